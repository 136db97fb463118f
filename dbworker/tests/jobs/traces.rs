//! Trace context from enqueue to every attempt (`dbworker migration
//! --traces`, the `opentelemetry` feature), seen by an exporter of the
//! test's own on real Postgres: attempt 1 is a child of the enqueue's span;
//! attempts 2 and 3 are roots linked to the enqueue's span and to the
//! attempt before; a job claimed two minutes after its enqueue is a linked
//! root; a trigger's SQL enqueue under `SET LOCAL dbworker.traceparent` is
//! parented by it; `tracestate` and the payload come back byte for byte;
//! every enqueue path (one, many, COPY) stores the current span's context;
//! a resumed wait links to the span that sent its signal (Rust or SQL), a
//! released workflow task to the attempt that released it, and an
//! operator's requeue of a failed or canceled job to its last attempt.
//!
//! Each test runs on one thread with its own subscriber (`set_default`), so
//! the worker's tasks report to the test's exporter and no other test's.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Db, Job};
use dbworker::ddl::OptionalColumns;
use dbworker::{DbJob, DbStore, Enqueuer, Handling, JobTable, NewJob, TraceContext, new_worker};
use opentelemetry::trace::{SpanId, TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use serde_json::json;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use workerutil::{Handler, HandlerError, JobContext, WorkerOptions};

/// Keeps every exported span.
#[derive(Debug, Clone, Default)]
struct Spans(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Spans {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

impl Spans {
    /// The `job` spans, in the order they started.
    fn attempts(&self) -> Vec<SpanData> {
        let mut jobs: Vec<SpanData> = self
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.name == "job")
            .cloned()
            .collect();
        jobs.sort_by_key(|s| s.start_time);
        jobs
    }
}

/// A subscriber exporting to `spans` at once (a simple processor), for this
/// thread only.
fn traced(spans: &Spans) -> (SdkTracerProvider, tracing::subscriber::DefaultGuard) {
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let tracer = provider.tracer("dbworker-traces-test");
    let subscriber =
        tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
    (provider, tracing::subscriber::set_default(subscriber))
}

/// Fails each job's first `fail` attempts (`payload.fail`), then completes.
struct FailsFirst;

impl Handler<DbStore<Job>> for FailsFirst {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let fail = job.record().payload["fail"].as_i64().unwrap_or(0);
        let attempts = job.record().cost;
        if i64::from(attempts) < fail {
            return Err(HandlerError::retryable(std::io::Error::other(
                "not this time",
            )));
        }
        Ok(())
    }
}

async fn traced_db() -> (Db, JobTable) {
    let db = Db::new().await;
    db.add_columns(|c| *c = OptionalColumns::all(), &[]).await;
    let table = db.table_with(|o| o.traces = true).await;
    assert!(table.has_traces());
    (db, table)
}

/// Runs the jobs until none is live; a failed attempt counts itself in
/// `cost`, which the handler reads as the attempt number.
async fn run(db: &Db, table: &JobTable) {
    run_handled(db, table, Handling::Heartbeat).await;
}

async fn run_handled(db: &Db, table: &JobTable, handling: Handling) {
    run_with(db, table, handling, Arc::new(FailsFirst)).await;
}

/// Runs the jobs with `handler` until none is queued, errored or
/// processing (jobs that wait for a signal count as live).
async fn run_with<H: Handler<DbStore<Job>>>(
    db: &Db,
    table: &JobTable,
    handling: Handling,
    handler: Arc<H>,
) {
    db.execute(
        "CREATE OR REPLACE FUNCTION count_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN IF NEW.state = 'errored' THEN NEW.cost := NEW.cost + 1; END IF; RETURN NEW; END $$;
         DROP TRIGGER IF EXISTS count_attempt ON jobs;
         CREATE TRIGGER count_attempt BEFORE UPDATE OF state ON jobs FOR EACH ROW EXECUTE FUNCTION count_attempt();",
    )
    .await;
    let mut so = db.options();
    so.max_num_retries = 5;
    so.handling = handling;
    let store = db.store_on(table, so).await;
    let mut wo = WorkerOptions::new("traces");
    wo.num_handlers = 2;
    wo.interval = Duration::from_millis(10);
    wo.heartbeat_interval = Duration::from_millis(200);
    wo.heartbeat_failure_limit = Some(Duration::from_secs(1));
    for _ in 0..50 {
        new_worker(store.clone(), handler.clone(), wo.clone())
            .unwrap()
            .run_until_empty()
            .await;
        let live: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobs WHERE state NOT IN ('completed', 'failed', 'canceled')",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if live == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("jobs still live");
}

fn ids(span: &tracing::Span) -> (TraceId, SpanId) {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    (sc.trace_id(), sc.span_id())
}

fn linked(attempt: &SpanData) -> Vec<(TraceId, SpanId)> {
    attempt
        .links
        .iter()
        .map(|l| (l.span_context.trace_id(), l.span_context.span_id()))
        .collect()
}

#[tokio::test]
async fn attempt_one_is_a_child_of_the_enqueue_and_retries_are_roots_linked_to_it_and_the_attempt_before()
 {
    for handling in [Handling::Heartbeat, Handling::Transactional] {
        attempts_in_one_trace_and_linked_roots(handling).await;
    }
}

async fn attempts_in_one_trace_and_linked_roots(handling: Handling) {
    let spans = Spans::default();
    let (provider, _guard) = traced(&spans);
    let (db, table) = traced_db().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let payload = json!({"fail": 2, "note": "ünïcode  spaced", "n": 1.5});
    let producer = tracing::info_span!("http_request");
    let enqueue = ids(&producer);
    let job = NewJob::new()
        .json("payload", payload.clone())
        .set("cost", 0_i32);
    let id = enqueuer
        .enqueue(job)
        .instrument(producer.clone())
        .await
        .unwrap()
        .id();
    drop(producer);
    run_handled(&db, &table, handling).await;
    provider.force_flush().unwrap();

    let attempts = spans.attempts();
    assert_eq!(attempts.len(), 3, "three attempts");
    let (first, second, third) = (&attempts[0], &attempts[1], &attempts[2]);
    assert_eq!(
        first.span_context.trace_id(),
        enqueue.0,
        "attempt 1 is in the enqueue's trace"
    );
    assert_eq!(
        first.parent_span_id, enqueue.1,
        "attempt 1 is the enqueue span's child"
    );
    for (later, before) in [(second, first), (third, second)] {
        assert_eq!(later.parent_span_id, SpanId::INVALID, "a retry is a root");
        assert_ne!(later.span_context.trace_id(), enqueue.0);
        let links = linked(later);
        assert!(links.contains(&enqueue), "linked to the enqueue: {links:?}");
        assert!(
            links.contains(&(
                before.span_context.trace_id(),
                before.span_context.span_id()
            )),
            "linked to the attempt before: {links:?}"
        );
    }
    // The context lives in its own columns; the payload is the producer's.
    let stored: String = db
        .scalar("SELECT payload::text FROM jobs WHERE id = $1", id)
        .await;
    let expected: String = sqlx::query_scalar("SELECT $1::jsonb::text")
        .bind(payload.to_string())
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(stored, expected);
    assert!(!stored.contains("traceparent"));
}

#[tokio::test]
async fn a_job_claimed_two_minutes_after_its_enqueue_is_a_root_linked_to_it() {
    let spans = Spans::default();
    let (provider, _guard) = traced(&spans);
    let (db, table) = traced_db().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let producer = tracing::info_span!("producer");
    let enqueue = ids(&producer);
    let job = NewJob::new().json("payload", json!({})).set("cost", 0_i32);
    enqueuer.enqueue(job).instrument(producer).await.unwrap();
    db.execute("UPDATE jobs SET queued_at = queued_at - interval '2 minutes'")
        .await;
    run(&db, &table).await;
    provider.force_flush().unwrap();
    let attempts = spans.attempts();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].parent_span_id, SpanId::INVALID);
    assert_ne!(attempts[0].span_context.trace_id(), enqueue.0);
    assert!(linked(&attempts[0]).contains(&enqueue));
}

