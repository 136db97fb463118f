//! The names progress and checkpoints add to a job table (`dbworker
//! migration --progress`): fixed, like the other optional columns.

/// The job's public progress (`jsonb`): what `dbworker show` and the
/// dashboard show; kept when the job completes.
pub(crate) const PROGRESS: &str = "progress";
/// The job's private checkpoint (`jsonb`): what the next attempt resumes
/// from; dropped when the job completes.
pub(crate) const CHECKPOINT: &str = "checkpoint";
/// How many progress or checkpoint writes the job has had (`bigint`): every
/// write names the count it read, so none can land out of order.
pub(crate) const PROGRESS_SEQ: &str = "progress_seq";
/// The largest progress or checkpoint stored, as JSON text.
pub(crate) const MAX_PROGRESS_BYTES: usize = 64 * 1024;
