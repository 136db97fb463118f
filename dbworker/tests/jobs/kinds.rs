//! Many kinds of job in one table on real Postgres: a `KindRegistry` per
//! worker, dequeues restricted to the kinds a worker handles, and an unknown
//! kind failed with a clear message.

use crate::common;

use std::sync::{Arc, Mutex};

use dbworker::{
    DbConditions, DbJob, DbStore, Enqueuer, JobTable, NewJob, StoreOptions, new_worker,
};
use workerutil::{Handler, HandlerError, JobContext, KindRegistry, Record};

use common::Db;

#[derive(Debug, sqlx::FromRow)]
struct KindJob {
    id: i64,
    kind: String,
}

impl Record for KindJob {
    fn id(&self) -> i64 {
        self.id
    }
}

type Store = DbStore<KindJob>;

/// Records the ids it ran.
#[derive(Clone, Default)]
struct Ran(Arc<Mutex<Vec<i64>>>);
impl Handler<Store> for Ran {
    async fn handle(
        &self,
        job: &mut DbJob<KindJob>,
        _ctx: &JobContext<Store>,
    ) -> Result<(), HandlerError> {
        self.0.lock().unwrap().push(job.record().id);
        Ok(())
    }
}

async fn store(db: &Db, table: &JobTable) -> Arc<Store> {
    let mut o = StoreOptions::new("kinds");
    o.max_num_retries = 0;
    Arc::new(DbStore::new(&db.pool, table, o).await.unwrap())
}

fn options(jobs: u64) -> workerutil::WorkerOptions {
    let mut o = workerutil::WorkerOptions::new("kinds");
    o.num_total_jobs = Some(jobs);
    o
}

#[tokio::test]
async fn workers_take_their_kinds_and_an_unknown_kind_fails_clearly() {
    let db = Db::new().await;
    db.add_columns(|c| c.kind = true, &[]).await;
    let table = db.table_with(|t| t.kind_column = Some("kind".into())).await;
    let enqueuer = Enqueuer::new(&db.pool, &table).await.unwrap();
    let kinds = ["email", "report", "email", "fax", "report", "email"];
    let jobs: Vec<NewJob> = kinds.iter().map(|k| NewJob::new().kind(*k)).collect();
    let ids = enqueuer.enqueue_many(&jobs).await.unwrap();
    let ids_of = |kind: &str| -> Vec<i64> {
        ids.iter()
            .zip(kinds)
            .filter(|(_, k)| *k == kind)
            .map(|(id, _)| *id)
            .collect()
    };

    // The mail worker claims only e-mails: the rest stay queued for others.
    let mailer = Ran::default();
    let registry = KindRegistry::<Store>::new(|j: &KindJob| j.kind.as_str())
        .register("email", mailer.clone())
        .unwrap()
        .restrict_dequeue(|kinds| DbConditions::new().column_in("j.kind", kinds));
    new_worker(store(&db, &table).await, registry, options(3))
        .unwrap()
        .run()
        .await;
    let mut ran = mailer.0.lock().unwrap().clone();
    ran.sort_unstable();
    assert_eq!(ran, ids_of("email"));
    for id in ids_of("report").into_iter().chain(ids_of("fax")) {
        assert_eq!(db.state(id).await, "queued", "job {id}");
    }

    // An unrestricted worker takes everything left; a kind it has no handler
    // for fails at once, saying why.
    let reporter = Ran::default();
    let registry = KindRegistry::<Store>::new(|j: &KindJob| j.kind.as_str())
        .register("report", reporter.clone())
        .unwrap();
    new_worker(store(&db, &table).await, registry, options(3))
        .unwrap()
        .run()
        .await;
    let mut ran = reporter.0.lock().unwrap().clone();
    ran.sort_unstable();
    assert_eq!(ran, ids_of("report"));
    let fax = ids_of("fax")[0];
    assert_eq!(db.state(fax).await, "failed");
    let message: String = db
        .scalar("SELECT failure_message FROM jobs WHERE id = $1", fax)
        .await;
    assert_eq!(
        message,
        "no handler is registered for kind \"fax\" (registered: report)"
    );
}
