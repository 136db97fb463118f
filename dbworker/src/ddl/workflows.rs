//! Workflows in the job table: the `pending` state's columns, the dependency
//! edges, and the trigger that releases dependents in the transaction of the
//! write that finishes their upstream job.

use std::collections::HashMap;

use crate::columns::{
    BLOCKED_BY, Columns, HAS_DEPENDENTS, Relation, TASK_NAME, TRACE_FOLLOWS, UPSTREAM_IDS,
    WORKFLOW_ID, deps_table, quote, workflow_sequence,
};
use crate::error::Result;

/// `ALTER TABLE`, `CREATE TABLE`, `CREATE SEQUENCE` and trigger statements
/// that let jobs of `table_name` wait for other jobs (safe to run again):
///
/// - columns `workflow_id bigint`, `task_name text`, `blocked_by bigint`
///   (the upstream job whose failure canceled this one), indexed, and
///   `has_dependents boolean` (set when a job is first waited for: the
///   trigger fires only for such jobs);
/// - the edge table `<table>_deps (job_id, depends_on, policy)`, one row per
///   dependency not yet satisfied, indexed on `depends_on` (the policy
///   `on_failure` is a batch's failure callback, see `workflow::Batch`);
/// - `upstream_ids bigint[]`: every job a dependent waited for, recorded when
///   its edges are inserted (the edges go as they are satisfied; this keeps
///   the graph for the dashboard and for `DbJob::upstream_results`; `--results`
///   adds the same column, so running both is harmless), with a partial GIN
///   index over the unfinished rows, for the purger's check that no
///   dependent still needs a completed job's result;
/// - the sequence `<table>_workflow_seq` that workflow ids come from;
/// - the release trigger, `<table>_dbworker_release` (on a table with traces
///   it also copies the span the releasing mark recorded in `trace_follows`
///   to the dependent it releases, whose first attempt links to it).
///
/// A job that waits is `pending`, a state the claim never takes. Every write
/// that moves a job to `completed`, `failed` or `canceled` (a worker's mark,
/// single or grouped, in either handling mode; a reset that fails it; an
/// operator's cancel; plain SQL) fires the trigger in that same transaction:
/// so a dependency is released exactly when, and only if, its upstream's
/// final state commits. So does the delete of a job that did not complete
/// (unfinished, failed or canceled): it never will, so its dependents are
/// canceled for good and its edges go. See
/// [the release](crate::workflow#the-release) for the design.
///
/// ```
/// let ddl = dbworker::ddl::workflows_sql("jobs", &Default::default()).unwrap();
/// assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "jobs_deps""#));
/// ```
pub fn workflows_sql(
    table_name: &str,
    alternate_column_names: &HashMap<String, String>,
) -> Result<String> {
    let rel = Relation::parse("table_name", table_name)?;
    let c = Columns::resolve(alternate_column_names)?;
    let table = rel.quoted();
    let deps = deps_table(&rel).quoted();
    let index = |suffix: &str| rel.quoted_derived(suffix);
    let function = rel.quoted_derived_sibling("dbworker_release");
    let on_update = rel.quoted_derived("dbworker_release");
    let on_delete = rel.quoted_derived("dbworker_release_delete");
    let (id, state) = (quote(&c.id), quote(&c.state));
    let (finished_at, failure_message) = (quote(&c.finished_at), quote(&c.failure_message));
    let (workflow_id, task_name, blocked_by) =
        (quote(WORKFLOW_ID), quote(TASK_NAME), quote(BLOCKED_BY));
    let has_dependents = quote(HAS_DEPENDENTS);
    let last = format!(r#" AND NOT EXISTS (SELECT 1 FROM {deps} WHERE "job_id" = v_dep)"#);
    // The row function keeps its branches for 'completed' although its
    // trigger no longer fires for completions: re-run outside a transaction
    // on an older table, the old trigger still calls the new function until
    // the narrowed trigger replaces it, and must release, not cancel
    // (`release_set.rs::while_the_older_row_trigger_still_fires_for_completions_dependents_are_released`).
    Ok(format!(
        r#"-- Workflows: jobs that wait (state 'pending') for other jobs to finish.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {workflow_id} bigint;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {task_name} text;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {blocked_by} bigint;
-- Every job a dependent waited for: the graph outlives its satisfied edges.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {upstream_ids} bigint[];
-- Only the jobs others wait for fire the release trigger.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {has_dependents} boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS {workflow_idx} ON {table} ({workflow_id}) WHERE {workflow_id} IS NOT NULL;
CREATE INDEX IF NOT EXISTS {blocked_idx} ON {table} ({blocked_by}) WHERE {blocked_by} IS NOT NULL;
-- The unfinished dependents by the jobs they wait for: the purger keeps a
-- completed upstream while one of them may still read its result.
CREATE INDEX IF NOT EXISTS {waiting_idx} ON {table} USING gin ({upstream_ids})
    WHERE {state} NOT IN ('completed', 'failed', 'canceled');
CREATE SEQUENCE IF NOT EXISTS {sequence};
-- One row per dependency not yet satisfied: deleted when it is.
CREATE TABLE IF NOT EXISTS {deps} (
    "job_id" bigint NOT NULL REFERENCES {table} ({id}) ON DELETE CASCADE,
    -- No foreign key: the trigger handles a deleted upstream (a cascade would
    -- delete the edges before it could see them).
    "depends_on" bigint NOT NULL,
    "policy" text NOT NULL DEFAULT 'cancel',
    PRIMARY KEY ("job_id", "depends_on")
);
CREATE INDEX IF NOT EXISTS {deps_idx} ON {deps} ("depends_on");
-- Dropped and added again so that running this again on an older table
-- admits the policies added since ('on_failure': a batch's failure callback).
ALTER TABLE {deps} DROP CONSTRAINT IF EXISTS {policy_check};
ALTER TABLE {deps} ADD CONSTRAINT {policy_check}
    CHECK ("policy" IN ('cancel', 'ignore_failed', 'ignore_canceled', 'ignore', 'on_failure'));

-- Runs in the transaction of the write that finishes (or retries, or deletes)
-- a job: releases, cancels or revives the jobs that wait for it.
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $dbworker$
DECLARE
    v_job bigint;
    v_outcome text;
    v_dep bigint;
    v_policy text;
    v_span text;
    v_span_read boolean := false;
BEGIN
    IF TG_OP = 'DELETE' THEN
        -- A job deleted before it completed never will: its dependents see
        -- it canceled, or failed if it failed (not canceled: an edge that
        -- ignores only cancels must not release its dependent now).
        v_job := OLD.{id};
        v_outcome := CASE WHEN OLD.{state} = 'failed' THEN 'failed' ELSE 'canceled' END;
    ELSE
        v_job := NEW.{id};
        v_outcome := NEW.{state};
    END IF;
    IF v_outcome IN ('completed', 'failed', 'canceled') THEN
        -- The edges this outcome satisfies go; a dependent is released by
        -- whoever deletes its last edge. No counter row: concurrent upstream
        -- completions delete different rows and never wait for each other.
        -- An 'on_failure' edge (a batch's failure callback) goes whatever the
        -- outcome: a failure releases its dependent at once, and the deleter
        -- of the last one cancels it if no failure did.
        -- Dependents in id order: two completions sharing dependents lock
        -- them in one order, so they never deadlock (the delete's own order
        -- follows the heap, which reused space can change).
        FOR v_dep, v_policy IN
            WITH gone AS (
                DELETE FROM {deps}
                 WHERE "depends_on" = v_job
                   AND (v_outcome = 'completed' OR "policy" IN ('ignore', 'on_failure')
                        OR "policy" = 'ignore_' || v_outcome)
                RETURNING "job_id", "policy"
            )
            SELECT "job_id", "policy" FROM gone ORDER BY "job_id"
        LOOP
{read_committed}
            IF v_policy = 'on_failure' AND v_outcome = 'failed' THEN
                -- Only the first failure finds it pending: a concurrent one
                -- waits for this row and then sees it queued.
{release_on_failure}
                CONTINUE;
            END IF;
            -- Another edge no one is deleting right now: its deleter comes
            -- after us (our KEY SHARE lock makes it wait for our commit) and
            -- sees our delete, so the release is its to do. Highest first:
            -- the last-enqueued upstream is the last to run.
            PERFORM 1 FROM {deps} WHERE "job_id" = v_dep
             ORDER BY "depends_on" DESC LIMIT 1 FOR KEY SHARE SKIP LOCKED;
            IF NOT FOUND THEN
                -- Every other edge is being deleted by an open transaction, or
                -- gone. Gone for this statement's fresh snapshot: their
                -- deleters committed, each seeing our edge, so none released;
                -- the release is ours, without the lock below (a chain's
                -- every release: one statement fewer, one tuple lock fewer).
                IF v_policy <> 'on_failure' THEN
{release_last}
                    CONTINUE WHEN FOUND;
                END IF;
                -- Otherwise deleters serialize on the dependent's row, and
                -- each checks again with a snapshot taken after the lock:
                -- the last one to get it sees every other delete committed.
                PERFORM 1 FROM {table} WHERE {id} = v_dep FOR UPDATE;
                IF v_policy = 'on_failure' THEN
                    -- Every upstream ended and none failed (a failure would
                    -- have queued it): the failure callback never runs.
                    UPDATE {table}
                       SET {state} = 'canceled', {finished_at} = clock_timestamp(),
                           {failure_message} = 'no job of its batch failed'
                     WHERE {id} = v_dep AND {state} = 'pending'
                       AND NOT EXISTS (SELECT 1 FROM {deps} WHERE "job_id" = v_dep);
                ELSE
{release_last}
                END IF;
            END IF;
        END LOOP;
        IF v_outcome <> 'completed' THEN
            -- The other edges cancel their dependent, and stay: a retry of
            -- this job brings the dependent back. Its own trigger cascades.
            -- Locked first, canceled ones too: a concurrent retry of another
            -- upstream may be bringing one back (canceled to pending, not
            -- yet committed, so this snapshot sees it canceled). The lock
            -- waits for that commit; the UPDATE's new snapshot sees it pending.
            PERFORM 1 FROM {table}
             WHERE {id} IN (SELECT "job_id" FROM {deps} WHERE "depends_on" = v_job)
               AND {state} IN ('pending', 'canceled')
             ORDER BY {id} FOR UPDATE;
            -- clock_timestamp(), here and in every write of these functions:
            -- now() is the transaction's start, which in transactional
            -- handling precedes the write that caused this one.
            UPDATE {table}
               SET {state} = 'canceled', {finished_at} = clock_timestamp(),
                   {blocked_by} = CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE v_job END,
                   {failure_message} = format('upstream job %s was %s', v_job,
                       CASE WHEN TG_OP = 'DELETE' THEN 'deleted' ELSE v_outcome END)
             WHERE {id} IN (SELECT "job_id" FROM {deps} WHERE "depends_on" = v_job)
               AND {state} = 'pending';
        END IF;
        IF TG_OP = 'DELETE' THEN
            -- Those a failure canceled (this job's or another upstream's) stay
            -- canceled for good, naming this job: with `blocked_by` gone no
            -- retry brings back a job whose upstream can never complete.
            UPDATE {table}
               SET {blocked_by} = NULL,
                   {failure_message} = format('upstream job %s was deleted', v_job)
             WHERE {id} IN (SELECT "job_id" FROM {deps} WHERE "depends_on" = v_job)
               AND {state} = 'canceled' AND {blocked_by} IS NOT NULL;
            DELETE FROM {deps} WHERE "depends_on" = v_job;
        END IF;
    ELSIF OLD.{state} IN ('failed', 'canceled') THEN
        -- Retried: what its failure canceled waits again, unless another
        -- upstream still blocks it (then that one is named instead).
{revive}
    END IF;
    RETURN NULL;
END
$dbworker$;
{completions}
-- Completions are released set-wise, once per statement, above: a grouped
-- mark completing hundreds of jobs pays one trigger call, not one each. (The
-- statement trigger comes first: run outside a transaction on an older table,
-- no completion falls between the two; while both fire, whichever runs
-- first deletes the edges and releases, and the other finds none.)
CREATE OR REPLACE TRIGGER {on_update} AFTER UPDATE OF {state} ON {table}
    FOR EACH ROW WHEN (NEW.{has_dependents} AND OLD.{state} IS DISTINCT FROM NEW.{state}
        AND NEW.{state} IS DISTINCT FROM 'completed'
        AND (NEW.{state} IN ('failed', 'canceled') OR OLD.{state} IN ('failed', 'canceled')))
    EXECUTE FUNCTION {function}();
-- Every delete but a completed job's (whose edges went with its completion):
-- a failed or canceled one's edges may hold a dependent an operator requeued,
-- or one a retry of it would bring back.
CREATE OR REPLACE TRIGGER {on_delete} AFTER DELETE ON {table}
    FOR EACH ROW WHEN (OLD.{has_dependents} AND OLD.{state} <> 'completed')
    EXECUTE FUNCTION {function}();
-- NewJob::after from SQL: makes a job queued in this transaction wait for the
-- jobs `after` (e.g. SELECT {wait_for}({enqueue}('{{}}'), ARRAY[12, 13])).
-- The upstream jobs are locked FOR SHARE first, so none finishes until this
-- commits: a completed one counts at once, a failed or canceled one applies
-- the policy at once. Returns the job's state: queued, pending or canceled.
-- A job waiting for itself, a NULL id, or an edge closing a cycle is refused
-- (the job would stay pending forever); at most {max_ids} ids per call.
CREATE OR REPLACE FUNCTION {wait_for}(job bigint, after bigint[], policy text DEFAULT 'cancel')
RETURNS text LANGUAGE plpgsql AS $dbworker$
DECLARE
    up record;
    waits integer := 0;
    blocker bigint;
    blocker_state text;
    loop_through bigint;
BEGIN
    IF policy IS NULL OR policy NOT IN ('cancel', 'ignore_failed', 'ignore_canceled', 'ignore') THEN
        RAISE EXCEPTION 'policy must be cancel, ignore_failed, ignore_canceled or ignore, not %', policy;
    END IF;
    IF after IS NULL OR array_position(after, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'after must be an array of job ids without NULL, not %', after;
    END IF;{bound}
    IF job = ANY(after) THEN
        RAISE EXCEPTION 'job % cannot wait for itself', job;
    END IF;
    PERFORM 1 FROM {table} WHERE {id} = job AND {state} = 'queued' FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % is not a queued job', job;
    END IF;
    -- A cycle through this job needs a job waiting for it, and none can start
    -- to before this commits (it would lock this job's row first). With one,
    -- calls that could close a cycle take turns, and look at the edges once
    -- the upstream jobs are locked (so a concurrent call on one of them has
    -- committed): waiting for a job that already waits for this one, however
    -- indirectly, is refused.
    IF EXISTS (SELECT 1 FROM {deps} WHERE "depends_on" = job) THEN
        PERFORM pg_advisory_xact_lock(hashtextextended({cycle_lock}, 0));
        PERFORM 1 FROM {table} WHERE {id} = ANY(after) ORDER BY {id} FOR SHARE;
        WITH RECURSIVE downstream(id) AS (
            SELECT "job_id" FROM {deps} WHERE "depends_on" = job
            UNION
            SELECT e."job_id" FROM {deps} AS e JOIN downstream AS d ON e."depends_on" = d.id
        )
        SELECT d.id INTO loop_through FROM downstream AS d WHERE d.id = ANY(after) LIMIT 1;
        IF loop_through IS NOT NULL THEN
            RAISE EXCEPTION 'job % cannot wait for job %, which already waits for it: the edges would form a cycle', job, loop_through;
        END IF;
    END IF;
    -- Counted as locked: a row whose delete commits meanwhile is skipped by
    -- the lock, and the job must not be queued as if it never waited for it.
    IF (SELECT count(DISTINCT a) FROM unnest(after) AS a)
       <> (SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {id} = ANY(after)
                                  ORDER BY {id} FOR SHARE) AS dbworker_locked) THEN
        RAISE EXCEPTION 'an upstream job of % does not exist: %', job, after;
    END IF;
    FOR up IN SELECT {id} AS id, {state}::text AS state FROM {table}
               WHERE {id} = ANY(after) ORDER BY {id} FOR SHARE LOOP
        CONTINUE WHEN up.state = 'completed';
        CONTINUE WHEN up.state IN ('failed', 'canceled')
            AND (policy = 'ignore' OR policy = 'ignore_' || up.state);
        IF up.state IN ('failed', 'canceled') AND blocker IS NULL THEN
            blocker := up.id;
            blocker_state := up.state;
        END IF;
        UPDATE {table} SET {has_dependents} = true WHERE {id} = up.id AND NOT {has_dependents};
        INSERT INTO {deps} ("job_id", "depends_on", "policy") VALUES (job, up.id, policy);
        waits := waits + 1;
    END LOOP;
    -- The dependent remembers every upstream (finished or not), added to
    -- those of earlier calls: the dashboard draws the graph from it, and a
    -- handler reads their results by id.
    UPDATE {table}
       SET {upstream_ids} = ARRAY(SELECT DISTINCT u
                                    FROM unnest(COALESCE({upstream_ids}, '{{}}') || after) AS u
                                   ORDER BY u)
     WHERE {id} = job;
    IF blocker IS NOT NULL THEN
        UPDATE {table}
           SET {state} = 'canceled', {finished_at} = clock_timestamp(), {blocked_by} = blocker,
               {failure_message} = format('upstream job %s was %s', blocker, blocker_state)
         WHERE {id} = job;
        RETURN 'canceled';
    ELSIF waits > 0 THEN
        UPDATE {table} SET {state} = 'pending' WHERE {id} = job;
        RETURN 'pending';
    END IF;
    RETURN 'queued';
END
$dbworker$;
"#,
        completions = super::release_set::completions_sql(&rel, &c),
        read_committed = read_committed_sql("v_job", "            "),
        revive = revive_sql(&rel, &c, "ARRAY[v_job]", "        "),
        release_on_failure = release(&table, &c, "", "                "),
        release_last = release(&table, &c, &last, "                    "),
        upstream_ids = quote(UPSTREAM_IDS),
        bound = super::functions::bound_ids("after"),
        cycle_lock = crate::columns::literal(&format!("dbworker wait_for {deps}")),
        max_ids = super::MAX_FUNCTION_IDS,
        wait_for = rel.quoted_derived_sibling("wait_for"),
        enqueue = rel.derived("enqueue"),
        workflow_idx = index("workflow_idx"),
        blocked_idx = index("blocked_by_idx"),
        waiting_idx = index("upstream_ids_waiting_idx"),
        deps_idx = index("deps_depends_on_idx"),
        // Postgres's own name for the column's check in earlier versions.
        policy_check = index("deps_policy_check"),
        sequence = workflow_sequence(&rel),
    ))
}

/// Refuses a release outside READ COMMITTED, naming the job `job` (an
/// expression) whose write caused it. The protocol's "a new statement sees
/// every commit so far" holds only there: under REPEATABLE READ or
/// SERIALIZABLE the last two deleters could each keep seeing the other's edge
/// and strand the dependent; an error rolls the write back instead.
pub(super) fn read_committed_sql(job: &str, pad: &str) -> String {
    [
        "IF current_setting('transaction_isolation') <> 'read committed' THEN".to_owned(),
        "    RAISE EXCEPTION 'releasing the dependents of job % needs READ COMMITTED, not %',"
            .to_owned(),
        format!("        {job}, current_setting('transaction_isolation')"),
        "        USING ERRCODE = 'object_not_in_prerequisite_state',".to_owned(),
        "              HINT = 'finish jobs others wait for in a READ COMMITTED transaction';"
            .to_owned(),
        "END IF;".to_owned(),
    ]
    .iter()
    .map(|l| format!("{pad}{l}"))
    .collect::<Vec<_>>()
    .join("\n")
}

/// Brings back the dependents that the jobs `ids` (an array expression),
/// now retried or completed, had canceled (`blocked_by`): `pending` again,
/// unless another upstream still blocks them, which `blocked_by` and the
/// message then name. An edge whose upstream row is gone blocks too: a
/// delete takes its edges now, but one of a failed job deleted before it did
/// (its delete fired no trigger) is still there, and that job never completes.
/// Indented by `pad`.
pub(super) fn revive_sql(rel: &Relation, c: &Columns, ids: &str, pad: &str) -> String {
    let (table, deps) = (rel.quoted(), deps_table(rel).quoted());
    let (id, state, blocked_by) = (quote(&c.id), quote(&c.state), quote(BLOCKED_BY));
    let (finished_at, failure_message) = (quote(&c.finished_at), quote(&c.failure_message));
    // The canceled dependents are locked first, in id order, found by their
    // edges (not by `blocked_by`, which a concurrent revive may be moving to
    // one of these jobs): the lock waits for a concurrent failure or revive
    // of another upstream to commit, and the statements after it see that.
    format!(
        r#"PERFORM 1 FROM {table}
 WHERE {id} IN (SELECT "job_id" FROM {deps} WHERE "depends_on" = ANY({ids}))
   AND {state} = 'canceled'
 ORDER BY {id} FOR UPDATE;
UPDATE {table} AS dbworker_j
   SET {blocked_by} = dbworker_b.upstream,
       {failure_message} = format('upstream job %s was %s', dbworker_b.upstream, dbworker_b.outcome)
  FROM (SELECT DISTINCT ON (e."job_id") e."job_id" AS dependent, e."depends_on" AS upstream,
               COALESCE(u.{state}::text, 'deleted') AS outcome
          FROM {deps} AS e LEFT JOIN {table} AS u ON u.{id} = e."depends_on"
         WHERE e."job_id" IN (SELECT {id} FROM {table} WHERE {blocked_by} = ANY({ids}) AND {state} = 'canceled')
           AND NOT e."depends_on" = ANY({ids})
           AND (u.{id} IS NULL
                OR (u.{state} IN ('failed', 'canceled')
                    AND NOT (e."policy" = 'ignore' OR e."policy" = 'ignore_' || u.{state})))
         ORDER BY e."job_id", e."depends_on") AS dbworker_b
 WHERE dbworker_j.{id} = dbworker_b.dependent;
UPDATE {table}
   SET {state} = 'pending', {finished_at} = NULL, {failure_message} = NULL, {blocked_by} = NULL
 WHERE {blocked_by} = ANY({ids}) AND {state} = 'canceled';"#
    )
    .lines()
    .map(|l| format!("{pad}{l}"))
    .collect::<Vec<_>>()
    .join("\n")
}

/// The trigger's release of the dependent `v_dep` (pending, and `also`):
/// queued, and on a table with traces it takes the span the releasing mark
/// recorded in `trace_follows` (read by name, once per firing, so a table
/// without the column releases as before), which its first attempt links
/// to. Due from now (`process_after`): a job's wait is measured from due,
/// and it did not wait for a worker while pending. Indented by `pad`.
fn release(table: &str, c: &Columns, also: &str, pad: &str) -> String {
    let (id, state, due) = (quote(&c.id), quote(&c.state), quote(&c.process_after));
    let follows = quote(TRACE_FOLLOWS);
    let lines = [
        "IF NOT v_span_read THEN".to_owned(),
        format!(
            "    v_span := CASE WHEN TG_OP = 'UPDATE' THEN to_jsonb(NEW) ->> {} END;",
            crate::columns::literal(TRACE_FOLLOWS)
        ),
        "    v_span_read := true;".to_owned(),
        "END IF;".to_owned(),
        "IF v_span IS NULL THEN".to_owned(),
        format!("    UPDATE {table} SET {state} = 'queued', {due} = clock_timestamp()"),
        format!("     WHERE {id} = v_dep AND {state} = 'pending'{also};"),
        "ELSE".to_owned(),
        format!(
            "    UPDATE {table} SET {state} = 'queued', {due} = clock_timestamp(), {follows} = v_span"
        ),
        format!("     WHERE {id} = v_dep AND {state} = 'pending'{also};"),
        "END IF;".to_owned(),
    ];
    lines
        .iter()
        .map(|l| format!("{pad}{l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_table_and_renames() {
        let renames = HashMap::from([("state".to_owned(), "status".to_owned())]);
        let ddl = workflows_sql("app.jobs", &renames).unwrap();
        assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "app"."jobs_deps""#));
        assert!(ddl.contains(r#"CREATE SEQUENCE IF NOT EXISTS "app"."jobs_workflow_seq""#));
        assert!(ddl.contains(r#"AFTER UPDATE OF "status" ON "app"."jobs""#));
        assert!(!ddl.contains(r#""state""#));
    }
}
