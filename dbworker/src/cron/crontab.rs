//! Crontab files: schedules as text, one a line, parsed with line-numbered
//! errors into entries a [`Scheduler`](super::Scheduler) runs.
//!
//! ```text
//! # ┌ minute ┌ hour ┌ day of month ┌ month ┌ day of week (0-7, Sun = 0 or 7)
//! # │        │      │              │       │  kind        options               payload
//!   30       4      *              *       1  send_email  ?fill=2d&max=10       {"onboarding": false}
//! # The same fields read in a time zone (UTC without the prefix):
//!   CRON_TZ=Europe/Berlin 0 3 * * *           nightly_report
//! ```

use std::time::Duration;

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// One line of a crontab: a schedule and the job each tick enqueues.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CrontabEntry {
    /// The line it came from (1-based).
    pub line: usize,
    /// The schedule's name in the cron table: `?id=`, or the kind. Two
    /// entries of one crontab may not share it.
    pub id: String,
    /// The five time fields as written (minute hour day-of-month month
    /// day-of-week), read in [`time_zone`](Self::time_zone).
    pub expression: String,
    /// The line's `CRON_TZ=` (or `TZ=`) prefix: the IANA time zone its
    /// fields are read in; `None` is UTC. Not checked against the time-zone
    /// database here: [`Scheduler::crontab`](super::Scheduler::crontab) does,
    /// and an unknown zone fails that schedule alone.
    pub time_zone: Option<String>,
    /// The task identifier: the job's kind.
    pub kind: String,
    /// `?fill=`: every tick missed within this window is enqueued when a
    /// scheduler comes back ([`Backfill::Fill`](super::Backfill::Fill)).
    pub fill: Option<Duration>,
    /// `?max=`: the job's attempts at most (stored as `max_retries = max - 1`).
    pub max_attempts: Option<u32>,
    /// `?queue=`: the job's queue.
    pub queue: Option<String>,
    /// `?priority=`: the job's priority.
    pub priority: Option<i32>,
    /// The JSON object after the options (empty without one); each job's
    /// payload is this plus `_cron`.
    pub payload: Map<String, Value>,
}

/// A parsed crontab: its entries in file order.
///
/// ```
/// let crontab = dbworker::cron::Crontab::parse(
///     "# weekly, and the two days missed before a restart\n\
///      30 4 * * 1 send_weekly_email ?fill=2d&max=10 {\"onboarding\": false}\n\
///      0 */4 * * * rollup\n",
/// )
/// .unwrap();
/// assert_eq!(crontab.entries().len(), 2);
/// assert_eq!(crontab.entries()[0].fill, Some(std::time::Duration::from_secs(2 * 86_400)));
/// let err = dbworker::cron::Crontab::parse("* * * * nightly").unwrap_err();
/// assert_eq!(err.to_string(), "crontab line 1: expected 5 time fields and a task identifier");
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Crontab {
    entries: Vec<CrontabEntry>,
}

impl Crontab {
    /// Parses crontab text: `#` comments and blank lines are skipped; each
    /// other line is optionally `CRON_TZ=Zone`, five time fields, a task
    /// identifier, then optionally
    /// `?opts` (`id`, `fill`, `max`, `queue`, `priority`, query-string
    /// style) and a JSON object. The first bad line is reported as
    /// [`Error::Crontab`] with its number.
    pub fn parse(text: &str) -> Result<Crontab> {
        let mut entries: Vec<CrontabEntry> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let content = raw.trim();
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            let entry =
                parse_line(line, content).map_err(|reason| Error::Crontab { line, reason })?;
            if let Some(first) = entries.iter().find(|e| e.id == entry.id) {
                return Err(Error::Crontab {
                    line,
                    reason: format!(
                        "id {:?} is already used on line {}; give one of them ?id=",
                        entry.id, first.line
                    ),
                });
            }
            entries.push(entry);
        }
        Ok(Crontab { entries })
    }

    /// The entries, in file order.
    pub fn entries(&self) -> &[CrontabEntry] {
        &self.entries
    }
}

