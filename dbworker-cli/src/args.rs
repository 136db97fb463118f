//! The arguments several commands share — the database, the job table, the
//! worker registry — and their parsers.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use dbworker::admin::Admin;
use dbworker::cluster::DEFAULT_LEADER_TABLE;
use dbworker::{JobTable, JobTableOptions};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// The database, as every command that connects takes it.
#[derive(Debug, Args)]
pub(crate) struct Database {
    /// The database to connect to: postgres://user:password@host:port/db.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// How long to wait for the database before reporting it unreachable
    /// (`5s`, `500ms`, `1m`).
    #[arg(long, env = "DBWORKER_CONNECT_TIMEOUT", default_value = "5s", value_parser = duration, alias = "connect-timeout-secs")]
    connect_timeout: Duration,
}

impl Database {
    /// The connect timeout, checked.
    pub(crate) fn connect_timeout(&self) -> Result<Duration> {
        if self.connect_timeout.is_zero() {
            return Err(crate::exit::usage(
                "--connect-timeout (DBWORKER_CONNECT_TIMEOUT) must be more than 0: it is how long to wait for the server",
            ));
        }
        Ok(self.connect_timeout)
    }

    /// How every command connects, so all report a bad URL, a refused login
    /// or an unreachable server alike. One connection is opened at once,
    /// under the connect timeout: it fails fast with the cause and the
    /// address, where a pool would retry until its acquire timeout and say
    /// only "pool timed out". The pool then connects as it needs.
    pub(crate) async fn connect(&self, max_connections: u32) -> Result<PgPool> {
        self.connect_with(self.options()?, max_connections).await
    }

    /// [`connect`](Self::connect) to the replica `read` names, if it names
    /// one, else to the database.
    pub(crate) async fn connect_reads(
        &self,
        read: &ReadArgs,
        max_connections: u32,
    ) -> Result<PgPool> {
        self.connect_reads_limited(read, max_connections, Duration::ZERO)
            .await
    }

    /// [`connect`](Self::connect) with each statement limited to
    /// `statement_timeout` (zero: no limit), set when the session starts.
    pub(crate) async fn connect_limited(
        &self,
        max_connections: u32,
        statement_timeout: Duration,
    ) -> Result<PgPool> {
        let options = limited(self.options()?, statement_timeout);
        self.connect_with(options, max_connections).await
    }

    /// [`connect_reads`](Self::connect_reads) with each statement limited to
    /// `statement_timeout` (zero: no limit).
    pub(crate) async fn connect_reads_limited(
        &self,
        read: &ReadArgs,
        max_connections: u32,
        statement_timeout: Duration,
    ) -> Result<PgPool> {
        match &read.replica_url {
            Some(url) => {
                let options = parse_url(url, "DBWORKER_REPLICA_URL (--replica-url)")?;
                self.connect_with(limited(options, statement_timeout), max_connections)
                    .await
            }
            None => {
                self.connect_limited(max_connections, statement_timeout)
                    .await
            }
        }
    }

    async fn connect_with(
        &self,
        options: PgConnectOptions,
        max_connections: u32,
    ) -> Result<PgPool> {
        let timeout = self.connect_timeout()?;
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(timeout)
            .connect_lazy_with(options);
        dbworker::check_connection(&pool, timeout).await?;
        Ok(pool)
    }

    /// The job table `name` as the command's flags describe it (`describe`
    /// sets the renames, the optional columns and the control tables),
    /// checked against the database by [`JobTable::new`]: the one place every
    /// command builds its table, so they all describe it alike.
    pub(crate) async fn job_table(
        &self,
        pool: &PgPool,
        name: &str,
        describe: impl FnOnce(&mut JobTableOptions),
    ) -> Result<JobTable> {
        let mut options = JobTableOptions::new(name);
        options.connect_timeout = self.connect_timeout()?;
        describe(&mut options);
        JobTable::new(pool, options)
            .await
            .with_context(|| format!("job table {name}"))
    }

    fn options(&self) -> Result<PgConnectOptions> {
        parse_url(&self.database_url, "DATABASE_URL (--database-url)")
    }
}

/// `options` with the session's `statement_timeout` set at start-up (a
/// startup option: a pooler that refuses those needs zero, no limit).
fn limited(options: PgConnectOptions, statement_timeout: Duration) -> PgConnectOptions {
    if statement_timeout.is_zero() {
        return options;
    }
    let ms = statement_timeout.as_millis().to_string();
    options.options([("statement_timeout", ms.as_str())])
}

