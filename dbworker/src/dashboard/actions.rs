//! The dashboard's POST handlers: one job's action, bulk actions (with a
//! confirmation), and pause/resume. Each starts from an [`AdminForm`], so the
//! role, CSRF and origin checks are written once.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};

use super::{Shared, Viewer, auth, filter_from, pages, server_error, url_escape};
use crate::job_filter::{BulkAction, Matching, excerpt};

/// A posted form's fields, repeated keys kept.
pub(crate) type FormFields = Vec<(String, String)>;

/// A form posted by an admin, its CSRF token and origin checked.
pub(crate) struct AdminForm(pub(crate) FormFields);

impl FromRequest<Arc<Shared>> for AdminForm {
    type Rejection = Response;

    async fn from_request(request: Request, s: &Arc<Shared>) -> Result<Self, Response> {
        let viewer = request
            .extensions()
            .get::<Viewer>()
            .cloned()
            .ok_or_else(|| StatusCode::UNAUTHORIZED.into_response())?;
        viewer.admin()?;
        let same_origin = auth::same_origin(request.headers());
        let body = Bytes::from_request(request, s)
            .await
            .map_err(IntoResponse::into_response)?;
        let form: FormFields = url::form_urlencoded::parse(&body).into_owned().collect();
        let csrf_ok = field(&form, "csrf").is_some_and(|t| auth::constant_time_eq(t, &s.csrf));
        if !csrf_ok || !same_origin {
            return Err((
                StatusCode::FORBIDDEN,
                "the form is stale or comes from another site",
            )
                .into_response());
        }
        Ok(AdminForm(form))
    }
}

pub(super) fn field<'a>(form: &'a [(String, String)], key: &str) -> Option<&'a str> {
    form.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// The action a form names; `fail` takes the form's `message` when it has
/// one, `reschedule` its `run_in_secs` (empty: the run-at stays). The error
/// names the bad field.
fn action_of(form: &[(String, String)]) -> Result<BulkAction, Response> {
    let text = field(form, "action").unwrap_or("");
    let action: BulkAction = text.parse().map_err(|_| match text {
        "" => super::bad_parameter("action", "choose an action"),
        _ => super::bad_parameter("action", &format!("unknown action {}", excerpt(text))),
    })?;
    Ok(match (action, field(form, "message")) {
        (BulkAction::Reschedule(mut r), _) => {
            if let Some(secs) = field(form, "run_in_secs").filter(|s| !s.trim().is_empty()) {
                let secs = super::filter::seconds("run_in_secs", secs)
                    .map_err(|message| (StatusCode::BAD_REQUEST, message).into_response())?;
                r.run_after = Some(secs);
            }
            BulkAction::Reschedule(r)
        }
        (action, Some(message)) => action.with_message(message),
        (action, None) => action,
    })
}

/// The selected jobs' ids; one that is not an id refuses the whole form.
fn ids_of(form: &[(String, String)]) -> Result<Vec<i64>, Response> {
    form.iter()
        .filter(|(k, _)| k == "id")
        .map(|(_, v)| {
            v.trim()
                .parse()
                .map_err(|_| super::bad_parameter("id", &format!("{} is not a job id", excerpt(v))))
        })
        .collect()
}

fn bad_request(message: &'static str) -> Response {
    (StatusCode::BAD_REQUEST, message).into_response()
}

pub(crate) async fn job_action(
    State(s): State<Arc<Shared>>,
    Extension(viewer): Extension<Viewer>,
    Path((table, id)): Path<(String, i64)>,
    AdminForm(form): AdminForm,
) -> Result<Response, Response> {
    let t = s.table(&table)?;
    let action = action_of(&form)?;
    let n = t
        .writer
        .act_on_ids(&[id], &action)
        .await
        .map_err(server_error)?;
    tracing::info!(user = %viewer.user.name, table = %t.name, job = id, action = action.verb(), done = n, "dashboard action");
    let done = if n == 1 { action.verb() } else { "nothing" };
    let back = format!(
        "/t/{}/jobs/{id}?{}",
        url_escape(&t.name),
        super::notice::query(&s, done)
    );
    Ok(Redirect::to(&viewer.href(&back)).into_response())
}

