//! The job table's start-up check: every relation, column, type, index and
//! privilege the description names, and the optional columns found when
//! asked to detect them. All problems are collected into one error.

use sqlx::{PgPool, Row};

use crate::columns::{
    AWAITING, BLOCKED_BY, FAIR_COST, FAIR_KEY, FAIR_TAG, HAS_DEPENDENTS, STANDARD_LIMIT_TABLE,
    STANDARD_PAUSE_TABLE, TASK_NAME, TRACE_FOLLOWS, TRACEPARENT, TRACESTATE, UPSTREAM_IDS,
    WORKFLOW_ID, deps_table, fair_due_trigger, fair_triggers, fair_weights_table, signals_table,
};
use crate::error::{Error, Result, has_sqlstate};
use crate::schema_check::{
    self as schema, check_access, check_table, columns_of, jsonb_column_problem,
};
use crate::sql::{self, ErrorHistory, Table};

/// Optional columns under the names `dbworker migration` gives them, with the
/// types a detected one must have.
const STANDARD_OPTIONAL: [(&str, &[&str]); 9] = [
    ("queue", &["text", "varchar", "bpchar"]),
    ("kind", &["text", "varchar", "bpchar"]),
    ("job_key", &["text", "varchar", "bpchar"]),
    ("priority", &["int2", "int4", "int8"]),
    ("max_retries", &["int2", "int4", "int8"]),
    ("flags", &["_text"]),
    ("payload", &["jsonb"]),
    ("result", &["jsonb"]),
    ("errors", &["jsonb"]),
];

