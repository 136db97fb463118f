//! The signal-consumption model: a consumption that locks the job row checks
//! the claim as it is when the signal is taken; one that reads it in its
//! snapshot lets an attempt whose claim was lost take the signal.

use dbworker_models::check;
use dbworker_models::signal_consume::*;

fn run(m: &ConsumeModel) -> dbworker_models::Report {
    let r = check(m);
    println!(
        "signal consume {m:?}: {} states ({} at end), depth {}",
        r.unique_states, r.end_states, r.max_depth
    );
    r
}

#[test]
fn a_consumption_locking_the_job_row_is_the_owners_alone() {
    for max_resets in [1, 2] {
        let r = run(&ConsumeModel {
            lock_job: true,
            max_resets,
        });
        for p in [
            "nothing consumed by a stale token",
            "each signal consumed at most once",
        ] {
            assert!(!r.found(p), "{max_resets}: {p}:\n{}", r.path(p));
        }
        for p in [
            "a stale consumption is refused",
            "a later attempt consumes the signal",
        ] {
            assert!(r.found(p), "vacuous: {p}");
        }
        assert!(r.complete && r.unique_states > 20, "{}", r.unique_states);
    }
}

#[test]
fn a_snapshot_claim_check_lets_a_lost_attempt_consume() {
    let r = run(&ConsumeModel {
        lock_job: false,
        max_resets: 1,
    });
    let p = "nothing consumed by a stale token";
    println!("counterexample:\n{}", r.path(p));
    assert!(r.found(p));
    assert!(!r.found("each signal consumed at most once"));
}