#[tokio::test]
async fn a_triggers_sql_enqueue_under_the_session_setting_parents_the_attempt() {
    let spans = Spans::default();
    let (provider, _guard) = traced(&spans);
    let (db, table) = traced_db().await;
    db.execute(
        "CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL);
         CREATE FUNCTION order_job() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO jobs (payload) VALUES (jsonb_build_object('order', NEW.id)); RETURN NEW; END $$;
         CREATE TRIGGER order_job AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION order_job();",
    )
    .await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    // Not canonical (spaces around a comma): kept byte for byte in the row.
    let tracestate = "congo=t61rcWkgMzE ,  rojo=00f067aa0ba902b7";
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SELECT set_config('dbworker.traceparent', $1, true), set_config('dbworker.tracestate', $2, true)")
        .bind(traceparent)
        .bind(tracestate)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("INSERT INTO orders (item) VALUES ('book')")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let (parent, state): (String, String) =
        sqlx::query_as("SELECT traceparent, tracestate FROM jobs")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((parent.as_str(), state.as_str()), (traceparent, tracestate));
    // A session without the setting stores nothing.
    db.execute("INSERT INTO jobs (payload) VALUES ('{}')").await;
    let unset: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE traceparent IS NULL")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(unset, 1);

    run(&db, &table).await;
    provider.force_flush().unwrap();
    let attempts = spans.attempts();
    assert_eq!(attempts.len(), 2);
    let child = attempts
        .iter()
        .find(|s| {
            s.span_context.trace_id()
                == TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        })
        .expect("the order's job runs in the producer's trace");
    assert_eq!(
        child.parent_span_id,
        SpanId::from_hex("00f067aa0ba902b7").unwrap()
    );
    assert!(child.parent_span_is_remote);
}

