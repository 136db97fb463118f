//! Grouped marks for heartbeat handling. Jobs that finish while the groups in
//! flight (at most two) are being written wait for the next, so under load one fenced statement marks
//! many jobs (group commit), and an idle worker adds no delay at all. Each job
//! still gets its own answer: the state written, or none when its lease no
//! longer owned the row.
//!
//! Groups are written in the order of their ids (which made deadlocks
//! between two workers' release triggers rarer), and a group Postgres rolls
//! back as a deadlock victim or for a serialization failure is written again
//! (see `transient.rs`).
//!
//! A crash before a group is written leaves its jobs `processing` with their
//! heartbeats stopping: the resetter requeues them, so nothing is lost, but a
//! job that had finished may run again (at-least-once, as heartbeat handling
//! always is).

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::{PgPool, Row};
use tokio::sync::{Semaphore, mpsc, oneshot};

use workerutil::JobState;

use crate::retry::RetryRule;
use crate::sql::{self, Mark, MarkKind};
use crate::store::Resolved;

/// The most jobs one statement marks.
const MAX_GROUP: usize = 1000;
/// Groups written at once: while they are, the next one fills.
const MAX_IN_FLIGHT: usize = 2;
/// Below this many marks, a second group waits for the one in flight.
const SMALL_GROUP: usize = 16;

/// A job's answer: the state written (`None`: not marked, the lease no
/// longer owned the row), or why it was not written.
type Answer = Result<Option<JobState>, MarkFailed>;

/// A grouped mark that was not written: the database error rendered, and
/// whether it is the job's own (its row alone refused it: a trigger, a
/// constraint), as opposed to a group's or the connection's trouble.
#[derive(Debug, Clone)]
pub(crate) struct MarkFailed {
    message: String,
    pub(crate) own: bool,
}

impl std::fmt::Display for MarkFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for MarkFailed {}

impl MarkFailed {
    fn other(message: &str) -> MarkFailed {
        MarkFailed {
            message: message.to_owned(),
            own: false,
        }
    }
}

struct Pending {
    mark: Mark,
    /// The retry rule of an errored mark: the store's, or its kind's.
    retry: RetryRule,
    done: oneshot::Sender<Answer>,
}

/// The handle the store marks through; the writer task ends when it is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Completer {
    tx: mpsc::UnboundedSender<Pending>,
}

impl Completer {
    /// Starts the writer task.
    pub(crate) fn spawn(pool: PgPool, options: Arc<Resolved>) -> Completer {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_groups(pool, options, rx));
        Completer { tx }
    }

    /// Queues `mark` for the next group and waits until it is written.
    pub(crate) async fn mark(&self, mark: Mark, retry: RetryRule) -> Answer {
        let (done, answer) = oneshot::channel();
        self.tx
            .send(Pending { mark, retry, done })
            .map_err(|_| MarkFailed::other("the grouped-mark writer has stopped"))?;
        answer
            .await
            .map_err(|_| MarkFailed::other("the grouped-mark writer stopped before writing"))?
    }
}

async fn write_groups(
    pool: PgPool,
    options: Arc<Resolved>,
    mut rx: mpsc::UnboundedReceiver<Pending>,
) {
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    loop {
        // While every writer is busy, marks pile up into the next group.
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let mut group = Vec::with_capacity(MAX_GROUP);
        if rx.recv_many(&mut group, MAX_GROUP).await == 0 {
            return;
        }
        if group.len() < SMALL_GROUP && in_flight.available_permits() == 0 {
            // Another group is on its way: rather than a round trip for a few
            // rows, let it land and take what piled up meanwhile.
            drop(in_flight.clone().acquire_owned().await);
            while group.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(pending) => group.push(pending),
                    Err(_) => break,
                }
            }
        }
        let (pool, options) = (pool.clone(), options.clone());
        tokio::spawn(async move {
            let _permit = permit;
            write_answering(&pool, &options, group).await;
        });
    }
}

/// Writes one group and answers each of its jobs.
async fn write_answering(pool: &PgPool, options: &Resolved, mut group: Vec<Pending>) {
    // Every group takes its rows' locks in one order: fewer deadlocks.
    group.sort_by_key(|p| p.mark.id);
    // Answers are matched by id, so two attempts of one job (a stale one and
    // its successor, both of this process) never share a statement: the
    // later ones are written after it, each told what became of its own.
    let mut later = Vec::new();
    let mut i = 1;
    while i < group.len() {
        if group[i].mark.id == group[i - 1].mark.id {
            later.push(group.remove(i));
        } else {
            i += 1;
        }
    }
    if !later.is_empty() {
        Box::pin(write_answering(pool, options, group)).await;
        return Box::pin(write_answering(pool, options, later)).await;
    }
    let marks: Vec<(Mark, &RetryRule)> = group.iter().map(|p| (p.mark.clone(), &p.retry)).collect();
    let started = std::time::Instant::now();
    let result = write_again_if_transient(pool, options, &marks).await;
    tracing::debug!(store = %options.name, marks = marks.len(), took = ?started.elapsed(), "wrote a group of marks");
    match result {
        Ok(marked) => {
            for p in group {
                let _ = p.done.send(Ok(marked.get(&p.mark.id).copied()));
            }
        }
        // One bad row must not sink the others: write them one by one.
        Err(_) if group.len() > 1 => {
            for p in group {
                let answer = write_again_if_transient(pool, options, &[(p.mark.clone(), &p.retry)])
                    .await
                    .map(|marked| marked.get(&p.mark.id).copied())
                    .map_err(MarkFailed::alone);
                let _ = p.done.send(answer);
            }
        }
        Err(failure) => {
            let failed = MarkFailed::alone(failure);
            for p in group {
                let _ = p.done.send(Err(failed.clone()));
            }
        }
    }
}

