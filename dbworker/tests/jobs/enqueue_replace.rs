//! Replacing a key holder on real Postgres: the new work starts over (no
//! cancel request, resets or checkpoint of the old), a replace that fails
//! after the running holder gave its key up changes nothing, the SQL
//! function replaces like the enqueuer, and a replace drops the old work's
//! row from the progress side table.

use crate::common;

use dbworker::{
    Enqueued, Enqueuer, JobTable, JobTableOptions, KeyMode, NewJob,
    ddl::{OptionalColumns, enqueue_function_sql, partitioned_keys_sql, progress_table_sql},
};
use serde_json::json;

use common::Db;

async fn set_up(partitioned: bool) -> (Db, Enqueuer) {
    let db = if partitioned {
        let db = Db::partitioned().await;
        let keys = partitioned_keys_sql("jobs", &Default::default()).unwrap();
        db.add_columns(
            |c| {
                *c = OptionalColumns::all();
                c.keys = false;
            },
            &[keys],
        )
        .await;
        db
    } else {
        let db = Db::new().await;
        db.add_columns(|c| *c = OptionalColumns::all(), &[]).await;
        db
    };
    let mut o: JobTableOptions = Db::table_options();
    o.key_column = Some("job_key".into());
    o.max_retries_column = Some("max_retries".into());
    o.progress = true;
    let table = JobTable::new(&db.pool, o).await.unwrap();
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    (db, enqueuer)
}

fn job(n: i64, mode: KeyMode) -> NewJob {
    NewJob::new()
        .json("payload", json!({ "n": n }))
        .key("k", mode)
}

