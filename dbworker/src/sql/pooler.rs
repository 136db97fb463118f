//! How statements reach the server: [`Pooler`], each pool's choice between
//! direct (or session-pooled) connections and a transaction pooler such as
//! PgBouncer in `pool_mode = transaction` (a process-wide default, and a
//! mode of its own for any pool given one), and the one way every statement
//! is sent ([`Statement::execute`] and the `fetch_*` methods).
//!
//! A statement sent on a connection rather than a pool takes the mode of
//! the pool that connection came from, which the service sending it names
//! (its own pool, or the one a caller's transaction was begun on). A
//! connection whose pool nobody named gets transaction mode as soon as any
//! pool of the process has it: correct on a direct connection too, at one
//! more round trip per statement.
//!
//! Directly, a statement is prepared once per connection under a name
//! (sqlx's statement cache) and re-bound on later calls. Behind a transaction
//! pooler a connection's next transaction may run on another server
//! connection, so a named statement is unknown there, or another client's
//! statement of the same name is. Under [`Pooler::Transaction`] every
//! statement is therefore sent unnamed, and one not already inside a
//! transaction is wrapped in `BEGIN … COMMIT`: sqlx sends an unnamed
//! statement as Parse/Describe/Sync and then Bind/Execute/Sync, and between
//! the two Syncs an idle connection could be handed to another client.
//!
//! One more trap: between those two Syncs sqlx looks up, with a simple
//! query, any result column type it does not know (an application's enum or
//! domain, `xid8`, an extension's type), once per connection, and a simple
//! query discards the unnamed statement: its Bind then fails with "unnamed
//! prepared statement does not exist". A wrapped statement is therefore run
//! again once on that error (the types are known by then, and its own
//! transaction rolled back).
//!
//! One message where it can: a statement whose values can be written into
//! its text (`literal.rs`) and whose rows are known to read the same from
//! text (`known_types.rs`; a statement returning no rows qualifies at once)
//! goes as one simple-protocol Query message. The server runs it in an
//! implicit transaction of its own, or in the caller's, and nothing is
//! prepared, so it needs neither the wrap nor the savepoint below: one round
//! trip instead of four. A statement is sent the prepared way until one of
//! its runs has shown what its rows hold. An application's records read from
//! text too, when all their columns are of those built-in types: sqlx's own
//! decoders read both forms, and so must a hand-written `Decode` (a record
//! that fails to scan fails its job with the reason).
//!
//! In a caller's transaction, where a failure would abort the caller's work,
//! a statement returning rows whose result types this process has not yet
//! seen to be built-in ones runs behind a savepoint: on that error it is
//! rolled back to the savepoint and sent again. Once a statement has
//! returned only types sqlx knows without a lookup, it is sent unnamed
//! without the savepoint from then on. No statement is ever prepared under a
//! name in this mode: a server connection a pooler shares may hold other
//! clients' statements under sqlx's names (`sqlx_s_1`, ...), which PgBouncer
//! (before 1.21) does not reset between clients.

use std::sync::{Arc, RwLock};

use sqlx::postgres::{PgConnectOptions, PgQueryResult, PgRow};
use sqlx::{Connection, Executor, PgConnection, PgPool, Postgres};

use super::Statement;
use super::{known_types, literal};

/// How a pool reaches PostgreSQL. The process-wide default is set once at
/// start-up with [`set_pooler`] (or the `DBWORKER_POOLER` and
/// `DBWORKER_LISTEN_URL` environment variables), before any service starts;
/// a pool given a mode of its own with [`Pooler::apply_to`] keeps it, so one
/// process can hold a direct pool and one through PgBouncer. Every statement
/// of every service built on a pool follows that pool's mode, including the
/// statements a service runs in a transaction begun on it.
///
/// ```
/// # async fn f() -> Result<(), sqlx::Error> {
/// use dbworker::Pooler;
/// let direct = sqlx::PgPool::connect_lazy("postgres://app@db-primary:5432/app")?;
/// let pooled = sqlx::PgPool::connect_lazy("postgres://app@pgbouncer:6432/app")?;
/// Pooler::Transaction {
///     listen_url: Some("postgres://app@db-primary:5432/app".into()),
/// }
/// .apply_to(&pooled);
/// assert!(Pooler::of(&pooled).is_transaction());
/// assert!(!Pooler::of(&direct).is_transaction());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Pooler {
    /// Connections straight to PostgreSQL, or through a pooler in session
    /// mode: statements are prepared once per connection and cached. The
    /// default.
    #[default]
    Direct,
    /// Through a pooler in transaction mode (PgBouncer's `pool_mode =
    /// transaction`): every statement is sent unnamed, inside a transaction,
    /// and nothing depends on a session.
    Transaction {
        /// A direct (or session-pooled) connection string for what needs a
        /// session of its own: LISTEN. Without it, stores and consumers that
        /// were asked to listen poll instead, and say so once in the log.
        listen_url: Option<String>,
    },
}

