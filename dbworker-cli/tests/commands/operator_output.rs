//! What operators type and read: `status` with every state, paused queues
//! and human durations; `--format json` on `status`, `list`, `show` and
//! `workflow show`; `--queue` without `--queue-column`; durations as `2h`;
//! an invalid `--state`; shell completions; the connect timeout; finished
//! counts without the retention index, estimated or from the history.

use crate::cli;
use crate::common;

use std::collections::HashMap;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dbworker::control::DEFAULT_PAUSE_TABLE;
use dbworker::ddl::{history_table_sql, pause_table_sql, workflows_sql};
use serde_json::Value;

use cli::{dbworker, ok, refused};
use common::Db;

/// A table as `dbworker migration --queue --retention --workflows --pauses`
/// makes it: emails has 3 queued (1 scheduled), 1 errored, 2 completed, 1
/// failed an hour ago... (see the inserts); reports has 1 stalled processing
/// job and is paused.
async fn seed() -> Db {
    let db = Db::new().await;
    db.add_columns(
        |c| {
            c.queue = true;
            c.retention = true;
        },
        &[
            workflows_sql("jobs", &HashMap::new()).unwrap(),
            pause_table_sql(DEFAULT_PAUSE_TABLE).unwrap(),
        ],
    )
    .await;
    db.execute(
        "INSERT INTO jobs (state, queue, queued_at) SELECT 'queued', 'emails', now() - interval '3 minutes 12 seconds' FROM generate_series(1, 2);
         INSERT INTO jobs (state, queue, process_after) VALUES ('queued', 'emails', now() + interval '1 day');
         INSERT INTO jobs (state, queue, process_after, failure_message) VALUES ('errored', 'emails', now() + interval '1 hour', 'smtp down');
         INSERT INTO jobs (state, queue, finished_at) VALUES ('completed', 'emails', now()), ('completed', 'emails', now());
         INSERT INTO jobs (state, queue, finished_at) VALUES ('failed', 'emails', now() - interval '5 minutes');
         INSERT INTO jobs (state, queue, started_at, last_heartbeat_at, worker_hostname) VALUES ('processing', 'reports', now(), now() - interval '10 minutes', 'host-1');
         INSERT INTO jobs (state, queue, workflow_id, task_name, finished_at) VALUES ('completed', 'reports', 7, 'fetch', now());
         INSERT INTO jobs (state, queue, workflow_id, task_name) VALUES ('queued', 'reports', 7, 'render');",
    )
    .await;
    ok(&dbworker(
        &db,
        &["pause", "--queue", "reports", "--by", "ops"],
    ));
    db
}

fn json(out: &str) -> Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[tokio::test]
async fn status_shows_every_state_per_queue_paused_queues_and_human_durations() {
    let db = seed().await;
    // No --queue-column: the table's `queue` column is found by its name.
    let text = ok(&dbworker(&db, &["status", "--stalled-after", "1m"]));
    let row = |name: &str| -> Vec<String> {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name}: {text}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    // queue pending scheduled available errored processing stalled completed failed canceled failed/1h
    assert_eq!(
        row("emails"),
        ["emails", "0", "1", "2", "1", "0", "0", "2", "1", "0", "1"]
    );
    assert_eq!(
        row("reports"),
        ["reports", "0", "0", "1", "0", "1", "1", "1", "0", "0", "0"]
    );
    assert_eq!(
        row("total"),
        ["total", "0", "1", "3", "1", "1", "1", "3", "1", "0", "1"]
    );
    assert!(text.contains("paused: queue reports, by ops"), "{text}");
    // 3 minutes 12 seconds as a person writes it, not 192.0 s.
    assert!(text.contains("oldest waiting: 3m 1"), "{text}");
    assert!(text.contains("no heartbeat for 1m"), "{text}");

    let doc = json(&ok(&dbworker(&db, &["status", "--format", "json"])));
    assert_eq!(doc["table"], "jobs");
    assert_eq!(doc["finished_counts"], "exact");
    assert_eq!(doc["total"]["completed"], 3);
    assert_eq!(doc["total"]["stalled"], 1, "stalled after 30 s by default");
    assert_eq!(doc["queues"][0]["queue"], "emails");
    assert_eq!(doc["queues"][0]["scheduled"], 1);
    assert_eq!(doc["queues"][0]["failed_last_hour"], 1);
    assert_eq!(doc["paused"][0]["queue"], "reports");
    assert_eq!(doc["processing_by_host"][0]["host"], "host-1");
    // The JSON agrees with the rows.
    let counted: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'completed'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(doc["total"]["completed"], counted);
}

