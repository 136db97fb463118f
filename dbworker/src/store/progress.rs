//! A handler's progress and checkpoints (`dbworker migration --progress`):
//! written fenced by the claim's token and numbered, each write of an
//! attempt (a heartbeat carrying a report included) taking the next number
//! above the row's `progress_seq` its claim read, when it is sent; a write
//! lands only above the newest one landed. Neither a stale attempt nor a
//! write that lands late (a heartbeat given up at its timeout) can move them
//! back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::Row;
use workerutil::{Lease, Record};

use super::open::JobTx;
use super::{DbJob, DbStore};
use crate::columns::{CHECKPOINT, MAX_PROGRESS_BYTES};
use crate::error::{Error, from_json, to_json};
use crate::sql;

impl<R: Record> DbJob<R> {
    /// The checkpoint the last attempt saved ([`save_checkpoint`](Self::save_checkpoint)),
    /// read as a `T`; `None` on a job's first attempt (or once none was
    /// saved). Kept across retries, snoozes, resets and waits; dropped when
    /// the job completes. In transactional handling it is read in the job's
    /// transaction.
    ///
    /// ```no_run
    /// # use dbworker::{DbJob, DbStore};
    /// # #[derive(Debug)] struct Job { id: i64 }
    /// # impl workerutil::Record for Job { fn id(&self) -> i64 { self.id } }
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Import { next_row: u64 }
    ///
    /// # async fn handle(job: &mut DbJob<Job>, store: &DbStore<Job>) -> Result<(), dbworker::Error> {
    /// let from = job.checkpoint::<Import>(store).await?.map_or(0, |c| c.next_row);
    /// for chunk in (from..1_000_000).step_by(10_000) {
    ///     // ... import rows chunk..chunk + 10,000 ...
    ///     job.save_checkpoint(store, &Import { next_row: chunk + 10_000 }).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn checkpoint<T: DeserializeOwned>(
        &mut self,
        store: &DbStore<R>,
    ) -> Result<Option<T>, Error> {
        needs_progress(store, "checkpoint")?;
        let statement = sql::read_checkpoint(store.resolved(), self.lease.id, self.lease.token);
        let row = match self.tx.as_mut() {
            Some(tx) => statement.fetch_optional(tx).await,
            None => statement.fetch_optional(store.pool()).await,
        }
        .map_err(Error::db("read_checkpoint"))?
        .ok_or(Error::ProgressRefused {
            what: "checkpoint",
            id: self.lease.id,
        })?;
        row.get::<Option<serde_json::Value>, _>(CHECKPOINT)
            .map(|v| from_json(&v, || format!("the checkpoint of job {}", self.lease.id)))
            .transpose()
    }

    /// Saves the checkpoint the next attempt resumes from. In heartbeat
    /// handling it is written at once, on the pool. In transactional handling
    /// it is written in the job's transaction, which then commits, with what
    /// the handler wrote so far, and opens again on the job's row: the
    /// handler's output and its checkpoint commit together or not at all
    /// (exactly-once progress within Postgres).
    ///
    /// Refused with [`Error::ProgressRefused`] when this attempt no longer
    /// owns the job (the handler should stop), with
    /// [`Error::ProgressTooLarge`] over 64 KiB of JSON.
    pub async fn save_checkpoint(
        &mut self,
        store: &DbStore<R>,
        checkpoint: impl Serialize,
    ) -> Result<(), Error> {
        let value = value_of("checkpoint", &checkpoint)?;
        self.write(store, "checkpoint", None, Some(value)).await?;
        if let Some(tx) = self.tx.take() {
            self.tx = Some(reopen(store, self.lease, tx).await?);
        }
        Ok(())
    }

    /// Sets the job's public progress (a percentage, a message, counters):
    /// shown by `dbworker show` and the dashboard's job page, kept when the
    /// job completes. Written at once, fenced as
    /// [`save_checkpoint`](Self::save_checkpoint) is; in transactional
    /// handling it commits with the job's transaction.
    pub async fn set_progress(
        &mut self,
        store: &DbStore<R>,
        progress: impl Serialize,
    ) -> Result<(), Error> {
        let value = value_of("progress", &progress)?;
        self.write(store, "progress", Some(value), None).await
    }

    /// Reports the job's public progress without a statement of its own: the
    /// latest value reported reaches the row with the store's next heartbeat
    /// (fenced by the heartbeat's token check, numbered as the attempt's
    /// writes are, so a heartbeat that lands late never moves it back), so
    /// a handler may report as often as it likes — per row, ten times a
    /// second — for at most one write per heartbeat interval. A value still
    /// waiting when the job's attempt ends is written, fenced, just before
    /// the attempt's final mark (a completion's in its transaction), so the
    /// last value reported survives completion, an error, a snooze or a
    /// wait. Refused at once over 64 KiB or with a NUL character, as
    /// `set_progress` is.
    pub fn report_progress(
        &mut self,
        store: &DbStore<R>,
        progress: impl Serialize,
    ) -> Result<(), Error> {
        needs_progress(store, "progress")?;
        let value = value_of("progress", &progress)?;
        store.pending_progress.put(self.lease, &self.numbers, value);
        Ok(())
    }

    /// One fenced write, numbered as this attempt's next.
    async fn write(
        &mut self,
        store: &DbStore<R>,
        what: &'static str,
        progress: Option<serde_json::Value>,
        checkpoint: Option<serde_json::Value>,
    ) -> Result<(), Error> {
        needs_progress(store, what)?;
        // A beat on its way carries a smaller number: landing after this
        // write, it is refused. Beats sent while this write is on its way
        // would carry larger ones and refuse it: they wait.
        let (number, _writing) =
            store
                .pending_progress
                .start_write(self.lease, &self.numbers, progress.is_some());
        let statement = sql::write_progress(
            store.resolved(),
            (self.lease.id, self.lease.token),
            number,
            progress,
            checkpoint,
        );
        let row = match self.tx.as_mut() {
            Some(tx) => statement.fetch_optional(tx).await,
            None => statement.fetch_optional(store.pool()).await,
        }
        .map_err(Error::db("write_progress"))?;
        match row {
            Some(_) => Ok(()),
            // The claim moved on (or someone else wrote a larger number).
            None => Err(Error::ProgressRefused {
                what,
                id: self.lease.id,
            }),
        }
    }
}

