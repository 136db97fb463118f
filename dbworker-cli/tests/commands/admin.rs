//! The `dbworker` operator commands end to end against real Postgres: status,
//! show, requeue, cancel, fail, delete, pause and resume — each acting only on
//! the states it names, never on a job a worker holds; `fair` (a fair table's
//! keys and weights) and `signal` (a waiting job's signal).

use crate::cli;
use crate::common;

use dbworker::{control::DEFAULT_PAUSE_TABLE, ddl::pause_table_sql};

use cli::{dbworker, ok, refused};
use common::{Db, Job};

/// One job per state; returns their ids by state.
async fn seed(db: &Db) -> std::collections::HashMap<&'static str, i64> {
    db.add_columns(
        |c| c.queue = true,
        &[pause_table_sql(DEFAULT_PAUSE_TABLE).unwrap()],
    )
    .await;
    let mut ids = std::collections::HashMap::new();
    for state in ["queued", "errored", "processing", "failed", "completed"] {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO jobs (state, queue, worker_hostname, num_failures) VALUES ($1, 'mail', CASE WHEN $1 = 'processing' THEN 'host-1' ELSE '' END, 2) RETURNING id",
        )
        .bind(state)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        ids.insert(state, id);
    }
    ids
}

#[tokio::test]
async fn each_command_acts_only_on_the_states_it_names() {
    each_command_acts_only_on_the_states_it_names_on(Db::new().await, false).await;
}

/// The same on a table partitioned by day, each job in its own day's partition.
#[tokio::test]
async fn on_a_partitioned_table_each_command_acts_only_on_the_states_it_names() {
    each_command_acts_only_on_the_states_it_names_on(Db::partitioned().await, true).await;
}

