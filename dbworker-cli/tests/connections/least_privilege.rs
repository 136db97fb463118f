//! The operator commands check their own grants at start-up: reading needs
//! only SELECT, an action UPDATE, `delete` and `purge` DELETE (a purge also
//! UPDATE: it locks the rows it deletes), `signal` and `fair --set` theirs on
//! the signal mailbox and the weight table; a missing grant is named with the
//! table and the `GRANT` that gives it, before anything is touched.

use crate::cli;
use crate::common;

use std::process::{Command, Output};

use cli::{http_get, ok, refused, serve_ui};
use common::Db;

/// A login role holding `grants` on the test database.
async fn role(db: &Db, name: &str, grants: &[&str]) -> String {
    let name = format!("{name}_{}", db.db.name());
    let name = name[..name.len().min(63)].to_owned();
    let mut sql = format!(
        "CREATE ROLE \"{name}\" LOGIN; GRANT CONNECT ON DATABASE \"{}\" TO \"{name}\"; GRANT USAGE ON SCHEMA public TO \"{name}\";",
        db.db.name()
    );
    for g in grants {
        sql.push_str(&format!("GRANT {g} TO \"{name}\";"));
    }
    db.execute(&sql).await;
    name
}

/// `dbworker <args> --table jobs` logged in as `role`.
fn as_role(db: &Db, role: &str, args: &[&str]) -> Output {
    let url = db
        .db
        .url()
        .replacen("://postgres@", &format!("://{role}@"), 1);
    assert_ne!(url, db.db.url(), "the test database's URL names its user");
    Command::new(env!("CARGO_BIN_EXE_dbworker"))
        .args(args)
        .args(["--table", "jobs"])
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

/// `dbworker ui --read-only` as `role`: the overview's raw HTTP response.
fn ui_overview(db: &Db, role: &str) -> String {
    let url = db
        .db
        .url()
        .replacen("://postgres@", &format!("://{role}@"), 1);
    let mut command = Command::new(env!("CARGO_BIN_EXE_dbworker"));
    command
        .args([
            "ui",
            "--read-only",
            "--table",
            "jobs",
            "--listen",
            "127.0.0.1:0",
        ])
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "warn");
    let (mut child, addr) = serve_ui(command);
    let out = http_get(&addr, "/", None);
    child.kill().unwrap();
    child.wait().unwrap();
    out
}

#[tokio::test]
async fn each_command_names_the_grant_it_lacks() {
    let db = Db::new().await;
    db.execute(
        "INSERT INTO jobs (state, finished_at) VALUES ('failed', now()), ('completed', now() - interval '30 days')",
    )
    .await;
    let failed: i64 = db.scalar("SELECT min(id) FROM jobs WHERE $1 = $1", 0).await;
    let id = failed.to_string();

    // SELECT: reads work, an action is refused by name.
    let reader = role(&db, "reader", &["SELECT ON jobs"]).await;
    assert!(ok(&as_role(&db, &reader, &["status"])).contains("failed"));
    ok(&as_role(&db, &reader, &["show", &id]));
    let err = refused(&as_role(&db, &reader, &["requeue", &id]));
    assert!(
        err.contains(&format!(
            "role {reader} lacks UPDATE on table jobs, which acting on jobs needs: GRANT UPDATE ON jobs TO {reader}"
        )),
        "{err}"
    );

    // The dashboard as a reader: refused with actions (naming UPDATE and the
    // way out), served with --read-only.
    let err = refused(&as_role(&db, &reader, &["ui", "--listen", "127.0.0.1:0"]));
    assert!(
        err.contains(&format!("role {reader} lacks UPDATE on table jobs"))
            && err.contains("dbworker ui --read-only"),
        "{err}"
    );
    let page = ui_overview(&db, &reader);
    assert!(
        page.contains(" 200 OK") && page.contains("read-only"),
        "{page}"
    );

    // SELECT, UPDATE: actions work; delete and purge name DELETE.
    let operator = role(&db, "operator", &["SELECT ON jobs", "UPDATE ON jobs"]).await;
    ok(&as_role(&db, &operator, &["requeue", &id]));
    assert_eq!(db.state(failed).await, "queued");
    let err = refused(&as_role(&db, &operator, &["delete", &id]));
    assert!(
        err.contains(&format!(
            "role {operator} lacks DELETE on table jobs, which deleting jobs needs: GRANT DELETE ON jobs TO {operator}"
        )),
        "{err}"
    );
    let err = refused(&as_role(&db, &operator, &["purge", "--once"]));
    assert!(
        err.contains(&format!(
            "role {operator} lacks DELETE on table jobs, which purging needs: GRANT DELETE ON jobs TO {operator}"
        )),
        "{err}"
    );
    assert_eq!(db.count("completed").await, 1, "nothing purged");

    // SELECT, DELETE without UPDATE: a purge names UPDATE (it locks rows).
    let deleter = role(&db, "deleter", &["SELECT ON jobs", "DELETE ON jobs"]).await;
    let err = refused(&as_role(&db, &deleter, &["purge", "--once"]));
    assert!(
        err.contains(&format!(
            "role {deleter} lacks UPDATE on table jobs, which purging needs"
        )),
        "{err}"
    );
    ok(&as_role(&db, &deleter, &["delete", &id]));
    assert_eq!(db.count("queued").await, 0);

    // The documented operator grants: purge works.
    db.execute(&format!("GRANT UPDATE ON jobs TO \"{deleter}\""))
        .await;
    ok(&as_role(&db, &deleter, &["purge", "--once"]));
    assert_eq!(db.count("completed").await, 0);

    for r in [reader, operator, deleter] {
        db.execute(&format!("DROP OWNED BY \"{r}\"; DROP ROLE \"{r}\""))
            .await;
    }
}

