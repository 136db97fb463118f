#!/bin/sh
# A worker process under `perf record`, for BENCH_WRAP_WORKER (which runs a
# program with the worker's command line): a call-graph profile of the
# measured run in $PERF_DATA (default perf.data).
#
#   BENCH_WRAP_WORKER=bench/cpu/perf-record.sh cargo run --release -p dbworker-bench -- \
#     --workloads heartbeat --handlers 24 --peer-handlers 24 --jobs 100000
#   perf report -i perf.data --no-children --sort sym
exec perf record -F 1999 --call-graph dwarf,16384 -o "${PERF_DATA:-perf.data}" -- "$@"
