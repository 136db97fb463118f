//! Stopping the long-running commands (`reset`, `purge`, `ui`) on a signal.

use tokio_util::sync::CancellationToken;

/// A token canceled by SIGINT or SIGTERM.
pub(crate) fn stop_on_signal() -> CancellationToken {
    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        on_signal.cancel();
    });
    stop
}

async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
