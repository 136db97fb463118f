//! Cron expressions in standard syntax, in a named time zone, read with the
//! `croner` crate.
//!
//! Why croner (over `cron` and `saffron`): it documents what a schedule in a
//! time zone does across daylight-saving changes (the Open Cron Pattern
//! Specification, as Vixie cron: a fixed-time tick in a skipped hour runs
//! right after the gap, a fixed-time tick in a repeated hour runs once, an
//! interval tick runs at every real occurrence), its iterators move in real
//! time so a tick is never returned twice, it reads standard weekdays
//! (Sunday = 0 or 7) without a shim, and it is released actively. `saffron`
//! has no time zones and no release since 2020; `cron` numbers weekdays from
//! Sunday = 1 and documents nothing about DST.

use std::fmt;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

use crate::error::{Error, Result};

/// The prefixes that name a schedule's time zone, as robfig/cron (and so
/// River) and Google Cloud's schedulers read them: `CRON_TZ=Europe/Berlin 0 3 * * *`.
const ZONE_PREFIXES: [&str; 2] = ["CRON_TZ=", "TZ="];

/// A standard cron expression and the time zone its fields are read in.
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    /// The time fields as written (no zone prefix), single-spaced.
    expression: String,
    zone: Tz,
    cron: Cron,
}

impl Schedule {
    /// `[CRON_TZ=Zone ]fields`: 5 fields (minute hour day-of-month month
    /// day-of-week), or 6 with seconds first; UTC without a prefix.
    pub(crate) fn parse(text: &str) -> Result<Schedule> {
        let (zone, fields) = split_zone(text);
        let schedule = parse_fields(fields.trim(), false).map_err(expression_error)?;
        match zone {
            Some(zone) => schedule.in_zone(zone),
            None => Ok(schedule),
        }
    }

    /// Exactly the 5 fields of a crontab line, in UTC.
    pub(crate) fn parse_five(fields: &str) -> std::result::Result<Schedule, String> {
        parse_fields(fields, true)
    }

    /// The same fields read in `zone` (an IANA name, such as `Europe/Berlin`).
    pub(crate) fn in_zone(mut self, zone: &str) -> Result<Schedule> {
        self.zone = time_zone(zone)?;
        Ok(self)
    }

    /// The time fields as written.
    pub(crate) fn expression(&self) -> &str {
        &self.expression
    }

    /// The IANA name of the time zone (`UTC` by default).
    pub(crate) fn time_zone(&self) -> &str {
        self.zone.name()
    }

    /// Every tick after `after` (exclusive), in real time: across a
    /// daylight-saving change each tick croner finds comes once, in order.
    pub(crate) fn ticks_after(
        &self,
        after: DateTime<Utc>,
    ) -> impl Iterator<Item = DateTime<Utc>> + '_ {
        self.cron
            .iter_after(after.with_timezone(&self.zone))
            .map(|t| t.with_timezone(&Utc))
    }

    /// The first tick after `after`.
    pub(crate) fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.ticks_after(after).next()
    }
}

impl fmt::Display for Schedule {
    /// As it would be written: `CRON_TZ=Europe/Berlin 0 3 * * *`, or the
    /// fields alone in UTC.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.zone == Tz::UTC {
            f.write_str(&self.expression)
        } else {
            write!(f, "CRON_TZ={} {}", self.zone.name(), self.expression)
        }
    }
}

/// A leading `CRON_TZ=Zone` (or `TZ=Zone`) and the rest.
pub(crate) fn split_zone(text: &str) -> (Option<&str>, &str) {
    let text = text.trim_start();
    for prefix in ZONE_PREFIXES {
        if let Some(rest) = text.strip_prefix(prefix) {
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            return (Some(&rest[..end]), &rest[end..]);
        }
    }
    (None, text)
}

/// An IANA time zone by name; the error names it.
pub(crate) fn time_zone(name: &str) -> Result<Tz> {
    name.parse::<Tz>().map_err(|_| Error::InvalidOption {
        field: "time_zone",
        reason: format!(
            "unknown time zone {name:?}: expected an IANA name such as Europe/Berlin or America/New_York (this build's time-zone database, IANA {}, knows {} names)",
            chrono_tz::IANA_TZDB_VERSION,
            chrono_tz::TZ_VARIANTS.len()
        ),
    })
}

fn expression_error(reason: String) -> Error {
    Error::InvalidOption {
        field: "expression",
        reason,
    }
}

/// The parser every schedule goes through: seconds optional (a 6th field
/// first), no year field, a restricted day-of-month and day-of-week must
/// both match (as this crate always read them), and `a/n` steps accepted as
/// `a-max/n` (the `cron` crate read them too).
fn parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .dom_and_dow(true)
        .sloppy_ranges(true)
        .build()
}

