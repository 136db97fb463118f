//! The progress-beats model's state: the row, the worker's `Pending` entry,
//! the two attempts, the heartbeat loop's beat, and the ghosts the
//! properties read.

/// One step of attempt 1's handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `report_progress(v)`.
    Report(u8),
    /// `set_progress(v)`: a numbered write of a newer value.
    SetProgress(u8),
    /// `save_checkpoint`: a numbered write keeping progress and the unsent report.
    Checkpoint,
    /// The final mark, with the last report no beat is known to have written.
    Finish,
}

/// Attempt 1's handler: two reports in a row (the second replaces the
/// first), a write superseding them, a report a checkpoint write keeps, the end.
pub const PROGRAM: [Op; 6] = [
    Op::Report(1),
    Op::Report(2),
    Op::SetProgress(3),
    Op::Report(4),
    Op::Checkpoint,
    Op::Finish,
];

/// The last value attempt 1 reports or writes.
pub(super) const LAST: u8 = 4;

/// Attempt 2's one write, above every value of attempt 1.
pub(super) const SECOND_VALUE: u8 = 9;

/// The job's state column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum JobState {
    /// Claimed.
    #[default]
    Processing,
    /// Requeued by the resetter.
    Queued,
    /// Marked by attempt 1.
    Done,
}

/// The job row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Row {
    /// `state`.
    pub state: JobState,
    /// The fencing token: the latest claim's number.
    pub token: u8,
    /// `progress`: the last value written.
    pub progress: u8,
    /// `progress_seq`: the number of the newest write landed.
    pub seq: u8,
}

impl Row {
    /// Whether `owned(id, token)` matches the row now.
    pub(super) fn owned_by(&self, token: u8) -> bool {
        self.state == JobState::Processing && self.token == token
    }
}

/// Attempt 1's entry in the worker's `Pending`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Pending {
    /// Reported, not taken by a beat.
    pub value: Option<u8>,
    /// Taken by the beat, not returned: the report and its number.
    pub in_flight: Option<(u8, u8)>,
    /// The last number the attempt gave a write (from the row's number at
    /// the claim: 0).
    pub numbered: u8,
    /// The number of the attempt's newest own write of a progress value: a
    /// report numbered below it is older, and never goes back.
    pub superseded: u8,
    /// An own write is on its way.
    pub writing: bool,
}

/// Attempt 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct First {
    /// Its next step in [`PROGRAM`].
    pub pc: u8,
    /// The number of its write on its way.
    pub writing: Option<u8>,
    /// Its mark ran, or a write was refused (the handler stops): no more
    /// steps, and its lease leaves the heartbeat's list.
    pub ended: bool,
}

/// The heartbeat loop's current beat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Beat {
    /// None running.
    #[default]
    Idle,
    /// Its statement runs: the report it took, its number, and
    /// `dbworker_owned`'s row.
    Sent(u8, u8, bool),
    /// Its statement ended, the report written (`true`) or not; not returned yet.
    Ended(bool),
}

/// The whole system's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct State {
    /// The row.
    pub row: Row,
    /// Attempt 1's `Pending` entry.
    pub pending: Pending,
    /// Attempt 1.
    pub first: First,
    /// Attempt 2, once claimed: the number of its write (above the row's
    /// number its claim read), and whether it wrote.
    pub second: Option<(u8, bool)>,
    /// The beat.
    pub beat: Beat,
    /// An abandoned beat's statement, still running: `(value, number, owned)`.
    pub orphan: Option<(u8, u8, bool)>,
    /// Beats abandoned so far.
    pub abandons: u8,
    /// The resetter ran.
    pub reset: bool,
    /// Ghost: a beat wrote the row while its attempt did not own it.
    pub late: bool,
    /// Ghost: an owner's write was refused.
    pub owner_refused: bool,
    /// Ghost: a write lowered the row's progress.
    pub regressed: bool,
    /// Ghost: a beat given up landed an older report over a newer value.
    pub late_over_newer: bool,
    /// Ghost: attempt 1's mark was accepted.
    pub marked: bool,
    /// Ghosts for the "sometimes" properties, by the indexes below.
    pub seen: [bool; 8],
}

/// Indexes into [`State::seen`], one per "sometimes" property.
pub(super) const BEAT_WROTE: usize = 0;
pub(super) const BEAT_SKIPPED: usize = 1;
pub(super) const GAVE_BACK: usize = 2;
pub(super) const OUTNUMBERED: usize = 3;
pub(super) const LAST_WRITTEN: usize = 4;
pub(super) const SECOND_WROTE: usize = 5;
pub(super) const LATE_REFUSED: usize = 6;
pub(super) const CARRIED_TO_MARK: usize = 7;

/// One atomic step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Attempt 1's next report, or the start of its next write (its number
    /// taken), or its final mark.
    Step,
    /// Attempt 1's write lands (or is refused) and returns.
    Land,
    /// A beat takes the report, numbers it, and reads its snapshot.
    BeatSend,
    /// The beat's lock step: it writes the row if it still matches.
    BeatLock,
    /// The beat skips the row (locked by the handler's transaction).
    BeatMiss,
    /// The beat returns (`returned`).
    BeatReturn,
    /// The loop gives the beat up, or it fails, its commit unknown: `returned`
    /// as failed; the statement runs on (landing at once: committed, failed).
    Abandon,
    /// The abandoned statement's lock step.
    OrphanLock,
    /// The abandoned statement fails after all.
    OrphanMiss,
    /// The resetter requeues the job.
    Reset,
    /// The next claim: token 2; attempt 2 reads the row's number.
    Claim,
    /// Attempt 2's numbered write.
    SecondWrite,
}
