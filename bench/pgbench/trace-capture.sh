#!/usr/bin/env bash
# What storing a trace context costs an enqueue, at the raw-SQL floor: a table
# made by `dbworker migration` and one made with `--traces`, filled by one
# pgbench run whose clients pick either table's script at random for each
# transaction, so both see the same moments of the machine. Each script
# inserts ROWS_PER rows in one statement (1 for single enqueues); the traced
# one writes a W3C traceparent into each row, as enqueue and enqueue_many do.
# Then each alone, for its WAL per row.
#
#   DATABASE_URL=postgres://... bash bench/pgbench/trace-capture.sh
#   DATABASE_URL=postgres://... ROWS_PER=1 TX=3000 bash bench/pgbench/trace-capture.sh
#
# DBWORKER=target/release/dbworker uses a built CLI instead of `cargo run`.
# Needs pgbench (PostgreSQL's own) on PATH or PGBENCH, and a scratch database:
# it drops and creates the tables cmp_plain and cmp_traced.
ROWS_PER=${ROWS_PER:-1000}
TX=${TX:-200}
ROUNDS=${ROUNDS:-3}
source "$(dirname "$0")/common.sh"
trap 'rm -rf "$work"' EXIT
parent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

fresh() {
    psql_ -c "DROP TABLE IF EXISTS cmp_plain" -c "DROP TABLE IF EXISTS cmp_traced"
    migration --table cmp_plain | psql_ >/dev/null
    migration --table cmp_traced --traces | psql_ >/dev/null
    psql_ -c CHECKPOINT
}
echo "INSERT INTO cmp_plain (state) SELECT 'queued' FROM generate_series(1, $ROWS_PER);" > "$work/plain.sql"
echo "INSERT INTO cmp_traced (state, traceparent) SELECT 'queued', '$parent' FROM generate_series(1, $ROWS_PER);" > "$work/traced.sql"

for round in $(seq "$ROUNDS"); do
    fresh
    "$PGBENCH" "$DATABASE_URL" -n -c "$CLIENTS" -j 2 -t "$TX" \
        -f "$work/plain.sql" -f "$work/traced.sql" |
        awk -v r="$round" '
            /SQL script 1/ { s = "plain" } /SQL script 2/ { s = "traced" }
            /latency average/ && s { ms[s] = $(NF - 1) }
            END { printf "round %s: ms per statement plain %s, traced %s, traced ÷ plain time %.3f\n", r, ms["plain"], ms["traced"], ms["traced"] / ms["plain"] }'
done

for t in plain traced; do
    fresh
    lsn=$(psql_ -Atc "SELECT pg_current_wal_lsn()")
    "$PGBENCH" "$DATABASE_URL" -n -c "$CLIENTS" -j 2 -t "$TX" -f "$work/$t.sql" >/dev/null
    psql_ -Atc "SELECT '$t: ' || round((pg_current_wal_lsn() - '$lsn'::pg_lsn) / ($TX * $CLIENTS * $ROWS_PER)) || ' B of WAL per row'"
done
