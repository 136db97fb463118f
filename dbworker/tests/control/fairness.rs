//! Fair claims on real Postgres: a tenant's backlog does not delay the others,
//! sharding it over many limit keys does not help it, weights hold in every
//! window, and a retried job goes to the back of its key's share.

use crate::TIMED;
use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dbworker::new_worker;
use dbworker::{
    Aging, DbJob, DbStore, Enqueuer, JobTable, NewJob, StoreOptions,
    control::{FairWeights, Limit, Limits},
    ddl::{FairClaims, fair_claims_sql, limit_table_sql},
};
use workerutil::{Handler, HandlerError, JobContext, Record, Store, WorkerOptions};

use common::{Db, Job};

/// The test table with a queue column and fair claims.
pub(crate) async fn fair_db() -> Db {
    let db = Db::new().await;
    let mut fair = FairClaims::default();
    fair.queue_column = Some("queue".into());
    db.add_columns(
        |c| c.queue = true,
        &[fair_claims_sql("jobs", &HashMap::new(), &fair).unwrap()],
    )
    .await;
    db
}

/// `n` jobs of `key`, in one COPY.
async fn copy_jobs(enqueuer: &Enqueuer, key: &str, n: usize) {
    let jobs: Vec<NewJob> = (0..n).map(|_| NewJob::new().fair_key(key)).collect();
    enqueuer.enqueue_copy(&jobs).await.unwrap();
}

