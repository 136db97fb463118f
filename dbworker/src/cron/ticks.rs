//! Which ticks a pass enqueues: the backfill policies, decided without the
//! database (the caller holds the schedule's row lock and the clock's reading).

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::schedule::Schedule;

/// What happens to ticks missed while no scheduler ran (downtime).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backfill {
    /// Enqueue the latest due tick only if it is at most `grace` late; older
    /// missed ticks are dropped. A tick a running scheduler finds on its
    /// next pass always runs: the grace is at least the pass interval plus a
    /// minute.
    Skip {
        /// How late a tick may be and still run.
        grace: Duration,
    },
    /// Enqueue one job for the latest due tick however late (a run that
    /// "catches up" once, never once per missed tick).
    RunOnce,
    /// Enqueue one job for every tick missed within `window` before now
    /// (oldest first, in one transaction), and drop older ones. The latest
    /// due tick also runs if a running scheduler could have found it now (at
    /// most a minute, or the pass interval plus a minute, late), so a window
    /// shorter than the scheduler's pass loses no regular tick. A crontab's
    /// `?fill=`.
    Fill {
        /// How far back missed ticks are enqueued.
        window: Duration,
    },
}

impl Default for Backfill {
    fn default() -> Self {
        Backfill::Skip {
            grace: Duration::from_secs(60),
        }
    }
}

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
    schedule: &Schedule,
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
        // A pass interval longer than the grace must not drop the ticks a
        // running scheduler finds late only because of its own pace.
        Backfill::Skip { grace } if late(latest) <= grace.max(on_time) => vec![due(latest)],
        Backfill::Skip { .. } => Vec::new(),
        Backfill::Fill { window } => {
            let from = chrono::Duration::from_std(window)
                .ok()
                .and_then(|w| now.checked_sub_signed(w))
                .map_or(last, |start| start.max(last));
            let mut ticks: Vec<Due> = schedule
                .ticks_after(from)
                .take(50_000_000)
                .take_while(|t| *t <= now)
                .map(due)
                .collect();
            if ticks.is_empty() && late(latest) <= FILL_LATEST_GRACE.max(on_time) {
                ticks.push(due(latest));
            }
            ticks
        }
    };
    (ticks, Some(latest))
}

