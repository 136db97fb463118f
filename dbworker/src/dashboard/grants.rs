//! What the dashboard's database role must be allowed: with actions, the
//! grants they use; with `DashboardOptions::read_only`, `SELECT` alone.

use crate::admin::Admin;
use crate::control::pauses::Pauses;
use crate::error::{Error, Result};

/// The grants a dashboard with actions uses: the actions' (delete
/// included) and the pause table's writes. Missing ones are named with the
/// way out that needs none.
pub(super) async fn check_actions(writer: &Admin, pauses: Option<&Pauses>) -> Result<()> {
    let mut checked = writer.check_actions().await;
    if checked.is_ok() {
        checked = writer.check_deletes().await;
    }
    if checked.is_ok()
        && let Some(p) = pauses
    {
        checked = p.check_writes().await;
    }
    match checked {
        Err(Error::Schema { mut problems }) => {
            problems.push(
                "a dashboard without actions needs only SELECT: set DashboardOptions::read_only (`dbworker ui --read-only`)".to_owned(),
            );
            Err(Error::Schema { problems })
        }
        other => other,
    }
}
