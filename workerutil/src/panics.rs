//! Panics in user code and in stores: caught, and turned into messages, so a
//! bug in a handler, a hook or a store never takes the worker down.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;

use crate::error::BoxError;

/// Runs a store call, turning a panic inside it into an error, so a bug in a
/// store (or in a scan function it calls) never takes the worker down.
pub(crate) async fn guarded<T>(
    op: &'static str,
    call: impl Future<Output = Result<T, BoxError>>,
) -> Result<T, BoxError> {
    match AssertUnwindSafe(call).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => Err(format!("{op} panicked: {}", panic_message(&panic)).into()),
    }
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
