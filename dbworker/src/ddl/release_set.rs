//! The set-wise release of completions: the statement trigger of
//! [`workflows_sql`](super::workflows_sql) that releases the dependents of
//! every job an `UPDATE` completed, once per statement.

use super::workflows::{read_committed_sql, revive_sql};
use crate::columns::{Columns, HAS_DEPENDENTS, Relation, TRACE_FOLLOWS, deps_table, quote};

/// The set-wise release of completions: a statement-level trigger over the
/// statement's new rows, so a grouped mark of hundreds of completions makes
/// one trigger call and a few set-wise statements instead of a call and
/// several statements per job. The protocol is the row trigger's, in phases
/// over all the statement's dependents (in id order, so two completions
/// sharing dependents lock them in one order):
///
/// 1. the completed jobs' edges go (one `DELETE`);
/// 2. a dependent with no edge left for a fresh snapshot is released without
///    a lock: every other deleter has committed and saw this one's edge;
/// 3. for the others, an edge no transaction is deleting is locked `FOR KEY
///    SHARE`: its deleter waits for this commit and releases;
/// 4. the rest (every other edge deleted by an open transaction) are locked
///    `FOR UPDATE`, and a statement whose snapshot is taken after the locks
///    releases those with no edge left: the last locker sees every delete.
///
/// A batch's failure callback (`on_failure` edges) is never released by a
/// completion: the last deleter cancels it, in step 4. Before step 1, a job
/// completed from `failed` or `canceled` (an operator's complete) brings
/// back what its failure canceled, as a retry does, so step 2 releases it.
/// `models/src/workflow.rs` checks the phases, alone and beside the row
/// trigger's protocol.
pub(super) fn completions_sql(rel: &Relation, c: &Columns) -> String {
    let table = rel.quoted();
    let deps = deps_table(rel).quoted();
    let function = rel.quoted_derived_sibling("dbworker_release_set");
    let trigger = rel.quoted_derived("dbworker_release_set");
    let (id, state) = (quote(&c.id), quote(&c.state));
    let (finished_at, failure_message) = (quote(&c.finished_at), quote(&c.failure_message));
    let has_dependents = quote(HAS_DEPENDENTS);
    let follows = quote(TRACE_FOLLOWS);
    let follows_name = crate::columns::literal(TRACE_FOLLOWS);
    let none_left =
        format!(r#"NOT EXISTS (SELECT 1 FROM {deps} WHERE "job_id" = dbworker_d.{id})"#);
    // Queues the pending dependents of `ids` with no edge left, due from now
    // (with the releasing job's span on a table with traces), collecting their ids.
    let due = quote(&c.process_after);
    let release = |ids: &str| {
        format!(
            r#"IF v_traced THEN
        WITH r AS (
            UPDATE {table} AS dbworker_d
               SET {state} = 'queued', {due} = clock_timestamp(),
                   {follows} = COALESCE(s.span, dbworker_d.{follows})
              FROM unnest(v_deps, v_spans) AS s(dep, span)
             WHERE dbworker_d.{id} = s.dep AND s.dep = ANY({ids})
               AND NOT s.dep = ANY(v_batch) AND dbworker_d.{state} = 'pending'
               AND {none_left}
            RETURNING dbworker_d.{id})
        SELECT v_released || COALESCE(array_agg({id}), ARRAY[]::bigint[]) INTO v_released FROM r;
    ELSE
        WITH r AS (
            UPDATE {table} AS dbworker_d SET {state} = 'queued', {due} = clock_timestamp()
             WHERE dbworker_d.{id} = ANY({ids}) AND NOT dbworker_d.{id} = ANY(v_batch)
               AND dbworker_d.{state} = 'pending' AND {none_left}
            RETURNING dbworker_d.{id})
        SELECT v_released || COALESCE(array_agg({id}), ARRAY[]::bigint[]) INTO v_released FROM r;
    END IF;"#
        )
    };
    let read_committed = read_committed_sql("v_done[1]", "    ");
    let revive = revive_sql(rel, c, "v_revive", "        ");
    let release_fast = release("v_deps");
    let release_last = release("v_rest");
    format!(
        r#"-- Runs once per UPDATE statement: releases the dependents of the jobs it
-- completed (see dbworker::ddl::workflows_sql for the protocol).
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $dbworker$
DECLARE
    v_done bigint[];
    v_deps bigint[];
    v_spans text[];
    v_batch bigint[];
    v_rest bigint[];
    v_released bigint[] := ARRAY[]::bigint[];
    v_traced boolean := false;
    v_revive bigint[];
BEGIN
    -- Jobs this statement completed (not rows that already were: an UPDATE
    -- of a completed job's other columns is none of the release's business).
    SELECT array_agg(c.{id}) INTO v_done
      FROM (SELECT dbworker_n.{id} FROM dbworker_new AS dbworker_n
             WHERE dbworker_n.{has_dependents} AND dbworker_n.{state} = 'completed'
            EXCEPT
            SELECT dbworker_o.{id} FROM dbworker_old AS dbworker_o
             WHERE dbworker_o.{has_dependents} AND dbworker_o.{state} = 'completed') AS c;
    IF v_done IS NULL THEN
        RETURN NULL;
    END IF;
    -- Failed or canceled jobs completed by hand: what their failure canceled
    -- waits again first, as after a retry, so the steps below release it.
    SELECT array_agg(dbworker_o.{id}) INTO v_revive FROM dbworker_old AS dbworker_o
     WHERE dbworker_o.{state} IN ('failed', 'canceled') AND dbworker_o.{id} = ANY(v_done);
    IF v_revive IS NOT NULL THEN
{revive}
    END IF;
    -- Read by name, so a table without traces releases as before.
    SELECT to_jsonb(dbworker_n) ? {follows_name} INTO v_traced FROM dbworker_new AS dbworker_n LIMIT 1;
    -- 1. Their edges go; each dependent once, in id order, with the span of
    -- its highest upstream here (the one enqueued last).
    WITH gone AS (
        DELETE FROM {deps} WHERE "depends_on" = ANY(v_done)
        RETURNING "job_id", "depends_on", "policy"
    ), per_dep AS (
        SELECT "job_id" AS dep, max("depends_on") AS up, bool_or("policy" = 'on_failure') AS batch
          FROM gone GROUP BY "job_id"
    )
    SELECT array_agg(p.dep ORDER BY p.dep),
           array_agg(CASE WHEN v_traced THEN to_jsonb(dbworker_n) ->> {follows_name} END ORDER BY p.dep),
           COALESCE(array_agg(p.dep ORDER BY p.dep) FILTER (WHERE p.batch), ARRAY[]::bigint[])
      INTO v_deps, v_spans, v_batch
      FROM per_dep AS p JOIN dbworker_new AS dbworker_n ON dbworker_n.{id} = p.up;
    IF v_deps IS NULL THEN
        RETURN NULL;
    END IF;
{read_committed}
    -- 2. No edge left for this statement's fresh snapshot: every other
    -- deleter committed, each seeing our edge, so the release is ours.
    {release_fast}
    -- 3. An edge nobody is deleting: locked, its deleter waits for our commit,
    -- sees our delete and releases. Highest first, as in the row trigger.
    SELECT array_agg(d ORDER BY d) INTO v_rest
      FROM unnest(v_deps) AS d
     WHERE NOT d = ANY(v_released)
       AND NOT EXISTS (SELECT 1 FROM (SELECT 1 FROM {deps} WHERE "job_id" = d
                                       ORDER BY "depends_on" DESC LIMIT 1
                                       FOR KEY SHARE SKIP LOCKED) AS dbworker_e);
    IF v_rest IS NULL THEN
        RETURN NULL;
    END IF;
    -- 4. Every other edge is being deleted by an open transaction: the
    -- deleters take turns on the dependent's row, and check again with a
    -- snapshot taken after the lock; the last one sees no edge.
    PERFORM 1 FROM {table} WHERE {id} = ANY(v_rest) ORDER BY {id} FOR UPDATE;
    {release_last}
    -- A batch's failure callback whose upstream jobs all ended and none
    -- failed (a failure would have queued it) never runs.
    UPDATE {table} AS dbworker_d
       SET {state} = 'canceled', {finished_at} = clock_timestamp(),
           {failure_message} = 'no job of its batch failed'
     WHERE dbworker_d.{id} = ANY(v_rest) AND dbworker_d.{id} = ANY(v_batch)
       AND dbworker_d.{state} = 'pending' AND {none_left};
    RETURN NULL;
END
$dbworker$;
-- Transition tables rule out a column list: it fires for every UPDATE
-- statement, and returns at once when it completed no awaited job.
CREATE OR REPLACE TRIGGER {trigger} AFTER UPDATE ON {table}
    REFERENCING OLD TABLE AS dbworker_old NEW TABLE AS dbworker_new
    FOR EACH STATEMENT EXECUTE FUNCTION {function}();"#
    )
}
