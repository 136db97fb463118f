//! Job tables: one `JobTable` described and checked once, views, quoted names, partitions, NUL
//! characters, config files, the reference migrations and bad schemas or configuration.
//!
//! One test binary for the feature; each file is a module of it and keeps
//! its name (docs cite tests as `file.rs::test_name`).

#[path = "../common/mod.rs"]
mod common;

/// The fixtures of `common/` that files of this binary share, each compiled once.
#[path = "../common"]
mod fixtures {
    #[path = "purge.rs"]
    pub(crate) mod purge;
    #[path = "router.rs"]
    pub(crate) mod router;
}

mod config_files;
mod job_table;
mod nul_characters;
mod partitioned;
mod partitioned_leader;
mod quoted_names;
mod reference_migrations;
mod robustness_config;
mod view;
