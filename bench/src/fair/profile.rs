//! Where a tagged COPY's server time goes: COPY into the plain table and into
//! the fair one with `pg_stat_statements.track = all` (each statement of the
//! trigger counted apart) and `track_functions = pl` (the trigger function's
//! total time), both superuser settings, set on the enqueuer's
//! connection only; into a table in use and into a new, empty one. Counting
//! adds time of its own, so these figures say how the time splits, not how
//! fast the measured enqueues were.

use std::collections::BTreeMap;

use dbworker::Enqueuer;
use sqlx::postgres::PgPoolOptions;

use super::enqueue::{IN_USE, Shape, calls};
use crate::Result;
use crate::db::{Bench, TABLE};
use crate::framework;

/// A fair COPY's server time, per row, split.
#[derive(Debug)]
pub(crate) struct Split {
    /// The COPY statement's execution time per row (µs).
    pub(crate) copy_us: f64,
    /// The trigger function's calls, its total time per row, and what its
    /// statements leave of that (µs).
    pub(crate) function: (u64, f64, f64),
    /// The trigger's statements: what each reads, calls, µs per row.
    pub(crate) statements: Vec<(&'static str, u64, f64)>,
}

/// One COPY of 10,000 jobs into each table, per row.
#[derive(Debug)]
pub(crate) struct Profile {
    /// Into the plain table in use (µs per row).
    pub(crate) plain_us: f64,
    /// Into the fair table in use.
    pub(crate) in_use: Split,
    /// Into a new, empty fair table.
    pub(crate) new_table: Split,
}

/// The profile, or why it cannot be taken on this server.
pub(crate) async fn run(bench: &Bench, keys: u64) -> Result<std::result::Result<Profile, String>> {
    if let Some(why) = bench.statements_unavailable() {
        return Ok(Err(format!("pg_stat_statements is unavailable: {why}")));
    }
    let superuser: String = sqlx::query_scalar("SELECT current_setting('is_superuser')")
        .fetch_one(bench.admin())
        .await?;
    if superuser != "on" {
        return Ok(Err(
            "pg_stat_statements.track and track_functions need a superuser".to_owned(),
        ));
    }
    let rows = u64::try_from(Shape::Copy.per_call())?;
    let per_row = |ms: f64| ms * 1000.0 / rows as f64;
    let plain = copy(bench, false, IN_USE, keys).await?;
    let mut splits = Vec::new();
    for before in [IN_USE, 0] {
        let fair = copy(bench, true, before, keys).await?;
        let (calls, total) = fair
            .function
            .ok_or("the trigger function has no statistics")?;
        let mut statements: BTreeMap<&'static str, (u64, f64)> = BTreeMap::new();
        for (query, calls, ms) in &fair.nested {
            let entry = statements.entry(what(query)).or_default();
            entry.0 += calls;
            entry.1 += per_row(*ms);
        }
        let mut statements: Vec<_> = statements
            .into_iter()
            .map(|(what, (calls, us))| (what, calls, us))
            .collect();
        statements.sort_by(|a, b| b.2.total_cmp(&a.2));
        // A function's "self time" counts only other functions out: its SQL
        // statements are in it. What they leave is the PL/pgSQL around them.
        let rest = per_row(total) - statements.iter().map(|s| s.2).sum::<f64>();
        splits.push(Split {
            copy_us: per_row(fair.copy_ms),
            function: (calls, per_row(total), rest),
            statements,
        });
    }
    let [in_use, new_table] = <[Split; 2]>::try_from(splits).map_err(|_| "two profiles")?;
    Ok(Ok(Profile {
        plain_us: per_row(plain.copy_ms),
        in_use,
        new_table,
    }))
}

/// What a statement of the trigger reads (the function's text, in
/// `dbworker::ddl::fair_claims_sql`).
fn what(query: &str) -> &'static str {
    if query.contains("fair_weights") {
        "the key's weight (weight table, by key)"
    } else if query.contains("sum(") {
        "the cost of the key's jobs at its last tag"
    } else if query.contains("DESC") {
        "the key's last tag (waiting jobs of the key, newest tag)"
    } else if query.contains("process_after") {
        "the head (smallest tag waiting, eligible now)"
    } else if query.contains("ORDER BY") {
        "the head again (nothing eligible now)"
    } else {
        "other statements"
    }
}

/// One table's COPYs, counted.
struct Copied {
    /// The COPY statements' execution time (ms).
    copy_ms: f64,
    /// Statements run inside the COPY (the trigger's): text, calls, ms.
    nested: Vec<(String, u64, f64)>,
    /// The trigger function's calls and total ms during the COPY.
    function: Option<(u64, f64)>,
}

/// One COPY of 10,000 jobs into a fresh table holding `before` jobs, fair
/// (tagged, `keys` keys) or plain, on a new connection that counts nested
/// statements and PL/pgSQL functions.
async fn copy(bench: &Bench, fair: bool, before: u64, keys: u64) -> Result<Copied> {
    super::prepare(bench, fair, before, keys, 5_000).await?;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::raw_sql("SET pg_stat_statements.track = 'all'; SET track_functions = 'pl'")
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .connect(bench.url())
        .await?;
    let table = framework::job_table(&pool).await?;
    super::expect_fair(&table, fair)?;
    let enqueuer = Enqueuer::new(&pool, &table).await?;
    let jobs = calls(Shape::Copy, 1, fair, keys);
    let counted = function_stats(bench).await?;
    bench.reset_statements().await?;
    for call in &jobs {
        enqueuer.enqueue_copy(call).await?;
    }
    // A backend reports its function counters when it goes idle, at most
    // once a second unless told: this makes the next report immediate.
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&pool)
        .await?;
    let after = function_stats(bench).await?;
    let rows: Vec<(bool, String, i64, f64)> = sqlx::query_as(
        r"SELECT toplevel, query, calls, total_exec_time FROM pg_stat_statements
          WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND query NOT ILIKE '%pg_stat%'",
    )
    .fetch_all(bench.admin())
    .await?;
    pool.close().await;
    let mut copied = Copied {
        copy_ms: 0.0,
        nested: Vec::new(),
        function: None,
    };
    for (toplevel, query, calls, ms) in rows {
        if !toplevel {
            copied.nested.push((query, u64::try_from(calls)?, ms));
        } else if query.trim_start().to_ascii_uppercase().starts_with("COPY") {
            copied.copy_ms += ms;
        }
    }
    let b = counted.unwrap_or((0, 0.0));
    copied.function = after.map(|a| (a.0.saturating_sub(b.0), a.1 - b.1));
    Ok(copied)
}

/// The trigger function's cumulative calls and total time (ms).
async fn function_stats(bench: &Bench) -> Result<Option<(u64, f64)>> {
    let row: Option<(i64, f64)> =
        sqlx::query_as("SELECT calls, total_time FROM pg_stat_user_functions WHERE funcname = $1")
            .bind(format!("{TABLE}_fair_tag"))
            .fetch_optional(bench.admin())
            .await?;
    row.map(|(calls, total)| Ok((u64::try_from(calls)?, total)))
        .transpose()
}
