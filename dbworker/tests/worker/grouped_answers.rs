//! Each job marked through a group is told what became of its own attempt,
//! even when a stale attempt of the same job lands in the same group as its
//! successor (both of this process: the job was reset and claimed again).

use crate::common;

use serde_json::json;
use workerutil::{Job as _, Store};

use dbworker::{DbConditions, Handling};

use common::Db;

#[tokio::test]
async fn a_stale_attempt_grouped_with_its_successor_is_told_it_was_not_marked() {
    let db = Db::new().await;
    let id = db.enqueue(1, json!({})).await[0];
    let mut o = db.options();
    o.handling = Handling::Heartbeat;
    // Claims look at the whole queue, so the requeued row is found at once.
    o.claim.claim_cursor = None;
    let store = db.store_on(&db.table().await, o).await;
    let claim = async || {
        let mut jobs = store
            .dequeue("host", &DbConditions::default(), 1)
            .await
            .unwrap();
        assert_eq!(jobs.len(), 1, "the job is claimed");
        jobs.remove(0)
    };
    let mut stale = claim().await;
    // A resetter's requeue behind the first attempt's back.
    db.execute(&format!(
        "UPDATE jobs SET state = 'queued', started_at = NULL WHERE id = {id}"
    ))
    .await;
    let mut live = claim().await;
    assert_ne!(stale.lease().token, live.lease().token);

    // Both marks are queued before the writer runs (one runtime thread), so
    // they meet in one group.
    let (stale_marked, live_marked) = tokio::join!(
        store.mark_complete(&mut stale),
        store.mark_complete(&mut live)
    );
    assert!(
        !stale_marked.unwrap(),
        "the stale attempt was told it marked the job"
    );
    assert!(
        live_marked.unwrap(),
        "the live attempt's completion was written"
    );
    assert_eq!(db.state(id).await, "completed");
    store.close().await;
}
