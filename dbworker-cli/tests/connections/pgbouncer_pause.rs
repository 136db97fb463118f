//! `dbworker pause` through a PgBouncer in transaction mode that another
//! program shares reaches a listening worker whose store runs through the
//! same PgBouncer: the jobs it claimed ahead go back to the queue, none
//! started. The pause's notification goes out at the commit of the
//! transaction PgBouncer ran on one server connection; the worker hears it
//! on its listener's direct session (`listen_url`).

use crate::cli;
use crate::common::{Db, Job};
use crate::fixtures::ahead::{self, Gate, Gated, listening};

use dbworker_testkit::pgbouncer as bouncer;
use std::process::Command;
use std::sync::Arc;

use dbworker::{
    DbStore, Handling, JobTable, JobTableOptions, Listen, Pooler, StoreOptions,
    control::DEFAULT_PAUSE_TABLE,
    ddl::{notify_trigger_sql, pause_table_sql},
    new_worker,
};
use workerutil::CancellationToken;

use bouncer::Bouncer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_from_the_command_line_through_a_shared_pgbouncer_holds_jobs_claimed_ahead() {
    let case = "dbworker pause through PgBouncer";
    let db = Db::new().await;
    let Some(b) = Bouncer::start_or_skip(case, db.db.url(), 4) else {
        return;
    };
    db.add_columns(
        |c| {
            c.queue = true;
            c.kind = true;
        },
        &[
            pause_table_sql(DEFAULT_PAUSE_TABLE).unwrap(),
            notify_trigger_sql("jobs", &Default::default(), None).unwrap(),
        ],
    )
    .await;
    assert_eq!(b.leave_named_statements().await, 60);
    let stop_other = CancellationToken::new();
    let other = ahead::other_program(b.pool(2).await, stop_other.clone());

    let ids = ahead::enqueue(&db.pool).await;
    let pool = b.pool(6).await;
    Pooler::Transaction {
        listen_url: Some(db.db.url().to_owned()),
    }
    .apply_to(&pool);
    let mut t = JobTableOptions::new("jobs");
    t.queue_column = Some("queue".into());
    let table = JobTable::new(&pool, t).await.unwrap();
    let mut so = StoreOptions::new("ahead");
    so.handling = Handling::Heartbeat;
    so.listen = Listen::TableChannel;
    let store = Arc::new(DbStore::<Job>::new(&pool, &table, so).await.unwrap());
    listening(&store).await;
    let gate = Arc::new(Gate::default());
    let worker = new_worker(store, Gated(gate.clone()), ahead::worker_options("ahead")).unwrap();
    let mut events = worker.subscribe();
    let shutdown = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    ahead::claimed_ahead(&db, case).await;

    let url = b.url();
    let paused = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_dbworker"))
            .args(["pause", "--queue", "emails", "--table", "jobs"])
            .env("DATABASE_URL", url)
            .env("DBWORKER_POOLER", "transaction")
            .env_remove("DBWORKER_LISTEN_URL")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(cli::ok(&paused).trim(), "paused queue emails");
    // Told by the notification: well within the polling worker's second.
    tokio::time::sleep(ahead::after_pause(true)).await;
    ahead::free_the_handler(&db, &gate, case).await;
    shutdown.graceful();
    run.await.unwrap();
    stop_other.cancel();
    assert!(other.await.unwrap() > 0, "the other program ran");
    ahead::assert_put_back(&db, &ids, &gate, &mut events, case).await;
    let log = b.log();
    assert!(!log.contains("ERROR"), "PgBouncer logged errors:\n{log}");
}
