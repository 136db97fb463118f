//! Batch jobs: the errored mark that also leaves only the failed items in the
//! job's payload, fenced by the claim's token like every mark.

use super::job_table::JobTable;
use super::marks::errored_update;
use super::{Statement, alias};
use crate::retry::RetryRule;
use sea_query::Expr;

/// [`mark_errored`], plus `payload_column = payload`: a batch job's retry
/// keeps only its failed items. One statement, so the payload changes exactly
/// when the mark lands (the same fence, the same transaction); a stale attempt
/// matches no row and rewrites nothing. The payload is rewritten whichever
/// state the mark writes (errored, failed once retries are exhausted, or
/// canceled): it always holds what was left undone.
pub(crate) fn mark_errored_with_payload(
    o: &JobTable,
    id: i64,
    token: i64,
    message: &str,
    retry: &RetryRule,
    payload_column: &str,
    payload: serde_json::Value,
) -> Statement {
    let q = errored_update(o, id, token, message, retry)
        .value(alias(payload_column), Expr::val(payload))
        .to_owned();
    Statement::from(&q)
}
