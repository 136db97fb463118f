//! PgBouncer in transaction mode in front of a test database: its ini in a
//! temporary directory, started from PATH or /usr/sbin, stopped on drop.
//! Tests that use it skip, saying why, when pgbouncer is not installed
//! ([`find`], [`Bouncer::start_or_skip`]); `.ci/run` installs it.

use std::fs;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;

/// A running PgBouncer; killed and its directory removed on drop.
#[derive(Debug)]
pub struct Bouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
    database: String,
    /// Its server connections (`default_pool_size`), when it was started
    /// with a known number.
    server_connections: u32,
}

/// The pgbouncer binary, or why the test cannot run.
pub fn find() -> Result<PathBuf, String> {
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("pgbouncer"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin/pgbouncer")])
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "pgbouncer is not installed (apt-get install pgbouncer; .ci/run installs it)".to_owned()
        })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The uid and gid of `postgres` from /etc/passwd: PgBouncer refuses to run as root.
fn postgres_user() -> Option<(u32, u32)> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.first() == Some(&"postgres"))
            .then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))?
    })
}

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// The password in `url` (`postgres://user:password@host/...`), if any.
fn password(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let userinfo = rest.split_once('@')?.0;
    userinfo.split_once(':').map(|(_, p)| p.to_owned())
}

impl Bouncer {
    /// Starts PgBouncer in transaction mode with `pool_size` server
    /// connections in front of the database at `url`; `ignore_float_digits`:
    /// with `ignore_startup_parameters = extra_float_digits`, which sqlx needs.
    pub fn start(binary: &Path, url: &str, pool_size: u32, ignore_float_digits: bool) -> Bouncer {
        Bouncer::start_for(binary, url, pool_size, ignore_float_digits, false)
    }

    /// Like [`Bouncer::start`] (`extra_float_digits` ignored), serving every database of the
    /// server at `url` by its own name (a `*` entry in `[databases]`): for programs that create
    /// their database first, as the examples do (see `TestDatabase::pool`).
    pub fn start_for_any_database(binary: &Path, url: &str, pool_size: u32) -> Bouncer {
        Bouncer::start_for(binary, url, pool_size, true, true)
    }

