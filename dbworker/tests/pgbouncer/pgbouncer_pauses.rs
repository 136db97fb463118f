//! Jobs claimed ahead meet a pause through PgBouncer in transaction mode,
//! a pooler another program shares (it left its named statements on every
//! server connection and keeps running transactions through it): the pause
//! is written through PgBouncer, its notification sent in the pause's
//! transaction, and a worker whose store runs through PgBouncer starts none
//! of the jobs it claimed ahead. Listening (the listener's session straight
//! to the server, `listen_url`) and polling (no `listen_url`). Skipped,
//! saying why, without pgbouncer (.ci/run installs it).

use crate::common::{Db, Job};
use crate::fixtures::ahead::{self, Gate, Gated, listening};

use dbworker_testkit::pgbouncer as bouncer;
use std::sync::Arc;

use dbworker::{
    DbStore, Handling, JobTable, JobTableOptions, Listen, Pooler, StoreOptions,
    control::{DEFAULT_PAUSE_TABLE, Pauses, PausesOptions},
    ddl::{notify_trigger_sql, pause_table_sql},
    new_worker,
};
use tokio_util::sync::CancellationToken;

use crate::POOLER;
use bouncer::Bouncer;

/// The application name the listener's direct session carries.
const LISTENER_NAME: &str = "dbworker_pause_listener";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_claimed_ahead_do_not_start_once_paused_through_a_shared_pgbouncer() {
    let _turn = POOLER.lock().await;
    for (listen, handling) in [
        (true, Handling::Transactional),
        (false, Handling::Heartbeat),
    ] {
        let case = format!("through PgBouncer, listen {listen}, {handling:?}");
        let db = Db::new().await;
        let Some(bouncer) = Bouncer::start_or_skip("claimed ahead, paused", db.db.url(), 6) else {
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
        assert_eq!(bouncer.leave_named_statements().await, 60);
        let stop_other = CancellationToken::new();
        let other = ahead::other_program(bouncer.pool(2).await, stop_other.clone());
        let listen_url = listen.then(|| {
            let url = db.db.url();
            let sep = if url.contains('?') { '&' } else { '?' };
            format!("{url}{sep}application_name={LISTENER_NAME}")
        });
        dbworker::set_pooler(Pooler::Transaction { listen_url });

        let ids = ahead::enqueue(&db.pool).await;
        let pool = bouncer.pool(8).await;
        let mut t = JobTableOptions::new("jobs");
        t.queue_column = Some("queue".into());
        let table = JobTable::new(&pool, t).await.unwrap();
        let mut so = StoreOptions::new("ahead");
        so.handling = handling;
        so.listen = Listen::TableChannel;
        let store = Arc::new(DbStore::<Job>::new(&pool, &table, so).await.unwrap());
        if listen {
            listening(&store).await;
            let sessions: Vec<String> = sqlx::query_scalar(
                "SELECT application_name FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'",
            )
            .fetch_all(&db.pool)
            .await
            .unwrap();
            assert_eq!(
                sessions,
                [LISTENER_NAME],
                "{case}: LISTEN on the direct session"
            );
        }
        let gate = Arc::new(Gate::default());
        let worker =
            new_worker(store, Gated(gate.clone()), ahead::worker_options("ahead")).unwrap();
        let mut events = worker.subscribe();
        let shutdown = worker.shutdown_handle();
        let run = tokio::spawn(worker.run());
        ahead::claimed_ahead(&db, &case).await;

        // Paused through PgBouncer: its notification goes out at the commit
        // of the transaction PgBouncer ran on one server connection.
        let mut named = JobTableOptions::new("jobs");
        named.queue_column = Some("queue".into());
        named.pause_table = Some(DEFAULT_PAUSE_TABLE.into());
        let paused_through = bouncer.pool(2).await;
        let operator = JobTable::new(&paused_through, named).await.unwrap();
        let pauses = Pauses::new(&paused_through, &operator, PausesOptions::default())
            .await
            .unwrap();
        assert!(pauses.pause(Some("emails"), "ops").await.unwrap());
        tokio::time::sleep(ahead::after_pause(listen)).await;
        ahead::free_the_handler(&db, &gate, &case).await;
        shutdown.graceful();
        run.await.unwrap();
        stop_other.cancel();
        assert!(other.await.unwrap() > 0, "{case}: the other program ran");
        ahead::assert_put_back(&db, &ids, &gate, &mut events, &case).await;
        let log = bouncer.log();
        assert!(
            !log.contains("ERROR"),
            "{case}: PgBouncer logged errors:\n{log}"
        );
    }
}
