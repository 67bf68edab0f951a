//! Webhook signature helpers: decoding, constant-time comparison, timestamp windows.
//!
//! Every helper returns a [`SignatureError`] instead of panicking, whatever the input.

use crate::SignatureError;
use base64::Engine as _;

/// Length in bytes of an HMAC-SHA256 tag.
pub const HMAC_SHA256_LEN: usize = 32;

/// Compares two byte strings in constant time (for equal lengths).
///
/// ```
/// use switchboard_sdk::signature::constant_time_eq;
/// assert!(constant_time_eq(b"abc", b"abc"));
/// assert!(!constant_time_eq(b"abc", b"abd"));
/// assert!(!constant_time_eq(b"abc", b"ab"));
/// ```
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// Decodes lower- or upper-case hex; anything else is [`SignatureError::Malformed`].
///
/// ```
/// use switchboard_sdk::{signature::decode_hex, SignatureError};
/// assert_eq!(decode_hex("0aFF").unwrap(), vec![0x0a, 0xff]);
/// assert_eq!(decode_hex("xyz"), Err(SignatureError::Malformed));
/// ```
pub fn decode_hex(s: &str) -> Result<Vec<u8>, SignatureError> {
    hex::decode(s.trim()).map_err(|_| SignatureError::Malformed)
}

/// Encodes bytes as lower-case hex.
///
/// ```
/// assert_eq!(switchboard_sdk::signature::encode_hex(&[0xde, 0xad]), "dead");
/// ```
pub fn encode_hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// Decodes standard base64 (padding optional); anything else is [`SignatureError::Malformed`].
///
/// ```
/// use switchboard_sdk::signature::decode_base64;
/// assert_eq!(decode_base64("aGk=").unwrap(), b"hi");
/// assert_eq!(decode_base64("aGk").unwrap(), b"hi");
/// assert!(decode_base64("!!").is_err());
/// ```
pub fn decode_base64(s: &str) -> Result<Vec<u8>, SignatureError> {
    let s = s.trim();
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(s))
        .map_err(|_| SignatureError::Malformed)
}

/// Encodes bytes as standard, padded base64.
///
/// ```
/// assert_eq!(switchboard_sdk::signature::encode_base64(b"hi"), "aGk=");
/// ```
pub fn encode_base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Checks `expected` (decoded from a header) against HMAC-SHA256(`key`, `data`).
///
/// A tag of the wrong length is [`SignatureError::Malformed`]; a wrong tag is
/// [`SignatureError::Mismatch`]. The comparison is constant-time.
///
/// ```
/// use switchboard_sdk::{host, signature, SignatureError};
/// let tag = host::hmac_sha256(b"k", b"body");
/// assert!(signature::verify_hmac_sha256(b"k", b"body", &tag).is_ok());
/// assert_eq!(signature::verify_hmac_sha256(b"k", b"other", &tag), Err(SignatureError::Mismatch));
/// assert_eq!(signature::verify_hmac_sha256(b"k", b"body", &tag[..31]), Err(SignatureError::Malformed));
/// ```
pub fn verify_hmac_sha256(key: &[u8], data: &[u8], expected: &[u8]) -> Result<(), SignatureError> {
    if expected.len() != HMAC_SHA256_LEN {
        return Err(SignatureError::Malformed);
    }
    let actual = crate::host::hmac_sha256(key, data);
    if constant_time_eq(&actual, expected) {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// Parses an epoch-seconds timestamp header; non-digits are [`SignatureError::Malformed`].
///
/// ```
/// use switchboard_sdk::signature::parse_timestamp;
/// assert_eq!(parse_timestamp("1700000000"), Ok(1_700_000_000));
/// assert!(parse_timestamp("-5").is_err());
/// assert!(parse_timestamp("17e8").is_err());
/// ```
pub fn parse_timestamp(s: &str) -> Result<u64, SignatureError> {
    let s = s.trim();
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SignatureError::Malformed);
    }
    s.parse().map_err(|_| SignatureError::Malformed)
}

/// Accepts `timestamp` only within `tolerance_secs` of `now`, in either direction.
///
/// ```
/// use switchboard_sdk::{signature::check_timestamp, SignatureError};
/// assert!(check_timestamp(1000, 1200, 300).is_ok());
/// assert_eq!(check_timestamp(1000, 1301, 300), Err(SignatureError::TimestampOutOfRange));
/// assert_eq!(check_timestamp(1301, 1000, 300), Err(SignatureError::TimestampOutOfRange));
/// ```
pub fn check_timestamp(
    timestamp: u64,
    now: u64,
    tolerance_secs: u64,
) -> Result<(), SignatureError> {
    if timestamp.abs_diff(now) > tolerance_secs {
        Err(SignatureError::TimestampOutOfRange)
    } else {
        Ok(())
    }
}
