//! Options loaded from an application's config file: the table, the store,
//! the resetter and the worker read from one document with humantime
//! durations, fields left out keep their defaults, and what is wrong is
//! refused by name.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;
use workerutil::{RetryPolicy, WorkerOptions};

use dbworker::control::PausesOptions;
use dbworker::cron::SchedulerOptions;
use dbworker::{
    ClaimOptions, Error, ForbiddenFlags, Handling, JobTableOptions, ResetterOptions, StallOptions,
    StoreOptions,
};
use dbworker::{
    DEFAULT_MAX_NUM_RETRIES, DEFAULT_MAX_RESULT_BYTES, DEFAULT_RESET_FAILURE_MESSAGE, Listen,
};

#[derive(sqlx::FromRow)]
#[allow(dead_code)]
struct Job {
    id: i64,
}

/// An application's config file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    table: JobTableOptions,
    store: StoreOptions,
    #[serde(default)]
    resetter: ResetterOptions,
    worker: WorkerOptions,
    #[serde(default)]
    scheduler: SchedulerOptions,
    #[serde(default)]
    pauses: PausesOptions,
}

const CONFIG: &str = r#"{
    "table": {
        "table_name": "app.email_jobs j",
        "queue_column": "queue",
        "flags_column": "flags",
        "alternate_column_names": { "state": "status" },
        "order_by": "j.id",
        "connect_timeout": "10s"
    },
    "store": {
        "name": "emails",
        "handling": "heartbeat",
        "max_num_retries": 5,
        "retry": { "retry_after": "30s", "max_delay": "2h" },
        "stall": { "stalled_max_age": "1m", "max_num_resets": 5 },
        "claim": {
            "claim_cursor": "off",
            "forbidden_flags": ["gpu", "slow-api"]
        },
        "listen": "table_channel"
    },
    "resetter": { "name": "emails_resetter", "interval": "15s", "stall": { "stalled_max_age": "1m" } },
    "worker": { "name": "emails", "num_handlers": 8, "heartbeat_interval": "5s", "max_interval": "30s" },
    "scheduler": { "interval": "500ms" },
    "pauses": { "notify_channel": "email_wakeup" }
}"#;

#[test]
fn a_config_file_sets_only_what_it_names() {
    let c: Config = serde_json::from_str(CONFIG).unwrap();

    let t = &c.table;
    assert_eq!(t.table_name, "app.email_jobs j");
    assert_eq!(t.queue_column.as_deref(), Some("queue"));
    assert_eq!(
        t.alternate_column_names,
        HashMap::from([("state".to_owned(), "status".to_owned())])
    );
    assert_eq!(t.connect_timeout, Duration::from_secs(10));
    assert_eq!(t.error_history_limit, dbworker::DEFAULT_ERROR_HISTORY_LIMIT);
    assert!(!t.detect && t.kind_column.is_none());
    assert_eq!(t.order_by.as_deref(), Some("j.id"));
    assert!(t.column_expressions.is_empty());

    let s = &c.store;
    assert_eq!(s.name, "emails");
    assert_eq!(s.handling, Handling::Heartbeat);
    assert_eq!(s.max_num_retries, 5);
    assert_eq!(
        s.retry,
        RetryPolicy {
            retry_after: Duration::from_secs(30),
            max_delay: Duration::from_secs(7200),
            ..RetryPolicy::default()
        }
    );
    assert_eq!(s.stall.stalled_max_age, Duration::from_secs(60));
    assert_eq!(s.stall.max_num_resets, 5);
    assert_eq!(s.stall.reset_failure_message, DEFAULT_RESET_FAILURE_MESSAGE);
    assert_eq!(s.claim.claim_cursor, None);
    assert_eq!(
        s.claim.candidate_window,
        ClaimOptions::default().candidate_window
    );
    assert!(
        matches!(&s.claim.forbidden_flags, Some(ForbiddenFlags::Fixed(f)) if f == &["gpu", "slow-api"])
    );
    assert_eq!(s.listen, Listen::TableChannel);
    assert_eq!(s.max_result_bytes, DEFAULT_MAX_RESULT_BYTES);

    let r = &c.resetter;
    assert_eq!(r.name, "emails_resetter");
    assert_eq!(r.interval, Duration::from_secs(15));
    assert_eq!(r.stall.stalled_max_age, Duration::from_secs(60));
    assert_eq!(
        r.stall.max_num_resets,
        StallOptions::default().max_num_resets
    );
    assert_eq!(r.dead_after, ResetterOptions::default().dead_after);

    let w = &c.worker;
    assert_eq!((w.name.as_str(), w.num_handlers), ("emails", 8));
    assert_eq!(w.heartbeat_interval, Duration::from_secs(5));
    assert_eq!(w.max_interval, Some(Duration::from_secs(30)));
    assert_eq!(w.interval, WorkerOptions::new("w").interval);

    assert_eq!(c.scheduler.interval, Duration::from_millis(500));
    assert_eq!(c.scheduler.cron_table, dbworker::cron::DEFAULT_CRON_TABLE);
    assert_eq!(c.pauses.notify_channel.as_deref(), Some("email_wakeup"));

    // What the services check where they take the options.
    c.table.validate().unwrap();
    c.store.validate().unwrap();
    c.resetter.validate().unwrap();
    c.worker.validate().unwrap();
    c.scheduler.validate().unwrap();
    c.pauses.validate().unwrap();
}

