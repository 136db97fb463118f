//! Every `StoreOptions` and `JobTableOptions` field that can be wrong is
//! named by `validate`.

use super::*;
use crate::store::ForbiddenFlags;
use crate::table::JobTableOptions;

fn opts() -> StoreOptions {
    StoreOptions::new("s")
}

fn table() -> JobTableOptions {
    JobTableOptions::new("jobs j")
}

#[test]
fn defaults_are_valid() {
    let t = JobTable::unchecked(table()).unwrap();
    let r = opts().resolve(&t).unwrap();
    assert_eq!(r.order_by, r#""j"."id""#);
    assert_eq!(r.column_expressions, vec![r#""j".*"#.to_owned()]);
}

#[test]
fn forbidden_flags_need_the_tables_flags_column() {
    let mut o = opts();
    o.claim.forbidden_flags = Some(ForbiddenFlags::fixed(["a"]));
    let plain = JobTable::unchecked(table()).unwrap();
    match o.resolve(&plain) {
        Err(Error::InvalidOption { field, .. }) => assert_eq!(field, "forbidden_flags"),
        other => panic!("expected an error, got {other:?}"),
    }
    let mut flagged = table();
    flagged.flags_column = Some("flags".into());
    assert!(o.resolve(&JobTable::unchecked(flagged).unwrap()).is_ok());
}

#[test]
fn the_cursor_is_off_with_a_view_an_order_or_pauses() {
    let t = JobTable::unchecked(table()).unwrap();
    assert!(opts().resolve(&t).unwrap().claim_cursor.is_some());
    let mut ordered = table();
    ordered.order_by = Some("j.priority DESC, j.id".into());
    let ordered = JobTable::unchecked(ordered).unwrap();
    assert_eq!(opts().resolve(&ordered).unwrap().claim_cursor, None);
    let mut paused = table();
    paused.pause_table = Some("dbworker_pauses".into());
    let paused = JobTable::unchecked(paused).unwrap();
    assert_eq!(opts().resolve(&paused).unwrap().claim_cursor, None);
    // Without a cursor the probe runs only to wake listening workers for jobs
    // coming due, through a view too.
    assert_eq!(opts().resolve(&paused).unwrap().probe, None);
    let mut listening = opts();
    listening.listen = crate::Listen::TableChannel;
    let every = listening.claim.claim_cursor;
    assert_eq!(listening.resolve(&paused).unwrap().probe, every);
    assert_eq!(listening.resolve(&ordered).unwrap().probe, every);
    let mut viewed = table();
    viewed.view_name = Some("jobs_view v".into());
    let viewed = JobTable::unchecked(viewed).unwrap();
    assert_eq!(opts().resolve(&viewed).unwrap().probe, None);
    let through_view = listening.resolve(&viewed).unwrap();
    assert_eq!(
        (through_view.claim_cursor, through_view.probe),
        (None, every)
    );
}

#[test]
fn each_bad_table_field_is_named() {
    type Breaker = Box<dyn Fn(&mut JobTableOptions)>;
    let cases: Vec<(&str, Breaker)> = vec![
        (
            "table_name",
            Box::new(|o| o.table_name = "jobs; drop".into()),
        ),
        (
            "view_name",
            Box::new(|o| o.view_name = Some("a b c d".into())),
        ),
        (
            "alternate_column_names",
            Box::new(|o| {
                o.alternate_column_names.insert("nope".into(), "x".into());
            }),
        ),
        (
            "max_retries_column",
            Box::new(|o| o.max_retries_column = Some("num_failures".into())),
        ),
        (
            "flags_column",
            Box::new(|o| o.flags_column = Some("no spaces".into())),
        ),
        (
            "payload_column",
            Box::new(|o| o.payload_column = Some("no spaces".into())),
        ),
        (
            "error_history_column",
            Box::new(|o| o.error_history_column = Some("no spaces".into())),
        ),
        (
            "error_history_limit",
            Box::new(|o| o.error_history_limit = 0),
        ),
        (
            "result_column",
            Box::new(|o| o.result_column = Some("no spaces".into())),
        ),
        (
            "limit_table",
            Box::new(|o| o.limit_table = Some("dbworker_limits".into())),
        ),
        (
            "limit_key_column",
            Box::new(|o| o.limit_key_column = Some("customer".into())),
        ),
        (
            "connect_timeout",
            Box::new(|o| o.connect_timeout = Duration::ZERO),
        ),
        (
            "column_expressions",
            Box::new(|o| o.column_expressions = vec![" ".into()]),
        ),
        ("order_by", Box::new(|o| o.order_by = Some(String::new()))),
        // Aging without a priority, too fast, boosting nothing, or with limits.
        (
            "aging",
            Box::new(|o| o.aging = Some(crate::Aging::every(Duration::from_secs(1)))),
        ),
        (
            "aging",
            Box::new(|o| {
                o.priority_column = Some("priority".into());
                o.aging = Some(crate::Aging::every(Duration::from_millis(1)));
            }),
        ),
        (
            "aging",
            Box::new(|o| {
                o.priority_column = Some("priority".into());
                o.aging = Some(crate::Aging::every(Duration::from_secs(1)).max_boost(0));
            }),
        ),
        (
            "aging",
            Box::new(|o| {
                o.priority_column = Some("priority".into());
                o.queue_column = Some("queue".into());
                o.limit_table = Some("dbworker_limits".into());
                o.aging = Some(crate::Aging::every(Duration::from_secs(1)));
            }),
        ),
    ];
    for (field, break_it) in cases {
        let mut o = table();
        break_it(&mut o);
        match o.validate() {
            Err(Error::InvalidOption { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: expected an error, got {other:?}"),
        }
    }
}

#[test]
fn each_bad_field_is_named() {
    type Breaker = Box<dyn Fn(&mut StoreOptions)>;
    let cases: Vec<(&str, Breaker)> = vec![
        ("name", Box::new(|o| o.name.clear())),
        (
            "retry.backoff_factor",
            Box::new(|o| o.retry.backoff_factor = 0.5),
        ),
        ("retry.jitter", Box::new(|o| o.retry.jitter = 1.0)),
        (
            "retry.max_delay",
            Box::new(|o| o.retry.max_delay = Duration::ZERO),
        ),
        (
            "retry.max_delay",
            Box::new(|o| o.retry.max_delay = Duration::MAX),
        ),
        (
            "stalled_max_age",
            Box::new(|o| o.stall.stalled_max_age = Duration::ZERO),
        ),
        (
            "reset_failure_message",
            Box::new(|o| o.stall.reset_failure_message.clear()),
        ),
        (
            "candidate_window",
            Box::new(|o| o.claim.candidate_window = 0),
        ),
        (
            "claim_cursor",
            Box::new(|o| o.claim.claim_cursor = Some(Duration::from_millis(1))),
        ),
        (
            "listen",
            Box::new(|o| o.listen = Listen::Channel("no spaces".into())),
        ),
        (
            "forbidden_flags",
            Box::new(|o| o.claim.forbidden_flags = Some(ForbiddenFlags::fixed(["a\0"]))),
        ),
        ("max_result_bytes", Box::new(|o| o.max_result_bytes = 0)),
    ];
    for (field, break_it) in cases {
        let mut o = opts();
        break_it(&mut o);
        match o.validate() {
            Err(Error::InvalidOption { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: expected an error, got {other:?}"),
        }
    }
}
