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
fn each_unit_and_its_spellings_read() {
    let cases: [(&[&str], Duration); 8] = [
        (
            &["ns", "nsec", "nanosecond", "nanoseconds"],
            Duration::from_nanos(7),
        ),
        (
            &["us", "µs", "usec", "microsecond", "microseconds"],
            Duration::from_micros(7),
        ),
        (
            &["ms", "msec", "millisecond", "milliseconds"],
            Duration::from_millis(7),
        ),
        (&["s", "sec", "secs", "second", "seconds"], secs(7)),
        (&["m", "min", "mins", "minute", "minutes"], secs(7 * MIN)),
        (&["h", "hr", "hrs", "hour", "hours"], secs(7 * HOUR)),
        (&["d", "day", "days"], secs(7 * DAY)),
        (&["w", "week", "weeks"], secs(49 * DAY)),
    ];
    for (units, expected) in cases {
        for unit in units {
            assert_eq!(parse(&format!("7{unit}")), Ok(expected), "7{unit}");
            assert_eq!(parse(&format!("7 {unit}")), Ok(expected), "7 {unit}");
        }
    }
}

#[test]
fn terms_add_up_with_or_without_spaces() {
    let ninety = Ok(secs(90 * MIN));
    assert_eq!(parse("1h30m"), ninety);
    assert_eq!(parse("1h 30m"), ninety);
    assert_eq!(parse("  1 hour 30 minutes  "), ninety);
    assert_eq!(parse("30m 1h"), ninety);
    assert_eq!(parse("90min"), ninety);
    assert_eq!(parse("1m 1m"), Ok(secs(2 * MIN)));
    assert_eq!(
        parse("1d2h3m4s5ms6us7ns"),
        Ok(Duration::new(DAY + 2 * HOUR + 3 * MIN + 4, 5_006_007))
    );
    assert_eq!(parse("0s"), Ok(Duration::ZERO));
    assert_eq!(parse("007s"), Ok(secs(7)));
}

#[test]
fn format_writes_the_shortest_exact_form() {
    let cases = [
        (Duration::ZERO, "0s"),
        (Duration::from_nanos(1), "1ns"),
        (Duration::from_millis(500), "500ms"),
        (Duration::from_millis(1_500), "1s 500ms"),
        (secs(30), "30s"),
        (secs(90 * MIN), "1h 30m"),
        (secs(7 * DAY), "7d"),
        (secs(DAY + 1), "1d 1s"),
        (
            Duration::new(DAY + 2 * HOUR + 3 * MIN + 4, 5_006_007),
            "1d 2h 3m 4s 5ms 6us 7ns",
        ),
    ];
    for (duration, text) in cases {
        assert_eq!(format(duration), text);
    }
}

#[test]
fn every_formatted_duration_reads_back() {
    let mut samples = vec![
        Duration::MAX,
        Duration::new(u64::MAX, 0),
        secs(u64::MAX / DAY * DAY),
    ];
    // A spread of magnitudes and sub-second parts.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for shift in 0..64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let nanos = u32::try_from(x % 1_000_000_000).unwrap();
        samples.push(Duration::new(x >> shift, nanos));
        samples.push(Duration::new(x >> shift, 0));
        samples.push(Duration::from_nanos(x >> shift));
    }
    for d in samples {
        assert_eq!(parse(&format(d)), Ok(d), "{}", format(d));
    }
}

#[test]
fn garbage_is_refused_naming_the_text_and_the_problem() {
    let cases = [
        (
            "30 parsecs",
            r#""30 parsecs" is not a duration: unknown unit "parsecs" (use ms, s, m, h or d)"#,
        ),
        (
            "30",
            r#""30" is not a duration: 30 has no unit (use ms, s, m, h or d, e.g. 30s)"#,
        ),
        (
            "1h 30",
            r#""1h 30" is not a duration: 30 has no unit (use ms, s, m, h or d, e.g. 30s)"#,
        ),
        (
            "",
            r#""" is not a duration: it is empty (write e.g. 30s or 1h 30m)"#,
        ),
        (
            "   ",
            r#""   " is not a duration: it is empty (write e.g. 30s or 1h 30m)"#,
        ),
        ("h", r#""h" is not a duration: expected a number at "h""#),
        (
            "-5s",
            r#""-5s" is not a duration: expected a number at "-5s""#,
        ),
        (
            "1h and 5m",
            r#""1h and 5m" is not a duration: expected a number at "and 5m""#,
        ),
        (
            "1.5h",
            r#""1.5h" is not a duration: fractions are not accepted; use a smaller unit (1h 30m or 90m, not 1.5h)"#,
        ),
        (
            "1h,30m",
            r#""1h,30m" is not a duration: expected a number at ",30m""#,
        ),
        ("5!", r#""5!" is not a duration: unexpected '!'"#),
        (
            "5 mo",
            r#""5 mo" is not a duration: unknown unit "mo" (use ms, s, m, h or d)"#,
        ),
        (
            "1S",
            r#""1S" is not a duration: unknown unit "S" (use ms, s, m, h or d)"#,
        ),
    ];
    for (text, message) in cases {
        assert_eq!(parse(text).unwrap_err().to_string(), message, "{text:?}");
    }
}

#[test]
fn more_than_the_longest_duration_is_refused() {
    let too_long = "is longer than the longest duration";
    for text in [
        "18446744073709551616s",
        "99999999999999999999999ns",
        "18446744073709551615s 1s",
        "18446744073709551615w",
    ] {
        let message = parse(text).unwrap_err().to_string();
        assert!(message.contains(too_long), "{text}: {message}");
    }
    assert_eq!(
        parse("18446744073709551615s 999999999ns"),
        Ok(Duration::MAX)
    );
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
            .starts_with(r#""30 parsecs" is not a duration: unknown unit "parsecs""#),
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
