//! `dbworker`: background workers over your own PostgreSQL job tables.
//!
//! A [`DbStore`] implements [`workerutil::Store`] for a job table you own (extra
//! columns welcome, a view for reading records, renamed columns). Jobs are
//! dequeued in two phases: a claim that commits on its own (`FOR UPDATE SKIP
//! LOCKED`, setting `processing` and a fencing token), then a transaction that
//! locks the row for the handler. Every later write carries the token, so a
//! stale worker can never overwrite a job that was reset and claimed again. A
//! [`Resetter`] requeues stalled jobs, in the worker's process or its own.
//!
//! Start with the guide in `docs/guide.md` and `cargo run --example quickstart`.

// The ground floor: names, errors, values and every SQL statement. None of
// these imports a feature module.
mod columns;
mod error;
mod job_filter;
mod message;
mod retry;
mod sql;

// Shared machinery the features build on.
mod notify;
mod schema_check;
mod worker;

pub mod admin;
pub mod cluster;
pub mod consumers;
pub mod control;
pub mod cron;
#[cfg(feature = "dashboard")]
pub mod dashboard;
pub mod ddl;
pub mod enqueue;
pub mod maintenance;
pub mod metrics;
pub mod prelude;
pub mod queues;
pub mod store;

pub use enqueue::{Enqueuer, NewJob};
pub use error::{Error, Result};
pub use maintenance::Resetter;
pub use store::{DbConditions, DbJob, DbStore, Handling, RetryPolicy, StoreOptions};
pub use worker::new_worker;

pub use sea_query;
pub use workerutil;

/// The guide's and the operations manual's code blocks, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/guide.md")]
#[doc = include_str!("../../docs/operations.md")]
struct GuideDoctests;
