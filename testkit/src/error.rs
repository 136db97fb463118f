//! The error type of the crate.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// Everything that can go wrong while providing a test database.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The PostgreSQL server binaries (`initdb`, `pg_ctl`, `postgres`) could not be found.
    #[error(
        "the PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found (searched: {}); \
         install the PostgreSQL server package (e.g. apt-get install postgresql) or set DATABASE_URL",
        display_paths(.searched)
    )]
    BinariesNotFound {
        /// The directories that were looked at.
        searched: Vec<PathBuf>,
    },

    /// The process runs as root, but there is no unprivileged user to own the throwaway cluster.
    #[error(
        "running as root, but there is no `{user}` user in /etc/passwd to own the throwaway \
         PostgreSQL cluster (initdb and postgres refuse to run as root); create that user \
         (e.g. useradd --system {user}) or set DATABASE_URL"
    )]
    NoServerUser {
        /// The user name that was looked up.
        user: String,
    },

    /// A file-system or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: io::Error,
    },

    /// An external command (such as `initdb`) ran but failed.
    #[error("`{command}` failed ({status}); its output:\n{output}")]
    Command {
        /// The command line that was run.
        command: String,
        /// How it exited.
        status: ExitStatus,
        /// What it wrote to stdout and stderr.
        output: String,
    },

    /// The throwaway server exited before it accepted connections.
    #[error(
        "the throwaway PostgreSQL server exited during start-up ({status}); server log:\n{log}"
    )]
    ServerExited {
        /// How the server exited.
        status: ExitStatus,
        /// The end of the server log.
        log: String,
    },

    /// The throwaway server did not accept connections in time.
    #[error(
        "the throwaway PostgreSQL server did not become ready within {waited:?}; server log:\n{log}"
    )]
    Timeout {
        /// How long start-up was waited for.
        waited: Duration,
        /// The end of the server log.
        log: String,
    },

    /// `DATABASE_URL` is not a usable PostgreSQL URL.
    #[error("invalid DATABASE_URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL, with any password hidden.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A database operation failed.
    #[error("database error: {0}")]
    Sqlx(#[from] sqlx::Error),

    /// A migration failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

fn display_paths(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "nothing".to_owned();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binaries_not_found_says_what_to_do() {
        let e = Error::BinariesNotFound {
            searched: vec![PathBuf::from("/usr/bin"), PathBuf::from("/opt/pg/bin")],
        };
        let text = e.to_string();
        assert!(text.contains("initdb"), "{text}");
        assert!(text.contains("/usr/bin, /opt/pg/bin"), "{text}");
        assert!(
            text.contains(
                "install the PostgreSQL server package (e.g. apt-get install postgresql) or set DATABASE_URL"
            ),
            "{text}"
        );
    }
}
