//! The claim model: fenced marks hold in both handling modes; without the token,
//! or with a token from the clock alone, they do not.

use dbworker_models::check;
use dbworker_models::claim::*;

fn run(workers: u8, handling: Handling, guard: Guard) -> dbworker_models::Report {
    let report = check(&ClaimModel::new(workers, 2, handling, guard));
    println!(
        "claim {workers} workers {handling:?} {guard:?}: {} states ({} end states), depth {}",
        report.unique_states, report.end_states, report.max_depth
    );
    report
}

#[test]
fn fencing_holds_in_both_handling_modes() {
    for handling in [Handling::Heartbeat, Handling::Transactional] {
        let r = run(3, handling, Guard::Fenced);
        for p in [
            "no stale mark accepted",
            "at most one live claimant",
            "no job lost",
        ] {
            assert!(!r.found(p), "{handling:?}: {p}:\n{}", r.path(p));
        }
        assert!(r.found("a job completes after a reset"), "vacuous");
        assert!(r.unique_states > 10_000, "{} states", r.unique_states);
    }
}

#[test]
fn marks_fenced_by_state_alone_accept_a_stale_claimant() {
    let r = run(2, Handling::Heartbeat, Guard::StateOnly);
    println!("counterexample:\n{}", r.path("no stale mark accepted"));
    assert!(r.found("no stale mark accepted"));
    assert!(r.found("at most one live claimant"));
}

#[test]
fn a_token_from_the_clock_alone_lets_two_claimants_mark() {
    let r = run(2, Handling::Heartbeat, Guard::ClockToken);
    println!("counterexample:\n{}", r.path("at most one live claimant"));
    assert!(r.found("at most one live claimant"));
    assert!(r.found("no stale mark accepted"));
}
