//! Jobs claimed ahead meet a pause however the worker was built: the front
//! door `Client` (typed jobs) and `new_worker` over a `DbStore`, over the
//! table described each way the docs show (columns named without a pause
//! table, `detected`, `typed`, schema-qualified), listening and polling.

use crate::TIMED;
use crate::common::{Db, Job};
use crate::fixtures::ahead::{self, Gate, Gated, listening};

use std::sync::Arc;

use dbworker::{
    Client, ClientOptions, DbStore, Handling, JobArgs, JobHandler, JobTable, JobTableOptions,
    Listen, StoreOptions,
    control::{DEFAULT_PAUSE_TABLE, Pauses, PausesOptions},
    ddl::{notify_trigger_sql, pause_table_sql},
    new_worker,
};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use workerutil::{HandlerError, ShutdownHandle, WorkerSummary};

/// The typed jobs' arguments: the fixture enqueues them as kind `held`.
#[derive(Serialize, Deserialize)]
struct Held {}

impl JobArgs for Held {
    const KIND: &'static str = "held";
}

/// The client's handler of `held` jobs, through the gate.
struct HeldHandler(Arc<Gate>);

impl JobHandler for HeldHandler {
    type Args = Held;

    async fn handle(&self, job: dbworker::Job<'_, Held>) -> Result<(), HandlerError> {
        self.0.start(job.id()).await;
        Ok(())
    }
}

/// How a case runs its worker.
enum Running {
    Worker(ShutdownHandle, JoinHandle<WorkerSummary>),
    Client(Client),
}

impl Running {
    async fn stop(self) {
        match self {
            Running::Worker(shutdown, run) => {
                shutdown.graceful();
                run.await.unwrap();
            }
            Running::Client(client) => {
                client.shutdown().await.unwrap();
            }
        }
    }
}

/// The table with a queue and a kind column (typed jobs need both with the
/// payload), the standard pause table and the notify trigger.
async fn set_up() -> Db {
    let db = Db::new().await;
    let extra = [
        pause_table_sql(DEFAULT_PAUSE_TABLE).unwrap(),
        notify_trigger_sql("jobs", &Default::default(), None).unwrap(),
    ];
    db.add_columns(
        |c| {
            c.queue = true;
            c.kind = true;
        },
        &extra,
    )
    .await;
    db
}

fn with_queue(mut o: JobTableOptions) -> JobTableOptions {
    o.queue_column = Some("queue".into());
    o
}

/// Each way the docs build a worker, and whether it listens: none of them
/// names the pause table, so each must adopt `dbworker_pauses`. A listening
/// store is told by the pause's notification; a polling one looks at the
/// jobs that waited its second.
#[tokio::test]
async fn jobs_claimed_ahead_do_not_start_once_paused_however_the_worker_is_built() {
    let _shared = TIMED.read().await;
    let ways = [
        (
            "new_worker, columns named",
            false,
            JobTableOptions::new("jobs"),
        ),
        (
            "new_worker, columns named",
            true,
            JobTableOptions::new("jobs"),
        ),
        (
            "new_worker, detected",
            false,
            JobTableOptions::detected("jobs"),
        ),
        (
            "new_worker, detected",
            true,
            JobTableOptions::detected("jobs"),
        ),
        ("new_worker, typed", false, JobTableOptions::typed("jobs")),
        (
            "new_worker, qualified",
            true,
            JobTableOptions::new("public.jobs j"),
        ),
        ("Client, typed", false, JobTableOptions::typed("jobs")),
        ("Client, typed", true, JobTableOptions::typed("jobs j")),
        ("Client, detected", true, JobTableOptions::detected("jobs")),
    ];
    for (way, listen, options) in ways {
        let case = format!("{way}, listen {listen}");
        let db = set_up().await;
        let ids = ahead::enqueue(&db.pool).await;
        let table = JobTable::new(&db.pool, with_queue(options)).await.unwrap();
        assert_eq!(
            table.pause_table().as_deref(),
            Some(DEFAULT_PAUSE_TABLE),
            "{case}: the pause table adopted"
        );
        let mut so = StoreOptions::new("ahead");
        if listen {
            so.listen = Listen::TableChannel;
        }
        // The client's way in heartbeat handling, the others' left as the
        // docs leave it (transactional).
        if way.starts_with("Client") && listen {
            so.handling = Handling::Heartbeat;
        }
        let gate = Arc::new(Gate::default());
        let (running, mut events) = if way.starts_with("Client") {
            let mut co = ClientOptions::default();
            co.worker = ahead::worker_options("ahead");
            let client = Client::builder(&db.pool, &table)
                .handler(HeldHandler(gate.clone()))
                .store_options(so)
                .options(co)
                .build()
                .await
                .unwrap();
            // Live before the first claim: going live counts as a pause
            // heard, which would hide the notification's part.
            if listen {
                listening(client.store()).await;
            }
            let events = client.subscribe();
            client.start().unwrap();
            (Running::Client(client), events)
        } else {
            let store = Arc::new(DbStore::<Job>::new(&db.pool, &table, so).await.unwrap());
            if listen {
                listening(&store).await;
            }
            let worker =
                new_worker(store, Gated(gate.clone()), ahead::worker_options("ahead")).unwrap();
            let events = worker.subscribe();
            let shutdown = worker.shutdown_handle();
            (
                Running::Worker(shutdown, tokio::spawn(worker.run())),
                events,
            )
        };
        ahead::claimed_ahead(&db, &case).await;

        // Paused as the docs' `Pauses` example does, from a description of
        // its own naming the pause table.
        let mut named = with_queue(JobTableOptions::new("jobs"));
        named.pause_table = Some(DEFAULT_PAUSE_TABLE.into());
        let operator = JobTable::new(&db.pool, named).await.unwrap();
        let pauses = Pauses::new(&db.pool, &operator, PausesOptions::default())
            .await
            .unwrap();
        assert!(pauses.pause(Some("emails"), "ops").await.unwrap());
        tokio::time::sleep(ahead::after_pause(listen)).await;
        ahead::free_the_handler(&db, &gate, &case).await;
        running.stop().await;
        ahead::assert_put_back(&db, &ids, &gate, &mut events, &case).await;
    }
}
