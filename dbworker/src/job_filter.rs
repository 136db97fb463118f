//! Which jobs an operator means: the filter `Admin::list` pages through and
//! the bulk actions act on, shared by the command line and applications'
//! own admin tools. Every value is bound in SQL; column names are checked
//! to be plain identifiers.

use std::time::{Duration, SystemTime};

use workerutil::JobState;

use crate::error::{Error, Result};

/// Jobs matching every condition set (an empty filter matches every job).
///
/// ```
/// use dbworker::admin::{FieldFilter, JobFilter};
/// use dbworker::workerutil::JobState;
/// let mut filter = JobFilter::default();
/// filter.states = vec![JobState::Failed];
/// filter.queue = Some("emails".into());
/// filter.fields.push("payload.customer_id=42".parse::<FieldFilter>().unwrap());
/// assert!(filter.is_restricted());
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct JobFilter {
    /// Only jobs in these states (empty: any state).
    pub states: Vec<JobState>,
    /// Only jobs of this queue (needs the admin's queue column).
    pub queue: Option<String>,
    /// Only jobs of this kind (needs the admin's kind column).
    pub kind: Option<String>,
    /// Only jobs queued at least this long ago (database clock).
    pub older_than: Option<Duration>,
    /// Only jobs queued at most this long ago (database clock).
    pub newer_than: Option<Duration>,
    /// Only jobs whose failure message contains this text (case-insensitive).
    pub failure_contains: Option<String>,
    /// Only jobs whose column (or JSON field inside a column) equals a value.
    pub fields: Vec<FieldFilter>,
    /// Only the tasks of this workflow (needs `dbworker migration --workflows`).
    pub workflow_id: Option<i64>,
    /// Only stalled jobs: processing, with a heartbeat (or, before the first,
    /// a start) older than this, by the database clock: what `status`
    /// counts as stalled with the same age.
    pub stalled_after: Option<Duration>,
    /// Only jobs whose id is at most this: a bulk action bounded by its
    /// confirmation ([`Matching::max_id`]), so jobs enqueued after the
    /// operator saw the count are left alone. Not a restriction for
    /// [`is_restricted`](Self::is_restricted).
    pub max_id: Option<i64>,
}

impl JobFilter {
    /// Whether anything narrows the filter (bulk commands require it, so a
    /// forgotten flag never acts on the whole table). A bound on the id
    /// alone does not: it still spans every job enqueued before it.
    pub fn is_restricted(&self) -> bool {
        let unbounded = JobFilter {
            max_id: None,
            ..self.clone()
        };
        unbounded != JobFilter::default()
    }
}

/// What a bulk action would act on now: how many jobs, and the highest id
/// among them, to bound the action by once the operator confirms (see
/// [`JobFilter::max_id`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Matching {
    /// How many jobs match (in a state the action may touch).
    pub count: u64,
    /// The highest id among them; `None` when none matches.
    pub max_id: Option<i64>,
}

/// `column = value`, or `column->'a'->>'b' = value` for a JSON column, as
/// text: parsed from `column=value` or `column.a.b=value`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FieldFilter {
    /// The column (a plain identifier).
    pub column: String,
    /// The path of keys inside a JSON column (empty: the column itself).
    pub path: Vec<String>,
    /// The value, compared as text.
    pub value: String,
}

impl FieldFilter {
    /// `column` (at `path`, for a JSON column) equal to `value` as text.
    pub fn new(column: &str, path: &[&str], value: &str) -> Result<FieldFilter> {
        if !crate::columns::is_identifier(column) {
            return Err(Error::InvalidOption {
                field: "fields",
                reason: format!("{} is not a plain column name", excerpt(column)),
            });
        }
        Ok(FieldFilter {
            column: column.to_owned(),
            path: path.iter().map(|&p| p.to_owned()).collect(),
            value: value.to_owned(),
        })
    }
}

impl std::str::FromStr for FieldFilter {
    type Err = Error;

    fn from_str(s: &str) -> Result<FieldFilter> {
        let Some((target, value)) = s.split_once('=') else {
            return Err(Error::InvalidOption {
                field: "fields",
                reason: format!(
                    "expected column=value or column.key=value, got {}",
                    excerpt(s)
                ),
            });
        };
        let mut parts = target.split('.');
        let column = parts.next().unwrap_or_default();
        let path: Vec<&str> = parts.collect();
        if path.iter().any(|p| p.is_empty()) {
            return Err(Error::InvalidOption {
                field: "fields",
                reason: format!("empty key in {}", excerpt(target)),
            });
        }
        FieldFilter::new(column, &path, value)
    }
}

