//! LISTEN/NOTIFY wake-ups: the channel a job table is notified on and the
//! listener that wakes idle workers (the trigger's DDL is in `ddl/notify.rs`).

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio_util::sync::CancellationToken;
use workerutil::{WakeupSender, Wakeups};

use crate::columns::{Relation, bounded_name, is_identifier};
use crate::error::{Error, Result};
use crate::sql::Pooler;

/// Whether a store listens for notifications, and on which channel. In a
/// config file: `"off"`, `"table_channel"` or `{ "channel": "name" }`.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Listen {
    /// No listener: workers poll every `interval`. The default.
    #[default]
    Off,
    /// Listen on the channel derived from the table name
    /// ([`default_notify_channel`]), the one [`notify_trigger_sql`](crate::ddl::notify_trigger_sql) notifies.
    TableChannel,
    /// Listen on this channel (a plain identifier of at most 63 bytes).
    Channel(String),
}

/// The channel a table's jobs are announced on by default: `dbworker_<table>`
/// (shortened with a hash to Postgres's 63-byte limit for long names).
///
/// ```
/// assert_eq!(dbworker::default_notify_channel("app.email_jobs j").unwrap(), "dbworker_email_jobs");
/// ```
pub fn default_notify_channel(table_name: &str) -> Result<String> {
    let rel = Relation::parse("table_name", table_name)?;
    Ok(channel_for(&rel))
}

pub(crate) fn channel_for(rel: &Relation) -> String {
    bounded_name(&format!("dbworker_{}", rel.name))
}

impl Listen {
    /// The channel to listen on, if any.
    pub(crate) fn resolve(&self, table: &Relation) -> Result<Option<String>> {
        match self {
            Listen::Off => Ok(None),
            Listen::TableChannel => Ok(Some(channel_for(table))),
            Listen::Channel(name) if is_identifier(name) => Ok(Some(name.clone())),
            Listen::Channel(name) => Err(Error::InvalidOption {
                field: "listen",
                reason: format!("channel {name:?} is not a plain identifier of at most 63 bytes"),
            }),
        }
    }
}