/// Checks `t` against the database, after turning on the optional columns it
/// has when `detect` is set; records whether it has `upstream_ids` and, when
/// partitioned with keys, its key table.
pub(crate) async fn check(pool: &PgPool, t: &mut Table, detect: bool) -> Result<()> {
    canonical_name(pool, t).await?;
    let mut problems = Vec::new();
    check_table(pool, &t.table, &t.columns, &mut problems).await?;
    let isolation: String = sql::default_isolation()
        .fetch_one(pool)
        .await
        .map_err(Error::db("schema_check"))?
        .get("isolation");
    if isolation != "read committed" {
        problems.push(format!(
            "transactions default to {isolation} (default_transaction_isolation), but claims, marks and signals need read committed: ALTER ROLE … SET default_transaction_isolation = 'read committed' (or the database's setting)"
        ));
    }
    schema::none(problems)?;
    let existing = columns_of(pool, &t.table).await?;
    if detect {
        // Claims name the flags through the view: flags the view leaves out
        // are not detected (naming them would refuse the view).
        let view_columns = match &t.view {
            Some(view) => Some(columns_of(pool, view).await?),
            None => None,
        };
        detected(t, |name, types| {
            existing
                .get(name)
                .is_some_and(|c| types.contains(&c.ty.as_str()))
                && (name != "flags" || view_columns.as_ref().is_none_or(|v| v.contains_key(name)))
        });
        t.workflows |= existing.contains_key(WORKFLOW_ID);
        t.traces |= [TRACEPARENT, TRACESTATE, TRACE_FOLLOWS]
            .iter()
            .all(|c| existing.contains_key(*c));
        if t.signals.is_none()
            && existing.contains_key(AWAITING)
            && !columns_of(pool, &signals_table(&t.table)).await?.is_empty()
        {
            t.signals = Some(signals_table(&t.table));
        }
    }
    adopt_control_tables(pool, t).await?;
    let mut problems = fairness_problems(pool, t, &existing).await?;
    problems.extend(aging_problems(t));
    problems.extend(super::layout::detect(pool, t, &existing).await?);
    let table = t.table.display_name();
    for (field, column, standard) in [
        ("queue_column", &t.queue_column, "queue"),
        ("kind_column", &t.kind_column, "kind"),
        ("key_column", &t.key_column, "job_key"),
        ("priority_column", &t.priority_column, "priority"),
    ] {
        let Some(column) = column else { continue };
        let types = STANDARD_OPTIONAL
            .iter()
            .find(|(n, _)| *n == standard)
            .map_or(&[][..], |(_, types)| *types);
        match existing.get(column) {
            None => problems.push(format!("table {table} has no column {column} ({field})")),
            Some(col) if !types.contains(&col.ty.as_str()) => problems.push(format!(
                "column {table}.{column} ({field}) has type {}, expected {}",
                col.ty,
                if standard == "priority" {
                    "an integer (smallint, integer or bigint)"
                } else {
                    "text (text, varchar or char)"
                }
            )),
            Some(_) => {}
        }
    }
    if let Some(column) = &t.max_retries_column {
        match existing.get(column) {
            None => problems.push(format!(
                "table {table} has no column {column} (max_retries_column)"
            )),
            Some(col) if !matches!(col.ty.as_str(), "int2" | "int4" | "int8") => {
                problems.push(format!(
                    "column {table}.{column} (max_retries_column) has type {}, expected an integer",
                    col.ty
                ));
            }
            Some(_) => {}
        }
    }
    let jsonb = [
        (
            "payload_column",
            t.payload_column.as_deref(),
            "; `dbworker migration --payload` adds it",
        ),
        (
            "result_column",
            t.result_column.as_deref(),
            "; `dbworker migration --results` adds it",
        ),
        (
            "error_history_column",
            t.error_history
                .as_ref()
                .map(|h: &ErrorHistory| h.column.as_str()),
            "; `dbworker migration --error-history` adds it",
        ),
    ];
    for (field, column, hint) in jsonb {
        if let Some(column) = column {
            problems.extend(jsonb_column_problem(pool, &t.table, column, field, hint).await?);
        }
    }
    if let Some(column) = &t.flags_column {
        problems.extend(flags_column_problems(pool, t, column).await?);
    }
    let mut signal_traces = false;
    if let Some(mailbox) = &t.signals {
        let hint = "`dbworker migration --signals` (dbworker::ddl::signals_sql) adds it";
        if !existing.contains_key(AWAITING) {
            problems.push(format!(
                "table {table} has no column {AWAITING} (signals; {hint})"
            ));
        }
        let columns = columns_of(pool, mailbox).await?;
        // A mailbox from before the senders' trace context: signals work,
        // unlinked (running `--signals` again adds the column).
        signal_traces = t.traces && columns.contains_key(TRACEPARENT);
        for column in [
            "job_id",
            "name",
            "payload",
            "dedupe_key",
            "consumed_at",
            "consumed_token",
        ] {
            if !columns.contains_key(column) {
                problems.push(format!(
                    "signal mailbox {} has no column {column} (signals; {hint})",
                    mailbox.display_name()
                ));
            }
        }
    }
    t.signal_traces = signal_traces;
    problems.extend(super::progress::storage(pool, t, &existing, detect).await?);
    if t.traces {
        for column in [TRACEPARENT, TRACESTATE, TRACE_FOLLOWS] {
            match existing.get(column) {
                None => problems.push(format!(
                    "table {table} has no column {column} (traces; `dbworker migration --traces` adds it)"
                )),
                Some(c) if c.ty != "text" => problems.push(format!(
                    "column {table}.{column} (traces) has type {}, expected text",
                    c.ty
                )),
                Some(_) => {}
            }
        }
    }
    if let Some(pauses) = &t.pause_table {
        problems.extend(schema::pause_table_problems(pool, pauses).await?);
    }
    if let Some(limits) = &t.limit_table {
        problems.extend(schema::limit_table_problems(pool, limits).await?);
    }
    if let Some(column) = &t.limit_key_column
        && !existing.contains_key(column)
    {
        problems.push(format!(
            "table {table} has no column {column} (limit_key_column)"
        ));
    }
    if let Some(view) = &t.view
        && check_access(pool, view, "view", &mut problems).await?
    {
        let view_columns = columns_of(pool, view).await?;
        let name = view.display_name();
        for col in [&t.columns.id, &t.columns.state, &t.columns.process_after] {
            if !view_columns.contains_key(col.as_str()) {
                problems.push(format!("view {name} has no column {col}"));
            }
        }
        // Named through the view's alias by some readers only (queue by
        // `QueueWorkers`' claims, kind and payload by a client's typed
        // reads): they refuse to start without them; pauses and limits read
        // the table's own row.
        t.view_lacks = [&t.queue_column, &t.kind_column, &t.payload_column]
            .into_iter()
            .flatten()
            .filter(|column| !view_columns.contains_key(column.as_str()))
            .cloned()
            .collect();
    }
    schema::none(problems)?;
    if schema::is_partitioned(pool, &t.table).await? {
        t.key_table = super::partitioned::check(pool, t).await?;
    } else if t.key_column.is_some()
        && let Err(err) = sql::explain_keyed_insert(t).execute(pool).await
        // EXPLAIN of an insert needs INSERT (42501, insufficient_privilege
        // otherwise): a reader's role cannot ask, and needs no answer (an
        // enqueuer's start-up names the missing INSERT).
        && !has_sqlstate(&err, "42501")
    {
        let column = t.key_column.as_deref().unwrap_or_default();
        let advice = format!(
            "key column {table}.{column} (key_column) needs a unique index on it WHERE its state is queued, errored or processing (`dbworker migration --keys` prints it)"
        );
        // 42P10: no unique index matches the keyed insert's ON CONFLICT,
        // which the advice says; any other failure is shown as it came.
        let problem = if has_sqlstate(&err, "42P10") {
            advice
        } else {
            format!("{advice}; checking it failed: {err}")
        };
        return Err(Error::Schema {
            problems: vec![problem],
        });
    }
    if t.workflows {
        schema::require_columns(
            pool,
            &t.table,
            "table",
            &[WORKFLOW_ID, TASK_NAME, BLOCKED_BY, HAS_DEPENDENTS],
            "or not visible on the search_path",
        )
        .await?;
        schema::require_columns(
            pool,
            &deps_table(&t.table),
            "dependency table",
            &["job_id", "depends_on", "policy"],
            "(`dbworker migration --workflows` creates it)",
        )
        .await?;
        // Tables migrated before `upstream_ids` existed work as they did:
        // their dependents just do not record what they waited for.
        t.upstream_ids = existing.contains_key(UPSTREAM_IDS);
        // A table with results is read through `DbJob::upstream_results`,
        // which needs the record.
        if t.result_column.is_some() && !t.upstream_ids {
            return Err(Error::Schema {
                problems: vec![format!(
                    "table {table} has results and workflows but no column {UPSTREAM_IDS}, where dependents record the jobs they waited for (`dbworker migration --workflows` or `--results` adds it)"
                )],
            });
        }
    }
    Ok(())
}

