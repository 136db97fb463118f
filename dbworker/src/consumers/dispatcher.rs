//! `LogDispatcher`: one reader of a log's head per process (per events table),
//! shared by every consumer group of the process. It reads the head (the last
//! final event in reading order, see [`LogPoint`]) every `poll_interval`, or,
//! with `listen`, on each NOTIFY and at least every `reconcile_interval` (a
//! lost notification is then seen within that bound), and wakes the groups
//! when the head moves. While committed events wait behind a writer
//! transaction that is still running, it reads again soon (from 5 ms, doubling
//! up to the interval): that transaction's end moves the head, and no insert
//! announces it. A group's store asks
//! the database only about consumers that are behind the head, so idle
//! consumers cost nothing: N idle consumers make one head read per interval,
//! not N reads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use sqlx::{PgPool, Row};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use workerutil::{WakeupSender, Wakeups};

use crate::columns::Relation;
use crate::error::{Error, Result};
use crate::runner::{Next, Pass, Runner};
use crate::sql::{self, LogTables};

use super::options::DEFAULT_TRANSACTION_COLUMN;
use crate::consumers::slice::LogPoint;

/// How the process's dispatcher of one events table reads its head.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DispatcherOptions {
    /// The events table, with an optional alias (`"events e"`).
    pub events_table: String,
    /// The global position column. Default `global_position`.
    pub position_column: String,
    /// The events' transaction column (`xid8`). Default `transaction_id`.
    pub transaction_column: String,
    /// Poll mode (no `listen`): how often the head is read. Default 200 ms
    /// (the latency floor of poll mode).
    pub poll_interval: Duration,
    /// Notify mode: the channel the events table's trigger notifies. `None`
    /// (the default): poll mode.
    pub listen: Option<String>,
    /// Notify mode: the head is read at least this often even when no
    /// notification comes, so an event whose NOTIFY was lost (a listener
    /// reconnecting, an insert that bypassed the trigger) is still seen within
    /// about this bound. Default 1 s.
    pub reconcile_interval: Duration,
    /// How long the listener waits for a connection. Default 5 s.
    pub connect_timeout: Duration,
}

impl DispatcherOptions {
    /// Poll-mode options for `events_table`, with defaults.
    pub fn new(events_table: impl Into<String>) -> Self {
        DispatcherOptions {
            events_table: events_table.into(),
            position_column: "global_position".into(),
            transaction_column: DEFAULT_TRANSACTION_COLUMN.into(),
            poll_interval: Duration::from_millis(200),
            listen: None,
            reconcile_interval: Duration::from_secs(1),
            connect_timeout: crate::table::DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        self.tables().map(|_| ())
    }

    fn tables(&self) -> Result<LogTables> {
        let invalid = |field, reason: &str| {
            Err(Error::InvalidOption {
                field,
                reason: reason.to_owned(),
            })
        };
        let events = Relation::parse("events_table", &self.events_table)?;
        let position_column =
            crate::columns::column_name("position_column", &self.position_column)?;
        let transaction_column =
            crate::columns::column_name("transaction_column", &self.transaction_column)?;
        if self.poll_interval < Duration::from_millis(1) {
            return invalid("poll_interval", "must be at least 1 ms");
        }
        if self.reconcile_interval < Duration::from_millis(1) {
            return invalid("reconcile_interval", "must be at least 1 ms");
        }
        Error::check_max_durations([
            ("poll_interval", self.poll_interval),
            ("reconcile_interval", self.reconcile_interval),
            ("connect_timeout", self.connect_timeout),
        ])?;
        if let Some(ch) = &self.listen
            && !crate::columns::is_identifier(ch)
        {
            return invalid("listen", "must be a plain identifier");
        }
        // Only the events table and its position are read.
        Ok(LogTables {
            column_expressions: Vec::new(),
            assignments: events.clone(),
            checkpoints: events.clone(),
            events,
            position_column,
            transaction_column,
            type_column: String::new(),
        })
    }
}

/// The process's reader of a log's head; see the module docs. Clones share
/// one task, which stops when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct LogDispatcher {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// The last head read; `None` until the first read, and after a failed one
    /// (stores then ask the database on every claim, as without a dispatcher).
    head: watch::Receiver<Option<LogPoint>>,
    wake: Arc<WakeupSender>,
    reads: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The running dispatchers of this process, by database and options.
fn registry() -> &'static Mutex<HashMap<String, Weak<Shared>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Weak<Shared>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl LogDispatcher {
    /// The process's dispatcher for this database and these options: the
    /// running one if a group already started it, else a new one (its task
    /// reads the head through `pool`).
    pub async fn new(pool: &PgPool, options: DispatcherOptions) -> Result<LogDispatcher> {
        let tables = options.tables()?;
        let connect = pool.connect_options();
        let key = format!(
            "{}:{}/{} as {} {options:?}",
            connect.get_host(),
            connect.get_port(),
            connect.get_database().unwrap_or_default(),
            connect.get_username(),
        );
        {
            let mut running = registry().lock().expect("not poisoned");
            running.retain(|_, d| d.strong_count() > 0);
            if let Some(shared) = running.get(&key).and_then(Weak::upgrade) {
                return Ok(LogDispatcher { shared });
            }
        }
        crate::schema_check::none(
            crate::schema_check::missing_columns(
                pool,
                &tables.events,
                "events table",
                &[&tables.position_column, &tables.transaction_column],
                "",
            )
            .await?,
        )?;
        let mut running = registry().lock().expect("not poisoned");
        // Another group may have started one while this one checked.
        if let Some(shared) = running.get(&key).and_then(Weak::upgrade) {
            return Ok(LogDispatcher { shared });
        }
        let (head_tx, head) = watch::channel(None);
        let wake = Arc::new(WakeupSender::new());
        let reads = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let task = Task {
            pool: pool.clone(),
            tables,
            head: head_tx,
            wake: wake.clone(),
            reads: reads.clone(),
            stop: stop.clone(),
        };
        tokio::spawn(task.run(options));
        let shared = Arc::new(Shared {
            head,
            wake,
            reads,
            stop,
        });
        running.insert(key, Arc::downgrade(&shared));
        Ok(LogDispatcher { shared })
    }

