//! The duration grammar: what it reads, what it writes, and what it refuses.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{format, parse};

const MIN: u64 = 60;
const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn the_common_forms_read() {
    let ninety = Ok(secs(90 * MIN));
    assert_eq!(parse("1h30m"), ninety);
    assert_eq!(parse("1h 30m"), ninety);
    assert_eq!(parse("  1 hour 30 minutes  "), ninety);
    assert_eq!(parse("90min"), ninety);
    assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse("7d"), Ok(secs(7 * DAY)));
    assert_eq!(parse("0s"), Ok(Duration::ZERO));
}

#[test]
fn every_formatted_duration_reads_back() {
    for d in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_millis(1500),
        secs(90 * MIN),
        secs(7 * DAY + 1),
        Duration::from_secs(u64::from(u32::MAX)),
    ] {
        assert_eq!(parse(&format(d)), Ok(d), "{}", format(d));
    }
    assert_eq!(format(secs(90 * MIN)), "1h 30m");
}

#[test]
fn garbage_is_refused_naming_the_text_and_why() {
    for (text, why) in [
        ("30", "a number needs a unit (ms, s, m, h or d, e.g. 30s)"),
        ("30 parsecs", "parsecs"),
        ("", "empty"),
        ("soon", "soon"),
    ] {
        let message = parse(text).unwrap_err().to_string();
        assert!(
            message.starts_with(&format!("{text:?} is not a duration: ")),
            "{message}"
        );
        assert!(message.contains(why), "{text:?}: {message}");
    }
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Config {
    #[serde(with = "super")]
    every: Duration,
    #[serde(default, with = "super::option")]
    limit: Option<Duration>,
}

#[test]
fn serde_reads_and_writes_the_text_form() {
    let c: Config = serde_json::from_str(r#"{"every": "1h 30m", "limit": "15s"}"#).unwrap();
    assert_eq!(
        c,
        Config {
            every: secs(90 * MIN),
            limit: Some(secs(15)),
        }
    );
    let text = serde_json::to_string(&c).unwrap();
    assert_eq!(text, r#"{"every":"1h 30m","limit":"15s"}"#);
    assert_eq!(serde_json::from_str::<Config>(&text).unwrap(), c);
}

#[test]
fn an_optional_duration_is_off_when_missing_null_or_off() {
    for text in [
        r#"{"every": "1s"}"#,
        r#"{"every": "1s", "limit": null}"#,
        r#"{"every": "1s", "limit": "off"}"#,
    ] {
        let c: Config = serde_json::from_str(text).unwrap();
        assert_eq!(c.limit, None, "{text}");
    }
    let off = Config {
        every: secs(1),
        limit: None,
    };
    let text = serde_json::to_string(&off).unwrap();
    assert_eq!(text, r#"{"every":"1s","limit":"off"}"#);
    assert_eq!(serde_json::from_str::<Config>(&text).unwrap(), off);
}

#[test]
fn serde_refuses_garbage_and_numbers_naming_them() {
    let err = serde_json::from_str::<Config>(r#"{"every": "30 parsecs"}"#).unwrap_err();
    assert!(
        err.to_string()
            .starts_with(r#""30 parsecs" is not a duration: "#),
        "{err}"
    );
    let err = serde_json::from_str::<Config>(r#"{"every": 30}"#).unwrap_err();
    assert!(
        err.to_string()
            .starts_with(r#"invalid type: integer `30`, expected a duration such as "30s""#),
        "{err}"
    );
    let err = serde_json::from_str::<Config>(r#"{"every": "1s", "limit": "soon"}"#).unwrap_err();
    assert!(
        err.to_string().contains(r#""soon" is not a duration"#),
        "{err}"
    );
    let err = serde_json::from_str::<Config>(r#"{"every": "1s", "limit": 5}"#).unwrap_err();
    assert!(err.to_string().contains(r#"or "off""#), "{err}");
}
