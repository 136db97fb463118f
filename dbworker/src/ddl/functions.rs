//! SQL functions for other languages beside `<table>_enqueue`: `<table>_add_jobs`
//! (many jobs in one call) and the admin functions (`complete_jobs`,
//! `permanently_fail_jobs`, `reschedule_jobs`, `remove_job`), the same
//! operations as [`Admin`](crate::admin::Admin) offers in Rust.

use std::collections::HashMap;

use super::{OptionalColumns, optional_params};
use crate::columns::{Columns, Relation, literal, quote};
use crate::error::Result;

/// A PL/pgSQL function `<table>_add_jobs(specs jsonb[], key_mode text)` that
/// enqueues one job per spec through `<table>_enqueue` (see
/// [`enqueue_function_sql`](super::enqueue_function_sql), which must be
/// installed too: `dbworker migration --add-jobs` prints both), so keys apply
/// per spec exactly as they do one by one. Returns the ids, in spec order, of
/// the jobs that carry the work (new, updated or kept).
///
/// Each spec is a JSON object with the enqueue function's parameters:
/// `fields` (the application's columns), `run_at`, and each optional column
/// the table has (`priority`, `queue`, `kind`, `max_retries`, `job_key`);
/// an unknown field is an error naming it. `key_mode` applies to every keyed
/// spec (`replace` by default).
///
/// ```sql
/// SELECT * FROM email_jobs_add_jobs(ARRAY[
///     '{"fields": {"payload": {"to": "a@example.com"}}, "priority": 5}',
///     '{"fields": {"payload": {}}, "run_at": "2030-01-01T00:00:00Z", "job_key": "digest:7"}'
/// ]::jsonb[]);
/// ```
pub fn add_jobs_function_sql(
    table_name: &str,
    alternate_column_names: &HashMap<String, String>,
    columns: OptionalColumns,
) -> Result<String> {
    let rel = Relation::parse("table_name", table_name)?;
    Columns::resolve(alternate_column_names)?;
    let table = rel.quoted();
    let function = rel.quoted_derived_sibling("add_jobs");
    let enqueue = rel.quoted_derived_sibling("enqueue");
    let mut known = vec!["'fields'".to_owned(), "'run_at'".to_owned()];
    let mut args = vec![
        "spec->'fields'".to_owned(),
        "(spec->>'run_at')::timestamptz".to_owned(),
    ];
    for (name, ty) in optional_params(columns) {
        known.push(format!("'{name}'"));
        // An array parameter (text[]) from a JSON array; a scalar from its text.
        let value = match ty.strip_suffix("[]") {
            Some(_) => format!(
                "CASE WHEN spec ? '{name}' THEN ARRAY(SELECT jsonb_array_elements_text(spec->'{name}'))::{ty} END"
            ),
            None => format!("(spec->>'{name}')::{ty}"),
        };
        args.push(format!("{name} => {value}"));
    }
    let mut params = vec!["specs jsonb[]".to_owned()];
    let mut signature = vec![("specs", "jsonb[]")];
    // Checked before any spec, so a bad mode fails even when no spec has a key.
    let mut check_mode = "";
    if columns.keys {
        known.push("'job_key'".into());
        args.push("job_key => spec->>'job_key'".into());
        args.push("key_mode => key_mode".into());
        params.push("key_mode text DEFAULT 'replace'".into());
        signature.push(("key_mode", "text"));
        check_mode = r#"
    IF key_mode IS NULL OR key_mode NOT IN ('replace', 'preserve_run_at', 'dedupe_only', 'unsafe_dedupe') THEN
        RAISE EXCEPTION 'key_mode must be replace, preserve_run_at, dedupe_only or unsafe_dedupe, not %', key_mode;
    END IF;"#;
    }
    Ok(format!(
        r#"{drop}-- Enqueues many jobs into {table}, one {enqueue} call per spec; returns their ids in order.
CREATE OR REPLACE FUNCTION {function}(
    {params}
) RETURNS SETOF bigint LANGUAGE plpgsql AS $dbworker$
DECLARE
    spec jsonb;
    bad text;
BEGIN{check_mode}
    FOREACH spec IN ARRAY COALESCE(specs, ARRAY[]::jsonb[]) LOOP
        IF spec IS NULL OR jsonb_typeof(spec) <> 'object' THEN
            RAISE EXCEPTION 'each job spec must be a JSON object, not %', spec;
        END IF;
        SELECT k INTO bad FROM jsonb_object_keys(spec) AS k WHERE k NOT IN ({known}) LIMIT 1;
        IF bad IS NOT NULL THEN
            RAISE EXCEPTION 'unknown job spec field %; expected one of {known_text}', bad;
        END IF;
        RETURN NEXT {enqueue}(
            {args}
        );
    END LOOP;
END
$dbworker$;
"#,
        drop = drop_other_overloads(&rel, "add_jobs", &signature),
        params = params.join(",\n    "),
        known = known.join(", "),
        known_text = known.join(", ").replace('\'', "").replace('%', "%%"),
        args = args.join(",\n            "),
    ))
}

