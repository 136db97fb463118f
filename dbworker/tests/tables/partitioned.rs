//! Partitioned job tables (`dbworker migration --partitioned`) on real
//! Postgres: retention by dropping whole partitions that never drops an
//! unfinished job (nor one retried while its partition is being detached), a
//! detach or a creation ahead that cannot get its lock in time, partitions
//! created ahead, job keys held across every partition, and the features a
//! partitioned table cannot carry refused by name. The conformance suite, the
//! crash tests, keys, limits, admin and the dashboard also run on a
//! partitioned table in their own files (tests named `…partitioned…`).

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use dbworker::{
    Enqueued, Enqueuer, Error, JobTable, JobTableOptions, KeyMode, NewJob,
    ddl::{OptionalColumns, partitioned_keys_sql},
    maintenance::{PurgeOptions, Purger},
};
use serde_json::json;
use workerutil::JobState;

use common::Db;

/// The dated partitions of `jobs` (not the default one), by name.
pub(crate) async fn partitions(db: &Db) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'jobs'::regclass AND c.relname <> 'jobs_default' ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// The partition job `id` lives in.
async fn partition_of(db: &Db, id: i64) -> String {
    db.scalar(
        "SELECT tableoid::regclass::text FROM jobs WHERE id = $1",
        id,
    )
    .await
}

/// The test table, `jobs`, with no optional column.
pub(crate) async fn jobs(db: &Db) -> JobTable {
    JobTable::new(&db.pool, JobTableOptions::new("jobs"))
        .await
        .unwrap()
}

pub(crate) fn purger_options() -> PurgeOptions {
    let mut o = PurgeOptions::new();
    o.max_age = vec![
        (JobState::Completed, Duration::from_secs(24 * 3600)),
        (JobState::Failed, Duration::from_secs(24 * 3600)),
    ];
    o
}

/// 100 jobs over the last ten days, all completed two days ago, but for a
/// queued job five days back, a processing one six days back and one
/// completed just now seven days back. Returns those three ids.
pub(crate) async fn finished_but_three(db: &Db) -> [i64; 3] {
    let ids = db.enqueue_spread(100, json!({})).await;
    db.execute("UPDATE jobs SET state = 'completed', finished_at = now() - interval '2 days'")
        .await;
    let in_partition = |days: i64| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT min(id) FROM jobs WHERE queued_at::date = (now() - make_interval(days => $1::int))::date",
            )
            .bind(days)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let (queued, processing, young) = (
        in_partition(5).await,
        in_partition(6).await,
        in_partition(7).await,
    );
    assert!(ids.contains(&queued));
    sqlx::query(
        "UPDATE jobs SET state = CASE id WHEN $1 THEN 'queued' WHEN $2 THEN 'processing' ELSE 'completed' END,
                         finished_at = CASE WHEN id = $3 THEN now() END,
                         last_heartbeat_at = now()
         WHERE id IN ($1, $2, $3)",
    )
    .bind(queued)
    .bind(processing)
    .bind(young)
    .execute(&db.pool)
    .await
    .unwrap();
    [queued, processing, young]
}

