//! Snapshot tests of the rendered SQL: every statement, for a table with a
//! renamed column, and the claim through a view. The snapshots live in
//! `src/sql/snapshots/`; `UPDATE_SNAPSHOTS=1 cargo test -p dbworker --lib` rewrites them.
//! The parameter structs are built here directly, as the features' options
//! resolve them, so the statement layer is tested on its own floor.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use super::claim::order_select;
use super::*;
use crate::job_filter::{FieldFilter, JobFilter, JobSort, PageRequest};
use crate::retry::RetryPolicy;

fn rel(text: &str) -> Relation {
    Relation::parse("table_name", text).unwrap()
}

fn renamed() -> Columns {
    Columns::resolve(&HashMap::from([("state".to_owned(), "status".to_owned())])).unwrap()
}

fn enqueue_target() -> Table {
    let mut t = Table::new(rel("app.example_jobs"), renamed());
    t.key_column = Some("job_key".into());
    t.queue_column = Some("queue".into());
    t.priority_column = Some("priority".into());
    t.max_retries_column = Some("max_retries".into());
    t.flags_column = Some("flags".into());
    t
}

/// `example_jobs j` with `state` renamed, as `StoreOptions` resolves it.
fn table(name: &str) -> StoreParams {
    let table = rel(name);
    StoreParams {
        column_expressions: vec![format!("{}.*", quote(&table.alias))],
        order_by: format!("{}.{}", quote(&table.alias), quote("id")),
        shared: std::sync::Arc::new(Table::new(table, renamed())),
        max_num_retries: 2,
        retry: RetryPolicy::default(),
        max_num_resets: 3,
        candidate_window: 50,
    }
}

fn resolved(view: bool) -> StoreParams {
    let mut t = table("example_jobs j");
    if view {
        let v = rel("example_jobs_with_repository_name v");
        t.column_expressions = vec![format!("{}.*", quote(&v.alias))];
        t.order_by = "v.repository_id, v.id DESC NULLS LAST".into();
        t.view = Some(v);
    }
    t
}

fn admin_table() -> Table {
    let mut t = Table::new(rel("app.example_jobs"), renamed());
    t.queue_column = Some("queue".into());
    t.kind_column = Some("kind".into());
    t.key_column = Some("job_key".into());
    t.priority_column = Some("priority".into());
    t.max_retries_column = Some("max_retries".into());
    t
}

fn log_tables() -> LogTables {
    let events = rel("app.events e");
    LogTables {
        column_expressions: vec![format!("{}.*", quote(&events.alias))],
        events,
        position_column: "position".into(),
        transaction_column: "transaction_id".into(),
        assignments: rel("dbworker_consumer_assignments"),
        checkpoints: rel("dbworker_consumer_checkpoints"),
        type_column: "aggregate_type".into(),
    }
}

fn row(values: &[(String, sea_query::Value)]) -> JobRow<'_> {
    JobRow {
        values,
        run_at: None,
        priority: None,
        queue: None,
        max_retries: None,
        kind: None,
        flags: None,
        payload: None,
    }
}