fn parse_fields(expression: &str, five_only: bool) -> std::result::Result<Schedule, String> {
    let fields: Vec<&str> = expression.split_whitespace().collect();
    let time_fields = match fields.len() {
        5 => &fields[..],
        6 if !five_only => &fields[1..],
        n if five_only => return Err(format!("expected 5 time fields, found {n}")),
        n => {
            return Err(format!(
                "{expression:?} has {n} fields; expected 5 (minute hour day month weekday) or 6 (seconds first)"
            ));
        }
    };
    // Each field alone first, so an error names it.
    for (i, name) in ["minute", "hour", "day of month", "month", "day of week"]
        .iter()
        .enumerate()
    {
        let mut probe = ["0", "*", "*", "*", "*", "*"];
        probe[i + 1] = time_fields[i];
        parser()
            .parse(&probe.join(" "))
            .map_err(|e| format!("{name} field {:?}: {e}", time_fields[i]))?;
    }
    if fields.len() == 6 {
        parser()
            .parse(&format!("{} * * * * *", fields[0]))
            .map_err(|e| format!("seconds field {:?}: {e}", fields[0]))?;
    }
    let text = fields.join(" ");
    let cron = parser()
        .parse(&text)
        .map_err(|e| format!("{text:?}: {e}"))?;
    let schedule = Schedule {
        expression: text,
        zone: Tz::UTC,
        cron,
    };
    // `0 0 30 2 *` parses, field by field, yet never fires. Every day that
    // exists (February 29 on a given weekday too) comes within 28 years.
    let now = Utc::now();
    let horizon = now + chrono::Duration::days(366 * NEVER_YEARS);
    if schedule.next_after(now).is_none_or(|tick| tick > horizon) {
        return Err(format!(
            "{:?} never fires (no tick within {NEVER_YEARS} years): no day matches its day-of-month, month and weekday fields",
            time_fields.join(" ")
        ));
    }
    Ok(schedule)
}

/// A schedule with no tick within this many years is refused as one that
/// never fires.
const NEVER_YEARS: i64 = 30;

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Datelike, Weekday};

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn next(expression: &str) -> DateTime<Utc> {
        Schedule::parse(expression)
            .unwrap()
            .next_after(at("2026-01-01T00:00:00Z"))
            .unwrap()
    }

    #[test]
    fn weekdays_count_from_sunday_zero_as_in_standard_cron() {
        assert_eq!(next("30 4 * * 1").weekday(), Weekday::Mon);
        assert_eq!(next("0 0 * * 0").weekday(), Weekday::Sun);
        assert_eq!(next("0 0 * * 7").weekday(), Weekday::Sun);
        assert_eq!(next("0 0 * * sat").weekday(), Weekday::Sat);
        // 1 January 2026 is a Thursday, its midnight the start (excluded).
        assert_eq!(next("0 0 * * Mon-Fri").weekday(), Weekday::Fri);
        assert_eq!(next("0 0 * * 6-7").weekday(), Weekday::Sat);
        // `a/n` runs from a to the end of the week.
        assert_eq!(next("0 0 * * 6/2").weekday(), Weekday::Sat);
        for bad in ["8", "5-1", "*/0", "funday"] {
            let err = Schedule::parse(&format!("0 0 * * {bad}")).unwrap_err();
            assert!(
                err.to_string().contains("day of week field"),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn six_fields_put_seconds_first_and_errors_name_the_field() {
        assert_eq!(next("15 * * * * *"), at("2026-01-01T00:00:15Z"));
        let err = |e: &str| Schedule::parse(e).unwrap_err().to_string();
        assert!(
            err("61 * * * *").contains("minute field"),
            "{}",
            err("61 * * * *")
        );
        assert!(err("* 24 * * *").contains("hour field"));
        assert!(err("* * * 13 *").contains("month field"));
        assert!(err("61 * * * * *").contains("seconds field"));
        assert!(err("* * *").contains("3 fields"));
        assert!(err("@daily").contains("1 fields"));
    }

    #[test]
    fn schedules_that_never_fire_are_refused() {
        for never in ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 31 2 1"] {
            let err = Schedule::parse(never).unwrap_err().to_string();
            assert!(err.contains("never fires"), "{never}: {err}");
        }
        // February 29 comes every four years; on a Monday, every 28 at most.
        assert!(Schedule::parse("0 0 29 2 *").is_ok());
        assert!(Schedule::parse("0 0 29 2 1").is_ok());
        // Croner's extensions: the last day of the month.
        assert_eq!(next("0 0 L * *"), at("2026-01-31T00:00:00Z"));
        // Both restricted: both must match (Friday the 13th).
        assert_eq!(next("0 0 13 * 5"), at("2026-02-13T00:00:00Z"));
    }

    #[test]
    fn a_zone_prefix_reads_the_fields_in_that_zone() {
        let berlin = Schedule::parse("CRON_TZ=Europe/Berlin 0 3 * * *").unwrap();
        assert_eq!(berlin.time_zone(), "Europe/Berlin");
        assert_eq!(berlin.expression(), "0 3 * * *");
        assert_eq!(berlin.to_string(), "CRON_TZ=Europe/Berlin 0 3 * * *");
        // 03:00 in Berlin is 02:00 UTC in winter.
        assert_eq!(
            berlin.next_after(at("2026-01-01T00:00:00Z")),
            Some(at("2026-01-01T02:00:00Z"))
        );
        let tz = Schedule::parse("TZ=America/New_York 0 9 * * *").unwrap();
        assert_eq!(tz.to_string(), "CRON_TZ=America/New_York 0 9 * * *");
        assert_eq!(Schedule::parse("0 3 * * *").unwrap().time_zone(), "UTC");
        let err = Schedule::parse("CRON_TZ=Europe/Berln 0 3 * * *")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`time_zone`") && err.contains("\"Europe/Berln\""),
            "{err}"
        );
    }
}
