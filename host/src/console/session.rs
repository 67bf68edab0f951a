//! Console sessions in a signed cookie: it holds a random session id, the API key's
//! SHA-256 (never the key) and an expiry, signed with the console's secret. Every
//! request resolves the digest through the authenticator, so revoking the key ends
//! every session made with it at once; the only server-side record is of sessions
//! signed out before they expire (by id, until then), so a copy of a signed-out cookie
//! is refused too. The CSRF token of a session is derived from the cookie, so a form
//! posted from another site (which cannot read the cookie) cannot carry it.

use crate::crypto::{constant_time_eq, hmac_sha256};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The session cookie's name.
pub const COOKIE: &str = "sb_console";

/// What a valid session cookie says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Random, made at sign-in: what a sign-out records.
    pub id: [u8; 16],
    /// SHA-256 of the API key signed in with.
    pub key_digest: [u8; 32],
    /// Unix seconds after which the cookie is refused.
    pub expires: i64,
}

/// A new session id.
pub fn new_id() -> [u8; 16] {
    uuid::Uuid::new_v4().into_bytes()
}

/// The cookie value for a session: `v2.<id hex>.<digest hex>.<expires>.<signature>`.
pub fn issue(secret: &[u8], session: &Session) -> String {
    let body = format!(
        "v2.{}.{}.{}",
        hex::encode(session.id),
        hex::encode(session.key_digest),
        session.expires
    );
    let tag = hmac_sha256(secret, body.as_bytes());
    format!("{body}.{}", URL_SAFE_NO_PAD.encode(tag))
}

/// The session a cookie value carries, if its signature holds and it has not expired
/// at `now` (unix seconds).
pub fn verify(secret: &[u8], value: &str, now: i64) -> Option<Session> {
    let (body, tag) = value.rsplit_once('.')?;
    let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
    if !constant_time_eq(&hmac_sha256(secret, body.as_bytes()), &tag) {
        return None;
    }
    let mut parts = body.split('.');
    // A `v1` cookie (no id, so it could not be signed out) is no session any more.
    let (Some("v2"), Some(id), Some(digest), Some(expires), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    let id: [u8; 16] = hex::decode(id).ok()?.try_into().ok()?;
    let key_digest: [u8; 32] = hex::decode(digest).ok()?.try_into().ok()?;
    let expires: i64 = expires.parse().ok()?;
    (now < expires).then_some(Session {
        id,
        key_digest,
        expires,
    })
}

/// The CSRF token of the session whose cookie value is `cookie`.
pub fn csrf_token(secret: &[u8], cookie: &str) -> String {
    let tag = hmac_sha256(secret, format!("csrf.{cookie}").as_bytes());
    URL_SAFE_NO_PAD.encode(tag)
}

/// Whether `token` is the CSRF token of the session `cookie` (constant time).
pub fn csrf_ok(secret: &[u8], cookie: &str, token: &str) -> bool {
    constant_time_eq(csrf_token(secret, cookie).as_bytes(), token.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"console secret for tests";

    fn session() -> Session {
        Session {
            id: [9; 16],
            key_digest: [7; 32],
            expires: 1_000,
        }
    }

    #[test]
    fn a_cookie_round_trips_until_it_expires() {
        let cookie = issue(SECRET, &session());
        assert_eq!(verify(SECRET, &cookie, 999), Some(session()));
        assert_eq!(verify(SECRET, &cookie, 1_000), None, "expired");
    }

    #[test]
    fn a_tampered_or_foreign_cookie_is_refused() {
        let cookie = issue(SECRET, &session());
        assert_eq!(verify(b"another secret", &cookie, 0), None);
        let longer = cookie.replace(".1000.", ".9999.");
        assert_eq!(verify(SECRET, &longer, 0), None, "expiry changed");
        let other = cookie.replace(&"07".repeat(32), &"08".repeat(32));
        assert_eq!(verify(SECRET, &other, 0), None, "key changed");
        let another = cookie.replace(&"09".repeat(16), &"0a".repeat(16));
        assert_eq!(verify(SECRET, &another, 0), None, "session changed");
        // A cookie of the first layout, signed with the right secret, has no id.
        let body = format!("v1.{}.1000", "07".repeat(32));
        let v1 = format!(
            "{body}.{}",
            URL_SAFE_NO_PAD.encode(hmac_sha256(SECRET, body.as_bytes()))
        );
        assert_eq!(verify(SECRET, &v1, 0), None, "v1");
        for junk in ["", "v1", "v2.x.y.z", ".....", "v2.09.07.1000.!!"] {
            assert_eq!(verify(SECRET, junk, 0), None, "{junk:?}");
        }
    }

    #[test]
    fn the_csrf_token_belongs_to_one_session() {
        let a = issue(SECRET, &session());
        let b = issue(
            SECRET,
            &Session {
                id: new_id(),
                ..session()
            },
        );
        let token = csrf_token(SECRET, &a);
        assert!(csrf_ok(SECRET, &a, &token));
        assert!(!csrf_ok(SECRET, &b, &token));
        assert!(!csrf_ok(SECRET, &a, ""));
    }
}
