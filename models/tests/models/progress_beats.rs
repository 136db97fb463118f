//! The heartbeat-carried progress model: with every write numbered and every
//! guard of `Pending` and the beat's lock re-check, reports and own writes
//! stay fenced and ordered, a beat given up that commits late included;
//! without each guard, the checker finds the bug it prevents.

use dbworker_models::check;
use dbworker_models::progress_beats::*;

const SAFETY: [&str; 5] = [
    "no beat writes for an attempt that lost its claim",
    "no write of the owner is refused",
    "no older report lands over a newer value",
    "no beat given up lands an older report over a newer value",
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

fn holds(r: &dbworker_models::Report, properties: &[&str]) {
    for p in properties {
        assert!(!r.found(p), "{p}:\n{}", r.path(p));
    }
}

#[test]
fn beats_and_own_writes_keep_progress_fenced_and_ordered() {
    let r = run(&BeatsModel::new());
    holds(&r, &SAFETY);
    for p in [
        "a beat writes a report",
        "a beat finds the claim gone under its lock",
        "a report a beat missed goes back",
        "a beat is refused by a newer write's number",
        "the final mark writes the last report",
        "the final mark writes the report a beat still carries",
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

/// The heartbeat loop drops a beat at its timeout (and a beat may fail after
/// its commit): `returned` gives its report back, though its statement may
/// still commit. Its number is below every write sent after it: landing
/// late, it is refused, and nothing moves back.
#[test]
fn a_beat_given_up_that_commits_late_is_refused_by_its_number() {
    let m = BeatsModel {
        abandon: true,
        ..BeatsModel::new()
    };
    let r = run(&m);
    holds(&r, &SAFETY);
    let p = "a beat given up that commits late is refused by its number";
    println!("example ({p}):\n{}", r.path(p));
    assert!(r.found(p), "vacuous: {p}");
    assert!(r.complete, "{} states", r.unique_states);
}

/// The statement before numbering: a beat lands by its token alone. A beat
/// on its way lands an older report over a newer own write; a beat given up
/// lands the report it gave back over its newer write (the old late-beat
/// limit).
#[test]
fn a_beat_landing_by_token_alone_puts_an_older_report_over_a_newer_value() {
    let m = BeatsModel {
        number_writes: false,
        ..BeatsModel::new()
    };
    let r = finds(&m, "no older report lands over a newer value");
    holds(&r, &["no beat writes for an attempt that lost its claim"]);
    let m = BeatsModel {
        number_writes: false,
        abandon: true,
        ..BeatsModel::new()
    };
    finds(
        &m,
        "no beat given up lands an older report over a newer value",
    );
}

#[test]
fn a_beat_locking_by_id_alone_writes_the_old_attempts_report_after_a_new_claim() {
    let m = BeatsModel {
        recheck_lock: false,
        ..BeatsModel::new()
    };
    finds(&m, "no beat writes for an attempt that lost its claim");
    // After a new claim, the number the stale beat sets refuses the new
    // owner's write.
    finds(&m, "no write of the owner is refused");
}

#[test]
fn a_beat_numbered_during_a_checkpoint_write_gets_it_refused() {
    let m = BeatsModel {
        hold_while_writing: false,
        ..BeatsModel::new()
    };
    let r = finds(&m, "no write of the owner is refused");
    holds(&r, &["no older report lands over a newer value"]);
}

#[test]
fn a_report_a_beat_missed_is_lost_unless_it_goes_back() {
    let m = BeatsModel {
        give_back: false,
        ..BeatsModel::new()
    };
    let r = finds(&m, "the last report reaches the row");
    holds(&r, &SAFETY[..4]);
}

#[test]
fn a_report_an_own_write_outnumbered_goes_back_and_lands_over_it() {
    let m = BeatsModel {
        drop_superseded: false,
        ..BeatsModel::new()
    };
    let r = finds(&m, "no older report lands over a newer value");
    holds(&r, &["no beat writes for an attempt that lost its claim"]);
}

#[test]
fn a_mark_writing_only_the_unsent_report_loses_the_one_a_beat_carries() {
    let m = BeatsModel {
        mark_in_flight: false,
        ..BeatsModel::new()
    };
    let r = finds(&m, "the last report reaches the row");
    holds(&r, &SAFETY[..4]);
}
