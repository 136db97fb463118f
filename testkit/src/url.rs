//! Small helpers for PostgreSQL connection URLs.

/// The parts of `scheme://authority/path?query#fragment`, borrowed from the URL.
struct Parts<'a> {
    /// `scheme://`
    scheme: &'a str,
    /// `user:password@host:port`
    authority: &'a str,
    /// Without the leading `?`.
    query: Option<&'a str>,
    /// With the leading `#`, or empty.
    fragment: &'a str,
}

fn split(url: &str) -> Result<Parts<'_>, String> {
    let scheme_len = url
        .find("://")
        .ok_or_else(|| "expected postgres://user@host:port/database".to_owned())?
        + 3;
    let scheme = &url[..scheme_len];
    if !matches!(
        scheme.to_ascii_lowercase().as_str(),
        "postgres://" | "postgresql://"
    ) {
        return Err(format!(
            "unsupported scheme `{scheme}` (expected postgres:// or postgresql://)"
        ));
    }
    let rest = &url[scheme_len..];
    let (rest, fragment) = match rest.find('#') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let authority = match rest.find('/') {
        Some(i) => &rest[..i],
        None => rest,
    };
    Ok(Parts {
        scheme,
        authority,
        query,
        fragment,
    })
}

/// Returns `url` with its database replaced by `database`: the path is replaced and any
/// `dbname=` query parameter (which would take precedence) is removed; other parameters stay.
pub(crate) fn with_database(url: &str, database: &str) -> Result<String, String> {
    let parts = split(url)?;
    let mut out = String::with_capacity(url.len() + database.len());
    out.push_str(parts.scheme);
    out.push_str(parts.authority);
    out.push('/');
    out.push_str(database);
    if let Some(query) = parts.query {
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| !pair.is_empty())
            .filter(|pair| pair.split('=').next() != Some("dbname"))
            .collect();
        if !kept.is_empty() {
            out.push('?');
            out.push_str(&kept.join("&"));
        }
    }
    out.push_str(parts.fragment);
    Ok(out)
}

/// Returns `url` with the password (if any) replaced by `***`, for error messages.
pub(crate) fn redact(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[start..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let Some(colon) = authority[..at].find(':') else {
        return url.to_owned();
    };
    format!(
        "{}{}:***{}",
        &url[..start],
        &authority[..colon],
        &url[start + at..]
    )
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
