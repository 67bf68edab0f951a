//! Small cryptographic helpers shared by the host.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// HMAC-SHA256 of `data` under `key`.
pub fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// Constant-time equality for secrets and tags: the SDK's, shared with the plugins.
pub use switchboard_sdk::signature::constant_time_eq;

#[cfg(test)]
mod tests {
    #[test]
    fn rfc4231_case_2() {
        let tag = super::hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(tag),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert!(super::constant_time_eq(&tag, &tag));
        assert!(!super::constant_time_eq(&tag, &tag[..31]));
    }
}