impl Pooler {
    /// Whether statements go through a transaction pooler.
    pub fn is_transaction(&self) -> bool {
        matches!(self, Pooler::Transaction { .. })
    }

    /// Gives `pool` (and every clone of it) this mode, whatever the
    /// process-wide default: call it before building services on the pool.
    /// A pool whose connect options are later replaced
    /// (`PgPool::set_connect_options`) falls back to the default.
    pub fn apply_to(self, pool: &PgPool) {
        let options = pool.connect_options();
        let mut pools = POOLS.write().unwrap_or_else(|e| e.into_inner());
        pools.retain(|(known, _)| !Arc::ptr_eq(known, &options));
        pools.push((options, self));
    }

    /// The mode `pool` is in: its own ([`Pooler::apply_to`]), else the
    /// process-wide default ([`pooler`]).
    pub fn of(pool: &PgPool) -> Pooler {
        own_mode(pool, Pooler::clone).unwrap_or_else(pooler)
    }

    /// The mode the environment asks for: `DBWORKER_POOLER=transaction` (or
    /// `direct`, the default) and, with it, `DBWORKER_LISTEN_URL`. Another
    /// value is refused by every start-up check ([`env_problem`]).
    fn from_env() -> Pooler {
        match std::env::var("DBWORKER_POOLER").as_deref() {
            Ok("transaction") => Pooler::Transaction {
                listen_url: std::env::var("DBWORKER_LISTEN_URL").ok(),
            },
            _ => Pooler::Direct,
        }
    }
}

/// What is wrong with `DBWORKER_POOLER`, when it is set to a value other
/// than the accepted ones (a typo is refused even where [`set_pooler`]
/// chose the mode in code: the environment says something was meant).
pub(crate) fn env_problem() -> Option<String> {
    match std::env::var("DBWORKER_POOLER") {
        Err(std::env::VarError::NotPresent) => None,
        Ok(v) if v == "transaction" || v == "direct" => None,
        Ok(v) => Some(format!(
            "{v:?} is not a pooler mode: use \"transaction\" (PgBouncer in pool_mode = transaction) or \"direct\" (the default: direct connections or a session-mode pooler)"
        )),
        Err(_) => Some("is not valid Unicode: use \"transaction\" or \"direct\"".into()),
    }
}

static SETTING: RwLock<Option<Pooler>> = RwLock::new(None);

/// The pools given a mode of their own, by the identity of their connect
/// options (shared by every clone of a pool). Holding the options keeps an
/// identity from being reused by another pool.
static POOLS: RwLock<Vec<(Arc<PgConnectOptions>, Pooler)>> = RwLock::new(Vec::new());

/// Chooses how this process reaches PostgreSQL (see [`Pooler`]); it takes
/// the place of the environment variables.
pub fn set_pooler(pooler: Pooler) {
    *SETTING.write().unwrap_or_else(|e| e.into_inner()) = Some(pooler);
}

/// The process-wide default mode: the one [`set_pooler`] chose, else the
/// environment's. A pool may have its own ([`Pooler::of`]).
pub fn pooler() -> Pooler {
    if let Some(p) = SETTING.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return p.clone();
    }
    let from_env = Pooler::from_env();
    SETTING
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert(from_env)
        .clone()
}

fn default_transaction_mode() -> bool {
    if let Some(p) = SETTING.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return p.is_transaction();
    }
    pooler().is_transaction()
}

/// What `read` finds in the mode `pool` was given with
/// [`Pooler::apply_to`], if it was given one.
fn own_mode<T>(pool: &PgPool, read: impl FnOnce(&Pooler) -> T) -> Option<T> {
    let pools = POOLS.read().unwrap_or_else(|e| e.into_inner());
    if pools.is_empty() {
        return None;
    }
    let options = pool.connect_options();
    pools
        .iter()
        .find(|(known, _)| Arc::ptr_eq(known, &options))
        .map(|(_, mode)| read(mode))
}

