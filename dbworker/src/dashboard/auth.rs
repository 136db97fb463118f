//! Who is looking: bearer tokens, basic auth, or the embedding application's
//! own hook; two roles; CSRF tokens for every action.

use std::fmt;
use std::sync::Arc;

use axum::http::request::Parts;
use axum::http::{HeaderMap, header};

/// What a user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Read every page; no actions.
    ReadOnly,
    /// Read and act (retry, cancel, fail, delete, pause, resume).
    Admin,
}

/// A signed-in user, as actions log them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The name logged with each action.
    pub name: String,
    /// What the user may do.
    pub role: Role,
}

impl User {
    /// A user with a role.
    pub fn new(name: impl Into<String>, role: Role) -> User {
        User {
            name: name.into(),
            role,
        }
    }
}

/// A hook that finds the user of a request (from the application's session
/// cookie, a header its proxy sets, ...); `None` refuses the request.
pub type AuthHook = Arc<dyn Fn(&Parts) -> Option<User> + Send + Sync>;

/// How the dashboard authenticates.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum Auth {
    /// Nobody is asked; everyone is an admin named `anonymous`. Only for a
    /// dashboard reachable from this machine alone (`dbworker ui` refuses it
    /// on a non-loopback address), and only for requests addressed to it
    /// by a loopback name (`localhost`, `127.0.0.1`, `[::1]`): a web page
    /// whose name an attacker points at 127.0.0.1 (DNS rebinding) reaches
    /// it with its own name as the host, and is refused. Behind a proxy or
    /// an outer sign-in, use [`Auth::Hook`].
    #[default]
    None,
    /// `Authorization: Bearer <token>`: the admin token, or the read-only one.
    Bearer {
        /// The token that may act.
        admin: Option<String>,
        /// The token that may only read.
        read_only: Option<String>,
    },
    /// HTTP basic auth against these users.
    Basic(Vec<BasicUser>),
    /// The embedding application's own check.
    Hook(AuthHook),
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::None => f.write_str("Auth::None"),
            Auth::Bearer { admin, read_only } => f
                .debug_struct("Auth::Bearer")
                .field("admin", &admin.as_ref().map(|_| "…"))
                .field("read_only", &read_only.as_ref().map(|_| "…"))
                .finish(),
            Auth::Basic(users) => f
                .debug_list()
                .entries(users.iter().map(|u| &u.name))
                .finish(),
            Auth::Hook(_) => f.write_str("Auth::Hook(..)"),
        }
    }
}

/// A basic-auth user.
#[derive(Clone, PartialEq, Eq)]
pub struct BasicUser {
    /// The user name.
    pub name: String,
    /// The password.
    pub password: String,
    /// What the user may do.
    pub role: Role,
}

impl fmt::Debug for BasicUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BasicUser")
            .field("name", &self.name)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

impl Auth {
    /// The request's user, or `None` (refused).
    pub(crate) fn user(&self, parts: &Parts) -> Option<User> {
        match self {
            Auth::None => loopback_host(parts).then(|| User::new("anonymous", Role::Admin)),
            Auth::Bearer { admin, read_only } => {
                let token = bearer(&parts.headers)?;
                if admin.as_deref().is_some_and(|a| constant_time_eq(a, token)) {
                    Some(User::new("admin token", Role::Admin))
                } else if read_only
                    .as_deref()
                    .is_some_and(|r| constant_time_eq(r, token))
                {
                    Some(User::new("read-only token", Role::ReadOnly))
                } else {
                    None
                }
            }
            Auth::Basic(users) => {
                let (name, password) = basic(&parts.headers)?;
                users
                    .iter()
                    .find(|u| u.name == name && constant_time_eq(&u.password, &password))
                    .map(|u| User::new(u.name.clone(), u.role))
            }
            Auth::Hook(hook) => hook(parts),
        }
    }

    /// The challenge a refused request gets.
    pub(crate) fn challenge(&self) -> Option<&'static str> {
        match self {
            Auth::Basic(_) => Some("Basic realm=\"dbworker\", charset=\"UTF-8\""),
            Auth::Bearer { .. } => Some("Bearer realm=\"dbworker\""),
            _ => None,
        }
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

fn basic(headers: &HeaderMap) -> Option<(String, String)> {
    let encoded = headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Basic ")?;
    let decoded = String::from_utf8(base64_decode(encoded.trim())?).ok()?;
    let (name, password) = decoded.split_once(':')?;
    Some((name.to_owned(), password.to_owned()))
}

/// Standard base64, as basic auth sends it. Lenient: the padding may be left
/// out, and trailing bits are ignored.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    use base64::alphabet::STANDARD;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_padding_mode(DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true),
    );
    LENIENT.decode(s).ok()
}