    /// The last head read (`None` before the first read or after a failed one).
    pub fn head(&self) -> Option<LogPoint> {
        *self.shared.head.borrow()
    }

    /// How many times this dispatcher has read the head: one statement each.
    pub fn head_reads(&self) -> u64 {
        self.shared.reads.load(Ordering::Relaxed)
    }

    /// Whether `other` is the same dispatcher (shares one task).
    pub fn same_as(&self, other: &LogDispatcher) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Wakes the groups after `delay`: a consumer left behind the head by a
    /// full slice starts its next one once its pause is over.
    pub(crate) fn wake_after(&self, delay: Duration) {
        let wake = self.shared.wake.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            wake.wake();
        });
    }

    /// Wake-ups sent whenever the head moves.
    pub(crate) fn wakeups(&self) -> Wakeups {
        self.shared.wake.subscribe()
    }
}

struct Task {
    pool: PgPool,
    tables: LogTables,
    head: watch::Sender<Option<LogPoint>>,
    wake: Arc<WakeupSender>,
    reads: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl Task {
    async fn run(self, options: DispatcherOptions) {
        let name = format!("dispatcher:{}", options.events_table);
        // Notify mode: the listener's wake-ups trigger reads between the
        // reconciliation reads; dropping `_listener` stops it.
        let (notified, _listener) = match &options.listen {
            Some(channel) => {
                let (w, task) = crate::notify::spawn_listener(
                    &self.pool,
                    channel.clone(),
                    name.clone(),
                    options.connect_timeout,
                    Default::default(),
                );
                (Some(w), Some(task))
            }
            None => (None, None),
        };
        let interval = match notified {
            Some(_) => options.reconcile_interval,
            None => options.poll_interval,
        };
        // No back-off: while the head cannot be read every store asks the
        // database itself, so this one read per interval is the cheap part,
        // and reading again soon is what brings the cheap mode back.
        let mut runner = Runner::every(interval);
        if let Some(w) = notified {
            runner = runner.woken_by(w);
        }
        let mut reads = HeadReads {
            task: &self,
            name,
            interval,
            soon: None,
        };
        runner.run(&self.stop, &mut reads).await;
    }

    /// Reads the head and wakes the groups if it moved; returns whether
    /// committed events wait behind a running transaction.
    async fn read_once(&self, name: &str) -> bool {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let read = sql::log_head(&self.tables)
            .fetch_one(&self.pool)
            .await
            .map(|row| {
                (
                    LogPoint::new(row.get(sql::LOG_HEAD_XID), row.get(sql::LOG_HEAD)),
                    row.get::<bool, _>(sql::LOG_WAITING),
                )
            });
        match read {
            Ok((head, waiting)) => {
                self.wake.set_live(true);
                let moved = self.head.send_if_modified(|h| {
                    let moved = *h != Some(head);
                    *h = Some(head);
                    moved
                });
                if moved {
                    self.wake.wake();
                }
                waiting
            }
            Err(err) => {
                tracing::warn!(dispatcher = %name, error = %err, "cannot read the log's head; consumers check the database themselves until it is back");
                self.head.send_replace(None);
                self.wake.set_live(false);
                false
            }
        }
    }
}

/// The dispatcher's task as the runner sees it: one head read per pass.
struct HeadReads<'a> {
    task: &'a Task,
    /// The dispatcher's name, for the logs.
    name: String,
    interval: Duration,
    /// While events wait behind a running writer: the next read's delay.
    soon: Option<Duration>,
}

impl Pass for HeadReads<'_> {
    fn span(&self) -> tracing::Span {
        tracing::info_span!("dispatcher", dispatcher = %self.name)
    }

    async fn pass(&mut self) -> Next {
        let waiting = self.task.read_once(&self.name).await;
        self.soon = waiting.then(|| {
            self.soon
                .map_or(Duration::from_millis(5), |d| d * 2)
                .min(self.interval)
        });
        self.soon.map_or(Next::Interval, Next::After)
    }
}
