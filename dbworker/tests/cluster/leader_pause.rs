//! A leader paused past its lease (SIGSTOP, as a VM migration or a long page
//! fault would pause it), then resumed: another node has taken the lease in a
//! newer term, and every write the old leader tries after resuming is
//! refused by its term's fence — before it has even noticed it lost the
//! lease. Writes are checked by SQL: their terms never go back, and none of
//! the paused node's writes lands after it resumed.
//!
//! Before terms and fences, the resumed leader wrote once more while the
//! lease row already named another node.

use crate::TIMED;
use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use dbworker::Error;
use dbworker::cluster::{LeaderElection, LeaderOptions};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use common::Db;

const CHILD_URL: &str = "DBWORKER_LEADER_PAUSE_URL";
const CHILD_NODE: &str = "DBWORKER_LEADER_PAUSE_NODE";
const LEASE: Duration = Duration::from_millis(1500);

/// A node: campaigns for the scope and, while it leads, writes a row every
/// few milliseconds in a transaction fenced by its term; a write that does
/// not go through is recorded (unfenced) in `leader_refusals`: `refused` by
/// the fence, or `cut off` (a transaction it had begun before the pause was
/// ended by the server's idle limit meanwhile).
#[tokio::test]
#[ignore = "run by the test below as a child process"]
async fn leader_pause_child() {
    let url = std::env::var(CHILD_URL).expect("the parent hands over the URL");
    let node = std::env::var(CHILD_NODE).expect("the parent names the node");
    let pool = PgPool::connect(&url).await.unwrap();
    let mut o = LeaderOptions::new("singleton", &node);
    o.lease = LEASE;
    let election = LeaderElection::new(&pool, o).await.unwrap();
    election
        .run(CancellationToken::new(), move |leadership| {
            let (pool, node) = (pool.clone(), node.clone());
            async move {
                loop {
                    // Tried whatever the token says: a paused leader resumes
                    // before its election loop can tell it anything.
                    let how = match leadership.begin().await {
                        Ok(mut tx) => {
                            let wrote = sqlx::query(
                                "INSERT INTO leader_writes (node, term) VALUES ($1, $2)",
                            )
                            .bind(&node)
                            .bind(leadership.term())
                            .execute(&mut *tx)
                            .await;
                            match wrote {
                                Ok(_) => tx.commit().await.err().map(|_| "cut off"),
                                Err(_) => Some("cut off"),
                            }
                        }
                        Err(Error::LeadershipLost { .. }) => Some("refused"),
                        Err(err) => {
                            eprintln!("{node}: {err}");
                            Some("cut off")
                        }
                    };
                    if let Some(how) = how {
                        let _ = sqlx::query(
                            "INSERT INTO leader_refusals (node, term, how) VALUES ($1, $2, $3)",
                        )
                        .bind(&node)
                        .bind(leadership.term())
                        .bind(how)
                        .execute(&pool)
                        .await;
                    }
                    // The token is not watched: a singleton that ignores it
                    // (or has not noticed it yet) is what the fence must stop.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        })
        .await;
}

fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal}");
}

async fn latest_writer(db: &Db) -> Option<(String, i64)> {
    sqlx::query_as("SELECT node, term FROM leader_writes ORDER BY id DESC LIMIT 1")
        .fetch_optional(&db.pool)
        .await
        .unwrap()
}

async fn clock(db: &Db) -> String {
    sqlx::query_scalar("SELECT clock_timestamp()::text")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_leader_resumed_after_its_lease_passed_has_every_write_refused() {
    let _alone = TIMED.write().await;
    let db = Db::new().await;
    db.execute(&dbworker::ddl::leader_table_sql(dbworker::cluster::DEFAULT_LEADER_TABLE).unwrap())
        .await;
    db.execute(
        "CREATE TABLE leader_writes (id bigserial PRIMARY KEY, node text NOT NULL, \
             term bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
         CREATE TABLE leader_refusals (node text NOT NULL, term bigint NOT NULL, how text NOT NULL, \
             at timestamptz NOT NULL DEFAULT clock_timestamp());",
    )
    .await;
    let url = db.db.url().to_owned();
    let mut children: Vec<(String, Child)> = (0..3)
        .map(|i| {
            let node = format!("node-{i}");
            let child = Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    common::test_path(module_path!(), "leader_pause_child").as_str(),
                    "--ignored",
                    "--nocapture",
                ])
                .env(CHILD_URL, &url)
                .env(CHILD_NODE, &node)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            (node, child)
        })
        .collect();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (leader, term) = loop {
        if let Some(w) = latest_writer(&db).await {
            break w;
        }
        assert!(tokio::time::Instant::now() < deadline, "no node led");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let paused = children.iter().position(|(n, _)| *n == leader).unwrap();
    signal(&children[paused].1, "-STOP");
    tokio::time::sleep(LEASE * 3).await;
    let (successor, new_term) = latest_writer(&db).await.unwrap();
    assert_ne!(successor, leader, "another node leads while it is paused");
    assert!(new_term > term, "a new leadership is a newer term");
    let resumed_at = clock(&db).await;
    signal(&children[paused].1, "-CONT");
    tokio::time::sleep(LEASE).await;
    for (_, child) in &mut children {
        child.kill().unwrap();
        child.wait().unwrap();
    }

    let late_writes: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM leader_writes WHERE node = $1 AND at > $2::timestamptz",
    )
    .bind(&leader)
    .bind(&resumed_at)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    // A write tried after resuming meets the fence; one whose transaction
    // began before the pause finds it cut off by the server's idle limit.
    let (refused, cut_off): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE how = 'refused'), count(*) FILTER (WHERE how = 'cut off') \
         FROM leader_refusals WHERE node = $1 AND term = $2 AND at > $3::timestamptz",
    )
    .bind(&leader)
    .bind(term)
    .bind(&resumed_at)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let backwards: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT term, lag(term) OVER (ORDER BY id) AS before \
         FROM leader_writes) w WHERE term < before",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let terms: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT node, term, count(*) FROM leader_writes GROUP BY 1, 2 ORDER BY min(id)",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    println!(
        "{leader} (term {term}) paused, {successor} took term {new_term}; after resuming the old \
         leader had {refused} writes refused, {cut_off} cut off and {late_writes} accepted; writes by \
         term: {terms:?}"
    );
    assert_eq!(
        late_writes, 0,
        "the resumed leader wrote after another node took the lease"
    );
    assert!(
        refused + cut_off >= 1,
        "the resumed leader tried to write at least once (and did not get through)"
    );
    assert_eq!(
        backwards, 0,
        "a write of an older term landed after a newer one"
    );
}