/// The latest tick in `(last, now]`, if any.
pub(super) fn latest_tick(
    schedule: &Schedule,
    last: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    // Bounded: a per-second schedule after a year offline is 3e7 steps at most.
    schedule
        .ticks_after(last)
        .take(50_000_000)
        .take_while(|t| *t <= now)
        .last()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn hourly() -> Schedule {
        Schedule::parse("0 0 * * * *").unwrap()
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

    /// A scheduler passing every five minutes finds an hourly tick up to
    /// five minutes late: it runs under `Skip` (grace 60 s) and `Fill` (a
    /// window of 30 s), though later than their minute.
    #[test]
    fn a_pass_interval_longer_than_the_grace_drops_no_regular_tick() {
        let on_time = Duration::from_secs(5 * 60 + 60);
        let (last, now) = (at("2026-01-01T00:00:00Z"), at("2026-01-01T01:04:30Z"));
        for backfill in [
            Backfill::default(),
            Backfill::Fill {
                window: Duration::from_secs(30),
            },
        ] {
            let (ticks, advance) = due_ticks(&hourly(), backfill, last, now, on_time);
            assert_eq!(
                ticks,
                [Due {
                    at: at("2026-01-01T01:00:00Z"),
                    backfilled: false
                }],
                "{backfill:?}"
            );
            assert_eq!(advance, Some(at("2026-01-01T01:00:00Z")));
        }
        // Missed for longer than a pass: downtime, skipped.
        let later = at("2026-01-01T01:07:00Z");
        let (ticks, _) = due_ticks(&hourly(), Backfill::default(), last, later, on_time);
        assert!(ticks.is_empty());
    }

    /// Drives the scheduler's decision as its passes would, every `step`
    /// from `from` to `to`, advancing `last` as the transaction does; the
    /// ticks enqueued, in order.
    fn passes(schedule: &Schedule, from: &str, to: &str, step: i64) -> Vec<DateTime<Utc>> {
        let (mut last, to) = (at(from), at(to));
        let mut now = last;
        let mut enqueued = Vec::new();
        let minute = Duration::from_secs(61);
        while now <= to {
            now += chrono::Duration::seconds(step);
            let (due, advance) = due_ticks(schedule, Backfill::default(), last, now, minute);
            enqueued.extend(due.iter().map(|d| d.at));
            if let Some(advance) = advance {
                last = advance;
            }
        }
        enqueued
    }

    fn berlin(fields: &str) -> Schedule {
        Schedule::parse(fields)
            .unwrap()
            .in_zone("Europe/Berlin")
            .unwrap()
    }

    fn local(ticks: &[DateTime<Utc>]) -> Vec<String> {
        let tz: chrono_tz::Tz = "Europe/Berlin".parse().unwrap();
        ticks
            .iter()
            .map(|t| t.with_timezone(&tz).format("%m-%d %H:%M %Z").to_string())
            .collect()
    }

    /// Europe/Berlin, 2026: clocks jump from 02:00 to 03:00 on 29 March and
    /// fall back from 03:00 to 02:00 on 25 October. A pass every 30 s.
    #[test]
    fn a_daily_tick_in_berlin_runs_once_per_local_day_across_both_changes() {
        let nightly = berlin("30 2 * * *");
        // Spring forward: 02:30 does not exist on the 29th; it runs right
        // after the gap, at 03:00 CEST.
        let ticks = passes(&nightly, "2026-03-27T12:00:00Z", "2026-03-31T12:00:00Z", 30);
        assert_eq!(
            local(&ticks),
            [
                "03-28 02:30 CET",
                "03-29 03:00 CEST",
                "03-30 02:30 CEST",
                "03-31 02:30 CEST"
            ]
        );
        // Fall back: 02:30 comes twice on the 25th; it runs at the first.
        let ticks = passes(&nightly, "2026-10-23T12:00:00Z", "2026-10-27T12:00:00Z", 30);
        assert_eq!(
            local(&ticks),
            [
                "10-24 02:30 CEST",
                "10-25 02:30 CEST",
                "10-26 02:30 CET",
                "10-27 02:30 CET"
            ]
        );
        assert_eq!(ticks[1], at("2026-10-25T00:30:00Z"));
    }

    /// An interval schedule runs at every real occurrence: none in the
    /// skipped hour, both passes of the repeated one, each once.
    #[test]
    fn an_interval_schedule_in_berlin_runs_every_real_half_hour_once() {
        let half_hourly = berlin("*/30 * * * *");
        let ticks = passes(
            &half_hourly,
            "2026-03-29T00:10:00Z",
            "2026-03-29T01:40:00Z",
            10,
        );
        assert_eq!(
            local(&ticks),
            ["03-29 01:30 CET", "03-29 03:00 CEST", "03-29 03:30 CEST"]
        );
        let ticks = passes(
            &half_hourly,
            "2026-10-24T23:40:00Z",
            "2026-10-25T02:10:00Z",
            10,
        );
        assert_eq!(
            local(&ticks),
            [
                "10-25 02:00 CEST",
                "10-25 02:30 CEST",
                "10-25 02:00 CET",
                "10-25 02:30 CET",
                "10-25 03:00 CET"
            ]
        );
        // Half an hour apart in real time, each instant once.
        assert!(
            ticks
                .windows(2)
                .all(|w| w[1] - w[0] == chrono::Duration::minutes(30))
        );
    }

    /// A scheduler that was down over the change and catches up with `Fill`
    /// enqueues the same ticks, once each.
    #[test]
    fn fill_across_a_change_enqueues_each_local_tick_once() {
        let nightly = berlin("30 2 * * *");
        let fill = Backfill::Fill {
            window: Duration::from_secs(7 * 86_400),
        };
        let (ticks, _) = due_ticks(
            &nightly,
            fill,
            at("2026-10-23T12:00:00Z"),
            at("2026-10-27T12:00:00Z"),
            Duration::from_secs(61),
        );
        let times: Vec<_> = ticks.iter().map(|d| d.at).collect();
        assert_eq!(
            local(&times),
            [
                "10-24 02:30 CEST",
                "10-25 02:30 CEST",
                "10-26 02:30 CET",
                "10-27 02:30 CET"
            ]
        );
    }
}
