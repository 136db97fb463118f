//! Log consumers: named consumers of an append-only events table, each with a
//! checkpoint advanced in its slice's transaction ([`LogStore`]), assigned to
//! live processes by the leader ([`ConsumerGroup`]), woken by the process's
//! reader of the log's head ([`LogDispatcher`]).
//!
#![doc = include_str!("../../docs/modules/consumers.md")]

pub(crate) mod books;
mod consumer;
pub(crate) mod dispatcher;
pub(crate) mod group;
pub(crate) mod options;
pub(crate) mod rebalance;
pub(crate) mod slice;
pub(crate) mod store;

pub use consumer::{Consumer, Consumers};
pub use dispatcher::{DispatcherOptions, LogDispatcher};
pub use group::{
    ConsumerGroup, ConsumerGroupOptions, ConsumerLag, consumer_assignments, consumer_lag,
};
pub use options::{DEFAULT_TRANSACTION_COLUMN, LogEvent, LogOptions};
pub use store::{
    DEFAULT_ASSIGNMENT_TABLE, DEFAULT_CHECKPOINT_TABLE, EventSlice, LogJob, LogPoint, LogStore,
};
