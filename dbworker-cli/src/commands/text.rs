//! Text for an operator's terminal: names and messages that come from
//! whoever enqueued or ran a job, with their control characters (an escape
//! sequence, a new line) shown as spaces, or escaped in JSON.

use std::fmt::Write;

/// `text` with its control characters (escape sequences, new lines) shown
/// as spaces, for a terminal.
pub(crate) fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// JSON `text` with the control characters serde_json leaves raw (DEL and
/// the C1 set, U+007F to U+009F: U+009B is a terminal's CSI) escaped as
/// `\u00XX`: the same JSON, safe on a terminal. Outside its strings JSON
/// text holds no control character but the pretty printer's new lines.
pub(crate) fn json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// [`printable`] `text`, cut at `max` characters.
pub(crate) fn one_line(text: &str, max: usize) -> String {
    let flat = printable(text);
    match flat.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &flat[..cut]),
        None => flat,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_escapes_what_serde_json_leaves_raw_and_stays_the_same_json() {
        let value = serde_json::json!({"queue": "q\u{9b}2J\u{7f}\u{1b}[2J\nx"});
        let text = serde_json::to_string_pretty(&value).unwrap();
        assert!(text.contains('\u{9b}'), "serde_json leaves it: {text:?}");
        let safe = super::json(&text);
        assert!(
            !safe.chars().any(|c| c.is_control() && c != '\n'),
            "{safe:?}"
        );
        assert!(safe.contains("q\\u009b2J\\u007f\\u001b[2J\\nx"), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, value);
    }
}