#[tokio::test]
async fn purge_drops_whole_partitions_but_never_one_holding_an_unfinished_job() {
    let db = Db::partitioned().await;
    let [queued, processing, young] = finished_but_three(&db).await;
    let keep = [
        partition_of(&db, queued).await,
        partition_of(&db, processing).await,
        partition_of(&db, young).await,
    ];
    let before = partitions(&db).await;

    let purger = Purger::new(&db.pool, &jobs(&db).await, purger_options())
        .await
        .unwrap();
    assert!(purger.is_partitioned());
    let purged = purger.purge_once().await.unwrap();

    // The six closed partitions of finished, old jobs (1-4, 8 and 9 days
    // back) are dropped whole: 10 jobs each.
    let dropped: Vec<&str> = purged
        .partitions_dropped
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(dropped.len(), 6, "{purged:?}");
    assert!(
        purged.partitions_dropped.iter().all(|p| p.rows == 10),
        "{purged:?}"
    );
    for name in &keep {
        assert!(
            !dropped.iter().any(|d| d.ends_with(name.as_str())),
            "{name} kept"
        );
    }
    let after = partitions(&db).await;
    assert_eq!(after.len(), before.len() - 6, "{after:?}");
    for name in &keep {
        assert!(after.contains(name), "{name} still attached: {after:?}");
    }
    // Never a live job: the unfinished and the young ones are all there.
    assert_eq!(db.state(queued).await, "queued");
    assert_eq!(db.state(processing).await, "processing");
    assert_eq!(db.state(young).await, "completed");
    // Their partitions' old rows, and today's open partition, go in batches.
    assert_eq!(
        purged.by_state,
        [(JobState::Completed, 9 + 9 + 9 + 10), (JobState::Failed, 0)]
    );
    let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM jobs ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    let mut expected = vec![queued, processing, young];
    expected.sort_unstable();
    assert_eq!(left, expected);
    assert_eq!(purged.total(), 97);

    // Once the last live job of a partition finishes and ages, it goes too.
    db.execute(&format!(
        "UPDATE jobs SET state = 'completed', finished_at = now() - interval '2 days' WHERE id = {queued}"
    ))
    .await;
    let purged = purger.purge_once().await.unwrap();
    assert_eq!(purged.partitions_dropped.len(), 1, "{purged:?}");
    assert!(
        purged.partitions_dropped[0]
            .name
            .ends_with(keep[0].as_str())
    );
    assert_eq!(db.state(processing).await, "processing");
}

