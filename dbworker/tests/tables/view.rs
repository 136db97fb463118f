//! Dequeuing through a view that joins other tables, with renamed columns, under
//! contention: each job exactly once (the trap of Sourcegraph PR 37067).

use dbworker::{
    DbJob, DbStore, Handling, JobTable, JobTableOptions, StoreOptions, ddl::job_table_sql,
    new_worker,
};
use dbworker_testkit::TestDatabase;
use sqlx::Row;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use workerutil::{Handler, HandlerError, JobContext, Record, WorkerOptions};

#[derive(Debug)]
struct RepoJob {
    id: i64,
    repo_name: String,
}

impl Record for RepoJob {
    fn id(&self) -> i64 {
        self.id
    }
}

#[derive(Default)]
struct Count(Mutex<HashMap<i64, (usize, String)>>);
impl Handler<DbStore<RepoJob>> for Count {
    async fn handle(
        &self,
        job: &mut DbJob<RepoJob>,
        _ctx: &JobContext<DbStore<RepoJob>>,
    ) -> Result<(), HandlerError> {
        let r = job.record();
        let mut seen = self.0.lock().unwrap();
        let entry = seen.entry(r.id).or_insert((0, r.repo_name.clone()));
        entry.0 += 1;
        Ok(())
    }
}

#[tokio::test]
async fn concurrent_workers_through_a_joined_view_take_each_job_once() {
    for handling in [Handling::Transactional, Handling::Heartbeat] {
        let db = TestDatabase::new().await.unwrap();
        let pool = db.pool(80).await.unwrap();
        let renames: HashMap<String, String> = [
            ("state".to_owned(), "status".to_owned()),
            ("id".to_owned(), "job_id".to_owned()),
        ]
        .into();
        sqlx::raw_sql(sqlx::AssertSqlSafe(
            job_table_sql("repo_jobs", &renames).unwrap(),
        ))
        .execute(&pool)
        .await
        .unwrap();
        sqlx::raw_sql(
            "CREATE TABLE repo (id integer PRIMARY KEY, name text NOT NULL);
             INSERT INTO repo SELECT i, 'repo-' || i FROM generate_series(1, 10) i;
             ALTER TABLE repo_jobs ADD COLUMN repository_id integer NOT NULL REFERENCES repo (id);
             CREATE VIEW repo_jobs_view AS
               SELECT rj.*, r.name AS repo_name,
                      (SELECT count(*) FROM repo_jobs other WHERE other.repository_id = rj.repository_id) AS siblings
               FROM repo_jobs rj JOIN repo r ON r.id = rj.repository_id;
             INSERT INTO repo_jobs (repository_id) SELECT 1 + i % 10 FROM generate_series(1, 400) i;",
        )
        .execute(&pool)
        .await
        .unwrap();

        let mut to = JobTableOptions::new("repo_jobs t");
        to.view_name = Some("repo_jobs_view v".into());
        to.alternate_column_names = renames.clone();
        to.column_expressions = vec!["v.job_id".into(), "v.repo_name".into()];
        to.order_by = Some("v.siblings DESC, v.repository_id, v.job_id".into());
        let table = JobTable::new(&pool, to).await.unwrap();
        let scan = |row: &sqlx::postgres::PgRow| {
            Ok(RepoJob {
                id: row.try_get(0)?,
                repo_name: row.try_get(1)?,
            })
        };
        let mut so = StoreOptions::new("view_store");
        so.handling = handling;
        so.stall.stalled_max_age = Duration::from_secs(10);
        let store = Arc::new(DbStore::with_scan(&pool, &table, so, scan).await.unwrap());

        let handler = Arc::new(Count::default());
        let mut runs = Vec::new();
        for w in 0..4 {
            let mut o = WorkerOptions::new(format!("view-{w}"));
            o.num_handlers = 4;
            o.num_total_jobs = Some(100);
            o.interval = Duration::from_millis(10);
            o.heartbeat_interval = Duration::from_millis(200);
            o.heartbeat_failure_limit = Some(Duration::from_secs(5));
            runs.push(tokio::spawn(
                new_worker(store.clone(), handler.clone(), o).unwrap().run(),
            ));
        }
        for r in runs {
            r.await.unwrap();
        }
        let seen = handler.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 400, "{handling:?}: every job handled");
        assert!(
            seen.values().all(|(n, _)| *n == 1),
            "{handling:?}: a job was handled twice"
        );
        assert!(
            seen.values().all(|(_, name)| name.starts_with("repo-")),
            "{handling:?}: record read through the view"
        );
        let done: i64 =
            sqlx::query_scalar("SELECT count(*) FROM repo_jobs WHERE status = 'completed'")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(done, 400, "{handling:?}");
    }
}

#[derive(Debug)]
struct Plain(i64);
impl Record for Plain {
    fn id(&self) -> i64 {
        self.0
    }
}

