//! Log consumers: assignments, checkpoints and batches of the events table.
//!
//! Written as text: the statements join the events table on a position index
//! with `LEFT JOIN`, `EXISTS` and data-modifying CTEs that sea-query cannot
//! express; every value is still bound.

use super::*;

/// The events table and the consumers' control tables.
#[derive(Debug, Clone)]
pub(crate) struct LogTables {
    pub(crate) events: Relation,
    pub(crate) position_column: String,
    pub(crate) column_expressions: Vec<String>,
    pub(crate) assignments: Relation,
    pub(crate) checkpoints: Relation,
}

/// Consumers assigned to `node` among `names`, with their checkpoint, that
/// have events after it (by the position index), by name, at most `limit`.
pub(crate) fn log_pending(
    l: &LogTables,
    node: &str,
    names: Vec<String>,
    limit: Option<usize>,
) -> Statement {
    let e = &l.events;
    raw(
        format!(
            "SELECT \"a\".\"consumer_name\", COALESCE(\"c\".\"last_position\", 0)::bigint AS \"last_position\" \
             FROM {assignments} AS \"a\" LEFT JOIN {checkpoints} AS \"c\" ON \"c\".\"consumer_name\" = \"a\".\"consumer_name\" \
             WHERE \"a\".\"node_id\" = $1 AND \"a\".\"consumer_name\" = ANY($2::text[]) \
               AND EXISTS (SELECT 1 FROM {events} AS {ea} WHERE {ea}.{pos} > COALESCE(\"c\".\"last_position\", 0)) \
             ORDER BY 1 LIMIT $3",
            assignments = l.assignments.quoted(),
            checkpoints = l.checkpoints.quoted(),
            events = e.quoted(),
            ea = quote(&e.alias),
            pos = quote(&l.position_column),
        ),
        vec![
            node.into(),
            names.into(),
            i64::try_from(limit.unwrap_or(usize::MAX))
                .unwrap_or(i64::MAX)
                .into(),
        ],
    )
}

/// Locks the consumer's assignment row if `node` still holds it: the proof of
/// ownership every batch transaction starts with.
pub(crate) fn log_lock_assignment(l: &LogTables, consumer: &str, node: &str) -> Statement {
    raw(
        format!(
            "SELECT 1 AS \"owned\" FROM {} WHERE \"consumer_name\" = $1 AND \"node_id\" = $2 FOR UPDATE",
            l.assignments.quoted()
        ),
        vec![consumer.into(), node.into()],
    )
}

/// The consumer's checkpoint, created at 0 when it has none.
pub(crate) fn log_checkpoint(l: &LogTables, consumer: &str) -> Statement {
    let t = l.checkpoints.quoted();
    raw(
        format!(
            "WITH \"new\" AS (INSERT INTO {t} (\"consumer_name\", \"last_position\") VALUES ($1, 0) \
               ON CONFLICT (\"consumer_name\") DO NOTHING RETURNING \"last_position\") \
             SELECT \"last_position\" FROM \"new\" UNION ALL \
             SELECT \"last_position\" FROM {t} WHERE \"consumer_name\" = $1"
        ),
        vec![consumer.into()],
    )
}

/// The next batch of events after `after`, in position order, with each
/// event's position after the configured expressions.
pub(crate) fn log_batch(l: &LogTables, after: i64, size: u32) -> Statement {
    let e = &l.events;
    let ea = quote(&e.alias);
    let pos = quote(&l.position_column);
    raw(
        format!(
            "SELECT {exprs}, {ea}.{pos}::bigint AS {position} FROM {events} AS {ea} \
             WHERE {ea}.{pos} > $1 ORDER BY {ea}.{pos} LIMIT $2",
            exprs = l.column_expressions.join(", "),
            position = quote(LOG_POSITION),
            events = e.quoted(),
        ),
        vec![after.into(), i64::from(size).into()],
    )
}

/// The column `log_batch` returns each event's position in.
pub(crate) const LOG_POSITION: &str = "dbworker_position";

