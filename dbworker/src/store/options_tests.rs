//! Every `StoreOptions` field that can be wrong is named by `validate`.

use super::*;

fn opts() -> StoreOptions<()> {
    StoreOptions::new("s", "jobs j", |_| Ok(()))
}

#[test]
fn defaults_are_valid() {
    let r = opts().resolve().unwrap();
    assert_eq!(r.order_by, r#""j"."id""#);
    assert_eq!(r.column_expressions, vec![r#""j".*"#.to_owned()]);
}

#[test]
fn each_bad_field_is_named() {
    type Breaker = Box<dyn Fn(&mut StoreOptions<()>)>;
    let cases: Vec<(&str, Breaker)> = vec![
        ("name", Box::new(|o| o.name.clear())),
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
            "column_expressions",
            Box::new(|o| o.column_expressions = vec![" ".into()]),
        ),
        ("order_by", Box::new(|o| o.order_by = Some(String::new()))),
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
            "stalled_max_age",
            Box::new(|o| o.stalled_max_age = Duration::ZERO),
        ),
        (
            "reset_failure_message",
            Box::new(|o| o.reset_failure_message.clear()),
        ),
        ("candidate_window", Box::new(|o| o.candidate_window = 0)),
        (
            "claim_cursor",
            Box::new(|o| o.claim_cursor = Some(Duration::from_millis(1))),
        ),
        (
            "connect_timeout",
            Box::new(|o| o.connect_timeout = Duration::ZERO),
        ),
        (
            "listen",
            Box::new(|o| o.listen = Listen::Channel("no spaces".into())),
        ),
        (
            "max_retries_column",
            Box::new(|o| o.max_retries_column = Some("num_failures".into())),
        ),
        (
            "forbidden_flags",
            Box::new(|o| o.forbidden_flags = Some(ForbiddenFlags::fixed(["a"]))),
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
