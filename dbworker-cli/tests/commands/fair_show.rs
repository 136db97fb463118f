//! `dbworker show` on a fair table: a job waiting for its run-at is
//! untagged, and its tag is printed in words, not as the number that keeps
//! it behind every tagged job (2^62); a tagged job's tag is printed as is,
//! and `--format json` keeps the stored number.

use crate::cli;
use crate::common;

use std::collections::HashMap;

use dbworker::ddl::{FairClaims, fair_claims_sql};
use serde_json::{Value, json};

use cli::{dbworker, ok};
use common::Db;

#[tokio::test]
async fn show_prints_an_untagged_fair_tag_in_words() {
    let db = Db::new().await;
    db.execute(&fair_claims_sql("jobs", &HashMap::new(), &FairClaims::default()).unwrap())
        .await;
    let due = db.enqueue(1, json!({})).await[0];
    let later: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (process_after) VALUES (now() + interval '1 hour') RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let show = |id: i64, json: bool| {
        let id = id.to_string();
        let mut args = vec!["show", id.as_str()];
        if json {
            args.extend(["--format", "json"]);
        }
        serde_json::from_str::<Value>(&ok(&dbworker(&db, &args))).unwrap()
    };
    assert_eq!(show(later, false)["fair_tag"], "untagged (not due yet)");
    assert_eq!(show(later, true)["fair_tag"], json!(1i64 << 62));
    assert_eq!(show(due, false)["fair_tag"], json!(0));
}
