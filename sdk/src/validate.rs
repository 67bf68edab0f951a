//! Input checks shared by providers.

/// True for an E.164 number: `+`, a non-zero country-code digit, 7 to 15 digits in all,
/// and nothing else (no spaces, dashes, brackets or trunk prefixes).
///
/// ```
/// use switchboard_sdk::validate::is_e164;
/// assert!(is_e164("+14155550123"));
/// assert!(!is_e164("+1 415 555 0123"));
/// assert!(!is_e164("14155550123"));
/// assert!(!is_e164("+0123456789"));
/// ```
pub fn is_e164(number: &str) -> bool {
    let Some(digits) = number.strip_prefix('+') else {
        return false;
    };
    (7..=15).contains(&digits.len())
        && digits.bytes().all(|b| b.is_ascii_digit())
        && !digits.starts_with('0')
}
