//! `dbworker ui`: the web dashboard served alone against `DATABASE_URL`.

use std::net::SocketAddr;

use anyhow::{Context, Result, bail};
use clap::Args;
use dbworker::dashboard::{Auth, BasicUser, Dashboard, DashboardOptions, Role};

use crate::args::{Database, ReadArgs};
use crate::signal::stop_on_signal;

#[derive(Debug, Args)]
pub(crate) struct UiArgs {
    #[command(flatten)]
    database: Database,
    #[command(flatten)]
    read: ReadArgs,
    /// How long one of the dashboard's queries may run (0: no limit), so a
    /// heavy page or filter cannot hold every connection. Through PgBouncer,
    /// which refuses startup options unless `ignore_startup_parameters`
    /// lists `options`, pass 0.
    #[arg(long, env = "DBWORKER_UI_STATEMENT_TIMEOUT", default_value = "10s", value_parser = crate::args::duration)]
    statement_timeout: std::time::Duration,
    /// Offer no actions, whatever the user's role: the database role then
    /// needs only SELECT (without this flag the dashboard checks the grants
    /// its actions use, and names those missing).
    #[arg(long)]
    read_only: bool,
    /// The job tables to show (repeatable or comma-separated).
    #[arg(
        long = "table",
        env = "DBWORKER_TABLE",
        value_delimiter = ',',
        required = true
    )]
    tables: Vec<String>,
    /// The tables' queue column, if they have one.
    #[arg(long, env = "DBWORKER_QUEUE_COLUMN")]
    queue_column: Option<String>,
    /// The tables' kind column, if they have one.
    #[arg(long, env = "DBWORKER_KIND_COLUMN")]
    kind_column: Option<String>,
    /// The pause table (pause/resume on the queues page).
    #[arg(long)]
    pause_table: Option<String>,
    /// The limit table (limits on the queues page).
    #[arg(long)]
    limit_table: Option<String>,
    /// The tables' error history column (`errors` from `dbworker migration
    /// --error-history`): the job page shows its entries as a table.
    #[arg(long, env = "DBWORKER_ERROR_HISTORY_COLUMN")]
    error_history_column: Option<String>,
    /// The tables have workflows (`dbworker migration --workflows`): show
    /// their graphs and filter jobs by workflow.
    #[arg(long)]
    workflows: bool,
    /// The worker registry (live processes on the overview, their health on
    /// the processes page).
    #[arg(long, env = "DBWORKER_NODE_TABLE")]
    node_table: Option<String>,
    /// The leader election's lease table (which process leads, on the
    /// processes page).
    #[arg(long, env = "DBWORKER_LEADER_TABLE", requires = "node_table")]
    leader_table: Option<String>,
    /// The cron table (`dbworker migration --cron`): each table gets a cron
    /// page (schedules, time zones, last and next tick, last job).
    #[arg(long, env = "DBWORKER_CRON_TABLE")]
    cron_table: Option<String>,
    /// JSON fields and columns never shown (comma-separated).
    #[arg(long, value_delimiter = ',')]
    hide: Vec<String>,
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The admin bearer token.
    #[arg(long, env = "DBWORKER_UI_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The read-only bearer token.
    #[arg(long, env = "DBWORKER_UI_READ_TOKEN", hide_env_values = true)]
    read_token: Option<String>,
    /// Basic-auth users, `name:password:admin|read`, comma-separated: the
    /// name is before the first ':', the role after the last, the password
    /// between (it may hold ':', not ',', which separates entries).
    #[arg(
        long,
        env = "DBWORKER_UI_USERS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    users: Vec<String>,
    /// The history table the overview's charts read (`dbworker migration
    /// --history` creates it, `dbworker history` records it).
    #[arg(long, default_value = dbworker::history::DEFAULT_HISTORY_TABLE)]
    history_table: String,
}

fn auth(args: &UiArgs) -> Result<Auth> {
    if !args.users.is_empty() {
        let mut users = Vec::new();
        for (i, entry) in args.users.iter().enumerate() {
            users.push(basic_user(i + 1, entry)?);
        }
        return Ok(Auth::Basic(users));
    }
    if args.token.is_some() || args.read_token.is_some() {
        return Ok(Auth::Bearer {
            admin: args.token.clone(),
            read_only: args.read_token.clone(),
        });
    }
    if !args.listen.ip().is_loopback() {
        bail!(
            "refusing to serve {} without authentication: set DBWORKER_UI_TOKEN (and/or DBWORKER_UI_READ_TOKEN) or DBWORKER_UI_USERS, or listen on a loopback address",
            args.listen
        );
    }
    Ok(Auth::None)
}

