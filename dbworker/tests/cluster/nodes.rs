//! Many processes on real Postgres: the worker registry (registration,
//! heartbeats, deregistration, dead processes), the fast rescue of a dead
//! process's jobs by the resetter, and leader election with failover. Resetter
//! processes (`dbworker reset --lead`) electing a leader: dbworker-cli/tests/services/nodes.rs.

use crate::TIMED;
use crate::common;
use crate::fixtures::nodes as shared;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dbworker::{
    DbConditions, Handling, JobTable, JobTableOptions, Resetter, ResetterOptions,
    cluster::{
        DEFAULT_LEADER_TABLE, DEFAULT_NODE_TABLE, LeaderElection, LeaderOptions, Node, NodeOptions,
        current_leader, live_nodes,
    },
};
use tokio_util::sync::CancellationToken;
use workerutil::Store;

use common::Db;
use shared::set_up;

fn fast_nodes(queues: &[&str], handlers: u32) -> NodeOptions {
    let mut o = NodeOptions::default();
    o.heartbeat_interval = Duration::from_millis(50);
    o.dead_after = Duration::from_millis(400);
    o.queues = queues.iter().map(|q| (*q).to_owned()).collect();
    o.handlers = handlers;
    o
}

async fn rows_in_registry(db: &Db) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM dbworker_nodes")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn processes_register_heartbeat_deregister_and_a_silent_one_is_dead() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    let a = Node::new(&db.pool, fast_nodes(&["emails"], 4))
        .await
        .unwrap();
    let b = Node::new(&db.pool, fast_nodes(&["reports"], 1))
        .await
        .unwrap();
    assert_ne!(a.id(), b.id());
    let pid = std::process::id().to_string();
    assert!(a.id().contains(&format!(":{pid}:")), "{}", a.id());
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    // One run owned by its task, the other as a `Service`: the same loop.
    let run_a = {
        let (a, stop) = (a.clone(), stop_a.clone());
        tokio::spawn(async move { dbworker::Service::run(&a, stop).await })
    };
    let run_b = tokio::spawn(b.clone().run(stop_b.clone()));

    // Both stay live across several dead_after periods while they heartbeat.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let dead_after = Duration::from_millis(400);
    let live = live_nodes(&db.pool, DEFAULT_NODE_TABLE, dead_after)
        .await
        .unwrap();
    assert_eq!(live.len(), 2, "{live:?}");
    let info_a = live.iter().find(|n| n.id == a.id()).unwrap();
    assert_eq!(info_a.queues, ["emails"]);
    assert_eq!(info_a.handlers, 4);
    assert_eq!(info_a.pid.to_string(), pid);
    assert!(info_a.up_seconds >= 0.9, "{info_a:?}");
    assert!(info_a.heartbeat_age_seconds < 0.4, "{info_a:?}");

    // A graceful stop removes the row.
    stop_a.cancel();
    run_a.await.unwrap().unwrap();
    let live = live_nodes(&db.pool, DEFAULT_NODE_TABLE, dead_after)
        .await
        .unwrap();
    assert_eq!(
        live.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(),
        [b.id()]
    );

    // A process that stops heartbeating without a word (its task dies, as
    // with SIGKILL) is dead once dead_after passes; its row stays for the
    // resetter to find.
    run_b.abort();
    let _ = run_b.await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        live_nodes(&db.pool, DEFAULT_NODE_TABLE, dead_after)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(rows_in_registry(&db).await, 1);
    drop(stop_b);
}

