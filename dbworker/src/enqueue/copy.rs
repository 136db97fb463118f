//! The COPY path of `Enqueuer::copy_many`: rows written as COPY text.

use std::time::Duration;

use sea_query::Value;

use crate::error::{Error, Result};
use crate::sql::RunAt;

pub(super) fn copy_refused(reason: &str) -> Error {
    Error::InvalidOption {
        field: "enqueue_copy",
        reason: reason.to_owned(),
    }
}

/// Escapes text for COPY's text format: backslash, tab, newline, carriage return.
pub(super) fn copy_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

/// A value in COPY's text format (`\N` for NULL).
pub(super) fn copy_text(column: &str, value: &Value) -> Result<String> {
    fn or_null<T>(v: &Option<T>, f: impl FnOnce(&T) -> String) -> String {
        v.as_ref().map_or_else(|| "\\N".to_owned(), f)
    }
    Ok(match value {
        Value::Bool(v) => or_null(v, |b| if *b { "t" } else { "f" }.to_owned()),
        Value::TinyInt(v) => or_null(v, ToString::to_string),
        Value::SmallInt(v) => or_null(v, ToString::to_string),
        Value::Int(v) => or_null(v, ToString::to_string),
        Value::BigInt(v) => or_null(v, ToString::to_string),
        Value::TinyUnsigned(v) => or_null(v, ToString::to_string),
        Value::SmallUnsigned(v) => or_null(v, ToString::to_string),
        Value::Unsigned(v) => or_null(v, ToString::to_string),
        Value::BigUnsigned(v) => or_null(v, ToString::to_string),
        Value::Float(v) => or_null(v, ToString::to_string),
        Value::Double(v) => or_null(v, ToString::to_string),
        Value::String(v) => or_null(v, |s| copy_escape(s)),
        Value::Char(v) => or_null(v, |c| copy_escape(&c.to_string())),
        Value::Json(v) => or_null(v, |j| copy_escape(&j.to_string())),
        _ => {
            return Err(copy_refused(&format!(
                "column {column:?}: COPY takes booleans, numbers, text and JSON; use enqueue_many for other values"
            )));
        }
    })
}

/// A text array literal (`{"a","b\"c"}`): every element double-quoted, with
/// `"` and `\` backslash-escaped, so commas, braces and `NULL` stay text.
pub(super) fn array_text(items: &[String]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|s| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("{{{}}}", quoted.join(","))
}

/// A run-at as microseconds since the epoch, delays counted from `now` (the
/// database clock).
pub(super) fn run_at_micros(run_at: RunAt, now: i64) -> i64 {
    let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
    match run_at {
        RunAt::After(delay) => now.saturating_add(micros(delay)),
        RunAt::At(at) => match at.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => micros(d),
            Err(before) => -micros(before.duration()),
        },
    }
}

/// `YYYY-MM-DD HH:MM:SS.ffffff+00` for microseconds since the epoch (UTC).
/// An instant beyond chrono's range (some 262,000 years away) is written as
/// its last representable one, still far beyond any real run-at.
pub(super) fn timestamp_text(micros: i64) -> String {
    use chrono::{DateTime, Datelike as _, Timelike as _, Utc};
    let at = DateTime::from_timestamp_micros(micros).unwrap_or(if micros < 0 {
        DateTime::<Utc>::MIN_UTC
    } else {
        DateTime::<Utc>::MAX_UTC
    });
    // Fields rather than `%Y`, which signs years past 9999 (`+10000`).
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}+00",
        at.year(),
        at.month(),
        at.day(),
        at.hour(),
        at.minute(),
        at.second(),
        at.timestamp_subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_written_in_utc_for_copy() {
        assert_eq!(timestamp_text(0), "1970-01-01 00:00:00.000000+00");
        assert_eq!(
            timestamp_text(951_827_696_789_012),
            "2000-02-29 12:34:56.789012+00"
        );
        assert_eq!(timestamp_text(-1), "1969-12-31 23:59:59.999999+00");
        assert_eq!(
            timestamp_text(253_402_300_800_000_000),
            "10000-01-01 00:00:00.000000+00"
        );
    }

    #[test]
    fn copy_text_escapes_what_copy_would_read_as_syntax() {
        let v = Value::String(Some("a\tb\nc\\d".into()));
        assert_eq!(copy_text("c", &v).unwrap(), "a\\tb\\nc\\\\d");
        assert_eq!(copy_text("c", &Value::Int(None)).unwrap(), "\\N");
        assert_eq!(copy_text("c", &Value::Bool(Some(true))).unwrap(), "t");
    }

    #[test]
    fn arrays_quote_every_element() {
        let items = ["a,b".to_owned(), "NULL".to_owned(), "q\"\\".to_owned()];
        assert_eq!(array_text(&items), r#"{"a,b","NULL","q\"\\"}"#);
        assert_eq!(array_text(&[]), "{}");
    }
}
