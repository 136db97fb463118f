//! A tag for this process, in the names of its databases and cluster directories.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

/// A short random tag for this process, so that names stay unique across machines sharing a
/// server (where pids repeat, e.g. in containers).
pub(crate) fn process_tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        format!("{:08x}", hasher.finish() & 0xffff_ffff)
    })
}
