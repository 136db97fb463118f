//! Maintenance services over a job table: the [`Resetter`] requeues stalled
//! jobs, the [`Purger`] deletes or archives old finished ones.

pub(crate) mod purger;
pub(crate) mod resetter;

pub use crate::store::ResetOutcome;
pub use purger::{PurgeOptions, Purged, Purger};
pub use resetter::{Resetter, ResetterOptions};
