//! The notice a page shows after an action ("Done: …"). The redirect carries
//! its text and a tag, SipHash-2-4 (a MAC for short inputs) under keys drawn
//! when the dashboard starts; a page shows a notice only when its tag
//! matches, so a crafted link cannot make the dashboard say "Done: deleted
//! 10000 jobs".

use std::collections::HashMap;
use std::hash::Hasher;

use super::{Shared, auth, url_escape};

/// The keys of the notices' tags, random per dashboard.
pub(crate) type Key = (u64, u64);

/// Fresh keys.
pub(crate) fn key() -> Key {
    (rand::random(), rand::random())
}

/// `done=…&sig=…`, the query of the redirect after an action saying `text`.
pub(crate) fn query(s: &Shared, text: &str) -> String {
    format!("done={}&sig={}", url_escape(text), tag(s, text))
}

/// The notice in `q`, when the dashboard wrote it (its tag matches).
pub(crate) fn of<'a>(s: &Shared, q: &'a HashMap<String, String>) -> Option<&'a str> {
    let text = q.get("done")?;
    let sig = q.get("sig")?;
    auth::constant_time_eq(sig, &tag(s, text)).then_some(text.as_str())
}

fn tag(s: &Shared, text: &str) -> String {
    let mut h = siphasher::sip::SipHasher24::new_with_keys(s.notice_key.0, s.notice_key.1);
    h.write(text.as_bytes());
    format!("{:016x}", h.finish())
}
