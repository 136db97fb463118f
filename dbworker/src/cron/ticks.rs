//! Which ticks a pass enqueues: the backfill policies, decided without the
//! database (the caller holds the schedule's row lock and the clock's reading).

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Backfill;

/// How late the latest tick of a [`Backfill::Fill`] schedule may be and
/// still run when it is older than the window (the default grace).
const FILL_LATEST_GRACE: Duration = Duration::from_secs(60);

/// A tick to enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Due {
    pub(super) at: DateTime<Utc>,
    /// Enqueued because it was missed: an earlier tick than the latest due
    /// one, or the latest when more than `on_time` late.
    pub(super) backfilled: bool,
}

/// The ticks to enqueue in this pass, oldest first, and the tick the
/// schedule advances to (`None`: nothing came due since `last`).
pub(super) fn due_ticks(
    schedule: &cron::Schedule,
    backfill: Backfill,
    last: DateTime<Utc>,
    now: DateTime<Utc>,
    on_time: Duration,
) -> (Vec<Due>, Option<DateTime<Utc>>) {
    let Some(latest) = latest_tick(schedule, last, now) else {
        return (Vec::new(), None);
    };
    let late = |t: DateTime<Utc>| now.signed_duration_since(t).to_std().unwrap_or_default();
    let due = |at: DateTime<Utc>| Due {
        at,
        backfilled: at != latest || late(at) > on_time,
    };
    let ticks = match backfill {
        Backfill::RunOnce => vec![due(latest)],
        Backfill::Skip { grace } if late(latest) <= grace => vec![due(latest)],
        Backfill::Skip { .. } => Vec::new(),
        Backfill::Fill { window } => {
            let from = chrono::Duration::from_std(window)
                .ok()
                .and_then(|w| now.checked_sub_signed(w))
                .map_or(last, |start| start.max(last));
            let mut ticks: Vec<Due> = schedule
                .after(&from)
                .take(50_000_000)
                .take_while(|t| *t <= now)
                .map(due)
                .collect();
            if ticks.is_empty() && late(latest) <= FILL_LATEST_GRACE {
                ticks.push(due(latest));
            }
            ticks
        }
    };
    (ticks, Some(latest))
}

/// The latest tick in `(last, now]`, if any.
pub(super) fn latest_tick(
    schedule: &cron::Schedule,
    last: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    // Bounded: a per-second schedule after a year offline is 3e7 steps at most.
    schedule
        .after(&last)
        .take(50_000_000)
        .take_while(|t| *t <= now)
        .last()
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn hourly() -> cron::Schedule {
        cron::Schedule::from_str("0 0 * * * *").unwrap()
    }

    #[test]
    fn the_latest_due_tick_is_found_and_none_before_the_first() {
        assert_eq!(
            latest_tick(
                &hourly(),
                at("2026-01-01T00:30:00Z"),
                at("2026-01-01T03:10:00Z")
            ),
            Some(at("2026-01-01T03:00:00Z"))
        );
        assert_eq!(
            latest_tick(
                &hourly(),
                at("2026-01-01T00:30:00Z"),
                at("2026-01-01T00:59:59Z")
            ),
            None
        );
    }

    #[test]
    fn fill_enqueues_every_missed_tick_within_the_window() {
        let (last, now) = (at("2026-01-01T00:30:00Z"), at("2026-01-01T05:10:00Z"));
        let fill = Backfill::Fill {
            window: Duration::from_secs(3 * 3600),
        };
        let minute = Duration::from_secs(61);
        let (ticks, advance) = due_ticks(&hourly(), fill, last, now, minute);
        let times: Vec<_> = ticks.iter().map(|d| d.at).collect();
        assert_eq!(
            times,
            [
                at("2026-01-01T03:00:00Z"),
                at("2026-01-01T04:00:00Z"),
                at("2026-01-01T05:00:00Z")
            ]
        );
        assert!(ticks.iter().all(|d| d.backfilled), "all were missed");
        assert_eq!(advance, Some(at("2026-01-01T05:00:00Z")));
        // On time: the latest tick alone, not backfilled.
        let now = at("2026-01-01T05:00:30Z");
        let (ticks, _) = due_ticks(&hourly(), fill, at("2026-01-01T04:00:00Z"), now, minute);
        assert_eq!(
            ticks,
            [Due {
                at: at("2026-01-01T05:00:00Z"),
                backfilled: false
            }]
        );
        // A window shorter than the lateness still runs an on-time tick.
        let short = Backfill::Fill {
            window: Duration::from_secs(10),
        };
        let (ticks, _) = due_ticks(&hourly(), short, at("2026-01-01T04:00:00Z"), now, minute);
        assert_eq!(ticks.len(), 1);
    }

    #[test]
    fn skip_and_run_once_enqueue_the_latest_tick_at_most() {
        let (last, now) = (at("2026-01-01T00:30:00Z"), at("2026-01-01T05:10:00Z"));
        let minute = Duration::from_secs(61);
        let (ticks, advance) = due_ticks(&hourly(), Backfill::RunOnce, last, now, minute);
        assert_eq!(
            ticks,
            [Due {
                at: at("2026-01-01T05:00:00Z"),
                backfilled: true
            }]
        );
        assert_eq!(advance, Some(at("2026-01-01T05:00:00Z")));
        let (ticks, advance) = due_ticks(&hourly(), Backfill::default(), last, now, minute);
        assert!(ticks.is_empty());
        assert_eq!(
            advance,
            Some(at("2026-01-01T05:00:00Z")),
            "skipped, still advanced"
        );
    }
}