/// A process whose registry row went stale while it still beats its jobs
/// (its registry heartbeat stuck on a lock or a connection) is not dead to
/// its jobs: they are rescued only once their own heartbeats stopped for
/// `dead_after` too, never while the process may still be running them.
#[tokio::test]
async fn a_stale_registry_row_does_not_rescue_jobs_whose_heartbeats_are_fresh() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    db.enqueue(1, serde_json::json!({})).await;
    let store = db.store(Handling::Heartbeat).await;
    let node = Node::new(&db.pool, fast_nodes(&[], 1)).await.unwrap();
    let jobs = store
        .dequeue(node.id(), &DbConditions::new(), 1)
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1);
    // The registry row stale (past dead_after, not yet pruned at the
    // stalled max age); the job beaten just now.
    sqlx::query(
        "UPDATE dbworker_nodes SET heartbeat_at = now() - interval '5 seconds' WHERE id = $1",
    )
    .bind(node.id())
    .execute(&db.pool)
    .await
    .unwrap();
    let leases: Vec<_> = jobs.iter().map(workerutil::Job::lease).collect();
    assert_eq!(store.heartbeat(&leases).await.unwrap().known.len(), 1);

    let table = JobTable::new(&db.pool, JobTableOptions::new("jobs"))
        .await
        .unwrap();
    let mut o = ResetterOptions::new("rescuer");
    o.stall.stalled_max_age = Duration::from_secs(60);
    o.node_table = Some(DEFAULT_NODE_TABLE.into());
    o.dead_after = Duration::from_millis(400);
    let resetter = Resetter::new(&db.pool, &table, o).await.unwrap();
    let out = resetter.reset_once().await.unwrap();
    assert!(
        out.reset.is_empty(),
        "a job beaten just now was requeued beside its running attempt: {out:?}"
    );
    assert_eq!(db.count("processing").await, 1);

    // Its heartbeats stop as well: now it is rescued, long before 60 s.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let out = resetter.reset_once().await.unwrap();
    assert_eq!(out.reset.len(), 1, "{out:?}");
    assert_eq!(db.count("queued").await, 1);
}

#[tokio::test]
async fn the_resetter_rescues_a_dead_processs_jobs_before_stalled_max_age() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    db.enqueue(3, serde_json::json!({})).await;
    let store = db.store(Handling::Heartbeat).await;
    let dead = Node::new(&db.pool, fast_nodes(&[], 2)).await.unwrap();
    let live = Node::new(&db.pool, fast_nodes(&[], 1)).await.unwrap();
    let stop = CancellationToken::new();
    let heartbeats = tokio::spawn(live.clone().run(stop.clone()));
    let dead_jobs = store
        .dequeue(dead.id(), &DbConditions::new(), 2)
        .await
        .unwrap();
    let live_jobs = store
        .dequeue(live.id(), &DbConditions::new(), 1)
        .await
        .unwrap();
    assert_eq!((dead_jobs.len(), live_jobs.len()), (2, 1));

    let table = JobTable::new(&db.pool, JobTableOptions::new("jobs"))
        .await
        .unwrap();
    let mut o = ResetterOptions::new("rescuer");
    o.stall.stalled_max_age = Duration::from_secs(60);
    o.node_table = Some(DEFAULT_NODE_TABLE.into());
    o.dead_after = Duration::from_millis(400);
    o.interval = Duration::from_millis(50);
    let resetter = Arc::new(Resetter::new(&db.pool, &table, o).await.unwrap());
    resetter.check().await.unwrap();
    // Nobody is dead yet: nothing moves.
    assert!(resetter.reset_once().await.unwrap().reset.is_empty());

    tokio::time::sleep(Duration::from_millis(600)).await;
    // Run as a service: its passes reach a subscriber.
    let mut passes = resetter.subscribe();
    let stop_resetter = CancellationToken::new();
    let resetting = {
        let (resetter, stop) = (resetter.clone(), stop_resetter.clone());
        tokio::spawn(async move { dbworker::Service::run(&*resetter, stop).await })
    };
    let out = passes.recv().await.unwrap();
    stop_resetter.cancel();
    resetting.await.unwrap().unwrap();
    let mut rescued: Vec<i64> = out.reset.iter().map(|(id, _)| *id).collect();
    rescued.sort_unstable();
    let mut expected: Vec<i64> = dead_jobs.iter().map(|j| j.record().id).collect();
    expected.sort_unstable();
    assert_eq!(
        rescued, expected,
        "only the dead process's jobs, long before 60 s"
    );
    assert_eq!(db.count("processing").await, 1);
    assert_eq!(db.count("queued").await, 2);

    // The dead process's late write is fenced off.
    for mut job in dead_jobs {
        assert!(!store.mark_complete(&mut job).await.unwrap());
    }
    // Its row is forgotten once even the heartbeat rule would have caught up.
    sqlx::query(
        "UPDATE dbworker_nodes SET heartbeat_at = now() - interval '2 minutes' WHERE id = $1",
    )
    .bind(dead.id())
    .execute(&db.pool)
    .await
    .unwrap();
    resetter.reset_once().await.unwrap();
    assert_eq!(rows_in_registry(&db).await, 1);
    stop.cancel();
    heartbeats.await.unwrap();
    assert_eq!(rows_in_registry(&db).await, 0);
}