/// [`write`], written again while Postgres rolls it back as a deadlock
/// victim or for a serialization failure: such a write changed nothing.
async fn write_again_if_transient(
    pool: &PgPool,
    options: &Resolved,
    marks: &[(Mark, &RetryRule)],
) -> Result<HashMap<i64, JobState>, Failure> {
    super::transient::again_if_transient(
        "a group of marks",
        || write(pool, options, marks),
        |failure: &Failure| failure.transient,
    )
    .await
}

impl MarkFailed {
    /// The failure of a group that held one mark only: a refusal for its
    /// row's own reason is that job's.
    fn alone(failure: Failure) -> MarkFailed {
        MarkFailed {
            own: failure.refused,
            message: failure.message,
        }
    }
}

/// A group's failed write: the database error rendered, whether Postgres
/// rolled it back for a reason that passes (a deadlock, a serialization
/// failure), and whether the database refused it for its rows' own reason
/// (a trigger, a constraint: nothing was written; `failed_completion::is_rows_own`).
struct Failure {
    message: String,
    transient: bool,
    refused: bool,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<sqlx::Error> for Failure {
    fn from(err: sqlx::Error) -> Failure {
        let transient = super::transient::is_transient(&err);
        Failure {
            refused: super::failed_completion::is_rows_own(&err),
            transient,
            message: format!("database error in mark_group: {err}"),
        }
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure {
            message,
            transient: false,
            refused: false,
        }
    }
}

/// Writes one group; returns the ids that were still owned and got marked,
/// each with the state written.
async fn write(
    pool: &PgPool,
    options: &Resolved,
    marks: &[(Mark, &RetryRule)],
) -> Result<HashMap<i64, JobState>, Failure> {
    // Completions alone (the usual group) take a smaller statement.
    if marks.iter().all(|(m, _)| m.kind == MarkKind::Complete) {
        let ids = marks.iter().map(|(m, _)| m.id).collect();
        let tokens = marks.iter().map(|(m, _)| m.token).collect();
        let results = marks.iter().map(|(m, _)| m.result.clone()).collect();
        let spans = marks.iter().map(|(m, _)| m.span.clone()).collect();
        let statement = sql::complete_group(options, ids, tokens, (results, spans));
        return run(pool, statement).await;
    }
    // One statement per retry rule: the store's, and each kind's own that
    // has errored marks here (a rule's values are bound per statement).
    let mut groups: Vec<(&RetryRule, Vec<Mark>)> = Vec::new();
    for (mark, rule) in marks {
        let rule = if mark.kind == MarkKind::Errored {
            *rule
        } else {
            marks[0].1
        };
        match groups.iter_mut().find(|(r, _)| *r == rule) {
            Some((_, group)) => group.push(mark.clone()),
            None => groups.push((rule, vec![mark.clone()])),
        }
    }
    if let [(rule, group)] = &groups[..] {
        return run(pool, sql::mark_group(options, group, rule)).await;
    }
    // Several statements commit together, so a failed group written again
    // one by one finds none of its marks already written.
    let mut tx = pool.begin().await?;
    let mut marked = HashMap::new();
    for (rule, group) in groups {
        marked.extend(run(&mut *tx, sql::mark_group(options, &group, rule)).await?);
    }
    tx.commit().await?;
    Ok(marked)
}

/// Runs a group's statement: the ids it marked, with the state each got
/// (`completed` where the statement returns none: completions alone).
async fn run<'c>(
    db: impl Into<sql::On<'c>>,
    statement: sql::Statement,
) -> Result<HashMap<i64, JobState>, Failure> {
    let rows = statement.fetch_all(db).await?;
    rows.iter()
        .map(|r| {
            let state = match r.try_get::<String, _>("state") {
                Ok(state) => state.parse().map_err(|e| format!("mark_group: {e}"))?,
                Err(_) => JobState::Completed,
            };
            Ok((r.get::<i64, _>("id"), state))
        })
        .collect()
}
