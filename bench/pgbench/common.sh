# Shared by the scripts here (sourced): settings, psql, and the DDL of
# `dbworker migration` (DBWORKER names a built CLI, else `cargo run`).
set -euo pipefail
export PGOPTIONS="-c client_min_messages=warning"
: "${DATABASE_URL:?set DATABASE_URL to a scratch database}"
PGBENCH=${PGBENCH:-pgbench}
ROWS=${ROWS:-300000}
CLIENTS=${CLIENTS:-16}
pgbench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
psql_() { psql "$DATABASE_URL" -q -v ON_ERROR_STOP=1 "$@"; }
migration() {
    if [ -n "${DBWORKER:-}" ]; then
        "$DBWORKER" migration "$@"
    else
        cargo run -q --manifest-path "$pgbench_dir/../../Cargo.toml" -p dbworker-cli -- migration "$@"
    fi
}
# A fresh job table of ROWS queued rows: table, then `dbworker migration`'s
# flags (e.g. --hot-layout).
queued_table() {
    local table=$1; shift
    psql_ -c "DROP TABLE IF EXISTS $table"
    migration --table "$table" "$@" | psql_ >/dev/null
    psql_ -c "INSERT INTO $table (state) SELECT 'queued' FROM generate_series(1, $ROWS)"
    psql_ -c "VACUUM ANALYZE $table"
}
# The claim's choice of rows, locked: table, rows, and an extra condition
# (e.g. "AND dbworker_live " on the HOT layout).
eligible() {
    echo "SELECT id FROM $1 WHERE state IN ('queued', 'errored') AND (process_after IS NULL OR process_after <= now()) ${3:-}ORDER BY id FOR UPDATE SKIP LOCKED LIMIT $2"
}
# The floor's claim as a pgbench line that keeps the claimed ids in :ids:
# table, rows, extra condition as for `eligible`.
claim_ids() {
    echo "WITH c AS (UPDATE $1 SET state = 'processing', started_at = now(), last_heartbeat_at = now(), worker_hostname = 'floor' WHERE id IN ($(eligible "$@")) RETURNING id) SELECT coalesce(array_agg(id), '{}') AS ids FROM c \\gset"
}
