//! Typed jobs on Postgres: arguments enqueued through `NewJob::args` (one,
//! in a transaction, many, COPY, a workflow) reach their `JobHandler`
//! deserialized, in both handling modes and on a table of one's own with
//! renamed columns; a payload that does not fit its type fails only its
//! job, naming the kind and the field; a kind's defaults set its queue,
//! priority, timeout and retries; results round-trip as Rust types.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dbworker::{
    DbStore, Enqueuer, Error, Handlers, Handling, Job, JobArgs, JobDefaults, JobHandler, JobTable,
    JobTableOptions, NewJob, RetryPolicy, StoreOptions, TypedJob,
    ddl::{OptionalColumns, job_table_sql, workflows_sql},
    new_worker,
    workflow::{Task, Workflow, Workflows},
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use workerutil::{HandlerError, WorkerOptions};

use common::Db;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Add {
    a: i64,
    b: i64,
}

impl JobArgs for Add {
    const KIND: &'static str = "add";

    fn defaults() -> JobDefaults {
        JobDefaults::new().queue("math").priority(3)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Greet {
    name: String,
    #[serde(default)]
    loud: bool,
}

impl JobArgs for Greet {
    const KIND: &'static str = "greet";
}

/// What the handlers saw: (job id, what they computed).
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<BTreeMap<i64, String>>>);

impl Seen {
    fn take(&self) -> BTreeMap<i64, String> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

/// Adds; in transactional handling also writes the sum in the job's
/// transaction.
struct Adder(Seen);
impl JobHandler for Adder {
    type Args = Add;

    async fn handle(&self, mut job: Job<'_, Add>) -> Result<(), HandlerError> {
        let id = job.record().id;
        let sum = job.args.a + job.args.b;
        if let Ok(tx) = job.tx() {
            sqlx::query("INSERT INTO side_effects (job_id, note) VALUES ($1, $2)")
                .bind(id)
                .bind(sum.to_string())
                .execute(tx)
                .await?;
        }
        self.0.0.lock().unwrap().insert(id, sum.to_string());
        Ok(())
    }
}

struct Greeter(Seen);
impl JobHandler for Greeter {
    type Args = Greet;