#[test]
fn the_smallest_config_is_the_required_names() {
    let c: Config = serde_json::from_str(
        r#"{ "table": { "table_name": "jobs" }, "store": { "name": "s" }, "worker": { "name": "w" } }"#,
    )
    .unwrap();
    c.table.validate().unwrap();
    c.store.validate().unwrap();
    assert_eq!(c.store.max_num_retries, DEFAULT_MAX_NUM_RETRIES);
    assert_eq!(c.store.handling, Handling::Transactional);
    assert_eq!(c.store.listen, Listen::Off);
    assert_eq!(c.resetter.name, "resetter");
    c.worker.validate().unwrap();
}

#[test]
fn written_options_read_back_the_same() {
    let mut o = StoreOptions::new("emails");
    o.listen = Listen::Channel("wake".into());
    o.claim.forbidden_flags = Some(ForbiddenFlags::fixed(["gpu"]));
    let written = serde_json::to_value(&o).unwrap();
    assert_eq!(written["listen"], serde_json::json!({ "channel": "wake" }));
    assert_eq!(written["stall"]["stalled_max_age"], "30s");
    assert_eq!(written["claim"]["claim_cursor"], "1s");
    assert!(written.get("scan").is_none());
    let read: StoreOptions = serde_json::from_value(written.clone()).unwrap();
    assert_eq!(serde_json::to_value(&read).unwrap(), written);

    // A callback has no written form: said, not dropped.
    o.claim.forbidden_flags = Some(ForbiddenFlags::callback(|| async { Vec::new() }));
    let err = serde_json::to_value(&o).unwrap_err().to_string();
    assert!(err.contains("forbidden_flags holds a callback"), "{err}");
}

/// The error of reading `CONFIG` with `from` replaced by `to`, and where.
fn refused(from: &str, to: &str) -> (String, String) {
    assert!(CONFIG.contains(from), "{from}");
    let text = CONFIG.replacen(from, to, 1);
    let mut de = serde_json::Deserializer::from_str(&text);
    match serde_path_to_error::deserialize::<_, Config>(&mut de) {
        Ok(_) => panic!("{to} was accepted"),
        Err(err) => (err.path().to_string(), err.inner().to_string()),
    }
}