/// Counts leaders at once; each service records which node led.
#[derive(Default)]
struct Watch {
    now: AtomicUsize,
    most: AtomicUsize,
    /// Runs started, in every term.
    started: AtomicUsize,
    leader: std::sync::Mutex<Option<String>>,
}

/// Decrements the leader count however the service ends (even aborted).
struct Leading(Arc<Watch>);

impl Drop for Leading {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
        *self.0.leader.lock().unwrap() = None;
    }
}

fn campaign(
    election: LeaderElection,
    name: String,
    watch: Arc<Watch>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        election
            .run(stop, move |leading| {
                let watch = watch.clone();
                let name = name.clone();
                async move {
                    let n = watch.now.fetch_add(1, Ordering::SeqCst) + 1;
                    watch.most.fetch_max(n, Ordering::SeqCst);
                    *watch.leader.lock().unwrap() = Some(name);
                    let _guard = Leading(watch);
                    leading.cancelled().await;
                }
            })
            .await;
    })
}

/// `n` campaigning "processes", each on a pool of its own (another process,
/// as Postgres sees it), watched by one `Watch`.
struct Candidates {
    watch: Arc<Watch>,
    pools: Vec<sqlx::PgPool>,
    runs: Vec<Option<tokio::task::JoinHandle<()>>>,
    stops: Vec<CancellationToken>,
}

async fn candidates(db: &Db, n: usize, lease: Duration) -> Candidates {
    let watch = Arc::new(Watch::default());
    let mut c = Candidates {
        watch,
        pools: Vec::new(),
        runs: Vec::new(),
        stops: Vec::new(),
    };
    for i in 0..n {
        let pool = db.db.pool(2).await.unwrap();
        let name = format!("node-{i}");
        let mut o = LeaderOptions::new("jobs", &name);
        o.lease = lease;
        let election = LeaderElection::new(&pool, o).await.unwrap();
        let stop = CancellationToken::new();
        c.runs.push(Some(campaign(
            election,
            name,
            c.watch.clone(),
            stop.clone(),
        )));
        c.stops.push(stop);
        c.pools.push(pool);
    }
    c
}

