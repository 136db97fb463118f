#!/usr/bin/env bash
# What releasing workflow dependents costs a completing UPDATE, set-wise (the
# statement trigger `<table>_dbworker_release_set`, today's migration) beside
# the row trigger alone (the same migration with the statement trigger dropped
# and the row trigger firing for completions again, as before 2026-12-03):
#
#   chains: CHAINS two-job chains; one UPDATE completes every first job
#   fan-in: one job waiting for FAN_IN jobs; they complete in statements of
#           FAN_IN_STEP
#
# Both tables are filled alike; the rounds alternate which goes first. Prints
# each statement's time (psql's \timing, summed over the fan-in's statements).
#
#   DATABASE_URL=postgres://... bash bench/pgbench/release.sh
#
# DBWORKER=target/release/dbworker uses a built CLI instead of `cargo run`.
# Needs a scratch database: it drops and creates rel_set, rel_row and their
# `_deps` tables.
CHAINS=${CHAINS:-5000}
FAN_IN=${FAN_IN:-10000}
FAN_IN_STEP=${FAN_IN_STEP:-500}
ROUNDS=${ROUNDS:-3}
source "$(dirname "$0")/common.sh"
trap 'rm -rf "$work"' EXIT

fresh() { # table
    psql_ -c "DROP TABLE IF EXISTS $1_deps" -c "DROP TABLE IF EXISTS $1"
    migration --table "$1" --workflows | psql_ >/dev/null
    if [ "$1" = rel_row ]; then
        psql_ <<SQL
DROP TRIGGER "rel_row_dbworker_release_set" ON rel_row;
CREATE OR REPLACE TRIGGER "rel_row_dbworker_release" AFTER UPDATE OF "state" ON rel_row
    FOR EACH ROW WHEN (NEW."has_dependents" AND OLD."state" IS DISTINCT FROM NEW."state"
        AND (NEW."state" IN ('completed', 'failed', 'canceled') OR OLD."state" IN ('failed', 'canceled')))
    EXECUTE FUNCTION "rel_row_dbworker_release"();
SQL
    fi
}
fill() { # table, shape
    if [ "$2" = chains ]; then
        # Ids 1..CHAINS are the first jobs, CHAINS+1.. their dependents.
        psql_ <<SQL
INSERT INTO $1 (id, state, has_dependents) SELECT g, 'queued', true FROM generate_series(1, $CHAINS) g;
INSERT INTO $1 (id, state) SELECT g + $CHAINS, 'pending' FROM generate_series(1, $CHAINS) g;
INSERT INTO $1_deps (job_id, depends_on) SELECT g + $CHAINS, g FROM generate_series(1, $CHAINS) g;
SQL
    else
        psql_ <<SQL
INSERT INTO $1 (id, state, has_dependents) SELECT g, 'queued', true FROM generate_series(1, $FAN_IN) g;
INSERT INTO $1 (id, state) VALUES ($FAN_IN + 1, 'pending');
INSERT INTO $1_deps (job_id, depends_on) SELECT $FAN_IN + 1, g FROM generate_series(1, $FAN_IN) g;
SQL
    fi
    psql_ -c "VACUUM ANALYZE $1" -c "VACUUM ANALYZE $1_deps"
}
timed() { # table, shape; prints ms
    local f="$work/$1.sql"
    echo '\timing on' > "$f"
    if [ "$2" = chains ]; then
        echo "UPDATE $1 SET state = 'completed', finished_at = now() WHERE id <= $CHAINS;" >> "$f"
    else
        local hi
        for lo in $(seq 1 "$FAN_IN_STEP" "$FAN_IN"); do
            # Never past the upstreams: the sink is released, not completed.
            hi=$((lo + FAN_IN_STEP - 1))
            [ "$hi" -le "$FAN_IN" ] || hi=$FAN_IN
            echo "UPDATE $1 SET state = 'completed', finished_at = now() WHERE id BETWEEN $lo AND $hi;" >> "$f"
        done
    fi
    psql_ -f "$f" | awk '/^Time:/ { ms += $2 } END { printf "%.0f", ms }'
    local released want=1
    [ "$2" = chains ] && want=$CHAINS
    released=$(psql_ -Atc "SELECT count(*) FROM $1 WHERE state = 'queued'")
    [ "$released" = "$want" ] || { echo "$1: $released dependents released, not $want" >&2; exit 1; }
}
for shape in chains fan-in; do
    for round in $(seq "$ROUNDS"); do
        order=(rel_set rel_row)
        [ $((round % 2)) = 0 ] && order=(rel_row rel_set)
        line="$shape, round $round:"
        for t in "${order[@]}"; do
            fresh "$t"
            fill "$t" "$shape"
            psql_ -c CHECKPOINT
            line="$line $t $(timed "$t" "$shape") ms"
        done
        echo "$line"
    done
done