/// A bulk action: first a confirmation with the count, then the action in
/// batches, on the selected jobs or on every job matching the filter.
pub(crate) async fn bulk(
    State(s): State<Arc<Shared>>,
    Extension(viewer): Extension<Viewer>,
    Path(table): Path<String>,
    AdminForm(form): AdminForm,
) -> Result<Response, Response> {
    let t = s.table(&table)?;
    let action = action_of(&form)?;
    let ids = ids_of(&form)?;
    let all_matching = field(&form, "scope") == Some("matching");
    let q: HashMap<String, String> = form
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("f_").map(|k| (k.to_owned(), v.clone())))
        .collect();
    let hidden = super::HiddenColumns::of(t, &s.options.hidden_fields);
    let mut filter = filter_from(&q, &s.options.hidden_fields, hidden)
        .map_err(|message| (StatusCode::BAD_REQUEST, message).into_response())?;
    crate::dashboard::workflow::check_filter(t, &filter)?;
    if all_matching && !filter.is_restricted() {
        return Err(bad_request(
            "set a filter before acting on every matching job",
        ));
    }
    if !all_matching && ids.is_empty() {
        return Err(bad_request("select jobs first"));
    }
    if field(&form, "confirm") != Some("yes") {
        let (matching, first) = if all_matching {
            let m = t
                .writer
                .matching(&filter, &action)
                .await
                .map_err(server_error)?;
            (m, first_matching(t, &filter, &action, m).await?)
        } else {
            let m = Matching {
                count: ids.len() as u64,
                ..Matching::default()
            };
            (m, ids.iter().copied().take(FIRST_SHOWN as usize).collect())
        };
        let confirm = pages::Confirm {
            form: &form,
            action: &action,
            matching,
            first: &first,
            all_matching,
        };
        return Ok(pages::confirm(&viewer, &s, t, &confirm).into_response());
    }
    // Only what the confirmation counted: jobs enqueued since are newer.
    let bound = if all_matching {
        confirmed_bound(&form)?
    } else {
        None
    };
    let confirmed = confirmed_count(&form)?;
    // Audited as it starts: a long action (or one that fails midway) is on
    // record before its batches commit, not only once they all have.
    tracing::info!(user = %viewer.user.name, table = %t.name, action = action.verb(), all_matching, max_id = ?bound, selected = ids.len(), "dashboard bulk action started");
    let mut so_far = 0;
    let done = match (all_matching, bound) {
        (true, Some(max_id)) => {
            filter.max_id = Some(max_id);
            t.writer
                .act_on_matching(&filter, &action, 500, |n| so_far = n)
                .await
        }
        (true, None) => Ok(0),
        (false, _) => t.writer.act_on_ids(&ids, &action).await,
    };
    let n = done.map_err(|err| {
        tracing::error!(user = %viewer.user.name, table = %t.name, action = action.verb(), done = so_far, "dashboard bulk action stopped");
        server_error(err)
    })?;
    tracing::info!(user = %viewer.user.name, table = %t.name, action = action.verb(), all_matching, done = n, "dashboard bulk action");
    let mut back = format!(
        "/t/{}/jobs?{}",
        url_escape(&t.name),
        super::notice::query(&s, &outcome(action.verb(), n, confirmed))
    );
    for (k, v) in &q {
        back.push_str(&format!("&{}={}", url_escape(k), url_escape(v)));
    }
    Ok(Redirect::to(&viewer.href(&back)).into_response())
}

/// How many of the jobs an action would touch its confirmation names.
const FIRST_SHOWN: u32 = 20;

