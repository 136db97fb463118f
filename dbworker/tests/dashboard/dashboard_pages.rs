//! The operators' pages of the dashboard, through the router against real
//! Postgres: limits edited by an admin and obeyed at the next claim (refused
//! to a reader), a fair table's keys with their work and weights (set and
//! reset by an admin, bad weights refused, no form in read-only views, no
//! page on a plain table), the job page in an operator's order (with a
//! running job's progress on a table that keeps it),
//! a waiting job's signal sent from its page (by an admin, with the token),
//! the processes page (stale and dead heartbeats, the leader), and the
//! paused-refresh toggle.

use crate::common;
use crate::fixtures::router;

use std::time::Duration;

use axum::http::StatusCode;
use dbworker::cluster::{DEFAULT_LEADER_TABLE, DEFAULT_NODE_TABLE};
use dbworker::control::{DEFAULT_LIMIT_TABLE, FairWeights, Limits};
use dbworker::dashboard::{Auth, Dashboard, DashboardOptions};
use dbworker::ddl::{
    FairClaims, fair_claims_sql, leader_table_sql, limit_table_sql, node_table_sql,
};
use dbworker::{DbConditions, Enqueuer, JobTable, NewJob};
use workerutil::Store;

use common::Db;
use router::{csrf, get, get_as, post};

