#!/usr/bin/env bash
# What the set-wise release trigger costs jobs that no other job waits for:
# the raw-SQL floor (claim 100 rows, complete them) on two tables made by
# `dbworker migration --workflows --notify`, one with the statement-level
# trigger `<table>_dbworker_release_set` and one without it, burned down by
# one pgbench run whose clients pick either script at random for each
# transaction, so both see the same moments of the machine.
#
#   DATABASE_URL=postgres://... bash bench/pgbench/plain-on-workflow-table.sh
#
# DBWORKER=target/release/dbworker uses a built CLI instead of `cargo run`.
# Needs pgbench (PostgreSQL's own) on PATH or PGBENCH, and a scratch database:
# it drops and creates the tables cmp_with and cmp_without.
TX=${TX:-300}
source "$(dirname "$0")/common.sh"
ddl() { migration --table "$1" --workflows --notify; }
for t in cmp_with cmp_without; do
    psql_ -c "DROP TABLE IF EXISTS ${t}_deps" -c "DROP TABLE IF EXISTS $t"
    ddl "$t" | psql_ >/dev/null
    psql_ -c "INSERT INTO $t (state) SELECT 'queued' FROM generate_series(1, $ROWS)"
    psql_ -c "VACUUM ANALYZE $t"
    cat > "$work/$t.sql" <<SQL
WITH c AS (UPDATE $t SET state = 'processing', started_at = now(), last_heartbeat_at = now(), worker_hostname = 'floor' WHERE id IN (SELECT id FROM $t WHERE state IN ('queued', 'errored') AND (process_after IS NULL OR process_after <= now()) ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 100) RETURNING id) SELECT coalesce(array_agg(id), '{}') AS ids FROM c \gset
UPDATE $t SET state = 'completed', finished_at = now() WHERE id = ANY(':ids'::bigint[]) AND state = 'processing';
SQL
done
psql_ -c 'DROP TRIGGER "cmp_without_dbworker_release_set" ON cmp_without'
psql_ -c CHECKPOINT
"$PGBENCH" "$DATABASE_URL" -n -c "$CLIENTS" -j 2 -t "$TX" \
    -f "$work/cmp_with.sql" -f "$work/cmp_without.sql" | grep -E "SQL script|latency average"
rm -r "$work"