/// Without the retention index, `status` shows the planner's estimate,
/// labelled so; with a history table holding rows, the history's sums per
/// queue over the period it covers, labelled so, in text and JSON.
#[tokio::test]
async fn without_the_index_finished_counts_are_estimated_or_from_the_history() {
    let db = Db::new().await;
    db.add_columns(|c| c.queue = true, &[]).await;
    db.execute(
        "INSERT INTO jobs (state, queue, finished_at) SELECT 'completed', 'emails', now() FROM generate_series(1, 50);
         INSERT INTO jobs (state, queue) VALUES ('queued', 'emails'), ('queued', 'reports');
         ANALYZE jobs;",
    )
    .await;
    let text = ok(&dbworker(&db, &["status"]));
    assert!(text.contains("planner estimates, in total only"), "{text}");
    assert!(!text.contains("from the history"), "{text}");
    let doc = json(&ok(&dbworker(&db, &["status", "--format", "json"])));
    assert_eq!(doc["finished_counts"], "estimated");
    assert_eq!(doc["finished_period_seconds"], Value::Null);
    assert_eq!(doc["queues"][0]["completed"], Value::Null);

    db.execute(&history_table_sql("ops_history").unwrap()).await;
    db.execute(
        "INSERT INTO ops_history (job_table, queue, bucket, seconds, completed, failed, canceled) VALUES
           ('jobs', 'emails', date_trunc('hour', now() - interval '2 days'), 3600, 30, 1, 0),
           ('jobs', 'emails', date_trunc('minute', now() - interval '5 minutes'), 60, 12, 0, 2),
           ('jobs', 'reports', date_trunc('minute', now() - interval '1 hour'), 60, 0, 4, 0);",
    )
    .await;
    let args = ["status", "--history-table", "ops_history"];
    let text = ok(&dbworker(&db, &args));
    assert!(
        text.contains("finished in the last 2d, from the history"),
        "{text}"
    );
    let row = |name: &str| -> Vec<String> {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name}: {text}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    // completed failed canceled failed/1h, the last four columns.
    assert_eq!(row("emails")[7..], ["42", "1", "2", "-"]);
    assert_eq!(row("reports")[7..], ["0", "4", "0", "-"]);
    assert_eq!(row("total")[7..], ["42", "5", "2", "-"]);
    let doc = json(&ok(&dbworker(
        &db,
        &[
            "status",
            "--history-table",
            "ops_history",
            "--format",
            "json",
        ],
    )));
    assert_eq!(doc["finished_counts"], "history");
    let period = doc["finished_period_seconds"].as_f64().unwrap();
    assert!(
        (2.0 * 86_400.0..2.0 * 86_400.0 + 3700.0).contains(&period),
        "{period}"
    );
    assert_eq!(doc["queues"][0]["completed"], 42);
    assert_eq!(doc["queues"][1]["failed"], 4);
    assert_eq!(doc["total"]["canceled"], 2);
}

