//! `Consumer`: what a log consumer implements, and [`Consumers`], the list a
//! [`ConsumerGroup`](super::ConsumerGroup) runs (consumers of different types
//! side by side).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use sqlx::PgConnection;
use workerutil::BoxError;

/// A named consumer of the log. Its writes through `tx` commit together with
/// its checkpoint's advance (exactly once within Postgres); effects outside
/// Postgres are at least once, so make them idempotent. Implement
/// [`handle`](Self::handle) with `async fn`.
pub trait Consumer<E>: Send + Sync + 'static {
    /// The consumer's name: its checkpoint and its assignment.
    fn name(&self) -> &str;

    /// The aggregate types this consumer reads (the seed's `ScopedConsumer`).
    /// Empty (the default): every event. The store filters in SQL on
    /// `LogOptions::aggregate_type_column`, so the consumer never receives
    /// events of other types, and its checkpoint still advances past them.
    fn aggregate_types(&self) -> Vec<String> {
        Vec::new()
    }

    /// Handles one event, in position order, inside the slice's transaction.
    /// An error rolls the whole slice back; it is retried from the same
    /// position.
    fn handle(
        &self,
        tx: &mut PgConnection,
        event: &E,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;
}

/// A shared consumer is a consumer: keep an `Arc` to read its state.
impl<E: 'static, C: Consumer<E>> Consumer<E> for Arc<C> {
    fn name(&self) -> &str {
        (**self).name()
    }

    fn aggregate_types(&self) -> Vec<String> {
        (**self).aggregate_types()
    }

    fn handle(
        &self,
        tx: &mut PgConnection,
        event: &E,
    ) -> impl Future<Output = Result<(), BoxError>> + Send {
        (**self).handle(tx, event)
    }
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A [`Consumer`] behind a pointer, so consumers of different types share
/// one list (`Consumer::handle`'s `impl Future` cannot be called through
/// `dyn`).
pub(crate) trait AnyConsumer<E>: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn aggregate_types(&self) -> Vec<String>;
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a E,
    ) -> BoxFuture<'a, Result<(), BoxError>>;
}

impl<E, C: Consumer<E>> AnyConsumer<E> for C {
    fn name(&self) -> &str {
        Consumer::name(self)
    }

    fn aggregate_types(&self) -> Vec<String> {
        Consumer::aggregate_types(self)
    }

    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a E,
    ) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(Consumer::handle(self, tx, event))
    }
}

/// The consumers a [`ConsumerGroup`](super::ConsumerGroup) runs, of any
/// types: `Consumers::new().add(Orders).add(Emails)`, or collected from an
/// iterator of one type.
pub struct Consumers<E> {
    pub(crate) list: Vec<Arc<dyn AnyConsumer<E>>>,
}

impl<E: 'static> std::fmt::Debug for Consumers<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.list.iter().map(|c| c.name()).collect();
        f.debug_tuple("Consumers").field(&names).finish()
    }
}

impl<E: 'static> Default for Consumers<E> {
    fn default() -> Self {
        Consumers::new()
    }
}

impl<E: 'static> Consumers<E> {
    /// No consumer yet.
    pub fn new() -> Consumers<E> {
        Consumers { list: Vec::new() }
    }

    /// Adds `consumer`.
    #[allow(clippy::should_implement_trait)]
    pub fn add(mut self, consumer: impl Consumer<E>) -> Consumers<E> {
        self.list.push(Arc::new(consumer));
        self
    }

    /// How many consumers the list holds.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether the list holds no consumer.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

impl<E: 'static, C: Consumer<E>> FromIterator<C> for Consumers<E> {
    fn from_iter<I: IntoIterator<Item = C>>(iter: I) -> Consumers<E> {
        iter.into_iter().fold(Consumers::new(), Consumers::add)
    }
}
