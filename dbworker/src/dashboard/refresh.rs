//! Keeping a page current. By default a page updates live: `live.js`
//! re-fetches it every [`LIVE_SECONDS`] while the tab is visible and swaps
//! in its content. `?refresh=5` reloads the page instead (and turns the
//! live updates off): `live.js` reloads it, and without script a refresh
//! meta tag in `<noscript>` does. With script, neither replaces a form the
//! operator has started filling in (a field focused, or edited and left):
//! the bar says the refresh waits. "pause" links to `?paused=5`, which
//! stops both and offers to resume at the same interval. Links between
//! pages carry the state along, so a paused dashboard stays paused.

use std::collections::HashMap;

use maud::{Markup, html};

use super::url_escape;

/// How often a page updates live, in seconds.
pub(crate) const LIVE_SECONDS: u32 = 5;

/// The shortest and longest intervals a page accepts, in seconds.
const INTERVALS: std::ops::RangeInclusive<u32> = 1..=3600;

/// The page's refresh state, and its other query parameters, so the
/// toggle's links keep the filters.
#[derive(Debug, Clone, Default)]
pub(crate) struct Refresh {
    /// Reload every this many seconds.
    pub(crate) every: Option<u32>,
    /// Paused; resuming reloads every this many seconds.
    pub(crate) paused: Option<u32>,
    pub(crate) query: String,
}

impl Refresh {
    /// The page's own address with `param=n` (`refresh` or `paused`), or
    /// with neither.
    fn link(&self, set: Option<(&str, u32)>) -> String {
        let mut parts: Vec<String> = Vec::new();
        if !self.query.is_empty() {
            parts.push(self.query.clone());
        }
        if let Some((param, n)) = set {
            parts.push(format!("{param}={n}"));
        }
        format!("?{}", parts.join("&"))
    }

    /// `path` with the refresh state carried along (for links to other pages).
    pub(crate) fn carried(&self, path: String) -> String {
        match (self.every, self.paused) {
            (Some(e), _) => format!("{path}?refresh={e}"),
            (None, Some(p)) => format!("{path}?paused={p}"),
            (None, None) => path,
        }
    }

    /// The interval of the live updates, unless the page reloads itself
    /// (`refresh`) or is paused.
    pub(crate) fn live(&self) -> Option<u32> {
        (self.every.is_none() && self.paused.is_none()).then_some(LIVE_SECONDS)
    }

    /// The toggle: the state, and the links that change it.
    pub(crate) fn bar(&self) -> Markup {
        html! {
            p class="muted refresh" id="refresh" data-refresh=(self.state()) {
                "Auto-refresh: "
                @match (self.every, self.paused) {
                    (Some(r), _) => {
                        strong { "every " (r) " s" } (held()) " · "
                        a id="refresh-pause" href=(self.link(Some(("paused", r)))) { "pause" }
                    }
                    (None, Some(r)) => {
                        strong { "paused" } " · "
                        a id="refresh-resume" href=(self.link(Some(("refresh", r)))) { "resume (every " (r) " s)" }
                    }
                    (None, None) => {
                        // Shown by live.js: without script the page is still.
                        span id="live-note" hidden {
                            strong { "live" } " (every " (LIVE_SECONDS) " s while this tab is visible)" (held()) " · "
                            a id="live-pause" href=(self.link(Some(("paused", LIVE_SECONDS)))) { "pause" } " · or reload "
                        }
                        span id="live-off" { "off · " }
                        a href=(self.link(Some(("refresh", 5)))) { "every 5 s" } " · "
                        a href=(self.link(Some(("refresh", 30)))) { "every 30 s" }
                    }
                }
            }
        }
    }

    /// The reload interval `live.js` keeps (`?refresh=`), so it can wait
    /// for a form; the meta tag does it without script.
    pub(crate) fn reload(&self) -> Option<u32> {
        self.every
    }

    fn state(&self) -> &'static str {
        match (self.every, self.paused) {
            (Some(_), _) => "on",
            (None, Some(_)) => "paused",
            (None, None) => "off",
        }
    }
}

/// What `live.js` shows while a form on the page holds the refresh back.
fn held() -> Markup {
    html! {
        span id="refresh-held" hidden {
            ", " strong { "waiting" } " while a form on this page is being filled in (submit it, or clear what you typed)"
        }
    }
}

/// The refresh state of a request's query (an interval out of range is
/// ignored), and its other parameters but `done` (a one-time notice).
pub(crate) fn refresh(q: &HashMap<String, String>) -> Refresh {
    let interval = |key: &str| {
        q.get(key)
            .and_then(|r| r.parse::<u32>().ok())
            .filter(|r| INTERVALS.contains(r))
    };
    let mut keys: Vec<&String> = q
        .keys()
        .filter(|k| !matches!(k.as_str(), "refresh" | "paused" | "done" | "sig"))
        .collect();
    keys.sort();
    let every = interval("refresh");
    Refresh {
        every,
        paused: interval("paused").filter(|_| every.is_none()),
        query: keys
            .iter()
            .map(|k| format!("{}={}", url_escape(k), url_escape(&q[*k])))
            .collect::<Vec<_>>()
            .join("&"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(query: &[(&str, &str)]) -> Refresh {
        refresh(
            &query
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    #[test]
    fn pause_and_resume_keep_the_interval_and_the_filters() {
        let on = of(&[("refresh", "30"), ("state", "failed"), ("done", "x")]);
        assert_eq!(on.state(), "on");
        let bar = on.bar().into_string();
        assert!(
            bar.contains("href=\"?state=failed&amp;paused=30\""),
            "{bar}"
        );
        let paused = of(&[("paused", "30"), ("state", "failed")]);
        assert_eq!((paused.every, paused.paused), (None, Some(30)));
        let bar = paused.bar().into_string();
        assert!(bar.contains("<strong>paused</strong>"), "{bar}");
        assert!(
            bar.contains("href=\"?state=failed&amp;refresh=30\""),
            "{bar}"
        );
        assert_eq!(
            paused.carried("/t/jobs/jobs".into()),
            "/t/jobs/jobs?paused=30"
        );
        assert_eq!(of(&[("refresh", "0")]).state(), "off", "out of range");
        assert_eq!(of(&[]).carried("/".into()), "/");
    }
}
