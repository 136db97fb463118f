//! The snapshot tests of the rendered SQL, and the statement layer's other
//! unit tests. Each file of `sql/` ends with a `snapshots()` that renders its
//! statements (from the parameter structs of `fixtures.rs`), each under its
//! name; [`FILES`] lists them. The snapshots live in `src/sql/snapshots/`, one
//! `<name>.sql` each; `UPDATE_SNAPSHOTS=1 cargo test -p dbworker --lib`
//! rewrites them.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use super::claim::order_select;
use super::fixtures::{admin_table, enqueue_target, rel, resolved, row, table};
use super::*;
use crate::job_filter::{FieldFilter, JobFilter, PageRequest};
use crate::retry::RetryPolicy;

/// A file's `snapshots()`: its statements, each rendered under a name.
type Snapshots = fn() -> Vec<(&'static str, Statement)>;

/// Every file of `sql/` that defines statements, with its `snapshots()`.
const FILES: [(&str, Snapshots); 33] = [
    ("mod.rs", super::snapshots),
    ("admin.rs", crate::sql::admin::snapshots),
    ("progress_table.rs", crate::sql::progress_table::snapshots),
    ("admin_search.rs", crate::sql::admin_search::snapshots),
    ("suggest.rs", crate::sql::suggest::snapshots),
    ("claim.rs", crate::sql::claim::snapshots),
    ("cluster.rs", crate::sql::cluster::snapshots),
    ("consumers.rs", crate::sql::consumers::snapshots),
    (
        "consumer_members.rs",
        crate::sql::consumer_members::snapshots,
    ),
    ("control.rs", crate::sql::control::snapshots),
    ("counts.rs", crate::sql::counts::snapshots),
    ("cron.rs", crate::sql::cron::snapshots),
    ("cursor.rs", crate::sql::cursor::snapshots),
    ("enqueue.rs", crate::sql::enqueue::snapshots),
    ("execution_logs.rs", crate::sql::execution_logs::snapshots),
    ("fairness.rs", crate::sql::fairness::snapshots),
    ("gauges.rs", crate::sql::gauges::snapshots),
    ("grants.rs", crate::sql::grants::snapshots),
    ("heartbeat.rs", crate::sql::heartbeat::snapshots),
    ("job_history.rs", crate::sql::job_history::snapshots),
    ("marks.rs", crate::sql::marks::snapshots),
    ("grouped_marks.rs", crate::sql::grouped_marks::snapshots),
    ("partition_keys.rs", crate::sql::partition_keys::snapshots),
    ("partitions.rs", crate::sql::partitions::snapshots),
    ("pooler.rs", crate::sql::pooler::snapshots),
    ("progress.rs", crate::sql::progress::snapshots),
    ("purge.rs", crate::sql::purge::snapshots),
    ("replica.rs", crate::sql::replica::snapshots),
    ("reset.rs", crate::sql::reset::snapshots),
    ("results.rs", crate::sql::results::snapshots),
    ("schema.rs", crate::sql::schema::snapshots),
    ("signals.rs", crate::sql::signals::snapshots),
    ("workflow.rs", crate::sql::workflow::snapshots),
];

#[test]
fn rendered_sql_matches_the_snapshots() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/sql/snapshots");
    let update = std::env::var_os("UPDATE_SNAPSHOTS").is_some();
    let mut mismatches = Vec::new();
    for (name, statement) in FILES.iter().flat_map(|(_, snapshots)| snapshots()) {
        let path = dir.join(format!("{name}.sql"));
        let rendered = format!("{}\n", statement.sql);
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &rendered).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_default();
        if expected != rendered {
            mismatches.push(format!(
                "{name}:\n  expected: {expected}  rendered: {rendered}"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "SQL changed (UPDATE_SNAPSHOTS=1 to accept):\n{}",
        mismatches.join("\n")
    );
}

/// The statement functions of a file of `sql/`, read from its source: every
/// `pub(crate) fn NAME(…) -> Statement` that is not a method (a method takes
/// `self` and renders what a statement function renders: `PerJob`'s are held
/// to theirs by `per_job_statements_render_as_their_functions_do`).
fn statement_functions(source: &str) -> Vec<&str> {
    let mut functions = Vec::new();
    for item in source.split("pub(crate) fn ").skip(1) {
        let signature = &item[..item.find('{').unwrap_or(item.len())];
        let Some(open) = signature.find(['(', '<']) else {
            continue;
        };
        let params = &signature[signature.find('(').unwrap_or(open) + 1..];
        let first = &params[..params.find([',', ')']).unwrap_or(params.len())];
        let method = first
            .split(|c: char| c.is_whitespace() || c == '&' || c == ':')
            .any(|word| word == "self");
        if signature.contains("-> Statement") && !method {
            functions.push(&item[..open]);
        }
    }
    functions
}

/// The function a snapshot belongs to: of `functions`, the longest name that
/// is the snapshot's name, or its start followed by `_` (`claim_with_record`
/// is `claim`'s; `mark_complete_with_result` is that function's own, not a
/// variant of `mark_complete`).
fn owner<'a>(snapshot: &str, functions: &[&'a str]) -> Option<&'a str> {
    functions
        .iter()
        .copied()
        .filter(|f| {
            snapshot
                .strip_prefix(f)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('_'))
        })
        .max_by_key(|f| f.len())
}