/// Commits the job's transaction and begins another that locks its row again
/// (`FOR KEY SHARE`, fenced by the token). No row: the claim was lost.
async fn reopen<R: Record>(
    store: &DbStore<R>,
    lease: workerutil::Lease,
    tx: JobTx,
) -> Result<JobTx, Error> {
    tx.commit().await.map_err(Error::db("checkpoint_commit"))?;
    let mut tx = JobTx::begin(store.pool(), store.kept())
        .await
        .map_err(Error::db("checkpoint_begin"))?;
    let locked = store
        .resolved()
        .per_job
        .lock_claimed(lease.id, lease.token)
        .fetch_optional(&mut tx)
        .await
        .map_err(Error::db("checkpoint_lock"))?;
    match locked {
        Some(row) => {
            tx.locked_by(&row).map_err(Error::db("checkpoint_lock"))?;
            Ok(tx)
        }
        None => Err(Error::ProgressRefused {
            what: "checkpoint",
            id: lease.id,
        }),
    }
}

fn needs_progress<R: Record>(store: &DbStore<R>, what: &'static str) -> Result<(), Error> {
    if store.resolved().keeps_progress() {
        return Ok(());
    }
    Err(Error::InvalidOption {
        field: "progress",
        reason: format!(
            "the job's {what} needs the table's progress columns or its progress table (JobTableOptions::progress; `dbworker migration --progress` adds the columns, `--progress-table` creates the table)"
        ),
    })
}

/// The value as JSON, refused over the cap or holding a NUL character.
fn value_of(what: &'static str, value: &impl Serialize) -> Result<serde_json::Value, Error> {
    let json = to_json(value, || format!("cannot write the job's {what}"))?;
    let bytes = json.to_string().len();
    if bytes > MAX_PROGRESS_BYTES {
        return Err(Error::ProgressTooLarge {
            what,
            bytes,
            cap: MAX_PROGRESS_BYTES,
        });
    }
    if let Some(path) = crate::message::nul_path(&json) {
        return Err(Error::NulCharacter {
            what: format!("the job's {what} (at {path})"),
        });
    }
    Ok(json)
}

/// The numbers of an attempt's progress writes: the last one given, from
/// the row's `progress_seq` its claim read. Shared by the attempt's
/// [`DbJob`] and its [`Pending`] entry (which comes and goes), so no number
/// is given twice.
#[derive(Debug, Clone, Default)]
pub(super) struct Numbers(Arc<AtomicI64>);

impl Numbers {
    pub(super) fn above(seq: i64) -> Numbers {
        Numbers(Arc::new(AtomicI64::new(seq)))
    }

