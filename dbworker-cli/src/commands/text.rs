//! Text for an operator's terminal: names and messages that come from
//! whoever enqueued or ran a job, with their control characters (an escape
//! sequence, a new line) shown as spaces.

/// `text` with its control characters (escape sequences, new lines) shown
/// as spaces, for a terminal.
pub(crate) fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// [`printable`] `text`, cut at `max` characters.
pub(crate) fn one_line(text: &str, max: usize) -> String {
    let flat = printable(text);
    match flat.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &flat[..cut]),
        None => flat,
    }
}
