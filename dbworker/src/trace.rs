//! Trace context from enqueue to every attempt, on a table with
//! `dbworker migration --traces`: [`TraceContext`], what an enqueue stores
//! (W3C `traceparent` and `tracestate`, in columns of their own, never the
//! payload), and how an attempt's `job` span is tied to it.
//!
//! The rule (with the `opentelemetry` feature): a job's first attempt that
//! starts within 60 s of its enqueue (by the database clock) is
//! a child of the enqueue's span, so it inherits the producer's sampling
//! decision; any other attempt is a root of its own linked to the enqueue's
//! span and to the span its previous attempt ran under (written by that
//! attempt's fenced mark, and by its first heartbeat for a worker killed
//! before its mark), so a retry hours later does not stretch the
//! producer's trace. Without the feature, contexts are still stored (given
//! with [`NewJob::trace_context`](crate::NewJob::trace_context) or the
//! session setting) and nothing else happens.

use crate::error::{Error, Result};

/// A W3C trace context: a `traceparent` (`00-<trace id>-<span id>-<flags>`,
/// lowercase hex) and an optional `tracestate`, kept byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

impl TraceContext {
    /// A context from its headers; a `traceparent` that is not version `00`
    /// with a non-zero trace and span id, or a `tracestate` holding a NUL
    /// character, is refused, naming the header.
    ///
    /// ```
    /// use dbworker::TraceContext;
    /// let cx = TraceContext::new(
    ///     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ///     Some("congo=t61rcWkgMzE".into()),
    /// )?;
    /// assert_eq!(cx.tracestate(), Some("congo=t61rcWkgMzE"));
    /// assert!(TraceContext::new("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None).is_err());
    /// # Ok::<(), dbworker::Error>(())
    /// ```
    pub fn new(traceparent: impl Into<String>, tracestate: Option<String>) -> Result<TraceContext> {
        let traceparent = traceparent.into();
        if let Some(reason) = traceparent_problem(&traceparent) {
            return Err(Error::InvalidOption {
                field: "traceparent",
                reason: format!("{traceparent:?} {reason}"),
            });
        }
        if tracestate.as_deref().is_some_and(|s| s.contains('\0')) {
            return Err(Error::InvalidOption {
                field: "tracestate",
                reason: "holds a NUL character, which PostgreSQL's text cannot store".into(),
            });
        }
        Ok(TraceContext {
            traceparent,
            tracestate,
        })
    }

    /// The `traceparent` header.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` header, if any.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The context of the current `tracing` span as OpenTelemetry sees it
    /// (the `opentelemetry` feature), when it is valid; `None` without the
    /// feature. Enqueues on a table with traces store it unless the job
    /// names its own.
    pub fn current() -> Option<TraceContext> {
        #[cfg(feature = "opentelemetry")]
        {
            otel::current()
        }
        #[cfg(not(feature = "opentelemetry"))]
        {
            None
        }
    }
}

/// What is wrong with a `traceparent`, if anything.
fn traceparent_problem(tp: &str) -> Option<&'static str> {
    let parts: Vec<&str> = tp.split('-').collect();
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let zero = |s: &str| s.bytes().all(|b| b == b'0');
    match parts.as_slice() {
        [version, trace, span, flags]
            if hex(version, 2) && hex(trace, 32) && hex(span, 16) && hex(flags, 2) =>
        {
            if *version != "00" {
                Some("is not version 00 of W3C trace context")
            } else if zero(trace) || zero(span) {
                Some("has an all-zero trace or span id")
            } else {
                None
            }
        }
        _ => Some("is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>, lowercase)"),
    }
}

/// What a claimed job's row says about its trace: the enqueue's context,
/// the span its previous attempt ran under, and whether this attempt is the
/// first and prompt (a child of the enqueue rather than a linked root).
#[derive(Debug, Clone, Default)]
#[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
pub(crate) struct JobTrace {
    pub(crate) enqueue: Option<TraceContext>,
    pub(crate) follows: Option<String>,
    pub(crate) fresh: bool,
}