#[tokio::test]
async fn list_show_and_workflow_show_print_json() {
    let db = seed().await;
    let page = json(&ok(&dbworker(
        &db,
        &["list", "--state", "errored", "--format", "json"],
    )));
    let jobs = page["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{page}");
    assert_eq!(jobs[0]["queue"], "emails");
    assert_eq!(jobs[0]["failure_message"], "smtp down");
    assert!(page["next"].is_null());
    let id = jobs[0]["id"].as_i64().unwrap().to_string();

    let row = json(&ok(&dbworker(&db, &["show", &id, "--format", "json"])));
    assert_eq!(row["state"], "errored");

    let w = json(&ok(&dbworker(
        &db,
        &["workflow", "show", "7", "--format", "json"],
    )));
    assert_eq!(w["id"], 7);
    assert_eq!(w["counts"]["completed"], 1, "{w}");
    let names: Vec<&str> = w["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"fetch") && names.contains(&"render"), "{w}");
}

#[tokio::test]
async fn filters_take_the_queue_column_by_name_durations_and_name_what_is_wrong() {
    let db = seed().await;
    // --queue without --queue-column, on a table with a `queue` column.
    let listed = json(&ok(&dbworker(
        &db,
        &["list", "--queue", "reports", "--format", "json"],
    )));
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 3, "{listed}");
    // Durations as people write them, and the old seconds flag still works.
    for args in [
        &["list", "--older-than", "3m", "--format", "json"][..],
        &["list", "--older-than-secs", "180", "--format", "json"][..],
    ] {
        let old = json(&ok(&dbworker(&db, args)));
        assert_eq!(old["jobs"].as_array().unwrap().len(), 2, "{args:?}: {old}");
    }
    let err = refused(&dbworker(&db, &["list", "--older-than", "soon"]));
    assert!(err.contains("30s, 5m, 2h"), "{err}");
    // An invalid state lists the valid ones.
    let err = refused(&dbworker(&db, &["list", "--state", "done"]));
    assert!(
        err.contains("pending, queued, processing, completed, errored, failed, canceled"),
        "{err}"
    );

    // A table without a queue column: the error names the flag to give.
    let bare = Db::new().await;
    let err = refused(&dbworker(&bare, &["list", "--queue", "emails"]));
    assert!(err.contains("--queue-column"), "{err}");
}

#[test]
fn completions_are_printed_for_bash_zsh_and_fish() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef dbworker"),
        ("fish", "complete -c dbworker"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_dbworker"))
            .args(["completions", shell])
            .output()
            .unwrap();
        let script = ok(&out);
        assert!(script.contains(marker), "{shell}: {script}");
        assert!(
            script.contains("workflow") && script.contains("format"),
            "{shell}"
        );
    }
}

/// A server that accepts connections and never answers: the connect must
/// give up at the timeout, naming the address and the likely cause.
#[test]
fn a_server_that_never_answers_is_reported_at_the_connect_timeout() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let held = std::thread::spawn(move || {
        // Keep the accepted connections open and silent until the test ends.
        let mut open = Vec::new();
        for stream in listener.incoming().take(4) {
            open.push(stream);
        }
        std::thread::sleep(Duration::from_secs(5));
    });
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_dbworker"))
        .args(["status", "--table", "jobs", "--connect-timeout", "1s"])
        .env(
            "DATABASE_URL",
            format!("postgres://app:s3cret@{address}/app"),
        )
        .env("RUST_LOG", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = child.wait().unwrap();
    let took = started.elapsed();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "{err}");
    assert!(took < Duration::from_secs(4), "took {took:?}: {err}");
    assert!(err.contains(&address), "{err}");
    assert!(err.contains("connect timeout of 1s"), "{err}");
    assert!(err.contains("firewall"), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
    drop(held);
}

/// Queue, kind and host names come from whoever enqueued or ran a job: an
/// escape sequence in one reaches no operator's terminal through `list` or
/// `status` (shown as spaces), as a failure message's does not.
#[tokio::test]
async fn list_and_status_print_no_control_characters_from_job_names() {
    let db = Db::new().await;
    db.add_columns(
        |c| {
            c.queue = true;
            c.kind = true;
        },
        &[],
    )
    .await;
    db.execute(
        "INSERT INTO jobs (state, queue, kind, worker_hostname, started_at, last_heartbeat_at) \
         VALUES ('processing', E'q\\x1b[2J', E'k\\x1b]0;owned\\x07', E'h\\x1b[31m', now(), now())",
    )
    .await;
    for command in [&["list"][..], &["status"][..]] {
        let out = ok(&dbworker(&db, command));
        assert!(
            !out.contains('\x1b') && !out.contains('\x07'),
            "{command:?}: {out:?}"
        );
    }
    let out = ok(&dbworker(&db, &["list"]));
    assert!(out.contains("q [2J") && out.contains("k ]0;owned"), "{out}");
}
