//! Snapshot tests of the rendered SQL: every statement, for a table with a
//! renamed column, and the claim through a view. The snapshots live in
//! `src/sql/snapshots/`; `UPDATE_SNAPSHOTS=1 cargo test -p dbworker --lib` rewrites them.

use std::path::PathBuf;

use super::*;
use crate::options::StoreOptions;

fn enqueue_target() -> Target {
    let mut o = crate::EnqueueOptions::new("app.example_jobs");
    o.alternate_column_names
        .insert("state".into(), "status".into());
    o.key_column = Some("job_key".into());
    o.queue_column = Some("queue".into());
    o.priority_column = Some("priority".into());
    o.max_retries_column = Some("max_retries".into());
    o.resolve().unwrap()
}

fn resolved(view: bool) -> Resolved {
    let mut o = StoreOptions::<()>::new("s", "example_jobs j", |_| Ok(()));
    if view {
        o.view_name = Some("example_jobs_with_repository_name v".into());
        o.order_by = Some("v.repository_id, v.id DESC NULLS LAST".into());
    }
    o.alternate_column_names
        .insert("state".into(), "status".into());
    o.max_num_retries = 2;
    o.resolve().unwrap()
}

fn statements() -> Vec<(&'static str, Statement)> {
    let t = resolved(false);
    let v = resolved(true);
    let e = enqueue_target();
    let paused = {
        let mut o = StoreOptions::<()>::new("s", "app.jobs j", |_| Ok(()));
        o.pause_table = Some("dbworker_pauses".into());
        o.queue_column = Some("queue".into());
        o.resolve().unwrap()
    };
    let pauses = Relation::parse("pause_table", "dbworker_pauses").unwrap();
    let limited = {
        let mut o = StoreOptions::<()>::new("s", "app.jobs j", |_| Ok(()));
        o.limit_table = Some("dbworker_limits".into());
        o.queue_column = Some("queue".into());
        o.resolve().unwrap()
    };
    let purge = crate::PurgeOptions::new("app.jobs").resolve().unwrap();
    let archive = {
        let mut o = crate::PurgeOptions::new("app.jobs");
        o.archive_table = Some("app.jobs_archive".into());
        o.resolve().unwrap()
    };
    let keyed = NewJob::new()
        .set("payload", "p")
        .queue("emails")
        .key("k", KeyMode::Replace);
    let cost = || Expr::cust_with_values("j.cost <= $1", [5]);
    vec![
        ("claim", claim(&t, "host", &[cost()], 3, false)),
        ("claim_with_record", claim(&t, "host", &[cost()], 3, true)),
        ("claim_through_view", claim(&v, "host", &[cost()], 3, true)),
        ("lock_claimed", lock_claimed(&t, 1, 2)),
        ("select_records", select_records(&t, vec![1, 2])),
        (
            "select_records_through_view",
            select_records(&v, vec![1, 2]),
        ),
        ("heartbeat", heartbeat(&t, vec![1], vec![2])),
        ("mark_complete", mark_complete(&t, 1, 2)),
        ("mark_errored", mark_errored(&t, 1, 2, "m")),
        ("mark_failed", mark_failed(&t, 1, 2, "m")),
        ("requeue", requeue(&t, 1, 2)),
        (
            "mark_batch",
            mark_batch(
                &t,
                &[Mark {
                    id: 1,
                    token: 2,
                    kind: MarkKind::Errored,
                    message: "m".into(),
                }],
            ),
        ),
        ("complete_batch", complete_batch(&t, vec![1], vec![2])),
        ("requeue_lost", requeue_lost(&t, 1, 2, "m")),
        ("log_append", log_append(&t, 1, 2, "{}".into())),
        ("log_update", log_update(&t, 1, 2, 0, "{}".into())),
        ("log_len", log_len(&t, 1, 2)),
        (
            "reset_stalled",
            reset_stalled(&t.table, &t.columns, 5.0, None, 3, "m"),
        ),
        (
            "reset_stalled_or_orphaned",
            reset_stalled(
                &t.table,
                &t.columns,
                5.0,
                Some(&(
                    Relation::parse("node_table", "dbworker_nodes").unwrap(),
                    std::time::Duration::from_secs(10),
                )),
                3,
                "m",
            ),
        ),
        ("queued_count", queued_count(&t)),
        ("any_queued", any_queued(&t)),
        ("max_age_in_queue", max_age_in_queue(&t)),
        ("relation_columns", relation_columns(&t.table)),
        ("relation_access", relation_access(&t.table)),
        ("probe_expressions", probe_expressions(&v)),
        (
            "enqueue_rows",
            enqueue_rows(
                &e,
                &[
                    &NewJob::new().set("payload", "a").priority(2).max_retries(1),
                    &NewJob::new()
                        .set("cost", 3)
                        .run_after(std::time::Duration::from_secs(5)),
                ],
            ),
        ),
        (
            "enqueue_keyed_replace",
            enqueue_keyed(&e, &keyed, "k", KeyMode::Replace),
        ),
        (
            "enqueue_keyed_preserve_run_at",
            enqueue_keyed(&e, &keyed, "k", KeyMode::PreserveRunAt),
        ),
        (
            "enqueue_keyed_dedupe_only",
            enqueue_keyed(&e, &keyed, "k", KeyMode::DedupeOnly),
        ),
        ("live_job_with_key", live_job_with_key(&e, "k")),
        ("claim_unless_paused", claim(&paused, "host", &[], 3, true)),
        ("claim_within_limits", claim(&limited, "host", &[], 3, true)),
        ("claim_lock", claim_lock(&limited)),
        ("pause", pause(&pauses, "app.jobs", "emails", "ops")),
        ("resume", resume(&pauses, "app.jobs", "emails")),
        ("list_pauses", list_pauses(&pauses, "app.jobs")),
        (
            "purge_batch",
            purge_batch(
                &purge,
                JobState::Completed,
                std::time::Duration::from_secs(60),
                100,
            ),
        ),
        (
            "purge_batch_to_archive",
            purge_batch(
                &archive,
                JobState::Failed,
                std::time::Duration::from_secs(60),
                100,
            ),
        ),
        ("explain_keyed_insert", explain_keyed_insert(&e)),
    ]
}

