//! What the dashboard's database role must be allowed: with actions, the
//! grants they use; with `DashboardOptions::read_only`, `SELECT` alone.

use crate::admin::Admin;
use crate::control::FairWeights;
use crate::control::pauses::Pauses;
use crate::error::{Error, Result};

/// The grants a dashboard with actions uses: the actions' (delete
/// included), the pause table's and the weight table's writes, and sending
/// signals on a table with them. Missing ones are named with the way out
/// that needs none.
pub(super) async fn check_actions(
    writer: &Admin,
    pauses: Option<&Pauses>,
    fairness: Option<&FairWeights>,
) -> Result<()> {
    // Every check runs, so one start-up names every missing grant.
    let mut problems = Vec::new();
    let mut checks = vec![
        writer.check_actions().await,
        writer.check_deletes().await,
        writer.check_signals().await,
    ];
    if let Some(p) = pauses {
        checks.push(p.check_writes().await);
    }
    if let Some(f) = fairness {
        checks.push(f.check_writes().await);
    }
    for checked in checks {
        match checked {
            Ok(()) => {}
            Err(Error::Access { problems: more }) => {
                for m in more {
                    if !problems.contains(&m) {
                        problems.push(m);
                    }
                }
            }
            Err(other) => return Err(other),
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    problems.push(
        "a dashboard without actions needs only SELECT: set DashboardOptions::read_only (`dbworker ui --read-only`)".to_owned(),
    );
    Err(Error::Access { problems })
}
