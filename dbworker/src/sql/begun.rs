//! A pool connection that is closed, not handed back, if the future using it
//! is dropped before it says it is done.
//!
//! sqlx's `begin` counts a transaction only once the server has answered
//! its `BEGIN`: a future dropped while it waits (a timeout, a cancellation,
//! the `BEGIN` queued behind a pooler with no free server connection) leaves
//! the server in the transaction and sqlx none the wiser. Handed back, the
//! connection passes the pool's test, and the next caller's statements run
//! in that transaction and are never committed: a mark reported written,
//! then lost. Closing it instead makes the server roll that transaction back
//! (a transaction pooler drops its server connection with the client).

use std::ops::{Deref, DerefMut};

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};

/// A connection closed on drop unless [`Begun::done`] said it is idle.
pub(crate) struct Begun(Option<PoolConnection<Postgres>>);

impl Begun {
    pub(crate) fn new(conn: PoolConnection<Postgres>) -> Begun {
        Begun(Some(conn))
    }

    /// Whatever ran on it finished (or failed) without being dropped: sqlx
    /// knows its state, and the pool may have it back.
    pub(crate) fn done(mut self) -> PoolConnection<Postgres> {
        self.0.take().expect("held until done")
    }
}

impl Drop for Begun {
    fn drop(&mut self) {
        // Detached, the pool may open another in its place; dropped, its
        // socket is closed at once.
        if let Some(conn) = self.0.take() {
            drop(conn.detach());
        }
    }
}

impl Deref for Begun {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.0.as_deref().expect("held until done")
    }
}

impl DerefMut for Begun {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.0.as_deref_mut().expect("held until done")
    }
}

/// `pool.begin()` that a dropped caller cannot leave half done: the `BEGIN`
/// runs to its answer in a task of its own, and a transaction nobody is left
/// to take is rolled back as any dropped `sqlx::Transaction` is. For every
/// transaction the crate begins on a pool (the transactional open has its
/// own, [`Begun`]).
pub(crate) async fn begin(pool: &PgPool) -> sqlx::Result<Transaction<'static, Postgres>> {
    let pool = pool.clone();
    let (give, take) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        // Refused (the caller is gone): the transaction is dropped here.
        let _ = give.send(pool.begin().await);
    });
    take.await
        .unwrap_or_else(|_| Err(sqlx::Error::WorkerCrashed))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use dbworker_testkit::pgbouncer::{Bouncer, find};
    use sqlx::{Connection, PgConnection};

    /// Behind PgBouncer with its one server connection taken, a `BEGIN`
    /// waits in the pooler's queue; its caller gives up. Once the server
    /// connection is free, the next statement on the same client connection
    /// commits (sqlx's own `pool.begin()` left it inside the stray
    /// transaction, never committed).
    #[tokio::test]
    async fn a_begin_whose_caller_gave_up_leaves_no_transaction_behind() {
        let binary = match find() {
            Ok(binary) => binary,
            Err(reason) => return dbworker_testkit::skip("the dropped BEGIN test", &reason),
        };
        let db = dbworker_testkit::TestDatabase::new().await.unwrap();
        let mut direct = PgConnection::connect(db.url()).await.unwrap();
        sqlx::raw_sql("CREATE TABLE t (n int)")
            .execute(&mut direct)
            .await
            .unwrap();
        let bouncer = Bouncer::start(&binary, db.url(), 1, true);
        // Not tested before it is handed out: the `BEGIN` is the first thing
        // to wait for the server connection (as on a connection acquired
        // just before the pooler's last server connection was taken).
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect(&bouncer.url())
            .await
            .unwrap();
        let mut holder = PgConnection::connect(&bouncer.url()).await.unwrap();
        let mut held = holder.begin().await.unwrap();
        sqlx::raw_sql("SELECT 1").execute(&mut *held).await.unwrap();

        let gave_up = tokio::time::timeout(Duration::from_millis(300), super::begin(&pool)).await;
        assert!(gave_up.is_err(), "the BEGIN waited in the queue");
        held.commit().await.unwrap();

        sqlx::raw_sql("INSERT INTO t VALUES (1)")
            .execute(&pool)
            .await
            .unwrap();
        let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM t")
            .fetch_one(&mut direct)
            .await
            .unwrap();
        assert_eq!(seen, 1, "the insert committed");
    }
}
