//! The claim cursor's probe: beside the claims, it looks behind each cursor
//! in use (`store/cursor.rs`) for a row that became eligible there without
//! the store learning its id (a scheduled job coming due, a reset by another
//! process while not listening, a row a condition passed over), takes the
//! cursor back to it and wakes the workers. A listening store also looks,
//! while a worker waits for a wake-up, for a job that came due since its last
//! look, at any id: no notification announces one (a scheduled job, a retry,
//! a wait's timeout), and a worker that backed off to a long poll would find
//! it only then. It wakes the workers for that job at one or two looks, not
//! at every look for an older eligible row the claims leave (a limit that
//! binds), which would undo their back-off. A listening store whose claims cannot use a cursor (see
//! `store/cursor.rs`) runs the probe for that alone.
//!
//! Its look behind walks the dead index entries below the cursor, which a long
//! transaction elsewhere keeps in the index; with millions of them one look
//! takes longer than the interval. So the probe paces itself: it starts at
//! most once per `PACE` times the fastest of its last `RECENT` looks, and
//! never more often than the configured interval, so once its looks are slow
//! in a row it holds one connection about a tenth of the time (a look that
//! overruns the interval is followed at once, so the first slow looks run
//! back to back until `RECENT` of them stretch it). Dead entries slow every
//! look; a busy machine slows one now and then, and pacing on that one alone
//! would leave a job coming due behind the cursor waiting ten times the
//! hiccup. It warns once when its looks outgrow the interval, and says it is
//! fast again once a look fits in half of it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::{PgPool, Row};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use workerutil::WakeupSender;

use super::cursor::ClaimCursor;
use crate::runner::{Next, Pass, Runner};
use crate::sql;
use crate::store::Resolved;

/// The probe waits at least this many times its recent looks' duration
/// between the starts of two looks.
const PACE: u32 = 10;

/// How many of the last looks the pace follows (the fastest of them).
const RECENT: usize = 3;

/// How far back a set of conditions' first look for jobs coming due reaches
/// (one that came due meanwhile and is still eligible wakes the workers).
const FIRST_LOOK_BACK: Duration = Duration::from_secs(60);

/// When the probe looks next, and whether operators were told it is slow.
#[derive(Debug, Clone, Copy)]
struct Pace {
    /// The configured interval (`ClaimOptions::claim_cursor`).
    every: Duration,
    /// The last looks' durations, the newest at `next - 1` (a ring).
    recent: [Duration; RECENT],
    next: usize,
    /// Between the starts of the last look and the next one.
    period: Duration,
    /// A slow look was reported and no clearly fast one since.
    reported_slow: bool,
}

/// What a look changes in what operators were told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Report {
    Nothing,
    /// The interval stretched: tell them (once).
    Slow,
    /// Looks fit the interval again with room to spare: tell them (once).
    Fast,
}

impl Pace {
    fn new(every: Duration) -> Self {
        Pace {
            every,
            recent: [Duration::ZERO; RECENT],
            next: 0,
            period: every,
            reported_slow: false,
        }
    }

    /// A look took `took`: the period until the next one starts, from the
    /// fastest of the last `RECENT` looks (so one slow look among fast ones
    /// leaves the pace alone, and `RECENT` slow ones in a row stretch it).
    fn after(&mut self, took: Duration) -> Duration {
        self.recent[self.next] = took;
        self.next = (self.next + 1) % RECENT;
        let fastest = self.recent.iter().min().copied().unwrap_or(took);
        self.period = self.every.max(fastest.saturating_mul(PACE));
        self.period
    }

    fn stretched(&self) -> bool {
        self.period > self.every
    }

    /// What to tell operators after [`Pace::after`]. With hysteresis: looks
    /// hovering around the limit (a held xmin keeps the dead entries, and
    /// each look's time wobbles) would otherwise warn and recover every
    /// pass; "fast again" needs a look within half the limit.
    fn report(&mut self, took: Duration) -> Report {
        let clearly_fast = took.saturating_mul(PACE.saturating_mul(2)) <= self.every;
        match (self.reported_slow, self.stretched()) {
            (false, true) => {
                self.reported_slow = true;
                Report::Slow
            }
            (true, false) if clearly_fast => {
                self.reported_slow = false;
                Report::Fast
            }
            _ => Report::Nothing,
        }
    }
}

