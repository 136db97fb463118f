#!/usr/bin/env python3
"""CPU time per process group while the benchmark runs.

Every 100 ms, one line: the wall clock, the cumulative CPU ticks (user +
system, in USER_HZ, usually 100 a second) of the server's processes
(`postgres`), of the benchmark's (`dbworker-bench`: its in-process burn-downs
and its worker subprocesses), of the peer's (`bench-peer-graphile`), and the
machine's busy and idle ticks from /proc/stat. Processes that exit keep what
they used. Difference the lines over a burn-down's window and divide by its
jobs for the CPU per job on each side (docs/benchmarks.md, "Where a no-op
job's CPU goes").

    python3 bench/cpu/sample.py /tmp/samples.txt &
    cargo run --release -p dbworker-bench -- --workloads heartbeat --handlers 24 --peer-handlers 24,100 --jobs 100000
    kill %1
"""

import os
import sys
import time

GROUPS = ("postgres", "dbworker-bench", "bench-peer-grap")  # comm is cut at 15 bytes


def main(path):
    last = {}
    used = dict.fromkeys(GROUPS, 0)
    with open(path, "w") as out:
        while True:
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        stat = f.read()
                except OSError:
                    continue
                comm = stat[stat.index("(") + 1 : stat.rindex(")")]
                group = next((g for g in GROUPS if comm.startswith(g)), None)
                if group is None:
                    continue
                fields = stat[stat.rindex(")") + 2 :].split()
                ticks = int(fields[11]) + int(fields[12])
                key = (pid, fields[19])  # a pid and its start time: one process
                used[group] += ticks - last.get(key, 0)
                last[key] = ticks
            with open("/proc/stat") as f:
                cpu = [int(v) for v in f.readline().split()[1:]]
            idle = cpu[3] + cpu[4]
            busy = sum(cpu[:8]) - idle
            groups = " ".join(str(used[g]) for g in GROUPS)
            out.write(f"{time.time():.2f} {groups} {busy} {idle}\n")
            out.flush()
            time.sleep(0.1)


if __name__ == "__main__":
    main(sys.argv[1])
