//! **The connection budget restates the code's constants.** docs/scaling.md's
//! "Connection budget" gives what a worker's pool holds besides its jobs
//! (`RESERVED_CONNECTIONS`) and how long transactional handling keeps a
//! committed job's connection for the next (`KEEP_FOR`). This reads both
//! constants from the source and checks the page states the same figures,
//! so changing one without the other fails here.

use std::fs;
use std::path::Path;

/// The digits after `prefix` in `text` (`const NAME: u32 = ` → `2`).
fn number_after(text: &str, prefix: &str, file: &str) -> u64 {
    let at = text
        .find(prefix)
        .unwrap_or_else(|| panic!("{file} has no `{prefix}`"))
        + prefix.len();
    let digits: String = text[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '_')
        .filter(|c| *c != '_')
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("{file}: no number after `{prefix}`"))
}

#[test]
fn the_connection_budget_states_the_codes_figures() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    let (store, open) = ("dbworker/src/store/mod.rs", "dbworker/src/store/open.rs");
    let reserved = number_after(
        &read(store),
        "pub const RESERVED_CONNECTIONS: u32 = ",
        store,
    );
    let keep_ms = number_after(
        &read(open),
        "const KEEP_FOR: Duration = Duration::from_millis(",
        open,
    );
    let doc = read("docs/scaling.md");
    let budget = &doc[doc
        .find("## Connection budget")
        .expect("docs/scaling.md has its Connection budget")..];
    for promise in [
        format!("at least {reserved} (`RESERVED_CONNECTIONS`"),
        format!("plus {reserved};"),
        format!("for up to {keep_ms} ms"),
    ] {
        assert!(
            budget.contains(&promise),
            "docs/scaling.md's Connection budget no longer says `{promise}`, the code's figure"
        );
    }
}
