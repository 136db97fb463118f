//! `dbworker limit set|clear|list`: a queue's global limits from the
//! command line, written through the library's `Limits` (what every
//! worker's claim reads) and read back by it; refusals change nothing.

use crate::cli;
use crate::common;

use dbworker::control::{DEFAULT_LIMIT_TABLE, Limit, Limits};
use dbworker::ddl::limit_table_sql;
use dbworker::{JobTable, JobTableOptions};

use std::process::Output;

use cli::{dbworker, ok, refused};
use common::Db;

/// The test table with a queue column, a `customer` column and the limit table.
async fn set_up() -> Db {
    let db = Db::new().await;
    db.add_columns(
        |c| c.queue = true,
        &[
            limit_table_sql(DEFAULT_LIMIT_TABLE).unwrap(),
            "ALTER TABLE jobs ADD COLUMN customer text;".into(),
        ],
    )
    .await;
    db
}

/// `dbworker limit <verb> <flags> --table jobs`.
fn limit(db: &Db, verb: &str, flags: &[&str]) -> Output {
    let mut args = vec!["limit", verb];
    args.extend_from_slice(flags);
    dbworker(db, &args)
}

/// The limits as a worker's table reads them.
async fn limits(db: &Db) -> Vec<(String, Limit)> {
    let mut o = JobTableOptions::new("jobs");
    o.queue_column = Some("queue".into());
    o.limit_table = Some(DEFAULT_LIMIT_TABLE.into());
    let table = JobTable::new(&db.pool, o).await.unwrap();
    let mut all = Limits::new(&db.pool, &table)
        .await
        .unwrap()
        .list()
        .await
        .unwrap();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

/// Before, no command set a limit: only the library and the dashboard.
#[tokio::test]
async fn limit_sets_clears_and_lists_a_queues_limits() {
    let db = set_up().await;
    let list = || ok(&limit(&db, "list", &[]));
    assert_eq!(list().trim(), "no queue of jobs is limited");

    let out = ok(&limit(
        &db,
        "set",
        &["--queue", "reports", "--max-processing", "3"],
    ));
    assert_eq!(out.trim(), "queue reports: at most 3 processing");
    let out = ok(&limit(
        &db,
        "set",
        &["--queue", "mail", "--rate", "10", "--burst", "20"],
    ));
    assert_eq!(out.trim(), "queue mail: 10/s (burst 20)");
    assert_eq!(
        limits(&db).await,
        [
            ("mail".to_owned(), Limit::default().rate(10.0, 20)),
            ("reports".to_owned(), Limit::processing(3)),
        ]
    );

    // A set replaces the queue's limits whole; per key needs the key column.
    let out = ok(&limit(
        &db,
        "set",
        &[
            "--queue",
            "reports",
            "--max-per-key",
            "1",
            "--limit-key-column",
            "customer",
        ],
    ));
    assert_eq!(out.trim(), "queue reports: 1 per key");
    let mut per_key = Limit::default();
    per_key.max_per_key = Some(1);
    assert_eq!(limits(&db).await[1], ("reports".to_owned(), per_key));
    let listed = list();
    let lines: Vec<&str> = listed.lines().map(str::trim_end).collect();
    assert_eq!(lines.len(), 3, "{listed}");
    assert!(lines[0].starts_with("QUEUE") && lines[0].ends_with("LIMIT"));
    assert!(
        lines[1].starts_with("mail ") && lines[1].ends_with(" 10/s (burst 20)"),
        "{listed}"
    );
    assert!(
        lines[2].starts_with("reports ") && lines[2].ends_with(" 1 per key"),
        "{listed}"
    );

    let clear = || ok(&limit(&db, "clear", &["--queue", "mail"]));
    assert_eq!(clear().trim(), "queue mail: no limit");
    assert_eq!(clear().trim(), "queue mail had no limit");
    assert_eq!(limits(&db).await.len(), 1);
}

/// Blank or padded queue names, a set with no limit, a burst without a
/// rate, a rate of 0, per key without its column, a key column the table
/// lacks: each refused with a clear error, nothing written.
#[tokio::test]
async fn limit_refuses_blank_or_padded_queues_and_limits_it_cannot_mean() {
    let db = set_up().await;
    ok(&limit(
        &db,
        "set",
        &["--queue", "mail", "--max-processing", "2"],
    ));
    let before = limits(&db).await;
    for (queue, says) in [
        ("", "--queue: name the queue"),
        ("  ", "--queue: name the queue"),
        (" mail", "whitespace at an end"),
    ] {
        for (verb, more) in [("set", &["--max-processing", "1"][..]), ("clear", &[])] {
            let mut flags = vec!["--queue", queue];
            flags.extend_from_slice(more);
            let err = refused(&limit(&db, verb, &flags));
            assert!(err.contains(says), "{verb} {queue:?}: {err}");
        }
    }
    let refusals: [(&[&str], &str); 5] = [
        (&["--queue", "mail"], "--max-processing"),
        (&["--queue", "mail", "--burst", "5"], "--rate"),
        (
            &["--queue", "mail", "--rate", "0"],
            "--rate: must be a positive number",
        ),
        (
            &["--queue", "mail", "--max-per-key", "1"],
            "--limit-key-column",
        ),
        (
            &[
                "--queue",
                "mail",
                "--max-per-key",
                "1",
                "--limit-key-column",
                "tenant",
            ],
            "tenant",
        ),
    ];
    for (flags, named) in refusals {
        let out = limit(&db, "set", flags);
        let err = refused(&out);
        assert!(err.contains(named), "{flags:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        if named != "tenant" {
            // A value refused: bad arguments (docs/operations.md, Exit status).
            assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        }
    }
    assert_eq!(limits(&db).await, before, "nothing written");
}

/// Without the limit table, each verb names it and the migration that
/// creates it.
#[tokio::test]
async fn limit_names_a_missing_limit_table() {
    let db = Db::new().await;
    db.add_columns(|c| c.queue = true, &[]).await;
    for args in [
        &["limit", "list"][..],
        &["limit", "clear", "--queue", "mail"],
        &["limit", "set", "--queue", "mail", "--max-processing", "1"],
    ] {
        let err = refused(&dbworker(&db, args));
        assert!(
            err.contains(DEFAULT_LIMIT_TABLE) && err.contains("dbworker migration --limits"),
            "{args:?}: {err}"
        );
    }
}
