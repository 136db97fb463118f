#!/usr/bin/env bash
# Runs N `cluster_node` processes, each in its own network namespace with its
# own address, against one Postgres — by hand, to watch failover and
# rebalancing (`dbworker status --node-table dbworker_nodes --events-table
# events --table jobs`). tests/examples/netns.rs automates the same with faults.
#
# Usage (as root, with iproute2):
#   scripts/netns-cluster.sh N PORT DBNAME
# Postgres must listen on all addresses (listen_addresses='*') on PORT and
# trust (or password-authenticate) 10.232.0.0/16 in pg_hba.conf; create the
# tables first with: target/debug/examples/cluster_node --setup --join postgres://...
# Everything it creates is removed on exit (Ctrl-C).
set -euo pipefail
n=${1:?number of nodes}; port=${2:?postgres port}; db=${3:?database name}
bin="$(dirname "$0")/../target/debug/examples/cluster_node"
[ -x "$bin" ] || { echo "build it first: cargo build --example cluster_node" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 1; }
command -v ip >/dev/null || { echo "needs iproute2 (ip)" >&2; exit 1; }

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for i in $(seq 0 $((n - 1))); do
        ip link del "dbwdemoh$i" 2>/dev/null || true
        ip netns del "dbwdemo$i" 2>/dev/null || true
    done
}
trap cleanup EXIT

for i in $(seq 0 $((n - 1))); do
    ip netns add "dbwdemo$i"
    ip link add "dbwdemoh$i" type veth peer name "dbwdemop$i"
    ip link set "dbwdemop$i" netns "dbwdemo$i"
    ip addr add "10.232.$i.1/24" dev "dbwdemoh$i"
    ip link set "dbwdemoh$i" up
    ip -n "dbwdemo$i" addr add "10.232.$i.2/24" dev "dbwdemop$i"
    ip -n "dbwdemo$i" link set "dbwdemop$i" up
    ip -n "dbwdemo$i" link set lo up
    ip netns exec "dbwdemo$i" "$bin" --join "postgres://postgres@10.232.$i.1:$port/$db" &
    pids+=($!)
    echo "node $i: namespace dbwdemo$i, address 10.232.$i.2, pid $!"
done
echo "cut node 0 off:  ip link set dbwdemoh0 down   (and up again)"
echo "kill node 1:     kill -9 ${pids[1]:-<pid>}"
wait