/// Another table partitioned by text (`TO ('m')`) and fresh catalog
/// statistics (which make the planner filter `pg_class` before joining) do
/// not fail the listing of closed partitions; and a partition that cannot be
/// dropped (a view depends on it) leaves the others, and the batches, to go.
#[tokio::test]
async fn another_tables_text_bounds_and_an_undroppable_partition_stop_no_retention() {
    let db = Db::partitioned().await;
    let [queued, processing, young] = finished_but_three(&db).await;
    db.execute(
        "CREATE TABLE customers (name text) PARTITION BY RANGE (name);
         CREATE TABLE customers_a_m PARTITION OF customers FOR VALUES FROM ('a') TO ('m');
         ANALYZE",
    )
    .await;
    // The oldest closed partition, all of whose rows are purgeable.
    let oldest: String = sqlx::query_scalar(
        "SELECT tableoid::regclass::text FROM jobs WHERE queued_at::date = (now() - interval '9 days')::date LIMIT 1",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    db.execute(&format!("CREATE VIEW report AS SELECT * FROM {oldest}"))
        .await;
    let purger = Purger::new(&db.pool, &jobs(&db).await, purger_options())
        .await
        .unwrap();
    let purged = purger.purge_once().await.unwrap();
    let dropped: Vec<&str> = purged
        .partitions_dropped
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(dropped.len(), 5, "{purged:?}");
    assert!(
        !dropped.iter().any(|d| d.ends_with(oldest.as_str())),
        "{dropped:?}"
    );
    assert!(partitions(&db).await.contains(&oldest));
    // Its rows went the batch way, with the others' old rows.
    let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM jobs ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    let mut expected = vec![queued, processing, young];
    expected.sort_unstable();
    assert_eq!(left, expected);
    assert_eq!(purged.total(), 97);
}

#[tokio::test]
async fn a_detach_that_cannot_get_the_tables_lock_in_time_skips_the_partition() {
    let db = Db::partitioned().await;
    let [_, processing, _] = finished_but_three(&db).await;
    // A transactional handler's lock on the job table (any row will do).
    let mut handler = db.pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM jobs WHERE id = $1 FOR KEY SHARE")
        .bind(processing)
        .execute(&mut *handler)
        .await
        .unwrap();
    let mut o = purger_options();
    o.detach_lock_timeout = Duration::from_millis(100);
    let purger = Purger::new(&db.pool, &jobs(&db).await, o).await.unwrap();
    let started = Instant::now();
    let purged = purger.purge_once().await.unwrap();
    assert!(purged.partitions_dropped.is_empty(), "{purged:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "six lock timeouts of 100 ms, not a wait for the handler: {:?}",
        started.elapsed()
    );
    // The rows still went, in batches; the partitions are empty now.
    assert_eq!(db.count("completed").await, 1);
    handler.commit().await.unwrap();
    let purged = purger.purge_once().await.unwrap();
    assert_eq!(purged.partitions_dropped.len(), 6, "{purged:?}");
    assert!(purged.partitions_dropped.iter().all(|p| p.rows == 0));
}

/// Creating partitions ahead takes the job table's lock too: it waits at
/// most `detach_lock_timeout` for a transaction holding the table, so the
/// claims and enqueues queued behind it wait no longer, and the partitions
/// come at the next pass once the lock is free. `partitions create` (the
/// CLI's) says it could not get the lock.
#[tokio::test]
async fn a_partition_creation_that_cannot_get_the_tables_lock_in_time_waits_for_the_next_pass() {
    let db = Db::partitioned().await;
    let id = db.enqueue(1, json!({})).await[0];
    // A transactional handler's lock on the job table.
    let mut handler = db.pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM jobs WHERE id = $1 FOR KEY SHARE")
        .bind(id)
        .execute(&mut *handler)
        .await
        .unwrap();
    let before = partitions(&db).await;
    let mut o = purger_options();
    // Two partitions past the three made at set-up are due.
    o.partitions_ahead = 5;
    o.detach_lock_timeout = Duration::from_millis(500);
    let purger = Purger::new(&db.pool, &jobs(&db).await, o).await.unwrap();
    let pass = {
        let purger = purger.clone();
        tokio::spawn(async move { purger.purge_once().await })
    };
    db.await_lock_wait(
        "%jobs_create_partitions%",
        "the purger never tried to create",
    )
    .await;
    // An enqueue queued behind the waiting CREATE goes once it gives up.
    tokio::time::timeout(Duration::from_secs(10), db.enqueue(1, json!({})))
        .await
        .expect("an enqueue waits for the purger's CREATE at most its lock timeout");
    // Nine empty closed partitions wait for their detach too.
    let purged = tokio::time::timeout(Duration::from_secs(30), pass)
        .await
        .expect("the pass skips the partitions it cannot create in time")
        .unwrap()
        .unwrap();
    assert!(purged.partitions_created.is_empty(), "{purged:?}");
    assert_eq!(partitions(&db).await, before);
    let err = tokio::time::timeout(Duration::from_secs(10), purger.create_partitions())
        .await
        .expect("`partitions create` gives up too")
        .unwrap_err()
        .to_string();
    assert!(err.contains("lock was not granted"), "{err}");
    handler.commit().await.unwrap();
    let purged = purger.purge_once().await.unwrap();
    assert_eq!(purged.partitions_created.len(), 2, "{purged:?}");
}

/// A dropped partition's rows go to the archive by column name, as the
/// batches' do: an archive with the job table's columns in another order
/// gets each value in its own column.
#[tokio::test]
async fn a_dropped_partitions_rows_go_to_the_archive_by_column_name() {
    use crate::fixtures::purge::{reversed_archive, rows_as_json};
    let db = Db::partitioned().await;
    finished_but_three(&db).await;
    reversed_archive(&db, "reversed_archive").await;
    let before = rows_as_json(&db, "jobs").await;
    let mut o = purger_options();
    o.archive_table = Some("reversed_archive".into());
    let purger = Purger::new(&db.pool, &jobs(&db).await, o).await.unwrap();
    let purged = purger.purge_once().await.unwrap();
    assert_eq!(purged.partitions_dropped.len(), 6, "{purged:?}");
    let archived = rows_as_json(&db, "reversed_archive").await;
    assert_eq!(archived.len() as u64, purged.total());
    for row in &archived {
        assert!(before.contains(row), "{row} is not a row of the job table");
    }
}

#[tokio::test]
async fn a_job_retried_while_its_partition_is_being_detached_is_never_dropped() {
    let db = Db::partitioned().await;
    // A finished job, old enough, alone in the oldest partition: the first
    // one the purger looks at.
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (state, queued_at, finished_at) VALUES ('completed', now() - interval '9 days', now() - interval '2 days') RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let partition = partition_of(&db, id).await;
    // An operator retries it, in a transaction still open when the purger's
    // first look (which sees the committed, purgeable row) is done.
    let mut retry = db.pool.begin().await.unwrap();
    sqlx::query("UPDATE jobs SET state = 'queued', finished_at = NULL WHERE id = $1")
        .bind(id)
        .execute(&mut *retry)
        .await
        .unwrap();
    let mut o = purger_options();
    o.detach_lock_timeout = Duration::from_secs(30);
    let purger = Purger::new(&db.pool, &jobs(&db).await, o).await.unwrap();
    let purge = tokio::spawn(async move { purger.purge_once().await });
    // The detach waits for the retry's lock on the table...
    db.await_lock_wait(
        "ALTER TABLE%DETACH PARTITION%",
        "the purger never tried to detach",
    )
    .await;
    // ...and once the retry commits, its re-count finds a live job: no drop.
    retry.commit().await.unwrap();
    let purged = purge.await.unwrap().unwrap();
    assert!(
        !purged
            .partitions_dropped
            .iter()
            .any(|p| p.name.ends_with(partition.as_str())),
        "{purged:?}"
    );
    assert_eq!(db.state(id).await, "queued");
    assert_eq!(partition_of(&db, id).await, partition, "still attached");
    // The empty closed partitions after it were dropped in the same pass.
    assert_eq!(purged.partitions_dropped.len(), 8, "{purged:?}");
}

#[tokio::test]
async fn partitions_are_created_ahead_and_an_insert_outside_them_never_fails() {
    let db = Db::partitioned().await;
    let before = partitions(&db).await;
    // Far ahead of every partition: the default partition takes it.
    let far: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (queued_at) VALUES (now() + interval '5 days') RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(partition_of(&db, far).await, "jobs_default");
    let mut o = purger_options();
    o.partitions_ahead = 6;
    let purger = Purger::new(&db.pool, &jobs(&db).await, o).await.unwrap();
    let created = purger.create_partitions().await.unwrap();
    // Days +4 and +6: day +5 holds a row in the default partition, so
    // Postgres cannot create it (the function warns and goes on).
    assert_eq!(created.len(), 2, "{created:?}");
    let after = partitions(&db).await;
    assert_eq!(after.len(), before.len() + 2);
    assert_eq!(partition_of(&db, far).await, "jobs_default");
    assert_eq!(db.state(far).await, "queued");
    // The next pass creates nothing new.
    assert!(
        purger
            .purge_once()
            .await
            .unwrap()
            .partitions_created
            .is_empty()
    );
}

/// Four processes creating the same partitions at once all succeed (the
/// look and the CREATE are not atomic: they take turns).
#[tokio::test]
async fn concurrent_creators_of_the_same_partitions_all_succeed() {
    let db = Db::partitioned().await;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let pool = db.db.pool(1).await.unwrap();
        tasks.push(tokio::spawn(async move {
            sqlx::query_scalar::<_, String>("SELECT jobs_create_partitions(120)")
                .fetch_all(&pool)
                .await
        }));
    }
    let mut created = 0;
    for task in tasks {
        created += task.await.unwrap().expect("no creator fails").len();
    }
    assert_eq!(created, 120 - 3, "each partition created once");
}

