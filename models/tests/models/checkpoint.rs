//! The log-checkpoint model: the (xid, position) rule under the horizon; today's
//! position rule and the xid order without the horizon lose events.

use dbworker_models::check;
use dbworker_models::checkpoint::*;

const SAFETY: [&str; 4] = [
    "no event skipped",
    "no event handled twice",
    "only committed events handled",
    "all handled when quiet",
];

fn run(writers: u8, events_per_writer: u8, rule: Rule) -> dbworker_models::Report {
    let model = CheckpointModel {
        writers,
        events_per_writer,
        slice_size: 2,
        rule,
    };
    let r = check(&model);
    println!(
        "checkpoint {writers}x{events_per_writer} {rule:?}: {} states, depth {}",
        r.unique_states, r.max_depth
    );
    r
}

#[test]
fn the_xid_horizon_rule_handles_every_committed_event_once() {
    for (writers, events) in [(2, 2), (3, 1), (3, 2)] {
        let r = run(writers, events, Rule::XidHorizon);
        for p in SAFETY {
            assert!(!r.found(p), "{p}:\n{}", r.path(p));
        }
        assert!(r.found("a lower position commits after a higher one was handled"));
        assert!(
            r.complete && r.unique_states > 1_000,
            "{} states",
            r.unique_states
        );
    }
}

#[test]
fn todays_position_rule_loses_an_event() {
    let r = run(2, 1, Rule::Position);
    println!("counterexample:\n{}", r.path("no event skipped"));
    assert!(r.found("no event skipped"));
    assert!(r.found("all handled when quiet"));
}

#[test]
fn the_xid_order_without_the_horizon_loses_an_event() {
    let r = run(2, 1, Rule::XidOnly);
    println!("counterexample:\n{}", r.path("no event skipped"));
    assert!(r.found("no event skipped"));
}
