#!/usr/bin/env bash
# Completion by UPDATE or by DELETE, on the standard and the HOT layout, at the
# raw-SQL floor: four tables burned down by one pgbench run whose clients pick
# one of four scripts at random for each transaction (claim 50 rows, complete
# them), so all four see the same moments of the machine and only their
# per-script latencies are compared. Then each alone, for its WAL per job.
#
#   DATABASE_URL=postgres://... bash bench/pgbench/completion.sh
#
# DBWORKER=target/release/dbworker uses a built CLI instead of `cargo run`.
# Needs pgbench (PostgreSQL's own) on PATH or PGBENCH, and a scratch database:
# it drops and creates the tables cmp_su, cmp_sd, cmp_hu, cmp_hd.
TX=${TX:-1000}
source "$(dirname "$0")/common.sh"
setup() { queued_table "$@"; } # table, layout flag

script() { # table, hot (0/1), complete (update/delete)
    local live=""
    [ "$2" = 1 ] && live="AND dbworker_live "
    local f="$work/$1.sql"
    claim_ids "$1" 50 "$live" > "$f"
    if [ "$3" = update ]; then
        echo "UPDATE $1 SET state = 'completed', finished_at = now() WHERE id = ANY(':ids'::bigint[]) AND state = 'processing';" >> "$f"
    else
        echo "DELETE FROM $1 WHERE id = ANY(':ids'::bigint[]) AND state = 'processing';" >> "$f"
    fi
    echo "$f"
}

all() {
    setup cmp_su; setup cmp_sd; setup cmp_hu --hot-layout; setup cmp_hd --hot-layout
    psql_ -c CHECKPOINT
}

echo "== interleaved: latency per 50-job transaction, same moments"
all
"$PGBENCH" "$DATABASE_URL" -n -c "$CLIENTS" -j 2 -t "$TX" \
    -f "$(script cmp_su 0 update)" -f "$(script cmp_sd 0 delete)" \
    -f "$(script cmp_hu 1 update)" -f "$(script cmp_hd 1 delete)" \
    | grep -E "SQL script|latency average"

echo "== alone: WAL bytes per job"
for spec in "cmp_su 0 update" "cmp_sd 0 delete" "cmp_hu 1 update" "cmp_hd 1 delete"; do
    set -- $spec
    flag=""; [ "$2" = 1 ] && flag=--hot-layout
    setup "$1" $flag
    psql_ -c CHECKPOINT
    lsn=$(psql_ -Atc "SELECT pg_current_wal_lsn()")
    tx=$((ROWS / 50 / CLIENTS * 3 / 4))
    "$PGBENCH" "$DATABASE_URL" -n -c "$CLIENTS" -j 2 -t "$tx" -f "$(script "$@")" >/dev/null
    psql_ -Atc "SELECT '$1 ($3): ' || round((pg_current_wal_lsn() - '$lsn'::pg_lsn) / ($tx * $CLIENTS * 50)) || ' B of WAL per job'"
done
rm -r "$work"
