//! Bad configuration reported by the command line as by the library: the
//! `dbworker migration` half of dbworker/tests/tables/robustness_config.rs.

use crate::common;

use std::collections::HashMap;

use dbworker::ddl::job_table_sql;

use common::Db;

#[tokio::test]
async fn colliding_renames_are_rejected_by_the_generator_and_the_store() {
    let renames: HashMap<String, String> = [("state".to_owned(), "id".to_owned())].into();
    let err = job_table_sql("jobs", &renames).unwrap_err().to_string();
    assert!(err.contains("would both be named \"id\""), "{err}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dbworker"))
        .args(["migration", "--table", "jobs", "--rename", "state=id"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("would both be named"));
    // The store takes its columns from the table's description.
    let mut o = Db::table_options();
    o.alternate_column_names = renames;
    assert!(
        o.validate()
            .unwrap_err()
            .to_string()
            .contains("would both be named")
    );
}

#[test]
fn a_malformed_database_url_says_what_was_expected_without_the_password() {
    for url in [
        "localhost:5432/app",
        "postgres://app:s3cret@db:notaport/app",
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dbworker"))
            .args(["status", "--table", "jobs", "--database-url", url])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{url}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("expected postgres://user@host:port/db"),
            "{url}: {err}"
        );
        assert!(!err.contains("s3cret"), "{url}: {err}");
    }
}