fn statements() -> Vec<(&'static str, Statement)> {
    let t = resolved(false);
    let v = resolved(true);
    let e = enqueue_target();
    let w = Table::new(rel("app.example_jobs j"), renamed());
    let paused = {
        let mut o = table("app.jobs j");
        o.columns = Columns::resolve(&HashMap::new()).unwrap();
        o.max_num_retries = 10;
        o.pause_table = Some(rel("dbworker_pauses"));
        o.queue_column = Some("queue".into());
        o
    };
    let history = ErrorHistory {
        column: "errors".into(),
        limit: 20,
    };
    let mut h = t.clone();
    h.error_history = Some(history.clone());
    let mut r = t.clone();
    r.result_column = Some("result".into());
    let pauses = Relation::parse("pause_table", "dbworker_pauses").unwrap();
    let limited = {
        let mut o = table("app.jobs j");
        o.columns = Columns::resolve(&HashMap::new()).unwrap();
        o.max_num_retries = 10;
        o.limit_table = Some(rel("dbworker_limits"));
        o.queue_column = Some("queue".into());
        o
    };
    let purge = Table::new(rel("app.jobs"), Columns::resolve(&HashMap::new()).unwrap());
    let archive = rel("app.jobs_archive");
    let payload_p = [("payload".to_owned(), sea_query::Value::from("p"))];
    let keyed = JobRow {
        queue: Some("emails"),
        ..row(&payload_p)
    };
    let payload_a = [("payload".to_owned(), sea_query::Value::from("a"))];
    let cost_3 = [("cost".to_owned(), sea_query::Value::from(3))];
    let flags = ["gpu".to_owned(), "slow".to_owned()];
    let typed_args = sea_query::Value::Json(Some(Box::new(serde_json::json!({"to": "a@b.c"}))));
    let a = admin_table();
    let filter = JobFilter {
        states: vec![JobState::Failed],
        queue: Some("emails".into()),
        kind: Some("send".into()),
        older_than: Some(Duration::from_secs(60)),
        newer_than: Some(Duration::from_secs(3600)),
        failure_contains: Some("timeout".into()),
        fields: vec![FieldFilter::new("payload", &["to", "domain"], "example.com").unwrap()],
        workflow_id: None,
    };
    let nodes = rel("dbworker_nodes");
    let leaders = rel("dbworker_leaders");
    let queues = ["emails".to_owned()];
    let node = NodeRow {
        host: "h",
        pid: 1,
        version: "0.1.0",
        queues: &queues,
        handlers: 8,
    };
    let l = log_tables();
    let cost = || Expr::cust_with_values("j.cost <= $1", [5]);
    vec![
        ("claim", claim(&t, "host", &[cost()], 3, false)),
        ("claim_with_record", claim(&t, "host", &[cost()], 3, true)),
        ("claim_through_view", claim(&v, "host", &[cost()], 3, true)),
        ("eligible_behind", eligible_behind(&t, &[cost()], 1000)),
        (
            "claim_after_cursor",
            claim(&t, "host", &[claim_cursor_condition(&t, 1000)], 3, true),
        ),
        (
            "claim_without_forbidden_flags",
            claim(
                &t,
                "host",
                &[not_flagged(&t, "flags", &["gpu".to_owned()])],
                3,
                true,
            ),
        ),
        ("lock_claimed", lock_claimed(&t, 1, 2)),
        ("select_records", select_records(&t, vec![1, 2])),
        (
            "select_records_through_view",
            select_records(&v, vec![1, 2]),
        ),
        ("heartbeat", heartbeat(&t, vec![1], vec![2])),
        ("mark_complete", mark_complete(&t, 1, 2)),
        (
            "mark_errored",
            mark_errored(&t, 1, 2, "m", &t.retry_rule(None)),
        ),
        ("mark_failed", mark_failed(&t, 1, 2, "m")),
        (
            "snooze",
            snooze(&t, 1, 2, std::time::Duration::from_millis(1500)),
        ),
        (
            "mark_errored_with_payload",
            mark_errored_with_payload(
                &t,
                1,
                2,
                "m",
                &t.retry_rule(None),
                "payload",
                serde_json::json!([1, 2]),
            ),
        ),
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
                    result: String::new(),
                }],
                &t.retry_rule(None),
            ),
        ),
        (
            "complete_batch",
            complete_batch(&t, vec![1], vec![2], vec![String::new()]),
        ),
        (
            "complete_batch_with_results",
            complete_batch(&r, vec![1, 3], vec![2, 4], vec!["{}".into(), String::new()]),
        ),
        (
            "mark_batch_with_results",
            mark_batch(
                &r,
                &[Mark {
                    id: 1,
                    token: 2,
                    kind: MarkKind::Complete,
                    message: String::new(),
                    result: "{\"n\": 1}".into(),
                }],
                &r.retry_rule(None),
            ),
        ),
        (
            "mark_complete_with_result",
            mark_complete_with_result(&r, 1, 2, "result", serde_json::json!({"n": 1})),
        ),
        ("upstream_results", upstream_results(&r, "result", 7)),
        (
            "record_upstreams",
            record_upstreams(&w, vec![3, 3], vec![1, 2]),
        ),
        ("requeue_lost", requeue_lost(&t, 1, 2, "m")),
        ("log_append", log_append(&t, 1, 2, "{}".into())),
        ("log_update", log_update(&t, 1, 2, 0, "{}".into())),
        ("log_len", log_len(&t, 1, 2)),
        (
            "reset_stalled",
            reset_stalled(&t.table, &t.columns, 5.0, None, 3, "m", None),
        ),
        (
            "reset_stalled_with_history",
            reset_stalled(&t.table, &t.columns, 5.0, None, 3, "m", Some(&history)),
        ),
        (
            "mark_errored_with_history",
            mark_errored(&h, 1, 2, "m", &h.retry_rule(None)),
        ),
        ("mark_failed_with_history", mark_failed(&h, 1, 2, "m")),
        ("requeue_lost_with_history", requeue_lost(&h, 1, 2, "m")),
        (
            "mark_batch_with_history",
            mark_batch(
                &h,
                &[Mark {
                    id: 1,
                    token: 2,
                    kind: MarkKind::Failed,
                    message: "m".into(),
                    result: String::new(),
                }],
                &h.retry_rule(None),
            ),
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
                None,
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
                    JobRow {
                        priority: Some(2),
                        max_retries: Some(1),
                        ..row(&payload_a)
                    },
                    JobRow {
                        run_at: Some(RunAt::After(Duration::from_secs(5))),
                        flags: Some(&flags),
                        ..row(&cost_3)
                    },
                ],
            ),
        ),
        (
            "enqueue_typed",
            enqueue_rows(
                &Table {
                    kind_column: Some("kind".into()),
                    payload_column: Some("args".into()),
                    ..enqueue_target()
                },
                &[JobRow {
                    kind: Some("send_email"),
                    payload: Some(&typed_args),
                    queue: Some("emails"),
                    ..row(&[])
                }],
            ),
        ),
        (
            "enqueue_keyed_replace",
            enqueue_keyed(&e, &keyed, "k", OnKey::Replace),
        ),
        (
            "enqueue_keyed_preserve_run_at",
            enqueue_keyed(&e, &keyed, "k", OnKey::PreserveRunAt),
        ),
        (
            "enqueue_keyed_dedupe_only",
            enqueue_keyed(&e, &keyed, "k", OnKey::DedupeOnly),
        ),
        (
            "enqueue_keyed_unsafe_dedupe",
            enqueue_keyed(&e, &keyed, "k", OnKey::UnsafeDedupe),
        ),
        (
            "enqueue_keyed_partitioned_replace",
            enqueue_keyed_partitioned(
                &e,
                &rel("app.example_jobs_keys"),
                &keyed,
                "k",
                OnKey::Replace,
            ),
        ),
        (
            "enqueue_keyed_partitioned_unsafe_dedupe",
            enqueue_keyed_partitioned(
                &e,
                &rel("app.example_jobs_keys"),
                &keyed,
                "k",
                OnKey::UnsafeDedupe,
            ),
        ),
        ("release_key", release_key(&e, "k")),
        ("live_job_with_key", live_job_with_key(&e, "k", false)),
        ("job_with_key_or_failed", live_job_with_key(&e, "k", true)),
        ("claim_unless_paused", claim(&paused, "host", &[], 3, true)),
        ("claim_within_limits", claim(&limited, "host", &[], 3, true)),
        ("claim_lock", claim_lock(&limited, 4)),
        ("claim_lane", claim_lane(&limited, 4, 1)),
        (
            "claim_within_limits_in_a_lane",
            claim_limited(
                &limited,
                "host",
                &[],
                3,
                true,
                LimitedClaim::Lane { threshold: 1024 },
            ),
        ),
        ("pause", pause(&pauses, "app.jobs", "emails", "ops")),
        ("resume", resume(&pauses, "app.jobs", "emails")),
        ("list_pauses", list_pauses(&pauses, "app.jobs")),
        (
            "purge_batch",
            purge_batch(
                &purge,
                None,
                JobState::Completed,
                std::time::Duration::from_secs(60),
                100,
            ),
        ),
        (
            "purge_batch_to_archive",
            purge_batch(
                &purge,
                Some(&archive),
                JobState::Failed,
                std::time::Duration::from_secs(60),
                100,
            ),
        ),
        ("explain_keyed_insert", explain_keyed_insert(&e)),
        (
            "closed_partitions",
            closed_partitions(&rel("app.example_jobs")),
        ),
        (
            "partition_rows",
            partition_rows(
                &rel("app.example_jobs_p20261124"),
                &renamed(),
                &[
                    (JobState::Completed, Duration::from_secs(60)),
                    (JobState::Failed, Duration::from_secs(3600)),
                ],
            ),
        ),
        (
            "partition_keeps_rows",
            partition_keeps_rows(
                &rel("app.example_jobs_p20261124"),
                &renamed(),
                &[(JobState::Completed, Duration::from_secs(60))],
            ),
        ),
        (
            "partition_rows_none_purged",
            partition_rows(&rel("app.example_jobs_p20261124"), &renamed(), &[]),
        ),
        (
            "set_lock_timeout",
            set_lock_timeout(Duration::from_millis(1500)),
        ),
        (
            "detach_partition",
            detach_partition(&rel("app.example_jobs"), &rel("app.example_jobs_p20261124")),
        ),
        (
            "archive_partition",
            archive_partition(&rel("app.archive"), &rel("app.example_jobs_p20261124")),
        ),
        (
            "drop_partition",
            drop_partition(&rel("app.example_jobs_p20261124")),
        ),
        (
            "create_partitions",
            create_partitions(&rel("app.example_jobs"), 3),
        ),
        (
            "create_partitions_exists",
            create_partitions_exists(&rel("app.example_jobs")),
        ),
        ("queue_stats", queue_stats(&paused)),
        ("notify", notify("dbworker_jobs")),
        ("database_now_micros", database_now_micros()),
        (
            "set_limit",
            set_limit(
                &rel("dbworker_limits"),
                "app.jobs",
                "emails",
                LimitRow {
                    max_processing: Some(4),
                    max_per_key: Some(1),
                    rate_per_second: Some(40.0),
                    burst: Some(4),
                },
            ),
        ),
        (
            "remove_limit",
            remove_limit(&rel("dbworker_limits"), "app.jobs", "emails"),
        ),
        (
            "list_limits",
            list_limits(&rel("dbworker_limits"), "app.jobs"),
        ),
        (
            "cron_register",
            cron_register(&rel("dbworker_cron"), "app.jobs", "0 * * * * *"),
        ),
        (
            "cron_state",
            cron_state(&rel("dbworker_cron"), "app.jobs", "0 * * * * *"),
        ),
        (
            "cron_advance",
            cron_advance(&rel("dbworker_cron"), "app.jobs", "0 * * * * *", 7),
        ),
        ("admin_live", admin_live(&a)),
        ("admin_hosts", admin_hosts(&a)),
        ("admin_estimate", admin_estimate(&a)),
        ("admin_show", admin_show(&a, 1)),
        (
            "admin_list",
            admin_list(&a, &filter, &PageRequest::first(50)),
        ),
        (
            "admin_list_by_workflow",
            admin_list(
                &Table {
                    workflows: true,
                    ..a.clone()
                },
                &JobFilter {
                    workflow_id: Some(7),
                    ..JobFilter::default()
                },
                &PageRequest::first(50),
            ),
        ),
        (
            "admin_list_by_failures_newest_first",
            admin_list(
                &a,
                &JobFilter::default(),
                &PageRequest {
                    after: Some(10),
                    after_value: Some("3".into()),
                    newest_first: true,
                    sort: JobSort::Failures,
                    ..PageRequest::first(50)
                },
            ),
        ),
        (
            "admin_select_ids",
            admin_select_ids(&a, &filter, &[JobState::Queued, JobState::Errored], 0, 100),
        ),
        (
            "admin_count",
            admin_count(&a, &filter, &[JobState::Queued, JobState::Errored]),
        ),
        ("admin_requeue", admin_requeue(&a, &[1, 2])),
        ("admin_cancel_waiting", admin_cancel_waiting(&a, &[1, 2])),
        ("admin_request_cancel", admin_request_cancel(&a, &[1, 2])),
        ("admin_fail", admin_fail(&a, &[1, 2], "m")),
        ("admin_delete", admin_delete(&a, &[1, 2])),
        ("admin_complete", admin_complete(&a, &[1, 2])),
        (
            "admin_reschedule",
            admin_reschedule(
                &a,
                &[1, 2],
                &crate::job_filter::Reschedule {
                    run_after: Some(Duration::from_secs(60)),
                    priority: Some(3),
                    num_failures: Some(0),
                    max_retries: Some(5),
                    ..Default::default()
                },
            ),
        ),
        (
            "admin_reschedule_state_only",
            admin_reschedule(&a, &[1], &Default::default()),
        ),
        ("admin_remove_key", admin_remove_key(&a, "k")),
        (
            "admin_processing_key_holder",
            admin_processing_key_holder(&a, "k"),
        ),
        ("admin_recent", admin_recent(&a, Duration::from_secs(300))),
        ("node_register", node_register(&nodes, node)),
        ("node_heartbeat", node_heartbeat(&nodes, "h:1:ab", node)),
        ("node_deregister", node_deregister(&nodes, "h:1:ab")),
        ("nodes_live", nodes_live(&nodes, Duration::from_secs(10))),
        (
            "nodes_prune",
            nodes_prune(&nodes, Duration::from_secs(3600)),
        ),
        (
            "leader_acquire",
            leader_acquire(&leaders, "purger", "h:1:ab", Duration::from_secs(15)),
        ),
        (
            "leader_release",
            leader_release(&leaders, "purger", "h:1:ab", 3),
        ),
        (
            "leader_renew",
            leader_renew(&leaders, "purger", "h:1:ab", 3, Duration::from_secs(15)),
        ),
        (
            "leader_fence",
            leader_fence(&leaders, "purger", "h:1:ab", 3, Duration::from_secs(15)),
        ),
        ("leader_current", leader_current(&leaders, "purger")),
        (
            "log_pending",
            log_pending(&l, "h:1:ab", vec!["billing".into()], Some(4)),
        ),
        (
            "log_lock_assignment",
            log_lock_assignment(&l, "billing", "h:1:ab"),
        ),
        ("log_held", log_held(&l, "h:1:ab", vec!["billing".into()])),
        ("log_head", log_head(&l)),
        (
            "log_scoped_batch",
            log_scoped_batch(&l, (7, 10), (9, 500), vec!["order".into()], 100),
        ),
        ("log_checkpoint", log_checkpoint(&l, "billing")),
        ("log_batch", log_batch(&l, (7, 10), 100)),
        ("log_advance", log_advance(&l, "billing", 10, (9, 20))),
        ("log_assigned", log_assigned(&l, "h:1:ab")),
        (
            "log_rebalance",
            log_rebalance(
                &l.assignments,
                &nodes,
                vec!["billing".into()],
                Duration::from_secs(10),
            ),
        ),
        ("log_assignments", log_assignments(&l.assignments)),
        (
            "log_lag",
            log_lag(&l.events, &l.position_column, &l.checkpoints),
        ),
        ("workflow_next_id", workflow_next_id(&w)),
        (
            "deps_insert",
            deps_insert(
                &w,
                vec![3, 3],
                vec![1, 2],
                vec!["cancel".into(), "ignore".into()],
            ),
        ),
        ("lock_upstreams", lock_upstreams(&w, vec![1, 2])),
        ("mark_has_dependents", mark_has_dependents(&w, vec![1, 2])),
        (
            "cancel_blocked",
            cancel_blocked(&w, 3, 1, "upstream job 1 was failed"),
        ),
        ("workflow_cancel_waiting", workflow_cancel_waiting(&w, 7)),
        ("workflow_request_cancel", workflow_request_cancel(&w, 7)),
        ("workflow_tasks", workflow_tasks(&w, 7)),
        ("batch_counts", batch_counts(&w, 7)),
        ("workflow_counts", workflow_counts(&w, 7)),
        ("workflow_graph", workflow_graph(&w, 7, true, 501)),
        (
            "workflow_graph_from_edges_only",
            workflow_graph(&w, 7, false, 501),
        ),
    ]
    .into_iter()
    .chain(quoted_statements())
    .collect()
}