/// The most ids one call of an admin function (`complete_jobs`,
/// `permanently_fail_jobs`, `reschedule_jobs`) or `wait_for` takes: more
/// raise an error naming this limit. One call is one statement holding its
/// row locks to the end, and its outcome list grows with it (a million ids
/// ran past 150 s): call again per slice of ids instead.
pub const MAX_FUNCTION_IDS: usize = 10_000;

/// The check at the top of a function taking the ids array `ids`.
pub(super) fn bound_ids(ids: &str) -> String {
    format!(
        r#"
    IF cardinality({ids}) > {MAX_FUNCTION_IDS} THEN
        RAISE EXCEPTION 'at most {MAX_FUNCTION_IDS} ids per call, not %; call again per slice', cardinality({ids});
    END IF;"#
    )
}

/// A `DO` block dropping every overload of `<table>_<suffix>` but the one
/// whose arguments are `signature` (name, type): generated again with other
/// columns, a function then replaces the old one instead of standing beside
/// it (with two, every call leaving parameters out fails as "not unique").
/// The one kept is replaced in place by `CREATE OR REPLACE`, grants and all.
pub(super) fn drop_other_overloads(
    rel: &Relation,
    suffix: &str,
    signature: &[(&str, &str)],
) -> String {
    // An unqualified function is created in the first schema of the search path.
    let schema = rel
        .schema
        .as_deref()
        .map_or_else(|| "current_schema()".to_owned(), literal);
    let list = |items: Vec<&str>| {
        items
            .into_iter()
            .map(literal)
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        r#"-- Replaces {function} generated with other columns: other overloads go first.
DO $dbworker$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
              WHERE n.nspname = {schema} AND p.proname = {name}
                AND (p.proargtypes::oid[] <> ARRAY[{types}]::regtype[]::oid[]
                     OR p.proargnames IS DISTINCT FROM ARRAY[{names}]::text[]) LOOP
        EXECUTE format('DROP FUNCTION %s', f);
    END LOOP;
END
$dbworker$;
"#,
        function = rel.quoted_derived_sibling(suffix),
        name = literal(&rel.derived(suffix)),
        types = list(signature.iter().map(|(_, t)| *t).collect()),
        names = list(signature.iter().map(|(n, _)| *n).collect()),
    )
}

/// One admin function: locks the rows it will change, changes them, and
/// returns `(id, outcome)` for every requested id, in order.
struct AdminFunction<'a> {
    name: &'a str,
    extra_params: String,
    /// Checks of the arguments, before anything is locked.
    checks: String,
    states: &'a [&'a str],
    sets: Vec<String>,
    /// Statements after the update (its rows' outcomes already returned).
    after: String,
}