#[tokio::test]
async fn every_enqueue_path_stores_the_current_context_and_a_given_one_byte_for_byte() {
    let spans = Spans::default();
    let (_provider, _guard) = traced(&spans);
    let (db, table) = traced_db().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let producer = tracing::info_span!("batch");
    let (trace, _) = ids(&producer);
    let job = || NewJob::new().json("payload", json!({})).set("cost", 0_i32);
    async {
        enqueuer.enqueue(job()).await.unwrap();
        enqueuer.enqueue_many((0..3).map(|_| job())).await.unwrap();
        enqueuer.enqueue_copy(&[job(), job()]).await.unwrap();
    }
    .instrument(producer)
    .await;
    let given = TraceContext::new(
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
        Some("vendor=a:b , other=c".into()),
    )
    .unwrap();
    enqueuer
        .enqueue_copy(&[job().trace_context(given.clone())])
        .await
        .unwrap();
    enqueuer.enqueue(job()).await.unwrap(); // outside any span: nothing

    let rows: Vec<(Option<String>, Option<String>)> =
        sqlx::query_as("SELECT traceparent, tracestate FROM jobs ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 8);
    for (parent, _) in &rows[..6] {
        let parent = parent.as_deref().expect("a context");
        assert!(parent.starts_with(&format!("00-{trace}-")), "{parent}");
    }
    assert_eq!(
        rows[6],
        (
            Some(given.traceparent().to_owned()),
            given.tracestate().map(str::to_owned)
        )
    );
    assert_eq!(rows[7], (None, None));
    assert!(TraceContext::new("00-abc-def-01", None).is_err());
}

#[tokio::test]
async fn attempt_one_keeps_the_producers_sampling_decision() {
    let spans = Spans::default();
    let (provider, _guard) = traced(&spans);
    let (db, table) = traced_db().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let context = |flags: &str| {
        TraceContext::new(
            format!("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-{flags}"),
            None,
        )
        .unwrap()
    };
    for flags in ["00", "01"] {
        let job = NewJob::new()
            .json("payload", json!({ "flags": flags }))
            .set("cost", 0_i32)
            .trace_context(context(flags));
        enqueuer.enqueue(job).await.unwrap();
    }
    run(&db, &table).await;
    provider.force_flush().unwrap();
    // The producer that did not sample its trace gets no attempt span.
    let attempts = spans.attempts();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert!(attempts[0].span_context.is_sampled());
}

/// The `job` spans of record `id`, in the order they started.
fn attempts_of(spans: &Spans, id: i64) -> Vec<SpanData> {
    spans
        .attempts()
        .into_iter()
        .filter(|s| {
            s.attributes
                .iter()
                .any(|kv| kv.key.as_str() == "record_id" && kv.value.as_str() == id.to_string())
        })
        .collect()
}

fn own(span: &SpanData) -> (TraceId, SpanId) {
    (span.span_context.trace_id(), span.span_context.span_id())
}

/// Waits for its signal `paid`, then completes.
struct WaitsForPaid;

impl Handler<DbStore<Job>> for WaitsForPaid {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        match job.signal::<serde_json::Value>(ctx.store(), "paid").await? {
            Some(_) => Ok(()),
            None => Err(HandlerError::wait_for("paid", Duration::from_secs(3600))),
        }
    }
}