/// The first jobs (by id) a matching action would touch, for its
/// confirmation: the filter narrowed to the action's states and bound.
async fn first_matching(
    t: &super::Table,
    filter: &crate::job_filter::JobFilter,
    action: &BulkAction,
    m: Matching,
) -> Result<Vec<i64>, Response> {
    if m.count == 0 {
        return Ok(Vec::new());
    }
    let mut f = filter.clone();
    f.max_id = m.max_id;
    if f.states.is_empty() {
        f.states = action.states().to_vec();
    }
    let page = crate::job_filter::PageRequest::first(FIRST_SHOWN);
    let list = t.writer.list(&f, page).await.map_err(server_error)?;
    Ok(list.jobs.iter().map(|j| j.id).collect())
}

/// How many jobs the operator confirmed (`confirmed`; a form from before
/// carries none, and is then not compared).
fn confirmed_count(form: &[(String, String)]) -> Result<Option<u64>, Response> {
    field(form, "confirmed")
        .map(|text| {
            text.parse().map_err(|_| {
                super::bad_parameter("confirmed", &format!("{} is not a count", excerpt(text)))
            })
        })
        .transpose()
}

/// What a bulk action did, for its result page, set against the count the
/// operator confirmed: selected jobs in a state the action leaves alone, and
/// jobs that left its states since the count, are left alone (fewer); jobs
/// under the bound that entered them are acted on too (more); either is
/// said, never shown as the plain count.
fn outcome(verb: &str, done: u64, confirmed: Option<u64>) -> String {
    match confirmed {
        Some(c) if done < c => format!(
            "{verb} {done} of the {c} job(s) confirmed; the other {} were not (or no longer) in a state it acts on and were left alone",
            c - done
        ),
        Some(c) if done > c => format!(
            "{verb} {done} job(s), {} more than the {c} confirmed: they came into a state it acts on after the count",
            done - c
        ),
        _ => format!("{verb} {done}"),
    }
}

/// The highest id the confirmation counted (`max_id`; empty: none matched).
fn confirmed_bound(form: &[(String, String)]) -> Result<Option<i64>, Response> {
    match field(form, "max_id") {
        None => Err(super::bad_parameter(
            "max_id",
            "the confirmation carries no bound; go back and confirm again",
        )),
        Some("") => Ok(None),
        Some(text) => text.parse().map(Some).map_err(|_| {
            super::bad_parameter("max_id", &format!("{} is not a job id", excerpt(text)))
        }),
    }
}

pub(crate) async fn pause(
    State(s): State<Arc<Shared>>,
    Extension(viewer): Extension<Viewer>,
    Path(table): Path<String>,
    AdminForm(form): AdminForm,
) -> Result<Response, Response> {
    let t = s.table(&table)?;
    let pauses = t
        .pauses
        .as_ref()
        .ok_or_else(|| bad_request("this table has no pause table"))?;
    // The whole table only by its own button: an empty queue field once
    // paused (and resumed) every queue.
    let queue = match field(&form, "queue") {
        Some(q) if q.trim().is_empty() => {
            return Err(super::bad_parameter(
                "queue",
                "name the queue (the whole table has its own button)",
            ));
        }
        Some(q) => Some(q),
        None if field(&form, "scope") == Some("table") => None,
        None => return Err(super::bad_parameter("queue", "name the queue")),
    };
    let resume = field(&form, "do") == Some("resume");
    if resume {
        pauses.resume(queue).await.map_err(server_error)?;
    } else {
        let by = format!("dashboard: {}", viewer.user.name);
        pauses.pause(queue, &by).await.map_err(server_error)?;
    }
    tracing::info!(user = %viewer.user.name, table = %t.name, queue = queue.unwrap_or("*"), resume, "dashboard pause");
    let back = format!("/t/{}/queues", url_escape(&t.name));
    Ok(Redirect::to(&viewer.href(&back)).into_response())
}