/// For `reschedule_jobs`, after the lock: on a table with workflows (its
/// edge table exists when called; the statements are planned only then),
/// the jobs among `ids` in `states` that still wait for an upstream job
/// that exists, into `still_waiting`, which the update sets `pending`, not
/// `queued`, as `Admin`'s reschedule does: they must not run before it
/// completes. Their edges to deleted upstream jobs go (those never
/// complete), and their `blocked_by`. A completion racing this needs no lock
/// here: one that deleted a job's last edge holds the job's row until it
/// commits, and the lock above waits for it, so these statements see it.
fn still_waiting_sql(rel: &Relation, c: &Columns, states: &str) -> String {
    let (table, deps) = (rel.quoted(), crate::columns::deps_table(rel).quoted());
    let (id, state) = (quote(&c.id), quote(&c.state));
    let blocked_by = quote(crate::columns::BLOCKED_BY);
    let moved = format!(
        "SELECT j.{id} FROM {table} AS j WHERE j.{id} = ANY(ids) AND j.{state} IN ({states})"
    );
    format!(
        r#"
    IF to_regclass({deps_name}) IS NOT NULL THEN
        DELETE FROM {deps} AS e
         WHERE e."job_id" IN ({moved})
           AND NOT EXISTS (SELECT 1 FROM {table} AS u WHERE u.{id} = e."depends_on");
        still_waiting := ARRAY(SELECT DISTINCT e."job_id" FROM {deps} AS e
                                 JOIN {table} AS u ON u.{id} = e."depends_on"
                                WHERE e."job_id" IN ({moved}));
        UPDATE {table} AS j SET {blocked_by} = NULL
         WHERE j.{id} = ANY(ids) AND j.{state} IN ({states}) AND j.{blocked_by} IS NOT NULL;
    END IF;"#,
        deps_name = literal(&deps)
    )
}

