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

mod admin;
mod columns;
mod completer;
mod connection_loss;
mod consumer_group;
mod cron;
#[cfg(feature = "dashboard")]
pub mod dashboard;
mod enqueue;
mod error;
mod gauges;
mod job_filter;
mod leader;
mod limits;
mod log_store;
mod message;
mod migrate;
mod nodes;
mod notify;
mod options;
mod pauses;
mod purger;
mod queues;
mod resetter;
mod retry;
mod schema_check;
mod sql;
mod store;
mod worker;

pub use admin::{Admin, Canceled, QueueCounts, Status};
pub use columns::STANDARD_COLUMNS;
pub use consumer_group::{
    Consumer, ConsumerGroup, ConsumerGroupOptions, ConsumerLag, consumer_assignments, consumer_lag,
};
pub use cron::{Backfill, DEFAULT_CRON_TABLE, Scheduler, cron_table_sql};
pub use enqueue::{EnqueueOptions, Enqueued, Enqueuer, KeyMode, NewJob};
pub use error::{Error, Result};
pub use gauges::{OLDEST_JOB_AGE_SECONDS, QUEUE_DEPTH, QueueStat};
pub use job_filter::{
    BulkAction, FieldFilter, JobFilter, JobPage, JobSort, JobSummary, PageRequest, format_age,
};
pub use leader::{
    DEFAULT_LEADER_TABLE, LEADER, LeaderElection, LeaderOptions, current_leader, leader_table_sql,
};
pub use limits::{DEFAULT_LIMIT_TABLE, Limit, Limits, limit_table_sql};
pub use log_store::{
    ConsumerBatch, DEFAULT_ASSIGNMENT_TABLE, DEFAULT_CHECKPOINT_TABLE, LogEvent, LogJob,
    LogOptions, LogStore, consumer_tables_sql, events_table_sql,
};
pub use message::MAX_FAILURE_MESSAGE_BYTES;
pub use migrate::{OptionalColumns, enqueue_function_sql, job_table_sql, optional_columns_sql};
pub use nodes::{
    DEFAULT_NODE_TABLE, NODES_LIVE, Node, NodeInfo, NodeOptions, live_nodes, node_table_sql,
};
pub use notify::{Listen, default_notify_channel, notify_trigger_sql};
pub use options::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_NUM_RETRIES, DEFAULT_RESET_FAILURE_MESSAGE, Handling,
    RetryPolicy, ScanFn, StoreOptions,
};
pub use pauses::{DEFAULT_PAUSE_TABLE, Pause, Pauses, pause_table_sql};
pub use purger::{PURGED_TOTAL, PurgeOptions, Purged, Purger};
pub use queues::{QueueWorkers, QueuesShutdown};
pub use resetter::{
    RESET_ERRORS_TOTAL, RESET_FAILURES_TOTAL, RESETS_TOTAL, ResetOutcome, Resetter, ResetterOptions,
};
pub use store::{DbConditions, DbJob, DbStore, RESERVED_CONNECTIONS};
pub use worker::new_worker;

pub use sea_query;
pub use workerutil;

/// The guide's and the operations manual's code blocks, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/guide.md")]
#[doc = include_str!("../../docs/operations.md")]
struct GuideDoctests;