async fn keyed_enqueuer(db: &Db) -> Enqueuer {
    let keys = partitioned_keys_sql("jobs", &HashMap::new()).unwrap();
    db.add_columns(|c| *c = OptionalColumns::default(), &[keys])
        .await;
    let mut o = JobTableOptions::new("jobs");
    o.key_column = Some("job_key".into());
    let table = JobTable::new(&db.pool, o).await.unwrap();
    Enqueuer::new(&db.pool, &table).await.unwrap()
}

#[tokio::test]
async fn a_key_is_held_by_one_live_job_across_every_partition() {
    let db = Db::partitioned().await;
    let enqueuer = keyed_enqueuer(&db).await;
    // The holder was queued last week: another partition than today's.
    let old = enqueuer
        .enqueue(
            &NewJob::new()
                .json("payload", json!({"n": 1}))
                .key("k", KeyMode::Replace),
        )
        .await
        .unwrap()
        .id();
    db.execute(&format!(
        "UPDATE jobs SET queued_at = now() - interval '6 days' WHERE id = {old}"
    ))
    .await;
    assert_ne!(partition_of(&db, old).await, "jobs_default");
    let today = NewJob::new().json("payload", json!({"n": 2}));
    assert_eq!(
        enqueuer
            .enqueue(&today.clone().key("k", KeyMode::DedupeOnly))
            .await
            .unwrap(),
        Enqueued::Kept(old)
    );
    assert_eq!(
        enqueuer
            .enqueue(&today.clone().key("k", KeyMode::Replace))
            .await
            .unwrap(),
        Enqueued::Updated(old)
    );
    let live: i64 = db
        .scalar(
            "SELECT count(*) FROM jobs WHERE job_key = 'k' AND id >= $1",
            old,
        )
        .await;
    assert_eq!(live, 1);
    // A second live holder is refused like the plain table's unique index
    // refuses it, whatever its partition.
    let err = sqlx::query(
        "INSERT INTO jobs (job_key, queued_at) VALUES ('k', now() - interval '2 days')",
    )
    .execute(&db.pool)
    .await
    .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().as_deref(),
        Some("23505")
    );

    // The holder finishes: the key is free, a new job takes it today.
    db.execute(&format!(
        "UPDATE jobs SET state = 'failed' WHERE id = {old}"
    ))
    .await;
    let new = enqueuer
        .enqueue(&today.clone().key("k", KeyMode::Replace))
        .await
        .unwrap();
    assert!(
        matches!(new, Enqueued::Inserted(id) if id != old),
        "{new:?}"
    );
    // Retrying the failed old holder now would make two live holders: refused.
    let err = sqlx::query("UPDATE jobs SET state = 'queued' WHERE id = $1")
        .bind(old)
        .execute(&db.pool)
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().as_deref(),
        Some("23505")
    );
    // The key table holds exactly the live holder.
    let held: Vec<(String, i64)> = sqlx::query_as("SELECT job_key, job_id FROM jobs_keys")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(held, [("k".to_owned(), new.id())]);
    // Deleting the holder frees the key too.
    db.execute(&format!("DELETE FROM jobs WHERE id = {}", new.id()))
        .await;
    assert_eq!(db.count("queued").await, 0);
    let again = enqueuer
        .enqueue(&today.key("k", KeyMode::DedupeOnly))
        .await
        .unwrap();
    assert!(matches!(again, Enqueued::Inserted(_)), "{again:?}");
}

