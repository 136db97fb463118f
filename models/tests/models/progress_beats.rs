//! The heartbeat-carried progress model: with every guard of `Pending` and
//! the beat's lock re-check, reports and own writes stay fenced and ordered;
//! without each one, the checker finds the bug it prevents.

use dbworker_models::check;
use dbworker_models::progress_beats::*;

const SAFETY: [&str; 4] = [
    "no beat writes for an attempt that lost its claim",
    "no write of the owner is refused as stale",
    "no older report lands over a newer value",
    "the last report reaches the row",
];

fn run(m: &BeatsModel) -> dbworker_models::Report {
    let r = check(m);
    println!(
        "progress beats {m:?}: {} states ({} at end), depth {}",
        r.unique_states, r.end_states, r.max_depth
    );
    r
}

/// Runs `m`, prints the counterexample of `property`, and asserts it was found.
fn finds(m: &BeatsModel, property: &str) -> dbworker_models::Report {
    let r = run(m);
    println!("counterexample ({property}):\n{}", r.path(property));
    assert!(r.found(property), "{property}");
    r
}

#[test]
fn beats_and_own_writes_keep_progress_fenced_and_ordered() {
    let r = run(&BeatsModel::new());
    for p in SAFETY {
        assert!(!r.found(p), "{p}:\n{}", r.path(p));
    }
    for p in [
        "a beat writes a report",
        "a beat finds the claim gone under its lock",
        "a report a beat missed goes back",
        "an own write counts a beat's write",
        "the final mark writes the last report",
        "the new attempt writes",
    ] {
        assert!(r.found(p), "vacuous: {p}");
    }
    assert!(
        r.complete && r.unique_states > 500,
        "{} states",
        r.unique_states
    );
}

#[test]
fn a_beat_locking_by_id_alone_writes_the_old_attempts_report_after_a_new_claim() {
    let m = BeatsModel {
        recheck_lock: false,
        ..BeatsModel::new()
    };
    finds(&m, "no beat writes for an attempt that lost its claim");
    // After a new claim, the count the stale beat adds refuses the new
    // owner's write.
    finds(&m, "no write of the owner is refused as stale");
}

#[test]
fn an_own_write_not_counting_the_beats_writes_is_refused_as_stale() {
    let m = BeatsModel {
        count_beats: false,
        ..BeatsModel::new()
    };
    let r = finds(&m, "no write of the owner is refused as stale");
    assert!(!r.found("no older report lands over a newer value"));
    assert!(!r.found("no beat writes for an attempt that lost its claim"));
}

#[test]
fn an_own_write_not_waiting_for_the_beat_is_overwritten_by_an_older_report() {
    let m = BeatsModel {
        wait_for_beats: false,
        ..BeatsModel::new()
    };
    finds(&m, "no older report lands over a newer value");
    let r = finds(&m, "no write of the owner is refused as stale");
    assert!(!r.found("no beat writes for an attempt that lost its claim"));
}

#[test]
fn a_beat_taking_the_report_during_a_checkpoint_write_gets_it_refused() {
    let m = BeatsModel {
        hold_while_writing: false,
        ..BeatsModel::new()
    };
    let r = finds(&m, "no write of the owner is refused as stale");
    assert!(!r.found("no older report lands over a newer value"));
}

#[test]
fn a_report_a_beat_missed_is_lost_unless_it_goes_back() {
    let m = BeatsModel {
        give_back: false,
        ..BeatsModel::new()
    };
    let r = finds(&m, "the last report reaches the row");
    for p in &SAFETY[..3] {
        assert!(!r.found(p), "{p}:\n{}", r.path(p));
    }
}

/// Not a guard removed: the real heartbeat loop drops a beat after its
/// interval and `returned` treats it as failed, but its statement may still
/// commit. The checker finds what that does, with every guard in place.
#[test]
fn a_beat_given_up_at_its_timeout_can_still_land() {
    let m = BeatsModel {
        abandon: true,
        ..BeatsModel::new()
    };
    finds(&m, "no older report lands over a newer value");
    finds(&m, "no write of the owner is refused as stale");
}
