//! Many hosts, for real: `cluster_node` processes, each in its own Linux
//! network namespace with its own address (a veth pair to the host, where
//! Postgres listens), share one database while processes are SIGKILLed, cut
//! off (link down) and brought back, and new ones join. Every job's effect and
//! every consumer's projection of every event must be committed exactly once;
//! leader failover and rebalancing times are printed.
//!
//! Needs root and `ip` (iproute2): otherwise it prints why and skips. It only
//! touches the namespaces and links it creates (named after this process),
//! and removes them at the end, also on failure.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dbworker_testkit::{TestDatabase, ThrowawayServer};
use sqlx::PgPool;

/// `target/<profile>/examples/NAME`, built by `cargo test` alongside this test.
fn example(name: &str) -> PathBuf {
    let mut dir = std::env::current_exe().expect("test binary path");
    dir.pop();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join("examples").join(name)
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Why this machine cannot run the test, if it cannot.
fn unsupported() -> Option<String> {
    // SAFETY-free check: root is uid 0; `id -u` avoids a libc dependency.
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not running as root".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("`ip` (iproute2) is not installed".into());
    }
    let probe = format!("dbwprobe{}", std::process::id());
    if let Err(e) = ip(&["netns", "add", &probe]) {
        return Some(format!("cannot create a network namespace: {e}"));
    }
    let _ = ip(&["netns", "del", &probe]);
    None
}

/// The namespaces and links this test created; removed on drop.
struct Net {
    tag: String,
    hosts: Vec<usize>,
}

impl Net {
    fn ns(&self, n: usize) -> String {
        format!("dbw{}n{n}", self.tag)
    }

    fn host_link(&self, n: usize) -> String {
        format!("dbw{}h{n}", self.tag)
    }

    /// The address Postgres is reached at from host `n`.
    fn server_addr(n: usize) -> String {
        format!("10.231.{n}.1")
    }

    /// A namespace with a veth pair: 10.231.n.2 inside, 10.231.n.1 outside.
    fn add_host(&mut self, n: usize) -> Result<(), String> {
        let (ns, host, peer) = (
            self.ns(n),
            self.host_link(n),
            format!("dbw{}p{n}", self.tag),
        );
        self.hosts.push(n);
        ip(&["netns", "add", &ns])?;
        ip(&["link", "add", &host, "type", "veth", "peer", "name", &peer])?;
        ip(&["link", "set", &peer, "netns", &ns])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/24", Net::server_addr(n)),
            "dev",
            &host,
        ])?;
        ip(&["link", "set", &host, "up"])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("10.231.{n}.2/24"),
            "dev",
            &peer,
        ])?;
        ip(&["-n", &ns, "link", "set", &peer, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        Ok(())
    }

    fn set_link(&self, n: usize, up: bool) -> Result<(), String> {
        ip(&[
            "link",
            "set",
            &self.host_link(n),
            if up { "up" } else { "down" },
        ])
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for &n in &self.hosts {
            let _ = ip(&["link", "del", &self.host_link(n)]);
            let _ = ip(&["netns", "del", &self.ns(n)]);
        }
    }
}