async fn each_command_acts_only_on_the_states_it_names_on(db: Db, spread: bool) {
    let ids = seed(&db).await;
    if spread {
        db.execute("UPDATE jobs SET queued_at = now() - (id % 5) * interval '1 day'")
            .await;
        assert_eq!(db.partitions_in_use().await, 5);
    }
    let id = |s: &str| ids[s].to_string();

    let status = ok(&dbworker(&db, &["status", "--queue-column", "queue"]));
    // queue, pending, scheduled, available, errored, processing, stalled,
    // then the finished states: no retention index, so estimated in total.
    let mail: Vec<&str> = status
        .lines()
        .find(|l| l.starts_with("mail "))
        .unwrap_or_else(|| panic!("{status}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        mail,
        ["mail", "0", "0", "2", "1", "1", "0", "-", "-", "-", "-"],
        "{status}"
    );
    assert!(status.contains("processing on host-1: 1"), "{status}");

    let shown = ok(&dbworker(&db, &["show", &id("failed")]));
    assert!(shown.contains("\"state\": \"failed\""), "{shown}");

    // Requeue: a failed job runs again with a fresh failure count; a queued
    // one is not "requeued".
    ok(&dbworker(&db, &["requeue", &id("failed")]));
    assert_eq!(db.state(ids["failed"]).await, "queued");
    let failures: i32 = db
        .scalar("SELECT num_failures FROM jobs WHERE id = $1", ids["failed"])
        .await;
    assert_eq!(failures, 0);
    assert!(refused(&dbworker(&db, &["requeue", &id("queued")])).contains("not failed"));

    // Cancel: a waiting job at once; a processing one through its worker.
    ok(&dbworker(&db, &["cancel", &id("queued")]));
    assert_eq!(db.state(ids["queued"]).await, "canceled");
    let asked = ok(&dbworker(&db, &["cancel", &id("processing")]));
    assert!(asked.contains("next heartbeat"), "{asked}");
    assert_eq!(db.state(ids["processing"]).await, "processing");
    let flag: bool = db
        .scalar("SELECT cancel FROM jobs WHERE id = $1", ids["processing"])
        .await;
    assert!(flag);

    ok(&dbworker(
        &db,
        &["fail", &id("errored"), "--message", "bad payload"],
    ));
    assert_eq!(db.state(ids["errored"]).await, "failed");
    let message: String = db
        .scalar(
            "SELECT failure_message FROM jobs WHERE id = $1",
            ids["errored"],
        )
        .await;
    assert_eq!(message, "bad payload");

    // A job a worker holds is never deleted.
    refused(&dbworker(&db, &["delete", &id("processing")]));
    ok(&dbworker(&db, &["delete", &id("completed")]));
    let left: i64 = db
        .scalar("SELECT count(*) FROM jobs WHERE id = $1", ids["completed"])
        .await;
    assert_eq!(left, 0);

    let paused = ok(&dbworker(
        &db,
        &["pause", "--queue", "mail", "--by", "test"],
    ));
    assert_eq!(paused.trim(), "paused queue mail");
    let by: String =
        sqlx::query_scalar("SELECT paused_by FROM dbworker_pauses WHERE queue = 'mail'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(by, "test");
    assert_eq!(
        ok(&dbworker(&db, &["resume", "--queue", "mail"])).trim(),
        "resumed queue mail"
    );
    assert!(ok(&dbworker(&db, &["resume", "--queue", "mail"])).contains("already"));
}

/// Failed jobs of two customers in two queues, with a JSON payload and a
/// failure message; one processing job; returns the ids of customer 42's
/// failed `mail` jobs.
async fn seed_many(db: &Db) -> Vec<i64> {
    db.add_columns(
        |c| {
            c.queue = true;
            c.kind = true;
        },
        &[],
    )
    .await;
    sqlx::query(
        "INSERT INTO jobs (state, queue, kind, payload, failure_message, num_failures) \
         SELECT 'failed', CASE WHEN i % 3 = 0 THEN 'reports' ELSE 'mail' END, 'send', \
                jsonb_build_object('customer', jsonb_build_object('id', (41 + i % 2)::text)), \
                'SMTP <b>refused</b> ''x''', 3 \
         FROM generate_series(1, 30) AS i",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO jobs (state, queue, kind, worker_hostname) VALUES ('processing', 'mail', 'send', 'host-9')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query_scalar(
        "SELECT id FROM jobs WHERE state = 'failed' AND queue = 'mail' AND payload->'customer'->>'id' = '42' ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

fn listed_ids(out: &str) -> Vec<i64> {
    out.lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

#[tokio::test]
async fn list_pages_through_a_filter_and_bulk_actions_act_on_it_only() {
    let db = Db::new().await;
    let customer_42 = seed_many(&db).await;
    assert_eq!(customer_42.len(), 10);
    let cols = ["--queue-column", "queue", "--kind-column", "kind"];
    let filter = [
        "--state",
        "failed",
        "--queue",
        "mail",
        "--field",
        "payload.customer.id=42",
    ];
    let list = |extra: &[&str]| {
        let mut args = vec!["list"];
        args.extend(cols);
        args.extend(filter);
        args.extend(extra);
        ok(&dbworker(&db, &args))
    };

    // Two pages of 6 by keyset, oldest first, then the rest.
    let first = list(&["--limit", "6", "--oldest"]);
    assert_eq!(listed_ids(&first), customer_42[..6], "{first}");
    let next = customer_42[5].to_string();
    assert!(first.contains(&format!("more: --after {next}")), "{first}");
    let second = list(&["--limit", "6", "--after", &next, "--oldest"]);
    assert_eq!(listed_ids(&second), customer_42[6..], "{second}");
    assert!(second.contains("end of list"), "{second}");
    assert!(first.contains("SMTP <b>refused</b> 'x'"), "{first}");
    let newest = list(&["--limit", "1", "--newest"]);
    assert_eq!(listed_ids(&newest), [*customer_42.last().unwrap()]);
    // A search (--field, --failure) starts at the newest matches by default.
    let default = list(&["--limit", "1"]);
    assert_eq!(listed_ids(&default), [*customer_42.last().unwrap()]);
    // Hostile text is bound, never spliced into SQL.
    let none = ok(&dbworker(
        &db,
        &[
            "list",
            "--failure",
            "'; DROP TABLE jobs; --",
            "--field",
            "payload.x'=1",
        ],
    ));
    assert!(none.contains("(0 job(s)"), "{none}");
    let by_failure = ok(&dbworker(
        &db,
        &["list", "--failure", "<B>REFUSED", "--limit", "100"],
    ));
    assert_eq!(listed_ids(&by_failure).len(), 30);

    // Without --yes and nobody at a terminal: the count, and nothing done.
    let mut args = vec!["requeue"];
    args.extend(cols);
    args.extend(filter);
    let asked = refused(&dbworker(&db, &args));
    assert!(asked.contains("10 job(s) match; nothing done"), "{asked}");
    assert_eq!(db.count("queued").await, 0);

    args.push("--yes");
    let done = ok(&dbworker(&db, &args));
    assert!(done.contains("requeued 10 job(s)"), "{done}");
    let requeued: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM jobs WHERE state = 'queued' ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(requeued, customer_42, "only the matching jobs");

    // Bulk cancel: waiting jobs now, the processing one through its worker;
    // batches smaller than the match.
    let done = ok(&dbworker(
        &db,
        &[
            "cancel",
            "--queue-column",
            "queue",
            "--queue",
            "mail",
            "--state",
            "queued,processing",
            "--chunk-size",
            "3",
            "--yes",
        ],
    ));
    assert!(
        done.contains("canceled (or asked to cancel) 11 job(s)"),
        "{done}"
    );
    assert_eq!(db.count("canceled").await, 10);
    assert_eq!(db.count("processing").await, 1);

    // Bulk delete never deletes the job a worker holds.
    let done = ok(&dbworker(
        &db,
        &["delete", "--kind-column", "kind", "--kind", "send", "--yes"],
    ));
    assert!(done.contains("deleted 30 job(s)"), "{done}");
    assert_eq!(db.count("processing").await, 1);

    // A filter is required for bulk actions, and not with an id.
    assert!(refused(&dbworker(&db, &["delete", "--yes"])).contains("filter flags"));
    assert!(refused(&dbworker(&db, &["delete", "1", "--state", "failed"])).contains("not both"));
    // The table's `queue` column serves --queue without --queue-column.
    assert!(ok(&dbworker(&db, &["list", "--queue", "mail"])).contains("processing mail"));
}

/// Takes a while over each job, so a backlog outlasts the pause below.
struct Slow;
impl workerutil::Handler<dbworker::DbStore<common::Job>> for Slow {
    async fn handle(
        &self,
        _job: &mut dbworker::DbJob<common::Job>,
        _ctx: &workerutil::JobContext<dbworker::DbStore<common::Job>>,
    ) -> Result<(), workerutil::HandlerError> {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        Ok(())
    }
}

/// A pause from the command line holds for workers built each way the guide
/// shows: the table described with its columns named and no pause table,
/// `detected`, `typed`, and schema-qualified. After `dbworker pause` returns,
/// no worker claims from the paused queue while the other queue goes on; after
/// `dbworker resume` every job completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pause_from_the_command_line_holds_for_every_worker_however_built() {
    use dbworker::{DbStore, JobTableOptions, new_worker};
    use std::time::Duration;

    let db = Db::new().await;
    db.add_columns(
        |c| *c = dbworker::ddl::OptionalColumns::all(),
        &[pause_table_sql(DEFAULT_PAUSE_TABLE).unwrap()],
    )
    .await;
    db.execute(
        "INSERT INTO jobs (queue, kind, payload) SELECT CASE WHEN i % 2 = 0 THEN 'pipelines' ELSE 'other' END, 'k', '{}' FROM generate_series(1, 4000) AS i",
    )
    .await;
    let mut named = JobTableOptions::new("jobs");
    named.queue_column = Some("queue".into());
    let mut typed = JobTableOptions::typed("jobs");
    typed.queue_column = Some("queue".into());
    let mut qualified = JobTableOptions::new("public.jobs");
    qualified.queue_column = Some("queue".into());
    let descriptions = [named, JobTableOptions::detected("jobs"), typed, qualified];
    let mut shutdowns = Vec::new();
    let mut runs = Vec::new();
    for options in descriptions {
        let table = dbworker::JobTable::new(&db.pool, options).await.unwrap();
        assert_eq!(table.pause_table().as_deref(), Some(DEFAULT_PAUSE_TABLE));
        let mut so = db.options();
        so.handling = dbworker::Handling::Heartbeat;
        so.stall.stalled_max_age = Duration::from_secs(60);
        let store = std::sync::Arc::new(DbStore::new(&db.pool, &table, so).await.unwrap());
        let mut wo = workerutil::WorkerOptions::new("pause-test");
        wo.num_handlers = 2;
        wo.interval = Duration::from_millis(10);
        let worker = new_worker(store, Slow, wo).unwrap();
        shutdowns.push(worker.shutdown_handle());
        runs.push(tokio::spawn(worker.run()));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let db_url = db.db.url().to_owned();
    let paused = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_dbworker"))
            .args(["pause", "--queue", "pipelines", "--table", "jobs"])
            .env("DATABASE_URL", db_url)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(ok(&paused).trim(), "paused queue pipelines");
    let after: String = sqlx::query_scalar("SELECT clock_timestamp()::text")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (pipelines, other, waiting): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE queue = 'pipelines' AND started_at > $1::timestamptz),
                count(*) FILTER (WHERE queue = 'other' AND started_at > $1::timestamptz),
                count(*) FILTER (WHERE queue = 'pipelines' AND state = 'queued')
         FROM jobs",
    )
    .bind(after)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(pipelines, 0, "claims from the paused queue after the pause");
    assert!(other > 0, "the other queue goes on");
    assert!(waiting > 0, "the paused queue still has work");

    assert_eq!(
        ok(&dbworker(&db, &["resume", "--queue", "pipelines"])).trim(),
        "resumed queue pipelines"
    );
    db.wait_until_no_live_job(Duration::from_secs(120)).await;
    for s in &shutdowns {
        s.graceful();
    }
    for r in runs {
        r.await.unwrap();
    }
    assert_eq!(db.count("completed").await, 4000);
}

/// `list --state stalled` lists the processing jobs whose heartbeat is
/// older than --stalled-after, as `status` counts them; not the live ones.
#[tokio::test]
async fn list_takes_the_stalled_state_that_status_counts() {
    let db = Db::new().await;
    let ids: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO jobs (state, started_at, last_heartbeat_at) VALUES
           ('processing', now() - interval '1 hour', now() - interval '10 minutes'),
           ('processing', now() - interval '1 hour', now())
         RETURNING id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let listed = ok(&dbworker(&db, &["list", "--state", "stalled"]));
    assert_eq!(listed_ids(&listed), [ids[0]], "{listed}");
    let none = ok(&dbworker(
        &db,
        &["list", "--state", "stalled", "--stalled-after", "1h"],
    ));
    assert!(listed_ids(&none).is_empty(), "{none}");
    let err = refused(&dbworker(&db, &["list", "--state", "stalled,failed"]));
    assert!(err.contains("cannot be combined"), "{err}");
}

/// `dbworker cron` runs the schedules of a crontab file as its own process:
/// the first pass registers them, a pass after a missed tick enqueues it
/// once, with the entry's payload; a bad line is refused naming it.
#[tokio::test]
async fn the_cron_command_runs_a_crontab_file() {
    let db = Db::new().await;
    db.add_columns(
        |c| {
            c.kind = true;
            c.queue = true;
        },
        &[dbworker::ddl::cron_table_sql(dbworker::cron::DEFAULT_CRON_TABLE).unwrap()],
    )
    .await;
    let dir = std::env::temp_dir().join(format!("dbworker-crontab-{}", db.db.name()));
    std::fs::create_dir_all(&dir).unwrap();
    let crontab = dir.join("crontab");
    std::fs::write(
        &crontab,
        "# every minute\n* * * * * send_digest ?id=digest&queue=mail {\"to\": \"ops\"}\n",
    )
    .unwrap();
    let path = crontab.display().to_string();
    let once = || ok(&dbworker(&db, &["cron", "--crontab", &path, "--once"]));
    assert!(
        once().contains("enqueued 0 job(s)"),
        "the first pass registers"
    );
    db.execute("UPDATE dbworker_cron SET last_tick = last_tick - interval '2 minutes'")
        .await;
    let out = once();
    assert!(
        out.contains("enqueued 1 job(s)") && out.contains("digest: job"),
        "{out}"
    );
    let (kind, queue, to): (String, String, String) =
        sqlx::query_as("SELECT kind, queue, payload->>'to' FROM jobs")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (kind.as_str(), queue.as_str(), to.as_str()),
        ("send_digest", "mail", "ops")
    );

    std::fs::write(&crontab, "* * * * send_digest\n").unwrap();
    let err = refused(&dbworker(&db, &["cron", "--crontab", &path, "--once"]));
    assert!(err.contains("line 1"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `dbworker fair` lists each key's waiting and running jobs with its
/// weight, most waiting first (jobs without a key last among equals); `--set key=N` writes the weight table,
/// `--remove key` deletes the row (weight 1 again); a bad weight is refused
/// and changes nothing.
#[tokio::test]
async fn fair_lists_each_keys_share_and_sets_and_removes_weights() {
    let db = Db::new().await;
    let fair = dbworker::ddl::FairClaims::default();
    db.execute(&dbworker::ddl::fair_claims_sql("jobs", &Default::default(), &fair).unwrap())
        .await;
    db.execute(
        "INSERT INTO jobs (fair_key) SELECT 'acme' FROM generate_series(1, 3);
         INSERT INTO jobs (fair_key) VALUES ('globex'), (NULL);
         INSERT INTO jobs (fair_key, state, started_at, last_heartbeat_at) VALUES ('globex', 'processing', now(), now());
         INSERT INTO jobs (fair_key, state, finished_at) VALUES ('initech', 'completed', now());",
    )
    .await;
    // Each key's row as its cells: key, waiting, running, weight.
    let rows = |out: &str| -> Vec<Vec<String>> {
        out.lines()
            .skip_while(|l| !l.starts_with("KEY"))
            .skip(1)
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .collect()
    };
    let weights = async || -> Vec<(String, i32)> {
        sqlx::query_as("SELECT fair_key, weight FROM jobs_fair_weights ORDER BY fair_key")
            .fetch_all(&db.pool)
            .await
            .unwrap()
    };

    let out = ok(&dbworker(&db, &["fair"]));
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["KEY", "WAITING", "RUNNING", "WEIGHT"], "{out}");
    assert_eq!(
        rows(&out),
        [
            ["acme", "3", "0", "1"],
            ["globex", "1", "1", "1"],
            ["(none)", "1", "0", "1"],
        ],
        "{out}"
    );

    let out = ok(&dbworker(
        &db,
        &["fair", "--set", "acme=4", "--set", "globex=2"],
    ));
    assert!(
        out.contains("weight of \"acme\" is 4") && out.contains("weight of \"globex\" is 2"),
        "{out}"
    );
    assert_eq!(rows(&out)[0], ["acme", "3", "0", "4"], "{out}");
    assert_eq!(rows(&out)[1], ["globex", "1", "1", "2"], "{out}");
    assert_eq!(
        weights().await,
        [("acme".to_owned(), 4), ("globex".to_owned(), 2)]
    );
    // Set again: the row is updated, not doubled.
    ok(&dbworker(&db, &["fair", "--set", "acme=5"]));
    assert_eq!(weights().await[0], ("acme".to_owned(), 5));

    let out = ok(&dbworker(
        &db,
        &[
            "fair", "--remove", "acme", "--remove", "nobody", "--top", "1",
        ],
    ));
    assert!(out.contains("weight of \"acme\" is 1\n"), "{out}");
    assert!(out.contains("weight of \"nobody\" is 1 (it was)"), "{out}");
    assert_eq!(rows(&out), [["acme", "3", "0", "1"]], "--top 1: {out}");
    assert_eq!(weights().await, [("globex".to_owned(), 2)]);

    // Refused, naming what is wrong; the weight table is unchanged.
    let err = refused(&dbworker(&db, &["fair", "--set", "acme=0"]));
    assert!(err.contains("between 1 and 10000"), "{err}");
    let err = refused(&dbworker(&db, &["fair", "--set", "acme"]));
    assert!(err.contains("is not key=weight"), "{err}");
    assert_eq!(weights().await, [("globex".to_owned(), 2)]);
}

/// `dbworker signal` puts the signal in the mailbox and wakes the job that
/// waits for it: a worker's handler waiting for `paid` resumes at once and
/// consumes the payload; a repeated dedupe key is delivered once; `--key`
/// addresses the live job holding a key; an unknown job or a payload that
/// is not JSON is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_wakes_the_waiting_job_which_consumes_it_once() {
    use dbworker::{DbJob, DbStore, Handling, new_worker};
    use std::time::{Duration, Instant};
    use workerutil::{HandlerError, JobContext};

    const HOUR: Duration = Duration::from_secs(3600);
    /// Waits for `paid`, then records its payload in the job's transaction.
    struct Pays;
    impl workerutil::Handler<DbStore<Job>> for Pays {
        async fn handle(
            &self,
            job: &mut DbJob<Job>,
            ctx: &JobContext<DbStore<Job>>,
        ) -> Result<(), HandlerError> {
            let Some(paid) = job.signal::<serde_json::Value>(ctx.store(), "paid").await? else {
                return Err(HandlerError::wait_for("paid", HOUR));
            };
            let id = job.record().id;
            sqlx::query("INSERT INTO side_effects (job_id, note) VALUES ($1, $2)")
                .bind(id)
                .bind(paid.to_string())
                .execute(job.tx().expect("transactional handling"))
                .await
                .map_err(HandlerError::retryable)?;
            Ok(())
        }
    }
    async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done().await {
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    let db = Db::new().await;
    db.add_columns(
        |c| c.keys = true,
        &[dbworker::ddl::signals_sql("jobs", &Default::default()).unwrap()],
    )
    .await;
    let table = db.table_with(|o| o.signals = true).await;
    let mut so = db.options();
    so.handling = Handling::Transactional;
    so.stall.stalled_max_age = Duration::from_secs(60);
    let store = std::sync::Arc::new(DbStore::new(&db.pool, &table, so).await.unwrap());
    let mut wo = workerutil::WorkerOptions::new("signal-test");
    wo.interval = Duration::from_millis(20);
    let worker = new_worker(store, Pays, wo).unwrap();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());

    let id = db.enqueue(1, serde_json::json!({})).await[0];
    let awaiting = async || -> Option<String> {
        sqlx::query_scalar("SELECT awaiting FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };
    until("the job never waited for paid", async || {
        awaiting().await.as_deref() == Some("paid")
    })
    .await;
    let ids = id.to_string();
    let send = [
        "signal",
        "--id",
        &ids,
        "--name",
        "paid",
        "--payload",
        r#"{"amount": 5}"#,
        "--dedupe",
        "evt_1",
    ];
    assert_eq!(ok(&dbworker(&db, &send)), "sent paid\n");
    let (name, payload, dedupe): (String, Option<serde_json::Value>, Option<String>) =
        sqlx::query_as("SELECT name, payload, dedupe_key FROM jobs_signals WHERE job_id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (name.as_str(), payload, dedupe.as_deref()),
        (
            "paid",
            Some(serde_json::json!({"amount": 5})),
            Some("evt_1")
        )
    );
    // Woken at once (not in an hour): the handler ran again and consumed it.
    until("the signalled job did not complete", async || {
        db.state(id).await == "completed"
    })
    .await;
    let note: String = db
        .scalar("SELECT note FROM side_effects WHERE job_id = $1", id)
        .await;
    assert_eq!(note, r#"{"amount":5}"#);
    let consumed: bool = db
        .scalar(
            "SELECT consumed_at IS NOT NULL FROM jobs_signals WHERE job_id = $1",
            id,
        )
        .await;
    assert!(consumed, "the resumed attempt did not consume its signal");
    // The same dedupe key again: delivered once, no second row.
    assert_eq!(
        ok(&dbworker(&db, &send)),
        "paid was sent before with this dedupe key: delivered once\n"
    );
    let rows: i64 = db
        .scalar("SELECT count(*) FROM jobs_signals WHERE job_id = $1", id)
        .await;
    assert_eq!(rows, 1);
    shutdown.graceful();
    run.await.unwrap();

    // By key, to a job waiting with no worker running: requeued to run now.
    let keyed: i64 = db
        .scalar(
            "INSERT INTO jobs (job_key, awaiting, process_after) VALUES ('order-7', 'shipped', now() + interval '1 hour') RETURNING id + $1",
            0,
        )
        .await;
    let out = ok(&dbworker(
        &db,
        &["signal", "--key", "order-7", "--name", "shipped"],
    ));
    assert_eq!(out, "sent shipped\n");
    let (state, awaiting, due): (String, Option<String>, bool) =
        sqlx::query_as("SELECT state, awaiting, process_after <= now() FROM jobs WHERE id = $1")
            .bind(keyed)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), awaiting, due), ("queued", None, true));
    let mailbox: i64 = db
        .scalar(
            "SELECT count(*) FROM jobs_signals WHERE job_id = $1 AND name = 'shipped' AND payload IS NULL AND consumed_at IS NULL",
            keyed,
        )
        .await;
    assert_eq!(mailbox, 1);

    // Refused, naming what is wrong.
    let err = refused(&dbworker(
        &db,
        &["signal", "--id", "999999", "--name", "paid"],
    ));
    assert!(err.contains("no job 999999"), "{err}");
    let err = refused(&dbworker(
        &db,
        &[
            "signal",
            "--id",
            &ids,
            "--name",
            "paid",
            "--payload",
            "{oops",
        ],
    ));
    assert!(err.contains("--payload is not JSON"), "{err}");
    let err = refused(&dbworker(&db, &["signal", "--name", "paid"]));
    assert!(err.contains("--id") || err.contains("--key"), "{err}");
}
