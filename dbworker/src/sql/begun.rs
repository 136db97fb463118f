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
use sqlx::{PgConnection, Postgres};

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
