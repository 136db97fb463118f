//! The claim: phase one claims rows in one statement (limits, pauses, flags
//! and the claim cursor shape it), phase two turns each row into a job, failing
//! a row that cannot become one with the reason, so one bad row never stops
//! the worker.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;

use sqlx::Row;
use sqlx::postgres::PgRow;
use workerutil::{BoxError, Lease, Record, error_chain};

use super::{DbConditions, DbJob, DbStore};
use crate::error::{Error, Result};
use crate::sql;

impl<R: Record> DbStore<R> {
    pub(super) async fn claim_jobs(
        &self,
        hostname: &str,
        conditions: &DbConditions,
        limit: usize,
    ) -> std::result::Result<Vec<DbJob<R>>, BoxError> {
        let o = &self.options;
        // Before the claim: a pause announced while it runs is not missed.
        let claimed = self.pauses_heard.at_claim();
        self.come_due.tag(&self.pool, o).await;
        // The claim reads the records itself, unless a view must be read after
        // the table's rows are claimed. Transactional handling locks each row
        // later, in the job's own task (`open`), so claims never wait for that.
        let with_record = o.view.is_none();
        let started = std::time::Instant::now();
        let mut claim_conditions = std::borrow::Cow::Borrowed(conditions.0.as_slice());
        // Forbidden flags are one more condition: each set of them names a
        // cursor of its own, so rows a set skipped are never behind the
        // cursor of a set that allows them.
        if let (Some(forbidden), Some(column)) = (&o.forbidden_flags, &o.flags_column) {
            let flags = forbidden.current().await;
            if !flags.is_empty() {
                claim_conditions
                    .to_mut()
                    .push(sql::not_flagged(o, column, &flags));
            }
        }
        // The conditions as text (values inlined) name their cursor.
        let cursor = self
            .cursor
            .as_ref()
            .map(|c| (c, sql::conditions_key(&claim_conditions)));
        let start = cursor
            .as_ref()
            .map(|(c, key)| c.start(key, &claim_conditions));
        if let Some(low) = start.and_then(|s| s.low) {
            claim_conditions
                .to_mut()
                .push(sql::claim_cursor_condition(o, low));
        }
        let claim = |limit: usize, mode| {
            let conditions = &claim_conditions;
            sql::claim_limited(o, hostname, conditions, limit.max(1), with_record, mode)
        };
        let rows = if sql::limited(o).is_some() {
            super::limited::claim(&self.pool, o, limit.max(1), claim).await?
        } else {
            claim(limit, sql::LimitedClaim::Serialized)
                .fetch_all(&self.pool)
                .await
                .map_err(Error::db("claim"))?
        };
        tracing::debug!(store = %o.name, limit, claimed = rows.len(), cursor = ?start.and_then(|s| s.low), took = ?started.elapsed(), "claimed");
        // The rows come back in id order (the cursor's condition for use). A
        // claim that a limit bound may have passed rows over: the cursor stays.
        let bound = sql::limited(o).is_some()
            && rows
                .iter()
                .any(|r| r.get::<Option<bool>, _>(sql::CLAIM_BOUND) != Some(false));
        let last = rows.iter().map(|r| r.get::<i64, _>(sql::RECORD_ID)).max();
        if let (Some((cursor, key)), Some(start), Some(last), false) = (&cursor, start, last, bound)
        {
            cursor.claimed_up_to(key, start, last);
        }
        let mut leases = Vec::with_capacity(rows.len());
        let mut opened: Vec<Result<Option<DbJob<R>>>> = Vec::with_capacity(rows.len());
        let mut claimed_rows = Vec::new();
        let mut traces: HashMap<i64, crate::trace::JobTrace> = HashMap::new();
        // Each row's `progress_seq`: its attempt numbers its writes above it.
        let mut seqs: HashMap<i64, i64> = HashMap::new();
        for row in rows {
            let lease = Lease {
                id: row.get(sql::RECORD_ID),
                token: row.get(sql::CLAIMED_TOKEN),
            };
            if o.traces {
                traces.insert(lease.id, crate::trace::JobTrace::from_claim(&row));
            }
            if o.progress || o.progress_table.is_some() {
                seqs.insert(lease.id, row.get(sql::CLAIMED_PROGRESS_SEQ));
            }
            if row
                .get::<Option<bool>, _>(sql::CLAIMED_CANCEL)
                .unwrap_or(false)
            {
                // Canceled while it waited: record that instead of running it.
                let canceled = self
                    .fail_unstarted(lease, "job was canceled before it started")
                    .await;
                opened.push(canceled.map(|_| None));
            } else if with_record {
                claimed_rows.push((lease, row));
            } else {
                leases.push(lease);
            }
        }
        for (lease, row) in claimed_rows {
            let trace = traces.remove(&lease.id);
            let seq = seqs.remove(&lease.id).unwrap_or(0);
            opened.push(
                self.scan_or_fail(lease, Ok(Some(row)), trace, claimed, seq)
                    .await,
            );
        }
        // One read for the whole batch, through the view.
        if !leases.is_empty() {
            let ids: Vec<i64> = leases.iter().map(|l| l.id).collect();
            let ids_len = ids.len();
            match sql::select_records(o, ids).fetch_all(&self.pool).await {
                Ok(rows) => {
                    let mut by_id: HashMap<i64, PgRow> = rows
                        .into_iter()
                        .map(|r| (r.get::<i64, _>(sql::RECORD_ID), r))
                        .collect();
                    for lease in leases {
                        let row = Ok(by_id.remove(&lease.id));
                        let trace = traces.remove(&lease.id);
                        let seq = seqs.remove(&lease.id).unwrap_or(0);
                        opened.push(self.scan_or_fail(lease, row, trace, claimed, seq).await);
                    }
                }
                // One row the view cannot produce (its own data breaks a
                // column, a function of the view raises for it) must not
                // strand or fail the others: each is read alone (one claimed
                // alone failed already), and one whose own read fails for
                // its data is failed with the reason. Any other failure (the
                // view is out, a timeout, a lost connection) is no row's:
                // they stay `processing` for the resetter, paced by the
                // stall age.
                Err(err) if super::failed_completion::is_rows_own(&err) => {
                    let mut err = Some(err);
                    for lease in leases {
                        let row = match err.take() {
                            Some(e) if ids_len == 1 => Err(e),
                            _ => {
                                sql::select_records(o, vec![lease.id])
                                    .fetch_optional(&self.pool)
                                    .await
                            }
                        };
                        match row {
                            Err(e) if !super::failed_completion::is_rows_own(&e) => {
                                opened.push(Err(Error::db("select_records")(e)));
                            }
                            row => {
                                let trace = traces.remove(&lease.id);
                                let seq = seqs.remove(&lease.id).unwrap_or(0);
                                opened
                                    .push(self.scan_or_fail(lease, row, trace, claimed, seq).await);
                            }
                        }
                    }
                }
                Err(err) => opened.push(Err(Error::db("select_records")(err))),
            }
        }
        let mut jobs = Vec::with_capacity(opened.len());
        let mut first_error = None;
        // One bad row must not strand the others this call claimed.
        for result in opened {
            match result {
                Ok(Some(job)) => jobs.push(job),
                Ok(None) => {}
                Err(err) => {
                    tracing::error!(error = %err, "could not open a claimed job; the resetter will requeue it");
                    first_error.get_or_insert(err);
                }
            }
        }
        match first_error {
            Some(err) if jobs.is_empty() => Err(err.into()),
            _ => Ok(jobs),
        }
    }