/// Compares secrets without stopping at the first difference (a length
/// mismatch still answers at once, as the length is not the secret).
pub(crate) fn constant_time_eq(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// Whether the request names a loopback host (its `Host`, or the URI's
/// authority under HTTP/2); one that names none comes from no browser.
fn loopback_host(parts: &Parts) -> bool {
    let host = match parts.headers.get(header::HOST) {
        Some(value) => match value.to_str() {
            Ok(host) => host,
            Err(_) => return false,
        },
        None => match parts.uri.authority() {
            Some(authority) => authority.as_str(),
            None => return true,
        },
    };
    let name = match host.strip_prefix('[') {
        // `[::1]:8080`
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A random token for this process (form CSRF tokens): 128 bits from the
/// operating system's generator (through `rand`'s thread-local CSPRNG), as
/// 32 hex digits.
pub(crate) fn random_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Whether a state-changing request comes from the dashboard's own pages.
/// Browsers send `Sec-Fetch-Site`, which survives proxies that rewrite
/// `Host`; without it, `Origin` (if any) must name the host. The form's
/// CSRF token is checked besides.
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return matches!(site.to_str(), Ok("same-origin" | "none"));
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    match (
        headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()),
        host,
    ) {
        (Some(origin), Some(host)) => origin
            .split_once("://")
            .is_some_and(|(_, rest)| rest == host),
        (Some(_), None) => false,
        (None, _) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_auth_only_loopback_hosts_are_served() {
        let user = |host: Option<&str>| {
            let mut request = axum::http::Request::builder().uri("/");
            if let Some(host) = host {
                request = request.header(header::HOST, host);
            }
            let (parts, ()) = request.body(()).unwrap().into_parts();
            Auth::None.user(&parts).is_some()
        };
        let served = [
            "localhost:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
            "127.0.0.2",
            "app.localhost",
            "LOCALHOST.",
        ];
        for host in served {
            assert!(user(Some(host)), "{host}");
        }
        let refused = [
            "attacker.example",
            "attacker.example:8080",
            "10.0.0.5:8080",
            "localhost.attacker.example",
            "[2001:db8::1]:80",
        ];
        for host in refused {
            assert!(!user(Some(host)), "{host}");
        }
        assert!(user(None), "no browser sends no host");
    }

    #[test]
    fn basic_credentials_decode() {
        assert_eq!(base64_decode("YWRtaW46czNjcjN0").unwrap(), b"admin:s3cr3t");
        assert_eq!(base64_decode("YQ==").unwrap(), b"a");
        assert!(base64_decode("!!").is_none());
        assert_eq!(base64_decode("YQ").unwrap(), b"a", "padding is optional");
        assert!(base64_decode("Y").is_none());
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(constant_time_eq("s3cr3t", "s3cr3t"));
        assert!(!constant_time_eq("s3cr3t", "s3cr3T"));
        assert!(!constant_time_eq("s3cr3t", "s3cr3"));
        assert!(!constant_time_eq("", "x"));
        assert!(constant_time_eq("", ""));
    }

    #[test]
    fn only_same_origin_posts_pass() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, v.parse().unwrap());
            }
            h
        };
        assert!(same_origin(&headers(&[
            ("sec-fetch-site", "same-origin"),
            ("origin", "https://proxy"),
            ("host", "internal:8080")
        ])));
        assert!(!same_origin(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(!same_origin(&headers(&[("sec-fetch-site", "same-site")])));
        assert!(same_origin(&headers(&[
            ("origin", "http://a:1"),
            ("host", "a:1")
        ])));
        assert!(!same_origin(&headers(&[
            ("origin", "http://evil"),
            ("host", "a:1")
        ])));
        assert!(
            same_origin(&headers(&[])),
            "non-browser clients: the token decides"
        );
    }

    #[test]
    fn tokens_differ() {
        assert_ne!(random_token(), random_token());
        assert_eq!(random_token().len(), 32);
    }
}