/// The probe task; it stops when this is dropped or stopped.
#[derive(Debug)]
pub(crate) struct Probe {
    stop: CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Probe {
    /// Stops the probe and waits until it has.
    pub(crate) async fn stop(&self) {
        self.stop.cancel();
        let task = self.task.lock().expect("not poisoned").take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Starts the probe: about every `every` (longer while its looks are slow),
/// for each cursor in use, the lowest eligible row behind it (with its
/// claims' conditions) takes it back, and the workers are woken (`waker`,
/// when the store listens) to claim it, or, while one waits for a wake-up,
/// to claim a job that came due since the last look.
pub(crate) fn spawn_probe(
    pool: PgPool,
    o: Arc<Resolved>,
    cursor: Arc<ClaimCursor>,
    every: Duration,
    waker: Option<Arc<WakeupSender>>,
) -> Probe {
    let stop = CancellationToken::new();
    let task_stop = stop.clone();
    let task = tokio::spawn(async move {
        let (pool, o, cursor, waker) = (&pool, &*o, &*cursor, waker.as_deref());
        let checked = tokio::sync::Mutex::new(HashMap::new());
        let checked = &checked;
        paced(every, &task_stop, &o.name, || async move {
            let mut checked = checked.lock().await;
            look(pool, o, cursor, waker, every, &mut checked).await;
        })
        .await;
    });
    Probe {
        stop,
        task: Mutex::new(Some(task)),
    }
}

/// Runs `look` first after `every`, then at the pace its durations allow,
/// until `stop`; logs when the pace stretches past `every` and when it is
/// back.
async fn paced<F, Fut>(every: Duration, stop: &CancellationToken, store: &str, look: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    // The first look after `every`, each next one a pace after the last
    // one's start; a stop abandons a look (its connection goes back).
    Runner::every(every)
        .first_after(every)
        .steady_rate()
        .abandon_pass_on_stop()
        .run(
            stop,
            &mut Looks {
                store,
                look,
                pace: Pace::new(every),
            },
        )
        .await;
}

/// The probe as the runner sees it: one look per pass.
struct Looks<'a, F> {
    store: &'a str,
    look: F,
    pace: Pace,
}

impl<F, Fut> Pass for Looks<'_, F>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    fn span(&self) -> tracing::Span {
        tracing::info_span!("claim_cursor_probe", store = %self.store)
    }

    async fn pass(&mut self) -> Next {
        let (store, every) = (self.store, self.pace.every);
        let started = Instant::now();
        (self.look)().await;
        let took = started.elapsed();
        let period = self.pace.after(took);
        match self.pace.report(took) {
            Report::Slow => {
                tracing::warn!(store = %store, took = ?took, every = ?period, configured = ?every, "the claim cursor's probe is slow (dead index entries below the cursor, or many jobs scheduled for later); it looks less often, so a row that becomes eligible behind the cursor or comes due without a notification waits up to that long");
            }
            Report::Fast => {
                tracing::info!(store = %store, took = ?took, every = ?every, "the claim cursor's probe is fast again");
            }
            Report::Nothing => {}
        }
        Next::After(period)
    }
}

/// One look for every cursor in use. `checked` holds, per set of
/// conditions, the database clock at its last look for jobs coming due.
async fn look(
    pool: &PgPool,
    o: &Resolved,
    cursor: &ClaimCursor,
    waker: Option<&WakeupSender>,
    every: Duration,
    checked: &mut HashMap<String, f64>,
) {
    let in_use = cursor.in_use();
    // Jobs coming due matter only while a worker waits for a wake-up: a busy
    // one claims them itself, and looking reads past every queued row.
    let waiting = waker.is_some_and(WakeupSender::waiting);
    // Sets that went out of use leave their times (one whose values change
    // every claim makes a set each); back in use, a set looks back anew.
    checked.retain(|key, _| in_use.iter().any(|c| &c.key == key));
    if in_use.is_empty() || (!waiting && in_use.iter().all(|c| c.low.is_none())) {
        return;
    }
    // Only an idle connection: the pool is sized for the handlers, claims
    // and heartbeats. With none free the claims scan in full, and the
    // workers are woken so that one does (an idle worker hearing nothing
    // else would poll only after its interval, or its backed-off wait).
    let Some(mut conn) = pool.try_acquire() else {
        cursor.rewind_all();
        if let Some(waker) = waker {
            waker.wake();
        }
        return;
    };
    let mut wake = false;
    for c in in_use {
        if let Some(low) = c.low {
            let row = sql::eligible_behind(o, &c.conditions, low)
                .fetch_one(&mut *conn)
                .await;
            match row {
                Ok(row) => {
                    if let Some(id) = row.get::<Option<i64>, _>("id") {
                        cursor.rewind_key(&c.key, id);
                        wake = true;
                    }
                }
                Err(err) => {
                    wake = failed(o, cursor, &err);
                    break;
                }
            }
        }
        // Since this set's last such look, less an interval for a write
        // that scheduled a job and committed late (such a job may wake the
        // workers twice). A set left out keeps its time, so the next look
        // covers what this one did not.
        if waiting && !wake {
            let after = checked.get(&c.key).map(|at| at - every.as_secs_f64());
            let row = sql::came_due(o, &c.conditions, after, FIRST_LOOK_BACK)
                .fetch_one(&mut *conn)
                .await;
            match row {
                Ok(row) => {
                    checked.insert(c.key, row.get("at"));
                    wake = row.get::<Option<i64>, _>("id").is_some();
                }
                Err(err) => {
                    wake = failed(o, cursor, &err);
                    break;
                }
            }
        }
    }
    drop(conn);
    if let (true, Some(waker)) = (wake, waker) {
        waker.wake();
    }
}

