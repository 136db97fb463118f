//! Bad query parameters on the dashboard's job list, through the router: an
//! unknown column, a key path into a column that is not JSON, malformed
//! cursors and oversized values each answer 400 naming the parameter, echo
//! the input cut short, and leave the next request unaffected.

use crate::fixtures::dashboard as shared;
use crate::fixtures::router;

use axum::http::StatusCode;
use dbworker::dashboard::{Dashboard, DashboardOptions};
use router::get;

#[tokio::test]
async fn bad_list_parameters_answer_400_naming_the_parameter() {
    let (db, failed) = shared::seed().await;
    let table = db
        .table_with(|t| t.queue_column = Some("queue".into()))
        .await;
    let app = Dashboard::new(&db.pool, DashboardOptions::new(vec![table]))
        .await
        .unwrap()
        .router();
    let long = "x".repeat(10_000);
    let cases = [
        ("field=nosuchcol%3D1", "field", "nosuchcol"),
        ("field=nosuchcol.k%3D1", "field", "nosuchcol"),
        ("field=state.k%3D1", "field", "JSON"),
        (&format!("field={long}") as &str, "field", "xxx"),
        ("after=abc", "after", "abc"),
        (
            "after=1&after_value=abc&sort=failures",
            "after_value",
            "abc",
        ),
        (
            &format!("after=1&after_value={long}&sort=queued_at"),
            "after_value",
            "xxx",
        ),
        (&format!("state={long}"), "state", "xxx"),
        (&format!("sort={long}"), "sort", "xxx"),
    ];
    for (query, parameter, echoed) in cases {
        let (status, body) = get(&app, &format!("/t/jobs/jobs?{query}")).await;
        let shown = &query[..query.len().min(60)];
        assert_eq!(status, StatusCode::BAD_REQUEST, "{shown}: {body}");
        assert!(
            body.starts_with(&format!("{parameter}: ")) && body.contains(echoed),
            "{shown}: {body}"
        );
        // The input echoed at most cut short, never whole; no driver text.
        assert!(body.chars().count() < 300, "{shown}: {body}");
        assert!(!body.contains("database error"), "{shown}: {body}");
    }

    // The requests after them are served as before, good filters included.
    let (status, page) = get(&app, "/t/jobs/jobs?field=payload.customer_id%3D42").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains(&format!("/jobs/{failed}\"")), "{page}");
    let (status, page) = get(&app, "/t/jobs/jobs?field=queue%3Dreports&state=failed").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains(&format!("/jobs/{failed}\"")), "{page}");
    let (status, page) = get(&app, "/t/jobs/jobs?sort=failures&order=newest").await;
    assert_eq!(status, StatusCode::OK, "{page}");
}

/// Bad numbers in query parameters and forms (not numbers, out of range, a
/// time span the database cannot subtract) answer 400 with a plain message
/// naming the field, and act on nothing; a database error is logged, never
/// shown.
#[tokio::test]
async fn bad_numbers_answer_400_and_database_errors_are_not_echoed() {
    let (db, failed) = shared::seed().await;
    let app = router::dashboard(&db, |t| {
        t.queue_column = Some("queue".into());
        t.limit_table = Some(dbworker::control::DEFAULT_LIMIT_TABLE.into());
    })
    .await;
    let plain = |what: &str, status: StatusCode, body: &str, parameter: &str| {
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {body}");
        assert!(
            body.starts_with(&format!("{parameter}: ")),
            "{what}: {body}"
        );
        assert!(body.chars().count() < 300, "{what}: {body}");
        for leak in ["database", "timestamp", "SQL", "sqlx"] {
            assert!(!body.contains(leak), "{what}: {body}");
        }
    };
    for (query, parameter) in [
        ("older_than_secs=1e12", "older_than_secs"),
        ("older_than_secs=NaN", "older_than_secs"),
        ("older_than_secs=-3", "older_than_secs"),
        ("id=99999999999999999999", "id"),
        ("after=99999999999999999999", "after"),
    ] {
        let (status, body) = get(&app, &format!("/t/jobs/jobs?{query}")).await;
        plain(query, status, &body, parameter);
    }
    let (status, _) = get(&app, "/t/jobs/jobs/99999999999999999999").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let (_, page) = get(&app, "/t/jobs/jobs").await;
    let token = router::csrf(&page);
    let queued: i64 = sqlx::query_scalar("SELECT min(id) FROM jobs WHERE state = 'queued'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let bulk = format!("csrf={token}&scope=selected&id={queued}&confirm=yes");
    for (form, parameter) in [
        (format!("{bulk}&action=fail&id=abc"), "id"),
        (
            format!("{bulk}&action=reschedule&run_in_secs=abc"),
            "run_in_secs",
        ),
        (
            format!("{bulk}&action=reschedule&run_in_secs=1e15"),
            "run_in_secs",
        ),
        (format!("{bulk}&action=explode"), "action"),
    ] {
        let (status, body, _) = router::post(&app, "/t/jobs/bulk", &form, None).await;
        plain(&form, status, &body, parameter);
    }
    let (status, body, _) = router::post(
        &app,
        &format!("/t/jobs/jobs/{failed}/action"),
        &format!("csrf={token}&action=reschedule&run_in_secs=1e15"),
        None,
    )
    .await;
    plain("job action", status, &body, "run_in_secs");
    for form in ["max_processing=99999999999", "burst=-1&rate_per_second=1"] {
        let (status, body, _) = router::post(
            &app,
            "/t/jobs/queues/limit",
            &format!("csrf={token}&queue=mail&{form}"),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{form}: {body}");
    }
    assert_eq!(db.state(queued).await, "queued", "nothing was done");
    assert_eq!(db.state(failed).await, "failed", "nothing was done");

    // A database error: 500, the cause in the log, not on the page.
    db.execute("DROP TABLE dbworker_limits").await;
    let (status, body) = get(&app, "/t/jobs/queues").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert!(!body.contains("dbworker_limits"), "{body}");
    assert!(!body.contains("does not exist"), "{body}");
}

/// Options `Dashboard::new` used to take and fail on later: a registry or
/// lease table name that does not parse (the overview silently listed no
/// process, `/processes` answered 400 to every visit), two job tables of
/// one name (the second unreachable: URLs name a table by its name), and a
/// `dead_after` past 100 years. Each is refused at start-up, by name.
#[tokio::test]
async fn bad_options_are_refused_at_start_up_by_name() {
    use dbworker::Error;
    use std::time::Duration;
    let (db, _) = shared::seed().await;
    let table = db.table_with(|_| {}).await;
    let name = table.name();
    type Set = Box<dyn Fn(&mut DashboardOptions)>;
    let cases: Vec<(&str, &str, Set)> = vec![
        (
            "node_table",
            "nodes;",
            Box::new(|o| o.node_table = Some("nodes; --".into())),
        ),
        (
            "leader_table",
            "leaders;",
            Box::new(|o| o.leader_table = Some("leaders; --".into())),
        ),
        (
            "tables",
            &name,
            Box::new(|o| o.tables.push(o.tables[0].clone())),
        ),
        (
            "dead_after",
            "100 years",
            Box::new(|o| o.dead_after = Duration::MAX),
        ),
    ];
    let mut wrong = Vec::new();
    for (field, names, set) in cases {
        let mut o = DashboardOptions::new(vec![table.clone()]);
        set(&mut o);
        match Dashboard::new(&db.pool, o).await {
            Err(Error::InvalidOption { field: f, reason })
                if f == field && reason.contains(names) => {}
            Err(other) => wrong.push(format!("{field}: {other}")),
            Ok(_) => wrong.push(format!("{field}: accepted")),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