/// Names the table by its name alone when it was written schema-qualified
/// but the name alone resolves to it: every process then keys its pause and
/// limit rows, cron schedules and leases the same way, however it wrote the
/// name (the operator's `--table jobs` pauses a worker of `public.jobs`).
async fn canonical_name(pool: &PgPool, t: &mut Table) -> Result<()> {
    if t.table.schema.is_none() {
        return Ok(());
    }
    let row = sql::visible_unqualified(&t.table)
        .fetch_one(pool)
        .await
        .map_err(Error::db("schema_check"))?;
    if row.get::<Option<bool>, _>("same") == Some(true) {
        t.table.schema = None;
    }
    Ok(())
}

/// Adopts the control tables under their standard names when they exist and
/// the options name none: a pause or limit the operator sets there (the CLI
/// and the dashboard write there by default) must hold for every worker of
/// the table, whichever way it was described. Limits set for this table
/// that it cannot apply (no queue column, read through a view, or aging)
/// are said once in the log.
async fn adopt_control_tables(pool: &PgPool, t: &mut Table) -> Result<()> {
    let standard = |name: &str| crate::columns::Relation::parse("pause_table", name);
    if t.pause_table.is_none() {
        let pauses = standard(STANDARD_PAUSE_TABLE)?;
        if !columns_of(pool, &pauses).await?.is_empty() {
            t.pause_table = Some(pauses);
        }
    }
    if t.limit_table.is_none() {
        let limits = standard(STANDARD_LIMIT_TABLE)?;
        if !columns_of(pool, &limits).await?.is_empty() {
            if t.queue_column.is_some() && t.view.is_none() && t.aging.is_none() {
                t.limit_table = Some(limits);
            } else {
                // Aging is not supported with limits: adopting another
                // table's limit table would refuse to start this one.
                let why = if t.view.is_some() {
                    "it reads the table through a view"
                } else if t.aging.is_some() {
                    "it uses aging (JobTableOptions::aging), which limits do not support yet"
                } else {
                    "it has no queue column (set JobTableOptions::queue_column)"
                };
                // Another table's limits are none of this one's business: say
                // it only when the operator set some for this table (or when
                // the rows cannot be read to tell).
                let key = sql::pause_key(&t.table);
                match sql::list_limits(&limits, &key).fetch_all(pool).await {
                    Ok(rows) if rows.is_empty() => tracing::debug!(
                        table = %key,
                        "limit table {STANDARD_LIMIT_TABLE} exists and holds no limit for this table, which could not enforce one: {why}"
                    ),
                    Ok(rows) => tracing::warn!(
                        table = %key,
                        queues = ?rows.iter().map(|r| r.get::<String, _>("queue")).collect::<Vec<_>>(),
                        "limits set in {STANDARD_LIMIT_TABLE} for this table are not enforced by this process: {why}"
                    ),
                    Err(_) => tracing::warn!(
                        table = %key,
                        "limit table {STANDARD_LIMIT_TABLE} exists, but limits set there for this table are not enforced by this process: {why}"
                    ),
                }
            }
        }
    }
    Ok(())
}

