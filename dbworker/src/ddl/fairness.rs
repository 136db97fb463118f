//! Fair claims: the columns, indexes, weight table and triggers that give
//! every key (tenant, customer, account) its share of a table's claims.

use std::collections::HashMap;

use crate::columns::{
    Columns, FAIR_COST, FAIR_KEY, FAIR_TAG, FAIR_UNTAGGED, MAX_FAIR_COST, MAX_FAIR_WEIGHT,
    Relation, TAG_SCALE, fair_due_trigger, fair_triggers, fair_weights_table, quote,
};
use crate::error::{Error, Result};

/// What [`fair_claims_sql`] needs to know of the table: the columns a job's
/// level is made of, and where a key comes from when a producer sets none.
///
/// ```
/// let mut fair = dbworker::ddl::FairClaims::default();
/// fair.queue_column = Some("queue".into());
/// fair.key_from = Some("NEW.payload->>'customer'".into());
/// let ddl = dbworker::ddl::fair_claims_sql("jobs", &Default::default(), &fair).unwrap();
/// assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "jobs_fair_weights""#));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FairClaims {
    /// The queue column: each queue has shares of its own.
    pub queue_column: Option<String>,
    /// The priority column (claimed highest first, as `dbworker migration
    /// --priority` orders it): each priority level has shares of its own.
    pub priority_column: Option<String>,
    /// An SQL expression over `NEW` (the inserted row) that gives the key of
    /// a job inserted without one, e.g. `NEW.payload->>'customer'`. `None`:
    /// such jobs share the NULL key.
    pub key_from: Option<String>,
    /// Enqueue transactions of one key take turns (a transaction-scoped
    /// advisory lock on the key, held to their commit), so each sees the
    /// last tag of the one before: shares then hold to 2 jobs however many
    /// producers a key has, and one key's producers wait for each other
    /// (about a thousand enqueue transactions a second per key). Default
    /// `false`: producers never wait, and a key's concurrent transactions can
    /// gain it a few percent (see the guarantee).
    pub serialize_keys: bool,
}