/// PL/pgSQL admin functions on `table_name`, callable from any language, each
/// returning `TABLE (id bigint, outcome text)`: one row per requested id, in
/// order, with `outcome` one of
///
/// - `done`: the function changed the job;
/// - `processing`: left alone, a worker holds it;
/// - `skipped`: left alone, its state is not one the function acts on;
/// - `missing`: no such job.
///
/// ```sql
/// SELECT * FROM email_jobs_complete_jobs(ARRAY[7, 99]);            -- queued, errored, failed, canceled → completed
/// SELECT * FROM email_jobs_permanently_fail_jobs(ARRAY[7], 'bad address');  -- queued, errored → failed
/// SELECT * FROM email_jobs_reschedule_jobs(ARRAY[7], run_at => now() + interval '5 minutes',
///                                          priority => 5, num_failures => 0, max_retries => 3);
/// SELECT * FROM email_jobs_remove_job('digest:7');   -- the waiting holder of a key, deleted
/// ```
///
/// `reschedule_jobs` puts queued, errored, failed and canceled jobs back to
/// `queued` (on a table with workflows, a dependent that still waits for an
/// upstream job to `pending`, as `Admin` does); each NULL (or omitted) argument leaves its column unchanged
/// (`priority` exists with the priority column, `max_retries` with the retry
/// limit column); a negative `num_failures` or `max_retries` is an error.
/// Each function taking `ids` takes at most [`MAX_FUNCTION_IDS`] (10,000) per
/// call, and raises an error above. `remove_job` (with the key column) deletes the queued or
/// errored job holding the key and returns `(id, 'done')`; a processing
/// holder runs on but gives up the key and, with the retry-limit column, its
/// retries (graphile-worker's `remove_job` on a locked job), returning
/// `(id, 'processing')`; no row when no live job holds the key.
pub fn admin_functions_sql(
    table_name: &str,
    alternate_column_names: &HashMap<String, String>,
    columns: OptionalColumns,
) -> Result<String> {
    let rel = Relation::parse("table_name", table_name)?;
    let c = Columns::resolve(alternate_column_names)?;
    let name = |suffix: &str| rel.quoted_derived_sibling(suffix);
    let j = |column: &str| format!("j.{}", quote(column));
    let set = |column: &str, value: String| format!("{} = {value}", quote(column));
    let mut reschedule_params = String::from(",\n    run_at timestamptz DEFAULT NULL");
    let mut reschedule_signature = vec![("ids", "bigint[]"), ("run_at", "timestamptz")];
    // A negative count would be stored as given.
    let mut reschedule_checks = String::new();
    let mut refuse_negative = |param: &str| {
        reschedule_checks.push_str(&format!(
            r#"
    IF {param} < 0 THEN
        RAISE EXCEPTION '{param} must be 0 or more, not %', {param};
    END IF;"#
        ));
    };
    let mut reschedule_sets = vec![
        set(
            &c.state,
            format!(
                "CASE WHEN {} = ANY(still_waiting) THEN 'pending' ELSE 'queued' END",
                j(&c.id)
            ),
        ),
        set(&c.finished_at, "NULL".into()),
        set(&c.cancel, "false".into()),
        set(
            &c.process_after,
            format!("COALESCE(run_at, {})", j(&c.process_after)),
        ),
    ];
    if columns.priority {
        reschedule_params.push_str(",\n    priority integer DEFAULT NULL");
        reschedule_signature.push(("priority", "integer"));
        reschedule_sets.push(set(
            "priority",
            format!("COALESCE(priority, {})", j("priority")),
        ));
    }
    reschedule_params.push_str(",\n    num_failures integer DEFAULT NULL");
    reschedule_signature.push(("num_failures", "integer"));
    refuse_negative("num_failures");
    reschedule_sets.push(set(
        &c.num_failures,
        format!("COALESCE(num_failures, {})", j(&c.num_failures)),
    ));
    if columns.max_retries {
        reschedule_params.push_str(",\n    max_retries integer DEFAULT NULL");
        reschedule_signature.push(("max_retries", "integer"));
        refuse_negative("max_retries");
        reschedule_sets.push(set(
            "max_retries",
            format!("COALESCE(max_retries, {})", j("max_retries")),
        ));
    }
    // `finished_at` from the clock: the caller's transaction may have begun
    // long before the call. A completion drops the checkpoint, as a
    // worker's does: in the columns, or in the side table when it exists.
    let mut complete_sets = vec![
        set(&c.state, "'completed'".into()),
        set(&c.finished_at, "clock_timestamp()".into()),
    ];
    if columns.progress {
        complete_sets.push(set("checkpoint", "NULL".into()));
    }
    let side = crate::columns::progress_table(&rel).quoted();
    let side_checkpoints = format!(
        r#"
    IF to_regclass('{side_literal}') IS NOT NULL THEN
        UPDATE {side} AS s SET "checkpoint" = NULL
         WHERE s."job_id" = ANY(ids) AND s."checkpoint" IS NOT NULL
           AND EXISTS (SELECT 1 FROM {table} AS j
                        WHERE j.{id} = s."job_id" AND j.{state} = 'completed');
    END IF;"#,
        side_literal = side.replace('\'', "''"),
        table = rel.quoted(),
        id = quote(&c.id),
        state = quote(&c.state),
    );
    let functions = [
        AdminFunction {
            name: "complete_jobs",
            extra_params: String::new(),
            checks: String::new(),
            states: &["queued", "errored", "failed", "canceled"],
            sets: complete_sets,
            after: side_checkpoints,
        },
        AdminFunction {
            name: "permanently_fail_jobs",
            extra_params: ",\n    reason text DEFAULT NULL".into(),
            checks: String::new(),
            states: &["queued", "errored"],
            sets: vec![
                set(&c.state, "'failed'".into()),
                set(
                    &c.failure_message,
                    "COALESCE(reason, 'failed by an operator')".into(),
                ),
                set(&c.finished_at, "clock_timestamp()".into()),
            ],
            after: String::new(),
        },
        AdminFunction {
            name: "reschedule_jobs",
            extra_params: reschedule_params,
            checks: reschedule_checks,
            states: &["queued", "errored", "failed", "canceled"],
            sets: reschedule_sets,
            after: String::new(),
        },
    ];
    let table = rel.quoted();
    let (id, state) = (quote(&c.id), quote(&c.state));
    let mut sql = String::new();
    for f in functions {
        let states = f
            .states
            .iter()
            .map(|s| format!("'{s}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let (declare, waiting) = if f.name == "reschedule_jobs" {
            (
                "\nDECLARE\n    still_waiting bigint[] := '{}';",
                still_waiting_sql(&rel, &c, &states),
            )
        } else {
            ("", String::new())
        };
        if f.name == "reschedule_jobs" {
            // Its parameters follow the table's optional columns.
            sql.push_str(&drop_other_overloads(&rel, f.name, &reschedule_signature));
        }
        sql.push_str(&format!(
            r#"-- {table}: {name}, leaving processing jobs alone; (id, outcome) per requested id,
-- at most {MAX_FUNCTION_IDS} ids per call.
CREATE OR REPLACE FUNCTION {function}(
    ids bigint[]{extra_params}
) RETURNS TABLE (id bigint, outcome text) LANGUAGE plpgsql AS $dbworker$
#variable_conflict use_variable{declare}
BEGIN{bound}{checks}
    -- Lock the rows to change first, so no claim takes one in between and
    -- each outcome is exact. NO KEY UPDATE, like the claim: processing rows
    -- are not in the set, so no running job waits on this.
    PERFORM 1 FROM {table} AS j
     WHERE j.{id} = ANY(ids) AND j.{state} IN ({states})
     ORDER BY j.{id} FOR NO KEY UPDATE OF j;{waiting}
    RETURN QUERY
    WITH done AS (
        UPDATE {table} AS j SET {sets}
         WHERE j.{id} = ANY(ids) AND j.{state} IN ({states})
        RETURNING j.{id} AS done_id
    )
    SELECT r.job_id, CASE
               WHEN d.done_id IS NOT NULL THEN 'done'
               WHEN j.{id} IS NULL THEN 'missing'
               WHEN j.{state} = 'processing' THEN 'processing'
               ELSE 'skipped'
           END
      FROM unnest(ids) WITH ORDINALITY AS r(job_id, n)
      LEFT JOIN done AS d ON d.done_id = r.job_id
      LEFT JOIN {table} AS j ON j.{id} = r.job_id
     ORDER BY r.n;{after}
END
$dbworker$;

"#,
            name = f.name,
            function = name(f.name),
            extra_params = f.extra_params,
            bound = bound_ids("ids"),
            checks = f.checks,
            sets = f.sets.join(", "),
            after = f.after,
        ));
    }
    if columns.keys {
        sql.push_str(&format!(
            r#"-- {table}: removes the waiting job holding a key; a processing holder runs on without
-- the key{cap_note}.
CREATE OR REPLACE FUNCTION {function}(
    job_key text
) RETURNS TABLE (id bigint, outcome text) LANGUAGE plpgsql AS $dbworker$
#variable_conflict use_variable
BEGIN
    PERFORM 1 FROM {table} AS j
     WHERE j."job_key" = job_key AND j.{state} IN ('queued', 'errored')
       FOR UPDATE OF j;
    RETURN QUERY
    WITH gone AS (
        DELETE FROM {table} AS j
         WHERE j."job_key" = job_key AND j.{state} IN ('queued', 'errored')
        RETURNING j.{id} AS gone_id
    ), released AS (
        UPDATE {table} AS j SET "job_key" = NULL{cap}
         WHERE j."job_key" = job_key AND j.{state} = 'processing'
        RETURNING j.{id} AS released_id
    )
    SELECT g.gone_id::bigint, 'done' FROM gone AS g
    UNION ALL
    SELECT r.released_id::bigint, 'processing' FROM released AS r;
END
$dbworker$;
"#,
            function = name("remove_job"),
            cap = if columns.max_retries {
                format!(r#", "max_retries" = j.{}"#, quote(&c.num_failures))
            } else {
                String::new()
            },
            cap_note = if columns.max_retries {
                " and will not be retried"
            } else {
                ""
            },
        ));
    }
    Ok(sql)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_and_optional_columns_reach_the_functions() {
        let renames = HashMap::from([("state".to_owned(), "\"it's\"".to_owned())]);
        let f = admin_functions_sql("\"My Jobs\"", &renames, OptionalColumns::default()).unwrap();
        assert!(f.contains(r#"CREATE OR REPLACE FUNCTION "My Jobs_complete_jobs"("#));
        assert!(f.contains(r#"j."it's" IN ('queued', 'errored')"#), "{f}");
        assert!(!f.contains("remove_job") && !f.contains("priority"), "{f}");
        let all = admin_functions_sql("jobs", &HashMap::new(), OptionalColumns::all()).unwrap();
        assert!(all.contains(r#""jobs_remove_job"("#));
        assert!(all.contains(r#""priority" = COALESCE(priority, j."priority")"#));
        let add = add_jobs_function_sql("jobs", &HashMap::new(), OptionalColumns::all()).unwrap();
        assert!(add.contains(r#"RETURN NEXT "jobs_enqueue"("#));
        assert!(
            add.contains("priority => (spec->>'priority')::integer"),
            "{add}"
        );
    }
}