/// The claim goes through, then reading its records through the view fails
/// for one row's own data (a function of the view raises for it): that job
/// fails with the reason and the other starts; claimed alone, it fails
/// alone. When the view is out (an error that is no row's), none is failed
/// or counted: they stay `processing` for the resetter.
#[tokio::test]
async fn a_row_the_view_cannot_read_fails_alone_and_a_view_that_is_out_fails_none() {
    let db = TestDatabase::new().await.unwrap();
    let pool = db.pool(4).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(
        job_table_sql("jobs", &HashMap::new()).unwrap(),
    ))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::raw_sql(
        "CREATE TABLE broken (id bigint);
         CREATE FUNCTION checked(job bigint) RETURNS bigint STABLE LANGUAGE plpgsql AS $$
         BEGIN
             IF EXISTS (SELECT FROM broken WHERE broken.id = 0) THEN
                 RAISE EXCEPTION 'the view is out' USING ERRCODE = '55000';
             END IF;
             IF EXISTS (SELECT FROM broken WHERE broken.id = job) THEN
                 RAISE EXCEPTION 'job % cannot be read', job;
             END IF;
             RETURN job;
         END $$;
         CREATE VIEW jobs_view AS SELECT j.*, checked(j.id) AS checked_id FROM jobs j;
         INSERT INTO jobs DEFAULT VALUES; INSERT INTO jobs DEFAULT VALUES;
         INSERT INTO jobs DEFAULT VALUES; INSERT INTO jobs DEFAULT VALUES;",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut to = JobTableOptions::new("jobs t");
    to.view_name = Some("jobs_view v".into());
    to.column_expressions = vec!["v.checked_id".into()];
    let table = JobTable::new(&pool, to).await.unwrap();
    let mut so = StoreOptions::new("broken_view");
    so.handling = Handling::Heartbeat;
    so.stall.stalled_max_age = Duration::from_secs(600);
    let scan = |row: &sqlx::postgres::PgRow| Ok(Plain(row.try_get(0)?));
    let store = DbStore::with_scan(&pool, &table, so, scan).await.unwrap();
    let conditions = dbworker::DbConditions::default();
    let dequeue = async |n| workerutil::Store::dequeue(&store, "host", &conditions, n).await;
    let row = async |id: i64| -> (String, i32, String) {
        sqlx::query_as(
            "SELECT state, num_resets, coalesce(failure_message, '') FROM jobs WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap()
    };

    // Job 1's own data breaks the view: it fails, saying why; job 2 starts.
    sqlx::query("INSERT INTO broken VALUES (1)")
        .execute(&pool)
        .await
        .unwrap();
    let jobs = dequeue(2).await.unwrap();
    let started: Vec<i64> = jobs.iter().map(|j| workerutil::Job::record(j).0).collect();
    assert_eq!(started, [2]);
    let (state, _, message) = row(1).await;
    assert_eq!(state, "failed");
    assert!(message.contains("job 1 cannot be read"), "{message}");

    // A poison row claimed alone fails alone too.
    sqlx::query("INSERT INTO broken VALUES (3)")
        .execute(&pool)
        .await
        .unwrap();
    assert!(dequeue(1).await.unwrap().is_empty());
    let (state, _, message) = row(3).await;
    assert_eq!(state, "failed");
    assert!(message.contains("job 3 cannot be read"), "{message}");

    // The view is out (not a row's data): nothing failed, nothing counted.
    sqlx::query("INSERT INTO broken VALUES (0)")
        .execute(&pool)
        .await
        .unwrap();
    let err = dequeue(2).await.expect_err("the read fails");
    assert!(
        workerutil::error_chain(err.as_ref()).contains("the view is out"),
        "{err}"
    );
    assert_eq!(row(4).await, ("processing".to_owned(), 0, String::new()));
}

/// A fresh database with the job table `jobs`, the pause table every store
/// adopts, and what `more` adds (a view, rows, pauses).
async fn jobs_with_pauses(more: &str) -> (TestDatabase, sqlx::PgPool) {
    let db = TestDatabase::new().await.unwrap();
    let pool = db.pool(4).await.unwrap();
    let ddl = [
        job_table_sql("jobs", &HashMap::new()).unwrap(),
        dbworker::ddl::pause_table_sql("dbworker_pauses").unwrap(),
        more.to_owned(),
    ];
    for statement in ddl {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&pool)
            .await
            .unwrap();
    }
    (db, pool)
}