/// A job table named by SQL keywords (`app."select" "order"`), with quoted
/// control tables and columns: parsed unquoted, every statement quotes them.
fn quoted_statements() -> Vec<(&'static str, Statement)> {
    let mut o = table("app.\"select\" \"order\"");
    o.columns = Columns::resolve(&HashMap::from([(
        "state".to_owned(),
        "\"Status\"".to_owned(),
    )]))
    .unwrap();
    o.pause_table = Some(Relation::parse("pause_table", "\"pause\"").unwrap());
    o.limit_table = Some(Relation::parse("limit_table", "\"limit\"").unwrap());
    o.queue_column = Some(crate::columns::column_name("queue_column", "\"group\"").unwrap());
    o.limit_key_column =
        Some(crate::columns::column_name("limit_key_column", "\"My Key\"").unwrap());
    let mut e = Table::new(rel("\"order\""), Columns::resolve(&HashMap::new()).unwrap());
    e.key_column = Some("key".into());
    e.queue_column = Some("group".into());
    let payload = [("payload".to_owned(), sea_query::Value::from("p"))];
    let pauses = Relation::parse("pause_table", "\"pause\"").unwrap();
    vec![
        ("quoted_claim", claim(&o, "host", &[], 3, true)),
        (
            "quoted_reset_stalled",
            reset_stalled(&o.table, &o.columns, 5.0, None, 3, "m", None),
        ),
        ("quoted_relation_access", relation_access(&o.table)),
        ("quoted_enqueue_rows", enqueue_rows(&e, &[row(&payload)])),
        (
            "quoted_enqueue_keyed",
            enqueue_keyed(&e, &row(&payload), "k", OnKey::Replace),
        ),
        (
            "quoted_pause",
            pause(&pauses, &pause_key(&o.table), "emails", "ops"),
        ),
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

/// Every statement function of `sql/` is snapshotted above, and every
/// snapshot file belongs to a statement (a renamed or removed statement must
/// take its snapshot along).
#[test]
fn every_statement_has_a_snapshot_and_every_snapshot_a_statement() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/sql");
    let names: Vec<&str> = statements().iter().map(|(name, _)| *name).collect();
    for entry in std::fs::read_dir(root.join("snapshots")).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        let name = file.trim_end_matches(".sql");
        assert!(
            names.contains(&name),
            "stale snapshot {file}: no statement renders it"
        );
    }
    let tests = include_str!("tests.rs");
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") || path.ends_with("tests.rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        for item in source.split("pub(crate) fn ").skip(1) {
            let signature = &item[..item.find('{').unwrap_or(item.len())];
            if !signature.contains("-> Statement") {
                continue;
            }
            let name = &item[..item.find(['(', '<']).unwrap()];
            assert!(
                tests.contains(&format!("{name}(")),
                "{name} in {} has no snapshot",
                path.display()
            );
        }
    }
}

