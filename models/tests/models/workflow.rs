//! The workflow release model: the trigger as written, in one delete order and in
//! any; and two broken release rules.

use dbworker_models::check;
use dbworker_models::workflow::*;

fn model(ups: u8, deps: u8, late: bool, variant: Variant) -> WorkflowModel {
    WorkflowModel {
        ups,
        deps,
        late,
        any_order: false,
        aborts: 1,
        variant,
    }
}

fn run(m: &WorkflowModel) -> dbworker_models::Report {
    let r = check(m);
    println!(
        "workflow {}x{} late {} any order {} {:?}: {} states, depth {}",
        m.ups, m.deps, m.late, m.any_order, m.variant, r.unique_states, r.max_depth
    );
    r
}

#[test]
fn the_trigger_releases_each_dependent_once_after_all_upstreams() {
    let shapes = [
        model(2, 2, true, Variant::Real),
        model(3, 2, true, Variant::Real),
    ];
    for m in shapes {
        let r = run(&m);
        for p in [
            "released at most once",
            "never released early",
            "released once all completed",
        ] {
            assert!(!r.found(p), "{p}:\n{}", r.path(p));
        }
        assert!(!r.found("a deadlock"), "{}", r.path("a deadlock"));
        assert!(r.found("completions overlap"));
        assert!(
            r.complete && r.unique_states > 500,
            "{} states",
            r.unique_states
        );
    }
}

#[test]
fn deletes_in_different_orders_can_deadlock_but_stay_safe() {
    let r = run(&WorkflowModel {
        any_order: true,
        ..model(2, 2, false, Variant::Real)
    });
    for p in [
        "released at most once",
        "never released early",
        "released once all completed",
    ] {
        assert!(!r.found(p), "{p}:\n{}", r.path(p));
    }
    println!("deadlock:\n{}", r.path("a deadlock"));
    assert!(r.found("a deadlock"));
}

#[test]
fn a_snapshot_check_alone_never_releases() {
    let r = run(&model(2, 1, false, Variant::SnapshotOnly));
    println!("counterexample:\n{}", r.path("released once all completed"));
    assert!(r.found("released once all completed"));
}

#[test]
fn releasing_without_the_recheck_releases_early() {
    let r = run(&model(2, 1, false, Variant::NoRecheck));
    println!("counterexample:\n{}", r.path("never released early"));
    assert!(r.found("never released early"));
}

#[test]
fn the_set_wise_release_alone_and_beside_the_row_trigger_releases_once() {
    for variant in [Variant::SetWise, Variant::Mixed] {
        for m in [model(2, 2, true, variant), model(3, 2, true, variant)] {
            let r = run(&m);
            assert_safe(&r);
            assert!(!r.found("a deadlock"), "{}", r.path("a deadlock"));
            assert!(r.found("completions overlap"));
            assert!(
                r.complete && r.unique_states > 500,
                "{} states",
                r.unique_states
            );
        }
    }
    // One DELETE takes its edges in heap order: any order stays safe.
    let r = run(&WorkflowModel {
        any_order: true,
        ..model(2, 2, false, Variant::Mixed)
    });
    assert_safe(&r);
}

#[test]
fn the_set_wise_release_without_its_lock_never_releases() {
    let r = run(&model(2, 1, false, Variant::SetWiseNoLock));
    println!("counterexample:\n{}", r.path("released once all completed"));
    assert!(r.found("released once all completed"));
}

#[test]
fn the_set_wise_release_without_its_last_check_releases_early() {
    let r = run(&model(2, 1, false, Variant::SetWiseNoRecheck));
    println!("counterexample:\n{}", r.path("never released early"));
    assert!(r.found("never released early"));
}

/// None of the three safety properties is violated.
fn assert_safe(r: &dbworker_models::Report) {
    for p in [
        "released at most once",
        "never released early",
        "released once all completed",
    ] {
        assert!(!r.found(p), "{p}:\n{}", r.path(p));
    }
}
