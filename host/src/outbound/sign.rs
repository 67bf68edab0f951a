//! Signing per the Standard Webhooks specification, so receivers verify with its
//! libraries: `webhook-id` (the event's id, the receiver's de-duplication key),
//! `webhook-timestamp` (unix seconds) and `webhook-signature`, a space-separated list
//! of `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, one per signing secret
//! (two while a rotated secret's overlap lasts). A secret is `whsec_` and the base64
//! of its key bytes.

use crate::crypto::hmac_sha256;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rand::RngCore;

/// The prefix of every signing secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// A new signing secret: 32 random bytes.
pub fn new_secret() -> String {
    let mut key = [0u8; 32];
    rand::rng().fill_bytes(&mut key);
    format!("{SECRET_PREFIX}{}", STANDARD.encode(key))
}

/// The key bytes of a secret (`whsec_` optional, as receivers' libraries accept).
fn key(secret: &str) -> Vec<u8> {
    let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
    // Our secrets always decode; anything else signs with its text (never panics).
    STANDARD
        .decode(encoded)
        .unwrap_or_else(|_| encoded.as_bytes().to_vec())
}

/// The three headers of a request carrying `body`, signed with every one of `secrets`.
pub fn headers(
    id: &str,
    timestamp: i64,
    body: &[u8],
    secrets: &[&str],
) -> [(&'static str, String); 3] {
    let mut content = format!("{id}.{timestamp}.").into_bytes();
    content.extend_from_slice(body);
    let signature = secrets
        .iter()
        .map(|s| format!("v1,{}", STANDARD.encode(hmac_sha256(&key(s), &content))))
        .collect::<Vec<_>>()
        .join(" ");
    [
        ("webhook-id", id.to_string()),
        ("webhook-timestamp", timestamp.to_string()),
        ("webhook-signature", signature),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verify(secret: &str, headers: &[(&'static str, String); 3], body: &[u8]) -> bool {
        let mut map = axum::http::HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, value.parse().unwrap());
        }
        standardwebhooks::Webhook::new(secret)
            .unwrap()
            .verify(body, &map)
            .is_ok()
    }

    #[test]
    fn the_standard_library_verifies_each_secret_and_nothing_else() {
        let (old, new) = (new_secret(), new_secret());
        assert!(old.starts_with("whsec_") && old != new);
        let body = br#"{"type":"message.delivered"}"#;
        let now = chrono::Utc::now().timestamp();
        let both = headers("msg_1", now, body, &[&new, &old]);
        assert!(both[2].1.starts_with("v1,") && both[2].1.contains(" v1,"));
        assert!(verify(&new, &both, body));
        assert!(
            verify(&old, &both, body),
            "the rotated secret still verifies"
        );
        assert!(
            !verify(&new_secret(), &both, body),
            "another secret does not"
        );
        assert!(!verify(&new, &both, b"{}"), "another body does not");
        let one = headers("msg_1", now, body, &[&new]);
        assert!(
            !verify(&old, &one, body),
            "after the overlap the old one does not"
        );
        let stale = headers("msg_1", now - 3_600, body, &[&new]);
        assert!(
            !verify(&new, &stale, body),
            "the library refuses an old timestamp"
        );
    }
}
