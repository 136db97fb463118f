//! Durations as people write them in config files: `"30s"`, `"500ms"`,
//! `"1h 30m"`, `"7d"`, read and written by the `humantime` crate. [`parse`]
//! reads one, [`format`](fn@format) writes one, and the module doubles as a
//! serde `with` module, so an options struct's `Duration` fields load from a
//! config file written that way:
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
//! The grammar is humantime's: one or more terms, each a whole number and a
//! unit (`ns`, `us`, `ms`, `s`/`sec`, `m`/`min`, `h`/`hr`, `d`, `w`, and their
//! long forms), optionally separated by spaces; the terms add up. A number
//! without a unit is refused (`"30"`: seconds or milliseconds?). An optional
//! duration is also `"off"` ([`option`]), since TOML has no null.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::ser::Serializer;

/// The longest time an option may name, 100 years: options' times are
/// added to clock readings and multiplied (a deadline, three heartbeat
/// intervals), and nobody means more.
pub const MAX: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A text that is not a duration: says which text, and why.
///
/// ```
/// let err = workerutil::duration::parse("30 parsecs").unwrap_err();
/// assert!(err.to_string().starts_with(r#""30 parsecs" is not a duration: "#), "{err}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseDurationError {
    input: String,
    reason: String,
}

impl fmt::Display for ParseDurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not a duration: {}", self.input, self.reason)
    }
}

impl std::error::Error for ParseDurationError {}

/// Reads a duration such as `"30s"` or `"1h 30m"`.
pub fn parse(text: &str) -> Result<Duration, ParseDurationError> {
    humantime::parse_duration(text.trim()).map_err(|err| ParseDurationError {
        input: text.to_owned(),
        reason: match err {
            humantime::DurationError::UnknownUnit { unit, .. } if unit.is_empty() => {
                "a number needs a unit (ms, s, m, h or d, e.g. 30s)".to_owned()
            }
            other => other.to_string(),
        },
    })
}

/// Writes `duration` as [`parse`] reads it (`"1h 30m"`, `"0s"` for zero).
pub fn format(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// Serde: writes a duration as [`format`](fn@format) does.
pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format(*duration))
}

/// Serde: reads a duration as [`parse`] does; a bare number is refused.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    deserializer.deserialize_str(DurationVisitor)
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#"a duration such as "30s" or "1h 30m""#)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
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
