#!/usr/bin/env bash
# What a workflow chain's job costs the server, part by part, beside a plain
# job: one session, no concurrency, on a table from `dbworker migration
# --workflows --notify` (the benchmark's `workflows` workload uses the same).
#
#   plain          CHAINS jobs completed, then CHAINS queued jobs claimed
#   today          CHAINS two-job chains: the first jobs completed (their
#                  dependents released by the trigger), then the released
#                  jobs claimed
#   no-protocol    the same with a release that only deletes the edges and
#                  queues dependents with none left (NOT exactly-once under
#                  concurrency: a ceiling for what the protocol costs)
#   no-release     the same with a release trigger that returns at once (the
#                  completion alone; nothing is released or claimed)
#   no-wf-index    today's trigger, the workflow_id index dropped
#   no-notify      today's trigger, the NOTIFY requeue trigger disabled
#
# Completions and claims go GROUP rows a statement, as the worker's grouped
# marks and claims do. Prints each variant's milliseconds per round; the
# rounds rotate the order.
#
#   DATABASE_URL=postgres://... bash bench/pgbench/release-parts.sh
#
# DBWORKER=target/release/dbworker uses a built CLI instead of `cargo run`.
# Needs a scratch database: it drops and creates the table rp and rp_deps.
CHAINS=${CHAINS:-10000}
GROUP=${GROUP:-500}
ROUNDS=${ROUNDS:-3}
source "$(dirname "$0")/common.sh"
trap 'rm -rf "$work"' EXIT

migration --table rp --workflows --notify > "$work/ddl.sql"
variants=(plain today no-protocol no-release no-wf-index no-notify)

fresh() { # variant
    psql_ -c "DROP TABLE IF EXISTS rp_deps" -c "DROP TABLE IF EXISTS rp"
    psql_ -f "$work/ddl.sql" >/dev/null
    case $1 in
    no-protocol)
        psql_ <<'SQL'
CREATE OR REPLACE FUNCTION rp_dbworker_release_set() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_done bigint[];
    v_deps bigint[];
BEGIN
    SELECT array_agg(n.id) INTO v_done FROM dbworker_new AS n WHERE n.has_dependents AND n.state = 'completed';
    IF v_done IS NULL THEN
        RETURN NULL;
    END IF;
    WITH gone AS (DELETE FROM rp_deps WHERE depends_on = ANY(v_done) RETURNING job_id)
    SELECT array_agg(job_id) INTO v_deps FROM gone;
    UPDATE rp SET state = 'queued', process_after = clock_timestamp()
     WHERE id = ANY(v_deps) AND state = 'pending'
       AND NOT EXISTS (SELECT 1 FROM rp_deps AS e WHERE e.job_id = rp.id);
    RETURN NULL;
END
$$;
SQL
        ;;
    no-release)
        psql_ -c 'CREATE OR REPLACE FUNCTION rp_dbworker_release_set() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$'
        ;;
    no-wf-index) psql_ -c "DROP INDEX rp_workflow_idx" ;;
    no-notify) psql_ -c "ALTER TABLE rp DISABLE TRIGGER rp_dbworker_notify_requeue" ;;
    esac
}
fill() { # variant
    if [ "$1" = plain ]; then
        psql_ <<SQL
INSERT INTO rp (id, state, started_at) SELECT g, 'processing', now() FROM generate_series(1, $CHAINS) g;
INSERT INTO rp (id, state) SELECT g + $CHAINS, 'queued' FROM generate_series(1, $CHAINS) g;
SQL
    else
        # Ids 1..CHAINS are the first jobs (processing), CHAINS+1.. their dependents.
        psql_ <<SQL
INSERT INTO rp (id, state, started_at, has_dependents, workflow_id, task_name)
    SELECT g, 'processing', now(), true, g, 't0' FROM generate_series(1, $CHAINS) g;
INSERT INTO rp (id, state, workflow_id, task_name, upstream_ids)
    SELECT g + $CHAINS, 'pending', g, 't1', ARRAY[g] FROM generate_series(1, $CHAINS) g;
INSERT INTO rp_deps (job_id, depends_on) SELECT g + $CHAINS, g FROM generate_series(1, $CHAINS) g;
SQL
    fi
    psql_ -c "VACUUM ANALYZE rp" -c "VACUUM ANALYZE rp_deps" -c CHECKPOINT
}
timed() { # file of statements; prints ms
    psql_ -f "$1" | awk '/^Time:/ { ms += $2 } END { printf "%.0f", ms }'
}
echo '\timing on' > "$work/complete.sql"
echo '\timing on' > "$work/claim.sql"
for lo in $(seq 1 "$GROUP" "$CHAINS"); do
    hi=$((lo + GROUP - 1))
    [ "$hi" -le "$CHAINS" ] || hi=$CHAINS
    echo "UPDATE rp SET state = 'completed', finished_at = clock_timestamp() WHERE id BETWEEN $lo AND $hi AND state = 'processing';" >> "$work/complete.sql"
    echo "UPDATE rp SET state = 'processing', started_at = now(), last_heartbeat_at = now() WHERE id IN (SELECT id FROM rp WHERE state IN ('queued', 'errored') AND (process_after IS NULL OR process_after <= now()) ORDER BY id LIMIT $GROUP FOR UPDATE SKIP LOCKED);" >> "$work/claim.sql"
done
for round in $(seq "$ROUNDS"); do
    n=${#variants[@]}
    for i in $(seq 0 $((n - 1))); do
        v=${variants[$(((i + round - 1) % n))]}
        fresh "$v"
        fill "$v"
        complete=$(timed "$work/complete.sql")
        claim=$(timed "$work/claim.sql")
        claimed=$(psql_ -Atc "SELECT count(*) FROM rp WHERE id > $CHAINS AND state = 'processing'")
        want=$CHAINS
        [ "$v" = no-release ] && want=0
        [ "$claimed" = "$want" ] || { echo "$v: $claimed jobs claimed, not $want" >&2; exit 1; }
        echo "round $round, $v: complete $complete ms, claim $claim ms ($CHAINS jobs, $GROUP a statement)"
    done
done