#[test]
fn user_values_are_bound_not_rendered() {
    let t = resolved(false);
    let s = claim(&t, "evil'); DROP TABLE x; --", &[], 1, true);
    assert!(!s.sql.contains("evil"), "{}", s.sql);
    let s = mark_failed(&t, 1, 2, "it's broken");
    assert!(!s.sql.contains("broken"), "{}", s.sql);
    let values = [("payload".to_owned(), sea_query::Value::from("it's mine"))];
    let s = enqueue_keyed(&enqueue_target(), &row(&values), "k'ey", OnKey::Replace);
    assert!(
        !s.sql.contains("mine") && !s.sql.contains("k'ey"),
        "{}",
        s.sql
    );
    let filter = JobFilter {
        failure_contains: Some("'; DROP TABLE x; --".into()),
        fields: vec![FieldFilter::new("payload", &["a"], "it's mine").unwrap()],
        ..JobFilter::default()
    };
    let s = admin_list(&admin_table(), &filter, &PageRequest::first(10));
    assert!(
        !s.sql.contains("mine") && !s.sql.contains("k'ey"),
        "{}",
        s.sql
    );
}

#[test]
fn copy_in_quotes_the_table_and_columns() {
    let sql = copy_in(&enqueue_target(), &["payload".into(), "we\"ird".into()]);
    assert_eq!(
        sql,
        "COPY \"app\".\"example_jobs\" (\"payload\", \"we\"\"ird\") FROM STDIN"
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

#[test]
fn a_kinds_retry_rule_is_bound_values_in_the_same_statement() {
    let t = resolved(false);
    let over = workerutil::Retry::new()
        .max_retries(7)
        .delay(RetryPolicy::fixed(Duration::from_secs(42)));
    let store = mark_errored(&t, 1, 2, "m", &t.retry_rule(None));
    let kind = mark_errored(&t, 1, 2, "m", &t.retry_rule(Some(&over)));
    assert_eq!(store.sql, kind.sql, "one statement for every rule");
    let values = format!("{:?}", kind.values);
    assert!(values.contains("Unsigned(Some(7))"), "{values}");
    assert!(values.contains("Double(Some(42.0))"), "{values}");
    let store_values = format!("{:?}", store.values);
    assert!(store_values.contains("Unsigned(Some(2))"), "{store_values}");
    assert!(
        !store_values.contains("Double(Some(42.0))"),
        "{store_values}"
    );
}

/// The statements rendered once per store are the ones the statement
/// functions render for that job: same text, same values in the same order.
#[test]
fn per_job_statements_render_as_their_functions_do() {
    let mut views = table("app.example_jobs");
    views.view = Some(rel("app.example_view v"));
    for t in [table("app.example_jobs"), table("\"Odd Name\""), views] {
        let cached = PerJob::new(&t);
        for (id, token) in [(1, 2), (i64::MAX, -7), (42, 1_700_000_000_000_000)] {
            let pairs = [
                (cached.lock_claimed(id, token), lock_claimed(&t, id, token)),
                (
                    cached.mark_complete(id, token),
                    mark_complete(&t, id, token),
                ),
            ];
            for (cached, rendered) in pairs {
                assert_eq!(cached.sql, rendered.sql);
                assert_eq!(cached.values.0, rendered.values.0, "{}", rendered.sql);
            }
        }
    }
}
