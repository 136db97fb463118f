//! A handler's progress and checkpoints (`dbworker migration --progress`):
//! written fenced by the claim's token and by the write count it read, so
//! neither a stale attempt nor a write out of order can move them back.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::Row;
use workerutil::{Lease, Record};

use super::open::JobTx;
use super::{DbJob, DbStore};
use crate::columns::{CHECKPOINT, MAX_PROGRESS_BYTES, PROGRESS_SEQ};
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
        self.progress_seq = Some(row.get(PROGRESS_SEQ));
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
    /// (fenced by the heartbeat's token check, counted in `progress_seq`), so
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
        store.pending_progress.put(self.lease, value);
        Ok(())
    }

    /// One fenced write, naming the write count this attempt last saw.
    async fn write(
        &mut self,
        store: &DbStore<R>,
        what: &'static str,
        progress: Option<serde_json::Value>,
        checkpoint: Option<serde_json::Value>,
    ) -> Result<(), Error> {
        needs_progress(store, what)?;
        // After any beat carrying a report of this attempt: a beat landing
        // later would write an older value over this one, and the count it
        // adds would make this write look stale. A new progress value
        // replaces what was reported and not yet sent.
        let (counted, mut maybe_landed, _writing) = store
            .pending_progress
            .start_write(self.lease, progress.is_some())
            .await;
        let mut seq = self.progress_seq.map(|seq| seq + counted);
        // A beat that failed or was given up at its timeout may still have
        // landed, counting a write this attempt did not see: the write is
        // refused though the claim is still ours. Up to that many writes, the
        // count read now is this attempt's own (any further one is another
        // writer's, and the write stays refused).
        for _ in 0..MAX_RECOUNTS {
            let statement = sql::write_progress(
                store.resolved(),
                self.lease.id,
                self.lease.token,
                seq,
                progress.clone(),
                checkpoint.clone(),
            );
            let row = match self.tx.as_mut() {
                Some(tx) => statement.fetch_optional(tx).await,
                None => statement.fetch_optional(store.pool()).await,
            }
            .map_err(Error::db("write_progress"))?;
            if let Some(row) = row {
                self.progress_seq = Some(row.get(PROGRESS_SEQ));
                return Ok(());
            }
            let Some(seen) = seq else { break };
            let read = sql::read_checkpoint(store.resolved(), self.lease.id, self.lease.token);
            let now = match self.tx.as_mut() {
                Some(tx) => read.fetch_optional(tx).await,
                None => read.fetch_optional(store.pool()).await,
            }
            .map_err(Error::db("read_checkpoint"))?
            .map(|row| row.get::<i64, _>(PROGRESS_SEQ));
            match now {
                Some(now) if now > seen && now - seen <= maybe_landed => {
                    store.pending_progress.recounted(self.lease, now - seen);
                    maybe_landed -= now - seen;
                    seq = Some(now);
                }
                // The claim moved on, or another writer overtook this one.
                _ => break,
            }
        }
        Err(Error::ProgressRefused {
            what,
            id: self.lease.id,
        })
    }
}

/// How many times one write reads the count again after beats it had given
/// up on landed (one such beat per try at most).
const MAX_RECOUNTS: usize = 4;

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

/// Progress reported and not yet known written: each job's latest value,
/// under the token it was reported with; the value a heartbeat has taken
/// (its statement may still be on its way); and how many of this attempt's
/// reports the beats wrote, each counted in `progress_seq`.
///
/// The attempt's own writes (`set_progress`, `save_checkpoint`, the final
/// mark's last word) wait until no beat carries its value: a beat that
/// landed after them would write an older value over theirs, and the count
/// it adds would make their fenced write look stale. A beat that skipped
/// the row (locked by its handler's transaction) gives the value back, unless
/// a newer one was reported or written since.
#[derive(Debug, Default)]
pub(super) struct Pending {
    reports: Mutex<HashMap<i64, Reported>>,
    /// Wakes the writers waiting for a beat to return.
    beat_returned: tokio::sync::Notify,
}

#[derive(Debug)]
struct Reported {
    token: i64,
    /// Reported, not taken by a beat yet.
    value: Option<serde_json::Value>,
    /// Taken by a beat whose statement has not returned.
    in_flight: Option<serde_json::Value>,
    /// The beats' writes of this attempt the attempt has not counted yet.
    counted_by_beats: i64,
    /// Beats that carried a report of this attempt and failed or were given
    /// up at their timeout: each may still have written (and counted) it.
    maybe_landed: i64,
    /// The attempt is writing on its own: beats leave its value alone.
    writing: bool,
}

impl Reported {
    fn new(token: i64) -> Reported {
        Reported {
            token,
            value: None,
            in_flight: None,
            counted_by_beats: 0,
            maybe_landed: 0,
            writing: false,
        }
    }

