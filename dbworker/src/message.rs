//! Text the store writes into `text` and `json` columns, made storable.
//!
//! Postgres `text` cannot hold a NUL byte, and `jsonb` rejects the escape
//! `\u0000`: a statement binding either fails, so a failure message containing a
//! NUL once left its job `processing` to be reset and re-run, with the real
//! reason lost. Every failure message and execution-log entry passes through here.
//!
//! Diagnostics (failure messages, log entries) have their NUL bytes replaced:
//! they are read by people, and losing them loses the reason. Data (a
//! handler's result, a payload to retry with, an enqueued job's values) is
//! never altered: a value holding a NUL is refused, naming where it is
//! ([`nul_path`], [`Error::NulCharacter`](crate::Error::NulCharacter)), so
//! what a consumer later reads is what the producer wrote.

use std::borrow::Cow;

use workerutil::ExecutionLogEntry;

/// The longest failure message the store writes, in bytes (UTF-8). A longer
/// message is cut on a character boundary and ends with
/// `… (truncated from N bytes)`, the whole staying within this limit.
pub const MAX_FAILURE_MESSAGE_BYTES: usize = 64 * 1024;

/// What a NUL byte becomes: visible, and distinct from U+FFFD (bad UTF-8).
const NUL_REPLACEMENT: &str = "\\0";

/// A failure message that Postgres accepts: NUL bytes replaced by `\0`, and
/// at most [`MAX_FAILURE_MESSAGE_BYTES`] bytes. Borrows when nothing changes.
pub(crate) fn sanitize_failure_message(message: &str) -> Cow<'_, str> {
    let message = replace_nul(message);
    if message.len() <= MAX_FAILURE_MESSAGE_BYTES {
        return message;
    }
    let marker = format!("… (truncated from {} bytes)", message.len());
    let mut end = MAX_FAILURE_MESSAGE_BYTES - marker.len();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}{marker}", &message[..end]))
}

/// An execution-log entry whose strings contain no NUL byte (which `jsonb`
/// rejects as `\u0000`). Borrows when nothing changes.
pub(crate) fn sanitize_log_entry(entry: &ExecutionLogEntry) -> Cow<'_, ExecutionLogEntry> {
    let has_nul = |s: &str| s.contains('\0');
    let dirty = has_nul(&entry.key)
        || has_nul(&entry.out)
        || entry.command.iter().any(|c| has_nul(c))
        || entry.start_time.as_deref().is_some_and(has_nul);
    if !dirty {
        return Cow::Borrowed(entry);
    }
    let clean = |s: &str| replace_nul(s).into_owned();
    Cow::Owned(ExecutionLogEntry {
        key: clean(&entry.key),
        command: entry.command.iter().map(|c| clean(c)).collect(),
        start_time: entry.start_time.as_deref().map(clean),
        exit_code: entry.exit_code,
        out: clean(&entry.out),
        duration_ms: entry.duration_ms,
    })
}

/// Where `value` first holds a NUL character, in a key or a string, as a
/// path (`$`, `$.name`, `$[2]`, `$["odd key"]`); `None` when it holds none.
pub(crate) fn nul_path(value: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    fn walk(value: &Value, path: &mut String) -> bool {
        match value {
            Value::String(s) => s.contains('\0'),
            Value::Array(items) => items.iter().enumerate().any(|(i, item)| {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                let found = walk(item, path);
                if !found {
                    path.truncate(len);
                }
                found
            }),
            Value::Object(map) => map.iter().any(|(key, item)| {
                let len = path.len();
                // A key that is not a plain name is written as a JSON string
                // (a NUL in it shows as \u0000).
                if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    path.push('.');
                    path.push_str(key);
                } else {
                    path.push_str(&format!("[{}]", Value::String(key.clone())));
                }
                let found = key.contains('\0') || walk(item, path);
                if !found {
                    path.truncate(len);
                }
                found
            }),
            _ => false,
        }
    }
    let mut path = String::from("$");
    walk(value, &mut path).then_some(path)
}

/// The failure message of an errored job whose payload to retry with
/// ([`DbJob::retry_with_payload`](crate::DbJob::retry_with_payload)) holds a
/// NUL; `None` when the payload is storable.
pub(crate) fn refused_payload(message: &str, payload: &serde_json::Value) -> Option<String> {
    let path = nul_path(payload)?;
    let refused = crate::error::Error::NulCharacter {
        what: format!("the payload to retry with (at {path})"),
    };
    Some(format!("{message}; not retried: {refused}"))
}

fn replace_nul(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', NUL_REPLACEMENT))
    } else {
        Cow::Borrowed(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_short_messages_are_borrowed_unchanged() {
        assert!(matches!(
            sanitize_failure_message("flaky upstream"),
            Cow::Borrowed("flaky upstream")
        ));
    }

    #[test]
    fn nul_bytes_become_visible() {
        assert_eq!(sanitize_failure_message("a\0b\0"), "a\\0b\\0");
    }

    #[test]
    fn long_messages_are_cut_on_a_char_boundary_with_a_marker() {
        // 3-byte characters, so the cut point usually falls inside one.
        let long = "€".repeat(MAX_FAILURE_MESSAGE_BYTES);
        let out = sanitize_failure_message(&long);
        assert!(out.len() <= MAX_FAILURE_MESSAGE_BYTES, "{}", out.len());
        assert!(out.len() > MAX_FAILURE_MESSAGE_BYTES - 40);
        let marker = format!("… (truncated from {} bytes)", long.len());
        assert!(out.ends_with(&marker), "{}", &out[out.len() - 60..]);
        assert!(out.trim_end_matches(&marker).chars().all(|c| c == '€'));
    }

    #[test]
    fn the_limit_applies_after_replacing_nul() {
        let nuls = "\0".repeat(MAX_FAILURE_MESSAGE_BYTES);
        let out = sanitize_failure_message(&nuls);
        assert!(out.len() <= MAX_FAILURE_MESSAGE_BYTES);
        assert!(!out.contains('\0'));
        let exact = "x".repeat(MAX_FAILURE_MESSAGE_BYTES);
        assert_eq!(sanitize_failure_message(&exact), exact);
    }

    #[test]
    fn nul_paths_name_the_key_or_string_holding_it() {
        use serde_json::json;
        assert_eq!(nul_path(&json!({"s": "a\u{0}b"})).as_deref(), Some("$.s"));
        assert_eq!(nul_path(&json!("\u{0}")).as_deref(), Some("$"));
        assert_eq!(
            nul_path(&json!({"ok": [1, "x"], "a": [{"b": 2}, {"c": ["", "\u{0}"]}]})).as_deref(),
            Some("$.a[1].c[1]")
        );
        assert_eq!(
            nul_path(&json!({"k\u{0}": 1})).as_deref(),
            Some("$[\"k\\u0000\"]")
        );
        assert_eq!(nul_path(&json!({"a": [1, "b", null, {"c": "d"}]})), None);
    }

    #[test]
    fn log_entries_lose_their_nul_bytes() {
        let entry = ExecutionLogEntry {
            key: "step".into(),
            command: vec!["printf".into(), "a\0b".into()],
            out: "x\0".into(),
            exit_code: Some(1),
            ..Default::default()
        };
        let clean = sanitize_log_entry(&entry);
        assert_eq!(clean.command, vec!["printf".to_owned(), "a\\0b".to_owned()]);
        assert_eq!(clean.out, "x\\0");
        assert_eq!(clean.exit_code, Some(1));
        let fine = ExecutionLogEntry::default();
        assert!(matches!(sanitize_log_entry(&fine), Cow::Borrowed(_)));
    }
}