    async fn handle(&self, job: Job<'_, Greet>) -> Result<(), HandlerError> {
        let greeting = format!("hello {}", job.args.name);
        let greeting = if job.args.loud {
            greeting.to_uppercase()
        } else {
            greeting
        };
        self.0.0.lock().unwrap().insert(job.record().id, greeting);
        Ok(())
    }
}

/// The common `jobs` table (it has `payload`) with `kind`, `queue` and
/// `priority`.
async fn set_up() -> Db {
    let db = Db::new().await;
    db.add_columns(
        |c| {
            *c = OptionalColumns::typed();
            c.queue = true;
            c.priority = true;
        },
        &[],
    )
    .await;
    db
}

/// The table of `set_up` as its enqueuer and stores take it: typed, with
/// its queue and priority columns.
async fn table(db: &Db) -> JobTable {
    let mut t = JobTableOptions::typed("jobs j");
    t.queue_column = Some("queue".into());
    t.priority_column = Some("priority".into());
    JobTable::new(&db.pool, t).await.unwrap()
}

async fn enqueuer(db: &Db) -> Enqueuer {
    Enqueuer::new(&db.pool, &table(db).await).await.unwrap()
}

async fn store(db: &Db, handling: Handling) -> Arc<DbStore<TypedJob>> {
    let mut o = StoreOptions::new("typed");
    o.handling = handling;
    o.max_num_retries = 5;
    o.retry = RetryPolicy::fixed(Duration::ZERO);
    Arc::new(DbStore::new(&db.pool, &table(db).await, o).await.unwrap())
}

fn worker_options() -> WorkerOptions {
    let mut o = WorkerOptions::new("typed");
    o.num_handlers = 4;
    o.interval = Duration::from_millis(10);
    o
}

/// Runs both typed handlers until the queue is empty; returns what they saw.
async fn run(store: Arc<DbStore<TypedJob>>) -> BTreeMap<i64, String> {
    let seen = Seen::default();
    let registry = Handlers::new()
        .with(Adder(seen.clone()))
        .unwrap()
        .with(Greeter(seen.clone()))
        .unwrap();
    new_worker(store, registry, worker_options())
        .unwrap()
        .run_until_empty()
        .await;
    seen.take()
}

async fn typed_jobs_reach_their_handlers(handling: Handling) {
    let db = set_up().await;
    let enqueuer = enqueuer(&db).await;
    let one = enqueuer.enqueue(Add { a: 1, b: 2 }).await.unwrap().id();
    // In the caller's transaction: one commits, one rolls back.
    let mut tx = db.pool.begin().await.unwrap();
    let committed = enqueuer
        .enqueue_in(
            &mut tx,
            Greet {
                name: "ada".into(),
                loud: true,
            },
        )
        .await
        .unwrap()
        .id();
    tx.commit().await.unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    enqueuer
        .enqueue_in(&mut tx, Add { a: 100, b: 100 })
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    // Many, with NewJob options over the kind's defaults.
    let many = enqueuer
        .enqueue_many(&[
            NewJob::args(&Add { a: 3, b: 4 }).unwrap().priority(9),
            NewJob::args(&Greet {
                name: "bob".into(),
                loud: false,
            })
            .unwrap()
            .run_after(Duration::from_millis(1)),
        ])
        .await
        .unwrap();
    // COPY, and a payload missing a field the type defaults.
    let copied = enqueuer
        .enqueue_copy(&[NewJob::args(&Add { a: 5, b: 6 }).unwrap()])
        .await
        .unwrap();
    assert_eq!(copied, 1);
    let defaulted = enqueuer
        .enqueue(
            &NewJob::new()
                .kind(Greet::KIND)
                .json("payload", json!({"name": "cy"})),
        )
        .await
        .unwrap()
        .id();

    // The kind's defaults, and the override, are in the rows.
    let placed: Vec<(String, String, i32)> =
        sqlx::query_as("SELECT kind, queue, priority FROM jobs ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        placed,
        [
            ("add", "math", 3),
            ("greet", "default", 0),
            ("add", "math", 9),
            ("greet", "default", 0),
            ("add", "math", 3),
            ("greet", "default", 0),
        ]
        .map(|(k, q, p)| (k.to_owned(), q.to_owned(), p))
    );
    assert_eq!(
        db.scalar::<serde_json::Value>("SELECT payload FROM jobs WHERE id = $1", one)
            .await,
        json!({"a": 1, "b": 2})
    );

    let seen = run(store(&db, handling).await).await;
    assert_eq!(db.count("completed").await, 6, "{handling:?}");
    let copied_id = many[1] + 1;
    assert_eq!(
        seen,
        BTreeMap::from([
            (one, "3".to_owned()),
            (committed, "HELLO ADA".to_owned()),
            (many[0], "7".to_owned()),
            (many[1], "hello bob".to_owned()),
            (copied_id, "11".to_owned()),
            (defaulted, "hello cy".to_owned()),
        ]),
        "{handling:?}"
    );
    if handling == Handling::Transactional {
        let written: Vec<String> =
            sqlx::query_scalar("SELECT note FROM side_effects ORDER BY job_id")
                .fetch_all(&db.pool)
                .await
                .unwrap();
        assert_eq!(written, ["3", "7", "11"]);
    }
}

#[tokio::test]
async fn typed_jobs_reach_their_handlers_in_transactional_handling() {
    typed_jobs_reach_their_handlers(Handling::Transactional).await;
}

#[tokio::test]
async fn typed_jobs_reach_their_handlers_in_heartbeat_handling() {
    typed_jobs_reach_their_handlers(Handling::Heartbeat).await;
}

async fn failure_message(db: &Db, id: i64) -> String {
    db.scalar("SELECT failure_message FROM jobs WHERE id = $1", id)
        .await
}

async fn a_payload_that_does_not_fit_fails_only_its_job(handling: Handling) {
    let db = set_up().await;
    let enqueuer = enqueuer(&db).await;
    let mut good = Vec::new();
    for n in 0..6 {
        good.push(enqueuer.enqueue(Add { a: n, b: n }).await.unwrap().id());
    }
    let raw = |kind: &str, payload| NewJob::new().kind(kind).json("payload", payload);
    let wrong_type = enqueuer
        .enqueue(&raw("add", json!({"a": 1, "b": "two"})))
        .await
        .unwrap()
        .id();
    let missing = enqueuer
        .enqueue(&raw("greet", json!({"loud": true})))
        .await
        .unwrap()
        .id();

    let seen = run(store(&db, handling).await).await;
    assert_eq!(seen.len(), 6, "{handling:?}: the others ran");
    for id in good {
        assert_eq!(db.state(id).await, "completed", "{handling:?}");
    }
    // Failed at once, though the store would retry five times.
    for id in [wrong_type, missing] {
        assert_eq!(db.state(id).await, "failed", "{handling:?}");
        let failures: i32 = db
            .scalar("SELECT num_failures FROM jobs WHERE id = $1", id)
            .await;
        assert_eq!(failures, 1, "{handling:?}");
    }
    assert_eq!(
        failure_message(&db, wrong_type).await,
        "cannot read the arguments of kind \"add\" (at $.b): invalid type: string \"two\", expected i64"
    );
    assert_eq!(
        failure_message(&db, missing).await,
        "cannot read the arguments of kind \"greet\" (at $): missing field `name`"
    );
}

#[tokio::test]
async fn a_payload_that_does_not_fit_fails_only_its_job_in_transactional_handling() {
    a_payload_that_does_not_fit_fails_only_its_job(Handling::Transactional).await;
}

#[tokio::test]
async fn a_payload_that_does_not_fit_fails_only_its_job_in_heartbeat_handling() {
    a_payload_that_does_not_fit_fails_only_its_job(Handling::Heartbeat).await;
}

/// A kind whose jobs outlast its timeout, retried once at once.
#[derive(Serialize, Deserialize)]
struct Slow;

impl JobArgs for Slow {
    const KIND: &'static str = "slow";

