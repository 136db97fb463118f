//! The exit status scheme (docs: operations.md, "Exit status"; `dbworker
//! --help`): 0 done or nothing to do, 1 failed, 2 bad arguments, 3 nothing
//! has the id, key or workflow named, 4 refused. Every case exited 1 (or 0)
//! before the scheme, so a script could not tell a missing job from a
//! database that is down.

use std::process::{Command, Output};

use crate::cli;
use crate::common;

use dbworker::ddl::{pause_table_sql, signals_sql, workflows_sql};

use cli::dbworker;
use common::Db;

/// The exit status, with the output when it is not `want`.
fn exits(out: &Output, want: i32, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(want),
        "{what}: stdout {}\nstderr {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `dbworker <args> --table <table>` against the database at `url`.
fn dbworker_at(url: &str, table: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dbworker"))
        .args(args)
        .args(["--table", table, "--connect-timeout", "2s"])
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

#[tokio::test]
async fn each_command_exits_with_the_documented_status() {
    let db = Db::new().await;
    db.add_columns(
        |c| {
            c.queue = true;
            c.keys = true;
        },
        &[
            pause_table_sql(dbworker::control::DEFAULT_PAUSE_TABLE).unwrap(),
            signals_sql("jobs", &Default::default()).unwrap(),
            workflows_sql("jobs", &Default::default()).unwrap(),
        ],
    )
    .await;
    let queued: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (state, queue) VALUES ('queued', 'mail') RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let queued = queued.to_string();
    let missing = "999999";

    // 0: done, or nothing to do.
    for args in [
        &["show", &queued][..],
        &["list", "--state", "failed"],
        &["requeue", "--state", "failed", "--yes"],
        &["pause", "--queue", "mail"],
        &["pause", "--queue", "mail"],
        &["migration"],
    ] {
        exits(&dbworker(&db, args), 0, &format!("{args:?}"));
    }

    // 3: nothing has the id, key or workflow named.
    for args in [
        &["show", missing][..],
        &["requeue", missing],
        &["cancel", missing],
        &["delete", missing],
        &["complete", missing],
        &["reschedule", missing, "--run-in", "1m"],
        &["remove", "--key", "no-such-key"],
        &["signal", "--id", missing, "--name", "paid"],
        &["signal", "--key", "no-such-key", "--name", "paid"],
        &["workflow", "show", missing],
        &["workflow", "cancel", missing, "--yes"],
    ] {
        exits(&dbworker(&db, args), 3, &format!("{args:?}"));
    }

    // 4: refused, the job left alone: a state the action never touches, a
    // bulk action nobody confirmed (no terminal, no --yes).
    for args in [
        &["requeue", &queued][..],
        &["cancel", "--state", "queued"],
        &["delete", "--queue", "mail"],
    ] {
        exits(&dbworker(&db, args), 4, &format!("{args:?}"));
    }
    assert_eq!(db.state(queued.parse().unwrap()).await, "queued");

    // 2: bad arguments, clap's and the command's own.
    for args in [
        &["list", "--no-such-flag"][..],
        &["show", "not-a-number"],
        &["pause", "--queue", " "],
        &["requeue", &queued, "--state", "failed"],
        &["requeue"],
        &["requeue", "--state", "queued", "--yes"],
        &[
            "signal",
            "--id",
            &queued,
            "--name",
            "paid",
            "--payload",
            "{oops",
        ],
        &["limit", "set", "--queue", "mail", "--rate", "0"],
        &["purge", "--chunk-size", "0", "--once"],
        &["migration", "--partitioned", "--workflows"],
    ] {
        exits(&dbworker(&db, args), 2, &format!("{args:?}"));
    }
    exits(
        &dbworker_at("mysql://localhost/db", "jobs", &["status"]),
        2,
        "a URL that is not postgres://",
    );

    // 1: failed — a table unlike its description, a database not there.
    exits(
        &dbworker_at(db.db.url(), "no_such_table", &["status"]),
        1,
        "a missing table",
    );
    exits(
        &dbworker_at("postgres://dbworker@127.0.0.1:1/none", "jobs", &["status"]),
        1,
        "an unreachable database",
    );
}

/// `--help` states the scheme, so a script writer finds it without the manual.
#[test]
fn help_states_the_exit_statuses() {
    let out = Command::new(env!("CARGO_BIN_EXE_dbworker"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for line in [
        "Exit status",
        "  2  bad arguments",
        "  3  not found",
        "  4  refused",
    ] {
        assert!(help.contains(line), "{line:?} missing from:\n{help}");
    }
}