#[tokio::test]
async fn a_resumed_wait_links_to_the_span_that_sent_its_signal() {
    for handling in [Handling::Heartbeat, Handling::Transactional] {
        resumed_wait_links_to_its_sender(handling).await;
    }
}

async fn resumed_wait_links_to_its_sender(handling: Handling) {
    let spans = Spans::default();
    let (provider, _guard) = traced(&spans);
    let db = Db::new().await;
    db.add_columns(|c| *c = OptionalColumns::all(), &[]).await;
    db.execute(&dbworker::ddl::signals_sql("jobs", &Default::default()).unwrap())
        .await;
    let table = db
        .table_with(|o| {
            o.traces = true;
            o.signals = true;
        })
        .await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let signals = dbworker::Signals::new(&db.pool, &table).await.unwrap();
    let job = || NewJob::new().json("payload", json!({})).set("cost", 0_i32);
    let producer = tracing::info_span!("checkout");
    let (by_rust, by_sql) = async {
        let a = enqueuer.enqueue(job()).await.unwrap().id();
        let b = enqueuer.enqueue(job()).await.unwrap().id();
        (a, b)
    }
    .instrument(producer)
    .await;
    let mut so = db.options();
    so.handling = handling;
    let store = db.store_on(&table, so).await;
    let mut wo = WorkerOptions::new("waits");
    wo.num_handlers = 2;
    wo.interval = Duration::from_millis(10);
    wo.heartbeat_interval = Duration::from_millis(200);
    wo.heartbeat_failure_limit = Some(Duration::from_secs(1));
    let worker = new_worker(store, Arc::new(WaitsForPaid), wo).unwrap();
    let shutdown = worker.shutdown_handle();
    let running = tokio::spawn(worker.run());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobs WHERE awaiting = 'paid' AND state = 'queued'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if waiting == 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the jobs never waited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A webhook in Rust: the current span goes with the signal.
    let webhook = tracing::info_span!("webhook");
    let rust_sender = ids(&webhook);
    signals
        .send(by_rust, "paid", json!(1), None)
        .instrument(webhook.clone())
        .await
        .unwrap();
    // An SQL sender: the session setting.
    let sql_sender = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SELECT set_config('dbworker.traceparent', $1, true)")
        .bind(sql_sender)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT jobs_signal($1, 'paid')")
        .bind(by_sql)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    db.wait_until_no_live_job(Duration::from_secs(10)).await;
    shutdown.graceful();
    running.await.unwrap();
    provider.force_flush().unwrap();

    for (id, sender) in [
        (by_rust, rust_sender),
        (
            by_sql,
            (
                TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap(),
                SpanId::from_hex("b7ad6b7169203331").unwrap(),
            ),
        ),
    ] {
        let attempts = attempts_of(&spans, id);
        assert_eq!(attempts.len(), 2, "job {id}: waited, then resumed");
        let links = linked(&attempts[1]);
        assert!(
            links.contains(&sender),
            "job {id} ({handling:?}): the resumed attempt links to its signal's sender: {links:?}"
        );
        assert!(
            links.contains(&own(&attempts[0])),
            "and to the attempt that waited: {links:?}"
        );
    }
    // A send in the caller's transaction gives the caller's setting back.
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SELECT set_config('dbworker.traceparent', $1, true)")
        .bind(sql_sender)
        .execute(&mut *tx)
        .await
        .unwrap();
    signals
        .send_in(&mut tx, by_rust, "late", json!(2), None)
        .instrument(webhook)
        .await
        .unwrap();
    let (setting, stored): (String, String) = sqlx::query_as(
        "SELECT current_setting('dbworker.traceparent'), \
         (SELECT traceparent FROM jobs_signals WHERE name = 'late')",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(setting, sql_sender);
    assert!(
        stored.contains(&format!("{}-{}", rust_sender.0, rust_sender.1)),
        "{stored}"
    );
}

#[tokio::test]
async fn a_released_workflow_task_links_to_the_attempt_that_released_it() {
    for handling in [Handling::Heartbeat, Handling::Transactional] {
        released_task_links_to_its_upstream(handling).await;
    }
}

async fn released_task_links_to_its_upstream(handling: Handling) {
    use dbworker::workflow::{Task, Workflow, Workflows};
    let spans = Spans::default();
    let (provider, _guard) = traced(&spans);
    let (db, _) = traced_db().await;
    db.execute(&dbworker::ddl::workflows_sql("jobs", &Default::default()).unwrap())
        .await;
    let table = db
        .table_with(|o| {
            o.traces = true;
            o.workflows = true;
        })
        .await;
    let workflows = Workflows::new(&db.pool, &table).await.unwrap();
    let step = || NewJob::new().json("payload", json!({})).set("cost", 0_i32);
    let wf = Workflow::new()
        .task(Task::new("extract", step()))
        .task(Task::new("load", step()).after(["extract"]));
    let producer = tracing::info_span!("import");
    let enqueue = ids(&producer);
    let enqueued = workflows.enqueue(&wf).instrument(producer).await.unwrap();
    let (extract, load) = (
        enqueued.id_of("extract").unwrap(),
        enqueued.id_of("load").unwrap(),
    );
    run_handled(&db, &table, handling).await;
    provider.force_flush().unwrap();

    let upstream = attempts_of(&spans, extract);
    assert_eq!(upstream.len(), 1);
    assert_eq!(upstream[0].parent_span_id, enqueue.1, "extract: a child");
    let released = attempts_of(&spans, load);
    assert_eq!(released.len(), 1);
    let links = linked(&released[0]);
    assert_eq!(
        released[0].parent_span_id,
        SpanId::INVALID,
        "{handling:?}: a released task is a root"
    );
    assert!(
        links.contains(&own(&upstream[0])),
        "{handling:?}: linked to the attempt that released it: {links:?}"
    );
    assert!(links.contains(&enqueue), "and to its enqueue: {links:?}");
}

/// Ends each job's first attempt for good (`payload.end`: `fail` or
/// `cancel`); completes any later one.
#[derive(Default)]
struct EndsOnce(Mutex<std::collections::HashSet<i64>>);

impl Handler<DbStore<Job>> for EndsOnce {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        if !self.0.lock().unwrap().insert(job.record().id) {
            return Ok(());
        }
        match job.record().payload["end"].as_str() {
            Some("cancel") => Err(HandlerError::cancel("withdrawn")),
            _ => Err(HandlerError::non_retryable(std::io::Error::other("broken"))),
        }
    }
}

