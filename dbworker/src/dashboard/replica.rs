//! A dashboard reading from a streaming replica: how far behind it is, asked
//! on every page and shown in its header.

use maud::{Markup, html};

use super::Shared;
use crate::admin::{ReplicaLag, replica_lag};

/// With a replica: its lag, or `None` when it could not be read (the cause
/// logged, not shown to every viewer). `None`: no replica.
pub(crate) type Lag = Option<Option<ReplicaLag>>;

/// The replica's lag now, if the dashboard reads from one.
pub(super) async fn lag(s: &Shared) -> Lag {
    let replica = s.options.replica.as_ref()?;
    Some(
        replica_lag(replica)
            .await
            .inspect_err(|err| tracing::warn!(error = %err, "reading the replica's lag failed"))
            .ok(),
    )
}

/// The header's line saying the page was read from a replica, and how old
/// what it shows may be.
pub(super) fn line(lag: &Lag) -> Markup {
    html! {
        @if let Some(lag) = lag {
            p class="muted replica" {
                "Read from a replica · "
                @match lag {
                    Some(lag) => { (lag.describe()) }
                    None => { "its lag is unknown (the cause is in the dashboard's log)" }
                }
            }
        }
    }
}
