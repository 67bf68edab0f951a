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

/// True for something shaped like an email address: one `@` with text on both sides and
/// no white space or control characters. Deliverability is the provider's business;
/// this refuses only what no provider could send to (`not-an-email`).
///
/// ```
/// use switchboard_sdk::validate::is_email;
/// assert!(is_email("ada@example.com"));
/// assert!(!is_email("not-an-email"));
/// assert!(!is_email("ada@"));
/// assert!(!is_email("a b@example.com"));
/// assert!(!is_email("a@b@example.com"));
/// ```
pub fn is_email(address: &str) -> bool {
    let Some((local, domain)) = address.split_once('@') else {
        return false;
    };
    !local.is_empty()
        && !domain.is_empty()
        && !domain.contains('@')
        && !address.chars().any(|c| c.is_whitespace() || c.is_control())
}
