//! Everything through PgBouncer in transaction mode (`Pooler::Transaction`):
//! PgBouncer with four server connections in front of the test database,
//! sixteen client connections, so one client's statements run on server
//! connections other clients prepared theirs on. Enqueues (single, bulk,
//! COPY, keyed), a workflow, workers in both handling modes writing through
//! `job.tx()` with heartbeats, retries and execution logs, the resetter and
//! the admin: nothing errors and every job completes exactly once. In
//! `Pooler::Direct` mode the start-up check names the setting; a PgBouncer
//! refusing `extra_float_digits` is named with its pgbouncer.ini line.
//! Skipped, saying why, without pgbouncer (.ci/run installs it).

use crate::common;

use dbworker::{
    DbJob, DbStore, Enqueuer, Handling, JobTable, JobTableOptions, KeyMode, NewJob, Pooler,
    Resetter, ResetterOptions,
    admin::{Admin, JobFilter, PageRequest},
    ddl::{OptionalColumns, workflows_sql},
    new_worker,
    workflow::{Task, Workflow, Workflows},
};
use dbworker_testkit::pgbouncer as bouncer;
use serde_json::json;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use std::sync::Arc;
use std::time::Duration;
use workerutil::{ExecutionLogEntry, Handler, HandlerError, JobContext, WorkerOptions};

use crate::POOLER;
use bouncer::Bouncer;
use common::{Db, Job};

/// Writes a side effect (in the job's transaction, or through the pool),
/// logs an entry, and fails the first attempt of a job whose payload says
/// `fail_once`. Its own statements are unnamed (`persistent(false)`) and run
/// in a transaction, as an application's must behind a transaction pooler.
struct Writes {
    pool: PgPool,
}
impl Handler<DbStore<Job>> for Writes {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let id = job.record().id;
        if job.record().payload["fail_once"] == json!(true) {
            let mut tx = self.pool.begin().await?;
            let failures: i32 = sqlx::query_scalar("SELECT num_failures FROM jobs WHERE id = $1")
                .bind(id)
                .persistent(false)
                .fetch_one(&mut *tx)
                .await?;
            tx.commit().await?;
            if failures == 0 {
                return Err(std::io::Error::other("first attempt fails").into());
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        let insert = sqlx::query("INSERT INTO side_effects (job_id, note) VALUES ($1, 'ran')")
            .bind(id)
            .persistent(false);
        match job.tx() {
            Some(tx) => {
                insert.execute(tx).await?;
            }
            None => {
                let mut tx = self.pool.begin().await?;
                insert.execute(&mut *tx).await?;
                tx.commit().await?;
            }
        }
        let entry = ExecutionLogEntry {
            key: "ran".into(),
            ..Default::default()
        };
        ctx.log(&entry).await.map_err(HandlerError::Retryable)?;
        Ok(())
    }
}

/// A job read as its id and payload.
#[derive(Debug, sqlx::FromRow)]
struct Small {
    id: i64,
    payload: serde_json::Value,
}
impl workerutil::Record for Small {
    fn id(&self) -> i64 {
        self.id
    }
}

/// Checks the payload `each_statement_is_one_exchange_through_pgbouncer`
/// enqueued, which its record read from text.
struct ChecksPayload;
impl Handler<DbStore<Small>> for ChecksPayload {
    async fn handle(
        &self,
        job: &mut DbJob<Small>,
        _: &JobContext<DbStore<Small>>,
    ) -> Result<(), HandlerError> {
        let payload = &job.record().payload;
        if payload["s"] != json!(TRICKY) || !payload["n"].is_i64() {
            return Err(std::io::Error::other(format!("read back as {payload}")).into());
        }
        Ok(())
    }
}

/// Text that a statement written with its values in must keep.
const TRICKY: &str = "it's a \\ \"test\" $1 E'\\'' \u{1a}";

/// Writes with sqlx's default, a statement prepared under a name: behind a
/// transaction pooler it meets another client's statement of that name.
struct NamedStatement;
impl Handler<DbStore<Job>> for NamedStatement {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let id = job.record().id;
        let tx = job.tx().expect("transactional handling");
        sqlx::query("INSERT INTO side_effects (job_id, note) VALUES ($1, 'named')")
            .bind(id)
            .execute(tx)
            .await?;
        Ok(())
    }
}

