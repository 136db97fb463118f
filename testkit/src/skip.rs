//! Skipping a test whose tools are missing, said aloud; under `CI=true` a
//! skip is a failure, so a green CI run never hides a whole suite (`.ci/run`
//! installs what the tests need).

/// Says that `test` is skipped and why; panics instead under `CI=true`.
pub fn skip(test: &str, reason: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("{test} would be skipped under CI=true, which fails instead: {reason}");
    }
    println!("skipping {test}: {reason}");
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_skip_names_the_test_and_the_reason() {
        let result = std::panic::catch_unwind(|| super::skip("the t test", "no tool"));
        let under_ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        assert_eq!(result.is_err(), under_ci);
    }
}