/// Whether `pool` goes through a transaction pooler ([`Pooler::of`], without
/// copying the mode: it is asked once per statement and per job).
pub(crate) fn pool_transaction_mode(pool: &PgPool) -> bool {
    own_mode(pool, Pooler::is_transaction).unwrap_or_else(default_transaction_mode)
}

/// The mode for a connection whose pool nobody named: transaction mode if
/// the default or any pool has it (see the module's doc).
fn unknown_connection_mode() -> bool {
    default_transaction_mode()
        || POOLS
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|(_, mode)| mode.is_transaction())
}

/// Where a statement runs: the pool (a connection of its own, committed at
/// once) or a connection the caller holds, in a transaction or not, with
/// its pool's mode when known (`Some(true)`: a transaction pooler).
pub(crate) enum On<'a> {
    Pool(&'a PgPool),
    Conn(&'a mut PgConnection, Option<bool>),
}

impl<'a> On<'a> {
    /// `conn`, which came from `pool`: statements on it follow the pool's
    /// mode.
    pub(crate) fn conn_of(pool: &PgPool, conn: &'a mut PgConnection) -> On<'a> {
        On::Conn(conn, Some(pool_transaction_mode(pool)))
    }

    /// The same pool or connection, for one more statement.
    pub(crate) fn reborrow(&mut self) -> On<'_> {
        match self {
            On::Pool(pool) => On::Pool(pool),
            On::Conn(conn, mode) => On::Conn(conn, *mode),
        }
    }

    /// Whether statements here go through a transaction pooler.
    pub(crate) fn transaction_mode(&self) -> bool {
        match self {
            On::Pool(pool) => pool_transaction_mode(pool),
            On::Conn(_, Some(mode)) => *mode,
            On::Conn(_, None) => unknown_connection_mode(),
        }
    }
}

impl<'a> From<&'a PgPool> for On<'a> {
    fn from(pool: &'a PgPool) -> On<'a> {
        On::Pool(pool)
    }
}

impl<'a> From<&'a mut PgConnection> for On<'a> {
    fn from(conn: &'a mut PgConnection) -> On<'a> {
        On::Conn(conn, None)
    }
}

#[derive(Clone, Copy)]
enum Fetch {
    Execute,
    All,
    One,
    Optional,
}

enum Fetched {
    Done(PgQueryResult),
    All(Vec<PgRow>),
    One(PgRow),
    Optional(Option<PgRow>),
}

impl Fetched {
    fn rows(&self) -> &[PgRow] {
        match self {
            Fetched::Done(_) | Fetched::Optional(None) => &[],
            Fetched::All(rows) => rows,
            Fetched::One(row) | Fetched::Optional(Some(row)) => std::slice::from_ref(row),
        }
    }
}

async fn fetch<'e, E: Executor<'e, Database = Postgres>>(
    statement: Statement,
    on: E,
    how: Fetch,
    persistent: bool,
) -> sqlx::Result<Fetched> {
    let q = statement.query().persistent(persistent);
    Ok(match how {
        Fetch::Execute => Fetched::Done(q.execute(on).await?),
        Fetch::All => Fetched::All(q.fetch_all(on).await?),
        Fetch::One => Fetched::One(q.fetch_one(on).await?),
        Fetch::Optional => Fetched::Optional(q.fetch_optional(on).await?),
    })
}

/// Runs `statement` in a transaction of its own on `conn`; once more if
/// sqlx's type lookup discarded it (see the module's doc).
async fn wrapped(
    statement: Statement,
    conn: &mut PgConnection,
    how: Fetch,
) -> sqlx::Result<Fetched> {
    let again = Statement {
        sql: statement.sql.clone(),
        values: statement.values.clone(),
    };
    match wrapped_once(statement, conn, how).await {
        Err(err) if unnamed_statement_lost(&err) => wrapped_once(again, conn, how).await,
        done => done,
    }
}

async fn wrapped_once(
    statement: Statement,
    conn: &mut PgConnection,
    how: Fetch,
) -> sqlx::Result<Fetched> {
    let mut tx = conn.begin().await?;
    let fetched = fetch(statement, &mut *tx, how, false).await?;
    tx.commit().await?;
    Ok(fetched)
}

/// Runs `statement` in the caller's transaction behind a transaction pooler,
/// unnamed. A statement returning rows not yet known to return only built-in
/// types runs behind a savepoint, so that sqlx's type lookup discarding it
/// costs one more try instead of the caller's transaction (see the module's
/// doc).
async fn in_callers_transaction(
    statement: Statement,
    conn: &mut PgConnection,
    how: Fetch,
) -> sqlx::Result<Fetched> {
    if matches!(how, Fetch::Execute) || known_types::builtin(&statement.sql) {
        return fetch(statement, conn, how, false).await;
    }
    let again = Statement {
        sql: statement.sql.clone(),
        values: statement.values.clone(),
    };
    savepoint(Savepoint::Set).execute_simple(&mut *conn).await?;
    let fetched = match fetch(statement, &mut *conn, how, false).await {
        Err(err) if unnamed_statement_lost(&err) => {
            savepoint(Savepoint::RollBack)
                .execute_simple(&mut *conn)
                .await?;
            fetch(again, &mut *conn, how, false).await?
        }
        done => done?,
    };
    savepoint(Savepoint::Release)
        .execute_simple(&mut *conn)
        .await?;
    Ok(fetched)
}

/// What to do with the savepoint a statement in a caller's transaction runs
/// behind.
#[derive(Clone, Copy)]
pub(crate) enum Savepoint {
    Set,
    RollBack,
    Release,
}

/// `SAVEPOINT`, `ROLLBACK TO SAVEPOINT` or `RELEASE SAVEPOINT` of that one
/// savepoint, sent as a simple query (one round trip, nothing prepared).
/// Raw text: sea-query builds no transaction control.
pub(crate) fn savepoint(what: Savepoint) -> Statement {
    let sql = match what {
        Savepoint::Set => "SAVEPOINT dbworker_statement",
        Savepoint::RollBack => "ROLLBACK TO SAVEPOINT dbworker_statement",
        Savepoint::Release => "RELEASE SAVEPOINT dbworker_statement",
    };
    Statement {
        sql: sql.into(),
        values: sea_query_sqlx::SqlxValues(sea_query::Values(Vec::new())),
    }
}

/// Whether `err` is the server's "unnamed prepared statement does not
/// exist" (SQLSTATE 26000, invalid_sql_statement_name).
fn unnamed_statement_lost(err: &sqlx::Error) -> bool {
    crate::error::has_sqlstate(err, "26000")
}

/// Runs `sql` (its values already in its text) as one simple-protocol
/// message.
async fn simple<'e, E: Executor<'e, Database = Postgres>>(
    sql: String,
    on: E,
    how: Fetch,
) -> sqlx::Result<Fetched> {
    let q = sqlx::raw_sql(sqlx::AssertSqlSafe(sql));
    Ok(match how {
        Fetch::Execute => Fetched::Done(q.execute(on).await?),
        Fetch::All => Fetched::All(q.fetch_all(on).await?),
        Fetch::One => Fetched::One(q.fetch_one(on).await?),
        Fetch::Optional => Fetched::Optional(q.fetch_optional(on).await?),
    })
}

impl Statement {
    /// The statement as one simple-protocol message, when that reads its
    /// rows the same (see the module's doc).
    fn as_simple(&self, how: Fetch) -> Option<String> {
        let text_rows = matches!(how, Fetch::Execute) || known_types::text_safe(&self.sql);
        text_rows.then(|| literal::inline(self)).flatten()
    }

    async fn run(self, on: On<'_>, how: Fetch) -> sqlx::Result<Fetched> {
        let pooled = on.transaction_mode();
        if pooled && let Some(sql) = self.as_simple(how) {
            return match on {
                On::Pool(pool) => simple(sql, pool, how).await,
                On::Conn(conn, _) => simple(sql, conn, how).await,
            };
        }
        let sql = self.sql.clone();
        let fetched = match on {
            On::Pool(pool) if pooled => wrapped(self, &mut *pool.acquire().await?, how).await?,
            On::Pool(pool) => return fetch(self, pool, how, true).await,
            On::Conn(conn, _) if pooled && !conn.is_in_transaction() => {
                wrapped(self, conn, how).await?
            }
            On::Conn(conn, _) if pooled => in_callers_transaction(self, conn, how).await?,
            On::Conn(conn, _) => return fetch(self, conn, how, true).await,
        };
        known_types::record(&sql, fetched.rows());
        Ok(fetched)
    }

    /// Runs the statement; how many rows it changed.
    pub(crate) async fn execute<'a>(self, on: impl Into<On<'a>>) -> sqlx::Result<PgQueryResult> {
        match self.run(on.into(), Fetch::Execute).await? {
            Fetched::Done(done) => Ok(done),
            _ => unreachable!("asked to execute"),
        }
    }

    /// Runs the statement; every row it returned.
    pub(crate) async fn fetch_all<'a>(self, on: impl Into<On<'a>>) -> sqlx::Result<Vec<PgRow>> {
        match self.run(on.into(), Fetch::All).await? {
            Fetched::All(rows) => Ok(rows),
            _ => unreachable!("asked for all rows"),
        }
    }

    /// Runs the statement; its one row (an error without one).
    pub(crate) async fn fetch_one<'a>(self, on: impl Into<On<'a>>) -> sqlx::Result<PgRow> {
        match self.run(on.into(), Fetch::One).await? {
            Fetched::One(row) => Ok(row),
            _ => unreachable!("asked for one row"),
        }
    }

    /// Runs the statement; its first row, if any.
    pub(crate) async fn fetch_optional<'a>(
        self,
        on: impl Into<On<'a>>,
    ) -> sqlx::Result<Option<PgRow>> {
        match self.run(on.into(), Fetch::Optional).await? {
            Fetched::Optional(row) => Ok(row),
            _ => unreachable!("asked for an optional row"),
        }
    }
}