#[tokio::test]
async fn an_operators_requeue_of_a_failed_or_canceled_job_links_to_its_last_attempt() {
    for handling in [Handling::Heartbeat, Handling::Transactional] {
        requeue_links_to_the_final_attempt(handling).await;
    }
}

async fn requeue_links_to_the_final_attempt(handling: Handling) {
    let spans = Spans::default();
    let (provider, _guard) = traced(&spans);
    let (db, table) = traced_db().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let job = |end: &str| {
        NewJob::new()
            .json("payload", json!({ "end": end }))
            .set("cost", 0_i32)
    };
    let failed = enqueuer.enqueue(job("fail")).await.unwrap().id();
    let canceled = enqueuer.enqueue(job("cancel")).await.unwrap().id();
    let handler = Arc::new(EndsOnce::default());
    run_with(&db, &table, handling, handler.clone()).await;
    assert_eq!(db.state(failed).await, "failed");
    assert_eq!(db.state(canceled).await, "canceled");
    let admin = dbworker::admin::Admin::new(&db.pool, &table).await.unwrap();
    for id in [failed, canceled] {
        assert!(admin.requeue(id).await.unwrap());
    }
    run_with(&db, &table, handling, handler).await;
    provider.force_flush().unwrap();
    for id in [failed, canceled] {
        let attempts = attempts_of(&spans, id);
        assert_eq!(attempts.len(), 2, "job {id}");
        let links = linked(&attempts[1]);
        assert!(
            links.contains(&own(&attempts[0])),
            "job {id} ({handling:?}): the requeued attempt links to the one that ended it: {links:?}"
        );
    }
}

