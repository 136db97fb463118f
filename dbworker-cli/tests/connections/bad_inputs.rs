//! Bad inputs the command line must refuse clearly, through the binary: a
//! server that refuses the login or is not there, a malformed or foreign
//! `DATABASE_URL` (every command takes the same connect path), and ids of
//! jobs or workflows that do not exist.

use crate::cli;
use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dbworker::ddl::workflows_sql;

use cli::refused;
use common::Db;

/// Every command that connects, as `dbworker <args> --table jobs` runs it.
const COMMANDS: &[&[&str]] = &[
    &["status"],
    &["list"],
    &["show", "1"],
    &["complete", "1"],
    &["reschedule", "1"],
    &["workflow", "show", "1"],
    &["workflow", "cancel", "1"],
    &["purge", "--once"],
    &["reset", "--once"],
    &["pause"],
    &["limit", "list"],
    &["top", "--once"],
    &["history", "--once"],
    &["partitions", "create"],
    &["ui", "--listen", "127.0.0.1:0"],
];

/// Runs `dbworker <args> --table jobs` against `url`, killed after a minute
/// (a command that connects and serves would otherwise never end); returns
/// its error output, whether it failed, and how long it took.
fn run(url: &str, args: &[&str]) -> (String, bool, Duration) {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_dbworker"))
        .args(args)
        .args(["--table", "jobs"])
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    (
        String::from_utf8_lossy(&out.stderr).into_owned(),
        !out.status.success(),
        started.elapsed(),
    )
}

