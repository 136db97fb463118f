//! Workflows, batches, item jobs and results passed downstream.
//!
//! One test binary for the feature; each file is a module of it and keeps
//! its name (docs cite tests as `file.rs::test_name`).

#[path = "../common/mod.rs"]
mod common;

mod batches;
mod deletes;
mod items;
mod release_set;
mod results;
mod workflows;
