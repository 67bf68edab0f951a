//! The delivery log's opaque cursor. It names a place in one endpoint's log (the last
//! listed delivery's `seq`), not a row, so the next page is whole even when that
//! delivery has since been pruned or erased. `seq` counts the deliveries of every
//! tenant, so the cursor seals it: two cursors must not tell a tenant how many
//! deliveries other tenants made between them. Sealed with the database's secret
//! [`SECRET`] (every process sharing the database opens what another sealed), an HMAC-
//! SHA-256 keystream and tag over a random nonce, bound to the endpoint.

use crate::crypto::{constant_time_eq, hmac_sha256};
use crate::ids::EndpointId;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;

/// The name of the database secret cursors are sealed with.
pub(crate) const SECRET: &str = "delivery-log-cursor";

const NONCE: usize = 12;
const TAG: usize = 16;

/// `label`'s HMAC of the endpoint and `parts`, each length-prefixed.
fn mac(secret: &[u8; 32], label: &[u8], endpoint: &EndpointId, parts: &[&[u8]]) -> [u8; 32] {
    let mut input = Vec::with_capacity(96);
    for part in [label, endpoint.as_str().as_bytes()].iter().chain(parts) {
        input.extend_from_slice(&(part.len() as u32).to_be_bytes());
        input.extend_from_slice(part);
    }
    hmac_sha256(secret, &input)
}

fn masked(secret: &[u8; 32], endpoint: &EndpointId, nonce: &[u8], value: [u8; 8]) -> [u8; 8] {
    let pad = mac(secret, b"switchboard/log-cursor/pad", endpoint, &[nonce]);
    std::array::from_fn(|i| value[i] ^ pad[i])
}

/// The cursor after the delivery numbered `seq` in `endpoint`'s log.
pub(crate) fn seal(secret: &[u8; 32], endpoint: &EndpointId, seq: i64) -> String {
    let mut nonce = [0u8; NONCE];
    rand::rng().fill_bytes(&mut nonce);
    let sealed = masked(secret, endpoint, &nonce, seq.to_be_bytes());
    let tag = mac(
        secret,
        b"switchboard/log-cursor/tag",
        endpoint,
        &[&nonce, &sealed],
    );
    let mut bytes = Vec::with_capacity(NONCE + 8 + TAG);
    bytes.extend_from_slice(&nonce);
    bytes.extend_from_slice(&sealed);
    bytes.extend_from_slice(&tag[..TAG]);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The `seq` a cursor [`seal`] made for `endpoint` with `secret` names; `None` for
/// anything else (another endpoint's cursor, or one changed, included).
pub(crate) fn open(secret: &[u8; 32], endpoint: &EndpointId, cursor: &str) -> Option<i64> {
    let bytes = URL_SAFE_NO_PAD.decode(cursor).ok()?;
    if bytes.len() != NONCE + 8 + TAG {
        return None;
    }
    let (nonce, rest) = bytes.split_at(NONCE);
    let (sealed, tag) = rest.split_at(8);
    let expected = mac(
        secret,
        b"switchboard/log-cursor/tag",
        endpoint,
        &[nonce, sealed],
    );
    if !constant_time_eq(&expected[..TAG], tag) {
        return None;
    }
    let seq = masked(secret, endpoint, nonce, sealed.try_into().ok()?);
    Some(i64::from_be_bytes(seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_opens_for_its_endpoint_and_secret_only() {
        let (secret, other_secret) = ([7u8; 32], [8u8; 32]);
        let endpoint = EndpointId::generate();
        for seq in [0, 1, 41, i64::MAX] {
            let cursor = seal(&secret, &endpoint, seq);
            assert_eq!(cursor.len(), 48, "{cursor}");
            assert_eq!(open(&secret, &endpoint, &cursor), Some(seq));
            assert_eq!(open(&secret, &EndpointId::generate(), &cursor), None);
            assert_eq!(open(&other_secret, &endpoint, &cursor), None);
        }
        // The same place twice is two cursors, and neither carries `seq` as it is.
        let (a, b) = (seal(&secret, &endpoint, 41), seal(&secret, &endpoint, 41));
        assert_ne!(a, b);
        for cursor in [&a, &b] {
            let bytes = URL_SAFE_NO_PAD.decode(cursor).unwrap();
            assert_ne!(bytes[NONCE..NONCE + 8], 41i64.to_be_bytes());
        }
        let mut bytes = URL_SAFE_NO_PAD.decode(&a).unwrap();
        for i in [0, NONCE, NONCE + 7, bytes.len() - 1] {
            bytes[i] ^= 1;
            let changed = URL_SAFE_NO_PAD.encode(&bytes);
            assert_eq!(open(&secret, &endpoint, &changed), None, "byte {i}");
            bytes[i] ^= 1;
        }
        for bad in [
            a[..47].to_string(),
            format!("{a}A"),
            "whd_0123".to_string(),
            String::new(),
            "!!!!".to_string(),
        ] {
            assert_eq!(open(&secret, &endpoint, &bad), None, "{bad}");
        }
    }
}