/// A `cluster_node` process inside namespace `n`; killed on drop.
struct NodeProcess {
    child: Child,
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_node(net: &Net, n: usize, url: &str) -> NodeProcess {
    let child = Command::new("ip")
        .args(["netns", "exec", &net.ns(n)])
        .arg(example("cluster_node"))
        .args(["--join", url])
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start cluster_node");
    NodeProcess { child }
}

async fn scalar(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

async fn leader(pool: &PgPool) -> Option<String> {
    sqlx::query_scalar(
        "SELECT node_id FROM dbworker_leaders WHERE scope = 'jobs' AND expires_at > now()",
    )
    .fetch_optional(pool)
    .await
    .unwrap()
}

/// The live node (by registry) running on namespace `n`'s process `pid`.
async fn node_of(pool: &PgPool, pid: u32) -> Option<String> {
    sqlx::query_scalar("SELECT id FROM dbworker_nodes WHERE pid = $1")
        .bind(i32::try_from(pid).unwrap())
        .fetch_optional(pool)
        .await
        .unwrap()
}

async fn wait_until(
    pool: &PgPool,
    what: &str,
    limit: Duration,
    mut done: impl AsyncFnMut() -> bool,
) -> Duration {
    let start = Instant::now();
    while !done().await {
        if start.elapsed() > limit {
            panic!(
                "timed out waiting for {what}; the cluster:\n{}",
                dump(pool).await
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

/// The coordination tables and sessions, for a failure message.
async fn dump(pool: &PgPool) -> String {
    let mut out = String::new();
    for sql in [
        "SELECT id || ' heartbeat ' || round(EXTRACT(EPOCH FROM now() - heartbeat_at)::numeric, 1) || ' s ago' FROM dbworker_nodes ORDER BY id",
        "SELECT scope || ' led by ' || node_id || ' for ' || round(EXTRACT(EPOCH FROM expires_at - now())::numeric, 1) || ' s more' FROM dbworker_leaders",
        "SELECT consumer_name || ' on ' || node_id FROM dbworker_consumer_assignments ORDER BY 1",
        "SELECT consumer_name || ' at ' || last_position FROM dbworker_consumer_checkpoints ORDER BY 1",
        "SELECT state || ' ' || count(*) FROM jobs GROUP BY state",
        "SELECT client_addr || ' ' || state || ' ' || COALESCE(wait_event_type, '-') || ' ' || left(query, 90) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
    ] {
        let rows: Vec<Option<String>> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_all(pool)
            .await
            .unwrap_or_default();
        for r in rows.into_iter().flatten() {
            out.push_str(&r);
            out.push('\n');
        }
        out.push_str("--\n");
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_in_separate_network_namespaces_process_everything_exactly_once() {
    if let Some(why) = unsupported() {
        dbworker_testkit::skip("the network-namespace test", &why);
        return;
    }
    // Backends of cut-off processes are noticed dead within a few seconds.
    let server = ThrowawayServer::start(&[
        "listen_addresses=*",
        "tcp_keepalives_idle=2",
        "tcp_keepalives_interval=1",
        "tcp_keepalives_count=2",
    ])
    .expect("throwaway server");
    let hba = server.data_dir().join("pg_hba.conf");
    let mut conf = std::fs::read_to_string(&hba).unwrap();
    conf.push_str("\nhost all all 10.231.0.0/16 trust\n");
    std::fs::write(&hba, conf).unwrap();
    let db = TestDatabase::new_on(server.admin_url()).await.unwrap();
    let pool = db.pool(4).await.unwrap();
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&pool)
        .await
        .unwrap();
    let setup = Command::new(example("cluster_node"))
        .args(["--setup", "--join", db.url()])
        .status()
        .unwrap();
    assert!(setup.success());

    let mut net = Net {
        tag: format!("{}", std::process::id() % 100_000),
        hosts: Vec::new(),
    };
    let port = url::Url::parse(db.url()).unwrap().port().unwrap();
    let name = url::Url::parse(db.url())
        .unwrap()
        .path()
        .trim_start_matches('/')
        .to_owned();
    let url_for = |n: usize| format!("postgres://postgres@{}:{port}/{name}", Net::server_addr(n));
    let mut nodes = Vec::new();
    for n in 0..3 {
        net.add_host(n).unwrap();
        nodes.push(start_node(&net, n, &url_for(n)));
    }
    let started = Instant::now();
    wait_until(&pool, "three live nodes", Duration::from_secs(30), async || {
        scalar(&pool, "SELECT count(*) FROM dbworker_nodes WHERE heartbeat_at > now() - interval '1 second'").await == 3
    })
    .await;
    wait_until(&pool, "progress", Duration::from_secs(60), async || {
        scalar(&pool, "SELECT count(*) FROM jobs WHERE state = 'completed'").await >= 300
    })
    .await;

    // SIGKILL the leader's process: another leads within the lease (1.5 s) and a third.
    let first = leader(&pool).await.expect("a leader");
    let mut leader_index = None;
    for (i, p) in nodes.iter().enumerate() {
        if node_of(&pool, p.child.id()).await.as_deref() == Some(first.as_str()) {
            leader_index = Some(i);
        }
    }
    let killed = leader_index.expect("the leader is one of the nodes");
    let mut doomed = nodes.remove(killed);
    doomed.child.kill().unwrap();
    let _ = doomed.child.wait();
    let failover = wait_until(&pool, "a new leader", Duration::from_secs(10), async || {
        leader(&pool).await.is_some_and(|l| l != first)
    })
    .await;
    println!("leader failover after SIGKILL: {failover:?} (lease 1.5 s)");

    // Cut another process off for 4 s (its link down), then bring it back.
    let cut = net.hosts[if killed == 0 { 1 } else { 0 }];
    net.set_link(cut, false).unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    net.set_link(cut, true).unwrap();

    // A new process joins on a fourth host: with four consumers over at most
    // three live processes, it gets at least one.
    net.add_host(3).unwrap();
    let joined = Instant::now();
    nodes.push(start_node(&net, 3, &url_for(3)));
    let last = nodes.last().unwrap().child.id();
    let rebalance = wait_until(
        &pool,
        "consumers on the new node",
        Duration::from_secs(30),
        async || match node_of(&pool, last).await {
            Some(id) => {
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM dbworker_consumer_assignments WHERE node_id = $1",
                )
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
                    > 0
            }
            None => false,
        },
    )
    .await;
    println!(
        "rebalanced onto a joining process in {rebalance:?} (from its start: {:?})",
        joined.elapsed()
    );

    let total = wait_until(
        &pool,
        "every job and event",
        Duration::from_secs(120),
        async || {
            scalar(&pool, "SELECT count(*) FROM jobs WHERE state = 'completed'").await == 2000
                && scalar(
                    &pool,
                    "SELECT COALESCE(min(last_position), 0) FROM dbworker_consumer_checkpoints",
                )
                .await
                    == 2000
                && scalar(&pool, "SELECT count(*) FROM dbworker_consumer_checkpoints").await == 4
        },
    )
    .await;
    println!(
        "all 2000 jobs and 4 × 2000 events done {:?} after the start",
        started.elapsed()
    );
    let _ = total;

    let effects = scalar(&pool, "SELECT count(*) FROM effects").await;
    let distinct = scalar(&pool, "SELECT count(DISTINCT job_id) FROM effects").await;
    assert_eq!(
        (effects, distinct),
        (2000, 2000),
        "each job's effect exactly once"
    );
    let projected = scalar(&pool, "SELECT count(*) FROM projection").await;
    let distinct = scalar(
        &pool,
        "SELECT count(DISTINCT (consumer, position)) FROM projection",
    )
    .await;
    assert_eq!(
        (projected, distinct),
        (8000, 8000),
        "each event once per consumer"
    );
    let hosts = scalar(&pool, "SELECT count(DISTINCT node) FROM effects").await;
    println!("jobs ran on {hosts} processes");
    assert!(hosts >= 3, "the work was shared");
    drop(nodes);
    drop(net);
}