/// A look failed: claims scan from the start, and the workers are woken.
fn failed(o: &Resolved, cursor: &ClaimCursor, err: &sqlx::Error) -> bool {
    tracing::warn!(store = %o.name, error = %err, "the claim cursor's probe failed; claims scan from the start");
    cursor.rewind_all();
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pace_is_the_interval_or_ten_times_the_fastest_recent_look() {
        let mut pace = Pace::new(Duration::from_secs(1));
        let ms = Duration::from_millis;
        assert_eq!(pace.after(ms(5)), Duration::from_secs(1));
        // A busy machine's hiccup: one or two slow looks among fast ones
        // leave the interval alone.
        assert_eq!(pace.after(ms(1500)), Duration::from_secs(1));
        assert_eq!(pace.after(ms(1500)), Duration::from_secs(1));
        assert!(!pace.stretched());
        // Dead entries slow every look: three in a row stretch it.
        assert_eq!(pace.after(ms(1500)), Duration::from_secs(15));
        assert!(pace.stretched());
        assert_eq!(pace.after(ms(2000)), Duration::from_secs(15));
        assert_eq!(pace.after(ms(99)), Duration::from_secs(1));
        assert!(!pace.stretched(), "a fast look brings the interval back");
    }

    /// Looks hovering around the limit (100 ms for a 1 s interval) warn
    /// once, not on every crossing; only a look within half the limit says
    /// the probe is fast again, once.
    #[test]
    fn looks_around_the_limit_warn_once_and_recover_once() {
        let mut pace = Pace::new(Duration::from_secs(1));
        let mut reports = Vec::new();
        for ms in [120, 130, 110, 90, 130, 140, 150, 40, 30, 150, 160, 170, 20] {
            let took = Duration::from_millis(ms);
            pace.after(took);
            reports.push(pace.report(took));
        }
        use Report::{Fast, Nothing, Slow};
        assert_eq!(
            reports,
            [
                Nothing, Nothing, Slow, Nothing, Nothing, Nothing, Nothing, Fast, Nothing, Nothing,
                Nothing, Slow, Fast
            ]
        );
    }

    /// On a paused clock: a look that overruns the interval is followed at
    /// once; three looks of 2 s in a row push the next start 20 s out; once
    /// a look is fast again, the probe is back to every second.
    #[tokio::test(start_paused = true)]
    async fn slow_looks_stretch_the_interval_and_fast_ones_restore_it() {
        let t0 = Instant::now();
        let stop = CancellationToken::new();
        let took = [5, 2000, 2000, 2000, 20, 0].map(Duration::from_millis);
        let starts = Mutex::new(Vec::new());
        paced(Duration::from_secs(1), &stop, "test", || {
            let mut starts = starts.lock().unwrap();
            let n = starts.len();
            starts.push(t0.elapsed());
            if n + 1 == took.len() {
                stop.cancel();
            }
            tokio::time::sleep(took[n])
        })
        .await;
        let secs = [1.0, 2.0, 4.0, 6.0, 26.0, 27.0].map(Duration::from_secs_f64);
        assert_eq!(*starts.lock().unwrap(), secs);
    }

    /// A look still running when the store stops is abandoned at once.
    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_a_look_in_progress() {
        let stop = CancellationToken::new();
        let t0 = Instant::now();
        let run = paced(Duration::from_secs(1), &stop, "test", || {
            tokio::time::sleep(Duration::from_secs(3600))
        });
        let stopper = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            stop.cancel();
        };
        tokio::join!(run, stopper);
        assert_eq!(t0.elapsed(), Duration::from_secs(2));
    }
}
