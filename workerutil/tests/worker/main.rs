//! The generic worker on the in-memory store: its behaviour, the kind registry, snoozes and the
//! conformance suite.
//!
//! One test binary for the feature; each file is a module of it and keeps
//! its name (docs cite tests as `file.rs::test_name`).

mod conformance;
mod registry;
mod slow_mark;
mod snooze;
mod worker;