/// Every statement function of `sql/<file>.rs` has a snapshot registered by
/// that file's `snapshots()`, named `FUNCTION` or `FUNCTION_<variant>`; every
/// snapshot a file registers is so named after one of the file's statement
/// functions; and every snapshot file is one some file registers (a renamed or
/// removed statement must take its snapshot along).
#[test]
fn every_statement_has_a_snapshot_and_every_snapshot_a_statement() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/sql");
    let mut failures = Vec::new();
    let mut registered = HashSet::new();
    let mut checked = HashSet::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        if !file.ends_with(".rs") || file == "tests.rs" {
            continue;
        }
        let source = std::fs::read_to_string(root.join(&file)).unwrap();
        let functions = statement_functions(&source);
        let Some((_, snapshots)) = FILES.iter().find(|(f, _)| *f == file) else {
            if !functions.is_empty() {
                failures.push(format!(
                    "sql/{file} defines {} but has no snapshots() in FILES (sql/tests.rs)",
                    functions.join(", ")
                ));
            }
            continue;
        };
        checked.insert(file.clone());
        let names: Vec<&str> = snapshots().into_iter().map(|(name, _)| name).collect();
        for name in &names {
            if !registered.insert(*name) {
                failures.push(format!("sql/{file}: snapshot {name} is registered twice"));
            }
            if owner(name, &functions).is_none() {
                failures.push(format!(
                    "sql/{file}: snapshot {name} is named after none of the file's statement \
                     functions ({}): name it FUNCTION or FUNCTION_<variant>",
                    functions.join(", ")
                ));
            }
        }
        for function in &functions {
            if !names
                .iter()
                .any(|name| owner(name, &functions) == Some(*function))
            {
                failures.push(format!(
                    "sql/{file}: {function} has no snapshot: add (\"{function}\", …) or \
                     (\"{function}_<variant>\", …) to the file's snapshots()"
                ));
            }
        }
    }
    for (file, _) in FILES {
        if !checked.contains(file) {
            failures.push(format!(
                "FILES lists sql/{file}, which is not a file of sql/"
            ));
        }
    }
    for entry in std::fs::read_dir(root.join("snapshots")).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        let name = file.trim_end_matches(".sql");
        if !registered.contains(name) {
            failures.push(format!(
                "stale snapshot sql/snapshots/{file}: no file's snapshots() renders it"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn user_values_are_bound_not_rendered() {
    let t = resolved(false);
    let s = claim(&t, "evil'); DROP TABLE x; --", &[], 1, true);
    assert!(!s.sql.contains("evil"), "{}", s.sql);
    let s = mark_failed(&t, 1, 2, "it's broken", None);
    assert!(!s.sql.contains("broken"), "{}", s.sql);
    let values = [("payload".to_owned(), sea_query::Value::from("it's mine"))];
    let s = enqueue_keyed(&enqueue_target(), &row(&values), "k'ey", OnKey::Replace);
    assert!(
        !s.sql.contains("mine") && !s.sql.contains("k'ey"),
        "{}",
        s.sql
    );
    let filter = JobFilter {
        failure_contains: Some("'; DROP TABLE x; --".into()),
        fields: vec![FieldFilter::new("payload", &["a"], "it's mine").unwrap()],
        ..JobFilter::default()
    };
    let s = admin_list(&admin_table(), &filter, &PageRequest::first(10));
    assert!(
        !s.sql.contains("mine") && !s.sql.contains("k'ey"),
        "{}",
        s.sql
    );
}

#[test]
fn copy_in_quotes_the_table_and_columns() {
    let sql = copy_in(&enqueue_target(), &["payload".into(), "we\"ird".into()]);
    assert_eq!(
        sql,
        "COPY \"app\".\"example_jobs\" (\"payload\", \"we\"\"ird\") FROM STDIN"
    );
}

#[test]
fn identifiers_are_quoted() {
    assert_eq!(quote("jobs"), "\"jobs\"");
    assert_eq!(quote("we\"ird"), "\"we\"\"ird\"");
    let s = queued_count(&resolved(false));
    assert!(s.sql.contains("\"example_jobs\" AS \"j\""), "{}", s.sql);
    assert!(s.sql.contains("\"j\".\"status\""), "{}", s.sql);
}

#[test]
fn order_by_terms_keep_their_direction() {
    let mut q = Query::select();
    q.expr(Expr::val(1));
    order_select(&mut q, "a.x, lower(a.y) DESC, a.z asc nulls first");
    let sql = q.to_string(PostgresQueryBuilder);
    assert!(
        sql.ends_with("ORDER BY a.x ASC, lower(a.y) DESC, a.z ASC NULLS FIRST"),
        "{sql}"
    );
}

#[test]
fn a_kinds_retry_rule_is_bound_values_in_the_same_statement() {
    let t = resolved(false);
    let over = workerutil::Retry::new()
        .max_retries(7)
        .delay(RetryPolicy::fixed(Duration::from_secs(42)));
    let store = mark_errored(&t, 1, 2, "m", &t.retry_rule(None), None);
    let kind = mark_errored(&t, 1, 2, "m", &t.retry_rule(Some(&over)), None);
    assert_eq!(store.sql, kind.sql, "one statement for every rule");
    let values = format!("{:?}", kind.values);
    assert!(values.contains("Unsigned(Some(7))"), "{values}");
    assert!(values.contains("Double(Some(42.0))"), "{values}");
    let store_values = format!("{:?}", store.values);
    assert!(store_values.contains("Unsigned(Some(2))"), "{store_values}");
    assert!(
        !store_values.contains("Double(Some(42.0))"),
        "{store_values}"
    );
}

/// The statements rendered once per store are the ones the statement
/// functions render for that job: same text, same values in the same order.
#[test]
fn per_job_statements_render_as_their_functions_do() {
    let mut views = table("app.example_jobs");
    views.view = Some(rel("app.example_view v"));
    for t in [table("app.example_jobs"), table("\"Odd Name\""), views] {
        let cached = PerJob::new(&t);
        for (id, token) in [(1, 2), (i64::MAX, -7), (42, 1_700_000_000_000_000)] {
            let pairs = [
                (cached.lock_claimed(id, token), lock_claimed(&t, id, token)),
                (
                    cached.mark_complete(id, token),
                    mark_complete(&t, id, token, None),
                ),
            ];
            for (cached, rendered) in pairs {
                assert_eq!(cached.sql, rendered.sql);
                assert_eq!(cached.values.0, rendered.values.0, "{}", rendered.sql);
            }
        }
    }
}

/// A beat's spans cost a table without traces nothing (the statement and
/// its values are the plain beat's), and a traced table pays only on the
/// beats that carry a span.
#[test]
fn a_heartbeat_writes_spans_only_on_a_table_with_traces() {
    let span = || {
        vec![(
            1,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        )]
    };
    let plain = |o: &StoreParams, spans| heartbeat(o, vec![1], vec![2], Vec::new(), spans);
    let bare = resolved(false);
    let (with, without) = (plain(&bare, span()), plain(&bare, Vec::new()));
    assert_eq!(with.sql, without.sql);
    assert_eq!(with.values.0.0.len(), without.values.0.0.len());
    let traced = super::fixtures::with_traces();
    assert_eq!(plain(&traced, Vec::new()).sql, without.sql);
    assert!(plain(&traced, span()).sql.contains("\"trace_follows\""));
}

/// `terminate_backend` ends the session only while it is still in the
/// transaction `lock_claimed` saw begin: a later transaction of the same
/// session (or a pid gone to another session) is spared.
#[tokio::test]
async fn terminate_backend_ends_only_the_transaction_it_names() {
    use sqlx::{Connection, Row};
    let db = dbworker_testkit::TestDatabase::new()
        .await
        .expect("a database");
    let pool = sqlx::PgPool::connect(db.url()).await.expect("a pool");
    let mut victim = sqlx::PgConnection::connect(db.url()).await.unwrap();
    let begin = async |conn: &mut sqlx::PgConnection| -> (i32, i64) {
        sqlx::raw_sql("BEGIN").execute(&mut *conn).await.unwrap();
        let row = sqlx::query(
            "SELECT pg_backend_pid() AS pid, (EXTRACT(EPOCH FROM now()) * 1000000)::bigint AS xact_us",
        )
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        (row.get("pid"), row.get("xact_us"))
    };
    let (pid, old) = begin(&mut victim).await;
    sqlx::raw_sql("COMMIT").execute(&mut victim).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let (_, new) = begin(&mut victim).await;

    let spared = terminate_backend(pid, old)
        .fetch_optional(&pool)
        .await
        .unwrap()
        .expect("the session is there");
    assert_eq!(spared.get::<Option<bool>, _>("done"), None);
    assert!(!spared.get::<bool, _>("untracked"));
    sqlx::raw_sql("SELECT 1")
        .execute(&mut victim)
        .await
        .expect("spared");

    let ended = terminate_backend(pid, new)
        .fetch_optional(&pool)
        .await
        .unwrap()
        .expect("the session is there");
    assert_eq!(ended.get::<Option<bool>, _>("done"), Some(true));
    let after = tokio::time::timeout(
        Duration::from_secs(5),
        sqlx::raw_sql("SELECT 1").execute(&mut victim),
    )
    .await
    .expect("the session answers or is gone");
    assert!(after.is_err(), "terminated");
}