/// A view under the table's own alias (as the guide shows it), a pause table
/// every store adopts, and a claim condition on a column only the view has,
/// unqualified: the claim reads the view and checks the table's row under a
/// name of its own, so it claims (before, Postgres refused every claim: the
/// alias given twice, or the column ambiguous); a paused queue's job stays.
#[tokio::test]
async fn a_view_under_the_tables_alias_claims_beside_a_pause_table() {
    let (_db, pool) = jobs_with_pauses(
        "ALTER TABLE jobs ADD COLUMN queue text;
         CREATE VIEW jobs_view AS SELECT j.*, j.id * 10 AS weight FROM jobs j;
         INSERT INTO jobs (queue) VALUES ('a'), ('b'), ('a');
         INSERT INTO dbworker_pauses (job_table, queue, paused_by) VALUES ('jobs', 'b', 'test');",
    )
    .await;
    let mut to = JobTableOptions::new("jobs j");
    to.view_name = Some("jobs_view j".into());
    to.queue_column = Some("queue".into());
    to.column_expressions = vec!["j.id".into()];
    let table = JobTable::new(&pool, to).await.unwrap();
    assert!(table.pause_table().is_some(), "the pause table is adopted");
    let mut so = StoreOptions::new("shared_alias");
    so.handling = Handling::Heartbeat;
    let scan = |row: &sqlx::postgres::PgRow| Ok(Plain(row.try_get(0)?));
    let store = DbStore::with_scan(&pool, &table, so, scan).await.unwrap();
    let conditions = dbworker::DbConditions::new().and_sql("weight <= $1", [20_i64]);
    let jobs = workerutil::Store::dequeue(&store, "host", &conditions, 3)
        .await
        .unwrap();
    let claimed: Vec<i64> = jobs.iter().map(|j| workerutil::Job::record(j).0).collect();
    // Job 2 is paused (queue b), job 3 out of the condition (weight 30).
    assert_eq!(claimed, [1]);
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Ping {}
impl dbworker::JobArgs for Ping {
    const KIND: &'static str = "ping";
}
struct Pings;
impl dbworker::JobHandler for Pings {
    type Args = Ping;
    async fn handle(&self, _job: dbworker::Job<'_, Ping>) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// A view that leaves out columns the table names: what reads them through
/// the view refuses to start, naming them (a client's typed reads and kinds,
/// `QueueWorkers`' claims by queue; before, every claim failed, or every
/// claimed typed job failed its scan for good); what reads the table's own
/// row goes on (a pause of a queue holds). Detection over such a view turns
/// on what the table has but the flags the claims would name there.
#[tokio::test]
async fn a_view_without_the_columns_claims_read_is_named_at_start_up() {
    let (_db, pool) = jobs_with_pauses(
        "ALTER TABLE jobs ADD COLUMN queue text, ADD COLUMN kind text, \
         ADD COLUMN payload jsonb, ADD COLUMN flags text[];
         CREATE VIEW jobs_narrow AS SELECT id, state, process_after FROM jobs;
         INSERT INTO jobs (queue) VALUES ('paused');
         INSERT INTO dbworker_pauses (job_table, queue) VALUES ('jobs', 'paused');",
    )
    .await;
    let mut to = JobTableOptions::typed("jobs j");
    to.view_name = Some("jobs_narrow v".into());
    let typed = JobTable::new(&pool, to).await.unwrap();
    let err = dbworker::Client::builder(&pool, &typed)
        .handler(Pings)
        .build()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("view jobs_narrow, which has no column kind, no column payload"),
        "{err}"
    );

    let mut to = JobTableOptions::detected("jobs j");
    to.view_name = Some("jobs_narrow v".into());
    let table = JobTable::new(&pool, to).await.unwrap();
    assert_eq!(
        (
            table.queue_column(),
            table.kind_column(),
            table.payload_column()
        ),
        (Some("queue"), Some("kind"), Some("payload"))
    );
    let scan = |row: &sqlx::postgres::PgRow| Ok(Plain(row.try_get(0)?));
    let mut so = StoreOptions::new("narrow");
    so.handling = Handling::Heartbeat;
    let store = Arc::new(DbStore::with_scan(&pool, &table, so, scan).await.unwrap());
    // The pause reads the table's row: the paused queue's job stays.
    let claimed = workerutil::Store::dequeue(&*store, "host", &Default::default(), 1)
        .await
        .unwrap();
    assert!(claimed.is_empty(), "a paused queue's job was claimed");
    let queues =
        dbworker::queues::QueueWorkersOptions::new(WorkerOptions::new("q")).queue("paused", 1);
    let err = match dbworker::queues::QueueWorkers::new(store, Completes, queues) {
        Ok(_) => panic!("QueueWorkers started through a view without the queue"),
        Err(err) => err.to_string(),
    };
    assert!(
        err.contains("through the view jobs_narrow, which has no such column"),
        "{err}"
    );
}

struct Completes;
impl Handler<DbStore<Plain>> for Completes {
    async fn handle(
        &self,
        _job: &mut DbJob<Plain>,
        _ctx: &JobContext<DbStore<Plain>>,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}
