//! Panics in user code and in stores: caught, and turned into messages, so a
//! bug in a handler, a hook or a store never takes the worker down.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;

use crate::error::BoxError;

/// Runs a store call, turning a panic inside it into an error, so a bug in a
/// store (or in a scan function it calls) never takes the worker down.
///
/// The call is boxed: a store's native `async fn` futures are kilobytes
/// (a `DbStore` mark holds its statement, its connection checkout and the
/// grouped completer's state), and inline they would make every job task's
/// future as large as the largest of them, copied as it moves; one small
/// allocation per call (what `#[async_trait]` made before) is cheaper.
/// Boxed before the returned future exists, so not even that one holds the
/// call inline.
pub(crate) fn guarded<T>(
    op: &'static str,
    call: impl Future<Output = Result<T, BoxError>>,
) -> impl Future<Output = Result<T, BoxError>> {
    let call = Box::pin(call);
    async move {
        match AssertUnwindSafe(call).catch_unwind().await {
            Ok(result) => result,
            Err(panic) => Err(format!("{op} panicked: {}", panic_message(&panic)).into()),
        }
    }
}

/// Runs a synchronous hook (`kind`, `retry`, `max_runtime`), turning a
/// panic inside it into its message.
pub(crate) fn caught<T>(hook: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(AssertUnwindSafe(hook)).map_err(|panic| panic_message(&panic))
}

/// The text of a panic payload (for stores that catch panics in user code,
/// such as a scan function).
pub fn panic_message(panic: &Box<dyn Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guarded_call_is_as_small_as_a_box_whatever_the_store_future_holds() {
        let large = async {
            let buffer = [7u8; 4096];
            std::future::ready(()).await;
            Ok::<_, BoxError>(buffer.iter().map(|b| usize::from(*b)).sum::<usize>())
        };
        assert!(std::mem::size_of_val(&large) > 4096);
        let call = guarded("large", large);
        assert!(
            std::mem::size_of_val(&call) <= 64,
            "{} bytes",
            std::mem::size_of_val(&call)
        );
    }

    #[tokio::test]
    async fn a_panicking_call_is_an_error_naming_the_operation() {
        let err = guarded::<()>("mark_complete", async { panic!("scan failed") })
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "mark_complete panicked: scan failed");
    }
}