    fn next(&self) -> i64 {
        self.0.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// Progress reported and not yet known written: each job's latest value,
/// under the token it was reported with, and the value a heartbeat has taken
/// with its number (its statement may still be on its way).
///
/// Every write takes its number when sent, under this lock. A beat that did
/// not land its report (it skipped the row, locked by its handler's
/// transaction; a newer write landed first; it failed, or was given up at
/// its timeout and may still commit) gives it back, unless a newer one was
/// reported or written since: sent again, it takes a new number, so a late
/// commit of the old beat is refused.
#[derive(Debug, Default)]
pub(super) struct Pending {
    reports: Mutex<HashMap<i64, Reported>>,
}

#[derive(Debug)]
struct Reported {
    token: i64,
    numbers: Numbers,
    /// Reported, not taken by a beat yet.
    value: Option<serde_json::Value>,
    /// Taken by a beat whose statement has not returned, with its number.
    in_flight: Option<(i64, serde_json::Value)>,
    /// The number of the attempt's newest own progress write: a report
    /// numbered below it is older, and never goes back.
    superseded: i64,
    /// The attempt is writing on its own: beats leave its value alone.
    writing: bool,
}

impl Reported {
    fn new(token: i64, numbers: &Numbers) -> Reported {
        Reported {
            token,
            numbers: numbers.clone(),
            value: None,
            in_flight: None,
            superseded: 0,
            writing: false,
        }
    }

    fn is_empty(&self) -> bool {
        self.value.is_none() && self.in_flight.is_none() && !self.writing
    }
}

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Reported>> {
        self.reports.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn put(&self, lease: Lease, numbers: &Numbers, value: serde_json::Value) {
        let mut reports = self.lock();
        let r = reports
            .entry(lease.id)
            .or_insert_with(|| Reported::new(lease.token, numbers));
        // Tokens grow with each claim: a superseded attempt still running in
        // this process must not wipe the live attempt's bookkeeping.
        if r.token > lease.token {
            return;
        }
        if r.token < lease.token {
            *r = Reported::new(lease.token, numbers);
        }
        r.value = Some(value);
    }

    /// The values reported under `leases` and not yet sent (a heartbeat
    /// writes them), each with its number; each kept until
    /// [`returned`](Self::returned) says what became of it.
    pub(super) fn take(&self, leases: &[Lease]) -> Vec<(i64, i64, serde_json::Value)> {
        let mut reports = self.lock();
        if reports.is_empty() {
            return Vec::new();
        }
        let mut taken = Vec::new();
        for l in leases {
            let stale = match reports.get_mut(&l.id) {
                Some(r) if r.token == l.token => {
                    if r.in_flight.is_none()
                        && !r.writing
                        && let Some(value) = r.value.take()
                    {
                        let number = r.numbers.next();
                        taken.push((l.id, number, value.clone()));
                        r.in_flight = Some((number, value));
                    }
                    false
                }
                // An older attempt's entry goes; a newer one's (this lease
                // is the superseded one) stays.
                Some(r) => r.token < l.token,
                None => false,
            };
            if stale {
                reports.remove(&l.id);
            }
        }
        taken
    }

    /// The heartbeat that took `sent` returned: `wrote` are the rows whose
    /// report landed (none when it failed, or was given up). A value not
    /// written goes back, unless a newer one replaced it.
    pub(super) fn returned(&self, sent: &[i64], wrote: &[i64]) {
        let mut reports = self.lock();
        for id in sent {
            let Some(r) = reports.get_mut(id) else {
                continue;
            };
            let Some((number, value)) = r.in_flight.take() else {
                continue;
            };
            if !wrote.contains(id) && r.value.is_none() && number > r.superseded {
                r.value = Some(value);
            }
            if r.is_empty() {
                reports.remove(id);
            }
        }
    }

    /// The attempt `lease` writes on its own: its write's number, and beats
    /// leave its value alone until the guard drops (a beat numbered after
    /// this write and landing first would refuse it). `newer`: the write
    /// carries a newer progress value, which replaces what was reported and
    /// not sent, and what a beat carries.
    fn start_write(&self, lease: Lease, numbers: &Numbers, newer: bool) -> (i64, Writing<'_>) {
        let mut reports = self.lock();
        let number = numbers.next();
        let r = reports
            .entry(lease.id)
            .or_insert_with(|| Reported::new(lease.token, numbers));
        if r.token == lease.token {
            if newer {
                r.value = None;
                r.superseded = number;
            }
            r.writing = true;
        }
        // Otherwise another attempt's entry (this one's lease was lost): its
        // write is refused anyway.
        (
            number,
            Writing {
                pending: self,
                lease,
            },
        )
    }

    /// What the attempt `lease` reported and no heartbeat is known to have
    /// written, numbered: its last word, for the attempt's final mark. The
    /// unsent report, or the one a beat still carries (no need to wait for
    /// it: landing after this one it is refused). Forgets it.
    pub(super) fn last(&self, lease: Lease, numbers: &Numbers) -> Option<(i64, serde_json::Value)> {
        let mut reports = self.lock();
        let r = reports.remove(&lease.id)?;
        if r.token != lease.token {
            // Another attempt's value (this one's lease was lost): keep it.
            reports.insert(lease.id, r);
            return None;
        }
        let carried = r.in_flight.filter(|(number, _)| *number > r.superseded);
        let value = r.value.or(carried.map(|(_, value)| value))?;
        Some((numbers.next(), value))
    }

    /// Whether the attempt `lease` may have a last word for its mark (cheap:
    /// the common completion skips [`last`](Self::last)'s write path).
    pub(super) fn holds(&self, lease: Lease) -> bool {
        self.lock().contains_key(&lease.id)
    }
}

/// An attempt's own progress write on its way: beats leave its value alone
/// until this drops (the write returned, failed or was abandoned).
struct Writing<'a> {
    pending: &'a Pending,
    lease: Lease,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut reports = self.pending.lock();
        if let Some(r) = reports.get_mut(&self.lease.id)
            && r.token == self.lease.token
        {
            r.writing = false;
            if r.is_empty() {
                reports.remove(&self.lease.id);
            }
        }
    }
}

