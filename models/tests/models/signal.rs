//! The durable-signal model: a sender and a wait mark that both lock the job
//! row first lose no wake-up; the conditional wake alone does, so does a mark
//! whose read is its `UPDATE`'s snapshot, and a mark without the token lets a
//! stale attempt consume the signal.

use dbworker_models::check;
use dbworker_models::signal::*;

const SAFETY: [&str; 7] = [
    "never waiting on a committed signal",
    "no timeout with a committed signal unseen",
    "no job left waiting on a delivered signal",
    "each signal consumed at most once",
    "one signal row per dedupe key",
    "nothing consumed by a stale token",
    "no stale attempt changes the job",
];

fn run(m: &SignalModel) -> dbworker_models::Report {
    let r = check(m);
    println!(
        "signal {:?} fenced {} keys {:?} timeouts {} aborts {}: {} states ({} at end), depth {}",
        m.protocol,
        m.fenced,
        m.keys,
        m.timeouts,
        m.aborts,
        r.unique_states,
        r.end_states,
        r.max_depth
    );
    r
}

#[test]
fn locking_the_job_row_first_loses_no_wake_up() {
    for keys in [&[0, 0][..], &[0, 1][..], &[0, 0, 1][..]] {
        for (timeouts, aborts) in [(false, false), (true, true)] {
            let r = run(&SignalModel {
                timeouts,
                aborts,
                ..SignalModel::new(Protocol::Locked, keys)
            });
            for p in SAFETY {
                assert!(
                    !r.found(p),
                    "{keys:?} {timeouts} {aborts}: {p}:\n{}",
                    r.path(p)
                );
            }
            for p in [
                "a signal sent before the wait is seen without parking",
                "a parked job is woken and consumes its signal",
                "a stale attempt is refused",
            ] {
                assert!(r.found(p), "vacuous: {p}");
            }
            assert_eq!(r.found("a duplicate send is absorbed"), keys[0] == keys[1]);
            assert_eq!(r.found("a wait times out"), timeouts);
            assert!(
                r.complete && r.unique_states > 200,
                "{} states",
                r.unique_states
            );
        }
    }
}

#[test]
fn a_conditional_wake_alone_loses_the_wake_up() {
    let r = run(&SignalModel::new(Protocol::Naive, &[0]));
    println!(
        "counterexample:\n{}",
        r.path("no job left waiting on a delivered signal")
    );
    println!(
        "counterexample:\n{}",
        r.path("never waiting on a committed signal")
    );
    assert!(r.found("never waiting on a committed signal"));
    assert!(r.found("no job left waiting on a delivered signal"));
    for p in &SAFETY[3..] {
        assert!(!r.found(p), "{p}:\n{}", r.path(p));
    }
}

#[test]
fn with_deadlines_the_lost_wake_up_becomes_a_blind_timeout() {
    let r = run(&SignalModel {
        timeouts: true,
        ..SignalModel::new(Protocol::Naive, &[0])
    });
    println!(
        "counterexample:\n{}",
        r.path("no timeout with a committed signal unseen")
    );
    assert!(r.found("no timeout with a committed signal unseen"));
    assert!(r.found("never waiting on a committed signal"));
}

#[test]
fn a_one_statement_mark_reads_a_snapshot_from_before_its_lock_wait() {
    let r = run(&SignalModel::new(Protocol::OneStatement, &[0]));
    println!(
        "counterexample:\n{}",
        r.path("never waiting on a committed signal")
    );
    assert!(r.found("never waiting on a committed signal"));
    assert!(r.found("no job left waiting on a delivered signal"));
}

#[test]
fn a_mark_without_the_token_lets_a_stale_attempt_consume() {
    let r = run(&SignalModel {
        fenced: false,
        ..SignalModel::new(Protocol::Locked, &[0])
    });
    println!(
        "counterexample:\n{}",
        r.path("nothing consumed by a stale token")
    );
    assert!(r.found("nothing consumed by a stale token"));
    assert!(r.found("no stale attempt changes the job"));
}
