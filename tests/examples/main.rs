//! Every example run as a process, and cluster_node processes in separate network namespaces.
//!
//! One test binary for the feature; each file is a module of it and keeps
//! its name (docs cite tests as `file.rs::test_name`).

mod examples;
mod netns;