#[tokio::test]
async fn a_limit_edited_by_an_admin_holds_at_the_next_claim_and_readers_cannot_edit() {
    let db = Db::new().await;
    db.add_columns(
        |c| c.queue = true,
        &[limit_table_sql(DEFAULT_LIMIT_TABLE).unwrap()],
    )
    .await;
    db.execute(
        "INSERT INTO jobs (state, queue) SELECT 'queued', 'reports' FROM generate_series(1, 10)",
    )
    .await;
    let table = db
        .table_with(|t| {
            t.queue_column = Some("queue".into());
            t.limit_table = Some(DEFAULT_LIMIT_TABLE.into());
        })
        .await;
    let mut o = DashboardOptions::new(vec![table.clone()]);
    o.auth = Auth::Bearer {
        admin: Some("admin-secret".into()),
        read_only: Some("read-secret".into()),
    };
    let app = Dashboard::new(&db.pool, o).await.unwrap().router();
    let (admin, reader) = ("Bearer admin-secret", "Bearer read-secret");

    // The admin sees a form per queue and one for another queue; a reader
    // sees the limits and no form.
    let (_, page) = get_as(&app, "/t/jobs/queues", admin).await;
    assert_eq!(
        page.matches("action=\"/t/jobs/queues/limit\"").count(),
        2,
        "{page}"
    );
    let token = csrf(&page);
    let (_, page) = get_as(&app, "/t/jobs/queues", reader).await;
    assert!(
        !page.contains("/queues/limit") && !page.contains("method=\"post\""),
        "{page}"
    );
    let set = |max: &str| format!("csrf={token}&queue=reports&do=set&max_processing={max}");
    let (status, _, _) = post(&app, "/t/jobs/queues/limit", &set("2"), Some(reader)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a reader's post is refused");
    let (status, _, _) = post(
        &app,
        "/t/jobs/queues/limit",
        "queue=reports&do=set&max_processing=2",
        Some(admin),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "no token, no change");
    let limits = Limits::new(&db.pool, &table).await.unwrap();
    assert!(limits.list().await.unwrap().is_empty());

    // Set by the admin: a worker's next claim takes no more than it.
    let (status, _, location) = post(&app, "/t/jobs/queues/limit", &set("2"), Some(admin)).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let location = location.unwrap();
    assert!(
        location.starts_with("/t/jobs/queues?done=limit+set+on+reports&sig="),
        "{location}"
    );
    let store = db.store_on(&table, db.options()).await;
    let claim = |n| {
        let store = store.clone();
        async move {
            store
                .dequeue("limits-test", &DbConditions::new(), n)
                .await
                .unwrap()
                .len()
        }
    };
    assert_eq!(claim(10).await, 2, "the limit of 2 holds at once");
    assert_eq!(claim(10).await, 0);
    let (_, page) = get_as(&app, &location, admin).await;
    assert!(
        page.contains("at most 2 processing") && page.contains("Done: limit set on reports"),
        "{page}"
    );
    // A notice the dashboard did not write (a crafted link, a tampered
    // tag) is not shown: no page says "Done: deleted 10000 jobs".
    let forged = location.replace("limit+set+on+reports", "deleted+10000+jobs");
    for path in [
        "/t/jobs/queues?done=deleted+10000+jobs",
        "/t/jobs/jobs?done=deleted+10000+jobs",
        "/t/jobs/jobs?done=deleted+10000+jobs&sig=0000000000000000",
        forged.as_str(),
    ] {
        let (status, page) = get_as(&app, path, admin).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert!(!page.contains("Done:"), "{path}: {page}");
    }
    assert!(page.contains("name=\"max_processing\" min=\"0\""), "{page}");

    // Changed: one more; removed: the rest.
    post(&app, "/t/jobs/queues/limit", &set("3"), Some(admin)).await;
    assert_eq!(claim(10).await, 1);
    let (status, _, location) = post(
        &app,
        "/t/jobs/queues/limit",
        &format!("csrf={token}&queue=reports&do=remove"),
        Some(admin),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(location.unwrap().contains("limit+removed"));
    assert!(limits.list().await.unwrap().is_empty());
    assert_eq!(claim(10).await, 7);

    // Bad input names its field and changes nothing.
    for (form, field) in [
        ("max_processing=two", "max_processing"),
        ("rate_per_second=-1", "rate_per_second"),
        ("burst=5", "burst"),
        ("max_per_key=1", "max_per_key"),
    ] {
        let (status, body, _) = post(
            &app,
            "/t/jobs/queues/limit",
            &format!("csrf={token}&queue=reports&do=set&{form}"),
            Some(admin),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{form}: {body}");
        assert!(body.starts_with(&format!("{field}:")), "{form}: {body}");
    }
    assert!(limits.list().await.unwrap().is_empty());
    // A rate with its burst, on a queue with no job yet.
    post(
        &app,
        "/t/jobs/queues/limit",
        &format!("csrf={token}&queue=emails&do=set&rate_per_second=2.5&burst=5"),
        Some(admin),
    )
    .await;
    let (_, page) = get_as(&app, "/t/jobs/queues", reader).await;
    assert!(
        page.contains("<td>emails</td>") && page.contains("2.5/s (burst 5)"),
        "{page}"
    );
}

/// A fair table with a queue column: "acme" has 4 jobs waiting and 1
/// running, "globex" 2 waiting, a hostile key 1, and one job has no key;
/// acme weighs 3 and "idle", with no job, 7.
async fn fair_db() -> (Db, JobTable) {
    let db = Db::new().await;
    let mut fair = FairClaims::default();
    fair.queue_column = Some("queue".into());
    db.add_columns(
        |c| c.queue = true,
        &[fair_claims_sql("jobs", &Default::default(), &fair).unwrap()],
    )
    .await;
    let table = db
        .table_with(|t| t.queue_column = Some("queue".into()))
        .await;
    assert!(table.is_fair(), "found by its triggers");
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    for (key, n) in [("acme", 5), ("globex", 2), ("<i>x</i>", 1)] {
        let jobs: Vec<NewJob> = (0..n).map(|_| NewJob::new().fair_key(key)).collect();
        enqueuer.enqueue_copy(&jobs).await.unwrap();
    }
    enqueuer.enqueue_copy(&[NewJob::new()]).await.unwrap();
    db.execute(
        "UPDATE jobs SET state = 'processing' WHERE id = (SELECT min(id) FROM jobs WHERE fair_key = 'acme')",
    )
    .await;
    let weights = FairWeights::new(&db.pool, &table).await.unwrap();
    weights.set("acme", 3).await.unwrap();
    weights.set("idle", 7).await.unwrap();
    (db, table)
}

/// The dashboard over `table` with an admin and a reader (bearer tokens).
async fn fair_app(db: &Db, table: &JobTable, read_only: bool) -> axum::Router {
    let mut o = DashboardOptions::new(vec![table.clone()]);
    o.auth = Auth::Bearer {
        admin: Some("admin-secret".into()),
        read_only: Some("read-secret".into()),
    };
    o.read_only = read_only;
    Dashboard::new(&db.pool, o).await.unwrap().router()
}

/// A row of the keys' table: key, waiting, running, weight.
fn key_row(key: &str, waiting: u64, running: u64, weight: u32) -> String {
    format!(
        "<td>{key}</td><td class=\"num\">{waiting}</td><td class=\"num\">{running}</td><td class=\"num\">{weight}</td>"
    )
}

#[tokio::test]
async fn the_fairness_page_lists_each_keys_work_and_weight_on_a_fair_table_only() {
    let (db, table) = fair_db().await;
    let app = fair_app(&db, &table, false).await;
    let (status, page) = get_as(&app, "/t/jobs/fairness", "Bearer read-secret").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains("href=\"/t/jobs/fairness\">fairness</a>"),
        "in the nav: {page}"
    );
    // Most waiting first; a key without a weight has 1; text escaped.
    let acme = page.find(&key_row("acme", 4, 1, 3)).expect(&page);
    let globex = page.find(&key_row("globex", 2, 0, 1)).expect(&page);
    assert!(acme < globex, "{page}");
    assert!(
        page.contains(&key_row("&lt;i&gt;x&lt;/i&gt;", 1, 0, 1)) && !page.contains("<i>x</i>"),
        "{page}"
    );
    assert!(
        page.contains("<td><span class=\"muted\">(none)</span></td><td class=\"num\">1</td>"),
        "the jobs without a key: {page}"
    );
    // A weight set for a key with no job is listed too.
    let others = &page[page.find("id=\"fair-weights\"").expect(&page)..];
    assert!(
        others.contains("<td>idle</td><td class=\"num\">7</td>"),
        "{others}"
    );

    // A plain table: no link, no section, no page.
    let plain = Db::new().await;
    let table = plain.table().await;
    assert!(!table.is_fair());
    let app = fair_app(&plain, &table, false).await;
    for path in ["/", "/t/jobs/queues", "/t/jobs/jobs"] {
        let (status, page) = get_as(&app, path, "Bearer admin-secret").await;
        assert_eq!(status, StatusCode::OK, "{path}: {page}");
        assert!(
            !page.contains("fairness") && !page.contains("weight"),
            "{path}: {page}"
        );
    }
    let (status, body) = get_as(&app, "/t/jobs/fairness", "Bearer admin-secret").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("no fair claims"), "{body}");
}

#[tokio::test]
async fn an_admin_sets_and_resets_weights_and_a_bad_weight_changes_nothing() {
    let (db, table) = fair_db().await;
    let app = fair_app(&db, &table, false).await;
    let admin = Some("Bearer admin-secret");
    let weights = FairWeights::new(&db.pool, &table).await.unwrap();
    let weight = |key: &'static str| {
        let weights = weights.clone();
        async move {
            let set = weights.list().await.unwrap();
            set.into_iter().find(|(k, _)| k == key).map(|(_, w)| w)
        }
    };

    // A form per key (not the keyless jobs'), per other weight, and one to
    // name a key; "Reset to 1" where a weight is set.
    let (_, page) = get_as(&app, "/t/jobs/fairness", "Bearer admin-secret").await;
    let url = "action=\"/t/jobs/fairness/weight\"";
    assert_eq!(page.matches(url).count(), 5, "{page}");
    assert_eq!(page.matches("value=\"reset\"").count(), 2, "{page}");
    let token = csrf(&page);
    let post_form = |form: String| {
        let app = app.clone();
        async move { post(&app, "/t/jobs/fairness/weight", &form, admin).await }
    };

    let (status, _, location) = post_form(format!("csrf={token}&key=globex&do=set&weight=5")).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(
        location.as_deref().and_then(|l| l.split("&sig=").next()),
        Some("/t/jobs/fairness?done=weight+of+%22globex%22+set+to+5")
    );
    assert_eq!(weight("globex").await, Some(5));
    let (_, page) = get_as(&app, &location.unwrap(), "Bearer admin-secret").await;
    assert!(
        page.contains("Done: weight of &quot;globex&quot; set to 5")
            && page.contains(&key_row("globex", 2, 0, 5)),
        "{page}"
    );
    // A key named in the form, with no job yet.
    post_form(format!("csrf={token}&key=newco&do=set&weight=10000")).await;
    assert_eq!(weight("newco").await, Some(10_000));

    // Reset: back to 1 (no row); a second reset says it already was.
    let (_, _, location) = post_form(format!("csrf={token}&key=acme&do=reset&weight=")).await;
    assert!(location.unwrap().contains("reset+to+1&sig="));
    assert_eq!(weight("acme").await, None);
    let (_, _, location) = post_form(format!("csrf={token}&key=acme&do=reset")).await;
    assert!(location.unwrap().contains("already+1&sig="));

    // Bad weights are refused, naming the field and why; nothing changes.
    let before = weights.list().await.unwrap();
    for (bad, why) in [
        ("0", "weight: must be between 1 and 10000, not 0"),
        ("10001", "weight: must be between 1 and 10000, not 10001"),
        (
            "two",
            "weight: \"two\" is not a whole number from 1 to 10000",
        ),
        ("-1", "weight: \"-1\" is not a whole number from 1 to 10000"),
        (
            "2.5",
            "weight: \"2.5\" is not a whole number from 1 to 10000",
        ),
        ("", "weight: give a whole number from 1 to 10000"),
    ] {
        let form = format!("csrf={token}&key=globex&do=set&weight={bad}");
        let (status, body, _) = post_form(form).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert_eq!(body, why, "{bad}");
    }
    let (status, body, _) = post_form(format!("csrf={token}&key=&do=set&weight=2")).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::BAD_REQUEST, "key: name the key")
    );
    let (status, _, _) = post_form("key=globex&do=set&weight=2".into()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "no token, no change");
    assert_eq!(weights.list().await.unwrap(), before);
    assert_eq!(weight("globex").await, Some(5));
}

