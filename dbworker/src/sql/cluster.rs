//! The node registry and leader election by lease.
//!
//! Written as text: `INSERT … ON CONFLICT` with expressions built from several
//! bound values and `RETURNING` is clearer here than sea-query's builder, and every
//! value is still bound.

use super::*;

/// What a process registers about itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeRow<'a> {
    pub(crate) host: &'a str,
    pub(crate) pid: i32,
    pub(crate) version: &'a str,
    pub(crate) queues: &'a [String],
    pub(crate) handlers: u32,
}

/// Registers a process; the database makes its id `host:pid:random`.
pub(crate) fn node_register(nodes: &Relation, o: NodeRow<'_>) -> Statement {
    raw(
        format!(
            "INSERT INTO {} (\"id\", \"host\", \"pid\", \"version\", \"queues\", \"handlers\") \
             VALUES ($1 || ':' || $2 || ':' || substr(md5(random()::text || clock_timestamp()::text), 1, 8), $1, $2, $3, $4, $5) \
             RETURNING \"id\"",
            nodes.quoted()
        ),
        vec![
            o.host.into(),
            o.pid.into(),
            o.version.into(),
            o.queues.to_vec().into(),
            i32::try_from(o.handlers).unwrap_or(i32::MAX).into(),
        ],
    )
}

/// A process's heartbeat; registers it again (keeping its id) if its row was
/// removed meanwhile.
pub(crate) fn node_heartbeat(nodes: &Relation, id: &str, o: NodeRow<'_>) -> Statement {
    raw(
        format!(
            "INSERT INTO {} (\"id\", \"host\", \"pid\", \"version\", \"queues\", \"handlers\") \
             VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (\"id\") DO UPDATE SET \"heartbeat_at\" = now()",
            nodes.quoted()
        ),
        vec![
            id.into(),
            o.host.into(),
            o.pid.into(),
            o.version.into(),
            o.queues.to_vec().into(),
            i32::try_from(o.handlers).unwrap_or(i32::MAX).into(),
        ],
    )
}

/// Removes a process's row.
pub(crate) fn node_deregister(nodes: &Relation, id: &str) -> Statement {
    raw(
        format!("DELETE FROM {} WHERE \"id\" = $1", nodes.quoted()),
        vec![id.into()],
    )
}

/// Live processes (heartbeat younger than `dead_after`, database clock).
pub(crate) fn nodes_live(nodes: &Relation, dead_after: std::time::Duration) -> Statement {
    raw(
        format!(
            "SELECT \"id\", \"host\", \"pid\", \"version\", \"queues\", \"handlers\", \
             EXTRACT(EPOCH FROM now() - \"started_at\")::float8 AS \"up\", \
             EXTRACT(EPOCH FROM now() - \"heartbeat_at\")::float8 AS \"age\" \
             FROM {} WHERE \"heartbeat_at\" >= now() - make_interval(secs => $1::float8) ORDER BY \"id\"",
            nodes.quoted()
        ),
        vec![dead_after.as_secs_f64().into()],
    )
}

/// Forgets processes dead for longer than `older_than` (their jobs were
/// rescued long since).
pub(crate) fn nodes_prune(nodes: &Relation, older_than: std::time::Duration) -> Statement {
    raw(
        format!(
            "DELETE FROM {} WHERE \"heartbeat_at\" < now() - make_interval(secs => $1::float8)",
            nodes.quoted()
        ),
        vec![older_than.as_secs_f64().into()],
    )
}

/// Takes the scope's lease if it is free or expired, or renews it if this
/// node holds it; returns the holder only when it is this node.
pub(crate) fn leader_acquire(
    leaders: &Relation,
    scope: &str,
    node_id: &str,
    lease: std::time::Duration,
) -> Statement {
    let t = leaders.quoted();
    raw(
        format!(
            "INSERT INTO {t} AS \"l\" (\"scope\", \"node_id\", \"acquired_at\", \"expires_at\") \
             VALUES ($1, $2, now(), now() + make_interval(secs => $3::float8)) \
             ON CONFLICT (\"scope\") DO UPDATE SET \"node_id\" = EXCLUDED.\"node_id\", \
               \"acquired_at\" = CASE WHEN \"l\".\"node_id\" = EXCLUDED.\"node_id\" THEN \"l\".\"acquired_at\" ELSE now() END, \
               \"expires_at\" = EXCLUDED.\"expires_at\" \
             WHERE \"l\".\"node_id\" = EXCLUDED.\"node_id\" OR \"l\".\"expires_at\" < now() \
             RETURNING \"l\".\"node_id\""
        ),
        vec![scope.into(), node_id.into(), lease.as_secs_f64().into()],
    )
}

/// Gives up the scope's lease if this node holds it.
pub(crate) fn leader_release(leaders: &Relation, scope: &str, node_id: &str) -> Statement {
    raw(
        format!(
            "DELETE FROM {} WHERE \"scope\" = $1 AND \"node_id\" = $2",
            leaders.quoted()
        ),
        vec![scope.into(), node_id.into()],
    )
}

/// The holder of the scope's unexpired lease.
pub(crate) fn leader_current(leaders: &Relation, scope: &str) -> Statement {
    raw(
        format!(
            "SELECT \"node_id\" FROM {} WHERE \"scope\" = $1 AND \"expires_at\" > now()",
            leaders.quoted()
        ),
        vec![scope.into()],
    )
}
