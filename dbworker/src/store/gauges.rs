//! Queue gauges: depth per live state and queue and the oldest waiting age,
//! sampled by one cheap query and exposed through the `metrics` facade.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Row;
use tokio_util::sync::CancellationToken;
use workerutil::{JobState, Record};

use crate::error::{Error, Result};
use crate::metrics::{OLDEST_JOB_AGE_SECONDS, QUEUE_DEPTH};
use crate::runner::{Next, Pass, Runner};
use crate::sql;
use crate::store::DbStore;

/// Live jobs of one state (and queue).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct QueueStat {
    /// `queued`, `errored` or `processing`.
    pub state: JobState,
    /// The queue, when the store's table has a `queue_column`.
    pub queue: Option<String>,
    /// How many jobs.
    pub count: u64,
    /// For waiting jobs, seconds since the longest-waiting due one became
    /// runnable (queued, or its later `process_after`); for processing ones,
    /// since the oldest was queued. By the database clock.
    pub oldest_seconds: f64,
}

impl<R: Record> DbStore<R> {
    /// Live jobs per state (and queue, with `JobTableOptions::queue_column`): one
    /// query whose two branches each follow a partial index, so it costs what
    /// the live rows cost however many finished rows the table holds.
    pub async fn queue_stats(&self) -> Result<Vec<QueueStat>> {
        let rows = sql::queue_stats(self.resolved())
            .fetch_all(self.pool())
            .await
            .map_err(Error::db("queue_stats"))?;
        let mut stats = Vec::with_capacity(rows.len());
        for row in rows {
            let state: String = row.get("state");
            let Ok(state) = state.parse::<JobState>() else {
                continue;
            };
            stats.push(QueueStat {
                state,
                queue: row.get("queue"),
                count: u64::try_from(row.get::<i64, _>("count")).unwrap_or(0),
                oldest_seconds: row.get("oldest"),
            });
        }
        Ok(stats)
    }

    /// Samples [`queue_stats`](Self::queue_stats) into the gauges
    /// [`QUEUE_DEPTH`] and [`OLDEST_JOB_AGE_SECONDS`]. A state (or queue)
    /// seen before and now empty is set to 0, not left at its last value,
    /// and then forgotten: `seen` holds only the series live at the last
    /// sample, so a queue per tenant does not grow it without bound. The
    /// recorder keeps the 0 until the series is seen again (or its exporter
    /// drops series not updated for a while, e.g. `metrics-exporter-prometheus`'s
    /// `idle_timeout`).
    pub async fn record_gauges(&self, seen: &mut Vec<(JobState, Option<String>)>) -> Result<()> {
        let stats = self.queue_stats().await?;
        let table = self.resolved().table.display_name();
        let set = |state: JobState, queue: &Option<String>, count: f64, oldest: f64| {
            let labels = [
                ("table", table.clone()),
                ("state", state.as_str().to_owned()),
                ("queue", queue.clone().unwrap_or_default()),
            ];
            metrics::gauge!(QUEUE_DEPTH, &labels).set(count);
            metrics::gauge!(OLDEST_JOB_AGE_SECONDS, &labels).set(oldest);
        };
        seen.retain(|(state, queue)| {
            let live = stats.iter().any(|s| s.state == *state && s.queue == *queue);
            if !live {
                set(*state, queue, 0.0, 0.0);
            }
            live
        });
        for s in &stats {
            #[allow(clippy::cast_precision_loss)]
            set(s.state, &s.queue, s.count as f64, s.oldest_seconds);
            if !seen.iter().any(|(st, q)| *st == s.state && *q == s.queue) {
                seen.push((s.state, s.queue.clone()));
            }
        }
        Ok(())
    }
}

/// The queue gauges of a store, sampled every `interval` by one query: a
/// [`Service`](crate::Service) (a [`Client`](crate::Client) runs one when
/// `ClientOptions::gauges` is set).
///
/// ```no_run
/// # use std::{sync::Arc, time::Duration};
/// # use dbworker::{DbStore, QueueGauges, Service};
/// # async fn f(store: Arc<DbStore<dbworker::TypedJob>>) -> Result<(), dbworker::Error> {
/// let gauges = QueueGauges::new(store, Duration::from_secs(15))?;
/// let stop = tokio_util::sync::CancellationToken::new();
/// tokio::spawn(async move { gauges.run(stop).await });
/// # Ok(()) }
/// ```
pub struct QueueGauges<R> {
    store: Arc<DbStore<R>>,
    interval: Duration,
}

impl<R> std::fmt::Debug for QueueGauges<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueGauges")
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl<R: Record> QueueGauges<R> {
    /// Gauges of `store`, sampled every `interval` (positive).
    pub fn new(store: Arc<DbStore<R>>, interval: Duration) -> Result<QueueGauges<R>> {
        if interval.is_zero() {
            return Err(Error::InvalidOption {
                field: "interval",
                reason: "must be positive".into(),
            });
        }
        Error::check_max_durations([("interval", interval)])?;
        Ok(QueueGauges { store, interval })
    }
}

impl<R: Record> crate::Service for QueueGauges<R> {
    fn name(&self) -> &str {
        "gauges"
    }

    /// Records the gauges every interval until `stop` fires; a failed sample
    /// is logged and retried after a back-off: twice the interval, doubling
    /// with each failure in a row up to eight intervals.
    async fn run(&self, stop: CancellationToken) -> Result<()> {
        Runner::every(self.interval)
            .backoff_up_to(self.interval.saturating_mul(8))
            .run(
                &stop,
                &mut Gauges {
                    store: &self.store,
                    seen: Vec::new(),
                },
            )
            .await;
        Ok(())
    }
}

/// The gauges as the runner sees them: one sample per pass.
struct Gauges<'a, R> {
    store: &'a DbStore<R>,
    /// The states (and queues) seen so far, set to 0 once empty.
    seen: Vec<(JobState, Option<String>)>,
}

impl<R: Record> Pass for Gauges<'_, R> {
    fn span(&self) -> tracing::Span {
        tracing::info_span!("gauges", store = %self.store.name())
    }

    async fn pass(&mut self) -> Next {
        match self.store.record_gauges(&mut self.seen).await {
            Ok(()) => Next::Interval,
            Err(err) => {
                tracing::warn!(store = %self.store.name(), error = %err, "sampling queue gauges failed");
                Next::BackOff
            }
        }
    }
}
