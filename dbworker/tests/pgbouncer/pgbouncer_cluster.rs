//! The leader election and cron through PgBouncer in transaction mode, once
//! with `listen_url` set (to the direct server) and once without (neither
//! needs a session, so both behave the same): three candidates elect exactly
//! one leader, a standby takes over a killed leader's lease with a newer
//! term, and the old term's writes are fenced off; two schedulers racing on
//! one schedule enqueue each tick once. Skipped, saying why, without
//! pgbouncer (.ci/run installs it).

use crate::common;

use dbworker_testkit::pgbouncer as bouncer;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dbworker::{
    Error, NewJob, Pooler,
    cluster::{DEFAULT_LEADER_TABLE, LeaderElection, LeaderOptions, Leadership, current_leader},
    cron::{Backfill, DEFAULT_CRON_TABLE, Scheduler, SchedulerOptions},
    ddl::{cron_table_sql, leader_table_sql},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::POOLER;
use bouncer::Bouncer;
use common::Db;

/// Both settings the tests run under: with a listen URL to the direct
/// server, and without.
fn poolers(db: &Db) -> [Pooler; 2] {
    [
        Pooler::Transaction {
            listen_url: Some(db.db.url().to_owned()),
        },
        Pooler::Transaction { listen_url: None },
    ]
}

async fn set_up(test: &str) -> Option<(Db, Bouncer)> {
    let db = Db::new().await;
    let bouncer = Bouncer::start_or_skip(test, db.db.url(), 6)?;
    db.execute(&format!(
        "{}{}",
        leader_table_sql(DEFAULT_LEADER_TABLE).unwrap(),
        cron_table_sql(DEFAULT_CRON_TABLE).unwrap()
    ))
    .await;
    // Another sqlx program's statements are on every server connection.
    assert_eq!(bouncer.leave_named_statements().await, 60);
    Some((db, bouncer))
}

/// How many nodes lead at once, the most ever, and each leadership seen.
#[derive(Default)]
struct Watch {
    now: AtomicUsize,
    most: AtomicUsize,
    terms: std::sync::Mutex<Vec<(String, Leadership)>>,
}

/// Takes one off the count however the service ends (even aborted).
struct Leading(Arc<Watch>);

impl Drop for Leading {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

fn campaign(
    election: LeaderElection,
    name: String,
    watch: Arc<Watch>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        election
            .run(CancellationToken::new(), move |leadership| {
                let (watch, name) = (watch.clone(), name.clone());
                async move {
                    let n = watch.now.fetch_add(1, Ordering::SeqCst) + 1;
                    watch.most.fetch_max(n, Ordering::SeqCst);
                    watch.terms.lock().unwrap().push((name, leadership.clone()));
                    let _leading = Leading(watch);
                    leadership.cancelled().await;
                }
            })
            .await;
    })
}

/// Waits until `n` leaderships have begun; returns the last.
async fn leadership(watch: &Watch, n: usize) -> (String, Leadership) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(last) = watch.terms.lock().unwrap().get(n - 1) {
            return last.clone();
        }
        assert!(Instant::now() < deadline, "no leadership number {n}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn elect_and_fence(db: &Db, bouncer: &Bouncer) {
    let lease = Duration::from_millis(900);
    let watch = Arc::new(Watch::default());
    let mut runs = Vec::new();
    for i in 0..3 {
        let name = format!("node-{i}");
        let mut o = LeaderOptions::new("jobs", &name);
        o.lease = lease;
        let election = LeaderElection::new(&bouncer.pool(2).await, o)
            .await
            .unwrap();
        runs.push(campaign(election, name, watch.clone()));
    }
    let (first, old) = leadership(&watch, 1).await;
    tokio::time::sleep(lease * 2).await;
    assert_eq!(watch.terms.lock().unwrap().len(), 1, "the leader renews");
    assert_eq!(
        current_leader(&db.pool, DEFAULT_LEADER_TABLE, "jobs")
            .await
            .unwrap()
            .as_deref(),
        Some(first.as_str())
    );
    let mut tx = old
        .begin()
        .await
        .expect("the leader's own term is fenced in");
    sqlx::query("SELECT 1")
        .persistent(false)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    // Killed (nothing released): a standby takes over in a newer term, and
    // the old term's writes are refused.
    let index: usize = first["node-".len()..].parse().unwrap();
    runs[index].abort();
    let (second, new) = leadership(&watch, 2).await;
    assert_ne!(second, first);
    assert!(new.term() > old.term(), "a newer term");
    match old.begin().await {
        Err(Error::LeadershipLost { term, .. }) => assert_eq!(term, old.term()),
        Err(other) => panic!("refused for the wrong reason: {other}"),
        Ok(_) => panic!("a stale term was let through the fence"),
    }
    assert!(new.begin().await.is_ok(), "the new term writes");
    assert_eq!(watch.most.load(Ordering::SeqCst), 1, "one leader at a time");
    for run in runs {
        run.abort();
    }
}

async fn two_schedulers_tick_once(db: &Db, bouncer: &Bouncer, name: &str) {
    let table = db.table().await;
    let mut schedulers = Vec::new();
    for _ in 0..2 {
        let pool = bouncer.pool(2).await;
        let s = Scheduler::new(&pool, &table, SchedulerOptions::default())
            .await
            .unwrap()
            .add(
                name,
                "* * * * * *",
                NewJob::new().json("payload", json!({ "cron": name })),
                Backfill::default(),
            )
            .unwrap();
        schedulers.push(s);
    }
    // The first tick registers the schedule: it starts from now.
    assert!(schedulers[0].tick().await.unwrap().is_empty());
    let last_tick = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT floor(EXTRACT(EPOCH FROM last_tick))::bigint FROM dbworker_cron WHERE schedule = $1",
        )
        .bind(name)
        .fetch_one(&db.pool)
        .await
        .unwrap()
    };
    let first = last_tick().await;
    let until = Instant::now() + Duration::from_millis(3200);
    let tasks: Vec<_> = schedulers
        .into_iter()
        .map(|s| {
            tokio::spawn(async move {
                while Instant::now() < until {
                    s.tick().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let ticks = last_tick().await - first;
    assert!(ticks >= 2, "ticks passed: {ticks}");
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE payload->>'cron' = $1")
        .bind(name)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(jobs, ticks, "one job per tick");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_is_elected_once_and_fences_a_stale_term_through_pgbouncer() {
    let _turn = POOLER.lock().await;
    let Some((db, bouncer)) = set_up("the leader through PgBouncer").await else {
        return;
    };
    for pooler in poolers(&db) {
        dbworker::set_pooler(pooler);
        db.execute("TRUNCATE dbworker_leaders").await;
        elect_and_fence(&db, &bouncer).await;
    }
    let log = bouncer.log();
    assert!(!log.contains("ERROR"), "PgBouncer logged errors:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_schedulers_enqueue_each_tick_once_through_pgbouncer() {
    let _turn = POOLER.lock().await;
    let Some((db, bouncer)) = set_up("cron through PgBouncer").await else {
        return;
    };
    for (pooler, name) in poolers(&db).into_iter().zip(["with-listen-url", "polling"]) {
        dbworker::set_pooler(pooler);
        two_schedulers_tick_once(&db, &bouncer, name).await;
    }
    let log = bouncer.log();
    assert!(!log.contains("ERROR"), "PgBouncer logged errors:\n{log}");
}
