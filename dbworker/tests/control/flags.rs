//! Flags on real Postgres: jobs carrying a forbidden flag wait, in every
//! store that forbids it, while the others run; lifting the flag releases
//! them at the next claim (the claim cursor never leaves them behind); flags
//! set from Rust (inserts, keyed, COPY) and from the SQL enqueue function.

use crate::TIMED;
use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dbworker::{
    DbConditions, DbStore, Enqueuer, ForbiddenFlags, JobTable, KeyMode, NewJob,
    ddl::{OptionalColumns, enqueue_function_sql},
    new_worker,
};
use workerutil::{Record, Store, WorkerOptions};

use common::{Completes, Db, Job};

async fn set_up() -> (Db, Enqueuer) {
    let db = Db::new().await;
    db.add_columns(
        |c| {
            c.flags = true;
            c.keys = true;
        },
        &[],
    )
    .await;
    let table = db
        .table_with(|t| {
            t.flags_column = Some("flags".into());
            t.key_column = Some("job_key".into());
        })
        .await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    (db, enqueuer)
}

/// A store on a pool of its own (another process, as Postgres sees it).
async fn store(db: &Db, forbidden: ForbiddenFlags, cursor: Duration) -> Arc<DbStore<Job>> {
    let table = db
        .table_with(|t| t.flags_column = Some("flags".into()))
        .await;
    let mut o = db.options();
    o.claim.forbidden_flags = Some(forbidden);
    o.claim.claim_cursor = Some(cursor);
    let pool = db.db.pool(6).await.unwrap();
    Arc::new(DbStore::new(&pool, &table, o).await.unwrap())
}

/// A callback over a shared cache, counting its calls.
fn cached(cache: &Arc<Mutex<Vec<String>>>, calls: &Arc<AtomicUsize>) -> ForbiddenFlags {
    let (cache, calls) = (cache.clone(), calls.clone());
    ForbiddenFlags::callback(move || {
        calls.fetch_add(1, Ordering::SeqCst);
        let now = cache.lock().unwrap().clone();
        async move { now }
    })
}

async fn claim(store: &DbStore<Job>) -> Vec<i64> {
    let jobs = store
        .dequeue("host", &DbConditions::new(), 100)
        .await
        .unwrap();
    let mut ids: Vec<i64> = jobs.iter().map(|j| j.record().id()).collect();
    ids.sort_unstable();
    ids
}

/// Enqueues jobs alternately flagged `slow` and not; returns (flagged, plain).
async fn interleaved(enqueuer: &Enqueuer, n: usize) -> (Vec<i64>, Vec<i64>) {
    let (mut flagged, mut plain) = (Vec::new(), Vec::new());
    for i in 0..n {
        if i % 2 == 0 {
            let job = NewJob::new().flags(["slow"]);
            flagged.push(enqueuer.enqueue(&job).await.unwrap().id());
        } else {
            plain.push(enqueuer.enqueue(&NewJob::new()).await.unwrap().id());
        }
    }
    (flagged, plain)
}

fn run_options(jobs: u64) -> WorkerOptions {
    let mut o = WorkerOptions::new("flags");
    o.num_total_jobs = Some(jobs);
    o.heartbeat_failure_limit = Some(Duration::from_secs(1));
    o
}

#[tokio::test]
async fn a_forbidden_flag_holds_jobs_back_in_every_process_until_lifted() {
    let _shared = TIMED.read().await;
    let (db, enqueuer) = set_up().await;
    let (flagged, plain) = interleaved(&enqueuer, 6).await;
    // Each process keeps its own cache of the forbidden flags.
    let calls = Arc::new(AtomicUsize::new(0));
    let (cache_x, cache_y) = (
        Arc::new(Mutex::new(vec!["slow".to_owned()])),
        Arc::new(Mutex::new(vec!["slow".to_owned()])),
    );
    let cursor = Duration::from_secs(1);
    let x = store(&db, cached(&cache_x, &calls), cursor).await;
    let y = store(&db, cached(&cache_y, &calls), cursor).await;

    // Process x runs the plain jobs; the flagged ones wait.
    new_worker(x.clone(), Completes, run_options(3))
        .unwrap()
        .run()
        .await;
    for id in &plain {
        assert_eq!(db.state(*id).await, "completed", "plain job {id}");
    }
    for id in &flagged {
        assert_eq!(db.state(*id).await, "queued", "flagged job {id}");
    }
    assert!(calls.load(Ordering::SeqCst) >= 1, "asked before the claims");
    // Process y forbids the flag too.
    let before = calls.load(Ordering::SeqCst);
    assert!(claim(&y).await.is_empty());
    assert_eq!(calls.load(Ordering::SeqCst), before + 1, "asked per claim");

    // Lifted in y only: y runs them, x would still not.
    cache_y.lock().unwrap().clear();
    assert!(claim(&x).await.is_empty());
    new_worker(y.clone(), Completes, run_options(3))
        .unwrap()
        .run()
        .await;
    for id in &flagged {
        assert_eq!(db.state(*id).await, "completed", "flagged job {id}");
    }
    x.close().await;
    y.close().await;
}