/// On a table with workflows and a pause table, `status` as a role with only
/// `SELECT ON jobs` names both missing reads at once (not one per try, and
/// no raw "permission denied", no silently missing pause line); with them
/// granted it shows the pause.
#[tokio::test]
async fn status_names_every_read_it_lacks_at_once() {
    let db = Db::new().await;
    db.add_columns(
        |c| c.queue = true,
        &[
            dbworker::ddl::workflows_sql("jobs", &Default::default()).unwrap(),
            dbworker::ddl::pause_table_sql(dbworker::control::DEFAULT_PAUSE_TABLE).unwrap(),
        ],
    )
    .await;
    ok(&cli::dbworker(&db, &["pause", "--queue", "mail"]));
    let reader = role(&db, "reader", &["SELECT ON jobs"]).await;
    let err = refused(&as_role(&db, &reader, &["status"]));
    assert!(
        err.contains("GRANT SELECT ON jobs_deps")
            && err.contains("GRANT SELECT ON dbworker_pauses"),
        "{err}"
    );
    assert!(!err.contains("permission denied"), "{err}");
    db.execute(&format!(
        "GRANT SELECT ON jobs_deps, dbworker_pauses TO \"{reader}\""
    ))
    .await;
    let status = ok(&as_role(&db, &reader, &["status"]));
    assert!(status.contains("paused: queue mail"), "{status}");
}

