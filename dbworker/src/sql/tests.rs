//! Snapshot tests of the rendered SQL.

use super::*;
use crate::options::StoreOptions;

fn resolved(view: bool) -> Resolved {
    let mut o = StoreOptions::<()>::new("s", "example_jobs j", |_| Ok(()));
    if view {
        o.view_name = Some("example_jobs_with_repository_name v".into());
        o.order_by = Some("v.repository_id, v.id DESC NULLS LAST".into());
    }
    o.alternate_column_names.insert("state".into(), "status".into());
    o.max_num_retries = 2;
    o.resolve().unwrap()
}

#[test]
fn dump() {
    for view in [false, true] {
        let o = resolved(view);
        println!("{}\n", claim(&o, "host", &[Expr::cust_with_values("j.cost <= $1", [5])], 3).sql);
    }
    let o = resolved(false);
    for s in [
        lock_claimed(&o, 1, 2),
        select_record(&o, 1),
        heartbeat(&o, vec![1], vec![2]),
        mark_complete(&o, 1, 2),
        mark_errored(&o, 1, 2, "m"),
        mark_failed(&o, 1, 2, "m"),
        requeue(&o, 1, 2),
        log_append(&o, 1, 2, "{}".into()),
        log_update(&o, 1, 2, 0, "{}".into()),
        reset_stalled(&o.table, &o.columns, 5.0, 3, "m"),
        queued_count(&o),
        any_queued(&o),
        max_age_in_queue(&o),
        relation_columns(&o.table),
        probe_expressions(&o),
    ] {
        println!("{}\n", s.sql);
    }
}