/// Advances a checkpoint, fenced by the position the batch started from.
pub(crate) fn log_advance(l: &LogTables, consumer: &str, from: i64, to: i64) -> Statement {
    raw(
        format!(
            "UPDATE {} SET \"last_position\" = $3, \"updated_at\" = now() \
             WHERE \"consumer_name\" = $1 AND \"last_position\" = $2",
            l.checkpoints.quoted()
        ),
        vec![consumer.into(), from.into(), to.into()],
    )
}

/// The consumers `node` holds now.
pub(crate) fn log_assigned(l: &LogTables, node: &str) -> Statement {
    raw(
        format!(
            "SELECT \"consumer_name\" FROM {} WHERE \"node_id\" = $1",
            l.assignments.quoted()
        ),
        vec![node.into()],
    )
}

/// Assigns `names` (sorted) round-robin over the live nodes (sorted by id):
/// inserts missing assignments and moves those whose node changes, skipping
/// rows a running batch locks (they move at a later rebalance, once the batch
/// ends — a process cut off mid-batch keeps its consumer until its backend
/// is gone). Returns the rows it wrote.
pub(crate) fn log_rebalance(
    assignments: &Relation,
    nodes: &Relation,
    names: Vec<String>,
    dead_after: std::time::Duration,
) -> Statement {
    let t = assignments.quoted();
    raw(
        format!(
            "WITH \"live\" AS (SELECT \"id\", row_number() OVER (ORDER BY \"id\") - 1 AS \"i\", count(*) OVER () AS \"n\" \
               FROM {nodes} WHERE \"heartbeat_at\" >= now() - make_interval(secs => $2::float8)), \
             \"target\" AS (SELECT \"w\".\"name\", \"live\".\"id\" AS \"node\" \
               FROM unnest($1::text[]) WITH ORDINALITY AS \"w\"(\"name\", \"i\") \
               JOIN \"live\" ON \"live\".\"i\" = (\"w\".\"i\" - 1) % \"live\".\"n\"), \
             \"inserted\" AS (INSERT INTO {t} (\"consumer_name\", \"node_id\") \
               SELECT \"name\", \"node\" FROM \"target\" ON CONFLICT (\"consumer_name\") DO NOTHING \
               RETURNING \"consumer_name\", \"node_id\"), \
             \"movable\" AS (SELECT \"a\".\"consumer_name\", \"target\".\"node\" FROM {t} AS \"a\" \
               JOIN \"target\" ON \"target\".\"name\" = \"a\".\"consumer_name\" \
               WHERE \"a\".\"node_id\" IS DISTINCT FROM \"target\".\"node\" FOR UPDATE OF \"a\" SKIP LOCKED), \
             \"moved\" AS (UPDATE {t} AS \"a\" SET \"node_id\" = \"movable\".\"node\", \"updated_at\" = now() \
               FROM \"movable\" WHERE \"a\".\"consumer_name\" = \"movable\".\"consumer_name\" \
               RETURNING \"a\".\"consumer_name\", \"a\".\"node_id\") \
             SELECT \"consumer_name\", \"node_id\" FROM \"inserted\" UNION ALL SELECT \"consumer_name\", \"node_id\" FROM \"moved\"",
            nodes = nodes.quoted(),
        ),
        vec![names.into(), dead_after.as_secs_f64().into()],
    )
}

/// Every consumer's assignment.
pub(crate) fn log_assignments(assignments: &Relation) -> Statement {
    raw(
        format!(
            "SELECT \"consumer_name\", \"node_id\" FROM {} ORDER BY 1",
            assignments.quoted()
        ),
        Vec::new(),
    )
}

/// Each consumer's checkpoint beside the log's last position.
pub(crate) fn log_lag(
    events: &Relation,
    position_column: &str,
    checkpoints: &Relation,
) -> Statement {
    let ea = quote(&events.alias);
    let pos = quote(position_column);
    raw(
        format!(
            "SELECT \"c\".\"consumer_name\", \"c\".\"last_position\"::bigint AS \"last_position\", \
               COALESCE((SELECT max({ea}.{pos}) FROM {events} AS {ea}), 0)::bigint AS \"latest\" \
             FROM {checkpoints} AS \"c\" ORDER BY 1",
            events = events.quoted(),
            checkpoints = checkpoints.quoted(),
        ),
        Vec::new(),
    )
}