    fn defaults() -> JobDefaults {
        JobDefaults::new()
            .timeout(Duration::from_millis(200))
            .max_retries(1)
            .retry(RetryPolicy::fixed(Duration::ZERO))
    }
}

struct Sleeper;
impl JobHandler for Sleeper {
    type Args = Slow;

    async fn handle(&self, _job: Job<'_, Slow>) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok(())
    }
}

#[tokio::test]
async fn a_kinds_defaults_set_its_timeout_and_retries() {
    let db = set_up().await;
    // A unit struct is JSON null, which the NOT NULL jsonb column holds.
    let id = enqueuer(&db).await.enqueue(Slow).await.unwrap().id();
    let mut o = StoreOptions::new("typed");
    o.max_num_retries = 0; // the kind's max_retries(1) overrides it
    let store = Arc::new(DbStore::new(&db.pool, &table(&db).await, o).await.unwrap());
    let registry = Handlers::new().with(Sleeper).unwrap();
    new_worker(store, registry, worker_options())
        .unwrap()
        .run_until_empty()
        .await;
    assert_eq!(db.state(id).await, "failed");
    let failures: i32 = db
        .scalar("SELECT num_failures FROM jobs WHERE id = $1", id)
        .await;
    assert_eq!(failures, 2, "one attempt and the kind's one retry");
    assert_eq!(
        failure_message(&db, id).await,
        "job exceeded maximum runtime of 200ms"
    );
}

#[tokio::test]
async fn typed_jobs_run_on_a_table_of_your_own_with_renamed_columns() {
    let db = Db::new().await;
    let renames = HashMap::from([("state".to_owned(), "status".to_owned())]);
    db.execute(&job_table_sql("tasks", &renames).unwrap()).await;
    db.execute(
        "ALTER TABLE tasks ADD COLUMN task_type text NOT NULL, ADD COLUMN args jsonb NOT NULL",
    )
    .await;
    let mut t = JobTableOptions::new("tasks t");
    t.alternate_column_names = renames;
    t.kind_column = Some("task_type".into());
    t.payload_column = Some("args".into());
    // A worker of its own reads the renamed columns under TypedJob's names.
    t.column_expressions = vec![
        "t.id".into(),
        "t.task_type AS kind".into(),
        "t.args AS payload".into(),
    ];
    let table = JobTable::new(&db.pool, t).await.unwrap();
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    // Add's default queue needs a queue column this table does not have.
    let refused = enqueuer.enqueue(Add { a: 1, b: 1 }).await;
    assert!(
        matches!(
            refused,
            Err(Error::InvalidOption {
                field: "queue_column",
                ..
            })
        ),
        "{refused:?}"
    );
    let ids = enqueuer
        .enqueue_many(&[
            NewJob::args(&Greet {
                name: "dee".into(),
                loud: false,
            })
            .unwrap(),
            NewJob::args(&Greet {
                name: "eve".into(),
                loud: true,
            })
            .unwrap(),
        ])
        .await
        .unwrap();

    for handling in [Handling::Transactional, Handling::Heartbeat] {
        sqlx::query("UPDATE tasks SET status = 'queued'")
            .execute(&db.pool)
            .await
            .unwrap();
        let mut o = StoreOptions::new("tasks");
        o.handling = handling;
        let store = Arc::new(DbStore::new(&db.pool, &table, o).await.unwrap());
        let seen = Seen::default();
        let registry = Handlers::new().with(Greeter(seen.clone())).unwrap();
        new_worker(store, registry, worker_options())
            .unwrap()
            .run_until_empty()
            .await;
        assert_eq!(
            seen.take(),
            BTreeMap::from([
                (ids[0], "hello dee".to_owned()),
                (ids[1], "HELLO EVE".to_owned())
            ]),
            "{handling:?}"
        );
        let completed: i64 =
            sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'completed'")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(completed, 2, "{handling:?}");
    }
}

#[tokio::test]
async fn typed_enqueue_names_what_the_table_lacks() {
    let db = Db::new().await;
    // No payload column configured: typed arguments have nowhere to go.
    let mut t = JobTableOptions::new("jobs");
    t.kind_column = Some("kind".into());
    db.add_columns(|c| c.kind = true, &[]).await;
    let plain = Enqueuer::new(&db.pool, &JobTable::new(&db.pool, t).await.unwrap())
        .await
        .unwrap();
    let refused = plain
        .enqueue(Greet {
            name: "x".into(),
            loud: false,
        })
        .await;
    assert!(
        matches!(
            refused,
            Err(Error::InvalidOption {
                field: "payload_column",
                ..
            })
        ),
        "{refused:?}"
    );
    // Typed arguments and the payload column set by name: one too many.
    let typed_table = JobTable::new(&db.pool, JobTableOptions::typed("jobs"))
        .await
        .unwrap();
    let typed = Enqueuer::new(&db.pool, &typed_table).await.unwrap();
    let both = NewJob::args(&Greet {
        name: "x".into(),
        loud: false,
    })
    .unwrap()
    .json("payload", json!({}));
    let refused = typed.enqueue(&both).await;
    assert!(
        matches!(
            refused,
            Err(Error::InvalidOption {
                field: "column",
                ..
            })
        ),
        "{refused:?}"
    );
    // A payload column that is not jsonb is refused by name (by the
    // table's check, which the enqueuer's used to be).
    db.execute("ALTER TABLE jobs ADD COLUMN args text").await;
    let mut t = JobTableOptions::typed("jobs");
    t.payload_column = Some("args".into());
    let err = JobTable::new(&db.pool, t).await.unwrap_err().to_string();
    assert!(
        err.contains("column jobs.args (payload_column) has type text, expected jsonb"),
        "{err}"
    );
    // A NUL character, which jsonb cannot hold, is refused with its path.
    let nul = typed
        .enqueue(Greet {
            name: "a\0b".into(),
            loud: false,
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(nul.contains("the job's arguments (at $.name)"), "{nul}");
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Extract {
    file: String,
}

impl JobArgs for Extract {
    const KIND: &'static str = "extract";
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Extracted {
    file: String,
    rows: u32,
}

#[derive(Serialize, Deserialize)]
struct Load;

impl JobArgs for Load {
    const KIND: &'static str = "load";
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Loaded {
    rows: u32,
    from: String,
}

struct Extractor;
impl JobHandler for Extractor {
    type Args = Extract;

    async fn handle(&self, mut job: Job<'_, Extract>) -> Result<(), HandlerError> {
        let file = job.args.file.clone();
        job.set_result(Extracted { file, rows: 1200 })?;
        Ok(())
    }
}

/// Reads "extract"'s result as `Extracted`, checks the typed reads that
/// must fail or find nothing, and stores a `Loaded`.
struct Loader;
impl JobHandler for Loader {
    type Args = Load;

    async fn handle(&self, mut job: Job<'_, Load>) -> Result<(), HandlerError> {
        let extracted: Extracted = job
            .upstream_result("extract")
            .await?
            .ok_or_else(|| HandlerError::non_retryable("no result from extract"))?;
        let absent = job.upstream_result::<Extracted>("transform").await?;
        assert!(absent.is_none());
        match job.upstream_result::<Loaded>("extract").await {
            Err(Error::Json { what, path, .. }) => {
                assert_eq!(what, "cannot read the result of upstream task \"extract\"");
                assert_eq!(path, "$");
            }
            other => panic!("{other:?}"),
        }
        job.set_result(Loaded {
            rows: extracted.rows,
            from: extracted.file,
        })?;
        Ok(())
    }
}

async fn typed_results_round_trip(handling: Handling) {
    let db = Db::new().await;
    db.execute(&workflows_sql("jobs", &HashMap::new()).unwrap())
        .await;
    db.add_columns(
        |c| {
            *c = OptionalColumns::typed();
            c.results = true;
        },
        &[],
    )
    .await;
    let mut t = JobTableOptions::typed("jobs j");
    t.workflows = true;
    t.result_column = Some("result".into());
    let table = JobTable::new(&db.pool, t).await.unwrap();
    let workflows = Workflows::new(&db.pool, &table).await.unwrap();
    let file = Extract {
        file: "s3://bucket/part-0".into(),
    };
    let wf = workflows
        .enqueue(
            &Workflow::new()
                .task(Task::new("extract", NewJob::args(&file).unwrap()))
                .task(Task::new("load", NewJob::args(&Load).unwrap()).after(["extract"])),
        )
        .await
        .unwrap();

    let mut o = StoreOptions::new("typed");
    o.handling = handling;
    let store = Arc::new(DbStore::new(&db.pool, &table, o).await.unwrap());
    let registry = Handlers::new()
        .with(Extractor)
        .unwrap()
        .with(Loader)
        .unwrap();
    new_worker(store, registry, worker_options())
        .unwrap()
        .run_until_empty()
        .await;

    let load = wf.id_of("load").unwrap();
    assert_eq!(db.state(load).await, "completed", "{handling:?}");
    let stored: serde_json::Value = db
        .scalar("SELECT result FROM jobs WHERE id = $1", load)
        .await;
    let loaded: Loaded = serde_json::from_value(stored).unwrap();
    assert_eq!(
        loaded,
        Loaded {
            rows: 1200,
            from: "s3://bucket/part-0".into()
        },
        "{handling:?}"
    );
}

#[tokio::test]
async fn typed_results_round_trip_in_transactional_handling() {
    typed_results_round_trip(Handling::Transactional).await;
}

#[tokio::test]
async fn typed_results_round_trip_in_heartbeat_handling() {
    typed_results_round_trip(Handling::Heartbeat).await;
}

/// A result that does not serialize fails its job with the path, instead
/// of completing without it.
struct BadResult;
impl JobHandler for BadResult {
    type Args = Extract;

    async fn handle(&self, mut job: Job<'_, Extract>) -> Result<(), HandlerError> {
        // JSON object keys must be strings.
        let by_pair = HashMap::from([((1, 2), "x")]);
        let refused = job.set_result(BTreeMap::from([("pairs", by_pair)]));
        assert!(matches!(refused, Err(Error::Json { .. })), "{refused:?}");
        Ok(())
    }
}

#[tokio::test]
async fn a_result_that_does_not_serialize_fails_its_job() {
    let db = set_up().await;
    db.add_columns(|c| c.results = true, &[]).await;
    let mut t = JobTableOptions::typed("jobs j");
    t.result_column = Some("result".into());
    let table = JobTable::new(&db.pool, t).await.unwrap();
    let id = Enqueuer::new(&db.pool, &table)
        .await
        .unwrap()
        .enqueue(Extract { file: "f".into() })
        .await
        .unwrap()
        .id();
    let store = Arc::new(
        DbStore::new(&db.pool, &table, StoreOptions::new("typed"))
            .await
            .unwrap(),
    );
    let registry = Handlers::new().with(BadResult).unwrap();
    new_worker(store, registry, worker_options())
        .unwrap()
        .run_until_empty()
        .await;
    assert_eq!(db.state(id).await, "failed");
    let message = failure_message(&db, id).await;
    assert!(
        message.starts_with("cannot write the job's result (at $.pairs): key must be a string"),
        "{message}"
    );
}

/// `Add` renamed: its jobs are now `add_v2`, and those enqueued as `add`
/// before the rename still run.
#[derive(Debug, Serialize, Deserialize)]
struct AddV2 {
    a: i64,
    b: i64,
}

impl JobArgs for AddV2 {
    const KIND: &'static str = "add_v2";
    const ALIASES: &'static [&'static str] = &["add"];
}

/// Records each sum, and whether the job had a transaction to write in.
struct Summer(Seen);
impl JobHandler for Summer {
    type Args = AddV2;

    async fn handle(&self, mut job: Job<'_, AddV2>) -> Result<(), HandlerError> {
        let sum = job.args.a + job.args.b;
        let tx = job.tx().map(|_| "tx").unwrap_or_else(|e| {
            assert!(e.to_string().contains("heartbeat handling"), "{e}");
            "no tx"
        });
        self.0
            .0
            .lock()
            .unwrap()
            .insert(job.id(), format!("{sum} {tx}"));
        Ok(())
    }
}

#[tokio::test]
async fn a_client_runs_a_kind_under_its_name_and_its_aliases() {
    let db = set_up().await;
    let table = table(&db).await;
    let seen = Seen::default();
    let client = dbworker::Client::builder(&db.pool, &table)
        .handler(Summer(seen.clone()))
        .build()
        .await
        .unwrap();
    let old = client.enqueue(Add { a: 1, b: 2 }).await.unwrap().id();
    let new = client.enqueue(AddV2 { a: 3, b: 4 }).await.unwrap().id();
    let ids = client
        .enqueue_many([5, 6].map(|a| AddV2 { a, b: 0 }))
        .await
        .unwrap();
    let summary = client.run_until_empty().await.unwrap();
    assert_eq!(summary.dequeued, 4);
    let seen = seen.take();
    assert_eq!(seen[&old], "3 tx", "the old kind runs under its alias");
    assert_eq!(seen[&new], "7 tx");
    assert_eq!(seen[&ids[1]], "6 tx");
    for id in [old, new, ids[0], ids[1]] {
        assert_eq!(db.state(id).await, "completed");
    }
    let again = client.run_until_empty().await.unwrap_err().to_string();
    assert!(again.contains("started already"), "{again}");
}

#[tokio::test]
async fn a_client_refuses_a_kind_twice_and_no_handler_at_build() {
    let db = set_up().await;
    let table = table(&db).await;
    let seen = Seen::default();
    let err = dbworker::Client::builder(&db.pool, &table)
        .handler(Adder(seen.clone()))
        .handler(Summer(seen.clone())) // its alias is Adder's kind
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("\"add\""), "{err}");
    let err = dbworker::Client::builder(&db.pool, &table)
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("at least one handler"), "{err}");
    // A refused handler adds nothing: the registry is as it was.
    let mut handlers = Handlers::new();
    handlers.add(Adder(seen.clone())).unwrap();
    assert!(handlers.add(Summer(seen.clone())).is_err());
    assert_eq!(handlers.kinds(), ["add"]);
}

#[tokio::test]
async fn a_started_client_runs_what_comes_and_shutdown_stops_it_all() {
    let db = set_up().await;
    let table = table(&db).await;
    let seen = Seen::default();
    let mut store = StoreOptions::new("client");
    store.handling = Handling::Heartbeat;
    let mut options = dbworker::ClientOptions::default();
    options.worker.interval = Duration::from_millis(10);
    let client = dbworker::Client::builder(&db.pool, &table)
        .handler(Summer(seen.clone()))
        .store_options(store)
        .options(options)
        .build()
        .await
        .unwrap();
    client.start().unwrap();
    assert!(client.start().is_err(), "started once");
    let id = client.enqueue(AddV2 { a: 20, b: 22 }).await.unwrap().id();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while db.state(id).await != "completed" {
        assert!(tokio::time::Instant::now() < deadline, "the job ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen.take()[&id], "42 no tx", "heartbeat handling has no tx");
    let summary = client.shutdown().await.unwrap().expect("it was running");
    assert_eq!(summary.dequeued, 1);
    // Stopped: a job enqueued now waits for the next process.
    let later = client.enqueue(AddV2 { a: 1, b: 1 }).await.unwrap().id();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(db.state(later).await, "queued");
    assert!(client.shutdown().await.unwrap().is_none(), "stopped once");
}

/// Cancels every job after writing in its transaction.
struct Withdrawer;
impl JobHandler for Withdrawer {
    type Args = AddV2;

    async fn handle(&self, mut job: Job<'_, AddV2>) -> Result<(), HandlerError> {
        let id = job.id();
        sqlx::query("INSERT INTO side_effects (job_id, note) VALUES ($1, 'written')")
            .bind(id)
            .execute(job.tx()?)
            .await?;
        Err(HandlerError::cancel("the order was withdrawn"))
    }
}

#[tokio::test]
async fn a_job_its_handler_cancels_is_canceled_with_the_reason_and_its_writes_undone() {
    let db = set_up().await;
    let table = table(&db).await;
    let client = dbworker::Client::builder(&db.pool, &table)
        .handler(Withdrawer)
        .build()
        .await
        .unwrap();
    let id = client.enqueue(AddV2 { a: 1, b: 1 }).await.unwrap().id();
    assert_eq!(client.run_until_empty().await.unwrap().dequeued, 1);
    assert_eq!(db.state(id).await, "canceled");
    let message: String = db
        .scalar("SELECT failure_message FROM jobs WHERE id = $1", id)
        .await;
    assert_eq!(message, "canceled by its handler: the order was withdrawn");
    let written: i64 = db
        .scalar("SELECT count(*) FROM side_effects WHERE job_id = $1", id)
        .await;
    assert_eq!(written, 0, "the attempt's writes are rolled back");
}

/// A service of the application's, run with the client.
struct Watcher(Arc<Mutex<Vec<&'static str>>>);
impl dbworker::Service for Watcher {
    fn name(&self) -> &str {
        "watcher"
    }

    async fn run(&self, stop: tokio_util::sync::CancellationToken) -> dbworker::Result<()> {
        self.0.lock().unwrap().push("started");
        stop.cancelled().await;
        self.0.lock().unwrap().push("stopped");
        Ok(())
    }
}

#[tokio::test]
async fn a_client_runs_the_services_it_is_given_and_stops_them_with_itself() {
    let db = set_up().await;
    let table = table(&db).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let client = dbworker::Client::builder(&db.pool, &table)
        .handler(Summer(Seen::default()))
        .service(Watcher(seen.clone()))
        .build()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(seen.lock().unwrap().is_empty(), "not before start");
    client.start().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while seen.lock().unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    client.shutdown().await.unwrap();
    assert_eq!(*seen.lock().unwrap(), ["started", "stopped"]);
}

#[tokio::test]
async fn a_client_runs_over_a_detected_table_and_renamed_kind_and_payload_columns() {
    let db = set_up().await;
    let seen = Seen::default();
    let run_one = async |table: &JobTable, a: i64| {
        let client = dbworker::Client::builder(&db.pool, table)
            .handler(Summer(seen.clone()))
            .build()
            .await
            .unwrap();
        let id = client.enqueue(AddV2 { a, b: 1 }).await.unwrap().id();
        assert_eq!(client.run_until_empty().await.unwrap().dequeued, 1);
        id
    };
    // The columns found by their standard names.
    let detected = JobTable::new(&db.pool, JobTableOptions::detected("jobs"))
        .await
        .unwrap();
    let first = run_one(&detected, 1).await;
    // The same columns under other names: the client selects them as
    // `kind` and `payload` from the table's description.
    db.execute("ALTER TABLE jobs RENAME COLUMN kind TO task_type")
        .await;
    db.execute("ALTER TABLE jobs RENAME COLUMN payload TO args")
        .await;
    let mut renamed = JobTableOptions::new("jobs t");
    renamed.kind_column = Some("task_type".into());
    renamed.payload_column = Some("args".into());
    let renamed = JobTable::new(&db.pool, renamed).await.unwrap();
    let second = run_one(&renamed, 41).await;
    let seen = seen.take();
    assert_eq!((&seen[&first][..], &seen[&second][..]), ("2 tx", "42 tx"));
}