/// One `--users` entry (the `position`th): the name before the first ':',
/// the role after the last, the password between. An error names the
/// position and the user, never the password (nor what may be one).
fn basic_user(position: usize, entry: &str) -> Result<BasicUser> {
    let form =
        "name:password:admin|read; entries are separated by ',', which a password cannot hold";
    let Some((name, rest)) = entry.split_once(':') else {
        bail!("--users: entry {position} is not {form}");
    };
    if name.is_empty() {
        bail!("--users: entry {position} has no user name ({form})");
    }
    let Some((password, role)) = rest.rsplit_once(':') else {
        bail!("--users: entry {position} (user {name:?}) has no role ({form})");
    };
    let role = match role {
        "admin" => Role::Admin,
        "read" => Role::ReadOnly,
        _ => bail!(
            "--users: entry {position} (user {name:?}): the role, after the last ':', must be admin or read"
        ),
    };
    if password.is_empty() {
        bail!("--users: entry {position} (user {name:?}) has an empty password");
    }
    Ok(BasicUser {
        name: name.to_owned(),
        password: password.to_owned(),
        role,
    })
}

pub(crate) async fn serve(args: UiArgs) -> Result<()> {
    // Every refusal of `auth` is about the flags: bad arguments.
    let auth = auth(&args).map_err(|err| crate::exit::usage(err.to_string()))?;
    let pool = args
        .database
        .connect_limited(4, args.statement_timeout)
        .await?;
    let mut tables = Vec::with_capacity(args.tables.len());
    for name in &args.tables {
        let table = args
            .database
            .job_table(&pool, name, |o| {
                o.queue_column = args.queue_column.clone();
                o.kind_column = args.kind_column.clone();
                // As `status` does: the optional columns (and workflows) by
                // their standard names, unless named.
                o.detect = o.queue_column.is_none() && o.kind_column.is_none();
                o.pause_table = args.pause_table.clone();
                o.limit_table = args.limit_table.clone();
                o.error_history_column = args.error_history_column.clone();
                o.workflows = args.workflows;
            })
            .await?;
        for missing in not_found(&table) {
            eprintln!("dashboard: table {name} has {missing}");
        }
        tables.push(table);
    }
    if args.node_table.is_none() {
        eprintln!(
            "dashboard: no worker registry (--node-table): no live processes or leader shown"
        );
    }
    if args.cron_table.is_none() {
        eprintln!("dashboard: no cron table (--cron-table): no cron pages");
    }
    let mut options = DashboardOptions::new(tables);
    options.auth = auth;
    options.hidden_fields = args.hide.clone();
    options.node_table = args.node_table.clone();
    options.leader_table = args.leader_table.clone();
    options.history_table = args.history_table.clone();
    options.cron_table = args.cron_table.clone();
    options.read_only = args.read_only;
    if args.read.replica_url.is_some() {
        options.replica = Some(
            args.database
                .connect_reads_limited(&args.read, 4, args.statement_timeout)
                .await?,
        );
    }
    let dashboard = Dashboard::new(&pool, options)
        .await
        .context("the dashboard")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr().context("the address listened on")?;
    println!("dashboard on http://{addr}/");
    let stop = stop_on_signal();
    axum::serve(listener, dashboard.router())
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
        .context("serving the dashboard")
}

/// What the dashboard could not find on `table`, each with what it costs
/// and how to give it, so a cut-down dashboard says why.
fn not_found(table: &dbworker::JobTable) -> Vec<&'static str> {
    let mut missing = Vec::new();
    if table.queue_column().is_none() {
        missing
            .push("no queue column (--queue-column): one (all) row, no per-queue pauses or limits");
    }
    if table.kind_column().is_none() {
        missing.push("no kind column (--kind-column): no filter by kind");
    }
    if table.pause_table().is_none() {
        missing.push("no pause table (--pause-table; `dbworker migration --pauses` creates dbworker_pauses): no pause or resume");
    }
    if !table.has_workflows() {
        missing.push("no workflows (`dbworker migration --workflows`): no workflow pages");
    }
    missing
}