#[test]
fn an_unknown_field_or_a_bad_value_is_refused_by_name() {
    let (path, e) = refused(r#""claim_cursor": "off""#, r#""cursor": "off""#);
    assert_eq!(path, "store.claim.cursor");
    assert!(
        e.starts_with("unknown field `cursor`, expected one of"),
        "{e}"
    );

    let (path, e) = refused(r#""interval": "15s""#, r#""interval": "15 parsecs""#);
    assert_eq!(path, "resetter.interval");
    assert!(
        e.starts_with(r#""15 parsecs" is not a duration: "#) && e.contains("parsecs"),
        "{e}"
    );

    let (path, e) = refused(
        r#""stalled_max_age": "1m", "max"#,
        r#""stalled_max_age": 60, "max"#,
    );
    assert_eq!(path, "store.stall.stalled_max_age");
    assert!(e.contains(r#"expected a duration such as "30s""#), "{e}");

    let (path, e) = refused(r#""handling": "heartbeat""#, r#""handling": "Heartbeat""#);
    assert_eq!(path, "store.handling");
    assert!(e.starts_with("unknown variant `Heartbeat`"), "{e}");

    let (_, e) = refused(r#""table_name": "app.email_jobs j","#, "");
    assert!(e.starts_with("missing field `table_name`"), "{e}");
    let (_, e) = refused(r#""name": "emails","#, "");
    assert!(e.starts_with("missing field `name`"), "{e}");
    let (path, e) = refused(r#""scheduler": {"#, r#""scheduler": { "cron": "x","#);
    assert_eq!(path, "scheduler.cron");
    assert!(e.starts_with("unknown field `cron`"), "{e}");

    // A value of the right form but out of range is refused by validate,
    // where the options are used.
    let text = CONFIG.replacen(
        r#""stalled_max_age": "1m", "max"#,
        r#""stalled_max_age": "1ms", "max"#,
        1,
    );
    let c: Config = serde_json::from_str(&text).unwrap();
    match c.store.validate() {
        Err(Error::InvalidOption { field, .. }) => assert_eq!(field, "stalled_max_age"),
        other => panic!("expected an error, got {other:?}"),
    }
}

/// Every time an option takes, far past `workerutil::duration::MAX` (100
/// years): refused by `validate`, naming the field. Such times were accepted
/// and then overflowed where they are added to a clock or to each other (a
/// panic, or a statement the database refuses on every pass); `catch_up`
/// panicked inside `validate` itself.
#[test]
fn a_time_past_100_years_is_refused_by_name() {
    use dbworker::Aging;
    use dbworker::cluster::LeaderOptions;
    use dbworker::consumers::{ConsumerGroupOptions, DispatcherOptions, LogOptions};
    use dbworker::history::HistoryOptions;
    use dbworker::maintenance::PurgeOptions;
    use serde::de::DeserializeOwned;
    use std::panic::{AssertUnwindSafe, catch_unwind};

    /// Options read from `json`, where `HUGE` stands for the time.
    fn file<T: DeserializeOwned>(json: &str) -> T {
        let json = json.replace("HUGE", "18446744073709551615s");
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("{json}: {e}"))
    }
    fn with<T>(mut o: T, set: impl FnOnce(&mut T)) -> T {
        set(&mut o);
        o
    }
    let huge = Duration::from_secs(u64::MAX);
    let group = || {
        let mut o = ConsumerGroupOptions::new("g", "events");
        o.node_id = "n".into();
        o
    };
    let log = || LogOptions::new("l", "events", "n", vec!["c".into()]);
    type Case = (&'static str, Box<dyn Fn() -> Result<(), Error>>);
    let cases: Vec<Case> = vec![
        (
            "interval",
            Box::new(|| file::<HistoryOptions>(r#"{"interval": "HUGE"}"#).validate()),
        ),
        (
            "settle",
            Box::new(|| file::<HistoryOptions>(r#"{"settle": "HUGE"}"#).validate()),
        ),
        (
            "catch_up",
            Box::new(|| file::<HistoryOptions>(r#"{"catch_up": "HUGE"}"#).validate()),
        ),
        (
            "downsample_after",
            Box::new(|| file::<HistoryOptions>(r#"{"downsample_after": "HUGE"}"#).validate()),
        ),
        (
            "keep",
            Box::new(|| file::<HistoryOptions>(r#"{"keep": "HUGE"}"#).validate()),
        ),
        (
            "catch_up",
            Box::new(|| file::<PurgeOptions>(r#"{"history": {"catch_up": "HUGE"}}"#).validate()),
        ),
        (
            "max_age",
            Box::new(|| file::<PurgeOptions>(r#"{"max_age": {"failed": "HUGE"}}"#).validate()),
        ),
        (
            "interval",
            Box::new(|| file::<PurgeOptions>(r#"{"interval": "HUGE"}"#).validate()),
        ),
        (
            "detach_lock_timeout",
            Box::new(|| file::<PurgeOptions>(r#"{"detach_lock_timeout": "HUGE"}"#).validate()),
        ),
        (
            "interval",
            Box::new(|| file::<SchedulerOptions>(r#"{"interval": "HUGE"}"#).validate()),
        ),
        (
            "interval",
            Box::new(|| file::<ResetterOptions>(r#"{"interval": "HUGE"}"#).validate()),
        ),
        (
            "dead_after",
            Box::new(|| {
                file::<ResetterOptions>(r#"{"node_table": "nodes", "dead_after": "HUGE"}"#)
                    .validate()
            }),
        ),
        (
            "stalled_max_age",
            Box::new(|| {
                file::<ResetterOptions>(r#"{"stall": {"stalled_max_age": "HUGE"}}"#).validate()
            }),
        ),
        (
            "claim_cursor",
            Box::new(|| {
                file::<StoreOptions>(r#"{"name": "s", "claim": {"claim_cursor": "HUGE"}}"#)
                    .validate()
            }),
        ),
        (
            "connect_timeout",
            Box::new(|| {
                file::<JobTableOptions>(r#"{"table_name": "jobs", "connect_timeout": "HUGE"}"#)
                    .validate()
            }),
        ),
        (
            "aging",
            Box::new(|| file::<Aging>(r#"{"interval": "HUGE"}"#).validate()),
        ),
        (
            "lease",
            Box::new(move || {
                let mut o = LeaderOptions::new("scope", "n");
                o.lease = huge;
                o.validate()
            }),
        ),
        (
            "slice_pause",
            Box::new(move || with(log(), |o| o.slice_pause = huge).validate()),
        ),
        (
            "retry_after",
            Box::new(move || with(log(), |o| o.retry_after = huge).validate()),
        ),
        (
            "connect_timeout",
            Box::new(move || with(log(), |o| o.connect_timeout = huge).validate()),
        ),
        (
            "poll_interval",
            Box::new(move || {
                let mut o = DispatcherOptions::new("events");
                o.poll_interval = huge;
                o.validate()
            }),
        ),
        (
            "reconcile_interval",
            Box::new(move || {
                let mut o = DispatcherOptions::new("events");
                o.reconcile_interval = huge;
                o.validate()
            }),
        ),
        (
            "dead_after",
            Box::new(move || with(group(), |o| o.dead_after = huge).validate()),
        ),
        (
            "lease",
            Box::new(move || with(group(), |o| o.lease = huge).validate()),
        ),
        (
            "slice_timeout",
            Box::new(move || with(group(), |o| o.slice_timeout = huge).validate()),
        ),
        (
            "poll_interval",
            Box::new(move || with(group(), |o| o.poll_interval = huge).validate()),
        ),
        (
            "reconcile_interval",
            Box::new(move || with(group(), |o| o.reconcile_interval = huge).validate()),
        ),
        (
            "max_poll_interval",
            Box::new(move || with(group(), |o| o.max_poll_interval = huge).validate()),
        ),
        (
            "recheck_interval",
            Box::new(move || with(group(), |o| o.recheck_interval = huge).validate()),
        ),
    ];
    let mut wrong = Vec::new();
    for (i, (field, validate)) in cases.iter().enumerate() {
        match catch_unwind(AssertUnwindSafe(validate)) {
            Ok(Err(Error::InvalidOption { field: f, reason }))
                if f == *field && reason.contains("at most 100 years") => {}
            Ok(other) => wrong.push(format!("case {i} ({field}): {other:?}")),
            Err(_) => wrong.push(format!("case {i} ({field}): validate panicked")),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `candidate_window` is added to a claim's batch size for the window's
/// `LIMIT`: `usize::MAX` overflowed there (a panic in a debug build, a
/// wrapped limit in a release one). A million is accepted, more refused.
#[test]
fn a_candidate_window_past_a_million_is_refused_by_name() {
    let store = |window: u64| -> StoreOptions {
        let json = format!(r#"{{"name": "s", "claim": {{"candidate_window": {window}}}}}"#);
        serde_json::from_str(&json).unwrap()
    };
    store(1_000_000).validate().unwrap();
    for window in [1_000_001, u64::MAX] {
        match store(window).validate() {
            Err(Error::InvalidOption { field, reason }) => {
                assert_eq!(field, "candidate_window");
                assert!(reason.contains("at most 1,000,000"), "{reason}");
            }
            other => panic!("{window}: expected an error, got {other:?}"),
        }
    }
}