impl JobTrace {
    /// What a claim's row returned (see `sql::CLAIMED_TRACE_PARENT`).
    pub(crate) fn from_claim(row: &sqlx::postgres::PgRow) -> JobTrace {
        use crate::sql::{
            CLAIMED_TRACE_FOLLOWS, CLAIMED_TRACE_FRESH, CLAIMED_TRACE_PARENT, CLAIMED_TRACE_STATE,
        };
        use sqlx::Row;
        let get = |name: &str| row.try_get::<Option<String>, _>(name).ok().flatten();
        let enqueue = get(CLAIMED_TRACE_PARENT)
            .and_then(|p| TraceContext::new(p, get(CLAIMED_TRACE_STATE)).ok());
        let fresh = row
            .try_get::<Option<bool>, _>(CLAIMED_TRACE_FRESH)
            .ok()
            .flatten()
            .unwrap_or(false);
        JobTrace {
            enqueue,
            follows: get(CLAIMED_TRACE_FOLLOWS),
            fresh,
        }
    }
}

/// Ties the attempt's `span` (just made, not yet entered) to the job's
/// trace; returns the attempt's own `traceparent`, which its mark records
/// for the next attempt. A stored context that does not parse is ignored.
pub(crate) fn link_attempt(span: &tracing::Span, job: &JobTrace) -> Option<String> {
    #[cfg(feature = "opentelemetry")]
    {
        otel::link_attempt(span, job)
    }
    #[cfg(not(feature = "opentelemetry"))]
    {
        let _ = (span, job);
        None
    }
}

/// Links the attempt's `span` to the span that sent it a signal (a stored
/// `traceparent`; one that does not parse is ignored).
pub(crate) fn link_sender(span: &tracing::Span, sender: &str) {
    #[cfg(feature = "opentelemetry")]
    {
        otel::link_to(span, sender);
    }
    #[cfg(not(feature = "opentelemetry"))]
    {
        let _ = (span, sender);
    }
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::{JobTrace, TraceContext};

    fn header(cx: &SpanContext) -> String {
        format!(
            "00-{}-{}-{:02x}",
            cx.trace_id(),
            cx.span_id(),
            cx.trace_flags().to_u8()
        )
    }

    pub(super) fn current() -> Option<TraceContext> {
        let cx = tracing::Span::current().context();
        let span = cx.span();
        let sc = span.span_context();
        if !sc.is_valid() {
            return None;
        }
        let state = sc.trace_state().header();
        Some(TraceContext {
            traceparent: header(sc),
            tracestate: (!state.is_empty()).then_some(state),
        })
    }

    /// A remote span context from stored headers (`None` if they do not parse).
    fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
        let mut parts = traceparent.split('-');
        let (_, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let state = tracestate
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        let cx = SpanContext::new(
            TraceId::from_hex(trace).ok()?,
            SpanId::from_hex(span).ok()?,
            TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
            true,
            state,
        );
        cx.is_valid().then_some(cx)
    }

    pub(super) fn link_to(span: &tracing::Span, traceparent: &str) {
        if let Some(cx) = parse(traceparent, None) {
            span.add_link(cx);
        }
    }

    pub(super) fn link_attempt(span: &tracing::Span, job: &JobTrace) -> Option<String> {
        let enqueue = job
            .enqueue
            .as_ref()
            .and_then(|e| parse(&e.traceparent, e.tracestate.as_deref()));
        match enqueue {
            Some(parent) if job.fresh => {
                let cx = opentelemetry::Context::new().with_remote_span_context(parent);
                // Fails only when no OpenTelemetry layer is installed.
                let _ = span.set_parent(cx);
            }
            Some(enqueue) => span.add_link(enqueue),
            None => {}
        }
        if let Some(previous) = job.follows.as_deref().and_then(|f| parse(f, None)) {
            span.add_link(previous);
        }
        let own = span.context();
        let own = own.span();
        let own = own.span_context();
        own.is_valid().then(|| header(own))
    }
}