/// Where a read-only command (`status`, `list`, `show`, `top`, the
/// dashboard's pages) reads.
#[derive(Debug, Args)]
pub(crate) struct ReadArgs {
    /// A streaming replica of the database to read from, sparing the
    /// primary: postgres://user:password@replica:port/db. What is shown is as
    /// old as the replica's lag (`status` prints it, the dashboard shows it
    /// on every page); actions still go to DATABASE_URL.
    #[arg(
        long,
        env = "DBWORKER_REPLICA_URL",
        hide_env_values = true,
        visible_alias = "read-url"
    )]
    pub(crate) replica_url: Option<String>,
}

/// The URL `flag` gave, parsed; a malformed or foreign one is blamed by name
/// instead of with sqlx's bare text ("relative URL without a base"), its
/// password never shown.
fn parse_url(url: &str, flag: &str) -> Result<PgConnectOptions> {
    let malformed = |why: String| {
        crate::exit::usage(format!(
            "{flag} {why}; expected postgres://user@host:port/db"
        ))
    };
    match url.split_once("://") {
        Some((scheme, _))
            if scheme.eq_ignore_ascii_case("postgres")
                || scheme.eq_ignore_ascii_case("postgresql") => {}
        // Only a plain scheme is quoted: what precedes "://" could be a
        // password in a URL missing its scheme.
        Some((scheme, _)) if scheme.chars().all(|c| c.is_ascii_alphanumeric()) => {
            return Err(malformed(format!(
                "is not a PostgreSQL URL: its scheme is {scheme}, not postgres or postgresql"
            )));
        }
        _ => {
            return Err(malformed(
                "is not a PostgreSQL URL: it does not start with postgres://".into(),
            ));
        }
    }
    url.parse().map_err(|err: sqlx::Error| {
        // sqlx nests its configuration errors, each prefixed alike.
        let text = err.to_string();
        let mut why = text.as_str();
        while let Some(rest) = why.strip_prefix("error with configuration: ") {
            why = rest;
        }
        malformed(format!("is malformed: {}", without_password(url, why)))
    })
}

/// `text` with the URL's password, if it quotes it, replaced by `***`.
fn without_password(url: &str, text: &str) -> String {
    let userinfo = url
        .split_once("://")
        .and_then(|(_, rest)| rest.rsplit_once('@'))
        .map_or("", |(userinfo, _)| userinfo);
    match userinfo.split_once(':') {
        Some((_, password)) if !password.is_empty() => text.replace(password, "***"),
        _ => text.to_owned(),
    }
}

/// The database and the job table, as most commands take them.
#[derive(Debug, Args)]
pub(crate) struct Target {
    #[command(flatten)]
    pub(crate) database: Database,
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
    pub(crate) async fn connect(&self) -> Result<PgPool> {
        self.database.connect(1).await
    }

    /// The job table, its standard columns renamed as the flags say.
    pub(crate) async fn job_table(&self, pool: &PgPool) -> Result<JobTable> {
        self.job_table_with(pool, |_| {}).await
    }

    /// The job table with what a command adds to its description (a pause
    /// table, workflows, an error history column).
    pub(crate) async fn job_table_with(
        &self,
        pool: &PgPool,
        more: impl FnOnce(&mut JobTableOptions),
    ) -> Result<JobTable> {
        self.database
            .job_table(pool, &self.table, |o| {
                o.alternate_column_names = self.renames();
                more(o);
            })
            .await
    }
}

/// The job table for the operator commands.
#[derive(Debug, Args)]
pub(crate) struct TableArgs {
    #[command(flatten)]
    pub(crate) target: Target,
    /// The queue column. Without it (and without --kind-column), the
    /// table's optional columns are found by their standard names (`queue`,
    /// `kind`, …), as `dbworker migration` adds them.
    #[arg(long, env = "DBWORKER_QUEUE_COLUMN")]
    queue_column: Option<String>,
    /// The kind column (see --queue-column).
    #[arg(long, env = "DBWORKER_KIND_COLUMN")]
    kind_column: Option<String>,
}

