//! Typed jobs: a Rust type per kind of job, serialized into the job's
//! `jsonb` payload column on enqueue and deserialized for its handler.
//!
//! - [`JobArgs`]: the arguments, their [`KIND`](JobArgs::KIND) and the
//!   kind's [`JobDefaults`] (queue, priority, retries, timeout).
//! - [`Enqueuer::enqueue`](crate::Enqueuer::enqueue) takes the arguments
//!   ([`IntoJob`](crate::enqueue::IntoJob)), or a [`NewJob::args`](crate::NewJob::args)
//!   with every [`NewJob`](crate::NewJob) option.
//! - [`JobHandler`]: receives a [`Job`] (the arguments and the claimed job);
//!   added per kind to a [`Client`](crate::Client) or [`Handlers`], or alone
//!   through [`ArgsHandler`].
//! - [`ArgsRecord`]: a record that carries the kind and the payload;
//!   [`TypedJob`] is a ready-made one.
//!
//! The guide's "Typed jobs" chapter walks through them.

mod args;
mod defaults;
mod handler;
mod record;
mod registry;
mod typed;

pub use args::JobArgs;
pub(crate) use args::check_kind;
pub use defaults::JobDefaults;
pub use handler::{ArgsHandler, JobHandler};
pub use record::{ArgsRecord, TypedJob};
pub use registry::Handlers;
pub use typed::Job;
