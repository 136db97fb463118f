//! Control tables shared by every process: durable [`Pauses`] of a table or a
//! queue, and global [`Limits`] (processing, per key, rate) the claim enforces.

pub(crate) mod limits;
pub(crate) mod pauses;

pub use limits::{DEFAULT_LIMIT_TABLE, Limit, Limits};
pub use pauses::{DEFAULT_PAUSE_TABLE, Pause, Pauses};