impl Statement {
    /// Runs a statement without parameters as one simple-protocol Query
    /// message, prepared under no name in any mode: for the probe, which must
    /// not depend on the mode it checks.
    pub(crate) async fn fetch_one_simple(self, conn: &mut PgConnection) -> sqlx::Result<PgRow> {
        debug_assert!(self.values.0.0.is_empty(), "a simple query binds nothing");
        sqlx::raw_sql(sqlx::AssertSqlSafe(self.sql))
            .fetch_one(conn)
            .await
    }

    /// The same, for a statement that returns no row.
    async fn execute_simple(self, conn: &mut PgConnection) -> sqlx::Result<PgQueryResult> {
        debug_assert!(self.values.0.0.is_empty(), "a simple query binds nothing");
        sqlx::raw_sql(sqlx::AssertSqlSafe(self.sql))
            .execute(conn)
            .await
    }
}

/// `SELECT pg_backend_pid()`: which server session ran the statement, for
/// the start-up probe that tells a transaction pooler from a direct
/// connection.
pub(crate) fn backend_pid() -> Statement {
    let q = sea_query::Query::select()
        .expr_as(
            sea_query::Expr::cust("pg_backend_pid()"),
            sea_query::Alias::new("pid"),
        )
        .to_owned();
    Statement::from(&q)
}

