//! `dbworker history` records the job history and `dbworker top --once`
//! prints it with the live states, as text and as JSON; on a table with
//! progress, the running jobs with their progress.

use crate::cli;
use crate::common;
use crate::fixtures::history as shared;

use serde_json::Value;

use cli::{dbworker, ok, refused};

#[tokio::test]
async fn top_once_prints_the_live_states_and_the_history() {
    let db = shared::seed().await;
    db.execute(
        "INSERT INTO jobs (state, queue, started_at, last_heartbeat_at, worker_hostname) VALUES ('processing', 'mail', now(), now(), 'host-9')",
    )
    .await;
    // Before the history is recorded: the live states, and how to get it.
    let frame = ok(&dbworker(
        &db,
        &["top", "--once", "--history-table", "no_history"],
    ));
    assert!(frame.contains("dbworker top — jobs"), "{frame}");
    assert!(frame.contains("no history table no_history"), "{frame}");
    // No progress column: no running jobs' panel.
    assert!(!frame.contains("running jobs"), "{frame}");

    let recorded = ok(&dbworker(&db, &["history", "--once"]));
    assert!(recorded.starts_with("recorded "), "{recorded}");
    let again = ok(&dbworker(&db, &["history", "--once"]));
    assert!(again.starts_with("recorded 0 minute row(s)"), "{again}");

    let frame = ok(&dbworker(&db, &["top", "--once", "--window", "1d"]));
    // mail: 5 available, 1 running; 600 done over the day, a third retried
    // once and a third twice (600 retries).
    let mail = frame.lines().find(|l| l.contains("│mail")).unwrap();
    let cells: Vec<&str> = mail.split_whitespace().collect();
    assert_eq!(
        cells[1..9],
        ["5", "0", "0", "1", "0", "600", "0", "600"],
        "{frame}"
    );
    let timing = frame.lines().find(|l| l.contains("│timing")).unwrap();
    assert!(timing.contains("20"), "{frame}");
    let reports = frame.lines().find(|l| l.contains("│reports")).unwrap();
    let cells: Vec<&str> = reports.split_whitespace().collect();
    assert_eq!(cells[6..9], ["0", "40", "80"], "{frame}");
    assert!(
        frame.contains("finished per minute, last hour: completed"),
        "{frame}"
    );
    assert!(frame.lines().any(|l| l.contains("host-9")), "{frame}");

    let out = ok(&dbworker(
        &db,
        &["top", "--once", "--window", "1d", "--format", "json"],
    ));
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["status"]["table"], "jobs");
    assert_eq!(v["window_seconds"], 86_400.0);
    let queues = v["queues"].as_array().unwrap();
    let mail = queues.iter().find(|q| q["queue"] == "mail").unwrap();
    assert_eq!(mail["point"]["completed"], 600);
    assert_eq!(mail["point"]["retried"], 600);
    let timing = queues.iter().find(|q| q["queue"] == "timing").unwrap();
    assert_eq!(timing["point"]["run_max"], 20.0);
    assert_eq!(v["last_hour"]["range"], "1h");
    assert!(v["last_hour"]["points"].is_array());
    let total = &v["status"]["total"];
    assert_eq!(total["processing"], 1);
    assert!(v["running"].is_null(), "{out}");

    // A duration that does not parse is named.
    let e = refused(&dbworker(&db, &["top", "--once", "--interval", "soon"]));
    assert!(e.contains("--interval"), "{e}");
}

/// On a table with progress (`migration --progress`), `top` lists the
/// running jobs, longest first, each with its host, time running and the
/// progress its handler set (`-` before any); as JSON too. Waiting and
/// finished jobs are not listed.
#[tokio::test]
async fn top_shows_the_running_jobs_progress_where_the_table_has_it() {
    running_jobs_progress(false).await;
}

/// The same on a table that keeps progress in its side table
/// (`migration --progress-table`), found as the columns are.
#[tokio::test]
async fn top_shows_the_running_jobs_progress_kept_in_the_side_table() {
    running_jobs_progress(true).await;
}

async fn running_jobs_progress(side: bool) {
    let db = common::Db::new().await;
    if side {
        db.execute(&dbworker::ddl::progress_table_sql("jobs").unwrap())
            .await;
    } else {
        db.add_columns(|c| c.progress = true, &[]).await;
    }
    let ids: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO jobs (state, started_at, last_heartbeat_at, worker_hostname) VALUES
           ('processing', now() - interval '2 minutes', now(), 'host-a'),
           ('processing', now() - interval '5 seconds', now(), 'host-b'),
           ('queued', NULL, NULL, ''),
           ('completed', now(), now(), 'host-c')
         RETURNING id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let progress = [
        Some(r#"{"rows": 40, "of": 100}"#),
        None,
        Some(r#"{"rows": 1}"#),
        Some(r#"{"rows": 100}"#),
    ];
    for (id, value) in ids.iter().zip(progress) {
        let Some(value) = value else { continue };
        let sql = if side {
            "INSERT INTO jobs_progress (job_id, progress) VALUES ($1, $2::jsonb)"
        } else {
            "UPDATE jobs SET progress = $2::jsonb WHERE id = $1"
        };
        sqlx::query(sql)
            .bind(id)
            .bind(value)
            .execute(&db.pool)
            .await
            .unwrap();
    }

    let frame = ok(&dbworker(
        &db,
        &["top", "--once", "--history-table", "no_history"],
    ));
    assert!(frame.contains("running jobs, longest first"), "{frame}");
    let row = |id: i64| -> Vec<String> {
        frame
            .lines()
            .find(|l| l.starts_with(&format!("│{id} ")))
            .unwrap_or_else(|| panic!("no row for job {id}: {frame}"))
            .trim_matches('│')
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    let first = row(ids[0]);
    assert_eq!(first[1], "host-a", "{frame}");
    assert!(first[2].starts_with("2m"), "{frame}");
    assert_eq!(first[3], r#"{"of":100,"rows":40}"#, "{frame}");
    assert_eq!(row(ids[1])[3], "-", "{frame}");
    let pos = |id: i64| frame.find(&format!("│{id} ")).unwrap();
    assert!(pos(ids[0]) < pos(ids[1]), "longest first: {frame}");
    for id in &ids[2..] {
        assert!(!frame.contains(&format!("│{id} ")), "{frame}");
    }

    let out = ok(&dbworker(
        &db,
        &[
            "top",
            "--once",
            "--history-table",
            "no_history",
            "--format",
            "json",
        ],
    ));
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let running = v["running"].as_array().unwrap();
    assert_eq!(running.len(), 2, "{out}");
    assert_eq!(running[0]["id"], ids[0]);
    assert_eq!(running[0]["worker_hostname"], "host-a");
    assert_eq!(running[0]["progress"]["rows"], 40);
    assert!(running[0]["running_seconds"].as_f64().unwrap() >= 120.0);
    assert!(running[1]["progress"].is_null());
}
