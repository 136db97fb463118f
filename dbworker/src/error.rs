//! The crate's one error type.

/// Errors returned by `dbworker`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A handler's result ([`DbJob::set_result`](crate::DbJob::set_result))
    /// is larger than the store's `max_result_bytes`: it is not stored, and
    /// the job fails with this message instead of completing.
    #[error(
        "the job's result is {bytes} bytes of JSON, over the cap of {cap} bytes (StoreOptions::max_result_bytes)"
    )]
    ResultTooLarge {
        /// The result's size, in bytes of its JSON text.
        bytes: usize,
        /// The cap.
        cap: usize,
    },
    /// A value to store holds a NUL character (U+0000), which PostgreSQL's
    /// `text` and `jsonb` cannot hold: it is refused before any statement
    /// runs (a result fails its job with this message instead of completing).
    #[error("{what} holds a NUL character (U+0000), which PostgreSQL cannot store")]
    NulCharacter {
        /// What holds it, and where: `the job's result (at $.s)`.
        what: String,
    },
    /// A value did not convert between Rust and JSON: a job's arguments
    /// ([`JobArgs`](crate::job::JobArgs)), a result, an upstream job's
    /// result. `path` says where in the value, as `$.items[2].to`.
    #[error("{what} (at {path}): {source}")]
    Json {
        /// What was converted: `the arguments of kind "send_email"`.
        what: String,
        /// Where in the value the conversion failed (`$` for the whole value).
        path: String,
        /// serde's error.
        #[source]
        source: serde_json::Error,
    },
    /// An options struct failed validation.
    #[error("invalid option `{field}`: {reason}")]
    InvalidOption {
        /// The field that is wrong.
        field: &'static str,
        /// Why it is wrong.
        reason: String,
    },
    /// The job table or view does not have the shape the options describe.
    /// Every problem found is listed.
    #[error("the job table does not match its description:\n  - {}", problems.join("\n  - "))]
    Schema {
        /// One line per missing or mistyped table, view or column.
        problems: Vec<String>,
    },
    /// The database refuses what the service needs: a missing grant (each
    /// named with the `GRANT` that gives it), or a read-only server for a
    /// service that writes. Every problem found is listed.
    #[error("the database refuses what this service needs:\n  - {}", problems.join("\n  - "))]
    Access {
        /// One line per missing grant or read-only server.
        problems: Vec<String>,
    },
    /// The pool cannot serve the worker: transactional handling holds a
    /// connection per running handler.
    #[error(
        "the connection pool allows {max_connections} connections but {needed} are needed ({reason})"
    )]
    PoolTooSmall {
        /// The pool's maximum.
        max_connections: u32,
        /// What the worker needs.
        needed: u32,
        /// Where the need comes from.
        reason: String,
    },
    /// The database could not be reached at start-up. `target` is
    /// `host:port` (or the socket path); the password is never shown.
    #[error("cannot connect to the database at {target}: {reason}")]
    Connect {
        /// Where it tried to connect.
        target: String,
        /// The underlying cause: refused, name lookup failed, authentication
        /// failed, or no answer within the connect timeout.
        reason: String,
    },
    /// A line of a crontab could not be read.
    #[error("crontab line {line}: {reason}")]
    Crontab {
        /// The line (1-based).
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A cron schedule's pass failed: its due tick was not enqueued (it is
    /// tried again at the next pass), and the other schedules' passes ran.
    #[error(
        "cron schedule {schedule:?}{}: {source}",
        line.map(|l| format!(" (crontab line {l})")).unwrap_or_default()
    )]
    CronSchedule {
        /// The schedule's name.
        schedule: String,
        /// Its crontab line, if it came from a crontab.
        line: Option<usize>,
        /// Why its pass failed.
        #[source]
        source: Box<Error>,
    },
    /// A database call failed.
    #[error("database error in {op}: {source}")]
    Database {
        /// The statement that failed.
        op: &'static str,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// A worker could not be built.
    #[error(transparent)]
    Worker(#[from] workerutil::Error),
    /// A log consumer failed too many slices in a row; its group stopped.
    #[error("consumer {consumer} failed {failures} slices in a row; last error: {message}")]
    ConsumerFailed {
        /// The consumer.
        consumer: String,
        /// Its consecutive failures.
        failures: u32,
        /// The last failure's message.
        message: String,
    },
    /// A job's progress or checkpoint was not written: its claim was lost (a
    /// reset, or a newer attempt), or another write came first. The attempt
    /// should stop; the job's next attempt reads what was written last.
    #[error("the {what} of job {id} was not written: this attempt no longer owns the job")]
    ProgressRefused {
        /// `progress` or `checkpoint`.
        what: &'static str,
        /// The job.
        id: i64,
    },
    /// A progress value or checkpoint is larger than the 64 KiB cap (as JSON
    /// text): it is not written.
    #[error("the job's {what} is {bytes} bytes of JSON, over the cap of {cap} bytes")]
    ProgressTooLarge {
        /// `progress` or `checkpoint`.
        what: &'static str,
        /// Its size, in bytes of its JSON text.
        bytes: usize,
        /// The cap.
        cap: usize,
    },
    /// A leader's fenced write was refused: this node no longer holds the
    /// scope's lease in this term (another node took it, or the lease
    /// expired). The write's transaction must roll back.
    #[error("leadership of {scope} in term {term} is over; the write was refused")]
    LeadershipLost {
        /// The scope led.
        scope: String,
        /// The term that is over.
        term: i64,
    },
    /// [`DbJob::upstream_results`](crate::DbJob::upstream_results): jobs
    /// this one waited for no longer exist (deleted by hand, or purged from
    /// a table whose DDL predates the purger's check), so their results
    /// cannot be read; a map without them would look complete.
    #[error("the upstream jobs {ids:?} of job {job} no longer exist: their results are lost")]
    UpstreamGone {
        /// The job reading.
        job: i64,
        /// The missing upstream jobs' ids.
        ids: Vec<i64>,
    },
}

impl Error {
    /// Refuses an option's time over [`workerutil::duration::MAX`]: times
    /// are added to clock readings and to each other, and past 100 years
    /// such a sum can overflow (a panic) or leave the database's range.
    pub(crate) fn check_max_durations<const N: usize>(
        fields: [(&'static str, std::time::Duration); N],
    ) -> Result<()> {
        match fields
            .into_iter()
            .find(|(_, d)| *d > workerutil::duration::MAX)
        {
            Some((field, _)) => Err(Error::InvalidOption {
                field,
                reason: "must be at most 100 years".to_owned(),
            }),
            None => Ok(()),
        }
    }

    pub(crate) fn db(op: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
        move |source| Error::Database { op, source }
    }

    /// Turns a path-tracking serde error into [`Error::Json`] about `what`.
    pub(crate) fn json(
        what: impl Into<String>,
    ) -> impl FnOnce(serde_path_to_error::Error<serde_json::Error>) -> Error {
        move |err| {
            // serde_path_to_error writes the root as "." and a top-level
            // index as "[0]"; the crate's other messages use JSONPath.
            let path = match err.path().to_string() {
                root if root == "." => "$".to_owned(),
                index if index.starts_with('[') => format!("${index}"),
                path => format!("$.{path}"),
            };
            Error::Json {
                what: what.into(),
                path,
                source: err.into_inner(),
            }
        }
    }
}

/// Whether `err` is the server's error with SQLSTATE `code`.
pub(crate) fn has_sqlstate(err: &sqlx::Error, code: &str) -> bool {
    err.as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|c| c == code)
}

/// Reads `value` as a `T`, naming `what` and the path of the first mismatch.
pub(crate) fn from_json<T: serde::de::DeserializeOwned>(
    value: &serde_json::Value,
    what: impl FnOnce() -> String,
) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|err| Error::json(what())(err))
}

/// Writes `value` as JSON, naming `what` and the path of the first failure.
pub(crate) fn to_json<T: serde::Serialize + ?Sized>(
    value: &T,
    what: impl FnOnce() -> String,
) -> Result<serde_json::Value> {
    serde_path_to_error::serialize(value, serde_json::value::Serializer)
        .map_err(|err| Error::json(what())(err))
}

/// `Result` with this crate's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