/// Claims every waiting job, `batch` at a time, and returns their keys in
/// claim order.
async fn claim_all(db: &Db, store: &DbStore<Job>, batch: usize, most: usize) -> Vec<String> {
    let mut ids = Vec::new();
    while ids.len() < most {
        let jobs = store
            .dequeue("host", &Default::default(), batch)
            .await
            .unwrap();
        if jobs.is_empty() {
            break;
        }
        ids.extend(jobs.iter().map(|j| j.record().id()));
    }
    let keys: HashMap<i64, String> =
        sqlx::query_as("SELECT id, coalesce(fair_key, '(none)') FROM jobs WHERE id = ANY($1)")
            .bind(&ids)
            .fetch_all(&db.pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    ids.iter().map(|id| keys[id].clone()).collect()
}

async fn store(db: &Db, table: &JobTable) -> DbStore<Job> {
    let o: StoreOptions = db.options();
    DbStore::new(&db.pool, table, o).await.unwrap()
}

#[tokio::test]
async fn a_tenants_backlog_does_not_delay_the_others_and_a_plain_table_would() {
    let _alone = TIMED.write().await;
    for fair in [true, false] {
        let db = if fair {
            fair_db().await
        } else {
            Db::new().await
        };
        if !fair {
            // The same columns, no triggers: claims by id.
            db.execute("ALTER TABLE jobs ADD COLUMN fair_key text")
                .await;
        }
        let table = db.table().await;
        assert_eq!(table.is_fair(), fair);
        let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
        copy_jobs(&enqueuer, "a", 20_000).await;
        for tenant in ["b", "c", "d", "e", "f", "g", "h"] {
            enqueuer
                .enqueue(NewJob::new().fair_key(tenant))
                .await
                .unwrap();
        }
        let store = store(&db, &table).await;
        let first = claim_all(&db, &store, 8, 16).await;
        let others = first.iter().filter(|k| *k != "a").count();
        if fair {
            assert_eq!(others, 7, "B..H wait behind A's backlog: {first:?}");
            // A is not starved either: it has the other half.
            assert!(first.iter().filter(|k| *k == "a").count() >= 8);
        } else {
            assert_eq!(others, 0, "a plain table claims by id: {first:?}");
        }
    }
}

#[tokio::test]
async fn spreading_a_backlog_over_many_limit_keys_does_not_beat_the_fairness_key() {
    let _alone = TIMED.write().await;
    for fair in [true, false] {
        let db = if fair {
            fair_db().await
        } else {
            Db::new().await
        };
        if !fair {
            db.add_columns(|c| c.queue = true, &[]).await;
            db.execute("ALTER TABLE jobs ADD COLUMN fair_key text")
                .await;
        }
        db.execute(&limit_table_sql(dbworker::control::DEFAULT_LIMIT_TABLE).unwrap())
            .await;
        db.execute("ALTER TABLE jobs ADD COLUMN customer text")
            .await;
        let table = db
            .table_with(|o| {
                o.queue_column = Some("queue".into());
                o.limit_table = Some(dbworker::control::DEFAULT_LIMIT_TABLE.into());
                o.limit_key_column = Some("customer".into());
            })
            .await;
        let limits = Limits::new(&db.pool, &table).await.unwrap();
        limits
            .set_limit("default", Limit::default().per_key(1))
            .await
            .unwrap();
        let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
        // A: 5,000 jobs over 1,000 limit keys, one fairness key.
        let jobs: Vec<NewJob> = (0..5_000)
            .map(|i| {
                NewJob::new()
                    .fair_key("a")
                    .set("customer", format!("a-{}", i % 1_000))
            })
            .collect();
        enqueuer.enqueue_copy(&jobs).await.unwrap();
        for tenant in ["b", "c", "d", "e", "f", "g", "h"] {
            enqueuer
                .enqueue(
                    NewJob::new()
                        .fair_key(tenant)
                        .set("customer", tenant.to_owned()),
                )
                .await
                .unwrap();
        }
        let store = store(&db, &table).await;
        // One claim of 64, as a busy worker makes: the limit keys let A take
        // all 64 by id; the tags give B..H theirs at once.
        let first = claim_all(&db, &store, 64, 64).await;
        let others = first.iter().filter(|k| *k != "a").count();
        if fair {
            assert_eq!(others, 7, "B..H lost to A's thousand keys: {first:?}");
        } else {
            assert_eq!(others, 0, "caps alone let A through: {first:?}");
        }
    }
}

#[tokio::test]
async fn weights_one_two_four_hold_in_every_window_of_claims() {
    let _alone = TIMED.write().await;
    let db = fair_db().await;
    let table = db.table().await;
    let weights = FairWeights::new(&db.pool, &table).await.unwrap();
    weights.check_writes().await.unwrap();
    weights.set("two", 2).await.unwrap();
    weights.set("four", 4).await.unwrap();
    assert!(weights.set("zero", 0).await.is_err());
    assert_eq!(
        weights.list().await.unwrap(),
        vec![("four".to_owned(), 4), ("two".to_owned(), 2)]
    );
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    for key in ["one", "two", "four"] {
        copy_jobs(&enqueuer, key, 8_000).await;
    }
    let shares = weights.shares(10).await.unwrap();
    assert_eq!(shares.len(), 3);
    assert!(shares.iter().all(|s| s.waiting == 8_000));
    let store = store(&db, &table).await;
    // "four" runs out after 14,000 claims: every window of 7,000 before that.
    let order = claim_all(&db, &store, 100, 14_000).await;
    for start in (0..=order.len() - 7_000).step_by(250) {
        let window = &order[start..start + 7_000];
        let count = |k: &str| window.iter().filter(|w| *w == k).count() as f64;
        let (one, two, four) = (count("one"), count("two"), count("four"));
        for (got, share) in [(one, 1.0), (two, 2.0), (four, 4.0)] {
            let expected = 7_000.0 * share / 7.0;
            assert!(
                (got - expected).abs() <= expected * 0.02,
                "window at {start}: {one}/{two}/{four}, expected 1:2:4 within 2 %"
            );
        }
    }
}

#[tokio::test]
async fn a_retried_job_goes_to_the_back_of_its_keys_share() {
    let _alone = TIMED.write().await;
    let db = fair_db().await;
    let table = db.table().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    copy_jobs(&enqueuer, "a", 4).await;
    copy_jobs(&enqueuer, "b", 4).await;
    let mut o = db.options();
    o.max_num_retries = 3;
    o.retry = dbworker::RetryPolicy::fixed(Duration::ZERO);
    let store = DbStore::<Job>::new(&db.pool, &table, o).await.unwrap();
    let mut first = store.dequeue("host", &Default::default(), 1).await.unwrap();
    let job = &mut first[0];
    let retried = job.record().id();
    store.mark_errored(job, "try again", None).await.unwrap();
    // A's other three, B's four, interleaved; the retried job after A's last.
    let tags: Vec<(i64, String, i64)> = sqlx::query_as(
        "SELECT id, fair_key, fair_tag FROM jobs WHERE state IN ('queued', 'errored') ORDER BY fair_tag, id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let keys: Vec<&str> = tags.iter().map(|(_, k, _)| k.as_str()).collect();
    assert_eq!(keys, ["b", "a", "b", "a", "b", "a", "b", "a"], "{tags:?}");
    assert_eq!(tags.last().unwrap().0, retried, "{tags:?}");
}

#[tokio::test]
async fn a_fair_table_is_fair_for_every_worker_and_missing_parts_are_named() {
    let _alone = TIMED.write().await;
    let db = Db::new().await;
    // Fair by the options, with nothing of it in the table: every part named.
    let mut o = Db::table_options();
    o.fair = true;
    let err = JobTable::new(&db.pool, o).await.unwrap_err().to_string();
    for part in [
        "fair_key",
        "fair_tag",
        "fair_cost",
        "jobs_fair_tag_insert",
        "jobs_fair_weights",
    ] {
        assert!(err.contains(part), "{part} not named: {err}");
    }
    // Migrated: a worker that says nothing of fairness claims by tag too, and
    // an order_by without the tag is refused by name.
    db.add_columns(
        |_| {},
        &[fair_claims_sql("jobs", &HashMap::new(), &FairClaims::default()).unwrap()],
    )
    .await;
    assert!(db.table().await.is_fair());
    let mut o = Db::table_options();
    o.order_by = Some("j.id".into());
    let err = JobTable::new(&db.pool, o).await.unwrap_err().to_string();
    assert!(err.contains("does not order by fair_tag"), "{err}");
    // Every other way in tags too: a plain INSERT, and a key from the payload.
    let mut fair = FairClaims::default();
    fair.key_from = Some("NEW.payload->>'customer'".into());
    db.execute(&fair_claims_sql("jobs", &HashMap::new(), &fair).unwrap())
        .await;
    db.execute(
        "INSERT INTO jobs (payload) SELECT jsonb_build_object('customer', 'x') FROM generate_series(1, 3);
         INSERT INTO jobs (payload) VALUES ('{\"customer\": \"y\"}');",
    )
    .await;
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT fair_key, fair_tag FROM jobs ORDER BY fair_tag, id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let keys: Vec<&str> = rows.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["x", "y", "x", "x"], "{rows:?}");
}

/// Claims 10 jobs every 100 ms for `most`, or until `done` says stop.
/// Claims 10 jobs every 100 ms for `most`, or until `done` says stop;
/// returns how many it claimed.
async fn claim_paced(store: &DbStore<Job>, most: Duration, done: impl AsyncFn() -> bool) -> usize {
    let deadline = tokio::time::Instant::now() + most;
    let mut claimed = 0;
    while tokio::time::Instant::now() < deadline && !done().await {
        claimed += store
            .dequeue("host", &Default::default(), 10)
            .await
            .unwrap()
            .len();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    claimed
}

#[tokio::test]
async fn priorities_age_so_a_flood_of_urgent_work_starves_nothing() {
    let _alone = TIMED.write().await;
    // Aging alone, aging on a fair table, and strict priorities.
    for (aging, fair) in [(true, false), (true, true), (false, false)] {
        let db = Db::new().await;
        let mut fair_ddl = FairClaims::default();
        fair_ddl.priority_column = Some("priority".into());
        let ddl = fair.then(|| fair_claims_sql("jobs", &HashMap::new(), &fair_ddl).unwrap());
        db.add_columns(|c| c.priority = true, &Vec::from_iter(ddl))
            .await;
        let table = db
            .table_with(|o| {
                o.priority_column = Some("priority".into());
                if aging {
                    o.aging = Some(Aging::every(Duration::from_secs(1)));
                }
            })
            .await;
        let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
        // Four levels: a backlog at the top (3) that outlasts the test, and
        // one job two and three levels below it.
        let urgent: Vec<NewJob> = (0..5_000).map(|_| NewJob::new().priority(3)).collect();
        enqueuer.enqueue_copy(&urgent).await.unwrap();
        let low = enqueuer
            .enqueue(NewJob::new().priority(1))
            .await
            .unwrap()
            .id();
        let lowest = enqueuer
            .enqueue(NewJob::new().priority(0))
            .await
            .unwrap()
            .id();
        // One connection: the statistics read below are its own.
        let pool = db.db.pool(1).await.unwrap();
        let store = DbStore::<Job>::new(&pool, &table, db.options())
            .await
            .unwrap();
        let waited = |id: i64| {
            let pool = db.pool.clone();
            async move {
                sqlx::query_scalar::<_, Option<f64>>(
                    "SELECT CASE WHEN state = 'processing' THEN EXTRACT(EPOCH FROM started_at - queued_at)::float8 END FROM jobs WHERE id = $1",
                )
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
            }
        };
        let claimed = if aging {
            let claimed = claim_paced(&store, Duration::from_secs(8), async || {
                waited(lowest).await.is_some()
            })
            .await;
            // A level a second: two levels up after 2 s, three after 3 s,
            // then the next claim (every 100 ms) takes it.
            let low = waited(low).await.expect("the priority-1 job never started");
            let lowest = waited(lowest)
                .await
                .expect("the priority-0 job never started");
            assert!(
                (1.9..2.8).contains(&low),
                "priority 1 started after {low} s"
            );
            assert!(
                (2.9..3.8).contains(&lowest),
                "priority 0 started after {lowest} s"
            );
            claimed
        } else {
            let claimed = claim_paced(&store, Duration::from_secs(5), async || false).await;
            assert_eq!(waited(lowest).await, None, "strict priorities starve it");
            assert_eq!(waited(low).await, None, "strict priorities starve it");
            claimed
        };
        // Aging writes nothing: the claims are the table's only updates.
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(&pool)
            .await
            .unwrap();
        let updated: i64 =
            sqlx::query_scalar("SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'jobs'")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(updated, claimed as i64, "rows updated beside the claims");
        let priorities: Vec<i32> =
            sqlx::query_scalar("SELECT priority FROM jobs WHERE id = ANY($1) ORDER BY id")
                .bind(vec![low, lowest])
                .fetch_all(&db.pool)
                .await
                .unwrap();
        assert_eq!(priorities, [1, 0], "stored priorities are never changed");
    }
}

/// A job as the timed test reads it: its key and when it was queued.
#[derive(Debug, sqlx::FromRow)]
struct Tenanted {
    id: i64,
    fair_key: String,
    queued: f64,
}

impl Record for Tenanted {
    fn id(&self) -> i64 {
        self.id
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Records each job's key, when its handler started and how long after its
/// insert, then works 10 ms.
#[derive(Default)]
struct Pickups {
    starts: std::sync::Mutex<Vec<(String, f64, f64)>>,
}

impl Handler<DbStore<Tenanted>> for Pickups {
    async fn handle(
        &self,
        job: &mut DbJob<Tenanted>,
        _ctx: &JobContext<DbStore<Tenanted>>,
    ) -> Result<(), HandlerError> {
        let now = unix_now();
        let r = job.record();
        self.starts
            .lock()
            .unwrap()
            .push((r.fair_key.clone(), now, now - r.queued));
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok(())
    }
}

/// What one run of the noisy-neighbour set-up saw in its window.
struct Run {
    /// B..H's pickups (insert to handler start), seconds, sorted.
    others: Vec<f64>,
    /// How many jobs B..H enqueued.
    produced: usize,
    /// Handler starts per second: A's and the others'.
    a_rate: f64,
    /// A's before the others started.
    a_alone_rate: f64,
    others_rate: f64,
}

/// Two worker processes of 32 handlers on a fair table for `window`; A COPYs
/// `backlog` jobs first; with `producers`, B..H each enqueue a job a second
/// from 4 producers.
async fn noisy_run(backlog: usize, window: Duration) -> Run {
    let db = fair_db().await;
    let table = db
        .table_with(|o| {
            o.column_expressions = vec![
                "j.id".into(),
                "coalesce(j.fair_key, '') AS fair_key".into(),
                "EXTRACT(EPOCH FROM j.queued_at)::float8 AS queued".into(),
            ];
        })
        .await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    if backlog > 0 {
        copy_jobs(&enqueuer, "a", backlog).await;
    }
    let pickups = Arc::new(Pickups::default());
    let (mut shutdowns, mut runs) = (Vec::new(), Vec::new());
    for n in 0..2 {
        let pool = db.db.pool(12).await.unwrap();
        let mut so = db.options();
        so.name = format!("fair-{n}");
        so.stall.stalled_max_age = Duration::from_secs(60);
        so.handling = dbworker::Handling::Heartbeat;
        let store = DbStore::<Tenanted>::new(&pool, &table, so).await.unwrap();
        let mut o = WorkerOptions::new(format!("process-{n}"));
        o.num_handlers = 32;
        o.interval = Duration::from_millis(10);
        let worker = new_worker(Arc::new(store), pickups.clone(), o).unwrap();
        shutdowns.push(worker.shutdown_handle());
        runs.push(tokio::spawn(worker.run()));
    }
    // With a backlog, A runs alone for a while first: what it gets then is
    // the capacity, measured on the same workers and table.
    let lead = if backlog > 0 { 3.0 } else { 0.0 };
    tokio::time::sleep(Duration::from_secs_f64(lead)).await;
    let start = unix_now();
    let produced = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    {
        for p in 0..4u64 {
            let (enqueuer, produced) = (enqueuer.clone(), produced.clone());
            tasks.push(tokio::spawn(async move {
                // Producer p sends every tenant a job at p, p + 4, p + 8 … s.
                let mut at = Duration::from_secs(p);
                while at < window {
                    let wait = at.as_secs_f64() - (unix_now() - start);
                    if wait > 0.0 {
                        tokio::time::sleep(Duration::from_secs_f64(wait)).await;
                    }
                    for tenant in ["b", "c", "d", "e", "f", "g", "h"] {
                        enqueuer
                            .enqueue(NewJob::new().fair_key(tenant))
                            .await
                            .unwrap();
                        produced.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    at += Duration::from_secs(4);
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let remaining = window.as_secs_f64() - (unix_now() - start);
    if remaining > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(remaining)).await;
    }
    // Let the last others start before stopping.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for s in &shutdowns {
        s.graceful();
    }
    for r in runs {
        r.await.unwrap();
    }
    let starts = pickups.starts.lock().unwrap();
    let end = start + window.as_secs_f64();
    let in_window = |k: &(String, f64, f64)| k.1 >= start && k.1 < end;
    let mut others: Vec<f64> = starts.iter().filter(|s| s.0 != "a").map(|s| s.2).collect();
    others.sort_by(f64::total_cmp);
    let rate = |a: bool| {
        starts
            .iter()
            .filter(|s| in_window(s) && (s.0 == "a") == a)
            .count() as f64
            / window.as_secs_f64()
    };
    // The lead's last two seconds (the first is the workers' start).
    let alone = starts
        .iter()
        .filter(|s| s.0 == "a" && s.1 >= start - 2.0 && s.1 < start)
        .count() as f64
        / 2.0;
    Run {
        others,
        produced: produced.load(std::sync::atomic::Ordering::SeqCst),
        a_rate: rate(true),
        a_alone_rate: alone,
        others_rate: rate(false),
    }
}

fn p99(sorted: &[f64]) -> f64 {
    sorted[(sorted.len() * 99).div_ceil(100).clamp(1, sorted.len()) - 1]
}

#[tokio::test]
async fn a_noisy_neighbour_leaves_the_others_pickup_and_uses_what_they_leave() {
    let _alone = TIMED.write().await;
    let window = Duration::from_secs(8);
    let alone = noisy_run(0, window).await;
    let noisy = noisy_run(100_000, window).await;
    let (base, with_a) = (p99(&alone.others), p99(&noisy.others));
    eprintln!(
        "B..H pickup p99: {:.1} ms alone, {:.1} ms beside A ({} and {} jobs); A {:.0}/s beside them, {:.0}/s alone; others {:.1}/s",
        base * 1e3,
        with_a * 1e3,
        alone.others.len(),
        noisy.others.len(),
        noisy.a_rate,
        noisy.a_alone_rate,
        noisy.others_rate,
    );
    for run in [&alone, &noisy] {
        assert_eq!(run.others.len(), run.produced, "some of B..H never ran");
    }
    // Without fair claims B..H wait behind A's backlog: seconds. With them,
    // about what they wait alone; the floor of 100 ms keeps one scheduling
    // hiccup of this 2-core box (a p99 of 56 samples is nearly their maximum)
    // from failing the test, and still fails it without the feature.
    assert!(
        with_a <= (2.0 * base).max(0.1),
        "B..H pickup p99 {with_a} s beside A, {base} s alone"
    );
    // Work-conserving: A gets what the others leave, within this box's noise
    // between two phases of one run (0.85 seen while other builds shared the
    // 2 cores); a share-capped claim would leave A an eighth.
    let left = noisy.a_alone_rate - noisy.others_rate;
    assert!(
        noisy.a_rate >= 0.75 * left,
        "A ran {} jobs/s of the {left} the others left",
        noisy.a_rate,
    );
}

#[tokio::test]
async fn every_way_in_tags_the_job_at_the_back_of_its_keys_share() {
    let _alone = TIMED.write().await;
    let db = Db::with_sql_functions().await;
    let mut fair = FairClaims::default();
    fair.queue_column = Some("queue".into());
    fair.priority_column = Some("priority".into());
    db.execute(&dbworker::ddl::workflows_sql("jobs", &HashMap::new()).unwrap())
        .await;
    db.execute(&fair_claims_sql("jobs", &HashMap::new(), &fair).unwrap())
        .await;
    let table = db
        .table_with(|o| {
            o.detect = true;
            o.workflows = true;
        })
        .await;
    assert!(table.is_fair());
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let store = store(&db, &table).await;
    let upstream = enqueuer
        .enqueue(NewJob::new().fair_key("u"))
        .await
        .unwrap()
        .id();
    let mut claimed = store.dequeue("host", &Default::default(), 1).await.unwrap();
    assert_eq!(claimed[0].record().id(), upstream);

    // Eight jobs of key k, each way in: one, many, COPY, the SQL functions,
    // a plain INSERT; then a dependent of k, released by the upstream's end.
    let k = || NewJob::new().fair_key("k");
    enqueuer.enqueue(k()).await.unwrap();
    enqueuer.enqueue_many([k(), k()]).await.unwrap();
    enqueuer.enqueue_copy(&[k(), k()]).await.unwrap();
    db.execute(
        r#"SELECT jobs_enqueue('{"fair_key": "k"}');
           SELECT jobs_add_jobs(ARRAY['{"fields": {"fair_key": "k"}}'::jsonb]);
           INSERT INTO jobs (fair_key) VALUES ('k');"#,
    )
    .await;
    let dependent = enqueuer.enqueue(k().after([upstream])).await.unwrap().id();
    store.mark_complete(&mut claimed[0]).await.unwrap();
    let tags: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT id, fair_tag FROM jobs WHERE fair_key = 'k' AND state = 'queued' ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let expected: Vec<i64> = (0..9).map(|i| i * 1_000_000).collect();
    assert_eq!(
        tags.iter().map(|(_, t)| *t).collect::<Vec<_>>(),
        expected,
        "{tags:?}"
    );
    assert_eq!(tags.last().unwrap().0, dependent);
}

/// The keys of `order` up to the first key's last claim: while both waited.
fn while_both_wait<'a>(order: &'a [String], a: &str) -> &'a [String] {
    let a_total = order.iter().filter(|k| *k == a).count();
    let b_total = order.len() - a_total;
    let (mut a_seen, mut b_seen) = (0, 0);
    for (i, key) in order.iter().enumerate() {
        if key == a {
            a_seen += 1;
        } else {
            b_seen += 1;
        }
        if a_seen == a_total || b_seen == b_total {
            return &order[..=i];
        }
    }
    order
}

/// The most two keys' counts differ by in any run of consecutive claims.
fn worst_drift(order: &[String], a: &str) -> i64 {
    let mut diff = vec![0i64];
    for key in order {
        let last = *diff.last().unwrap();
        diff.push(last + if key == a { 1 } else { -1 });
    }
    diff.iter().max().unwrap() - diff.iter().min().unwrap()
}

/// Enqueues `jobs` jobs of `key` from `producers` concurrent producers, each
/// job in a transaction of its own.
async fn produce(
    enqueuer: &Enqueuer,
    key: &'static str,
    producers: usize,
    jobs: usize,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..producers)
        .map(|_| {
            let enqueuer = enqueuer.clone();
            tokio::spawn(async move {
                for _ in 0..jobs / producers {
                    enqueuer.enqueue(NewJob::new().fair_key(key)).await.unwrap();
                }
            })
        })
        .collect()
}

#[tokio::test]
async fn concurrent_producers_bound_how_far_shares_drift() {
    let _alone = TIMED.write().await;
    // One producer per key, both at once: the counts of any run of claims
    // differ by at most 2.
    let db = fair_db().await;
    let table = db.table().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let mut tasks = produce(&enqueuer, "a", 1, 400).await;
    tasks.extend(produce(&enqueuer, "b", 1, 400).await);
    for t in tasks {
        t.await.unwrap();
    }
    let claims = store(&db, &table).await;
    let order = claim_all(&db, &claims, 10, 800).await;
    let drift = worst_drift(while_both_wait(&order, "a"), "a");
    assert!(drift <= 2, "one producer each: drifted by {drift}");

    // Four producers of b against one of a: b's jobs enqueued at once cannot
    // see each other, so some crowd its share: measured 52 % of the claims
    // (54 % before the tagging counted every job at the key's last tag); by
    // id, b's faster producers would take about four in five.
    let db = fair_db().await;
    let table = db.table().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let mut tasks = produce(&enqueuer, "a", 1, 600).await;
    tasks.extend(produce(&enqueuer, "b", 4, 600).await);
    for t in tasks {
        t.await.unwrap();
    }
    let claims = store(&db, &table).await;
    let order = claim_all(&db, &claims, 10, 1_200).await;
    let both = while_both_wait(&order, "a");
    let b = both.iter().filter(|k| *k == "b").count() as f64 / both.len() as f64;
    assert!(
        b <= 0.55,
        "b's four producers took {:.1} % of the claims while both waited",
        b * 100.0
    );
    // With keys serialized, b's producers take turns: 2 jobs, as with one.
    let db = Db::new().await;
    let mut fair = FairClaims::default();
    fair.queue_column = Some("queue".into());
    fair.serialize_keys = true;
    db.add_columns(
        |c| c.queue = true,
        &[fair_claims_sql("jobs", &HashMap::new(), &fair).unwrap()],
    )
    .await;
    let table = db.table().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let mut tasks = produce(&enqueuer, "a", 1, 400).await;
    tasks.extend(produce(&enqueuer, "b", 4, 400).await);
    for t in tasks {
        t.await.unwrap();
    }
    let claims = store(&db, &table).await;
    let order = claim_all(&db, &claims, 10, 800).await;
    let drift = worst_drift(while_both_wait(&order, "a"), "a");
    assert!(drift <= 2, "serialized keys: drifted by {drift}");
}

#[tokio::test]
async fn a_declared_cost_counts_against_its_keys_share() {
    let _alone = TIMED.write().await;
    let db = fair_db().await;
    let table = db.table().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let heavy: Vec<NewJob> = (0..300)
        .map(|_| NewJob::new().fair_key("heavy").fair_cost(3))
        .collect();
    enqueuer.enqueue_copy(&heavy).await.unwrap();
    copy_jobs(&enqueuer, "light", 600).await;
    let claims = store(&db, &table).await;
    let order = claim_all(&db, &claims, 10, 400).await;
    let heavy = order.iter().filter(|k| *k == "heavy").count();
    // Cost 3 against cost 1: a quarter of the claims, 100 of 400.
    assert!(
        (98..=102).contains(&heavy),
        "heavy jobs took {heavy} of 400"
    );
}

#[tokio::test]
async fn a_partitioned_table_is_fair_too() {
    let _alone = TIMED.write().await;
    let db = Db::partitioned().await;
    db.execute(&fair_claims_sql("jobs", &HashMap::new(), &FairClaims::default()).unwrap())
        .await;
    let table = db.table().await;
    assert!(table.is_fair());
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    copy_jobs(&enqueuer, "a", 2_000).await;
    copy_jobs(&enqueuer, "b", 10).await;
    let claims = store(&db, &table).await;
    let first = claim_all(&db, &claims, 10, 20).await;
    assert_eq!(first.iter().filter(|k| *k == "b").count(), 10, "{first:?}");
}

/// The aging claim walks at most 32 priority levels; only levels with jobs
/// due count. Thirty-two levels of jobs scheduled for tomorrow above a due
/// job at the bottom used to fill the walk, so the due job was never claimed.
#[tokio::test]
async fn with_aging_levels_of_jobs_not_yet_due_hide_no_due_job() {
    let db = Db::new().await;
    db.add_columns(|c| c.priority = true, &[]).await;
    let table = db
        .table_with(|o| {
            o.priority_column = Some("priority".into());
            o.aging = Some(Aging::every(Duration::from_secs(60)));
        })
        .await;
    db.execute(
        "INSERT INTO jobs (priority, process_after)
         SELECT g, now() + interval '1 day' FROM generate_series(1, 40) g",
    )
    .await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let due = enqueuer
        .enqueue(NewJob::new().priority(0))
        .await
        .unwrap()
        .id();
    let store = DbStore::<Job>::new(&db.pool, &table, db.options())
        .await
        .unwrap();
    let claimed: Vec<i64> = store
        .dequeue("host", &Default::default(), 5)
        .await
        .unwrap()
        .iter()
        .map(|j| j.record().id)
        .collect();
    assert_eq!(claimed, [due]);
}

/// A key's batch scheduled for later is tagged when it comes due, against
/// the head of that moment: it takes its share of the claims then, not all
/// of them (it took 500 of 500 when tagged at its enqueue). Until tagged it
/// waits behind the tagged jobs, and it is never starved: alone, it runs.
#[tokio::test]
async fn a_batch_scheduled_for_later_takes_its_share_when_due_not_every_claim() {
    let _alone = TIMED.write().await;
    let db = fair_db().await;
    let table = db.table().await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let later: Vec<NewJob> = (0..200)
        .map(|_| {
            NewJob::new()
                .fair_key("later")
                .run_after(Duration::from_millis(1500))
        })
        .collect();
    enqueuer.enqueue_many(&later).await.unwrap();
    copy_jobs(&enqueuer, "b", 300).await;
    copy_jobs(&enqueuer, "c", 300).await;
    let store = store(&db, &table).await;
    // B and C run a while before the batch is due; the head moves on.
    let before = claim_all(&db, &store, 10, 200).await;
    assert!(before.iter().all(|k| k != "later"), "not due yet");
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let after = claim_all(&db, &store, 10, 90).await;
    let later_share = after.iter().filter(|k| *k == "later").count();
    assert!(
        (20..=40).contains(&later_share),
        "the batch took {later_share} of the next 90 claims: {after:?}"
    );
    // Alone at the end, the rest of it runs.
    let rest = claim_all(&db, &store, 50, 10_000).await;
    assert_eq!(
        before.len() + after.len() + rest.len(),
        800,
        "every job claimed once"
    );
}

/// `len` characters that compress badly, as a real key's would (a run of
/// one letter would fit the index compressed).
fn scrambled(len: usize) -> String {
    let mut x: u32 = 0x9e37_79b9;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            char::from(b'!' + u8::try_from(x % 90).unwrap())
        })
        .collect()
}

/// A fairness key is capped like a job key (512 characters) and a cost to
/// the column's bounds (1 to 1,000,000), each refused by name before
/// anything is written, one by one, in a batch and in a COPY: one
/// overlong key no longer fails its whole batch with Postgres's "index row
/// size exceeds btree maximum".
#[tokio::test]
async fn an_overlong_fair_key_or_a_cost_out_of_range_is_refused_by_name() {
    let _shared = TIMED.read().await;
    let db = fair_db().await;
    let table = db
        .table_with(|o| o.queue_column = Some("queue".into()))
        .await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    enqueuer
        .enqueue(&NewJob::new().fair_key(scrambled(512)).fair_cost(1_000_000))
        .await
        .expect("at the limits");
    for (bad, field) in [
        (NewJob::new().fair_key(scrambled(2_700)), "fair_key"),
        (NewJob::new().fair_cost(0), "fair_cost"),
        (NewJob::new().fair_cost(1_000_001), "fair_cost"),
    ] {
        let batch = [NewJob::new(), bad];
        for (how, err) in [
            ("one", enqueuer.enqueue(&batch[1]).await.unwrap_err()),
            ("many", enqueuer.enqueue_many(&batch).await.unwrap_err()),
            ("copy", enqueuer.enqueue_copy(&batch).await.unwrap_err()),
        ] {
            assert!(
                matches!(&err, dbworker::Error::InvalidOption { field: f, .. } if *f == field)
                    && err.to_string().contains("at most"),
                "{how}: {err}"
            );
        }
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 1, "only the job within the limits");
}
