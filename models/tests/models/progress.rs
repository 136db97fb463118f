//! The progress model: a checkpoint write fenced by token and seq; without the
//! seq one attempt's reordered writes move progress back, and without the
//! token a slow attempt overwrites the next one's.

use dbworker_models::check;
use dbworker_models::progress::*;

const SAFETY: [&str; 3] = [
    "checkpoint never moves backward",
    "no write of an old attempt after a new claim",
    "a new attempt resumes from the latest checkpoint",
];

fn run(writes: u8, fence: Fence) -> dbworker_models::Report {
    let r = check(&ProgressModel { writes, fence });
    println!(
        "progress {writes} writes {fence:?}: {} states ({} end states), depth {}",
        r.unique_states, r.end_states, r.max_depth
    );
    r
}

#[test]
fn token_and_seq_keep_progress_monotonic_across_retries() {
    for writes in [2, 3] {
        let r = run(writes, Fence::TokenAndSeq);
        for p in SAFETY {
            assert!(!r.found(p), "{writes}: {p}:\n{}", r.path(p));
        }
        for p in [
            "a new attempt resumes from progress",
            "writes land out of order",
            "a write is refused",
        ] {
            assert!(r.found(p), "vacuous: {p}");
        }
        assert!(
            r.complete && r.unique_states > 100,
            "{} states",
            r.unique_states
        );
    }
}

#[test]
fn a_token_without_the_seq_lets_reordered_writes_move_progress_back() {
    let r = run(2, Fence::TokenOnly);
    println!(
        "counterexample:\n{}",
        r.path("checkpoint never moves backward")
    );
    println!(
        "counterexample:\n{}",
        r.path("a new attempt resumes from the latest checkpoint")
    );
    assert!(r.found("checkpoint never moves backward"));
    assert!(r.found("a new attempt resumes from the latest checkpoint"));
    assert!(!r.found("no write of an old attempt after a new claim"));
}

#[test]
fn an_unfenced_write_lets_a_slow_attempt_overwrite_the_next() {
    let r = run(2, Fence::None);
    println!(
        "counterexample:\n{}",
        r.path("no write of an old attempt after a new claim")
    );
    println!(
        "counterexample:\n{}",
        r.path("checkpoint never moves backward")
    );
    assert!(r.found("no write of an old attempt after a new claim"));
    assert!(r.found("checkpoint never moves backward"));
}
