//! Every model checked exhaustively, and each with its guard removed.
//! One test binary, so the models are checked in parallel.

mod checkpoint;
mod claim;
mod leader;
mod progress;
mod progress_beats;
mod signal;
mod signal_consume;
mod signal_key;
mod workflow;