/// `dbworker signal` and `dbworker fair` check their grants at start-up,
/// as the manual's rows for `jobs_signals` and `jobs_fair_weights` give
/// them: a role missing one is refused, naming its `GRANT`, before anything
/// is written; with them all the signal is sent and the weight set.
#[tokio::test]
async fn signal_and_fair_name_the_grant_they_lack() {
    let db = Db::new().await;
    db.execute(&format!(
        "{}{}",
        dbworker::ddl::fair_claims_sql("jobs", &Default::default(), &Default::default()).unwrap(),
        dbworker::ddl::signals_sql("jobs", &Default::default()).unwrap(),
    ))
    .await;
    let id: i64 = db
        .scalar(
            "INSERT INTO jobs (awaiting, process_after) VALUES ('paid', now() + interval '1 hour') RETURNING id + $1",
            0,
        )
        .await;
    let id = id.to_string();
    let sent = async || -> i64 {
        db.scalar("SELECT count(*) FROM jobs_signals WHERE $1 = $1", 0)
            .await
    };

    let sender = [
        "SELECT ON jobs",
        "UPDATE ON jobs",
        "SELECT ON jobs_signals",
        "USAGE ON SEQUENCE jobs_signals_id_seq",
    ];
    let partial = role(&db, "sender", &sender).await;
    let err = refused(&as_role(
        &db,
        &partial,
        &["signal", "--id", &id, "--name", "paid"],
    ));
    assert!(
        err.contains(&format!(
            "role {partial} lacks INSERT on signal mailbox jobs_signals, which sending signals needs: GRANT INSERT ON jobs_signals TO {partial}"
        )) && !err.contains("permission denied"),
        "{err}"
    );
    assert_eq!(sent().await, 0);
    db.execute(&format!("GRANT INSERT ON jobs_signals TO \"{partial}\""))
        .await;
    let out = ok(&as_role(
        &db,
        &partial,
        &["signal", "--id", &id, "--name", "paid"],
    ));
    assert_eq!(out, "sent paid\n");
    assert_eq!(sent().await, 1);

    // Reading the shares needs SELECT on the weights; setting one, writes.
    let reader = role(
        &db,
        "weights",
        &["SELECT ON jobs", "SELECT ON jobs_fair_weights"],
    )
    .await;
    let listed = ok(&as_role(&db, &reader, &["fair"]));
    assert!(listed.starts_with("KEY"), "{listed}");
    let err = refused(&as_role(&db, &reader, &["fair", "--set", "acme=4"]));
    assert!(
        err.contains(&format!(
            "role {reader} lacks INSERT, UPDATE, DELETE on weight table jobs_fair_weights, which setting fair weights needs: GRANT INSERT, UPDATE, DELETE ON jobs_fair_weights TO {reader}"
        )),
        "{err}"
    );
    db.execute(&format!(
        "GRANT INSERT, UPDATE, DELETE ON jobs_fair_weights TO \"{reader}\""
    ))
    .await;
    ok(&as_role(&db, &reader, &["fair", "--set", "acme=4"]));
    let weight: i32 = db
        .scalar(
            "SELECT weight FROM jobs_fair_weights WHERE fair_key = 'acme' AND $1 = $1",
            0,
        )
        .await;
    assert_eq!(weight, 4);

    for r in [partial, reader] {
        db.execute(&format!("DROP OWNED BY \"{r}\"; DROP ROLE \"{r}\""))
            .await;
    }
}

/// `dbworker limit` checks its grants at start-up, as the manual's row for
/// the limit table gives them: `list` needs `SELECT`, `set` and `clear`
/// also `INSERT, UPDATE, DELETE`, each missing one named with its `GRANT`
/// before anything is written.
#[tokio::test]
async fn limit_names_the_grant_it_lacks() {
    let db = Db::new().await;
    db.add_columns(
        |c| c.queue = true,
        &[dbworker::ddl::limit_table_sql(dbworker::control::DEFAULT_LIMIT_TABLE).unwrap()],
    )
    .await;
    ok(&cli::dbworker(
        &db,
        &["limit", "set", "--queue", "mail", "--max-processing", "2"],
    ));
    let nobody = role(&db, "nobody", &["SELECT ON jobs"]).await;
    let err = refused(&as_role(&db, &nobody, &["limit", "list"]));
    assert!(err.contains("GRANT SELECT ON dbworker_limits"), "{err}");
    let reader = role(
        &db,
        "reader",
        &["SELECT ON jobs", "SELECT ON dbworker_limits"],
    )
    .await;
    let listed = ok(&as_role(&db, &reader, &["limit", "list"]));
    assert!(listed.contains("at most 2 processing"), "{listed}");
    for args in [
        &["limit", "set", "--queue", "mail", "--max-processing", "5"][..],
        &["limit", "clear", "--queue", "mail"],
    ] {
        let err = refused(&as_role(&db, &reader, args));
        assert!(
            err.contains("GRANT INSERT, UPDATE, DELETE ON dbworker_limits"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("permission denied"), "{err}");
    }
    let listed = ok(&as_role(&db, &reader, &["limit", "list"]));
    assert!(
        listed.contains("at most 2 processing"),
        "unchanged: {listed}"
    );
    db.execute(&format!(
        "GRANT INSERT, UPDATE, DELETE ON dbworker_limits TO \"{reader}\""
    ))
    .await;
    ok(&as_role(
        &db,
        &reader,
        &["limit", "clear", "--queue", "mail"],
    ));
    for r in [nobody, reader] {
        db.execute(&format!("DROP OWNED BY \"{r}\"; DROP ROLE \"{r}\""))
            .await;
    }
}
