//! The enqueue side and the kinds of job: enqueue, typed jobs, the generated SQL functions, kinds
//! with their settings and retries, and trace context from enqueue to every attempt.
//!
//! One test binary for the feature; each file is a module of it and keeps
//! its name (docs cite tests as `file.rs::test_name`).

#[path = "../common/mod.rs"]
mod common;

mod enqueue;
mod enqueue_replace;
mod kind_inputs;
mod kind_retry;
mod kinds;
mod sql_function_inputs;
mod sql_functions;
mod traces;
mod typed_jobs;
