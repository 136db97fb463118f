//! Durations as people write them in config files: `"30s"`, `"500ms"`,
//! `"1h 30m"`, `"7d"`. [`parse`] reads one, [`format`](fn@format) writes one, and the
//! module doubles as a serde `with` module, so an options struct's
//! `Duration` fields load from a config file written that way:
//!
//! ```
//! use std::time::Duration;
//!
//! #[derive(serde::Deserialize)]
//! struct Config {
//!     #[serde(with = "workerutil::duration")]
//!     interval: Duration,
//!     #[serde(default, with = "workerutil::duration::option")]
//!     timeout: Option<Duration>,
//! }
//!
//! let c: Config = serde_json::from_str(r#"{ "interval": "1m 30s" }"#).unwrap();
//! assert_eq!(c.interval, Duration::from_secs(90));
//! assert_eq!(c.timeout, None);
//! assert_eq!(workerutil::duration::format(c.interval), "1m 30s");
//! ```
//!
//! The grammar is humantime's common subset: one or more terms, each a
//! whole number and a unit, optionally separated by spaces (`"1h30m"`,
//! `"1h 30m"`, `"30 s"`); the terms add up. The units:
//!
//! | unit         | also written                                  |
//! |--------------|-----------------------------------------------|
//! | nanoseconds  | `ns`, `nsec`, `nanosecond(s)`                 |
//! | microseconds | `us`, `µs`, `usec`, `microsecond(s)`          |
//! | milliseconds | `ms`, `msec`, `millisecond(s)`                |
//! | seconds      | `s`, `sec`, `secs`, `second(s)`               |
//! | minutes      | `m`, `min`, `mins`, `minute(s)`               |
//! | hours        | `h`, `hr`, `hrs`, `hour(s)`                   |
//! | days         | `d`, `day(s)` (24 hours)                      |
//! | weeks        | `w`, `week(s)` (7 days)                       |
//!
//! Units are case-sensitive. Not accepted: a number without a unit (`"30"`:
//! seconds or milliseconds?), fractions (`"1.5h"`: write `"1h 30m"`), signs,
//! months and years (their length varies). [`format`](fn@format) writes the shortest
//! exact form in `d`, `h`, `m`, `s`, `ms`, `us` and `ns` (`"0s"` for zero), so
//! `parse(&format(d)) == Ok(d)` for every `Duration`.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::ser::Serializer;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// The units [`format`](fn@format) writes, largest first, in nanoseconds.
const FORMAT_UNITS: [(&str, u128); 7] = [
    ("d", 86_400 * NANOS_PER_SEC),
    ("h", 3_600 * NANOS_PER_SEC),
    ("m", 60 * NANOS_PER_SEC),
    ("s", NANOS_PER_SEC),
    ("ms", 1_000_000),
    ("us", 1_000),
    ("ns", 1),
];

/// The hint every unit problem ends with.
const UNITS_HINT: &str = "use ms, s, m, h or d";

/// A text that is not a duration: says which text, and why.
///
/// ```
/// let err = workerutil::duration::parse("30 parsecs").unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     r#""30 parsecs" is not a duration: unknown unit "parsecs" (use ms, s, m, h or d)"#
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseDurationError {
    input: String,
    problem: Problem,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Problem {
    Empty,
    /// Something other than a digit where a term must start (the rest of the text).
    NumberExpected(String),
    /// A number without a unit.
    NoUnit(u64),
    UnknownUnit(String),
    /// `1.5h`.
    Fraction,
    /// A character that is neither a digit, a unit nor a space.
    Unexpected(char),
    /// More than `Duration::MAX`.
    TooLong,
}

impl fmt::Display for ParseDurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not a duration: ", self.input)?;
        match &self.problem {
            Problem::Empty => write!(f, "it is empty (write e.g. 30s or 1h 30m)"),
            Problem::NumberExpected(rest) => write!(f, "expected a number at {rest:?}"),
            Problem::NoUnit(n) => write!(f, "{n} has no unit ({UNITS_HINT}, e.g. {n}s)"),
            Problem::UnknownUnit(unit) => write!(f, "unknown unit {unit:?} ({UNITS_HINT})"),
            Problem::Fraction => write!(
                f,
                "fractions are not accepted; use a smaller unit (1h 30m or 90m, not 1.5h)"
            ),
            Problem::Unexpected(c) => write!(f, "unexpected {c:?}"),
            Problem::TooLong => write!(f, "it is longer than the longest duration"),
        }
    }
}

impl std::error::Error for ParseDurationError {}

/// Nanoseconds per `unit`, if it is one.
fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" | "nsec" | "nanosecond" | "nanoseconds" => 1,
        "us" | "µs" | "usec" | "microsecond" | "microseconds" => 1_000,
        "ms" | "msec" | "millisecond" | "milliseconds" => 1_000_000,
        "s" | "sec" | "secs" | "second" | "seconds" => NANOS_PER_SEC,
        "m" | "min" | "mins" | "minute" | "minutes" => 60 * NANOS_PER_SEC,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600 * NANOS_PER_SEC,
        "d" | "day" | "days" => 86_400 * NANOS_PER_SEC,
        "w" | "week" | "weeks" => 7 * 86_400 * NANOS_PER_SEC,
        _ => return None,
    })
}