/// `enqueue_many` stores each job's own context byte for byte: jobs sharing
/// one, mixed contexts, inside a caller's transaction (whose session
/// setting it leaves as it was) and on a table whose columns have no
/// session-setting defaults.
#[tokio::test]
async fn enqueue_many_stores_each_jobs_context_whether_shared_or_not() {
    let (db, table) = traced_db().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let job = || NewJob::new().json("payload", json!({})).set("cost", 0_i32);
    let given = TraceContext::new(
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        Some("vendor=a:b , other=c".into()),
    )
    .unwrap();
    let other = TraceContext::new(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
        None,
    )
    .unwrap();
    let with = |cx: &TraceContext| job().trace_context(cx.clone());
    let contexts = |ids: Vec<i64>| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_as::<_, (Option<String>, Option<String>)>(
                "SELECT traceparent, tracestate FROM jobs WHERE id = ANY($1) ORDER BY id",
            )
            .bind(ids)
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    let expect = |cx: &TraceContext| {
        (
            Some(cx.traceparent().to_owned()),
            cx.tracestate().map(str::to_owned),
        )
    };
    // One context for every job, on the pool.
    let ids = enqueuer
        .enqueue_many([with(&given), with(&given), with(&given)])
        .await
        .unwrap();
    assert_eq!(contexts(ids).await, vec![expect(&given); 3]);
    // Mixed contexts.
    let ids = enqueuer
        .enqueue_many([with(&given), with(&other)])
        .await
        .unwrap();
    assert_eq!(contexts(ids).await, vec![expect(&given), expect(&other)]);
    // In the caller's transaction: its own setting stays.
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SELECT set_config('dbworker.traceparent', $1, true)")
        .bind(other.traceparent())
        .execute(&mut *tx)
        .await
        .unwrap();
    let ids = enqueuer
        .enqueue_many_in(&mut tx, [with(&given), with(&given)])
        .await
        .unwrap();
    let setting: String = sqlx::query_scalar("SELECT current_setting('dbworker.traceparent')")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(setting, other.traceparent(), "the caller's setting is kept");
    assert_eq!(contexts(ids).await, vec![expect(&given); 2]);
    // Columns without the session-setting defaults.
    db.execute(
        "ALTER TABLE jobs ALTER COLUMN traceparent DROP DEFAULT, ALTER COLUMN tracestate DROP DEFAULT",
    )
    .await;
    let table = db.table_with(|o| o.traces = true).await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let ids = enqueuer
        .enqueue_many([with(&given), with(&given)])
        .await
        .unwrap();
    assert_eq!(contexts(ids).await, vec![expect(&given); 2]);
}

/// Inside a span, the jobs of a batch that name no context take the span's,
/// whatever the first job names; and a batch of jobs binding every option
/// and a context is split below the bind-parameter limit.
#[tokio::test(flavor = "current_thread")]
async fn every_job_of_a_batch_naming_no_context_takes_the_spans() {
    let spans = Spans::default();
    let (_provider, _guard) = traced(&spans);
    let (db, _) = traced_db().await;
    let table = db
        .table_with(|o| {
            o.traces = true;
            o.kind_column = Some("kind".into());
            o.flags_column = Some("flags".into());
            o.priority_column = Some("priority".into());
            o.queue_column = Some("queue".into());
            o.max_retries_column = Some("max_retries".into());
        })
        .await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let given = TraceContext::new(
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        None,
    )
    .unwrap();
    let job = || NewJob::new().json("payload", json!({})).set("cost", 0_i32);
    let producer = tracing::info_span!("producer");
    let (trace, _) = ids(&producer);
    let ids = enqueuer
        .enqueue_many([job().trace_context(given.clone()), job(), job()])
        .instrument(producer.clone())
        .await
        .unwrap();
    let parents: Vec<Option<String>> =
        sqlx::query_scalar("SELECT traceparent FROM jobs WHERE id = ANY($1) ORDER BY id")
            .bind(&ids)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(parents[0].as_deref(), Some(given.traceparent()));
    for parent in &parents[1..] {
        assert!(
            parent
                .as_deref()
                .is_some_and(|p| p.contains(&trace.to_string())),
            "the span's context: {parent:?}"
        );
    }
    // Eight bound values besides the row's own: more than the split assumed.
    let full = || {
        job()
            .kind("k")
            .flags(["a"])
            .priority(1)
            .queue("q")
            .max_retries(3)
            .run_after(Duration::from_secs(1))
    };
    let many: Vec<NewJob> = (0..10_000).map(|_| full()).collect();
    let ids = enqueuer
        .enqueue_many(&many)
        .instrument(producer)
        .await
        .unwrap();
    assert_eq!(ids.len(), 10_000);
}

/// Blocks its first attempt of each job until the worker cancels it.
#[derive(Default)]
struct HangsOnce(Mutex<std::collections::HashSet<i64>>);

