//! Small helpers for PostgreSQL connection URLs, on the `url` crate.

use url::Url;

use crate::Error;

/// The form a connection URL must take, named in every error about one.
const EXPECTED: &str = "postgres://user@host:port/db";

fn parse(url: &str) -> Result<Url, String> {
    let problem = match Url::parse(url) {
        // `host:port/db` and `user:password@host` parse as a scheme and a path.
        Ok(parsed) if parsed.cannot_be_a_base() => "it does not start with postgres://".to_owned(),
        Ok(parsed) if matches!(parsed.scheme(), "postgres" | "postgresql") => return Ok(parsed),
        Ok(parsed) => format!(
            "unsupported scheme `{}://` (postgres:// or postgresql://)",
            parsed.scheme()
        ),
        // The url crate's "relative URL without a base": no scheme at all.
        Err(url::ParseError::RelativeUrlWithoutBase) => {
            "it does not start with postgres://".to_owned()
        }
        Err(e) => e.to_string(),
    };
    Err(format!("{problem}; expected {EXPECTED}"))
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

/// Returns `url` reaching `address` (`host:port`, a pooler in front of the same server)
/// instead of its own host and port.
pub(crate) fn through(url: &str, address: &str) -> Result<String, String> {
    let mut parsed = parse(url)?;
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| format!("{address:?} is not host:port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{address:?} is not host:port"))?;
    parsed
        .set_host(Some(host))
        .map_err(|e| format!("{address:?}: {e}"))?;
    parsed
        .set_port(Some(port))
        .map_err(|()| format!("{address:?}: no port here"))?;
    // A socket directory given as `host=` would take precedence.
    let kept: Vec<String> = parsed
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty() && pair.split('=').next() != Some("host"))
        .map(str::to_owned)
        .collect();
    parsed.set_query((!kept.is_empty()).then(|| kept.join("&")).as_deref());
    Ok(parsed.into())
}

/// The error for an unusable URL: what is wrong, the expected form, and the URL without its
/// password.
pub(crate) fn invalid(url: &str, reason: String) -> Error {
    Error::InvalidUrl {
        url: redact(url),
        reason,
    }
}

/// Returns `url` with the password (if any) replaced by `***`, for error messages. It works on
/// the text rather than a parsed URL, so a URL too broken to parse keeps its password hidden too.
pub(crate) fn redact(url: &str) -> String {
    // The user info runs from after `scheme://` (or the start) to the last `@`: the last,
    // because an unescaped password may itself hold `@`, `/`, `?` or `#`. A `://` after
    // anything but a scheme (in a query, say) is not the scheme's.
    let start = match url.find("://") {
        Some(i)
            if url[..i]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
        {
            i + 3
        }
        _ => 0,
    };
    let Some(at) = url[start..].rfind('@').map(|i| start + i) else {
        return url.to_owned();
    };
    match url[start..at].find(':') {
        Some(colon) => format!("{}:***{}", &url[..start + colon], &url[at..]),
        None => url.to_owned(),
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
        // Too broken to parse, or with an unescaped `@` or `/` in the password: still hidden.
        assert_eq!(
            redact("postgres://u:secret@h:port/db"),
            "postgres://u:***@h:port/db"
        );
        assert_eq!(redact("u:secret@h:5432/db"), "u:***@h:5432/db");
        assert_eq!(redact("postgres://u:s@c/ret@h/db"), "postgres://u:***@h/db");
        assert_eq!(
            redact("u:secret@h/db?next=http://x"),
            "u:***@h/db?next=http://x"
        );
    }

    #[test]
    fn a_malformed_url_names_the_expected_form_and_hides_the_password() {
        for bad in [
            "foo",
            "localhost:5432/db",
            "postgres://u:secret@localhost:notaport/db",
            "postgres://u:secret@/db:5432",
            "u:secret@localhost:5432/db",
            "postgres:u:secret@localhost/db",
            "mysql://u:secret@localhost/db",
        ] {
            let reason = with_database(bad, "x").expect_err(bad);
            let error = invalid(bad, reason);
            for text in [error.to_string(), format!("{error:?}")] {
                assert!(
                    text.contains("expected postgres://user@host:port/db"),
                    "{bad}: {text}"
                );
                assert!(!text.contains("secret"), "{bad}: {text}");
                assert!(
                    !text.contains("relative URL without a base"),
                    "{bad}: {text}"
                );
            }
        }
    }
}