fn table_options() -> JobTableOptions {
    let mut o = Db::table_options();
    o.key_column = Some("job_key".into());
    o.queue_column = Some("queue".into());
    o.workflows = true;
    o
}

/// Transactional handling holds a server connection per running handler:
/// three of PgBouncer's four, so heartbeats, logs and claims share the last.
fn worker_options(name: &str, handling: Handling) -> WorkerOptions {
    let mut o = WorkerOptions::new(name);
    o.num_handlers = match handling {
        Handling::Transactional => 3,
        _ => 8,
    };
    o.interval = Duration::from_millis(20);
    o.heartbeat_interval = Duration::from_millis(100);
    o.heartbeat_failure_limit = Some(Duration::from_secs(2));
    o
}

async fn pgbouncer() -> Option<(Db, Bouncer, PgPool)> {
    let binary = match bouncer::find() {
        Ok(b) => b,
        Err(reason) => {
            dbworker_testkit::skip("the PgBouncer test", &reason);
            return None;
        }
    };
    let db = Db::new().await;
    db.add_columns(|c| *c = OptionalColumns::all(), &[]).await;
    db.execute(&workflows_sql("jobs", &Default::default()).unwrap())
        .await;
    let b = Bouncer::start(&binary, db.db.url(), 4, true);
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect(&b.url())
        .await
        .expect("a pool through PgBouncer");
    Some((db, b, pool))
}