#[tokio::test]
async fn read_only_views_show_the_weights_with_no_form_and_refuse_the_post() {
    let (db, table) = fair_db().await;
    let weights = FairWeights::new(&db.pool, &table).await.unwrap();
    let before = weights.list().await.unwrap();
    let token = csrf(
        &get_as(
            &fair_app(&db, &table, false).await,
            "/t/jobs/fairness",
            "Bearer admin-secret",
        )
        .await
        .1,
    );
    // A reader of a dashboard with actions, and an admin of a read-only one.
    for (read_only, auth) in [(false, "Bearer read-secret"), (true, "Bearer admin-secret")] {
        let app = fair_app(&db, &table, read_only).await;
        let (status, page) = get_as(&app, "/t/jobs/fairness", auth).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert!(page.contains(&key_row("acme", 4, 1, 3)), "{page}");
        assert!(
            page.contains("<td>idle</td><td class=\"num\">7</td>"),
            "{page}"
        );
        assert!(
            !page.contains("/fairness/weight") && !page.contains("method=\"post\""),
            "{page}"
        );
        let form = format!("csrf={token}&key=acme&do=set&weight=9");
        let (status, body, _) = post(&app, "/t/jobs/fairness/weight", &form, Some(auth)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{read_only}: {body}");
        assert_eq!(body, "read-only users cannot act");
        let form = format!("csrf={token}&key=acme&do=reset");
        let (status, _, _) = post(&app, "/t/jobs/fairness/weight", &form, Some(auth)).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
    }
    assert_eq!(weights.list().await.unwrap(), before, "nothing changed");
}

#[tokio::test]
async fn the_job_page_reads_in_an_operators_order() {
    let db = Db::new().await;
    db.add_columns(
        |c| {
            c.queue = true;
            c.kind = true;
            c.max_retries = true;
            c.error_history = true;
            c.results = true;
        },
        &[],
    )
    .await;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (state, queue, kind, num_failures, max_retries, failure_message, queued_at, started_at, finished_at, payload, result, errors, execution_logs)
         VALUES ('failed', 'mail', 'send', 2, 3, 'SMTP 550', now() - interval '3 minutes', now() - interval '2 minutes', now() - interval '90 seconds',
                 '{\"customer\": {\"id\": 42}}', '{\"sent\": false}',
                 jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now() - interval '150 seconds', 'worker', 'host-1', 'message', 'timeout')),
                 ARRAY[json_build_object('key', 'step', 'out', 'ran 1 of 2')])
         RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let table = db
        .table_with(|t| {
            t.queue_column = Some("queue".into());
            t.kind_column = Some("kind".into());
            t.max_retries_column = Some("max_retries".into());
            t.error_history_column = Some("errors".into());
            t.result_column = Some("result".into());
            t.payload_column = Some("payload".into());
        })
        .await;
    let app = Dashboard::new(&db.pool, DashboardOptions::new(vec![table]))
        .await
        .unwrap()
        .router();
    let (status, page) = get(&app, &format!("/t/jobs/jobs/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let at = |needle: &str| {
        page.find(needle)
            .unwrap_or_else(|| panic!("no {needle:?} in {page}"))
    };
    // What it is, when, what went wrong, what it was given and gave, its
    // logs, then the rest.
    let order = [
        "<th>state</th>",
        "<th>kind</th><td>send</td>",
        "<th>queue</th><td>mail</td>",
        "<th>attempts</th>",
        "<h2>Times</h2>",
        "<h2>Errors</h2>",
        "<h2>Payload</h2>",
        "<h2>Result</h2>",
        "<h2>Execution logs</h2>",
        "<h2>Other columns</h2>",
    ];
    for pair in order.windows(2) {
        assert!(at(pair[0]) < at(pair[1]), "{} before {}", pair[0], pair[1]);
    }
    assert!(page.contains("2/3 failures"), "attempts: {page}");
    assert!(
        page.contains("<th>queued</th><td><span class=\"when\""),
        "{page}"
    );
    // Queued 3 minutes ago, started 2, finished 90 s (rounded: 2m).
    assert!(
        page.contains(">3m ago</span>") && page.contains(">2m ago</span>"),
        "relative times: {page}"
    );
    assert!(page.contains(" UTC)</span>"), "absolute times: {page}");
    assert!(
        page.contains("SMTP 550") && page.contains("timeout") && page.contains("host-1"),
        "{page}"
    );
    assert!(
        page.contains("{\n  &quot;customer&quot;: {\n    &quot;id&quot;: 42\n  }\n}"),
        "indented payload: {page}"
    );
    assert!(
        page.contains("{\n  &quot;sent&quot;: false\n}"),
        "indented result: {page}"
    );
    assert!(page.contains("ran 1 of 2"), "{page}");
    // The rest after: the columns the sections did not show, once each.
    let rest = &page[at("<h2>Other columns</h2>")..];
    assert!(rest.contains("<th>cancel</th>"), "{rest}");
    assert!(
        !rest.contains("<th>payload</th>") && !rest.contains("<th>state</th>"),
        "{rest}"
    );
    // A table without progress has no such section.
    assert!(!page.contains("<h2>Progress</h2>"), "{page}");
}