/// The first wait before reconnecting a lost listener, and the cap it doubles to.
const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// The running listener task. Dropping it stops the task; [`close`](Self::close)
/// also waits until its connection is closed, so a server stopped right after
/// sees a clean disconnect rather than a connection still in use.
#[derive(Debug)]
pub(crate) struct ListenerTask {
    stop: CancellationToken,
    /// Wakes the store's workers (the listener does on each notification).
    sender: std::sync::Arc<WakeupSender>,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl ListenerTask {
    /// Something other than a notification made jobs claimable: wake the
    /// store's workers as a notification would.
    pub(crate) fn waker(&self) -> std::sync::Arc<WakeupSender> {
        self.sender.clone()
    }

    /// Stops the task and waits for its connection to close.
    pub(crate) async fn close(&self) {
        self.stop.cancel();
        let task = self.task.lock().expect("not poisoned").take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl Drop for ListenerTask {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Starts the listener task: one dedicated connection (outside the store's
/// pool, since it is held for good) that LISTENs on `channel` and wakes the
/// store's workers. It reconnects by itself; while it is down, the wake-ups
/// are not live and workers poll. It stops when the task handle is dropped
/// or closed.
pub(crate) fn spawn_listener(
    pool: &PgPool,
    channel: String,
    store: String,
    connect_timeout: Duration,
    told: Told,
) -> (Wakeups, ListenerTask) {
    let sender = std::sync::Arc::new(WakeupSender::new());
    let wakeups = sender.subscribe();
    let task_sender = sender.clone();
    let stop = CancellationToken::new();
    let Some(connect) = listen_options(pool, &channel, &store) else {
        let task = ListenerTask {
            stop,
            sender,
            task: std::sync::Mutex::new(None),
        };
        return (wakeups, task);
    };
    let task_stop = stop.clone();
    let task = tokio::spawn(async move {
        // One pool for the task's whole life, closed (awaited) when it stops.
        let listen_pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .acquire_timeout(connect_timeout)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_lazy_with(connect);
        listen(
            &listen_pool,
            &channel,
            &store,
            &task_sender,
            &task_stop,
            &told,
        )
        .await;
        listen_pool.close().await;
    });
    let task = ListenerTask {
        stop,
        sender,
        task: std::sync::Mutex::new(Some(task)),
    };
    (wakeups, task)
}

/// The connection options the listener connects with: the pool's, or behind
/// a transaction pooler the `listen_url` of [`Pooler::Transaction`]
/// (`LISTEN` needs a session); `None`, said once in the log, when there is
/// none, and the workers poll.
fn listen_options(pool: &PgPool, channel: &str, store: &str) -> Option<PgConnectOptions> {
    match Pooler::of(pool) {
        Pooler::Transaction {
            listen_url: Some(url),
        } => match url.parse::<PgConnectOptions>() {
            Ok(options) => Some(options),
            Err(err) => {
                tracing::warn!(store = %store, channel = %channel, error = %err, "the pooler's listen_url is not a valid connection string; workers poll instead of listening");
                None
            }
        },
        Pooler::Transaction { listen_url: None } => {
            tracing::warn!(store = %store, channel = %channel, "LISTEN needs a session, which a transaction pooler does not keep: workers poll instead of listening (set listen_url in Pooler::Transaction, or DBWORKER_LISTEN_URL, to a direct or session-mode connection string)");
            None
        }
        _ => Some((*pool.connect_options()).clone()),
    }
}

/// Told the job id a notification carries (the id of the row that became
/// `queued`, or the lowest id an `INSERT` statement inserted), before the
/// workers are woken.
pub(crate) type OnId = std::sync::Arc<dyn Fn(i64) + Send + Sync>;

/// The payload a pause is announced with on its table's channel.
pub(crate) const PAUSE_PAYLOAD: &str = "pause";

/// Told that a pause may have been set: a pause's notification arrived, or
/// the listener (re)connected and may have missed one.
pub(crate) type OnPause = std::sync::Arc<dyn Fn() + Send + Sync>;

/// What a store's listener tells it besides waking its workers.
#[derive(Clone, Default)]
pub(crate) struct Told {
    pub(crate) id: Option<OnId>,
    pub(crate) pause: Option<OnPause>,
}

/// The listener's loop: (re)connect, LISTEN, wake on each notification, until
/// `stop` fires.
async fn listen(
    listen_pool: &PgPool,
    channel: &str,
    store: &str,
    sender: &WakeupSender,
    task_stop: &CancellationToken,
    told: &Told,
) {
    let mut delay = RECONNECT_MIN;
    let mut was_live = false;
    loop {
        let attempt = async {
            let mut listener = PgListener::connect_with(listen_pool).await?;
            listener.ignore_pool_close_event(true);
            listener.eager_reconnect(false);
            listener.listen(channel).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let result = tokio::select! {
            _ = task_stop.cancelled() => return,
            result = attempt => result,
        };
        let mut listener = match result {
            Ok(listener) => listener,
            Err(err) => {
                tracing::warn!(store = %store, channel = %channel, error = %err, retry_in = ?delay, "cannot LISTEN; workers poll until it is back");
                tokio::select! {
                    _ = task_stop.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(RECONNECT_MAX);
                continue;
            }
        };
        if was_live {
            tracing::info!(store = %store, channel = %channel, "listener reconnected");
        } else {
            tracing::debug!(store = %store, channel = %channel, "listening");
        }
        // Going live wakes the workers: jobs may have arrived while it was
        // down, and a pause may have been set.
        if let Some(on_pause) = &told.pause {
            on_pause();
        }
        sender.set_live(true);
        was_live = true;
        delay = RECONNECT_MIN;
        loop {
            let received = tokio::select! {
                _ = task_stop.cancelled() => return,
                received = listener.try_recv() => received,
            };
            match received {
                Ok(Some(notification)) => {
                    let payload = notification.payload();
                    if payload == PAUSE_PAYLOAD {
                        // Nothing to claim: only the jobs claimed ahead care.
                        if let Some(on_pause) = &told.pause {
                            on_pause();
                        }
                        continue;
                    }
                    if let (Some(on_id), Ok(id)) = (&told.id, payload.parse::<i64>()) {
                        on_id(id);
                    }
                    sender.wake()
                }
                Ok(None) => {
                    tracing::warn!(store = %store, channel = %channel, "listener connection lost; workers poll until it is back");
                    break;
                }
                Err(err) => {
                    tracing::warn!(store = %store, channel = %channel, error = %err, "listener failed; workers poll until it is back");
                    break;
                }
            }
        }
        sender.set_live(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_stay_distinct_and_within_63_bytes() {
        let a = bounded_name(&format!("{}_a", "x".repeat(70)));
        let b = bounded_name(&format!("{}_b", "x".repeat(70)));
        assert_ne!(a, b);
        assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
        assert_eq!(bounded_name("short"), "short");
    }
}