async fn run_worker(pool: &PgPool, table: &JobTable, handling: Handling, db: &Db) {
    let mut so = Db::options_for_tests();
    so.handling = handling;
    so.max_num_retries = 3;
    let name = format!("{handling:?}");
    // A workflow's next task is queued as the one before completes: run
    // until nothing is left (a new store each time, its claim cursor from
    // the start).
    for _ in 0..20 {
        let store = Arc::new(DbStore::new(pool, table, so.clone()).await.expect("store"));
        let handler = Writes { pool: pool.clone() };
        new_worker(store, handler, worker_options(&name, handling))
            .unwrap()
            .run_until_empty()
            .await;
        // A dependent released below the claim cursor waits for the
        // cursor's wrap, past `run_until_empty`'s first empty claim.
        if db.count("pending").await + db.count("queued").await + db.count("errored").await == 0 {
            break;
        }
    }
    let live: Vec<(i64, String, Option<String>, i32)> = sqlx::query_as(
        "SELECT id, state, failure_message, num_failures FROM jobs WHERE state IN ('pending', 'queued', 'errored', 'processing')",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(live.is_empty(), "{handling:?}: {live:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn everything_runs_through_pgbouncer_in_transaction_mode() {
    let _turn = POOLER.lock().await;
    let Some((db, b, pool)) = pgbouncer().await else {
        return;
    };
    // Another sqlx program used the same server connections first (the
    // operator's report: `prepared statement "sqlx_s_2" already exists`).
    assert_eq!(b.leave_named_statements().await, 60);
    dbworker::set_pooler(Pooler::Transaction { listen_url: None });
    let table = JobTable::new(&pool, table_options()).await.unwrap();
    let enqueuer = Enqueuer::new(&pool, &table).await.unwrap();

    // Enqueues: one at a time from many tasks, in bulk, by COPY, keyed.
    let mut singles = Vec::new();
    for i in 0..40 {
        let enqueuer = enqueuer.clone();
        singles.push(tokio::spawn(async move {
            let job = NewJob::new().json("payload", json!({ "fail_once": i % 10 == 0 }));
            enqueuer.enqueue(&job).await.unwrap().id()
        }));
    }
    for s in singles {
        s.await.unwrap();
    }
    let bulk: Vec<NewJob> = (0..100).map(|_| NewJob::new().queue("bulk")).collect();
    assert_eq!(enqueuer.enqueue_many(&bulk).await.unwrap().len(), 100);
    assert_eq!(enqueuer.enqueue_copy(&bulk[..50]).await.unwrap(), 50);
    let keyed = NewJob::new().key("user:42", KeyMode::DedupeOnly);
    let first = enqueuer.enqueue(&keyed).await.unwrap().id();
    assert_eq!(
        enqueuer.enqueue(&keyed).await.unwrap().id(),
        first,
        "deduplicated"
    );

    // A stalled job for the resetter.
    sqlx::query(
        "UPDATE jobs SET state = 'processing', started_at = now() - interval '1 hour', last_heartbeat_at = now() - interval '1 hour' WHERE id = $1",
    )
    .bind(first)
    .execute(&db.pool)
    .await
    .unwrap();
    let mut ro = ResetterOptions::new("r");
    ro.stall.stalled_max_age = Duration::from_secs(5);
    let reset = Resetter::new(&pool, &table, ro)
        .await
        .unwrap()
        .reset_once()
        .await
        .unwrap();
    let reset: Vec<i64> = reset.reset.iter().map(|(id, _)| *id).collect();
    assert_eq!(reset, vec![first]);

    // The admin reads through it too.
    let admin = Admin::new(&pool, &table).await.unwrap();
    let status = admin.status().await.unwrap();
    let live: u64 = status.live.iter().map(|(_, _, n)| n).sum();
    assert_eq!(live, 191);
    let page = admin
        .list(&JobFilter::default(), PageRequest::first(10))
        .await
        .unwrap();
    assert_eq!(page.jobs.len(), 10);

    // Half the jobs in heartbeat handling, then the rest and a workflow in
    // transactional handling.
    run_worker(&pool, &table, Handling::Heartbeat, &db).await;
    let workflows = Workflows::new(&pool, &table).await.unwrap();
    let wf = workflows
        .enqueue(
            &Workflow::new()
                .task(Task::new("a", NewJob::new()))
                .task(Task::new("b", NewJob::new()).after(["a"]))
                .task(Task::new("c", NewJob::new()).after(["a", "b"])),
        )
        .await
        .unwrap();
    // A job enqueued after another (`NewJob::after`) waits for it.
    let upstream = enqueuer.enqueue(&NewJob::new()).await.unwrap().id();
    let downstream = enqueuer
        .enqueue(&NewJob::new().after([upstream]))
        .await
        .unwrap()
        .id();
    for _ in 0..60 {
        enqueuer
            .enqueue(&NewJob::new().json("payload", json!({ "fail_once": true })))
            .await
            .unwrap();
    }
    run_worker(&pool, &table, Handling::Transactional, &db).await;
    assert!(
        workflows
            .status(wf.id)
            .await
            .unwrap()
            .unwrap()
            .is_finished(),
        "the workflow finished"
    );

    let (jobs, completed, once, logged, retried): (i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT count(*),
                count(*) FILTER (WHERE state = 'completed'),
                count(*) FILTER (WHERE (SELECT count(*) FROM side_effects s WHERE s.job_id = j.id) = 1),
                count(*) FILTER (WHERE coalesce(array_length(execution_logs, 1), 0) >= 1),
                count(*) FILTER (WHERE num_failures = 1)
         FROM jobs j",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let not_done: Vec<(i64, String, Option<String>, i32)> = sqlx::query_as(
        "SELECT id, state, failure_message, num_failures FROM jobs WHERE state <> 'completed' ORDER BY id LIMIT 5",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(not_done.is_empty(), "{not_done:?}");
    assert_eq!(jobs, 256, "191 + 3 workflow tasks + 2 after + 60");
    let (in_order,): (bool,) = sqlx::query_as(
        "SELECT d.started_at >= u.finished_at FROM jobs u, jobs d WHERE u.id = $1 AND d.id = $2",
    )
    .bind(upstream)
    .bind(downstream)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        in_order,
        "the job enqueued after another started once it finished"
    );
    assert_eq!(completed, jobs, "every job completed");
    assert_eq!(once, jobs, "every job ran its side effect exactly once");
    assert_eq!(logged, jobs, "every job has its execution log");
    assert_eq!(retried, 4 + 60, "each job failing once was retried once");
    let log = b.log();
    assert!(!log.contains("ERROR"), "PgBouncer logged errors:\n{log}");

    // A handler whose own statement is prepared under a name (sqlx's
    // default) fails its job saying why and what to change.
    let named = NewJob::new().json("payload", json!({}));
    let id = enqueuer.enqueue(&named).await.unwrap().id();
    let fresh = b.pool(3).await;
    let store = Arc::new(
        DbStore::new(&fresh, &table, Db::options_for_tests())
            .await
            .unwrap(),
    );
    let mut wo = worker_options("named", Handling::Transactional);
    wo.num_handlers = 1;
    new_worker(store, NamedStatement, wo)
        .unwrap()
        .run_until_empty()
        .await;
    let message: String = db
        .scalar("SELECT failure_message FROM jobs WHERE id = $1", id)
        .await;
    assert!(
        message.contains("sqlx_s_") && message.contains(".persistent(false)"),
        "{message}"
    );

    // The same pooler in direct mode: the start-up check names the setting.
    dbworker::set_pooler(Pooler::Direct);
    let err = JobTable::new(&pool, table_options()).await.unwrap_err();
    dbworker::set_pooler(Pooler::Transaction { listen_url: None });
    let message = err.to_string();
    assert!(
        message.contains("pooler in transaction mode")
            && message.contains("Pooler::Transaction { listen_url }.apply_to(&pool)")
            && message.contains("DBWORKER_POOLER=transaction"),
        "{message}"
    );
}

/// One process, two pools: one through PgBouncer (its own mode, after
/// another program left sqlx's statement names on the server connections)
/// and one straight to PostgreSQL (the process default, `Direct`). Workers
/// of both run the same table at once; every job completes exactly once,
/// the pooled side never collides, and the direct side keeps its named,
/// cached statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_process_holds_a_direct_pool_and_one_through_pgbouncer() {
    let _turn = POOLER.lock().await;
    let Some((db, b, pooled)) = pgbouncer().await else {
        return;
    };
    assert_eq!(b.leave_named_statements().await, 60);
    dbworker::set_pooler(Pooler::Direct);
    Pooler::Transaction { listen_url: None }.apply_to(&pooled);
    let direct = PgPoolOptions::new()
        .max_connections(6)
        .connect(db.db.url())
        .await
        .unwrap();
    assert!(Pooler::of(&pooled).is_transaction());
    assert_eq!(Pooler::of(&direct), Pooler::Direct);

    let through = JobTable::new(&pooled, table_options()).await.unwrap();
    let straight = JobTable::new(&direct, table_options()).await.unwrap();
    let (pooled_enqueuer, direct_enqueuer) = (
        Enqueuer::new(&pooled, &through).await.unwrap(),
        Enqueuer::new(&direct, &straight).await.unwrap(),
    );
    let job = |i: i32| NewJob::new().json("payload", json!({ "fail_once": i % 7 == 0 }));
    for i in 0..30 {
        pooled_enqueuer.enqueue(&job(i)).await.unwrap();
        direct_enqueuer.enqueue(&job(i)).await.unwrap();
    }
    let many: Vec<NewJob> = (0..30).map(job).collect();
    pooled_enqueuer.enqueue_many(&many).await.unwrap();
    direct_enqueuer.enqueue_many(&many).await.unwrap();
    // A caller's transaction on the pooled side: its pool is not known to
    // the enqueuer, so it is sent the transaction-mode way.
    let mut tx = pooled.begin().await.unwrap();
    pooled_enqueuer.enqueue_in(&mut tx, &job(1)).await.unwrap();
    tx.commit().await.unwrap();
    // The other services built on the pooled pool follow its mode too: a
    // resetter puts back a stalled job, the admin reads.
    let stalled: i64 = sqlx::query_scalar(
        "UPDATE jobs SET state = 'processing', started_at = now() - interval '1 hour', last_heartbeat_at = now() - interval '1 hour' WHERE id = (SELECT min(id) FROM jobs) RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let mut ro = ResetterOptions::new("r");
    ro.stall.stalled_max_age = Duration::from_secs(5);
    let reset = Resetter::new(&pooled, &through, ro)
        .await
        .unwrap()
        .reset_once()
        .await
        .unwrap();
    let reset: Vec<i64> = reset.reset.iter().map(|(id, _)| *id).collect();
    assert_eq!(reset, vec![stalled]);
    let status = Admin::new(&pooled, &through)
        .await
        .unwrap()
        .status()
        .await
        .unwrap();
    assert_eq!(status.live.iter().map(|(_, _, n)| n).sum::<u64>(), 121);

    // Both sides at once on the one table, until nothing is left (a
    // retried job comes back after its back-off).
    let work = async |pool: &PgPool, table: &JobTable, handling: Handling| {
        let mut so = Db::options_for_tests();
        so.handling = handling;
        so.max_num_retries = 3;
        let store = Arc::new(DbStore::new(pool, table, so).await.expect("store"));
        let handler = Writes { pool: pool.clone() };
        new_worker(
            store,
            handler,
            worker_options(&format!("{handling:?}"), handling),
        )
        .unwrap()
        .run_until_empty()
        .await;
    };
    for _ in 0..20 {
        tokio::join!(
            work(&pooled, &through, Handling::Transactional),
            work(&direct, &straight, Handling::Heartbeat),
        );
        if db.count("completed").await == 121 {
            break;
        }
    }
    assert_eq!(db.count("completed").await, 121);
    let twice: Option<i64> = sqlx::query_scalar(
        "SELECT job_id FROM side_effects GROUP BY job_id HAVING count(*) > 1 LIMIT 1",
    )
    .fetch_optional(&db.pool)
    .await
    .unwrap();
    assert_eq!(twice, None, "a job's side effect written twice");

    // The direct pool prepared its statements under names (the fast way):
    // a connection of it holds some.
    let mut conn = direct.acquire().await.unwrap();
    let named: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_prepared_statements")
        .persistent(false)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert!(named > 0, "the direct pool sent its statements unnamed");
    drop(conn);
    dbworker::set_pooler(Pooler::Transaction { listen_url: None });
}

/// A stock pgbouncer.ini refuses sqlx's `extra_float_digits`: the start-up
/// check says which line to add.
#[tokio::test]
async fn a_pooler_refusing_extra_float_digits_is_named_with_the_fix() {
    let binary = match bouncer::find() {
        Ok(b) => b,
        Err(reason) => {
            dbworker_testkit::skip("the PgBouncer test", &reason);
            return;
        }
    };
    let db = Db::new().await;
    let b = Bouncer::start(&binary, db.db.url(), 2, false);
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_lazy(&b.url())
        .unwrap();
    let err = JobTable::new(&pool, Db::table_options())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("extra_float_digits")
            && err.contains("ignore_startup_parameters = extra_float_digits"),
        "{err}"
    );
}

/// The `pgbouncer.ini` of the operations manual, as printed there, with the
/// host, ports, names and paths replaced by this test's: PgBouncer starts
/// from it, a role logs in through it with its password, and the services
/// run through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manuals_pgbouncer_ini_serves_every_service() {
    let binary = match bouncer::find() {
        Ok(b) => b,
        Err(reason) => {
            dbworker_testkit::skip("the PgBouncer test", &reason);
            return;
        }
    };
    let _turn = POOLER.lock().await;
    let manual =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
            .unwrap();
    let ini = manual
        .split_once("<!-- pgbouncer.ini -->\n```ini\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(ini, _)| ini.to_owned())
        .expect("the manual's pgbouncer.ini");
    let db = Db::new().await;
    let role = "dbworker_manual_ini";
    db.execute(&format!(
        "DO $$ BEGIN CREATE ROLE {role} LOGIN SUPERUSER; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
         ALTER ROLE {role} PASSWORD 'ini-secret'"
    ))
    .await;
    let target: sqlx::postgres::PgConnectOptions = db.db.url().parse().unwrap();
    let database = target.get_database().unwrap().to_owned();
    let server_port = target.get_port();
    let b = Bouncer::start_with_ini(&binary, &database, |dir, port| {
        let userlist = dir.join("userlist.txt");
        std::fs::write(&userlist, format!("\"{role}\" \"ini-secret\"\n")).unwrap();
        let replaced = ini
            .replace("\napp = ", &format!("\n{database} = "))
            .replace("host=db-primary", "host=127.0.0.1")
            .replace("port=5432", &format!("port={server_port}"))
            .replace("dbname=app", &format!("dbname={database}"))
            .replace("listen_addr = 0.0.0.0", "listen_addr = 127.0.0.1")
            .replace("listen_port = 6432", &format!("listen_port = {port}"))
            .replace(
                "/etc/pgbouncer/userlist.txt",
                &userlist.display().to_string(),
            )
            .replace(
                "/var/log/postgresql/pgbouncer.log",
                &dir.join("pgbouncer.log").display().to_string(),
            )
            .replace(
                "/var/run/postgresql/pgbouncer.pid",
                &dir.join("pgbouncer.pid").display().to_string(),
            );
        assert!(!replaced.contains("db-primary") && !replaced.contains("6432"));
        // Many PgBouncers share this machine's sockets directory.
        format!("{replaced}unix_socket_dir =\n")
    });
    let url = format!(
        "postgres://{role}:ini-secret@127.0.0.1:{}/{database}",
        b.url()
            .rsplit_once(':')
            .unwrap()
            .1
            .split_once('/')
            .unwrap()
            .0
    );
    let pool = PgPoolOptions::new()
        .max_connections(6)
        .connect(&url)
        .await
        .expect("a login through the manual's PgBouncer");
    dbworker::set_pooler(Pooler::Transaction {
        listen_url: Some(db.db.url().to_owned()),
    });
    let table = JobTable::new(&pool, Db::table_options()).await.unwrap();
    let enqueuer = Enqueuer::new(&pool, &table).await.unwrap();
    let jobs: Vec<NewJob> = (0..20).map(|_| NewJob::new()).collect();
    enqueuer.enqueue_many(&jobs).await.unwrap();
    let store = Arc::new(
        DbStore::new(&pool, &table, Db::options_for_tests())
            .await
            .unwrap(),
    );
    let mut wo = worker_options("manual", Handling::Transactional);
    wo.num_handlers = 2;
    new_worker(store, Writes { pool: pool.clone() }, wo)
        .unwrap()
        .run_until_empty()
        .await;
    Resetter::new(&pool, &table, ResetterOptions::new("r"))
        .await
        .unwrap()
        .reset_once()
        .await
        .unwrap();
    assert_eq!(db.count("completed").await, 20);
    let log = b.log();
    assert!(!log.contains("ERROR"), "PgBouncer logged errors:\n{log}");
    let wrong = url.replace("ini-secret", "wrong");
    assert!(
        PgPoolOptions::new()
            .max_connections(1)
            .connect(&wrong)
            .await
            .is_err(),
        "a wrong password is refused"
    );
}

/// Behind a transaction pooler every statement of a worker in heartbeat
/// handling (claims, completions, the open check) is one exchange once its
/// rows are known, where `BEGIN`, the statement's two round trips and
/// `COMMIT` made four; the record read from text is the one bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_statement_is_one_exchange_through_pgbouncer() {
    let _turn = POOLER.lock().await;
    let Some((db, b, _)) = pgbouncer().await else {
        return;
    };
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect(&b.url())
        .await
        .expect("a pool through PgBouncer");
    dbworker::set_pooler(Pooler::Direct);
    Pooler::Transaction { listen_url: None }.apply_to(&pool);
    let table = JobTable::new(&pool, table_options()).await.unwrap();
    let enqueuer = Enqueuer::new(&pool, &table).await.unwrap();
    let jobs: Vec<NewJob> = (0..300)
        .map(|i| NewJob::new().json("payload", json!({ "n": i, "s": TRICKY })))
        .collect();
    enqueuer.enqueue_many(&jobs).await.unwrap();
    let mut read = table_options();
    read.column_expressions = vec!["j.id".into(), "j.payload".into()];
    let small = JobTable::new(&pool, read).await.unwrap();
    let store = Arc::new(
        DbStore::<Small>::new(&pool, &small, Db::options_for_tests())
            .await
            .expect("store"),
    );
    let run = async || {
        new_worker(
            store.clone(),
            ChecksPayload,
            worker_options("small", Handling::Heartbeat),
        )
        .unwrap()
        .run_until_empty()
        .await;
    };
    // A first run shows what each statement's rows hold.
    run().await;
    enqueuer.enqueue_many(&jobs).await.unwrap();
    let (_, before) = b.counts().await;
    run().await;
    let (_, after) = b.counts().await;
    assert_eq!(db.count("completed").await, 600);
    // Per job: its claim's share, its completion and the open check. PgBouncer
    // 1.18 counted 4.3 queries per job this way, 6.6 with every statement
    // wrapped in BEGIN and COMMIT and sent in two round trips.
    let per_job = (after - before) as f64 / 300.0;
    assert!(per_job < 5.5, "{per_job:.1} queries per job at PgBouncer");
    let payloads: Vec<serde_json::Value> =
        sqlx::query_scalar("SELECT payload FROM jobs ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert!(payloads.iter().all(|p| p["s"] == json!(TRICKY)));
}
