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