/// On a table with progress (`migration --progress`, or its side table:
/// `--progress-table`), the job page shows the progress the handler
/// reported, indented, under the job's summary and before its timeline (not
/// again among the other columns); "None reported." before any.
#[tokio::test]
async fn the_job_page_shows_the_progress_where_the_table_has_it() {
    job_page_progress(false).await;
}

#[tokio::test]
async fn the_job_page_shows_the_progress_kept_in_the_side_table() {
    job_page_progress(true).await;
}

async fn job_page_progress(side: bool) {
    let db = Db::new().await;
    let progress = "'{\"rows\": 40, \"of\": 100}'";
    let ids: Vec<i64> = if side {
        db.execute(&dbworker::ddl::progress_table_sql("jobs").unwrap())
            .await;
        let ids = sqlx::query_scalar(
            "INSERT INTO jobs (state, started_at, last_heartbeat_at, worker_hostname) VALUES
               ('processing', now(), now(), 'host-a'), ('processing', now(), now(), 'host-b')
             RETURNING id",
        )
        .fetch_all(&db.pool)
        .await
        .unwrap();
        db.execute(&format!(
            "INSERT INTO jobs_progress (job_id, progress) VALUES ({}, {progress})",
            ids[0]
        ))
        .await;
        ids
    } else {
        db.add_columns(|c| c.progress = true, &[]).await;
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "INSERT INTO jobs (state, started_at, last_heartbeat_at, worker_hostname, progress) VALUES
               ('processing', now(), now(), 'host-a', {progress}),
               ('processing', now(), now(), 'host-b', NULL)
             RETURNING id"
        )))
        .fetch_all(&db.pool)
        .await
        .unwrap()
    };
    let table = db.table_with(|t| t.progress = true).await;
    let app = Dashboard::new(&db.pool, DashboardOptions::new(vec![table]))
        .await
        .unwrap()
        .router();
    let (status, page) = get(&app, &format!("/t/jobs/jobs/{}", ids[0])).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let at = |needle: &str| {
        page.find(needle)
            .unwrap_or_else(|| panic!("no {needle:?} in {page}"))
    };
    assert!(at("<th>worker</th>") < at("<h2>Progress</h2>"), "{page}");
    assert!(at("<h2>Progress</h2>") < at("<h2>Timeline</h2>"), "{page}");
    assert!(
        page.contains(
            "<div id=\"progress\"><pre>{\n  &quot;of&quot;: 100,\n  &quot;rows&quot;: 40\n}</pre></div>"
        ),
        "{page}"
    );
    let rest = &page[at("<h2>Other columns</h2>")..];
    assert!(!rest.contains("<th>progress</th>"), "{rest}");
    // The same columns whichever storage holds them.
    assert!(rest.contains("<th>progress_seq</th>"), "{rest}");

    let (_, page) = get(&app, &format!("/t/jobs/jobs/{}", ids[1])).await;
    assert!(
        page.contains("<div id=\"progress\"><p class=\"muted\">None reported.</p></div>"),
        "{page}"
    );
}