impl TableArgs {
    /// The job table as the shared flags describe it (table, renames, queue
    /// and kind columns), with what `more` adds (a key, priority or retry
    /// limit column, workflows, a pause table).
    pub(crate) async fn job_table_with(
        &self,
        pool: &PgPool,
        more: impl FnOnce(&mut JobTableOptions),
    ) -> Result<JobTable> {
        self.target
            .job_table_with(pool, |o| {
                o.queue_column = self.queue_column.clone();
                o.kind_column = self.kind_column.clone();
                // The reference table's columns by their standard names.
                o.detect = o.queue_column.is_none() && o.kind_column.is_none();
                more(o);
            })
            .await
    }

    /// The admin for reading, on a connection of its own to the replica
    /// `read` names (the table checked there), or to the database.
    pub(crate) async fn reader(&self, read: &ReadArgs) -> Result<(PgPool, Admin)> {
        let pool = self.target.database.connect_reads(read, 1).await?;
        let admin = self.admin_on(&pool).await?;
        Ok((pool, admin))
    }

    /// The admin on a connection the command already has.
    pub(crate) async fn admin_on(&self, pool: &PgPool) -> Result<Admin> {
        self.admin_with(pool, |_| {}).await
    }

    /// The admin of the table with what a command adds to its description.
    pub(crate) async fn admin_with(
        &self,
        pool: &PgPool,
        more: impl FnOnce(&mut JobTableOptions),
    ) -> Result<Admin> {
        let table = self.job_table_with(pool, more).await?;
        Admin::new(pool, &table)
            .await
            .with_context(|| format!("job table {}", self.target.table))
    }
}

/// How a command prints what it reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// Aligned text for people.
    #[default]
    Text,
    /// One JSON document on one line, for scripts (its shape: docs/operations.md).
    Json,
}

/// `--format text|json`.
#[derive(Debug, Args)]
pub(crate) struct FormatArg {
    /// Print as text, or as one JSON document (the shape is documented in
    /// docs/operations.md).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub(crate) format: Format,
}

/// The worker registry, for the commands that use it.
#[derive(Debug, Args)]
pub(crate) struct RegistryArgs {
    /// The worker registry table (`dbworker migration --nodes`).
    #[arg(long, env = "DBWORKER_NODE_TABLE")]
    pub(crate) node_table: Option<String>,
    /// A process whose registry heartbeat is older than this is dead.
    #[arg(long, env = "DBWORKER_DEAD_AFTER", default_value = "10s", value_parser = duration, alias = "dead-after-secs")]
    pub(crate) dead_after: Duration,
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

/// A duration flag's value: humantime (`30s`, `2h`, `1h 30m`, `250ms`) or
/// a bare number of seconds (`90`, `0.5`), as the old `--…-secs` flags took.
/// At most 100 years, the library's bound on every option's time
/// (`workerutil::duration::MAX`): refused here, clap names the flag, where
/// a command would otherwise overflow adding it (a panic) or name only the
/// library's field.
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    let not = |why: &str| Err(format!("{s:?} is not a duration: {why}"));
    let d = match s.trim().parse::<f64>() {
        Ok(secs) if secs.is_nan() => return not("it is not a number"),
        Ok(secs) if secs < 0.0 => return not("seconds must be 0 or more"),
        // Past a `Duration`'s range is past the bound below too.
        Ok(secs) => Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX),
        Err(_) => humantime::parse_duration(s.trim()).map_err(|err| {
            format!("{s:?} is not a duration ({err}); write it as 30s, 5m, 2h, 1h 30m or 250ms")
        })?,
    };
    if d > workerutil::duration::MAX {
        return Err(format!("{s:?} is too long: must be at most 100 years"));
    }
    Ok(d)
}

/// A duration as an operator reads it: `3m 12s`, `2h 5m`, `450ms` (the two
/// largest units, rounded down).
pub(crate) fn human(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let full = humantime::format_duration(Duration::from_secs(d.as_secs())).to_string();
    full.split(' ').take(2).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_timeout_is_set_when_the_session_starts_and_zero_sets_none() {
        let url = "postgres://u@localhost/db";
        let options = limited(parse_url(url, "test").unwrap(), Duration::from_secs(10));
        let set = options.get_options().unwrap_or_default();
        assert!(set.contains("statement_timeout=10000"), "{set}");
        let none = limited(parse_url(url, "test").unwrap(), Duration::ZERO);
        assert!(none.get_options().is_none());
    }
}
