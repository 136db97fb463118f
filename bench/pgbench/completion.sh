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
ddl() { migration --table "$1" ${2:+"$2"}; }

setup() { # table, layout flag
    psql_ -c "DROP TABLE IF EXISTS $1"
    ddl "$1" "${2:-}" | psql_ >/dev/null
    psql_ -c "INSERT INTO $1 (state) SELECT 'queued' FROM generate_series(1, $ROWS)"
    psql_ -c "VACUUM ANALYZE $1"
}

script() { # table, hot (0/1), complete (update/delete)
    local live=""
    [ "$2" = 1 ] && live="AND dbworker_live "
    local f="$work/$1.sql"
    echo "WITH c AS (UPDATE $1 SET state = 'processing', started_at = now(), last_heartbeat_at = now(), worker_hostname = 'floor' WHERE id IN (SELECT id FROM $1 WHERE state IN ('queued', 'errored') AND (process_after IS NULL OR process_after <= now()) ${live}ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 50) RETURNING id) SELECT coalesce(array_agg(id), '{}') AS ids FROM c \\gset" > "$f"
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