/// A keyed insert that breaks a unique index of the application's own is
/// that index's error, not a key "that kept changing".
#[tokio::test]
async fn a_keyed_insert_refused_by_the_applications_own_index_says_so() {
    let db = Db::partitioned().await;
    let enqueuer = keyed_enqueuer(&db).await;
    db.execute(
        "ALTER TABLE jobs ADD COLUMN ext_ref text;
         CREATE UNIQUE INDEX jobs_ext_ref ON jobs (ext_ref, queued_at)",
    )
    .await;
    // One transaction: both rows take the same `queued_at` (its `now()`).
    let mut tx = db.pool.begin().await.unwrap();
    let job = |key: &str| NewJob::new().set("ext_ref", "x").key(key, KeyMode::Replace);
    enqueuer.enqueue_in(&mut tx, &job("a")).await.unwrap();
    let err = enqueuer.enqueue_in(&mut tx, &job("b")).await.unwrap_err();
    let message = err.to_string();
    assert!(message.contains("ext_ref"), "{message}");
    assert!(!message.contains("kept changing"), "{message}");
}

#[tokio::test]
async fn keys_without_the_key_table_and_workflows_are_refused_by_name() {
    let db = Db::partitioned().await;
    db.add_columns(
        |c| c.keys = false,
        &["ALTER TABLE jobs ADD COLUMN job_key text".into()],
    )
    .await;
    let mut o = JobTableOptions::new("jobs");
    o.key_column = Some("job_key".into());
    let err = JobTable::new(&db.pool, o).await.unwrap_err().to_string();
    assert!(err.contains("key table jobs_keys does not exist"), "{err}");
    assert!(err.contains("--partitioned --keys"), "{err}");

    let mut o = JobTableOptions::new("jobs");
    o.workflows = true;
    match JobTable::new(&db.pool, o).await {
        Err(Error::InvalidOption { field, reason }) => {
            assert_eq!(field, "workflows");
            assert!(reason.contains("partitioned"), "{reason}");
        }
        other => panic!("workflows must be refused: {other:?}"),
    }
    // The table without them is all a partitioned table can be: its
    // workflows are refused too.
    let err = dbworker::workflow::Workflows::new(&db.pool, &jobs(&db).await)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("workflows"), "{err}");
}

