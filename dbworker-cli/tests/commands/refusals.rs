//! Operator input the commands refuse with a clear error and a non-zero
//! exit, changing nothing: a blank queue name for `pause` and `resume`.

use crate::cli;
use crate::common;

use dbworker::{control::DEFAULT_PAUSE_TABLE, ddl::pause_table_sql};

use cli::{dbworker, ok, refused};
use common::Db;

async fn pauses(db: &Db) -> Vec<String> {
    sqlx::query_scalar("SELECT queue FROM dbworker_pauses ORDER BY queue")
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

/// An empty or blank `--queue` once paused (or resumed) a queue named so, or
/// the whole table through the library; a padded one is a typo.
#[tokio::test]
async fn pause_and_resume_refuse_a_blank_or_padded_queue_name() {
    let db = Db::new().await;
    db.add_columns(
        |c| c.queue = true,
        &[pause_table_sql(DEFAULT_PAUSE_TABLE).unwrap()],
    )
    .await;
    for queue in ["", "  ", " mail"] {
        let err = refused(&dbworker(&db, &["pause", "--queue", queue]));
        assert!(err.contains("queue"), "{queue:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    for queue in ["", "  "] {
        let err = refused(&dbworker(&db, &["resume", "--queue", queue]));
        assert!(err.contains("--queue: name the queue"), "{queue:?}: {err}");
    }
    assert_eq!(pauses(&db).await, Vec::<String>::new());
    ok(&dbworker(&db, &["pause"]));
    let err = refused(&dbworker(&db, &["resume", "--queue", ""]));
    assert!(err.contains("--queue"), "{err}");
    assert_eq!(pauses(&db).await, ["*"], "the whole table stays paused");
    ok(&dbworker(&db, &["pause", "--queue", "mail"]));
    assert_eq!(pauses(&db).await, ["*", "mail"]);
}