/// Splits off the first whitespace-separated token.
fn token(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start();
    if s.is_empty() {
        return None;
    }
    let end = s.find(char::is_whitespace).unwrap_or(s.len());
    Some((&s[..end], &s[end..]))
}

fn parse_line(line: usize, content: &str) -> std::result::Result<CrontabEntry, String> {
    let (time_zone, mut rest) = super::schedule::split_zone(content);
    if let Some(zone) = time_zone
        && (zone.is_empty()
            || !zone
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '-' | '+')))
    {
        return Err(format!(
            "time zone {zone:?} must be an IANA name such as CRON_TZ=Europe/Berlin"
        ));
    }
    let mut fields = Vec::with_capacity(6);
    for _ in 0..6 {
        let Some((t, r)) = token(rest) else {
            return Err("expected 5 time fields and a task identifier".to_owned());
        };
        fields.push(t);
        rest = r;
    }
    let kind = fields.pop().unwrap_or_default().to_owned();
    let expression = fields.join(" ");
    super::schedule::Schedule::parse_five(&expression)?;
    if !is_name(&kind, true) {
        return Err(format!(
            "task identifier {kind:?} must start with a letter or _ and hold only letters, digits, _, - and :"
        ));
    }
    let mut entry = CrontabEntry {
        line,
        id: kind.clone(),
        expression,
        time_zone: time_zone.map(str::to_owned),
        kind,
        fill: None,
        max_attempts: None,
        queue: None,
        priority: None,
        payload: Map::new(),
    };
    let mut rest = rest.trim_start();
    if rest.starts_with('?') {
        let (opts, r) = token(rest).unwrap_or_default();
        parse_options(&mut entry, &opts[1..])?;
        rest = r.trim_start();
    }
    if !rest.is_empty() {
        if !rest.starts_with('{') {
            return Err(format!(
                "expected ?options or a JSON object after the task identifier, found {rest:?}"
            ));
        }
        // JSON, or JSON5 as graphile-worker's crontabs write it (unquoted
        // keys, single quotes, trailing commas: `{onboarding:false}`).
        let parsed = serde_json::from_str::<Value>(rest)
            .or_else(|_| json5::from_str::<Value>(rest).map_err(|e| e.to_string()));
        entry.payload = match parsed {
            Ok(Value::Object(map)) => map,
            Ok(_) => return Err("the payload must be a JSON object".to_owned()),
            Err(e) => return Err(format!("the payload is not valid JSON or JSON5: {e}")),
        };
        // Every tick's enqueue would fail on it.
        if let Some(path) = crate::message::nul_path(&Value::Object(entry.payload.clone())) {
            return Err(format!(
                "the payload holds a NUL character (\\u0000) at {path}, which PostgreSQL cannot store"
            ));
        }
    }
    Ok(entry)
}

fn parse_options(entry: &mut CrontabEntry, opts: &str) -> std::result::Result<(), String> {
    let mut seen: Vec<&str> = Vec::new();
    for pair in opts.split('&') {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("option {pair:?} needs a value (key=value)"))?;
        if seen.contains(&key) {
            return Err(format!("option {key:?} is given twice"));
        }
        seen.push(key);
        match key {
            "id" if is_name(value, false)
                && value.starts_with(|c: char| c.is_ascii_alphabetic()) =>
            {
                entry.id = value.to_owned();
            }
            "id" => {
                return Err(format!(
                    "id {value:?} must start with a letter and hold only letters, digits, _ and -"
                ));
            }
            "fill" => entry.fill = Some(time_phrase(value)?),
            "max" => {
                entry.max_attempts = Some(
                    value
                        .parse::<u32>()
                        .ok()
                        .filter(|n| (1..=32_767).contains(n))
                        .ok_or_else(|| {
                            format!("max {value:?} must be an integer from 1 to 32767")
                        })?,
                );
            }
            "queue" if !value.is_empty() && is_name(value, true) => {
                entry.queue = Some(value.to_owned());
            }
            "queue" => {
                return Err(format!(
                    "queue {value:?} must hold only letters, digits, _, - and :"
                ));
            }
            "priority" => {
                entry.priority = Some(
                    value
                        .parse::<i32>()
                        .map_err(|_| format!("priority {value:?} must be an integer"))?,
                );
            }
            other => {
                return Err(format!(
                    "unknown option {other:?} (expected id, fill, max, queue or priority)"
                ));
            }
        }
    }
    Ok(())
}

