//! The checks every enqueue path runs on a job before any statement: options
//! the table was not configured for, names too long, NUL characters, columns
//! that are dbworker's.

use crate::columns::{FAIR_COST, FAIR_KEY, MAX_FAIR_COST, is_identifier};
use crate::error::{Error, Result};

use sea_query::Value;

use super::{Enqueuer, MAX_KEY_CHARS, MAX_NAME_CHARS, NewJob};

impl Enqueuer {
    /// Refuses options this table was not configured for.
    pub(crate) fn check_job(&self, job: &NewJob) -> Result<()> {
        let t = &self.target;
        let refuse = |field: &'static str, what: &str| {
            Err(Error::InvalidOption {
                field,
                reason: format!(
                    "the job sets a {what}, but the table's {field} is not set (JobTableOptions::{field})"
                ),
            })
        };
        if job.key_value().is_some() && t.key_column.is_none() {
            return refuse("key_column", "key");
        }
        if job.queue_value().is_some() && t.queue_column.is_none() {
            return refuse("queue_column", "queue");
        }
        if job.priority_value().is_some() && t.priority_column.is_none() {
            return refuse("priority_column", "priority");
        }
        if job.max_retries_value().is_some() && t.max_retries_column.is_none() {
            return refuse("max_retries_column", "retry limit");
        }
        if let Some(max) = job
            .max_retries_value()
            .filter(|m| i32::try_from(*m).is_err())
        {
            return Err(Error::InvalidOption {
                field: "max_retries",
                reason: format!("{max} is more than the column holds ({})", i32::MAX),
            });
        }
        if job.kind_value().is_some() && t.kind_column.is_none() {
            return refuse("kind_column", "kind");
        }
        if job.flags_value().is_some() && t.flags_column.is_none() {
            return refuse("flags_column", "flags");
        }
        if job.payload_value().is_some() {
            let Some(payload) = &t.payload_column else {
                return Err(Error::InvalidOption {
                    field: "payload_column",
                    reason: "the job has typed arguments (NewJob::args), but the table's payload_column is not set (JobTableOptions::payload_column)".into(),
                });
            };
            if job.columns().any(|c| c == payload) {
                return Err(Error::InvalidOption {
                    field: "column",
                    reason: format!(
                        "the job sets the payload column {payload:?} by name and has typed arguments for it; set one"
                    ),
                });
            }
        }
        if let Some(what) = job.nul_field() {
            return Err(Error::NulCharacter { what });
        }
        // graphile-worker's limits: names an operator reads and filters by.
        for (field, value, max) in [
            ("queue", job.queue_value(), MAX_NAME_CHARS),
            ("kind", job.kind_value(), MAX_NAME_CHARS),
            ("key", job.key_value().map(|(k, _)| k), MAX_KEY_CHARS),
        ] {
            if let Some(value) = value
                && value.chars().count() > max
            {
                return Err(Error::InvalidOption {
                    field,
                    reason: format!(
                        "is {} characters long; at most {max} are allowed",
                        value.chars().count()
                    ),
                });
            }
        }
        check_fairness(job)?;
        for (column, _) in job.values() {
            if !is_identifier(column) {
                return Err(Error::InvalidOption {
                    field: "column",
                    reason: format!("{column:?} is not a plain identifier"),
                });
            }
            let standard = t
                .columns
                .expected_types()
                .iter()
                .any(|(_, c, _)| *c == column.as_str());
            let optional = t.insert_columns().any(|c| c == column);
            if standard || optional {
                return Err(Error::InvalidOption {
                    field: "column",
                    reason: format!(
                        "{column:?} is managed by dbworker; use the NewJob option for it"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// A fairness key is capped like a job key (an index holds it: one too long
/// would fail its whole batch in the database), and a cost checked against
/// the column's bounds, each refused by name before anything is written.
fn check_fairness(job: &NewJob) -> Result<()> {
    for (column, value) in job.values() {
        if column == FAIR_KEY
            && let Value::String(Some(key)) = value
            && key.chars().count() > MAX_KEY_CHARS
        {
            return Err(Error::InvalidOption {
                field: "fair_key",
                reason: format!(
                    "is {} characters long; at most {MAX_KEY_CHARS} are allowed",
                    key.chars().count()
                ),
            });
        }
        if column == FAIR_COST {
            let cost = match value {
                Value::Int(Some(n)) => Some(i64::from(*n)),
                Value::BigInt(Some(n)) => Some(*n),
                Value::SmallInt(Some(n)) => Some(i64::from(*n)),
                _ => None,
            };
            if let Some(cost) = cost.filter(|c| !(1..=i64::from(MAX_FAIR_COST)).contains(c)) {
                return Err(Error::InvalidOption {
                    field: "fair_cost",
                    reason: format!("is {cost}; it must be at least 1 and at most {MAX_FAIR_COST}"),
                });
            }
        }
    }
    Ok(())
}
