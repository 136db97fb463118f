//! Small helpers for PostgreSQL connection URLs, on the `url` crate.

use url::Url;

fn parse(url: &str) -> Result<Url, String> {
    let parsed = Url::parse(url)
        .map_err(|e| format!("{e} (expected postgres://user@host:port/database)"))?;
    match parsed.scheme() {
        "postgres" | "postgresql" => Ok(parsed),
        other => Err(format!(
            "unsupported scheme `{other}://` (expected postgres:// or postgresql://)"
        )),
    }
}

/// Returns `url` with its database replaced by `database`: the path is replaced and any
/// `dbname=` query parameter (which would take precedence) is removed; other parameters stay
/// as written.
pub(crate) fn with_database(url: &str, database: &str) -> Result<String, String> {
    let mut parsed = parse(url)?;
    parsed.set_path(&format!("/{database}"));
    let kept: Vec<String> = parsed
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty() && pair.split('=').next() != Some("dbname"))
        .map(str::to_owned)
        .collect();
    parsed.set_query((!kept.is_empty()).then(|| kept.join("&")).as_deref());
    Ok(parsed.into())
}

/// Returns `url` with the password (if any) replaced by `***`, for error messages.
pub(crate) fn redact(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            // Cannot fail: a URL with a password has a host.
            let _ = parsed.set_password(Some("***"));
            parsed.into()
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_path() {
        assert_eq!(
            with_database("postgres://u:p@h:5432/app", "t1").unwrap(),
            "postgres://u:p@h:5432/t1"
        );
        assert_eq!(
            with_database("postgresql://h", "t1").unwrap(),
            "postgresql://h/t1"
        );
        assert_eq!(
            with_database("postgres://h/", "t1").unwrap(),
            "postgres://h/t1"
        );
    }

    #[test]
    fn keeps_query_and_drops_dbname() {
        assert_eq!(
            with_database("postgres://h/app?sslmode=disable", "t1").unwrap(),
            "postgres://h/t1?sslmode=disable"
        );
        assert_eq!(
            with_database("postgres://h?dbname=app&sslmode=disable&dbname=x", "t1").unwrap(),
            "postgres://h/t1?sslmode=disable"
        );
        assert_eq!(
            with_database("postgres://h/app?dbname=app", "t1").unwrap(),
            "postgres://h/t1"
        );
        assert_eq!(
            with_database("postgres://h/app?host=/tmp/s#frag", "t1").unwrap(),
            "postgres://h/t1?host=/tmp/s#frag"
        );
    }

    #[test]
    fn rejects_other_schemes() {
        assert!(with_database("mysql://h/app", "t1").is_err());
        assert!(with_database("not a url", "t1").is_err());
    }

    #[test]
    fn redacts_password() {
        assert_eq!(
            redact("postgres://user:secret@h:5432/db?x=1"),
            "postgres://user:***@h:5432/db?x=1"
        );
        assert_eq!(redact("postgres://user@h/db"), "postgres://user@h/db");
        assert_eq!(redact("postgres://h:5432/db"), "postgres://h:5432/db");
    }
}