/// `pg_terminate_backend(pid)`: ends the session `pid` (its running query,
/// its transaction, its locks) of a transactional job whose handler was
/// dropped mid-query, after its connection was closed (see `store/open.rs`).
/// Only while that session is still in the transaction that began at
/// `xact_us` (microseconds since the epoch, as `lock_claimed` read it): a pid
/// gone to another session since is spared. No row: no such session.
/// `done` NULL: not that transaction (`untracked`: its start cannot be read,
/// with `track_activities` off).
pub(crate) fn terminate_backend(pid: i32, xact_us: i64) -> Statement {
    Statement {
        sql: "SELECT CASE WHEN (EXTRACT(EPOCH FROM a.xact_start) * 1000000)::bigint = $2::bigint \
              THEN pg_terminate_backend(a.pid) END AS done, a.xact_start IS NULL AS untracked \
              FROM pg_stat_activity AS a WHERE a.pid = $1::int AND a.datname = current_database()"
            .into(),
        values: sea_query_sqlx::SqlxValues(sea_query::Values(vec![
            sea_query::Value::from(pid),
            sea_query::Value::from(xact_us),
        ])),
    }
}

/// `SELECT current_database()`: which database a connection reached, for
/// the start-up check that `listen_url` names the pool's (NOTIFY is per
/// database).
pub(crate) fn current_database() -> Statement {
    let q = sea_query::Query::select()
        .expr_as(
            sea_query::Expr::cust("current_database()::text"),
            sea_query::Alias::new("db"),
        )
        .to_owned();
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    vec![
        ("backend_pid", backend_pid()),
        ("current_database", current_database()),
        ("terminate_backend", terminate_backend(1, 2)),
        ("savepoint", savepoint(Savepoint::Set)),
        ("savepoint_rollback", savepoint(Savepoint::RollBack)),
        ("savepoint_release", savepoint(Savepoint::Release)),
    ]
}
