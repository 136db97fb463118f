//! Cron expressions in standard syntax, read with the `cron` crate.
//!
//! The crate numbers weekdays from Sunday = 1; standard cron (and crontab
//! files) from Sunday = 0 (or 7), Monday = 1. The weekday field is therefore
//! expanded here and handed over as names, so `30 4 * * 1` is Monday.

use std::str::FromStr;

const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];

/// A standard expression: 5 fields (minute hour day-of-month month
/// day-of-week), or 6 with seconds first; UTC.
pub(crate) fn parse(expression: &str) -> Result<cron::Schedule, String> {
    let fields: Vec<&str> = expression.split_whitespace().collect();
    match fields.len() {
        5 => build("0", &fields),
        6 => build(fields[0], &fields[1..]),
        n => Err(format!(
            "{expression:?} has {n} fields; expected 5 (minute hour day month weekday) or 6 (seconds first)"
        )),
    }
}

/// Exactly the 5 fields of a crontab line.
pub(crate) fn parse_five(expression: &str) -> Result<cron::Schedule, String> {
    let fields: Vec<&str> = expression.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!("expected 5 time fields, found {}", fields.len()));
    }
    build("0", &fields)
}

/// `fields`: minute hour day-of-month month day-of-week.
fn build(seconds: &str, fields: &[&str]) -> Result<cron::Schedule, String> {
    // Each field alone first, so an error names it.
    for (i, name) in ["minute", "hour", "day of month", "month"]
        .iter()
        .enumerate()
    {
        let mut probe = ["0", "*", "*", "*", "*", "*"];
        probe[i + 1] = fields[i];
        cron::Schedule::from_str(&probe.join(" "))
            .map_err(|e| format!("{name} field {:?}: {e}", fields[i]))?;
    }
    let weekdays =
        weekdays(fields[4]).map_err(|e| format!("day of week field {:?}: {e}", fields[4]))?;
    let text = format!(
        "{seconds} {} {} {} {} {weekdays}",
        fields[0], fields[1], fields[2], fields[3]
    );
    let schedule = cron::Schedule::from_str(&text).map_err(|e| format!("{text:?}: {e}"))?;
    // `0 0 30 2 *` parses, field by field, yet never fires. Every day that
    // exists (February 29 on a given weekday too) comes within 28 years.
    let now = chrono::Utc::now();
    let horizon = now + chrono::Duration::days(366 * NEVER_YEARS);
    if schedule
        .after(&now)
        .next()
        .is_none_or(|tick| tick > horizon)
    {
        return Err(format!(
            "{:?} never fires (no tick within {NEVER_YEARS} years): no day matches its day-of-month, month and weekday fields",
            fields.join(" ")
        ));
    }
    Ok(schedule)
}

/// A schedule with no tick within this many years is refused as one that
/// never fires.
const NEVER_YEARS: i64 = 30;

/// A standard day-of-week field (`*`, `*/n`, `a`, `a-b`, `a-b/n`, `a/n`,
/// comma lists; 0-7 with 0 and 7 Sunday, or names) as the crate's names.
fn weekdays(field: &str) -> Result<String, String> {
    let mut days = [false; 7];
    for item in field.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => (
                r,
                s.parse::<usize>()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or_else(|| format!("step {s:?} must be a positive integer"))?,
            ),
            None => (item, 1),
        };
        let (low, high) = match range.split_once('-') {
            _ if range == "*" => (0, 6),
            Some((a, b)) => (day(a)?, day(b)?),
            // `a/n` runs from a to the end of the week.
            None if step > 1 => (day(range)?, 6),
            None => (day(range)?, day(range)?),
        };
        if low > high {
            return Err(format!("range {range:?} runs backwards"));
        }
        for d in (low..=high).step_by(step) {
            days[d % 7] = true;
        }
    }
    if days.iter().all(|d| *d) {
        return Ok("*".to_owned());
    }
    let names: Vec<&str> = (0..7).filter(|d| days[*d]).map(|d| DAYS[d]).collect();
    Ok(names.join(","))
}

/// A day: 0-7 (0 and 7 are Sunday) or a three-letter name.
fn day(text: &str) -> Result<usize, String> {
    if let Ok(n) = text.parse::<usize>() {
        return if n <= 7 {
            Ok(n)
        } else {
            Err(format!("{n} is not a day (0-7, Sunday = 0 or 7)"))
        };
    }
    DAYS.iter()
        .position(|d| d.eq_ignore_ascii_case(text))
        .ok_or_else(|| format!("{text:?} is not a day (0-7 or Sun-Sat)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Datelike, Utc, Weekday};

    fn next(expression: &str) -> DateTime<Utc> {
        let from = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap();
        parse(expression)
            .unwrap()
            .after(&from.with_timezone(&Utc))
            .next()
            .unwrap()
    }

    #[test]
    fn weekdays_count_from_sunday_zero_as_in_standard_cron() {
        assert_eq!(next("30 4 * * 1").weekday(), Weekday::Mon);
        assert_eq!(next("0 0 * * 0").weekday(), Weekday::Sun);
        assert_eq!(next("0 0 * * 7").weekday(), Weekday::Sun);
        assert_eq!(next("0 0 * * sat").weekday(), Weekday::Sat);
        assert_eq!(weekdays("1-5").unwrap(), "Mon,Tue,Wed,Thu,Fri");
        assert_eq!(weekdays("5-7").unwrap(), "Sun,Fri,Sat");
        assert_eq!(weekdays("*/2").unwrap(), "Sun,Tue,Thu,Sat");
        assert_eq!(weekdays("0-7").unwrap(), "*");
        assert_eq!(weekdays("3/2,0").unwrap(), "Sun,Wed,Fri");
        for bad in ["8", "5-1", "*/0", "funday", ""] {
            assert!(weekdays(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn six_fields_put_seconds_first_and_errors_name_the_field() {
        assert_eq!(
            next("15 * * * * *").to_rfc3339(),
            "2026-01-01T00:00:15+00:00"
        );
        assert!(parse("61 * * * *").unwrap_err().starts_with("minute field"));
        assert!(parse("* 24 * * *").unwrap_err().starts_with("hour field"));
        assert!(parse("* * * 13 *").unwrap_err().starts_with("month field"));
        assert!(parse("* * *").unwrap_err().contains("3 fields"));
    }

    #[test]
    fn schedules_that_never_fire_are_refused() {
        for never in ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 31 2 1"] {
            let err = parse(never).unwrap_err();
            assert!(err.contains("never fires"), "{never}: {err}");
        }
        // February 29 comes every four years; on a Monday, every 28 at most.
        assert!(parse("0 0 29 2 *").is_ok());
        assert!(parse("0 0 29 2 1").is_ok());
    }
}