/// The key triggers keep the key table in step on `job_key` alone: a key
/// column of another name, or a trigger gone, would leave the table empty
/// and let every keyed enqueue insert a new job. Both are refused by name,
/// at once; a reader's role (SELECT only) still describes the intact table.
#[tokio::test]
async fn keys_on_another_column_or_without_their_triggers_are_refused_by_name() {
    let db = Db::partitioned().await;
    let keys = partitioned_keys_sql("jobs", &HashMap::new()).unwrap();
    db.add_columns(
        |c| *c = OptionalColumns::default(),
        &[keys, "ALTER TABLE jobs ADD COLUMN dedupe_key text;".into()],
    )
    .await;
    let refused = |column: &'static str| {
        let pool = db.pool.clone();
        async move {
            let mut o = JobTableOptions::new("jobs");
            o.key_column = Some(column.into());
            match JobTable::new(&pool, o).await {
                Ok(_) => panic!("key_column {column} must be refused"),
                Err(err) => err.to_string(),
            }
        }
    };
    let err = refused("dedupe_key").await;
    assert!(
        err.contains("key column jobs.dedupe_key (key_column)"),
        "{err}"
    );
    assert!(err.contains("watch job_key"), "{err}");

    let role = format!("reader_{}", db.db.name());
    let role = &role[..role.len().min(63)];
    db.execute(&format!(
        "CREATE ROLE \"{role}\" LOGIN; GRANT CONNECT ON DATABASE \"{}\" TO \"{role}\";
         GRANT USAGE ON SCHEMA public TO \"{role}\"; GRANT SELECT ON jobs, jobs_keys TO \"{role}\";",
        db.db.name()
    ))
    .await;
    let options: sqlx::postgres::PgConnectOptions = db.db.url().parse().unwrap();
    let reader = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(options.username(role));
    let mut o = JobTableOptions::new("jobs");
    o.key_column = Some("job_key".into());
    JobTable::new(&reader, o)
        .await
        .expect("a reader describes the keyed table");
    reader.close().await;

    db.execute(
        "DROP TRIGGER jobs_keys_update ON jobs; ALTER TABLE jobs DISABLE TRIGGER jobs_keys_delete;",
    )
    .await;
    let err = refused("job_key").await;
    assert!(err.contains("no trigger jobs_keys_update"), "{err}");
    assert!(
        err.contains("trigger jobs_keys_delete on table jobs is disabled"),
        "{err}"
    );
    assert!(err.contains("--partitioned --keys"), "{err}");
    db.execute(&format!("DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\""))
        .await;
}

/// A partitioned parent is never analyzed by autovacuum (its own
/// `reltuples` stays -1): the estimate sums its leaf partitions'.
#[tokio::test]
async fn the_estimated_rows_sum_the_analyzed_partitions() {
    let db = Db::partitioned().await;
    db.execute(
        "INSERT INTO jobs (state, queued_at) SELECT 'completed', now() - (n % 3) * interval '1 day' FROM generate_series(1, 3000) n;",
    )
    .await;
    let leaves: Vec<String> = sqlx::query_scalar(
        "SELECT relid::regclass::text FROM pg_partition_tree('jobs') WHERE isleaf",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(leaves.len() > 1, "{leaves:?}");
    db.execute(&format!("ANALYZE {}", leaves.join(", "))).await;
    let admin = dbworker::admin::Admin::new(&db.pool, &jobs(&db).await)
        .await
        .unwrap();
    let rows = admin.status().await.unwrap().estimated_rows;
    assert!((2000..=4000).contains(&rows), "{rows}");
}