impl<R: Record> DbStore<R> {
    /// Writes the progress `job`'s attempt reported and no heartbeat is known
    /// to have written, numbered as every write, just before the attempt's
    /// final mark: a handler's last report is never dropped. A mark that
    /// commits the job's transaction (`completing`: a completion, a wait)
    /// writes it there, committed with the mark; any other mark first rolls
    /// the handler's transaction back
    /// (as the mark itself would), so the value is written outside it and
    /// outlives it. A write refused or failed is logged: the mark goes on.
    pub(super) async fn last_progress(&self, job: &mut DbJob<R>, completing: bool) {
        // A value written in a completion's transaction that failed to commit
        // comes back for the errored mark that follows, numbered anew.
        let pending = self.pending_progress.last(job.lease, &job.numbers);
        let Some((number, value)) = pending.or_else(|| {
            let value = job.uncommitted_progress.take()?;
            Some((job.numbers.next(), value))
        }) else {
            return;
        };
        if completing && job.tx.is_some() {
            job.uncommitted_progress = Some(value.clone());
        }
        // `discard`: a handler stopped mid-query leaves a query a rollback
        // would wait for (`store/open.rs`).
        if !completing
            && let Some(tx) = job.tx.take()
            && let Err(err) = tx.discard().await
        {
            tracing::warn!(record_id = job.lease.id, error = %err, "rollback of the handler's transaction failed");
        }
        let statement = sql::write_progress(
            self.resolved(),
            (job.lease.id, job.lease.token),
            number,
            Some(value),
            None,
        );
        let written = match job.tx.as_mut() {
            Some(tx) => statement.fetch_optional(tx).await,
            None => statement.fetch_optional(self.pool()).await,
        };
        match written {
            Ok(Some(_)) => {}
            Ok(None) => {
                tracing::debug!(
                    record_id = job.lease.id,
                    "the attempt's last progress was refused: no longer ours"
                );
            }
            Err(err) => {
                tracing::warn!(record_id = job.lease.id, error = %err, "the attempt's last progress could not be written");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A superseded attempt still running in this process (its job reset
    /// and claimed again here) neither wipes nor drops the live attempt's
    /// bookkeeping, whether it reports or its lease is beaten.
    #[test]
    fn a_superseded_attempt_leaves_the_live_attempts_reports_alone() {
        let (old, live) = (Lease { id: 7, token: 100 }, Lease { id: 7, token: 200 });
        let (old_numbers, numbers) = (Numbers::above(0), Numbers::above(3));
        let pending = Pending::default();
        pending.put(live, &numbers, serde_json::json!({"n": 1}));
        assert_eq!(pending.take(&[live])[0].1, 4);
        pending.returned(&[7], &[7]);
        pending.put(live, &numbers, serde_json::json!({"n": 2}));
        pending.put(old, &old_numbers, serde_json::json!({"stale": true}));
        assert!(pending.take(&[old]).is_empty());
        let reports = pending.lock();
        let r = reports.get(&7).expect("the live attempt's entry");
        assert_eq!(r.token, 200);
        assert_eq!(r.value, Some(serde_json::json!({"n": 2})));
    }

    /// A report its beat did not land goes back and is numbered anew; one a
    /// newer own write outnumbered does not.
    #[test]
    fn a_report_not_landed_goes_back_with_a_new_number_unless_superseded() {
        let lease = Lease { id: 7, token: 100 };
        let numbers = Numbers::above(10);
        let pending = Pending::default();
        pending.put(lease, &numbers, serde_json::json!(1));
        assert_eq!(pending.take(&[lease])[0].1, 11);
        pending.returned(&[7], &[]);
        assert_eq!(pending.take(&[lease])[0].1, 12);
        let (number, writing) = pending.start_write(lease, &numbers, true);
        assert_eq!(number, 13);
        drop(writing);
        pending.returned(&[7], &[]);
        assert!(pending.take(&[lease]).is_empty());
        assert_eq!(pending.last(lease, &numbers), None);
    }
}