/// Reads a duration such as `"30s"`, `"500ms"` or `"1h 30m"` (see the
/// [module](self) for the grammar).
///
/// ```
/// use std::time::Duration;
/// use workerutil::duration::parse;
/// assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
/// assert_eq!(parse("1h 30m"), parse("90 min"));
/// assert!(parse("30").is_err()); // seconds? milliseconds? say which
/// ```
pub fn parse(text: &str) -> Result<Duration, ParseDurationError> {
    let fail = |problem| ParseDurationError {
        input: text.to_owned(),
        problem,
    };
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(fail(Problem::Empty));
    }
    let max = u128::from(Duration::MAX.as_secs()) * NANOS_PER_SEC
        + u128::from(Duration::MAX.subsec_nanos());
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(fail(Problem::NumberExpected(rest.to_owned())));
        }
        let (number, after) = rest.split_at(digits);
        // Too many digits for a u64 is too long for a Duration in any unit.
        let n: u64 = number.parse().map_err(|_| fail(Problem::TooLong))?;
        if after.starts_with(['.', ',']) && after[1..].starts_with(|c: char| c.is_ascii_digit()) {
            return Err(fail(Problem::Fraction));
        }
        let after = after.trim_start();
        let unit_len = after.len()
            - after
                .trim_start_matches(|c: char| c.is_alphabetic() || c == 'µ')
                .len();
        let (unit, after) = after.split_at(unit_len);
        if unit.is_empty() {
            return Err(fail(match after.chars().next() {
                None => Problem::NoUnit(n),
                Some(c) => Problem::Unexpected(c),
            }));
        }
        let nanos = unit_nanos(unit).ok_or_else(|| fail(Problem::UnknownUnit(unit.to_owned())))?;
        total = total
            .checked_add(u128::from(n) * nanos)
            .filter(|t| *t <= max)
            .ok_or_else(|| fail(Problem::TooLong))?;
        rest = after.trim_start();
    }
    let secs = u64::try_from(total / NANOS_PER_SEC).map_err(|_| fail(Problem::TooLong))?;
    let nanos = u32::try_from(total % NANOS_PER_SEC).map_err(|_| fail(Problem::TooLong))?;
    Ok(Duration::new(secs, nanos))
}

/// Writes `duration` as [`parse`] reads it, exactly, largest unit first:
/// `"1h 30m"`, `"1s 500ms"`, `"7d"`, `"0s"`.
///
/// ```
/// use std::time::Duration;
/// use workerutil::duration::format;
/// assert_eq!(format(Duration::from_millis(90_500)), "1m 30s 500ms");
/// assert_eq!(format(Duration::ZERO), "0s");
/// ```
pub fn format(duration: Duration) -> String {
    let mut left = duration.as_nanos();
    if left == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    for (unit, nanos) in FORMAT_UNITS {
        let n = left / nanos;
        if n > 0 {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(&n.to_string());
            out.push_str(unit);
            left %= nanos;
        }
    }
    out
}

/// Serde: writes a `Duration` as [`format`](fn@format) does (`#[serde(with = "workerutil::duration")]`).
pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format(*duration))
}

/// Serde: reads a `Duration` as [`parse`] does (`#[serde(with = "workerutil::duration")]`);
/// the error says which text and why.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    deserializer.deserialize_str(DurationVisitor)
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#"a duration such as "30s", "500ms" or "1h 30m""#)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
        parse(text).map_err(E::custom)
    }
}

/// Serde for `Option<Duration>` (`#[serde(default, with =
/// "workerutil::duration::option")]`): `None` is written `"off"`, and read
/// from `"off"` or a null, so a format without null (TOML) can turn a
/// setting off and a written config reads back the same.
///
/// ```
/// # use std::time::Duration;
/// #[derive(serde::Deserialize)]
/// struct Config {
///     #[serde(default, with = "workerutil::duration::option")]
///     limit: Option<Duration>,
/// }
/// let off: Config = serde_json::from_str(r#"{ "limit": "off" }"#).unwrap();
/// assert_eq!(off.limit, None);
/// let on: Config = serde_json::from_str(r#"{ "limit": "15s" }"#).unwrap();
/// assert_eq!(on.limit, Some(Duration::from_secs(15)));
/// ```
pub mod option {
    use std::fmt;
    use std::time::Duration;

    use serde::de::{self, Deserializer, Visitor};
    use serde::ser::Serializer;

    /// What `None` is written as, and read from.
    pub const OFF: &str = "off";

    /// Serde: writes `Some` as [`format`](super::format) does, `None` as `"off"`.
    pub fn serialize<S: Serializer>(
        duration: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match duration {
            Some(d) => super::serialize(d, serializer),
            None => serializer.serialize_str(OFF),
        }
    }

    /// Serde: reads `"off"` or a null as `None`, anything else as
    /// [`parse`](super::parse) does.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        deserializer.deserialize_option(OptionVisitor)
    }

    struct OptionVisitor;

    impl<'de> Visitor<'de> for OptionVisitor {
        type Value = Option<Duration>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(r#"a duration such as "30s" or "1h 30m", or "off""#)
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, inner: D) -> Result<Self::Value, D::Error> {
            inner.deserialize_str(OptionVisitor)
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
            if text.trim() == OFF {
                return Ok(None);
            }
            super::parse(text).map(Some).map_err(E::custom)
        }
    }
}

#[cfg(test)]
#[path = "duration_tests.rs"]
mod tests;
