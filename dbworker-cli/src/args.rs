//! The arguments several commands share — the database, the job table, the
//! worker registry — and their parsers.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use dbworker::admin::{Admin, AdminOptions};
use dbworker::cluster::DEFAULT_LEADER_TABLE;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// The database and the job table, as every command that connects takes them.
#[derive(Debug, Args)]
pub(crate) struct Target {
    /// The database to connect to.
    #[arg(long, env = "DATABASE_URL")]
    pub(crate) database_url: String,
    /// The job table, optionally schema-qualified.
    #[arg(long, env = "DBWORKER_TABLE")]
    pub(crate) table: String,
    /// Renamed standard columns, as `standard=actual` (repeatable).
    #[arg(long = "rename", value_parser = parse_rename)]
    renames: Vec<(String, String)>,
}

impl Target {
    pub(crate) fn renames(&self) -> HashMap<String, String> {
        self.renames.iter().cloned().collect()
    }

    /// One connection (an operator's command needs no more).
    pub(crate) async fn connect(&self) -> Result<sqlx::PgPool> {
        // Parsed first, so a malformed URL says what was expected instead of
        // sqlx's bare "relative URL without a base" (and never echoes it).
        let malformed = |why: &dyn std::fmt::Display| {
            anyhow::anyhow!(
                "DATABASE_URL (--database-url) is not a PostgreSQL URL: {why}; expected postgres://user@host:port/db"
            )
        };
        let url = &self.database_url;
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(malformed(&"it does not start with postgres://"));
        }
        let options: PgConnectOptions = url.parse().map_err(|err| malformed(&err))?;
        PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .context("cannot connect")
    }
}

/// The job table for the operator commands.
#[derive(Debug, Args)]
pub(crate) struct TableArgs {
    #[command(flatten)]
    pub(crate) target: Target,
    /// The queue column, if the table has one.
    #[arg(long, env = "DBWORKER_QUEUE_COLUMN")]
    queue_column: Option<String>,
    /// The kind column, if the table has one.
    #[arg(long, env = "DBWORKER_KIND_COLUMN")]
    kind_column: Option<String>,
}

impl TableArgs {
    pub(crate) async fn admin(&self) -> Result<Admin> {
        self.admin_on(&self.target.connect().await?).await
    }

    /// The admin on a connection the command already has.
    pub(crate) async fn admin_on(&self, pool: &sqlx::PgPool) -> Result<Admin> {
        self.admin_with(pool, |_| {}).await
    }

    /// The admin with options a command adds (a key or priority column).
    pub(crate) async fn admin_with(
        &self,
        pool: &sqlx::PgPool,
        more: impl FnOnce(&mut AdminOptions),
    ) -> Result<Admin> {
        let t = &self.target;
        let mut options = AdminOptions::new(&t.table);
        options.alternate_column_names = t.renames();
        options.queue_column = self.queue_column.clone();
        options.kind_column = self.kind_column.clone();
        more(&mut options);
        Admin::new(pool, options)
            .await
            .with_context(|| format!("job table {}", t.table))
    }
}

/// The worker registry, for the commands that use it.
#[derive(Debug, Args)]
pub(crate) struct RegistryArgs {
    /// The worker registry table (`dbworker migration --nodes`).
    #[arg(long, env = "DBWORKER_NODE_TABLE")]
    pub(crate) node_table: Option<String>,
    /// A process whose registry heartbeat is older than this is dead.
    #[arg(long, env = "DBWORKER_DEAD_AFTER_SECS", default_value_t = 10.0)]
    pub(crate) dead_after_secs: f64,
    /// The leader lease table (with --node-table).
    #[arg(long, default_value = DEFAULT_LEADER_TABLE)]
    pub(crate) leader_table: String,
}

/// `standard=actual`, for `--rename`.
pub(crate) fn parse_rename(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_owned(), b.to_owned())),
        _ => Err(format!("expected standard=actual, got {s:?}")),
    }
}

/// A flag's seconds as a duration; the error names the flag.
pub(crate) fn seconds(flag: &str, secs: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(secs).with_context(|| format!("--{flag}"))
}