/// [`run`] for every command at once (each in its own thread, so a slow
/// failure costs its own time only); `check` gets each command's result.
fn every_command(url: &str, check: impl Fn(&str, &str, bool, Duration) + Sync) {
    std::thread::scope(|s| {
        let handles: Vec<_> = COMMANDS
            .iter()
            .map(|args| {
                let check = &check;
                s.spawn(move || {
                    let (err, failed, took) = run(url, args);
                    check(&args.join(" "), &err, failed, took);
                })
            })
            .collect();
        for h in handles {
            if let Err(panic) = h.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
}

/// A local port nothing listens on (it was free a moment ago).
fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn an_unreachable_server_fails_fast_naming_the_address_and_the_cause() {
    let port = dead_port();
    let url = format!("postgres://app:s3cret@127.0.0.1:{port}/app");
    let address = format!("127.0.0.1:{port}");
    every_command(&url, |command, err, failed, took| {
        assert!(failed, "{command}: {err}");
        assert!(took < Duration::from_secs(10), "{command} took {took:?}");
        assert!(
            err.contains(&address) && err.to_lowercase().contains("refused"),
            "{command}: {err}"
        );
        assert!(!err.contains("s3cret"), "{command}: {err}");
    });
}

#[tokio::test]
async fn a_refused_login_gives_the_servers_reason_and_the_address_in_every_command() {
    let db = Db::new().await;
    // The test cluster trusts every login, so an unknown role stands for a
    // wrong password: the server refuses both during the handshake.
    let url = db.db.url();
    let (scheme, rest) = url.split_once("://").unwrap();
    let (_, host_and_db) = rest.rsplit_once('@').unwrap();
    let address = host_and_db.split(['/', '?']).next().unwrap().to_owned();
    let url = format!("{scheme}://no_such_role:s3cret@{host_and_db}");
    every_command(&url, |command, err, failed, _| {
        assert!(failed, "{command}: {err}");
        assert!(
            err.contains(&format!("cannot connect to the database at {address}"))
                && err.contains("role \"no_such_role\" does not exist"),
            "{command}: {err}"
        );
        // Neither the driver's wrapper nor the server's source line.
        assert!(
            !err.contains("error returned from database") && !err.contains(" at line "),
            "{command}: {err}"
        );
        assert!(!err.contains("s3cret"), "{command}: {err}");
    });
}

#[test]
fn a_malformed_or_foreign_database_url_is_blamed_without_its_password() {
    let port = dead_port();
    for (url, says) in [
        ("localhost:5432/app", "expected postgres://"),
        (
            "postgres://app:s3cret@db:notaport/app",
            "invalid port number",
        ),
        (
            "postgres://app:s3cret@localhost/app?sslmode=sometimes",
            "sometimes",
        ),
        (
            &format!("mysql://app:s3cret@127.0.0.1:{port}/app"),
            "not a PostgreSQL URL",
        ),
    ] {
        every_command(url, |command, err, failed, took| {
            assert!(failed, "{url}, {command}: {err}");
            assert!(took < Duration::from_secs(10), "{command} took {took:?}");
            assert!(
                err.contains("DATABASE_URL") && err.contains(says),
                "{url}, {command}: {err}"
            );
            assert!(!err.contains("s3cret"), "{url}, {command}: {err}");
        });
    }
}

#[tokio::test]
async fn actions_on_a_job_or_workflow_that_does_not_exist_say_so() {
    let db = Db::new().await;
    db.execute(&workflows_sql("jobs", &Default::default()).unwrap())
        .await;
    for verb in [
        "complete",
        "reschedule",
        "requeue",
        "fail",
        "cancel",
        "delete",
    ] {
        let err = refused(&cli::dbworker(&db, &[verb, "987654321"]));
        assert!(err.contains("no job 987654321"), "{verb}: {err}");
        assert!(!err.contains("is not"), "{verb}: {err}");
    }
    let err = refused(&cli::dbworker(&db, &["workflow", "cancel", "987654321"]));
    assert!(err.contains("no workflow 987654321"), "{err}");
}

/// A mistyped `DBWORKER_POOLER` is refused by every command that connects,
/// naming the variable and the accepted values, instead of being ignored.
#[tokio::test]
async fn an_unknown_pooler_mode_is_refused_naming_the_variable() {
    let db = Db::new().await;
    for args in [&["status"][..], &["list"], &["pause"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_dbworker"))
            .args(args)
            .args(["--table", "jobs"])
            .env("DATABASE_URL", db.db.url())
            .env("DBWORKER_POOLER", "transactional")
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        let err = refused(&out);
        assert!(
            err.contains("DBWORKER_POOLER")
                && err.contains("\"transactional\"")
                && err.contains("\"transaction\"")
                && err.contains("\"direct\""),
            "{args:?}: {err}"
        );
    }
}

/// The command line speaks TLS (rustls), as managed PostgreSQL services
/// require: against a server whose `pg_hba.conf` admits only `hostssl`,
/// `sslmode=require` and `verify-full` with the CA file connect; a plain
/// connection is refused with the server's reason; `verify-full` against
/// other authorities is refused.
#[tokio::test]
async fn the_command_line_speaks_tls_to_a_server_that_requires_it() {
    let tls = match dbworker_testkit::TlsServer::start() {
        Ok(tls) => tls,
        Err(err) => {
            dbworker_testkit::skip("the TLS test", &err.to_string());
            return;
        }
    };
    let db = Db::on_server(tls.server.admin_url()).await;
    let url = db.db.url().to_owned();
    let sep = if url.contains('?') { '&' } else { '?' };
    let ca = tls.ca_file.display().to_string();
    let status = |query: &str| {
        Command::new(env!("CARGO_BIN_EXE_dbworker"))
            .args(["status", "--table", "jobs"])
            .env("DATABASE_URL", format!("{url}{sep}{query}"))
            .env("RUST_LOG", "off")
            .output()
            .unwrap()
    };
    for query in [
        "sslmode=require".to_owned(),
        format!("sslmode=verify-ca&sslrootcert={ca}"),
        format!("sslmode=verify-full&sslrootcert={ca}"),
    ] {
        let out = status(&query);
        assert!(
            out.status.success(),
            "{query}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let plain = refused(&status("sslmode=disable"));
    assert!(
        plain.contains("no pg_hba.conf entry") && plain.contains("no encryption"),
        "{plain}"
    );
    // The system's authorities did not sign the test server's certificate.
    refused(&status("sslmode=verify-full"));
}