/// Letters, digits, `_` and `-` (and `:` when `colon`), not starting with a
/// digit, `-` or `:`.
fn is_name(s: &str, colon: bool) -> bool {
    let mut chars = s.chars();
    let ok_first = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_');
    ok_first
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || (colon && c == ':'))
}

/// A time phrase such as `4w3d2h1m`: numbers each followed by a unit (`s`,
/// `m`, `h`, `d`, `w`), summed.
pub(crate) fn time_phrase(text: &str) -> std::result::Result<Duration, String> {
    let bad =
        |why: &str| format!("time phrase {text:?} {why} (like 4w3d2h1m; units s, m, h, d, w)");
    if text.is_empty() {
        return Err(bad("is empty"));
    }
    let mut total: u64 = 0;
    let mut number = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit: u64 = match c {
            's' => 1,
            'm' => 60,
            'h' => 3_600,
            'd' => 86_400,
            'w' => 604_800,
            _ => return Err(bad(&format!("has an unknown unit {c:?}"))),
        };
        if number.is_empty() {
            return Err(bad(&format!("has no number before {c:?}")));
        }
        let n: u64 = number.parse().map_err(|_| bad("is too large"))?;
        total = n
            .checked_mul(unit)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(|| bad("is too large"))?;
        number.clear();
    }
    if !number.is_empty() {
        return Err(bad("ends without a unit"));
    }
    if total == 0 {
        return Err(bad("is zero"));
    }
    Ok(Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> (usize, String) {
        match Crontab::parse(text) {
            Err(Error::Crontab { line, reason }) => (line, reason),
            other => panic!("expected a crontab error, got {other:?}"),
        }
    }

    /// Seed 004's line as it writes it: a JSON5 payload.
    #[test]
    fn a_json5_payload_parses_as_graphile_writes_it() {
        let crontab = Crontab::parse(
            "30 4 * * 1 send_weekly_email ?fill=2d&max=10 {onboarding:false, to: 'ops', tags: ['a',],}\n",
        )
        .unwrap();
        let p = &crontab.entries()[0].payload;
        assert_eq!(p["onboarding"], Value::Bool(false));
        assert_eq!(p["to"], Value::String("ops".into()));
        assert_eq!(p["tags"], serde_json::json!(["a"]));
        let (line, reason) = error("* * * * * k {onboarding:}\n");
        assert_eq!(line, 1);
        assert!(reason.contains("not valid JSON or JSON5"), "{reason}");
    }

    #[test]
    fn a_crontab_with_comments_options_and_payloads_parses() {
        let text = "# nightly things\n\
                    \n\
                    30 4 * * 1 send_weekly_email ?fill=2d&max=10 {\"onboarding\": false, \"n\": 1}\n\
                    \t0 */4 * * * rollup\n\
                    0 3 * * * rollup ?id=rollup_nightly&queue=reports&priority=-5\n";
        let crontab = Crontab::parse(text).unwrap();
        let e = crontab.entries();
        assert_eq!(e.len(), 3);
        assert_eq!((e[0].line, e[0].id.as_str()), (3, "send_weekly_email"));
        assert_eq!(e[0].expression, "30 4 * * 1");
        assert_eq!(e[0].fill, Some(Duration::from_secs(2 * 86_400)));
        assert_eq!(e[0].max_attempts, Some(10));
        assert_eq!(e[0].payload["onboarding"], Value::Bool(false));
        assert_eq!(e[0].payload.len(), 2);
        assert_eq!((e[1].line, e[1].kind.as_str()), (4, "rollup"));
        assert!(e[1].payload.is_empty() && e[1].fill.is_none());
        assert_eq!(
            (e[2].id.as_str(), e[2].kind.as_str()),
            ("rollup_nightly", "rollup")
        );
        assert_eq!(e[2].queue.as_deref(), Some("reports"));
        assert_eq!(e[2].priority, Some(-5));
        assert_eq!(Crontab::parse("# only\n\n").unwrap().entries().len(), 0);
        assert!(e.iter().all(|e| e.time_zone.is_none()), "UTC by default");
        let zoned =
            Crontab::parse("CRON_TZ=Europe/Berlin 0 3 * * * report\nTZ=Etc/GMT+5 0 3 * * * other")
                .unwrap();
        let z = zoned.entries();
        assert_eq!(z[0].time_zone.as_deref(), Some("Europe/Berlin"));
        assert_eq!(
            (z[0].expression.as_str(), z[0].kind.as_str()),
            ("0 3 * * *", "report")
        );
        assert_eq!(z[1].time_zone.as_deref(), Some("Etc/GMT+5"));
    }

    #[test]
    fn time_phrases_add_up_their_units() {
        assert_eq!(
            time_phrase("4w3d2h1m"),
            Ok(Duration::from_secs(44_761 * 60))
        );
        assert_eq!(time_phrase("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(time_phrase("1h30m"), Ok(Duration::from_secs(5_400)));
        for bad in ["", "5", "d", "3x", "0m", "99999999999999999999w"] {
            assert!(time_phrase(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn errors_name_the_line_and_the_reason() {
        let ok = "0 * * * * a\n";
        let cases = [
            ("0 * * * a", "expected 5 time fields"),
            ("61 * * * * a", "minute"),
            ("0 * * * 8 a", "day of week"),
            ("0 * * * * 9lives", "task identifier"),
            ("0 * * * * a ?fill=2x", "unknown unit"),
            ("0 * * * * a ?fill", "needs a value"),
            ("0 * * * * a ?max=0", "max"),
            ("0 * * * * a ?priority=high", "priority"),
            ("0 * * * * a ?queue=a%20b", "queue"),
            ("0 * * * * a ?id=1st", "id"),
            ("0 * * * * a ?every=1d", "unknown option"),
            ("0 * * * * a ?max=1&max=2", "twice"),
            ("0 * * * * a [1]", "JSON object"),
            ("0 * * * * a {\"x\":", "not valid JSON"),
            ("0 * * * * a {\"x\": 1} trailing", "not valid JSON"),
            (
                "0 * * * * a {\"x\": \"a\\u0000b\"}",
                "NUL character (\\u0000) at $.x",
            ),
            ("0 0 30 2 * a", "never fires"),
            ("CRON_TZ= 0 * * * * a", "time zone \"\""),
            ("CRON_TZ=Europe/Berlin;rm 0 * * * * a", "IANA name"),
            ("CRON_TZ=Europe/Berlin 0 * * * a", "expected 5 time fields"),
            (
                "0 * * * * a ?id=b {} \n0 * * * * b",
                "already used on line 3",
            ),
        ];
        for (line, expected) in cases {
            let (at, reason) = error(&format!("# header\n{ok}{line}"));
            assert!(at >= 3, "{line:?}: line {at}");
            assert!(reason.contains(expected), "{line:?}: {reason}");
        }
        let err = Crontab::parse("\n\n0 * * * * a ?nope=1").unwrap_err();
        assert_eq!(
            err.to_string(),
            "crontab line 3: unknown option \"nope\" (expected id, fill, max, queue or priority)"
        );
    }
}