/// One row of `Admin::list`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct JobSummary {
    /// The job's id.
    pub id: i64,
    /// Its state.
    pub state: JobState,
    /// Its queue, when the admin knows the queue column.
    pub queue: Option<String>,
    /// Its kind, when the admin knows the kind column.
    pub kind: Option<String>,
    /// Failed attempts so far.
    pub num_failures: i32,
    /// Seconds since it was queued (database clock).
    pub age_seconds: f64,
    /// The host that holds (or last held) it.
    pub worker_hostname: String,
    /// The last failure message, if any.
    pub failure_message: Option<String>,
    /// The workflow it is a task of, when the admin knows the table has
    /// workflows (`JobTableOptions::workflows`).
    pub workflow_id: Option<i64>,
}

/// A page of `Admin::list`, and where the next page starts.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct JobPage {
    /// The jobs, in the page's order.
    pub jobs: Vec<JobSummary>,
    /// Pass as `after` for the next page; `None` on the last page.
    pub next: Option<i64>,
    /// With a sort other than by id: pass as `after_value` too.
    pub next_value: Option<String>,
    /// Set when the page stopped at its search window before filling up
    /// (see [`PageRequest::search_window`]): how many rows it looked at,
    /// down to the id in `next`, where the next page continues. More
    /// matches may lie beyond.
    pub searched: Option<u32>,
}

/// How many rows one page of `Admin::list` looks at, in id order, when its
/// filter has a condition no index serves (the failure text, payload
/// fields): enough to fill most pages, little enough to keep one under
/// ~100 ms on a large table. A page that stops there says so
/// ([`JobPage::searched`]) and the next one continues from where it stopped.
pub const SEARCH_WINDOW: u32 = 50_000;

/// What `Admin::list` sorts by; ties (and `Id`) by id, so pages never skip
/// or repeat a job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobSort {
    /// The id: insertion order (uses the primary key; the cheapest).
    #[default]
    Id,
    /// When the job was queued.
    QueuedAt,
    /// When it finished (jobs that have not finished come first).
    FinishedAt,
    /// How many times it failed.
    Failures,
}

impl JobSort {
    /// Its name in URLs and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            JobSort::Id => "id",
            JobSort::QueuedAt => "queued_at",
            JobSort::FinishedAt => "finished_at",
            JobSort::Failures => "failures",
        }
    }
}

impl std::str::FromStr for JobSort {
    type Err = Error;

    fn from_str(s: &str) -> Result<JobSort> {
        Ok(match s {
            "id" => JobSort::Id,
            "queued_at" => JobSort::QueuedAt,
            "finished_at" => JobSort::FinishedAt,
            "failures" => JobSort::Failures,
            other => {
                return Err(Error::InvalidOption {
                    field: "sort",
                    reason: format!(
                        "{}: sort by id, queued_at, finished_at or failures",
                        excerpt(other)
                    ),
                });
            }
        })
    }
}

/// Where a page of `Admin::list` starts and how long it is: keyset paging
/// on `(sort value, id)`, so a page costs the same however deep (unlike
/// `OFFSET`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PageRequest {
    /// Start after this id (before it, descending).
    pub after: Option<i64>,
    /// With a sort other than by id: the sort value of the job at `after`
    /// (what `JobPage::next_value` returned).
    pub after_value: Option<String>,
    /// Rows per page.
    pub size: u32,
    /// Descending: newest (highest id, latest time, most failures) first.
    pub newest_first: bool,
    /// What to sort by.
    pub sort: JobSort,
    /// Sorted by id with a filter on the failure text or payload fields:
    /// the most rows one page looks at ([`SEARCH_WINDOW`] by default; 0
    /// for no bound). Not bounded otherwise: a sort other than by id orders
    /// every matching row unless an index covers it (only `finished_at` has
    /// one, for the final states, with `dbworker migration --retention`), so
    /// on a large table narrow such a page with a filter, or sort by id.
    pub search_window: u32,
}

impl PageRequest {
    /// The first page of `size` rows, by id, oldest first.
    pub fn first(size: u32) -> PageRequest {
        PageRequest {
            after: None,
            after_value: None,
            size,
            newest_first: false,
            sort: JobSort::Id,
            search_window: SEARCH_WINDOW,
        }
    }
}