#[tokio::test]
async fn lifting_a_flag_releases_rows_the_claim_cursor_passed() {
    let _shared = TIMED.read().await;
    let (db, enqueuer) = set_up().await;
    let cache = Arc::new(Mutex::new(Vec::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    // The probe (which would find passed-over rows later) never runs here:
    // the rows must come back at the very next claim.
    let s = store(&db, cached(&cache, &calls), Duration::from_secs(3600)).await;
    // The cursor of "no flag forbidden" exists and sits before the new rows.
    let first = enqueuer.enqueue(&NewJob::new()).await.unwrap().id();
    assert_eq!(claim(&s).await, [first]);

    *cache.lock().unwrap() = vec!["slow".to_owned()];
    let (flagged, plain) = interleaved(&enqueuer, 6).await;
    assert_eq!(claim(&s).await, plain, "the cursor passes the flagged rows");
    let late = enqueuer.enqueue(&NewJob::new()).await.unwrap().id();
    assert_eq!(claim(&s).await, [late]);

    cache.lock().unwrap().clear();
    assert_eq!(claim(&s).await, flagged, "none left behind a cursor");
    s.close().await;
}

#[tokio::test]
async fn a_fixed_list_skips_any_job_carrying_one_of_its_flags() {
    let _shared = TIMED.read().await;
    let (db, enqueuer) = set_up().await;
    let gpu = enqueuer
        .enqueue(&NewJob::new().flags(["x", "gpu"]))
        .await
        .unwrap()
        .id();
    let other = enqueuer
        .enqueue(&NewJob::new().flags(["x"]))
        .await
        .unwrap()
        .id();
    let empty = enqueuer
        .enqueue(&NewJob::new().flags(Vec::<String>::new()))
        .await
        .unwrap()
        .id();
    let none = enqueuer.enqueue(&NewJob::new()).await.unwrap().id();
    let s = store(
        &db,
        ForbiddenFlags::fixed(["gpu", "tpu"]),
        Duration::from_secs(1),
    )
    .await;
    assert_eq!(claim(&s).await, [other, empty, none]);
    assert_eq!(db.state(gpu).await, "queued");
    s.close().await;
}

#[tokio::test]
async fn a_missing_flags_column_is_named_at_start_up() {
    let _shared = TIMED.read().await;
    let db = Db::new().await;
    let mut t = Db::table_options();
    t.flags_column = Some("flags".into());
    let err = JobTable::new(&db.pool, t).await.unwrap_err().to_string();
    assert!(err.contains("has no column flags"), "{err}");
    assert!(err.contains("--flags"), "{err}");
    // A column of another type is named too.
    db.execute("ALTER TABLE jobs ADD COLUMN flags jsonb").await;
    let mut t = Db::table_options();
    t.flags_column = Some("flags".into());
    let err = JobTable::new(&db.pool, t).await.unwrap_err().to_string();
    assert!(err.contains("expected text[]"), "{err}");
    // A store forbidding flags on a table without the column is refused.
    let mut o = db.options();
    o.claim.forbidden_flags = Some(ForbiddenFlags::fixed(["gpu"]));
    let err = DbStore::<Job>::new(&db.pool, &db.table().await, o)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("flags_column"), "{err}");
    // An enqueuer without the column configured refuses flags.
    let plain = Enqueuer::new(&db.pool, &db.table().await).await.unwrap();
    let err = plain
        .enqueue(&NewJob::new().flags(["a"]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("flags_column"), "{err}");
}

async fn flags_of(db: &Db, id: i64) -> Option<Vec<String>> {
    db.scalar("SELECT flags FROM jobs WHERE id = $1", id).await
}

#[tokio::test]
async fn flags_are_set_from_rust_and_from_sql() {
    let _shared = TIMED.read().await;
    let (db, enqueuer) = set_up().await;
    let odd = vec!["a,b".to_owned(), "NULL".to_owned(), "q\"\\{}".to_owned()];
    // One by one, many per statement, and COPY.
    let one = enqueuer
        .enqueue(&NewJob::new().flags(odd.clone()))
        .await
        .unwrap()
        .id();
    assert_eq!(flags_of(&db, one).await, Some(odd.clone()));
    let many = enqueuer
        .enqueue_many(&[NewJob::new().flags(["m"]), NewJob::new()])
        .await
        .unwrap();
    assert_eq!(flags_of(&db, many[0]).await, Some(vec!["m".to_owned()]));
    assert_eq!(flags_of(&db, many[1]).await, None);
    let copied = enqueuer
        .enqueue_copy(&[NewJob::new().flags(odd.clone()), NewJob::new().flags(["c"])])
        .await
        .unwrap();
    assert_eq!(copied, 2);
    let last: i64 = db.scalar("SELECT max(id) FROM jobs WHERE $1 = $1", 0).await;
    assert_eq!(flags_of(&db, last - 1).await, Some(odd));
    assert_eq!(flags_of(&db, last).await, Some(vec!["c".to_owned()]));
    // A keyed replace takes the new flags.
    let keyed = enqueuer
        .enqueue(&NewJob::new().key("k", KeyMode::Replace).flags(["old"]))
        .await
        .unwrap()
        .id();
    let again = enqueuer
        .enqueue(&NewJob::new().key("k", KeyMode::Replace).flags(["new"]))
        .await
        .unwrap();
    assert_eq!(again.id(), keyed);
    assert_eq!(flags_of(&db, keyed).await, Some(vec!["new".to_owned()]));

    // The SQL enqueue function takes them as a parameter.
    let mut columns = OptionalColumns::default();
    columns.flags = true;
    columns.keys = true;
    db.execute(&enqueue_function_sql("jobs", &HashMap::new(), columns).unwrap())
        .await;
    let from_sql: i64 = db
        .scalar(
            "SELECT jobs_enqueue('{}', flags => ARRAY['sql', 'x']) WHERE $1 = $1",
            0,
        )
        .await;
    assert_eq!(
        flags_of(&db, from_sql).await,
        Some(vec!["sql".to_owned(), "x".to_owned()])
    );
    let unflagged: i64 = db
        .scalar("SELECT jobs_enqueue('{}') WHERE $1 = $1", 0)
        .await;
    assert_eq!(flags_of(&db, unflagged).await, None);
    let err = sqlx::query("SELECT jobs_enqueue('{\"flags\": [\"a\"]}')")
        .execute(&db.pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("managed by dbworker"), "{err}");
}