/// Waits until a node other than `not` leads; returns it and how long it took.
async fn next_leader(watch: &Watch, not: Option<&str>) -> (String, Duration) {
    let start = Instant::now();
    loop {
        let current = watch.leader.lock().unwrap().clone();
        if let Some(l) = current
            && Some(l.as_str()) != not
        {
            return (l, start.elapsed());
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no new leader");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn one_leader_at_a_time_and_standbys_take_over_within_the_lease() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    let lease = Duration::from_millis(600);
    let Candidates {
        watch,
        pools,
        mut runs,
        stops,
    } = candidates(&db, 3, lease).await;
    let index = |name: &str| name["node-".len()..].parse::<usize>().unwrap();
    let (first, _) = next_leader(&watch, None).await;
    tokio::time::sleep(lease * 2).await;
    assert_eq!(
        watch.leader.lock().unwrap().as_deref(),
        Some(first.as_str()),
        "a leader keeps its lease"
    );
    assert_eq!(
        current_leader(&db.pool, DEFAULT_LEADER_TABLE, "jobs")
            .await
            .unwrap()
            .as_deref(),
        Some(first.as_str())
    );

    // Killed (its task aborted, nothing released): another leads once the
    // lease expires.
    runs[index(&first)].take().unwrap().abort();
    let (second, took) = next_leader(&watch, Some(&first)).await;
    println!("failover after the leader was killed: {took:?} (lease {lease:?})");
    assert!(took <= lease * 2, "took {took:?}");

    // Cut off from the database: it steps down by itself; another takes over.
    pools[index(&second)].close().await;
    let (third, took) = next_leader(&watch, Some(&second)).await;
    println!("failover after the leader lost its database: {took:?}");
    assert!(took <= lease * 2, "took {took:?}");
    assert_ne!(third, first);

    // A graceful stop releases the lease: with no one left to take it, the
    // scope has no leader at once.
    stops[index(&third)].cancel();
    runs[index(&third)].take().unwrap().await.unwrap();
    assert_eq!(
        current_leader(&db.pool, DEFAULT_LEADER_TABLE, "jobs")
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        watch.most.load(Ordering::SeqCst),
        1,
        "never two leaders at once"
    );
    for stop in stops {
        stop.cancel();
    }
}

#[tokio::test]
async fn a_graceful_leader_hands_over_within_a_third_of_the_lease() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    let lease = Duration::from_millis(900);
    let Candidates {
        watch, runs, stops, ..
    } = candidates(&db, 2, lease).await;
    let (first, _) = next_leader(&watch, None).await;
    let i = first["node-".len()..].parse::<usize>().unwrap();
    stops[i].cancel();
    let (_, took) = next_leader(&watch, Some(&first)).await;
    println!("hand-over after a graceful stop: {took:?} (lease {lease:?})");
    assert!(
        took < lease / 3 + Duration::from_millis(200),
        "took {took:?}"
    );
    assert_eq!(watch.most.load(Ordering::SeqCst), 1);
    for stop in stops {
        stop.cancel();
    }
    for run in runs.into_iter().flatten() {
        run.await.unwrap();
    }
}

/// A process says what its claims honour (`JobTable::honours`), and the
/// registry shows it; on a node table made before the `honours` column, a
/// process still registers, and readers say it did not tell.
#[tokio::test]
async fn a_process_records_the_control_tables_its_claims_honour() {
    let _shared = TIMED.read().await;
    let db = set_up().await;
    db.add_columns(
        |c| c.queue = true,
        &[
            dbworker::ddl::pause_table_sql(dbworker::control::DEFAULT_PAUSE_TABLE).unwrap(),
            dbworker::ddl::limit_table_sql(dbworker::control::DEFAULT_LIMIT_TABLE).unwrap(),
        ],
    )
    .await;
    let table = db
        .table_with(|t| t.queue_column = Some("queue".into()))
        .await;
    assert_eq!(
        table.honours(),
        ["pauses in dbworker_pauses", "limits in dbworker_limits"]
    );
    let mut o = fast_nodes(&["emails"], 2);
    o.honours = table.honours();
    let node = Node::new(&db.pool, o.clone()).await.unwrap();
    let live = live_nodes(&db.pool, DEFAULT_NODE_TABLE, Duration::from_secs(5))
        .await
        .unwrap();
    let me = live.iter().find(|n| n.id == node.id()).unwrap();
    assert_eq!(me.honours.as_deref(), Some(table.honours().as_slice()));
    node.deregister().await.unwrap();

    // A registry made before the column: registering works, nobody says.
    db.execute("ALTER TABLE dbworker_nodes DROP COLUMN honours")
        .await;
    let old = Node::new(&db.pool, o).await.unwrap();
    let live = live_nodes(&db.pool, DEFAULT_NODE_TABLE, Duration::from_secs(5))
        .await
        .unwrap();
    let me = live.iter().find(|n| n.id == old.id()).unwrap();
    assert_eq!(me.honours, None);
    old.heartbeat().await.unwrap();
}

/// A singleton of the test: counts how many run at once and records which
/// client runs it.
struct Singleton {
    client: &'static str,
    watch: Arc<Watch>,
}

impl dbworker::Service for Singleton {
    fn name(&self) -> &str {
        "singleton"
    }

    async fn run(&self, stop: CancellationToken) -> dbworker::Result<()> {
        let n = self.watch.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.watch.most.fetch_max(n, Ordering::SeqCst);
        self.watch.started.fetch_add(1, Ordering::SeqCst);
        *self.watch.leader.lock().unwrap() = Some(self.client.to_owned());
        let _guard = Leading(self.watch.clone());
        stop.cancelled().await;
        Ok(())
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Ping;
impl dbworker::JobArgs for Ping {
    const KIND: &'static str = "ping";
}
struct Pong;
impl dbworker::JobHandler for Pong {
    type Args = Ping;
    async fn handle(&self, _: dbworker::Job<'_, Ping>) -> Result<(), workerutil::HandlerError> {
        Ok(())
    }
}

/// A client's options in a cluster of fast nodes holding `lease`.
fn clustered(lease: Duration) -> dbworker::ClientOptions {
    let mut cluster = dbworker::ClusterOptions::default();
    cluster.node = fast_nodes(&[], 0);
    cluster.lease = lease;
    let mut options = dbworker::ClientOptions::default();
    options.cluster = Some(cluster);
    options
}

/// The registry's database with a typed `jobs` table, as a client takes it.
async fn typed_set_up() -> (Db, JobTable) {
    let db = set_up().await;
    db.add_columns(|c| *c = dbworker::ddl::OptionalColumns::typed(), &[])
        .await;
    let table = JobTable::new(&db.pool, JobTableOptions::typed("jobs"))
        .await
        .unwrap();
    (db, table)
}

/// Two clients of one table that join a cluster: both register, one leads,
/// and the singletons (the resetter, the purger, the application's own) run
/// on the leader only; when it shuts down the other takes them over, and the
/// registry is left empty.
#[tokio::test]
async fn clients_in_a_cluster_run_the_singletons_on_their_leader_only() {
    let _shared = TIMED.read().await;
    let (db, table) = typed_set_up().await;
    let watch = Arc::new(Watch::default());
    let mut options = clustered(Duration::from_millis(300));
    options.purge = Some(dbworker::maintenance::PurgeOptions::default());
    let mut clients = Vec::new();
    for name in ["a", "b"] {
        let pool = db.db.pool(6).await.unwrap();
        let mut o = options.clone();
        o.worker.name = name.to_owned();
        let client = dbworker::Client::builder(&pool, &table)
            .handler(Pong)
            .leader_service(Singleton {
                client: name,
                watch: watch.clone(),
            })
            .options(o)
            .build()
            .await
            .unwrap();
        client.start().unwrap();
        clients.push((name, client));
    }
    let live = live_nodes(&db.pool, DEFAULT_NODE_TABLE, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(live.len(), 2, "both clients registered: {live:?}");
    let (first, _) = next_leader(&watch, None).await;
    let lease = current_leader(&db.pool, DEFAULT_LEADER_TABLE, "jobs")
        .await
        .unwrap()
        .expect("a leader holds the table's lease");
    assert!(
        live.iter().any(|n| n.id == lease),
        "the leader is a registered node"
    );
    // The jobs a client claims carry its node id, so the resetter knows
    // them when the process dies.
    let (_, leader) = clients.iter().find(|(n, _)| *n == first).unwrap();
    leader.enqueue(Ping).await.unwrap();
    let owner: Option<String> = loop {
        let row: Option<String> =
            sqlx::query_scalar("SELECT worker_hostname FROM jobs WHERE state = 'completed'")
                .fetch_optional(&db.pool)
                .await
                .unwrap();
        if row.is_some() {
            break row;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        live.iter().any(|n| Some(&n.id) == owner.as_ref()),
        "{owner:?} names a registered node"
    );

    let at = clients.iter().position(|(n, _)| *n == first).unwrap();
    let (_, leader) = clients.remove(at);
    leader.shutdown().await.unwrap();
    let (second, took) = next_leader(&watch, Some(&first)).await;
    assert_ne!(first, second);
    // The lease was released on shutdown: a standby takes over within a
    // third of it, plus scheduling.
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert_eq!(watch.most.load(Ordering::SeqCst), 1, "never two at once");
    for (_, client) in clients {
        client.shutdown().await.unwrap();
    }
    assert_eq!(watch.now.load(Ordering::SeqCst), 0);
    assert_eq!(rows_in_registry(&db).await, 0);
}

/// A singleton whose first run panics.
struct PanicsFirst(Arc<AtomicUsize>);

impl dbworker::Service for PanicsFirst {
    fn name(&self) -> &str {
        "panics-first"
    }

    async fn run(&self, stop: CancellationToken) -> dbworker::Result<()> {
        if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("the first run panics");
        }
        stop.cancelled().await;
        Ok(())
    }
}

/// A leader's singletons share the term: one that panics is run again, and
/// takes none of the others down with it (before, the whole term unwound —
/// the resetter, the purger and the application's own singletons gone while
/// the process kept the lease, so no standby took over). Outside a cluster,
/// where each service has a task of its own, one that panics is run again
/// too (before, it was gone for good).
#[tokio::test]
async fn a_panicking_singleton_is_run_again_and_stops_no_other() {
    let _shared = TIMED.read().await;
    let (db, table) = typed_set_up().await;
    // A long lease: no new term restarts the services meanwhile.
    for (how, options) in [
        ("in a cluster", clustered(Duration::from_secs(30))),
        ("alone", dbworker::ClientOptions::default()),
    ] {
        let watch = Arc::new(Watch::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let client = dbworker::Client::builder(&db.pool, &table)
            .handler(Pong)
            .leader_service(Singleton {
                client: "a",
                watch: watch.clone(),
            })
            .leader_service(PanicsFirst(runs.clone()))
            .options(options)
            .build()
            .await
            .unwrap();
        client.start().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while runs.load(Ordering::SeqCst) < 2 {
            assert!(
                Instant::now() < deadline,
                "{how}: the panicking singleton was not run again ({} runs)",
                runs.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            (
                watch.now.load(Ordering::SeqCst),
                watch.started.load(Ordering::SeqCst)
            ),
            (1, 1),
            "{how}: the other singleton runs on, never stopped (running, started)"
        );
        client.shutdown().await.unwrap();
        assert_eq!(watch.now.load(Ordering::SeqCst), 0, "{how}");
    }
}

/// Bad cluster options are refused when the client is built, naming the
/// field, and leave no registry row behind (the node registers before the
/// election checks its lease).
#[tokio::test]
async fn a_client_refuses_bad_cluster_options_and_leaves_no_row() {
    let _shared = TIMED.read().await;
    let (db, table) = typed_set_up().await;
    let build = async |set: &dyn Fn(&mut dbworker::ClusterOptions)| {
        let mut cluster = dbworker::ClusterOptions::default();
        cluster.node = fast_nodes(&[], 0);
        set(&mut cluster);
        let mut options = dbworker::ClientOptions::default();
        options.cluster = Some(cluster);
        dbworker::Client::builder(&db.pool, &table)
            .handler(Pong)
            .options(options)
            .build()
            .await
    };
    let short_lease = build(&|c| c.lease = Duration::from_millis(1)).await;
    assert!(
        matches!(
            short_lease,
            Err(dbworker::Error::InvalidOption { field: "lease", .. })
        ),
        "{short_lease:?}"
    );
    assert_eq!(
        rows_in_registry(&db).await,
        0,
        "the refused client's row is gone"
    );
    let hasty = build(&|c| c.node.dead_after = c.node.heartbeat_interval).await;
    assert!(
        matches!(
            hasty,
            Err(dbworker::Error::InvalidOption {
                field: "dead_after",
                ..
            })
        ),
        "{hasty:?}"
    );
    // A time the clock arithmetic cannot hold is refused, not a panic.
    let forever = build(&|c| c.node.dead_after = Duration::MAX).await;
    assert!(
        matches!(
            forever,
            Err(dbworker::Error::InvalidOption {
                field: "dead_after",
                ..
            })
        ),
        "{forever:?}"
    );
    let no_table = build(&|c| c.leader_table = "no_such_leaders".into()).await;
    let message = no_table.map(|_| ()).unwrap_err().to_string();
    assert!(message.contains("no_such_leaders"), "{message}");
    assert_eq!(rows_in_registry(&db).await, 0);
    // Good options register at build; a client shut down without ever
    // starting removes its row.
    let client = build(&|_| {}).await.unwrap();
    assert_eq!(rows_in_registry(&db).await, 1);
    client.shutdown().await.unwrap();
    assert_eq!(rows_in_registry(&db).await, 0);
}
