//! The signal-by-key model: a sender that locks the key's holder with the
//! key checked again reaches the job holding it; one that locks by id alone
//! signals a job that let the key go.

use dbworker_models::check;
use dbworker_models::signal_key::*;

fn run(m: &SignalKeyModel) -> dbworker_models::Report {
    let r = check(m);
    println!(
        "signal key {m:?}: {} states ({} at end), depth {}",
        r.unique_states, r.end_states, r.max_depth
    );
    r
}

#[test]
fn a_locked_key_recheck_delivers_to_the_holder() {
    for (senders, moves) in [(1, 2), (2, 2)] {
        let r = run(&SignalKeyModel {
            recheck: true,
            senders,
            moves,
        });
        let p = "a signal by key goes to the job holding the key";
        assert!(!r.found(p), "{senders} {moves}: {p}:\n{}", r.path(p));
        for p in [
            "a sender looks again after the key moved",
            "a later holder gets a signal",
        ] {
            assert!(r.found(p), "vacuous: {p}");
        }
        assert!(r.complete && r.unique_states > 20, "{}", r.unique_states);
    }
}

#[test]
fn a_lock_by_id_alone_signals_the_job_that_let_the_key_go() {
    let r = run(&SignalKeyModel {
        recheck: false,
        senders: 1,
        moves: 1,
    });
    let p = "a signal by key goes to the job holding the key";
    println!("counterexample:\n{}", r.path(p));
    assert!(r.found(p));
    assert!(!r.found("a sender looks again after the key moved"));
}