/// A table whose tagging triggers exist is fair for every worker (its
/// producers tag jobs for claims in tag order; a worker claiming by id would
/// undo the shares the operator sees). Fair, by the options or the triggers:
/// what is missing of it, and the claim's order, by priority then tag.
async fn fairness_problems(
    pool: &PgPool,
    t: &mut Table,
    existing: &std::collections::HashMap<String, schema::Column>,
) -> Result<Vec<String>> {
    let found: Vec<String> = sql::fair_trigger_names(&t.table)
        .fetch_all(pool)
        .await
        .map_err(Error::db("schema_check"))?
        .iter()
        .map(|r| r.get("name"))
        .collect();
    if t.fair_weights.is_none() && found.is_empty() {
        return Ok(Vec::new());
    }
    let weights = fair_weights_table(&t.table);
    t.fair_weights = Some(weights.clone());
    t.fair_due = found.contains(&fair_due_trigger(&t.table));
    if !t.fair_due {
        tracing::warn!(table = %t.table.display_name(), "fair table without the trigger that tags scheduled jobs when due (run `dbworker migration --fair` again): such jobs keep the tag of when they started to wait");
    }
    let table = t.table.display_name();
    let hint = "`dbworker migration --fair` (dbworker::ddl::fair_claims_sql) adds it";
    let mut problems = Vec::new();
    for (column, types, expected) in [
        (FAIR_KEY, &["text", "varchar", "bpchar"][..], "text"),
        (FAIR_TAG, &["int8"][..], "bigint"),
        (FAIR_COST, &["int2", "int4", "int8"][..], "an integer"),
    ] {
        match existing.get(column) {
            None => problems.push(format!(
                "table {table} is fair but has no column {column}; {hint}"
            )),
            Some(c) if !types.contains(&c.ty.as_str()) => problems.push(format!(
                "column {table}.{column} has type {}, expected {expected}",
                c.ty
            )),
            Some(_) => {}
        }
    }
    for trigger in fair_triggers(&t.table) {
        if !found.contains(&trigger) {
            problems.push(format!(
                "table {table} is fair but has no trigger {trigger}, which tags its jobs; {hint}"
            ));
        }
    }
    if columns_of(pool, &weights).await?.is_empty() {
        problems.push(format!(
            "table {table} is fair but its weight table {} does not exist; {hint}",
            weights.display_name()
        ));
    }
    let source = t.source();
    if t.view.is_some() && !columns_of(pool, source).await?.contains_key(FAIR_TAG) {
        problems.push(format!(
            "view {} has no column {FAIR_TAG}, which fair claims order by",
            source.display_name()
        ));
    }
    match &t.order_by {
        None => {
            let read = |c: &str| t.read_column(c);
            let priority = t
                .priority_column
                .as_deref()
                .map(|p| format!("{} DESC, ", read(p)))
                .unwrap_or_default();
            t.order_by = Some(format!(
                "{priority}{}, {}",
                read(FAIR_TAG),
                read(&t.columns.id)
            ));
        }
        Some(order) if !order.contains(FAIR_TAG) => problems.push(format!(
            "table {table} is fair, but order_by {order:?} does not order by {FAIR_TAG}: leave it unset (priority, then tag) or put {FAIR_TAG} after the priority"
        )),
        Some(_) => {}
    }
    Ok(problems)
}

