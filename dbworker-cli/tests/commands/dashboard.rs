//! `dbworker ui`: the dashboard served alone, refusing an open network address
//! without authentication (the dashboard itself: dbworker/tests/dashboard/dashboard.rs).

use crate::cli;
use crate::fixtures::dashboard as shared;

use std::process::{Command, Stdio};

use cli::{http_get, serve_ui};
use shared::seed;

#[tokio::test]
async fn dbworker_ui_serves_alone_and_refuses_an_open_network_address() {
    let (db, _) = seed().await;
    let refused = Command::new(env!("CARGO_BIN_EXE_dbworker"))
        .args(["ui", "--table", "jobs", "--listen", "0.0.0.0:0"])
        .env("DATABASE_URL", db.db.url())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("without authentication"));

    let mut command = Command::new(env!("CARGO_BIN_EXE_dbworker"));
    command
        .args([
            "ui",
            "--table",
            "jobs",
            "--queue-column",
            "queue",
            "--listen",
            "0.0.0.0:0",
        ])
        .env("DATABASE_URL", db.db.url())
        .env("DBWORKER_UI_TOKEN", "tok");
    let (mut child, addr) = serve_ui(command);
    let denied = http_get(&addr, "/", None);
    assert!(
        denied.starts_with("HTTP/1.0 401") || denied.starts_with("HTTP/1.1 401"),
        "{denied}"
    );
    let page = http_get(&addr, "/", Some("Bearer tok"));
    assert!(
        page.contains(" 200 OK") && page.contains("<td>mail</td>"),
        "{page}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `dbworker ui --cron-table`: each table's cron page, from the cron table.
#[tokio::test]
async fn dbworker_ui_serves_the_cron_page_with_the_cron_table() {
    let (db, _) = seed().await;
    db.execute(&dbworker::ddl::cron_table_sql(dbworker::cron::DEFAULT_CRON_TABLE).unwrap())
        .await;
    db.execute(
        "INSERT INTO dbworker_cron (job_table, schedule, last_tick, expression, time_zone)
         VALUES ('jobs', 'berlin-nightly', now(), '30 2 * * *', 'Europe/Berlin')",
    )
    .await;
    let mut command = Command::new(env!("CARGO_BIN_EXE_dbworker"));
    command
        .args([
            "ui",
            "--table",
            "jobs",
            "--cron-table",
            "dbworker_cron",
            "--listen",
            "127.0.0.1:0",
        ])
        .env("DATABASE_URL", db.db.url());
    let (mut child, addr) = serve_ui(command);
    let page = http_get(&addr, "/t/jobs/cron", None);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        page.contains(" 200 OK")
            && page.contains("<td>berlin-nightly</td>")
            && page.contains("Europe/Berlin"),
        "{page}"
    );
}

/// `dbworker ui --table jobs` alone finds what `status` finds (the queue
/// column by its standard name) and says on its error output what it could
/// not find, instead of a silently cut-down dashboard.
#[tokio::test]
async fn dbworker_ui_alone_detects_the_columns_and_says_what_it_lacks() {
    let (db, _) = seed().await;
    let mut command = Command::new(env!("CARGO_BIN_EXE_dbworker"));
    command
        .args(["ui", "--table", "jobs", "--listen", "127.0.0.1:0"])
        .env("DATABASE_URL", db.db.url())
        .env("RUST_LOG", "warn")
        .stderr(Stdio::piped());
    let (mut child, addr) = serve_ui(command);
    let page = http_get(&addr, "/", None);
    assert!(
        page.contains("<td>mail</td>"),
        "the queue column found: {page}"
    );
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("no worker registry (--node-table)"), "{said}");
    assert!(said.contains("no cron table (--cron-table)"), "{said}");
    assert!(!said.contains("no queue column"), "{said}");
}

/// `dbworker ui --users`: the user is before the first ':', the role after
/// the last, the password between (it may hold ':'); an entry without a
/// user, a password or a known role is refused naming its position and
/// user, never echoing the password, even on a loopback address.
#[tokio::test]
async fn dbworker_ui_users_split_at_the_first_and_last_colon_and_never_echo_the_password() {
    let (db, _) = seed().await;
    for (users, password) in [
        ("ops:s3cret", "s3cret"),
        ("ops::admin", ""),
        (":s3cret:admin", "s3cret"),
        ("ops:s3cret:root", "s3cret"),
        ("s3cret", "s3cret"),
        ("ops:p4,ss:admin", "p4"),
        ("ok:fine:read,ops:s3cret:boss", "s3cret"),
    ] {
        let refused = Command::new(env!("CARGO_BIN_EXE_dbworker"))
            .args(["ui", "--table", "jobs", "--listen", "0.0.0.0:0"])
            .env("DATABASE_URL", db.db.url())
            .env("DBWORKER_UI_USERS", users)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{users}: {stderr}");
        assert!(stderr.contains("--users: entry "), "{users}: {stderr}");
        if !password.is_empty() {
            assert!(!stderr.contains(password), "{users}: {stderr}");
        }
    }

    let mut command = Command::new(env!("CARGO_BIN_EXE_dbworker"));
    command
        .args(["ui", "--table", "jobs", "--listen", "127.0.0.1:0"])
        .env("DATABASE_URL", db.db.url())
        .env("DBWORKER_UI_USERS", "ops:pa:ss:admin");
    let (mut child, addr) = serve_ui(command);
    // ops / pa:ss
    let page = http_get(&addr, "/", Some("Basic b3BzOnBhOnNz"));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        page.contains(" 200 OK") && page.contains("ops · admin"),
        "{page}"
    );
}
