//! Maintenance services over a job table: the [`Resetter`](crate::Resetter) requeues stalled
//! jobs, the [`Purger`] deletes or archives old finished ones (on a
//! partitioned table, by dropping whole partitions where it can).
//!
#![doc = include_str!("../../docs/modules/maintenance.md")]

mod archive;
pub(crate) mod partitions;
pub(crate) mod purge_options;
pub(crate) mod purger;
pub(crate) mod resetter;

pub use crate::store::ResetOutcome;
pub use partitions::DroppedPartition;
pub use purge_options::PurgeOptions;
pub use purger::{Purged, Purger};
