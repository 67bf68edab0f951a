//! Host-native implementations of the five bundled providers' webhook signature
//! schemes. (Skeleton: the implementation lands with the simulator.)

use crate::plugins::types::SignatureError;

/// The headers provider `slug` sends for `body` signed with `secret` at `timestamp`;
/// `None` for a slug that is not one of the bundled five.
pub fn sign(
    slug: &str,
    secret: &str,
    body: &[u8],
    timestamp: u64,
) -> Option<Vec<(String, String)>> {
    let _ = (slug, secret, body, timestamp);
    todo!("native schemes")
}

/// Verifies provider `slug`'s signature; `None` for a slug that is not bundled.
pub fn verify(
    slug: &str,
    secret: &str,
    headers: &[(String, String)],
    body: &[u8],
    now: u64,
) -> Option<Result<(), SignatureError>> {
    let _ = (slug, secret, headers, body, now);
    todo!("native schemes")
}
