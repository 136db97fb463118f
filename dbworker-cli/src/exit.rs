//! The exit status of every command, one scheme a script can branch on:
//! 0 done (nothing to do included), 1 failed, 2 bad arguments (clap's own
//! code), 3 nothing has the id, key or workflow named, 4 refused. An error
//! without a code of its own is a failure (1): a database error, a missing
//! grant, a table unlike its description.

use std::fmt;

/// The scheme as `dbworker --help` prints it after the commands.
pub(crate) const HELP: &str = "\
Exit status (every command):
  0  done, or nothing to do (a filter matching no job, a queue already paused)
  1  failed: the database unreachable or erroring, a missing grant, a table
     unlike its description
  2  bad arguments: a flag or value the command refuses, before changing anything
  3  not found: no job, key or workflow has the id or key given
  4  refused: the job is in a state the action leaves alone, or a bulk action
     or workflow cancel was not confirmed (pass --yes without a terminal)";

/// A status other than 0 and 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    Usage = 2,
    NotFound = 3,
    Refused = 4,
}

/// An error that exits with its own status.
#[derive(Debug)]
pub(crate) struct Coded {
    exit: Exit,
    message: String,
}

impl fmt::Display for Coded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Coded {}

fn coded(exit: Exit, message: impl Into<String>) -> anyhow::Error {
    Coded {
        exit,
        message: message.into(),
    }
    .into()
}

/// Bad arguments (2), found before anything changed.
pub(crate) fn usage(message: impl Into<String>) -> anyhow::Error {
    coded(Exit::Usage, message)
}

/// Nothing has the id, key or workflow named (3).
pub(crate) fn not_found(message: impl Into<String>) -> anyhow::Error {
    coded(Exit::NotFound, message)
}

/// The action was not taken (4): the job's state, or no confirmation.
pub(crate) fn refused(message: impl Into<String>) -> anyhow::Error {
    coded(Exit::Refused, message)
}

/// The status `error` exits with: the first code in its chain; a value the
/// library refused (`Error::InvalidOption`: every option the CLI passes it
/// comes from a flag) is bad arguments; anything else 1.
pub(crate) fn status(error: &anyhow::Error) -> u8 {
    error
        .chain()
        .find_map(|cause| match cause.downcast_ref::<dbworker::Error>() {
            Some(dbworker::Error::InvalidOption { .. }) => Some(Exit::Usage),
            _ => cause.downcast_ref::<Coded>().map(|c| c.exit),
        })
        .map_or(1, |exit| exit as u8)
}

/// The database's message if `error` is it saying `no_data_found` (SQLSTATE
/// P0002), as the signal functions say a job or key does not exist.
pub(crate) fn no_data_found(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(sqlx::Error::Database(db)) = e.downcast_ref::<sqlx::Error>()
            && db.code().as_deref() == Some("P0002")
        {
            return Some(db.message().to_owned());
        }
        cause = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::*;

    #[test]
    fn the_status_is_the_first_code_in_the_chain_else_one() {
        let err = Err::<(), _>(not_found("no job 7"))
            .context("reading job 7")
            .unwrap_err();
        assert_eq!(status(&err), 3);
        assert_eq!(status(&usage("--queue: name the queue")), 2);
        assert_eq!(status(&refused("nothing done")), 4);
        assert_eq!(status(&anyhow::anyhow!("connection refused")), 1);
        let option = dbworker::Error::InvalidOption {
            field: "interval",
            reason: "must be more than 0".into(),
        };
        let err = Err::<(), _>(option).context("the purger").unwrap_err();
        assert_eq!(status(&err), 2);
    }
}