#[test]
fn rendered_sql_matches_the_snapshots() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/sql/snapshots");
    let update = std::env::var_os("UPDATE_SNAPSHOTS").is_some();
    let mut mismatches = Vec::new();
    for (name, statement) in statements() {
        let path = dir.join(format!("{name}.sql"));
        let rendered = format!("{}\n", statement.sql);
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &rendered).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_default();
        if expected != rendered {
            mismatches.push(format!(
                "{name}:\n  expected: {expected}  rendered: {rendered}"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "SQL changed (UPDATE_SNAPSHOTS=1 to accept):\n{}",
        mismatches.join("\n")
    );
}

#[test]
fn user_values_are_bound_not_rendered() {
    let t = resolved(false);
    let s = claim(&t, "evil'); DROP TABLE x; --", &[], 1, true);
    assert!(!s.sql.contains("evil"), "{}", s.sql);
    let s = mark_failed(&t, 1, 2, "it's broken");
    assert!(!s.sql.contains("broken"), "{}", s.sql);
    let job = NewJob::new()
        .set("payload", "it's mine")
        .key("k'ey", KeyMode::Replace);
    let s = enqueue_keyed(&enqueue_target(), &job, "k'ey", KeyMode::Replace);
    assert!(
        !s.sql.contains("mine") && !s.sql.contains("k'ey"),
        "{}",
        s.sql
    );
}

#[test]
fn identifiers_are_quoted() {
    assert_eq!(quote("jobs"), "\"jobs\"");
    assert_eq!(quote("we\"ird"), "\"we\"\"ird\"");
    let s = queued_count(&resolved(false));
    assert!(s.sql.contains("\"example_jobs\" AS \"j\""), "{}", s.sql);
    assert!(s.sql.contains("\"j\".\"status\""), "{}", s.sql);
}

#[test]
fn order_by_terms_keep_their_direction() {
    let mut q = Query::select();
    q.expr(Expr::val(1));
    order_select(&mut q, "a.x, lower(a.y) DESC, a.z asc nulls first");
    let sql = q.to_string(PostgresQueryBuilder);
    assert!(
        sql.ends_with("ORDER BY a.x ASC, lower(a.y) DESC, a.z ASC NULLS FIRST"),
        "{sql}"
    );
}