/// A job waiting for a signal (`awaiting`, on a table with signals) says so
/// on its page and, to an admin, offers a form: the awaited name prefilled
/// and an optional JSON payload, posted with the CSRF token. Sent, the
/// signal is in the mailbox and the job is woken to run now. A reader, a
/// read-only dashboard, a missing token, a missing name or a payload that
/// is not JSON send nothing; a job that does not wait has no form.
#[tokio::test]
async fn an_admin_sends_a_waiting_job_its_signal_from_its_page() {
    let db = Db::new().await;
    db.execute(&dbworker::ddl::signals_sql("jobs", &Default::default()).unwrap())
        .await;
    let ids: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO jobs (awaiting, process_after) VALUES
           ('paid', now() + interval '1 hour'),
           (NULL, NULL)
         RETURNING id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let (waiting, plain) = (ids[0], ids[1]);
    let table = db.table_with(|t| t.signals = true).await;
    let app = |read_only: bool| {
        let (db, table) = (&db, &table);
        async move {
            let mut o = DashboardOptions::new(vec![table.clone()]);
            o.auth = Auth::Bearer {
                admin: Some("admin-secret".into()),
                read_only: Some("read-secret".into()),
            };
            o.read_only = read_only;
            Dashboard::new(&db.pool, o).await.unwrap().router()
        }
    };
    let app_rw = app(false).await;
    let (admin, reader) = ("Bearer admin-secret", "Bearer read-secret");
    let url = format!("/t/jobs/jobs/{waiting}/signal");
    let mailbox = async || -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM jobs_signals")
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };

    let (status, page) = get_as(&app_rw, &format!("/t/jobs/jobs/{waiting}"), admin).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains("<h2>Waiting for a signal</h2>")
            && page.contains("Waits for the signal <code>paid</code>"),
        "{page}"
    );
    assert!(
        page.contains(&format!("action=\"{url}\""))
            && page.contains("<input name=\"name\" value=\"paid\"")
            && page.contains("<textarea name=\"payload\""),
        "{page}"
    );
    let token = csrf(&page);
    // Not waiting: no section, no form.
    let (_, other) = get_as(&app_rw, &format!("/t/jobs/jobs/{plain}"), admin).await;
    assert!(
        !other.contains("Waiting for a signal") && !other.contains("/signal\""),
        "{other}"
    );
    // A reader sees what it waits for, but no form, and its post is refused.
    let (_, page) = get_as(&app_rw, &format!("/t/jobs/jobs/{waiting}"), reader).await;
    assert!(
        page.contains("Waits for the signal") && !page.contains(&url),
        "{page}"
    );
    let form = format!("csrf={token}&name=paid&payload=");
    let (status, _, _) = post(&app_rw, &url, &form, Some(reader)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // A read-only dashboard: no form for anyone, the post refused.
    let app_ro = app(true).await;
    let (_, page) = get_as(&app_ro, &format!("/t/jobs/jobs/{waiting}"), admin).await;
    assert!(!page.contains(&url), "{page}");
    let (status, _, _) = post(&app_ro, &url, &form, Some(admin)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // No token; no name; a payload that is not JSON.
    let (status, _, _) = post(&app_rw, &url, "name=paid", Some(admin)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "no token, no signal");
    let (status, body, _) = post(&app_rw, &url, &format!("csrf={token}&name="), Some(admin)).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::BAD_REQUEST, "name: name the signal")
    );
    let (status, body, _) = post(
        &app_rw,
        &url,
        &format!("csrf={token}&name=paid&payload=%7Boops"),
        Some(admin),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.starts_with("payload: \"{oops\" is not JSON"), "{body}");
    assert_eq!(mailbox().await, 0, "nothing sent");

    // Sent: in the mailbox with its payload, the job woken to run now.
    let (status, _, location) = post(
        &app_rw,
        &url,
        &format!("csrf={token}&name=paid&payload=%7B%22amount%22%3A+5%7D"),
        Some(admin),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let location = location.unwrap();
    assert_eq!(
        location.split("&sig=").next().unwrap(),
        format!("/t/jobs/jobs/{waiting}?done=signal+%22paid%22+sent")
    );
    let (name, payload): (String, Option<serde_json::Value>) =
        sqlx::query_as("SELECT name, payload FROM jobs_signals WHERE job_id = $1")
            .bind(waiting)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (name.as_str(), payload),
        ("paid", Some(serde_json::json!({"amount": 5})))
    );
    let (awaiting, due): (Option<String>, bool) =
        sqlx::query_as("SELECT awaiting, process_after <= now() FROM jobs WHERE id = $1")
            .bind(waiting)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((awaiting, due), (None, true));
    let (_, page) = get_as(&app_rw, &location, admin).await;
    assert!(
        page.contains("Done: signal &quot;paid&quot; sent")
            && !page.contains("Waiting for a signal"),
        "{page}"
    );
    // A job that is gone (deleted, purged) meanwhile: a 404 saying so.
    db.execute(&format!("DELETE FROM jobs WHERE id = {plain}"))
        .await;
    let (status, body, _) = post(
        &app_rw,
        &format!("/t/jobs/jobs/{plain}/signal"),
        &format!("csrf={token}&name=paid&payload="),
        Some(admin),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        body.contains(&format!("no job {plain} in table jobs")),
        "{body}"
    );
}

