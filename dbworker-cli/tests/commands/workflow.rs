//! `dbworker workflow show|cancel` and `migration --workflows` end to end
//! against real Postgres.

use crate::cli;
use crate::common;

use dbworker::NewJob;
use dbworker::ddl::workflows_sql;
use dbworker::workflow::{Task, Workflow, Workflows};

use cli::{dbworker, ok};
use common::Db;

#[tokio::test]
async fn show_lists_each_task_and_what_it_waits_for_and_cancel_cancels_them() {
    let db = Db::new().await;
    let ddl = ok(&dbworker(&db, &["migration", "--workflows"]));
    assert!(ddl.contains("jobs_dbworker_release"), "{ddl}");
    db.execute(&workflows_sql("jobs", &Default::default()).unwrap())
        .await;
    let table = db.table_with(|t| t.workflows = true).await;
    let workflows = Workflows::new(&db.pool, &table).await.unwrap();
    let wf = workflows
        .enqueue(
            &Workflow::new()
                .task(Task::new("fetch", NewJob::new()))
                .task(Task::new("resize", NewJob::new()).after(["fetch"]))
                .task(Task::new("publish", NewJob::new()).after(["fetch", "resize"])),
        )
        .await
        .unwrap();
    let id = wf.id.to_string();
    let shown = ok(&dbworker(&db, &["workflow", "show", &id]));
    assert!(shown.contains("2 pending, 1 queued"), "{shown}");
    let publish = shown.lines().find(|l| l.contains("publish")).unwrap();
    assert!(
        publish.contains("pending") && publish.ends_with("fetch, resize"),
        "{shown}"
    );
    assert!(
        shown.contains("edges:\n  fetch → resize\n  fetch → publish\n  resize → publish"),
        "{shown}"
    );

    // Fetch done: its edges are gone from the edge table, not from the graph.
    let fetch = wf.id_of("fetch").unwrap();
    db.execute(&format!(
        "UPDATE jobs SET state = 'completed', finished_at = now() WHERE id = {fetch}"
    ))
    .await;
    let shown = ok(&dbworker(&db, &["workflow", "show", &id]));
    assert!(
        shown.contains("  fetch → resize\n  fetch → publish"),
        "{shown}"
    );

    // The list filtered by workflow: its tasks only.
    let other = db.enqueue(1, serde_json::json!({})).await[0];
    let listed = ok(&dbworker(&db, &["list", "--workflow", &id]));
    assert!(listed.contains("(3 job(s), end of list)"), "{listed}");
    assert!(
        !listed
            .lines()
            .any(|l| l.trim_start().starts_with(&format!("{other} "))),
        "{listed}"
    );

    // No one to confirm (stdin is not a terminal) and no --yes: refused,
    // as `dbworker cancel --workflow` is; nothing canceled.
    let refused = dbworker(&db, &["workflow", "cancel", &id]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("nothing done (pass --yes"), "{stderr}");
    assert_eq!(db.count("canceled").await, 0);

    let canceled = ok(&dbworker(&db, &["workflow", "cancel", &id, "--yes"]));
    assert!(canceled.contains("2 waiting tasks canceled"), "{canceled}");
    assert_eq!(db.count("canceled").await, 2);
    let missing = dbworker(&db, &["workflow", "show", "999"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no workflow 999"));
}