/// Statements (safe to run again) that make claims of `table_name` fair
/// across keys (see [fair claims](crate::control#fair-claims-every-key-its-share)):
///
/// - columns `fair_key text` (the job's key; NULL is one key),
///   `fair_tag bigint` (its start tag) and `fair_cost integer` (default 1);
/// - the weight table `<table>_fair_weights (fair_key, weight)` (a key
///   without a row has weight 1);
/// - the claim's index (priority, tag, id over waiting jobs) and the two the
///   tagging reads: the head of a level, and a key's last tag in it;
/// - the triggers that tag a job when it is inserted waiting, and again
///   whenever it waits again (a retry, a reset, a released dependent, an
///   operator's reschedule), and untag it when its run-at moves ahead while
///   it waits: start-time fair queuing, with no lock on any
///   shared row, so producers of one key never wait for each other;
/// - a job not due yet is left untagged (behind every tagged one) and
///   tagged when it comes due, by a third trigger the store fires (and an
///   index of the untagged jobs by due time).
pub fn fair_claims_sql(
    table_name: &str,
    alternate_column_names: &HashMap<String, String>,
    fair: &FairClaims,
) -> Result<String> {
    let rel = Relation::parse("table_name", table_name)?;
    let c = Columns::resolve(alternate_column_names)?;
    let column = |field: &'static str, name: &Option<String>| -> Result<Option<String>> {
        name.as_deref()
            .map(|n| crate::columns::column_name(field, n))
            .transpose()
    };
    let queue = column("queue_column", &fair.queue_column)?;
    let priority = column("priority_column", &fair.priority_column)?;
    if matches!(&fair.key_from, Some(e) if e.trim().is_empty() || e.contains("$fair$")) {
        return Err(Error::InvalidOption {
            field: "key_from",
            reason: "must be an SQL expression over NEW".into(),
        });
    }
    let table = rel.quoted();
    let weights = fair_weights_table(&rel).quoted();
    let index = |suffix: &str| rel.quoted_derived(suffix);
    let function = rel.quoted_derived_sibling("fair_tag");
    let [on_insert, on_update] = fair_triggers(&rel).map(|t| quote(&t));
    let on_due = quote(&fair_due_trigger(&rel));
    let (id, state, process_after) = (quote(&c.id), quote(&c.state), quote(&c.process_after));
    let (key, tag, cost) = (quote(FAIR_KEY), quote(FAIR_TAG), quote(FAIR_COST));
    let level: Vec<String> = [&queue, &priority]
        .into_iter()
        .flatten()
        .map(|c| quote(c))
        .collect();
    // A job's level: the same queue and priority as the job being tagged.
    let same_level: String = level
        .iter()
        .map(|c| format!(" AND j.{c} = NEW.{c}"))
        .collect();
    let level_columns: String = level.iter().map(|c| format!("{c}, ")).collect();
    let claim_order = match &priority {
        Some(p) => format!("{} DESC, {tag}, {id}", quote(p)),
        None => format!("{tag}, {id}"),
    };
    let key_default = match &fair.key_from {
        Some(expr) => {
            format!("    IF NEW.{key} IS NULL THEN\n        NEW.{key} := {expr};\n    END IF;\n")
        }
        None => String::new(),
    };
    // Without a queue column the claim's index finds a level's head too.
    let (head_note, head_index) = match &queue {
        Some(_) => (
            "the head of a level (the smallest tag waiting), and ",
            format!(
                "CREATE INDEX IF NOT EXISTS {} ON {table} ({level_columns}{tag}) WHERE {state} IN ('queued', 'errored');\n",
                index("fair_head_idx")
            ),
        ),
        None => ("", String::new()),
    };
    // Untagged jobs (not due when they started to wait) are not in line yet.
    let waiting = format!("j.{state} IN ('queued', 'errored') AND j.{tag} < {FAIR_UNTAGGED}");
    // Taken per key and level, held to the commit, so the next transaction of
    // the key sees this one's tag. The table's name keeps keys of different
    // tables apart.
    let serialize = if fair.serialize_keys {
        let level_text: String = level
            .iter()
            .map(|c| format!(" || '/' || coalesce(NEW.{c}::text, '')"))
            .collect();
        format!(
            "    PERFORM pg_advisory_xact_lock(hashtext({table_literal} || '/' || coalesce(NEW.{key}, ''){level_text}));\n",
            table_literal = crate::columns::literal(&rel.display_name()),
        )
    } else {
        String::new()
    };
    Ok(format!(
        r#"-- Fair claims: every key (fair_key) gets its share of the claims within a priority.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {key} text;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {tag} bigint NOT NULL DEFAULT 0;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {cost} integer NOT NULL DEFAULT 1 CHECK ({cost} BETWEEN 1 AND {MAX_FAIR_COST});
CREATE TABLE IF NOT EXISTS {weights} (
    {key} text PRIMARY KEY,
    "weight" integer NOT NULL CHECK ("weight" BETWEEN 1 AND {MAX_FAIR_WEIGHT})
);
-- The claim's order: {claim_order}.
CREATE INDEX IF NOT EXISTS {claim_idx} ON {table} ({claim_order}) WHERE {state} IN ('queued', 'errored');
-- What the tagging reads: {head_note}a key's last tag in its level.
{head_index}CREATE INDEX IF NOT EXISTS {key_idx} ON {table} ({level_columns}{key}, {tag}) WHERE {state} IN ('queued', 'errored');
-- Start-time fair queuing: a job starts at the later of its level's head (the
-- smallest tag waiting) and its key's last tag plus the cost of the jobs there
-- over the key's weight. Rows earlier in the same statement are seen, so a batch of one
-- key is spread out; nothing shared is locked or written.
-- No sort and no sequential scan: each probe walks its index, even when
-- statistics taken while the table was empty (a new table's first COPY, whose
-- plans are cached for the whole statement) make a scan of the table look
-- cheaper; otherwise every row of a bulk load reads every row before it.
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql
    SET enable_sort = off SET enable_seqscan = off AS $fair$
DECLARE
    v_weight integer;
    v_head bigint;
    v_last bigint;
BEGIN
{key_default}    -- Not due yet (scheduled, a retry's backoff, a snooze, a timed wait): the
    -- head will have moved on when it is, so it waits untagged, behind every
    -- tagged job of its level, and is tagged when it comes due (below). The
    -- clock, not now(): a workflow's release makes its dependent due at the
    -- clock, after the releasing transaction's start.
    IF NEW.{process_after} > clock_timestamp() THEN
        NEW.{tag} := {FAIR_UNTAGGED};
        RETURN NEW;
    END IF;
{serialize}    SELECT w."weight" INTO v_weight FROM {weights} AS w WHERE w.{key} = NEW.{key};
    v_weight := coalesce(v_weight, 1);
    SELECT j.{tag} INTO v_head FROM {table} AS j
     WHERE {waiting}{same_level}
       AND (j.{process_after} IS NULL OR j.{process_after} <= now())
     ORDER BY j.{tag} LIMIT 1;
    IF v_head IS NULL THEN
        SELECT j.{tag} INTO v_head FROM {table} AS j
         WHERE {waiting}{same_level}
         ORDER BY j.{tag} LIMIT 1;
    END IF;
    -- The key's last tag, then past every job waiting at it: jobs of one key
    -- enqueued by concurrent transactions cannot see each other and share a
    -- tag; counting them all here keeps the key's jobs one cost apart on
    -- average, however many producers it has.
    IF NEW.{key} IS NULL THEN
        SELECT j.{tag} INTO v_last FROM {table} AS j
         WHERE {waiting}{same_level} AND j.{key} IS NULL
         ORDER BY j.{tag} DESC LIMIT 1;
        SELECT v_last + ({TAG_SCALE}::bigint * sum(j.{cost})) / v_weight INTO v_last FROM {table} AS j
         WHERE {waiting}{same_level} AND j.{key} IS NULL AND j.{tag} = v_last;
    ELSE
        SELECT j.{tag} INTO v_last FROM {table} AS j
         WHERE {waiting}{same_level} AND j.{key} = NEW.{key}
         ORDER BY j.{tag} DESC LIMIT 1;
        SELECT v_last + ({TAG_SCALE}::bigint * sum(j.{cost})) / v_weight INTO v_last FROM {table} AS j
         WHERE {waiting}{same_level} AND j.{key} = NEW.{key} AND j.{tag} = v_last;
    END IF;
    NEW.{tag} := greatest(coalesce(v_head, 0), coalesce(v_last, 0));
    RETURN NEW;
END
$fair$;
CREATE OR REPLACE TRIGGER {on_insert} BEFORE INSERT ON {table}
    FOR EACH ROW WHEN (NEW.{state} IN ('queued', 'errored')) EXECUTE FUNCTION {function}();
-- A retried, reset, released or rescheduled job re-enters at the back of its key's share.
-- A waiting job whose run-at moves ahead (an operator's reschedule, a key's
-- replacement) is untagged, as a new job scheduled for later, and tagged when
-- it comes due. One made due (a signal, a reschedule to now) keeps its tag,
-- or waits to be tagged as every job come due does: nothing read, so the
-- writers need no grant on the weights.
CREATE OR REPLACE TRIGGER {on_update} BEFORE UPDATE OF {state}, {process_after} ON {table}
    FOR EACH ROW WHEN (NEW.{state} IN ('queued', 'errored') AND (OLD.{state} NOT IN ('queued', 'errored')
        OR (NEW.{process_after} IS DISTINCT FROM OLD.{process_after} AND NEW.{process_after} > clock_timestamp())))
    EXECUTE FUNCTION {function}();
-- An untagged job come due is tagged when the store sets its tag to -1
-- (every worker's claims do, about once a second).
CREATE OR REPLACE TRIGGER {on_due} BEFORE UPDATE OF {tag} ON {table}
    FOR EACH ROW WHEN (NEW.{tag} = -1 AND NEW.{state} IN ('queued', 'errored'))
    EXECUTE FUNCTION {function}();
-- The untagged jobs, by when they come due.
CREATE INDEX IF NOT EXISTS {untagged_idx} ON {table} ({process_after}) WHERE {state} IN ('queued', 'errored') AND {tag} >= {FAIR_UNTAGGED};
"#,
        claim_idx = index("fair_claim_idx"),
        key_idx = index("fair_key_idx"),
        untagged_idx = index("fair_untagged_idx"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_the_queue_and_priority_columns() {
        let fair = FairClaims {
            queue_column: Some("queue".into()),
            priority_column: Some("priority".into()),
            key_from: None,
            serialize_keys: true,
        };
        let ddl = fair_claims_sql("app.jobs", &Default::default(), &fair).unwrap();
        assert!(ddl.contains(r#"("queue", "priority", "fair_key", "fair_tag")"#));
        assert!(ddl.contains(r#"("priority" DESC, "fair_tag", "id")"#));
        assert!(ddl.contains(r#"AND j."queue" = NEW."queue" AND j."priority" = NEW."priority""#));
        assert!(ddl.contains(r#""app"."jobs_fair_tag"()"#));
        assert!(ddl.contains("pg_advisory_xact_lock(hashtext('app.jobs' || '/' || coalesce(NEW.\"fair_key\", '') || '/' || coalesce(NEW.\"queue\"::text, '')"));
        let plain = fair_claims_sql("jobs", &Default::default(), &FairClaims::default()).unwrap();
        assert!(plain.contains(r#"ON "jobs" ("fair_tag", "id")"#));
        assert!(!plain.contains("NEW.\"fair_key\" :="));
        let bad = FairClaims {
            key_from: Some(" ".into()),
            ..FairClaims::default()
        };
        assert!(fair_claims_sql("jobs", &Default::default(), &bad).is_err());
    }
}