impl Handler<DbStore<Job>> for HangsOnce {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let first = self.0.lock().unwrap().insert(job.record().id);
        if first {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

/// A worker that shuts down under a running job hands it back to the queue;
/// the requeue records the attempt's span like every other mark, so the
/// next attempt links to the interrupted one.
#[tokio::test]
async fn a_job_handed_back_at_shutdown_links_its_next_attempt_to_the_interrupted_one() {
    for handling in [Handling::Heartbeat, Handling::Transactional] {
        handed_back_links_to_the_interrupted_attempt(handling).await;
    }
}

async fn handed_back_links_to_the_interrupted_attempt(handling: Handling) {
    let spans = Spans::default();
    let (provider, _guard) = traced(&spans);
    let (db, table) = traced_db().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let id = enqueuer
        .enqueue(NewJob::new().set("cost", 0_i32))
        .await
        .unwrap()
        .id();
    let mut so = db.options();
    so.handling = handling;
    let store = db.store_on(&table, so).await;
    let mut wo = WorkerOptions::new("traces");
    wo.interval = Duration::from_millis(10);
    wo.heartbeat_interval = Duration::from_millis(200);
    wo.heartbeat_failure_limit = Some(Duration::from_secs(1));
    let handler = Arc::new(HangsOnce::default());
    let worker = new_worker(store.clone(), handler.clone(), wo).unwrap();
    let shutdown = worker.shutdown_handle();
    let running = tokio::spawn(worker.run());
    // Running its handler (a shutdown while it waits to open would hand
    // it back before it ran).
    for _ in 0..500 {
        if handler.0.lock().unwrap().contains(&id) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(db.state(id).await, "processing");
    assert!(handler.0.lock().unwrap().contains(&id), "its handler runs");
    shutdown.immediate();
    running.await.unwrap();
    assert_eq!(db.state(id).await, "queued", "handed back, not failed");
    run_with(&db, &table, handling, handler).await;
    provider.force_flush().unwrap();
    let attempts = attempts_of(&spans, id);
    assert_eq!(attempts.len(), 2, "{handling:?}");
    let links = linked(&attempts[1]);
    assert!(
        links.contains(&own(&attempts[0])),
        "{handling:?}: the attempt after the shutdown links to the interrupted one: {links:?}"
    );
}

/// Ends its first attempt of each job by terminating its own transaction's
/// backend (a lost connection), then fails; the next attempt completes.
#[derive(Default)]
struct LosesItsConnectionOnce(Mutex<std::collections::HashSet<i64>>);

impl Handler<DbStore<Job>> for LosesItsConnectionOnce {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        _: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        let first = self.0.lock().unwrap().insert(job.record().id);
        if first {
            let tx = job.tx().expect("transactional handling");
            let _ = sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())")
                .execute(tx)
                .await;
            return Err(std::io::Error::other("the connection went away").into());
        }
        Ok(())
    }
}

/// A job whose transaction's connection is lost is requeued at once without
/// counting a failure; that requeue records the attempt's span too, so the
/// next attempt links to the one that lost its connection.
#[tokio::test]
async fn a_job_requeued_after_its_connection_was_lost_links_to_that_attempt() {
    let spans = Spans::default();
    let (provider, _guard) = traced(&spans);
    let (db, table) = traced_db().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let id = enqueuer
        .enqueue(NewJob::new().set("cost", 0_i32))
        .await
        .unwrap()
        .id();
    let handler = Arc::new(LosesItsConnectionOnce::default());
    run_with(&db, &table, Handling::Transactional, handler).await;
    let (failures, resets): (i32, i32) =
        sqlx::query_as("SELECT num_failures, num_resets FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((failures, resets), (0, 1), "requeued as a lost connection");
    provider.force_flush().unwrap();
    let attempts = attempts_of(&spans, id);
    assert_eq!(attempts.len(), 2);
    let links = linked(&attempts[1]);
    assert!(
        links.contains(&own(&attempts[0])),
        "the attempt after the lost connection links to the one that lost it: {links:?}"
    );
}

const KILLED_CHILD_ENV: &str = "DBWORKER_TRACES_KILLED_CHILD_URL";
const KILLED_CHILD_HANDLING: &str = "DBWORKER_TRACES_KILLED_CHILD_HANDLING";

/// Reports progress (the heartbeat carries it with the span), prints the
/// span its attempt runs under, then runs until it is killed.
struct PrintsItsSpanAndHangs;

impl Handler<DbStore<Job>> for PrintsItsSpanAndHangs {
    async fn handle(
        &self,
        job: &mut DbJob<Job>,
        ctx: &JobContext<DbStore<Job>>,
    ) -> Result<(), HandlerError> {
        job.report_progress(ctx.store(), json!({"step": "killed"}))?;
        let (trace, span) = ids(&tracing::Span::current());
        println!("attempt-span {trace} {span}");
        std::future::pending::<()>().await;
        Ok(())
    }
}

/// A traced worker, SIGKILLed by the test below in the middle of its job.
#[tokio::test]
#[ignore = "run as a child process by an_attempt_killed_after_a_heartbeat_is_linked_from_the_next"]
async fn killed_traced_child_worker() {
    let Ok(url) = std::env::var(KILLED_CHILD_ENV) else {
        return;
    };
    let spans = Spans::default();
    let (_provider, _guard) = traced(&spans);
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let mut to = Db::table_options();
    to.traces = true;
    to.progress = true;
    let table = JobTable::new(&pool, to).await.unwrap();
    let mut so = Db::options_for_tests();
    so.handling = match std::env::var(KILLED_CHILD_HANDLING).as_deref() {
        Ok("transactional") => Handling::Transactional,
        _ => Handling::Heartbeat,
    };
    let store = Arc::new(DbStore::new(&pool, &table, so).await.unwrap());
    let mut wo = WorkerOptions::new("doomed");
    wo.interval = Duration::from_millis(10);
    wo.heartbeat_interval = Duration::from_millis(200);
    wo.heartbeat_failure_limit = Some(Duration::from_secs(1));
    new_worker(store, PrintsItsSpanAndHangs, wo)
        .unwrap()
        .run()
        .await;
}

/// A worker killed mid-attempt writes no mark; its first heartbeat recorded
/// the attempt's span (with the progress it reported, in one statement), so
/// once the resetter requeues the job the next attempt links to the killed
/// one.
#[tokio::test]
async fn an_attempt_killed_after_a_heartbeat_is_linked_from_the_next() {
    for handling in [Handling::Heartbeat, Handling::Transactional] {
        killed_attempt_is_linked(handling).await;
    }
}

async fn killed_attempt_is_linked(handling: Handling) {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let spans = Spans::default();
    let (provider, _guard) = traced(&spans);
    let (db, _) = traced_db().await;
    let table = db
        .table_with(|o| {
            o.traces = true;
            o.progress = true;
        })
        .await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let id = enqueuer
        .enqueue(NewJob::new().json("payload", json!({})).set("cost", 0_i32))
        .await
        .unwrap()
        .id();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            common::test_path(module_path!(), "killed_traced_child_worker").as_str(),
            "--ignored",
            "--nocapture",
        ])
        .env(KILLED_CHILD_ENV, db.killed_child_url())
        .env(
            KILLED_CHILD_HANDLING,
            format!("{handling:?}").to_lowercase(),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let printed = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("attempt-span ").map(str::to_owned))
    });
    let printed = tokio::time::timeout(Duration::from_secs(30), printed)
        .await
        .expect("the child never started the job")
        .unwrap()
        .expect("the child printed its attempt's span");
    let (trace, span) = printed.split_once(' ').unwrap();
    let killed = (
        TraceId::from_hex(trace).unwrap(),
        SpanId::from_hex(span).unwrap(),
    );
    // Killed only once a heartbeat has refreshed the attempt's row after the
    // handler reported (the span is known before the handler starts).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let beaten: bool = db
            .scalar(
                "SELECT coalesce(last_heartbeat_at > started_at AND progress IS NOT NULL, false) FROM jobs WHERE id = $1",
                id,
            )
            .await;
        if beaten {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no heartbeat");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    db.wait_for_killed_child_backends().await;
    assert_eq!(db.state(id).await, "processing", "{handling:?}: stranded");
    let progress: String = db
        .scalar("SELECT progress::text FROM jobs WHERE id = $1", id)
        .await;
    assert_eq!(progress, r#"{"step": "killed"}"#);
    db.age_heartbeats().await;
    let out = dbworker::Resetter::new(&db.pool, &table, dbworker::ResetterOptions::new("r"))
        .await
        .unwrap()
        .reset_once()
        .await
        .unwrap();
    assert_eq!(out.reset.len(), 1, "{out:?}");
    run_with(&db, &table, handling, Arc::new(FailsFirst)).await;
    provider.force_flush().unwrap();
    let attempts = attempts_of(&spans, id);
    assert_eq!(
        attempts.len(),
        1,
        "{handling:?}: the attempt after the reset"
    );
    let links = linked(&attempts[0]);
    assert!(
        links.contains(&killed),
        "{handling:?}: the attempt after the reset links to the killed one ({killed:?}): {links:?}"
    );
}