    /// The address clients connect to, `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn start_for(
        binary: &Path,
        url: &str,
        pool_size: u32,
        ignore_float_digits: bool,
        any_database: bool,
    ) -> Bouncer {
        let target = PgConnectOptions::from_str(url).expect("the test database's url");
        let database = target.get_database().expect("a database name").to_owned();
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("dbworker-pgbouncer-{}-{port}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let host = target.get_host();
        let host = if host.starts_with('/') {
            "127.0.0.1"
        } else {
            host
        };
        let mut server = format!(
            "host={host} port={} user={}",
            target.get_port(),
            target.get_username()
        );
        if let Some(p) = password(url) {
            server.push_str(&format!(" password={p}"));
        }
        let entry = if any_database {
            format!("* = {server}")
        } else {
            format!("{database} = {server} dbname={database}")
        };
        let ini = format!(
            "[databases]\n{entry}\n\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = any\npool_mode = transaction\n\
             default_pool_size = {pool_size}\nmin_pool_size = 0\nreserve_pool_size = 0\n\
             max_client_conn = 500\nserver_reset_query =\n\
             {ignore}\n\
             logfile = {log}\npidfile = {pid}\n",
            ignore = if ignore_float_digits {
                "ignore_startup_parameters = extra_float_digits"
            } else {
                ""
            },
            log = dir.join("pgbouncer.log").display(),
            pid = dir.join("pgbouncer.pid").display(),
        );
        let mut bouncer = Bouncer::run(binary, dir, port, database, &ini);
        bouncer.server_connections = pool_size;
        bouncer
    }

    /// Starts PgBouncer with the ini `make_ini(dir, port)` writes: `dir` is
    /// its own temporary directory (for its log, pid and auth files), `port`
    /// a free one to listen on. Clients reach `database` through it.
    pub fn start_with_ini(
        binary: &Path,
        database: &str,
        make_ini: impl FnOnce(&Path, u16) -> String,
    ) -> Bouncer {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("dbworker-pgbouncer-{}-{port}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let ini = make_ini(&dir, port);
        Bouncer::run(binary, dir, port, database.to_owned(), &ini)
    }

    fn run(binary: &Path, dir: PathBuf, port: u16, database: String, ini: &str) -> Bouncer {
        let ini_path = dir.join("pgbouncer.ini");
        fs::write(&ini_path, ini).unwrap();
        let mut command = Command::new(binary);
        command
            .arg(&ini_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if is_root() {
            let (uid, gid) = postgres_user().expect("a postgres system user to run pgbouncer as");
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
            std::os::unix::fs::chown(&ini_path, Some(uid), Some(gid)).unwrap();
            command.uid(uid).gid(gid);
        }
        let child = command.spawn().expect("starting pgbouncer");
        let bouncer = Bouncer {
            child,
            dir,
            port,
            database,
            server_connections: 0,
        };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "pgbouncer did not listen within 10 s: {}",
                bouncer.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        bouncer
    }

    /// A URL through PgBouncer to the database.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.port, self.database
        )
    }

    /// Starts PgBouncer in transaction mode (`pool_size` server connections,
    /// `extra_float_digits` ignored) in front of `url`, or prints why `test`
    /// is skipped and returns `None` when pgbouncer is not installed.
    pub fn start_or_skip(test: &str, url: &str, pool_size: u32) -> Option<Bouncer> {
        match find() {
            Ok(binary) => Some(Bouncer::start(&binary, url, pool_size, true)),
            Err(reason) => {
                crate::skip(test, &reason);
                None
            }
        }
    }

    /// A pool of at most `max` client connections through PgBouncer.
    pub async fn pool(&self, max: u32) -> sqlx::PgPool {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(max)
            .connect(&self.url())
            .await
            .expect("a pool through PgBouncer")
    }

    /// Does what any sqlx program with default statements does through a
    /// pooler: prepares statements under sqlx's names (`sqlx_s_1` …
    /// `sqlx_s_60`) and leaves them there, on every server connection (one
    /// transaction per server connection held at once), where PgBouncer
    /// before 1.21 keeps them for the next client. Returns how many it left
    /// on one of them.
    pub async fn leave_named_statements(&self) -> i64 {
        use sqlx::Row;
        let n = self.server_connections.max(1);
        let other = self.pool(n).await;
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n as usize));
        let mut clients = Vec::new();
        for _ in 0..n {
            let (other, barrier) = (other.clone(), barrier.clone());
            clients.push(tokio::spawn(async move {
                let mut tx = other.begin().await.expect("a transaction");
                barrier.wait().await;
                for i in 0..60_i64 {
                    let sql = format!("SELECT $1::bigint + {i}");
                    let got: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                        .bind(i)
                        .fetch_one(&mut *tx)
                        .await
                        .expect("another program's statement");
                    assert_eq!(got, 2 * i);
                }
                barrier.wait().await;
                tx.commit().await.expect("commit");
            }));
        }
        for c in clients {
            c.await.expect("a client of the other program");
        }
        // Dropped without closing: the server connections keep them.
        drop(other);
        // A simple query prepares nothing of its own.
        sqlx::raw_sql("SELECT count(*) FROM pg_prepared_statements")
            .fetch_one(&self.pool(1).await)
            .await
            .expect("the count")
            .get(0)
    }

    /// PgBouncer's counts for the database since it started, from its
    /// console's `SHOW STATS` (`auth_type = any` lets any user in):
    /// (transactions, queries), where each exchange ending in a
    /// ReadyForQuery is one query.
    pub async fn counts(&self) -> (i64, i64) {
        use sqlx::{Connection, Row};
        let console = format!("postgres://postgres@127.0.0.1:{}/pgbouncer", self.port);
        let mut conn = sqlx::PgConnection::connect(&console)
            .await
            .expect("PgBouncer's console");
        // The console speaks only the simple protocol; its rows are text.
        let rows = sqlx::raw_sql("SHOW STATS")
            .fetch_all(&mut conn)
            .await
            .expect("SHOW STATS");
        let text = |row: &sqlx::postgres::PgRow, column: &str| -> String {
            row.try_get_unchecked(column).expect(column)
        };
        let row = rows
            .iter()
            .find(|r| text(r, "database") == self.database)
            .expect("the database's row");
        let count = |column| text(row, column).parse().expect("a count");
        (count("total_xact_count"), count("total_query_count"))
    }

    /// PgBouncer's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("PgBouncer's log:\n{}", self.log());
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}
