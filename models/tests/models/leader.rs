//! The leader-term model: the locked check keeps writes in term order; today's
//! unguarded writes and an unlocked check do not.

use dbworker_models::check;
use dbworker_models::leader::*;

fn run(model: &LeaderModel) -> dbworker_models::Report {
    let r = check(model);
    println!(
        "leader {:?} (expiry checked: {}, new term on late renewal: {}): {} states, depth {}",
        model.guard,
        model.check_expiry,
        model.new_term_on_late_renewal,
        r.unique_states,
        r.max_depth
    );
    r
}

#[test]
fn a_locked_term_check_keeps_writes_in_term_order() {
    for (check_expiry, new_term_on_late_renewal) in
        [(true, false), (true, true), (false, false), (false, true)]
    {
        let r = run(&LeaderModel {
            check_expiry,
            new_term_on_late_renewal,
            ..LeaderModel::new(3, Guard::Locked)
        });
        for p in ["writes in term order", "no write after a newer grant"] {
            assert!(!r.found(p), "{p}:\n{}", r.path(p));
        }
        assert!(r.found("a new term writes while the old leader still believes"));
        assert!(
            r.complete && r.unique_states > 300,
            "{} states",
            r.unique_states
        );
    }
}

#[test]
fn todays_unguarded_writes_interleave_terms() {
    let r = run(&LeaderModel::new(2, Guard::None));
    println!("counterexample:\n{}", r.path("writes in term order"));
    assert!(r.found("writes in term order"));
    assert!(r.found("no write after a newer grant"));
}

#[test]
fn a_check_without_the_lock_lets_a_takeover_in() {
    let r = run(&LeaderModel::new(2, Guard::Unlocked));
    println!(
        "counterexample:\n{}",
        r.path("no write after a newer grant")
    );
    assert!(r.found("no write after a newer grant"));
}