    /// Turns a phase-2 row into a job. A row that cannot become one (it fails to
    /// scan, the view hides it, the read failed) is failed here with the reason,
    /// so a bad row never stops the worker.
    async fn scan_or_fail(
        &self,
        lease: Lease,
        row: std::result::Result<Option<PgRow>, sqlx::Error>,
        trace: Option<crate::trace::JobTrace>,
        claimed: super::paused::AtClaim,
        progress_seq: i64,
    ) -> Result<Option<DbJob<R>>> {
        let failure = match row {
            // The scan is the user's code: a panic in it (`row.get` on a NULL)
            // fails this row with the panic message, like an error would.
            Ok(Some(row)) => match std::panic::catch_unwind(AssertUnwindSafe(|| (self.scan)(&row)))
                .unwrap_or_else(|panic| {
                    Err(format!("the scan panicked: {}", workerutil::panic_message(&panic)).into())
                }) {
                Ok(record) if record.id() == lease.id => {
                    return Ok(Some(DbJob {
                        record,
                        lease,
                        tx: None,
                        retry_payload: None,
                        result: None,
                        result_refused: None,
                        result_cap: self
                            .options
                            .result_column
                            .as_ref()
                            .map(|_| self.options.max_result_bytes),
                        numbers: super::progress::Numbers::above(progress_seq),
                        trace,
                        attempt_trace: None,
                        attempt_span: None,
                        unbeaten: self
                            .options
                            .traces
                            .then(|| super::heartbeat::Unbeaten::new(&self.attempt_spans, lease)),
                        claimed,
                        uncommitted_progress: None,
                    }));
                }
                Ok(record) => format!(
                    "failed to scan record {}: the scanned record has id {}",
                    lease.id,
                    record.id()
                ),
                Err(err) => format!(
                    "failed to scan record {}: {}",
                    lease.id,
                    error_chain(err.as_ref())
                ),
            },
            Ok(None) => format!(
                "record {} is not visible through {}",
                lease.id,
                self.options.source().display_name()
            ),
            Err(err) => format!("failed to read record {}: {}", lease.id, error_chain(&err)),
        };
        let marked = self.fail_unstarted(lease, &failure).await?;
        if marked {
            tracing::error!(store = %self.options.name, record_id = lease.id, reason = %failure, "marked the job failed");
        } else {
            // The fenced mark found it reset between the two phases: not ours any more.
            tracing::warn!(store = %self.options.name, record_id = lease.id, "claimed row was reset before it could be opened");
        }
        Ok(None)
    }
}