/// What a bulk action does to each job it selects.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BulkAction {
    /// Failed, canceled and errored jobs back to `queued` (failures reset);
    /// a workflow's dependent that still waits for an upstream job back to
    /// `pending` instead.
    Requeue,
    /// Waiting jobs to `canceled`; processing jobs asked to cancel.
    Cancel,
    /// Waiting jobs to `failed` with this message.
    Fail(String),
    /// Jobs no worker holds, deleted.
    Delete,
    /// Queued, errored, failed and canceled jobs marked `completed`, as if a
    /// worker had done them.
    Complete,
    /// Queued, errored, failed and canceled jobs back to `queued` with new
    /// scheduling values (each `None` leaves its column unchanged); a
    /// dependent that still waits for an upstream job to `pending`.
    Reschedule(Reschedule),
}

/// What [`BulkAction::Reschedule`] sets; each `None` leaves its column as it is.
///
/// ```
/// use dbworker::admin::{BulkAction, Reschedule};
/// let mut r = Reschedule::default();
/// r.run_after = Some(std::time::Duration::from_secs(300));
/// r.num_failures = Some(0);
/// assert_eq!(BulkAction::Reschedule(r).verb(), "reschedule");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reschedule {
    /// Run no earlier than this instant (`process_after`).
    pub run_at: Option<SystemTime>,
    /// Run no earlier than this long after the action, by the database
    /// clock (instead of `run_at`).
    pub run_after: Option<Duration>,
    /// The priority (needs `JobTableOptions::priority_column`).
    pub priority: Option<i32>,
    /// The failures counted so far (`num_failures`): 0 gives a failed job
    /// all its retries again. Negative values are refused.
    pub num_failures: Option<i32>,
    /// The job's own retry limit (needs `JobTableOptions::max_retries_column`).
    /// Negative values are refused.
    pub max_retries: Option<i32>,
}

impl BulkAction {
    /// The states the action may act on; it never touches the others.
    pub fn states(&self) -> &'static [JobState] {
        match self {
            BulkAction::Requeue => &[JobState::Failed, JobState::Canceled, JobState::Errored],
            BulkAction::Cancel => &[
                JobState::Pending,
                JobState::Queued,
                JobState::Errored,
                JobState::Processing,
            ],
            BulkAction::Fail(_) => &[JobState::Queued, JobState::Errored],
            BulkAction::Delete => &[
                JobState::Pending,
                JobState::Queued,
                JobState::Errored,
                JobState::Completed,
                JobState::Failed,
                JobState::Canceled,
            ],
            BulkAction::Complete | BulkAction::Reschedule(_) => &[
                JobState::Queued,
                JobState::Errored,
                JobState::Failed,
                JobState::Canceled,
            ],
        }
    }

    /// A `Fail` with `message` instead; any other action unchanged.
    pub fn with_message(self, message: &str) -> BulkAction {
        match self {
            BulkAction::Fail(_) => BulkAction::Fail(message.to_owned()),
            other => other,
        }
    }

    /// The verb, for messages (`requeue`, `cancel`, `fail`, `delete`,
    /// `complete`, `reschedule`).
    pub fn verb(&self) -> &'static str {
        match self {
            BulkAction::Requeue => "requeue",
            BulkAction::Cancel => "cancel",
            BulkAction::Fail(_) => "fail",
            BulkAction::Delete => "delete",
            BulkAction::Complete => "complete",
            BulkAction::Reschedule(_) => "reschedule",
        }
    }

    /// Refuses a filter naming a state this action never touches: it would
    /// act on none of those jobs and say only "0 job(s)", as if there were
    /// none.
    pub(crate) fn check_states(&self, filter: &JobFilter) -> Result<()> {
        let mut named = filter.states.clone();
        // Stalled jobs are processing ones.
        if filter.stalled_after.is_some() {
            named.push(JobState::Processing);
        }
        let allowed = self.states();
        let refused: Vec<&str> = named
            .iter()
            .filter(|s| !allowed.contains(s))
            .map(|s| s.as_str())
            .collect();
        if refused.is_empty() {
            return Ok(());
        }
        let allowed: Vec<&str> = allowed.iter().map(|s| s.as_str()).collect();
        Err(Error::InvalidOption {
            field: "state",
            reason: format!(
                "{} acts only on {} jobs, not {}",
                self.verb(),
                allowed.join(", "),
                refused.join(", ")
            ),
        })
    }
}