    fn is_empty(&self) -> bool {
        self.value.is_none()
            && self.in_flight.is_none()
            && self.counted_by_beats == 0
            && self.maybe_landed == 0
            && !self.writing
    }
}

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Reported>> {
        self.reports.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn put(&self, lease: Lease, value: serde_json::Value) {
        let mut reports = self.lock();
        let r = reports
            .entry(lease.id)
            .or_insert_with(|| Reported::new(lease.token));
        // Tokens grow with each claim: a superseded attempt still running in
        // this process must not wipe the live attempt's bookkeeping.
        if r.token > lease.token {
            return;
        }
        if r.token < lease.token {
            *r = Reported::new(lease.token);
        }
        r.value = Some(value);
    }

    /// The values reported under `leases` and not yet sent (a heartbeat
    /// writes them); each kept until [`returned`](Self::returned) says what
    /// became of it.
    pub(super) fn take(&self, leases: &[Lease]) -> Vec<(i64, serde_json::Value)> {
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
                        taken.push((l.id, value.clone()));
                        r.in_flight = Some(value);
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

    /// The heartbeat that took `sent` returned: `touched` are the rows it
    /// wrote (`None`: it failed, and wrote nothing). A value written is
    /// counted; one not written goes back, unless a newer one replaced it.
    pub(super) fn returned(&self, sent: &[i64], touched: Option<&[i64]>) {
        {
            let mut reports = self.lock();
            for id in sent {
                let Some(r) = reports.get_mut(id) else {
                    continue;
                };
                let Some(value) = r.in_flight.take() else {
                    continue;
                };
                if touched.is_some_and(|t| t.contains(id)) {
                    r.counted_by_beats += 1;
                } else {
                    if touched.is_none() {
                        r.maybe_landed += 1;
                    }
                    if r.value.is_none() {
                        r.value = Some(value);
                    }
                }
                if r.is_empty() {
                    reports.remove(id);
                }
            }
        }
        self.beat_returned.notify_waiters();
    }

    /// The reports, locked once no beat carries what the attempt `lease`
    /// reported.
    async fn settled(&self, lease: Lease) -> std::sync::MutexGuard<'_, HashMap<i64, Reported>> {
        loop {
            let returned = self.beat_returned.notified();
            if let Some(reports) = self.lock_if_settled(lease) {
                return reports;
            }
            returned.await;
        }
    }

    /// The reports, locked, if no beat carries what `lease` reported (a
    /// function of its own: a lock held across the wait above would make
    /// the marks' futures unsendable).
    fn lock_if_settled(
        &self,
        lease: Lease,
    ) -> Option<std::sync::MutexGuard<'_, HashMap<i64, Reported>>> {
        let reports = self.lock();
        let settled = reports.get(&lease.id).is_none_or(|r| r.in_flight.is_none());
        settled.then_some(reports)
    }

    /// The attempt `lease` writes on its own, once no beat carries its
    /// report (a beat landing later would write an older value over this
    /// one, and the count it adds would make this write look stale); beats
    /// leave its value alone until the guard drops. `newer`: the write
    /// carries a newer progress value, which replaces what was reported and
    /// not sent. Returns how many of its reports the beats wrote since it
    /// last asked (its writes' count, `progress_seq`, moved that much), and
    /// how many more they may have written unbeknown to it (beats that failed
    /// or were given up on).
    async fn start_write(&self, lease: Lease, newer: bool) -> (i64, i64, Writing<'_>) {
        let mut reports = self.settled(lease).await;
        let r = reports
            .entry(lease.id)
            .or_insert_with(|| Reported::new(lease.token));
        let counted = if r.token == lease.token {
            if newer {
                r.value = None;
            }
            r.writing = true;
            (std::mem::take(&mut r.counted_by_beats), r.maybe_landed)
        } else {
            // Another attempt's entry (this one's lease was lost): its
            // write is refused anyway.
            (0, 0)
        };
        (
            counted.0,
            counted.1,
            Writing {
                pending: self,
                lease,
            },
        )
    }

    /// `by` of the writes beats may have made unbeknown to `lease` turned
    /// out to have landed: the attempt counted them.
    fn recounted(&self, lease: Lease, by: i64) {
        let mut reports = self.lock();
        if let Some(r) = reports
            .get_mut(&lease.id)
            .filter(|r| r.token == lease.token)
        {
            r.maybe_landed = (r.maybe_landed - by).max(0);
        }
    }

    /// What the attempt `lease` reported and no heartbeat wrote: its last
    /// word, for the attempt's final mark (after any beat carrying it
    /// returned). Forgets it.
    pub(super) async fn last(&self, lease: Lease) -> Option<serde_json::Value> {
        let mut reports = self.settled(lease).await;
        match reports.remove(&lease.id) {
            Some(r) if r.token == lease.token => r.value,
            Some(r) => {
                // Another attempt's value (this one's lease was lost): keep it.
                reports.insert(lease.id, r);
                None
            }
            None => None,
        }
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
    /// to have written, fenced as every write, just before the attempt's
    /// final mark: a handler's last report is never dropped. A mark that
    /// commits the job's transaction (`completing`: a completion, a wait)
    /// writes it there, committed with the mark; any other mark first rolls
    /// the handler's transaction back
    /// (as the mark itself would), so the value is written outside it and
    /// outlives it. A write refused or failed is logged: the mark goes on.
    pub(super) async fn last_progress(&self, job: &mut DbJob<R>, completing: bool) {
        // A value written in a completion's transaction that failed to commit
        // comes back for the errored mark that follows.
        let pending = self.pending_progress.last(job.lease).await;
        let Some(value) = pending.or_else(|| job.uncommitted_progress.take()) else {
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
            job.lease.id,
            job.lease.token,
            None,
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
        let pending = Pending::default();
        pending.put(live, serde_json::json!({"n": 1}));
        assert_eq!(pending.take(&[live]).len(), 1);
        pending.returned(&[7], Some(&[7]));
        pending.put(live, serde_json::json!({"n": 2}));
        pending.put(old, serde_json::json!({"stale": true}));
        assert!(pending.take(&[old]).is_empty());
        let reports = pending.lock();
        let r = reports.get(&7).expect("the live attempt's entry");
        assert_eq!((r.token, r.counted_by_beats), (200, 1));
        assert_eq!(r.value, Some(serde_json::json!({"n": 2})));
    }
}
