//! `dbworker`: background workers over your own PostgreSQL job tables.
//!
//! This page is the short tour (`docs/front.md` in this crate); the book is
//! the [`guide`], the operations manual [`operations`];
//! [architecture.md](https://github.com/dbworker/dbworker/blob/main/docs/architecture.md)
//! in the repository maps the code.
//!
#![doc = include_str!("../docs/front.md")]
// docs.rs (`[package.metadata.docs.rs]`) labels feature-gated items.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The ground floor: names, errors, values and every SQL statement. None of
// these imports a feature module.
mod columns;
mod error;
mod job_filter;
mod message;
mod retry;
mod sql;

// Shared machinery the features build on.
mod grants;
mod notify;
mod pooler;
mod runner;
mod schema_check;
// A value bound to a statement (ground floor: sea-query's Value, wrapped).
mod sql_value;
// The job table every service takes (above the SQL, below the services).
mod table;
// Trace context from enqueue to every attempt (enqueue and store use it).
mod trace;

// Building a worker over a store (above the store).
mod worker;

pub mod admin;
mod client;
pub mod cluster;
pub mod consumers;
pub mod control;
pub mod cron;
#[cfg(feature = "dashboard")]
#[cfg_attr(docsrs, doc(cfg(feature = "dashboard")))]
pub mod dashboard;
pub mod ddl;
mod enqueue;
pub mod history;
pub mod items;
mod job;
pub mod maintenance;
pub mod metrics;
pub mod prelude;
pub mod queues;
mod store;
pub mod workflow;
// The contract every service meets (above the leader election it may run under).
mod service;

pub use client::{Client, ClientBuilder, ClientOptions, ClusterOptions};
pub use enqueue::{
    DependencyPolicy, Enqueued, Enqueuer, IntoJob, KeyMode, MAX_KEY_CHARS, MAX_NAME_CHARS, NewJob,
    Signals,
};
pub use error::{Error, Result};
pub use job::{ArgsHandler, ArgsRecord, Handlers, Job, JobArgs, JobDefaults, JobHandler, TypedJob};
pub use maintenance::resetter::{Resetter, ResetterOptions};
pub use schema_check::probe_connection as check_connection;
pub use service::Service;
pub use sql::{Pooler, pooler, set_pooler};
pub use sql_value::SqlValue;
pub use store::{
    ClaimOptions, DEFAULT_MAX_NUM_RETRIES, DEFAULT_MAX_RESULT_BYTES, DEFAULT_RESET_FAILURE_MESSAGE,
    DbConditions, DbJob, DbStore, ForbiddenFlags, ForbiddenFlagsFn, Handling, Listen,
    MAX_FAILURE_MESSAGE_BYTES, QueueGauges, QueueStat, RESERVED_CONNECTIONS, Retry, RetryPolicy,
    StallOptions, StoreOptions, default_notify_channel,
};
pub use table::{
    Aging, DEFAULT_CONNECT_TIMEOUT, DEFAULT_ERROR_HISTORY_LIMIT, JobTable, JobTableOptions,
};
pub use trace::TraceContext;
pub use worker::new_worker;

pub use workerutil;

#[doc = include_str!("../docs/guide.md")]
pub mod guide {}

#[doc = include_str!("../docs/operations.md")]
pub mod operations {}

// The README's example compiles as a doctest (crates.io shows the README).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;
