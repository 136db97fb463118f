//! The generic worker on the in-memory store: its behaviour, the kind registry, snoozes, jobs
//! withheld at their open and the conformance suite.
//!
//! One test binary for the feature; each file is a module of it and keeps
//! its name (docs cite tests as `file.rs::test_name`).

mod conformance;
mod registry;
mod slow_mark;
mod snooze;
mod withheld;
mod worker;
