#!/usr/bin/env bash
# Issue 38's HOT experiment: `bash run.sh <libpq connection args>` against a
# throwaway server (it creates four 2,000,000-row tables), two interleaved
# rounds of 12 s per table; jobs/s = tps × 100.
set -euo pipefail
cd "$(dirname "$0")"
psql "$@" -q -f setup.sql
for round in 1 2; do
    for script in claim_complete_a claim_complete_b claim_delete_c claim_complete_d; do
        printf '%s round %s: ' "$script" "$round"
        pgbench "$@" -n -M prepared -D lo=0 -c 8 -j 2 -T 12 -f "$script.sql" | grep '^tps'
    done
done
psql "$@" -Atc "SELECT relname, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables WHERE relname LIKE 'jobs__'"