#[tokio::test]
async fn the_processes_page_flags_stale_and_dead_heartbeats_and_names_the_leader() {
    let db = Db::new().await;
    db.execute(&format!(
        "{}{}",
        node_table_sql(DEFAULT_NODE_TABLE).unwrap(),
        leader_table_sql(DEFAULT_LEADER_TABLE).unwrap()
    ))
    .await;
    db.execute(
        "INSERT INTO dbworker_nodes (id, host, pid, version, queues, handlers, heartbeat_at) VALUES
           ('a:1:x', 'a', 1, '0.1.0', ARRAY['mail'], 8, now() - interval '1 second'),
           ('b:2:y', 'b', 2, '0.1.0', ARRAY['mail'], 8, now() - interval '7 seconds'),
           ('c:3:z', 'c', 3, '0.1.0', ARRAY['mail'], 8, now() - interval '60 seconds');
         INSERT INTO dbworker_leaders (scope, node_id, term, acquired_at, expires_at) VALUES
           ('jobs', 'a:1:x', 4, now(), now() + interval '6 seconds'),
           ('purger', 'c:3:z', 2, now() - interval '1 minute', now() - interval '50 seconds');",
    )
    .await;
    let mut o = DashboardOptions::new(vec![db.table().await]);
    o.node_table = Some(DEFAULT_NODE_TABLE.into());
    o.leader_table = Some(DEFAULT_LEADER_TABLE.into());
    o.dead_after = Duration::from_secs(10);
    let app = Dashboard::new(&db.pool, o).await.unwrap().router();
    let (status, page) = get(&app, "/processes").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains("href=\"/processes\">processes</a>"),
        "in the nav: {page}"
    );
    let row = |id: &str| {
        let r = &page[page.find(&format!("<td>{id}</td>")).unwrap()..];
        r[..r.find("</tr>").unwrap()].to_owned()
    };
    assert!(
        row("a:1:x").contains("health-live")
            && row("a:1:x").contains("<strong>leader</strong> of jobs"),
        "{page}"
    );
    assert!(row("b:2:y").contains("health-stale"), "{page}");
    assert!(
        row("c:3:z").contains("health-dead") && !row("c:3:z").contains("leader"),
        "{page}"
    );
    assert!(
        page.contains("<strong id=\"live-count\">2</strong> live of 3"),
        "{page}"
    );
    assert!(page.contains("<td>purger</td><td>c:3:z</td><td class=\"num\">2</td><td><span class=\"muted\">expired: no leader</span>"), "{page}");

    // Without the registry there is no such page (and no link to it).
    let app = Dashboard::new(&db.pool, DashboardOptions::new(vec![db.table().await]))
        .await
        .unwrap()
        .router();
    let (status, _) = get(&app, "/processes").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, page) = get(&app, "/").await;
    assert!(!page.contains("processes</a>"), "{page}");
}

