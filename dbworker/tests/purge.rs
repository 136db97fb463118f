//! Retention on real Postgres: old finished rows go (deleted or archived) in
//! batches, per-state ages hold, and live rows are never touched. The archive
//! and `dbworker purge --once`: dbworker-cli/tests/purge.rs.

mod common;
#[path = "common/purge.rs"]
mod shared;

use dbworker::maintenance::{PurgeOptions, Purger};
use workerutil::JobState;

use common::Db;
use shared::seed;

#[tokio::test]
async fn old_finished_rows_go_in_batches_and_live_rows_stay() {
    let db = Db::new().await;
    seed(&db).await;
    let mut o = PurgeOptions::new("jobs");
    o.batch_size = 2;
    let purger = Purger::new(&db.pool, o).await.unwrap();
    let purged = purger.purge_once().await.unwrap();
    assert_eq!(
        purged.by_state,
        [
            (JobState::Completed, 5),
            (JobState::Failed, 3),
            (JobState::Canceled, 1)
        ]
    );
    // Recent finished rows and every live row (an errored job will run again)
    // are still there.
    for (state, left) in [
        ("completed", 2),
        ("failed", 1),
        ("canceled", 0),
        ("queued", 2),
        ("processing", 1),
        ("errored", 1),
    ] {
        assert_eq!(db.count(state).await, left, "{state}");
    }
    assert_eq!(purger.purge_once().await.unwrap().total(), 0);
}