/// The holder as a reset leaves a job whose cancel was requested while it
/// ran, after two resets and a checkpoint.
async fn leave_as_reset(db: &Db, id: i64) {
    sqlx::query(
        "UPDATE jobs SET state = 'queued', cancel = true, num_resets = 2, \
         checkpoint = '{\"at\": 5}', progress = '{\"pct\": 50}' WHERE id = $1",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
}

async fn old_work_left(
    db: &Db,
    id: i64,
) -> (
    bool,
    i32,
    Option<serde_json::Value>,
    Option<serde_json::Value>,
) {
    sqlx::query_as("SELECT cancel, num_resets, checkpoint, progress FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_replaced_holder_keeps_no_cancel_request_resets_or_checkpoint_of_the_old_work() {
    for partitioned in [false, true] {
        let (db, enqueuer) = set_up(partitioned).await;
        let id = enqueuer
            .enqueue(&job(1, KeyMode::Replace))
            .await
            .unwrap()
            .id();
        for mode in [KeyMode::Replace, KeyMode::PreserveRunAt] {
            leave_as_reset(&db, id).await;
            let got = enqueuer.enqueue(&job(2, mode)).await.unwrap();
            assert_eq!(got, Enqueued::Updated(id), "{mode:?}");
            assert_eq!(
                old_work_left(&db, id).await,
                (false, 0, None, None),
                "partitioned: {partitioned}, {mode:?}"
            );
        }
    }
}

#[tokio::test]
async fn the_sql_functions_replace_starts_over_and_takes_the_new_run_at_like_the_enqueuer() {
    let (db, _) = set_up(false).await;
    let ddl = enqueue_function_sql("jobs", &Default::default(), OptionalColumns::all()).unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&db.pool)
        .await
        .unwrap();
    let id: i64 = sqlx::query_scalar(
        "SELECT jobs_enqueue('{\"payload\": {\"n\": 1}}', run_at => now() + interval '1 hour', job_key => 'k')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    leave_as_reset(&db, id).await;
    let replaced: i64 =
        sqlx::query_scalar("SELECT jobs_enqueue('{\"payload\": {\"n\": 2}}', job_key => 'k')")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(replaced, id);
    assert_eq!(old_work_left(&db, id).await, (false, 0, None, None));
    let due_now: bool = db
        .scalar(
            "SELECT process_after IS NULL OR process_after <= now() FROM jobs WHERE id = $1",
            id,
        )
        .await;
    assert!(
        due_now,
        "replace without run_at: due at once, as if newly enqueued"
    );
    let refused = sqlx::query_scalar::<_, i64>("SELECT jobs_enqueue(max_retries => -1)")
        .fetch_one(&db.pool)
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("max_retries must be 0 or more"),
        "{refused}"
    );
    let too_many = NewJob::new().max_retries(u32::MAX);
    let (_, enqueuer) = (
        &db,
        Enqueuer::new(
            &db.pool,
            &db.table_with(|o| o.max_retries_column = Some("max_retries".into()))
                .await,
        )
        .await
        .unwrap(),
    );
    let err = enqueuer.enqueue(&too_many).await.unwrap_err();
    assert!(err.to_string().contains("max_retries"), "{err}");
}

/// The second insert of a replace fails (here a trigger refuses it once the
/// running holder gave its key up): the holder keeps its key and retries.
#[tokio::test]
async fn a_replace_that_fails_after_the_running_holder_gave_its_key_up_changes_nothing() {
    for partitioned in [false, true] {
        let (db, enqueuer) = set_up(partitioned).await;
        let id = enqueuer
            .enqueue(&job(1, KeyMode::Replace).max_retries(5))
            .await
            .unwrap()
            .id();
        sqlx::query("UPDATE jobs SET state = 'processing', num_failures = 1 WHERE id = $1")
            .bind(id)
            .execute(&db.pool)
            .await
            .unwrap();
        sqlx::raw_sql(
            "CREATE FUNCTION refuse_after_release() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN IF EXISTS (SELECT 1 FROM jobs WHERE state = 'processing' AND job_key IS NULL) THEN \
             RAISE EXCEPTION 'injected: the new job cannot be inserted'; END IF; RETURN NEW; END $$; \
             CREATE TRIGGER refuse_after_release BEFORE INSERT ON jobs \
             FOR EACH ROW EXECUTE FUNCTION refuse_after_release();",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        let err = enqueuer
            .enqueue(&job(2, KeyMode::Replace))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("injected"), "{err}");
        let (key, max_retries): (Option<String>, Option<i32>) =
            sqlx::query_as("SELECT job_key, max_retries FROM jobs WHERE id = $1")
                .bind(id)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(
            (key.as_deref(), max_retries),
            (Some("k"), Some(5)),
            "partitioned: {partitioned}"
        );
        let count: i64 = db
            .scalar("SELECT count(*) FROM jobs WHERE id >= $1", id)
            .await;
        assert_eq!(count, 1, "partitioned: {partitioned}");
    }
}

/// A keyed table that keeps progress in its side table
/// (`migration --progress-table`), plain or partitioned.
async fn set_up_side(partitioned: bool) -> (Db, Enqueuer) {
    let db = if partitioned {
        let db = Db::partitioned().await;
        let keys = partitioned_keys_sql("jobs", &Default::default()).unwrap();
        db.add_columns(|c| c.keys = false, &[keys]).await;
        db
    } else {
        let db = Db::new().await;
        db.add_columns(|c| c.keys = true, &[]).await;
        db
    };
    db.execute(&progress_table_sql("jobs").unwrap()).await;
    let mut o: JobTableOptions = Db::table_options();
    o.key_column = Some("job_key".into());
    o.progress = true;
    let table = JobTable::new(&db.pool, o).await.unwrap();
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    (db, enqueuer)
}

/// The old work's side row, as an errored attempt leaves it.
async fn leave_side_row(db: &Db, id: i64) {
    sqlx::query("UPDATE jobs SET state = 'errored', num_failures = 1 WHERE id = $1; ")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO jobs_progress (job_id, progress, checkpoint, progress_seq) \
         VALUES ($1, '{\"pct\": 50}', '{\"at\": 5}', 3)",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
}

async fn side_rows(db: &Db, id: i64) -> i64 {
    db.scalar("SELECT count(*) FROM jobs_progress WHERE job_id = $1", id)
        .await
}

/// A replaced holder's progress and checkpoint in the side table belong to
/// the old work: the replace deletes them in its statement (the enqueuer,
/// plain and partitioned, and the SQL function); a dedupe keeps them with
/// the holder it keeps.
#[tokio::test]
async fn a_replace_drops_the_old_works_checkpoint_from_the_side_table() {
    for partitioned in [false, true] {
        let (db, enqueuer) = set_up_side(partitioned).await;
        let id = enqueuer
            .enqueue(&job(1, KeyMode::Replace))
            .await
            .unwrap()
            .id();
        leave_side_row(&db, id).await;
        let kept = enqueuer
            .enqueue(&job(2, KeyMode::DedupeOnly))
            .await
            .unwrap();
        assert_eq!(kept, Enqueued::Kept(id), "partitioned: {partitioned}");
        assert_eq!(side_rows(&db, id).await, 1, "partitioned: {partitioned}");
        for mode in [KeyMode::Replace, KeyMode::PreserveRunAt] {
            if side_rows(&db, id).await == 0 {
                leave_side_row(&db, id).await;
            }
            let got = enqueuer.enqueue(&job(3, mode)).await.unwrap();
            assert_eq!(got, Enqueued::Updated(id), "{mode:?}");
            assert_eq!(
                side_rows(&db, id).await,
                0,
                "partitioned: {partitioned}, {mode:?}: the old work's checkpoint was kept"
            );
        }
        // A new job (no holder) deletes nothing of another's.
        leave_side_row(&db, id).await;
        let other = enqueuer
            .enqueue(
                &NewJob::new()
                    .json("payload", json!({}))
                    .key("other", KeyMode::Replace),
            )
            .await
            .unwrap()
            .id();
        assert_ne!(other, id);
        assert_eq!(side_rows(&db, id).await, 1);
        if partitioned {
            continue;
        }
        let mut columns = OptionalColumns::default();
        columns.keys = true;
        let ddl = enqueue_function_sql("jobs", &Default::default(), columns).unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
            .execute(&db.pool)
            .await
            .unwrap();
        let replaced: i64 =
            sqlx::query_scalar("SELECT jobs_enqueue('{\"payload\": {\"n\": 4}}', job_key => 'k')")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(replaced, id);
        assert_eq!(
            side_rows(&db, id).await,
            0,
            "the SQL function kept the old work's checkpoint"
        );
    }
}

/// A replaced holder that was waiting for a signal waits for nothing: the
/// new work runs at its own run time, and a signal to the old wait's name
/// does not wake it early (before, `awaiting` stayed, and the signal made
/// the new work due at once); under `PreserveRunAt` the old wait's timeout
/// is no schedule to keep. The enqueuer and the SQL function alike.
#[tokio::test]
async fn a_replaced_waiting_holder_waits_for_nothing_and_keeps_no_wait_timeout() {
    let (db, _) = set_up(false).await;
    db.execute(&dbworker::ddl::signals_sql("jobs", &Default::default()).unwrap())
        .await;
    let mut o: JobTableOptions = Db::table_options();
    o.key_column = Some("job_key".into());
    o.max_retries_column = Some("max_retries".into());
    o.signals = true;
    let table = JobTable::new(&db.pool, o).await.unwrap();
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let ddl = enqueue_function_sql("jobs", &Default::default(), OptionalColumns::all()).unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&db.pool)
        .await
        .unwrap();
    let id = enqueuer
        .enqueue(&job(1, KeyMode::Replace))
        .await
        .unwrap()
        .id();
    // Waiting for "paid", timing out in an hour.
    let wait = || async {
        db.execute("UPDATE jobs SET awaiting = 'paid', process_after = now() + interval '1 hour'")
            .await;
    };
    // Seconds from now to the job's run time, and what it waits for.
    let due = || async {
        sqlx::query_as::<_, (f64, Option<String>)>(
            "SELECT EXTRACT(EPOCH FROM process_after - now())::float8, awaiting FROM jobs WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
    };
    // The old wait's signal arrives: the new work still waits for nothing
    // and runs in a day.
    let signaled_and_still_due_in_a_day = async |case: &str| {
        sqlx::query("SELECT jobs_signal($1, 'paid')")
            .bind(id)
            .execute(&db.pool)
            .await
            .unwrap();
        let (secs, awaiting) = due().await;
        assert_eq!(awaiting, None, "{case}");
        assert!(
            (secs - 86_400.0).abs() < 60.0,
            "{case}: due in {secs} s, not in a day"
        );
    };
    let in_a_day = std::time::Duration::from_secs(86_400);
    for mode in [KeyMode::Replace, KeyMode::PreserveRunAt] {
        wait().await;
        let got = enqueuer
            .enqueue(&job(2, mode).run_after(in_a_day))
            .await
            .unwrap();
        assert_eq!(got, Enqueued::Updated(id), "{mode:?}");
        signaled_and_still_due_in_a_day(&format!("{mode:?}")).await;
    }
    for mode in ["replace", "preserve_run_at"] {
        wait().await;
        sqlx::query(
            "SELECT jobs_enqueue('{\"payload\": {}}', run_at => now() + interval '1 day', job_key => 'k', key_mode => $1)",
        )
        .bind(mode)
        .execute(&db.pool)
        .await
        .unwrap();
        signaled_and_still_due_in_a_day(&format!("SQL {mode}")).await;
    }
}
