//! Cron: each tick claimed exactly once across schedulers.

use super::{Statement, alias, col, table_ref};
use crate::columns::{Relation, quote};
use std::time::Duration;

use sea_query::{Expr, ExprTrait, LockType, OnConflict, Query};

/// Registers a cron schedule, starting from now, unless it is known; a known
/// one whose expression or time zone changed gets the new ones and starts
/// from now too (the new expression's ticks before the edit were never its
/// own to catch up on); written only when they differ, so a pass adds no row
/// version.
pub(crate) fn cron_register(
    cron: &Relation,
    job_table: &str,
    schedule: &str,
    expression: &str,
    time_zone: &str,
) -> Statement {
    let mut q = Query::insert();
    q.into_table(table_ref(cron))
        .columns([
            alias("job_table"),
            alias("schedule"),
            alias("last_tick"),
            alias("expression"),
            alias("time_zone"),
        ])
        .values_panic([
            Expr::val(job_table),
            Expr::val(schedule),
            Expr::cust("clock_timestamp()"),
            Expr::val(expression),
            Expr::val(time_zone),
        ])
        .on_conflict(
            OnConflict::columns([alias("job_table"), alias("schedule")])
                .update_columns([alias("expression"), alias("time_zone")])
                .value(
                    alias("last_tick"),
                    Expr::cust(format!(
                        "GREATEST({}.\"last_tick\", clock_timestamp())",
                        quote(&cron.alias)
                    )),
                )
                .action_and_where(Expr::cust(format!(
                    "({a}.\"expression\", {a}.\"time_zone\") IS DISTINCT FROM (EXCLUDED.\"expression\", EXCLUDED.\"time_zone\")",
                    a = quote(&cron.alias)
                )))
                .to_owned(),
        )
        // Only a row just inserted has no xmax: this pass registered it.
        .returning(
            Query::returning().expr(Expr::cust("xmax = 0 AS \"registered\"")),
        );
    Statement::from(&q)
}

/// Bounds a tick's transaction: a schedule's row held longer than `lock` by
/// another scheduler (paused, or stuck on a lock of its own) is left to it for
/// this pass, and a scheduler that stops mid-tick (SIGSTOP, a hung client)
/// loses its session after `idle`, which releases the row. The same `lock`
/// bounds the tick's enqueue (a keyed job's holder locked by its handler).
pub(crate) fn cron_tick_timeouts(lock: Duration, idle: Duration) -> Statement {
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    let q = Query::select()
        .expr(Expr::cust_with_values(
            "set_config('lock_timeout', $1, true)",
            [ms(lock)],
        ))
        .expr(Expr::cust_with_values(
            "set_config('idle_in_transaction_session_timeout', $1, true)",
            [ms(idle)],
        ))
        .to_owned();
    Statement::from(&q)
}

/// Locks a schedule's row and reads its last tick and the database clock
/// (after the lock is granted), both in microseconds since the epoch.
pub(crate) fn cron_state(cron: &Relation, job_table: &str, schedule: &str) -> Statement {
    let q = Query::select()
        .expr_as(
            Expr::cust(format!(
                "(EXTRACT(EPOCH FROM {}.\"last_tick\") * 1000000)::bigint",
                quote(&cron.alias)
            )),
            alias("last_tick"),
        )
        .expr_as(
            Expr::cust("(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint"),
            alias("now"),
        )
        .from(table_ref(cron))
        .and_where(col(&cron.alias, "job_table").eq(job_table))
        .and_where(col(&cron.alias, "schedule").eq(schedule))
        .lock(LockType::Update)
        .to_owned();
    Statement::from(&q)
}

/// Records the tick a schedule has enqueued (or skipped) up to, and the
/// last job it enqueued (kept when this pass enqueued none).
pub(crate) fn cron_advance(
    cron: &Relation,
    job_table: &str,
    schedule: &str,
    tick_micros: i64,
    last_job: Option<i64>,
) -> Statement {
    let q = Query::update()
        .table(table_ref(cron))
        .value(
            alias("last_tick"),
            Expr::cust_with_values(
                "timestamptz 'epoch' + $1::bigint * interval '1 microsecond'",
                [tick_micros],
            ),
        )
        .value(
            alias("last_job_id"),
            Expr::cust_with_values(
                format!(
                    "COALESCE($1::bigint, {}.\"last_job_id\")",
                    quote(&cron.alias)
                ),
                [last_job],
            ),
        )
        .and_where(col(&cron.alias, "job_table").eq(job_table))
        .and_where(col(&cron.alias, "schedule").eq(schedule))
        .to_owned();
    Statement::from(&q)
}

/// Every schedule of a job table, by name: its expression and time zone (as
/// the last scheduler to run it wrote them), its last tick and last job, and
/// the database clock, timestamps in microseconds since the epoch. Read by
/// the dashboard without locking anything.
#[cfg_attr(not(feature = "dashboard"), allow(dead_code))]
pub(crate) fn cron_list(cron: &Relation, job_table: &str) -> Statement {
    let micros = |column: &str| {
        Expr::cust(format!(
            "(EXTRACT(EPOCH FROM {}.\"{column}\") * 1000000)::bigint",
            quote(&cron.alias)
        ))
    };
    let q = Query::select()
        .expr_as(col(&cron.alias, "schedule"), alias("schedule"))
        .expr_as(col(&cron.alias, "expression"), alias("expression"))
        .expr_as(col(&cron.alias, "time_zone"), alias("time_zone"))
        .expr_as(micros("last_tick"), alias("last_tick"))
        .expr_as(col(&cron.alias, "last_job_id"), alias("last_job_id"))
        .expr_as(
            Expr::cust("(EXTRACT(EPOCH FROM now()) * 1000000)::bigint"),
            alias("now"),
        )
        .from(table_ref(cron))
        .and_where(col(&cron.alias, "job_table").eq(job_table))
        .order_by(
            (alias(&cron.alias), alias("schedule")),
            sea_query::Order::Asc,
        )
        .to_owned();
    Statement::from(&q)
}

/// The statements above, rendered for `sql/snapshots/` (see tests.rs).
#[cfg(test)]
pub(super) fn snapshots() -> Vec<(&'static str, Statement)> {
    let (cron, every_minute) = (super::fixtures::rel("dbworker_cron"), "0 * * * * *");
    vec![
        (
            "cron_register",
            cron_register(&cron, "app.jobs", "nightly", every_minute, "Europe/Berlin"),
        ),
        ("cron_state", cron_state(&cron, "app.jobs", every_minute)),
        (
            "cron_advance",
            cron_advance(&cron, "app.jobs", every_minute, 7, Some(42)),
        ),
        ("cron_list", cron_list(&cron, "app.jobs")),
        (
            "cron_tick_timeouts",
            cron_tick_timeouts(Duration::from_secs(2), Duration::from_secs(30)),
        ),
    ]
}
