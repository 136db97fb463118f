//! One module per family of subcommands.

pub(crate) mod completions;
pub(crate) mod control;
pub(crate) mod cron;
pub(crate) mod fair;
pub(crate) mod history;
pub(crate) mod jobs;
pub(crate) mod json;
pub(crate) mod limits;
pub(crate) mod maintenance;
pub(crate) mod migration;
pub(crate) mod partitions;
pub(crate) mod send_signal;
pub(crate) mod status;
pub(crate) mod text;
pub(crate) mod top;
pub(crate) mod ui;
pub(crate) mod workflow;
