//! `dbworker history` records the job history and `dbworker top --once`
//! prints it with the live states, as text and as JSON.

mod cli;
#[path = "../../dbworker/tests/common/mod.rs"]
mod common;
#[path = "../../dbworker/tests/common/history.rs"]
mod shared;

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

    // A duration that does not parse is named.
    let e = refused(&dbworker(&db, &["top", "--once", "--interval", "soon"]));
    assert!(e.contains("--interval"), "{e}");
}
