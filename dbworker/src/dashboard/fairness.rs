//! The fairness page (`/t/{table}/fairness`, fair tables only): the keys
//! with the most jobs waiting, with what runs and their weights, and the
//! weights set for keys not among them. An admin sets a key's weight or puts
//! it back to 1 from a form that goes through the table's
//! [`FairWeights`](crate::control::FairWeights), as `dbworker fair` does, so
//! the key's jobs tagged next get the new share.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};

use super::actions::{AdminForm, field};
use super::pages::layout;
use super::{
    Refresh, Role, Shared, Table, Viewer, bad_parameter, refresh, server_error, url_escape,
};
use crate::control::{FairShare, MAX_FAIR_WEIGHT};
use crate::job_filter::excerpt;

/// How many keys the page lists, most waiting first (`dbworker fair --top`
/// lists more): one grouped read of the live jobs on every refresh.
const TOP_KEYS: u32 = 50;

/// `GET /t/{table}/fairness`.
pub(super) async fn page(
    State(s): State<Arc<Shared>>,
    viewer: Extension<Viewer>,
    Path(table): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, Response> {
    let t = s.table(&table)?;
    let Some(weights) = &t.fairness else {
        return Err((
            StatusCode::NOT_FOUND,
            "fairness: this table has no fair claims (dbworker migration --fair)",
        )
            .into_response());
    };
    let shares = weights.shares(TOP_KEYS).await.map_err(server_error)?;
    let set: BTreeMap<String, u32> = weights
        .list()
        .await
        .map_err(server_error)?
        .into_iter()
        .collect();
    let done = super::notice::of(&s, &q);
    Ok(render(&viewer, &s, t, &shares, &set, done, &refresh(&q)).into_response())
}

/// The admin's form for one key's weight, showing `weight` (`key` `None`:
/// a form that names the key, to weigh one not listed); "Reset to 1" when
/// the key's weight is `set` in the weight table.
fn form(
    viewer: &Viewer,
    s: &Shared,
    t: &Table,
    key: Option<&str>,
    weight: u32,
    set: bool,
) -> Markup {
    let url = viewer.href(&format!("/t/{}/fairness/weight", url_escape(&t.name)));
    html! {
        form class="inline weight" method="post" action=(url) {
            input type="hidden" name="csrf" value=(s.csrf);
            @match key {
                Some(k) => { input type="hidden" name="key" value=(k); }
                None => { input name="key" placeholder="key" size="16" required; " " }
            }
            input type="number" name="weight" min="1" max=(MAX_FAIR_WEIGHT) step="1" required
                title=(format!("Claimed this many times as often as a key of weight 1 (1 to {MAX_FAIR_WEIGHT})"))
                value=(weight);
            " " button type="submit" name="do" value="set" { "Set weight" }
            @if key.is_some() && set {
                // No validation: resetting needs no weight.
                " " button type="submit" name="do" value="reset" formnovalidate class="danger" { "Reset to 1" }
            }
        }
    }
}

fn render(
    viewer: &Viewer,
    s: &Shared,
    t: &Table,
    shares: &[FairShare],
    set: &BTreeMap<String, u32>,
    done: Option<&str>,
    refresh: &Refresh,
) -> Markup {
    let admin = viewer.user.role == Role::Admin;
    let listed = |k: &str| shares.iter().any(|sh| sh.key.as_deref() == Some(k));
    let others: Vec<(&String, &u32)> = set.iter().filter(|(k, _)| !listed(k)).collect();
    let body = html! {
        @if let Some(done) = done { p class="notice" { "Done: " (done) } }
        p class="muted" {
            "While backlogged, a key of weight 4 is claimed four times as often as a key of weight 1 "
            "(within a queue and priority). A new weight applies to the key's jobs enqueued, retried "
            "or released after it is set; jobs already waiting keep their place."
        }
        @if shares.is_empty() {
            p class="muted" id="no-keys" { "No job is waiting or running." }
        } @else {
            table id="fair-keys" {
                tr { th { "key" } th { "waiting" } th { "running" } th { "weight" } @if admin { th {} } }
                @for sh in shares {
                    tr {
                        td { @match &sh.key { Some(k) => { (k) } None => { span class="muted" { "(none)" } } } }
                        td class="num" { (sh.waiting) }
                        td class="num" { (sh.processing) }
                        td class="num" { (sh.weight) }
                        @if admin {
                            td {
                                @match &sh.key {
                                    Some(k) => { (form(viewer, s, t, Some(k), sh.weight, set.contains_key(k))) }
                                    None => { span class="muted" { "Jobs without a key share weight 1." } }
                                }
                            }
                        }
                    }
                }
            }
            @if shares.len() == TOP_KEYS as usize {
                p class="muted" { "The " (TOP_KEYS) " keys with the most jobs waiting; " code { "dbworker fair --top N" } " lists more." }
            }
        }
        @if !others.is_empty() {
            h2 { "Other weights set" }
            table id="fair-weights" {
                tr { th { "key" } th { "weight" } @if admin { th {} } }
                @for (k, w) in others {
                    tr {
                        td { (k) }
                        td class="num" { (w) }
                        @if admin { td { (form(viewer, s, t, Some(k), *w, true)) } }
                    }
                }
            }
        }
        @if admin { p { "Weigh another key: " (form(viewer, s, t, None, 1, false)) } }
    };
    layout(
        viewer,
        s,
        &format!("Fairness · {}", t.name),
        Some(refresh),
        body,
    )
}

/// `POST /t/{table}/fairness/weight`: sets a key's weight (`do=set`) or
/// puts it back to 1 (`do=reset`). A bad weight is refused, naming it, and
/// changes nothing.
pub(super) async fn set(
    State(s): State<Arc<Shared>>,
    Extension(viewer): Extension<Viewer>,
    Path(table): Path<String>,
    AdminForm(form): AdminForm,
) -> Result<Response, Response> {
    let t = s.table(&table)?;
    let weights = t.fairness.as_ref().ok_or_else(|| {
        (
            StatusCode::BAD_REQUEST,
            "this table has no fair claims (dbworker migration --fair)",
        )
            .into_response()
    })?;
    // Not trimmed: a key is the application's text, spaces included.
    let key = field(&form, "key")
        .filter(|k| !k.is_empty())
        .ok_or_else(|| bad_parameter("key", "name the key"))?;
    let reset = field(&form, "do") == Some("reset");
    let (weight, done) = if reset {
        let had = weights.remove(key).await.map_err(server_error)?;
        let done = if had { "reset to 1" } else { "already 1" };
        (1, done.to_owned())
    } else {
        let text = field(&form, "weight").map(str::trim).unwrap_or("");
        let weight: u32 = text.parse().map_err(|_| {
            let what = format!("a whole number from 1 to {MAX_FAIR_WEIGHT}");
            match text {
                "" => bad_parameter("weight", &format!("give {what}")),
                _ => bad_parameter("weight", &format!("{} is not {what}", excerpt(text))),
            }
        })?;
        // FairWeights refuses 0 and weights above the most, saying so.
        weights.set(key, weight).await.map_err(server_error)?;
        (weight, format!("set to {weight}"))
    };
    tracing::info!(user = %viewer.user.name, table = %t.name, key, weight, reset, "dashboard fair weight");
    let back = format!(
        "/t/{}/fairness?{}",
        url_escape(&t.name),
        super::notice::query(&s, &format!("weight of {} {done}", excerpt(key)))
    );
    Ok(Redirect::to(&viewer.href(&back)).into_response())
}