#[tokio::test]
async fn auto_refresh_pauses_and_resumes_by_links_and_links_keep_it() {
    let db = Db::new().await;
    db.add_columns(|c| c.queue = true, &[]).await;
    let table = db
        .table_with(|t| t.queue_column = Some("queue".into()))
        .await;
    let app = Dashboard::new(&db.pool, DashboardOptions::new(vec![table]))
        .await
        .unwrap()
        .router();
    let (_, page) = get(&app, "/t/jobs/jobs?state=failed").await;
    assert!(!page.contains("http-equiv=\"refresh\""), "off by default");
    assert!(page.contains("data-refresh=\"off\""), "{page}");
    assert!(
        page.contains("href=\"?state=failed&amp;refresh=5\""),
        "{page}"
    );

    let (_, page) = get(&app, "/t/jobs/jobs?state=failed&refresh=5").await;
    assert!(
        page.contains("<meta http-equiv=\"refresh\" content=\"5\">"),
        "{page}"
    );
    assert!(
        page.contains("data-refresh=\"on\"") && page.contains("<strong>every 5 s</strong>"),
        "{page}"
    );
    assert!(
        page.contains("id=\"refresh-pause\" href=\"?state=failed&amp;paused=5\""),
        "{page}"
    );
    assert!(
        page.contains("href=\"/t/jobs/queues?refresh=5\""),
        "the nav keeps it: {page}"
    );

    let (_, page) = get(&app, "/t/jobs/jobs?state=failed&paused=5").await;
    assert!(!page.contains("http-equiv=\"refresh\""), "paused: {page}");
    assert!(
        page.contains("data-refresh=\"paused\"") && page.contains("<strong>paused</strong>"),
        "{page}"
    );
    assert!(
        page.contains("id=\"refresh-resume\" href=\"?state=failed&amp;refresh=5\""),
        "{page}"
    );
    assert!(
        page.contains("href=\"/t/jobs/queues?paused=5\""),
        "the nav keeps it paused: {page}"
    );
}
