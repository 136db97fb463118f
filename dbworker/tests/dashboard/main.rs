//! The dashboard: its routes, actions and pages through the router, and in a real headless
//! Chromium.
//!
//! One test binary for the feature; each file is a module of it and keeps
//! its name (docs cite tests as `file.rs::test_name`).

#[path = "../common/mod.rs"]
mod common;

/// The fixtures of `common/` that files of this binary share, each compiled once.
#[path = "../common"]
mod fixtures {
    #[path = "dashboard.rs"]
    pub(crate) mod dashboard;
    #[path = "history.rs"]
    pub(crate) mod history;
    #[path = "router.rs"]
    pub(crate) mod router;
}

mod browser;
mod dashboard;
mod dashboard_bulk;
mod dashboard_cron;
mod dashboard_forms;
mod dashboard_history;
mod dashboard_inputs;
mod dashboard_list;
mod dashboard_pages;
mod dashboard_workflows;