/// A leader stuck inside a fenced transaction (its process paused
/// mid-transaction, here a service that ignores its token) holds the lease
/// row `FOR SHARE`: its own renewals wait on it, so it loses the lease, and
/// every takeover waits on it too. The fence limits how long: a fenced
/// transaction idle for a whole lease is cut off by the server, and another
/// node leads.
#[tokio::test]
async fn a_leader_stuck_in_a_fenced_transaction_is_cut_off_and_another_leads() {
    let _alone = TIMED.write().await;
    use std::sync::Arc;
    use tokio::sync::Mutex;

    let db = Db::new().await;
    db.execute(&dbworker::ddl::leader_table_sql(dbworker::cluster::DEFAULT_LEADER_TABLE).unwrap())
        .await;
    let lease = Duration::from_millis(900);
    let election = |node: &str| {
        let mut o = LeaderOptions::new("singleton", node);
        o.lease = lease;
        let pool = db.pool.clone();
        async move { LeaderElection::new(&pool, o).await.unwrap() }
    };
    let (a, b) = (election("node-a").await, election("node-b").await);
    let stop = CancellationToken::new();
    // What node A's stuck service saw: whether its token had fired, and what
    // its transaction answered afterwards.
    let seen: Arc<Mutex<Option<(bool, bool)>>> = Arc::default();
    let a_run = {
        let (stop, seen) = (stop.clone(), seen.clone());
        tokio::spawn(async move {
            a.run(stop, move |leadership| {
                let seen = seen.clone();
                async move {
                    let Ok(mut tx) = leadership.begin().await else {
                        return;
                    };
                    // Stuck: no statement, no commit, token ignored.
                    tokio::time::sleep(lease * 6).await;
                    let answered = sqlx::query("SELECT 1").execute(&mut *tx).await.is_ok();
                    *seen.lock().await = Some((leadership.token().is_cancelled(), answered));
                }
            })
            .await;
        })
    };
    tokio::time::sleep(lease / 2).await;
    let b_led = Arc::new(Mutex::new(None));
    let b_run = {
        let (stop, b_led) = (stop.clone(), b_led.clone());
        tokio::spawn(async move {
            b.run(stop, move |leadership| {
                let b_led = b_led.clone();
                async move {
                    *b_led.lock().await = Some(leadership.term());
                    leadership.cancelled().await;
                }
            })
            .await;
        })
    };
    let started = tokio::time::Instant::now();
    while b_led.lock().await.is_none() {
        assert!(
            started.elapsed() < lease * 5,
            "no takeover while the stuck transaction holds the lease row"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "node-b took over {:?} after it started campaigning",
        started.elapsed()
    );
    while seen.lock().await.is_none() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (cancelled, answered) = seen.lock().await.unwrap();
    assert!(
        cancelled,
        "its own renewal could not pass its lock: leadership ended"
    );
    assert!(
        !answered,
        "the idle fenced transaction was cut off by the server"
    );
    assert_eq!(*b_led.lock().await, Some(2), "a new term");
    stop.cancel();
    a_run.await.unwrap();
    b_run.await.unwrap();
}
