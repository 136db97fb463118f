//! Cron: each tick claimed exactly once across schedulers.

use super::{Statement, alias, col, table_ref};
use crate::columns::{Relation, quote};
use sea_query::{Expr, ExprTrait, LockType, OnConflict, Query};

/// Registers a cron schedule, starting from now, unless it is known.
pub(crate) fn cron_register(cron: &Relation, job_table: &str, schedule: &str) -> Statement {
    let mut q = Query::insert();
    q.into_table(table_ref(cron))
        .columns([alias("job_table"), alias("schedule"), alias("last_tick")])
        .values_panic([
            Expr::val(job_table),
            Expr::val(schedule),
            Expr::cust("clock_timestamp()"),
        ])
        .on_conflict(
            OnConflict::columns([alias("job_table"), alias("schedule")])
                .do_nothing()
                .to_owned(),
        );
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

/// Records the tick a schedule has enqueued (or skipped) up to.
pub(crate) fn cron_advance(
    cron: &Relation,
    job_table: &str,
    schedule: &str,
    tick_micros: i64,
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
        .and_where(col(&cron.alias, "job_table").eq(job_table))
        .and_where(col(&cron.alias, "schedule").eq(schedule))
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
            cron_register(&cron, "app.jobs", every_minute),
        ),
        ("cron_state", cron_state(&cron, "app.jobs", every_minute)),
        (
            "cron_advance",
            cron_advance(&cron, "app.jobs", every_minute, 7),
        ),
    ]
}