/// What keeps aging from working on `t` as checked: a limit table it adopted
/// (limits rank rows in their own order), or an order that does not start
/// with the highest priority; and the claim's order, by priority then id.
fn aging_problems(t: &mut Table) -> Vec<String> {
    let (Some(_), Some(priority)) = (&t.aging, t.priority_column.clone()) else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    if let Some(limits) = &t.limit_table {
        problems.push(format!(
            "aging is not supported with limits yet, and table {} honours the limit table {}",
            t.table.display_name(),
            limits.display_name()
        ));
    }
    match &t.order_by {
        // Each level is read in the table's order, which must therefore
        // start at the level: the highest priority first.
        None => {
            t.order_by = Some(format!(
                "{} DESC, {}",
                t.read_column(&priority),
                t.read_column(&t.columns.id)
            ));
        }
        Some(order) => {
            let first = crate::sql::order_terms(order).into_iter().next();
            if !matches!(&first, Some((term, sea_query::Order::Desc, _)) if term.contains(priority.as_str()))
            {
                problems.push(format!(
                    "aging raises priorities, so order_by {order:?} must start with {priority} DESC (the highest first)"
                ));
            }
        }
    }
    problems
}

/// Turns on each optional column not named in the options that `has` finds
/// under its standard name with a usable type.
fn detected(t: &mut Table, has: impl Fn(&str, &[&str]) -> bool) {
    let found = |name: &str| {
        STANDARD_OPTIONAL
            .iter()
            .find(|(n, _)| *n == name)
            .filter(|(n, types)| has(n, types))
            .map(|(n, _)| (*n).to_owned())
    };
    for (slot, name) in [
        (&mut t.queue_column, "queue"),
        (&mut t.kind_column, "kind"),
        (&mut t.key_column, "job_key"),
        (&mut t.priority_column, "priority"),
        (&mut t.max_retries_column, "max_retries"),
        (&mut t.flags_column, "flags"),
        (&mut t.payload_column, "payload"),
        (&mut t.result_column, "result"),
    ] {
        if slot.is_none() {
            *slot = found(name);
        }
    }
    if t.error_history.is_none() {
        t.error_history = found("errors").map(|column| ErrorHistory {
            column,
            limit: crate::table::DEFAULT_ERROR_HISTORY_LIMIT,
        });
    }
}

/// What is wrong with the flags column: missing from the relation claims
/// read (the view, or the table), or not `text[]`.
async fn flags_column_problems(pool: &PgPool, t: &Table, column: &str) -> Result<Vec<String>> {
    let rel = t.source();
    let existing = columns_of(pool, rel).await?;
    let name = rel.display_name();
    Ok(match existing.get(column) {
        // A missing relation is reported by its own check.
        _ if existing.is_empty() => Vec::new(),
        None => vec![format!(
            "{name} has no column {column} (flags_column; `dbworker migration --flags` adds it)"
        )],
        Some(col) if col.ty != "_text" => vec![format!(
            "column {name}.{column} (flags_column) has type {}, expected text[]",
            col.ty
        )],
        Some(_) => Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::JobTableOptions;

    #[test]
    fn detection_takes_standard_names_with_usable_types_and_keeps_named_ones() {
        let mut options = JobTableOptions::new("jobs");
        options.queue_column = Some("lane".into());
        let mut t = options.resolve().unwrap();
        detected(&mut t, |name, types| match name {
            "queue" | "kind" => types.contains(&"text"),
            // Present, but json rather than jsonb: not usable as the payload.
            "payload" => types.contains(&"json"),
            "errors" => true,
            _ => false,
        });
        assert_eq!(t.queue_column.as_deref(), Some("lane"));
        assert_eq!(t.kind_column.as_deref(), Some("kind"));
        assert_eq!(t.payload_column, None);
        assert_eq!(t.key_column, None);
        assert_eq!(
            t.error_history.as_ref().map(|h| h.column.as_str()),
            Some("errors")
        );
    }
}