/// The message of a `fail` parsed from text, until
/// [`with_message`](BulkAction::with_message) gives another.
pub const DEFAULT_FAIL_MESSAGE: &str = "failed by an operator";

/// Parses the verb (`requeue`, `cancel`, `fail`, `delete`, `complete`,
/// `reschedule`: changing nothing but the state), as the command line and the
/// dashboard's forms write it.
///
/// ```
/// use dbworker::admin::BulkAction;
/// let action: BulkAction = "fail".parse().unwrap();
/// assert_eq!(action.with_message("bad input"), BulkAction::Fail("bad input".into()));
/// assert!("drop".parse::<BulkAction>().is_err());
/// ```
impl std::str::FromStr for BulkAction {
    type Err = Error;

    fn from_str(verb: &str) -> Result<BulkAction> {
        Ok(match verb {
            "requeue" => BulkAction::Requeue,
            "cancel" => BulkAction::Cancel,
            "fail" => BulkAction::Fail(DEFAULT_FAIL_MESSAGE.to_owned()),
            "delete" => BulkAction::Delete,
            "complete" => BulkAction::Complete,
            "reschedule" => BulkAction::Reschedule(Reschedule::default()),
            _ => {
                return Err(Error::InvalidOption {
                    field: "action",
                    reason: format!(
                        "{}: expected requeue, cancel, fail, delete, complete or reschedule",
                        excerpt(verb)
                    ),
                });
            }
        })
    }
}

/// An operator's input as a message quotes it: cut to 64 characters, so a
/// pasted blob (or a hostile request) does not come back whole.
pub(crate) fn excerpt(input: &str) -> String {
    match input.char_indices().nth(64) {
        Some((cut, _)) => format!("{:?}…", &input[..cut]),
        None => format!("{input:?}"),
    }
}

/// An age as operators read it: `42s`, `7m`, `3h`, `2d`.
///
/// ```
/// assert_eq!(dbworker::admin::format_age(90.0), "2m");
/// ```
pub fn format_age(secs: f64) -> String {
    let secs = secs.max(0.0);
    let (n, unit) = if secs < 60.0 {
        (secs, "s")
    } else if secs < 3600.0 {
        (secs / 60.0, "m")
    } else if secs < 86400.0 {
        (secs / 3600.0, "h")
    } else {
        (secs / 86400.0, "d")
    };
    format!("{n:.0}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_filters_parse_columns_and_json_paths() {
        let f: FieldFilter = "payload.customer.id=4=2".parse().unwrap();
        assert_eq!(f.column, "payload");
        assert_eq!(f.path, ["customer", "id"]);
        assert_eq!(f.value, "4=2");
        let f: FieldFilter = "customer=".parse().unwrap();
        assert!(f.path.is_empty() && f.value.is_empty());
        for bad in ["nothing", "pay load=1", "payload..x=1", "\"x\"=1", "=1"] {
            assert!(bad.parse::<FieldFilter>().is_err(), "{bad}");
        }
    }

    #[test]
    fn inputs_are_quoted_cut_to_64_characters() {
        assert_eq!(excerpt("abc"), "\"abc\"");
        let long = excerpt(&"é".repeat(10_000));
        assert_eq!(long, format!("{:?}…", "é".repeat(64)));
        let err = "x".repeat(10_000).parse::<FieldFilter>().unwrap_err();
        assert!(err.to_string().len() < 200, "{err}");
    }

    #[test]
    fn actions_never_select_jobs_they_must_not_touch() {
        assert!(!BulkAction::Delete.states().contains(&JobState::Processing));
        assert!(!BulkAction::Requeue.states().contains(&JobState::Processing));
        assert!(
            !BulkAction::Complete
                .states()
                .contains(&JobState::Processing)
        );
        let reschedule = BulkAction::Reschedule(Reschedule::default());
        assert!(!reschedule.states().contains(&JobState::Processing));
        assert!(
            !BulkAction::Fail(String::new())
                .states()
                .contains(&JobState::Completed)
        );
        assert!(!JobFilter::default().is_restricted());
        let queued = JobFilter {
            states: vec![JobState::Queued],
            ..JobFilter::default()
        };
        let err = BulkAction::Requeue.check_states(&queued).unwrap_err();
        assert!(err.to_string().contains("not queued"), "{err}");
        assert!(BulkAction::Cancel.check_states(&queued).is_ok());
        let bounded = JobFilter {
            max_id: Some(7),
            ..JobFilter::default()
        };
        assert!(!bounded.is_restricted(), "a bound alone spans the table");
    }
}
