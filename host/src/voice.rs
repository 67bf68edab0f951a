//! The voice pipeline's pure rules (spec voice rules 3-6): digit pacing, language
//! normalisation, the script, cost, and the masked recipient kept in receipts; also the
//! one masking rule for contacts (numbers and email addresses) in stored details.

use crate::template::{self, Escape, RenderError, Undefined};
use serde_json::{Map, Value};

/// Spec rule 6: a call costs 15000 micro-USD.
pub const CALL_COST_MICRO_USD: i64 = 15_000;
/// Runs of at least this many digits are paced.
pub const PACING_THRESHOLD: usize = 4;

/// Rule 3: every contiguous run of four or more ASCII digits gets `", "` between its
/// digits (48291 becomes "4, 8, 2, 9, 1"); shorter runs are unchanged. Idempotent.
pub fn pace_digits(script: &str) -> String {
    let mut out = String::with_capacity(script.len() * 2);
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if run.len() >= PACING_THRESHOLD {
            let paced: Vec<String> = run.chars().map(String::from).collect();
            out.push_str(&paced.join(", "));
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in script.chars() {
        if c.is_ascii_digit() {
            run.push(c);
        } else {
            flush(&mut run, &mut out);
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

/// Rule 4: `en_US` becomes `en-US`, bare `en` and an omitted or empty tag become
/// `en-US`; otherwise the tag is normalised to `ll-RR` casing (`EN_gb` → `en-GB`).
pub fn normalize_language(tag: Option<&str>) -> String {
    let tag = tag.map(str::trim).unwrap_or("");
    if tag.is_empty() {
        return "en-US".into();
    }
    let mut parts = tag.split(['-', '_']).filter(|p| !p.is_empty());
    let primary = parts.next().unwrap_or("en").to_ascii_lowercase();
    let rest: Vec<String> = parts
        .map(|p| {
            if p.len() == 2 {
                p.to_ascii_uppercase()
            } else {
                p.to_string()
            }
        })
        .collect();
    if primary == "en" && rest.is_empty() {
        return "en-US".into();
    }
    std::iter::once(primary)
        .chain(rest)
        .collect::<Vec<_>>()
        .join("-")
}

/// Rules 3 and 5: the spoken script, rendered from the payload then paced. A
/// placeholder the payload lacks is an error naming every missing key; no call may be
/// placed then.
pub fn script(template: &str, payload: Option<&Map<String, Value>>) -> Result<String, RenderError> {
    template::render(template, payload, Escape::None, Undefined::Fail).map(|s| pace_digits(&s))
}

/// [`script`] for a script sent with the trigger: placeholders only (a tenant's text is
/// never run as a template).
pub fn override_script(
    template: &str,
    payload: Option<&Map<String, Value>>,
) -> Result<String, RenderError> {
    template::render_placeholders(template, payload)
        .map(|s| pace_digits(&s))
        .map_err(RenderError::Missing)
}

/// The recipient kept in voice receipts: `+` and the first three digits, then `*` for
/// all but the last two (`+14155550123` → `+141******23`). No plaintext number is stored.
pub fn mask_phone(number: &str) -> String {
    let chars: Vec<char> = number.chars().collect();
    if chars.len() <= 6 {
        return "*".repeat(chars.len());
    }
    let keep_head = 4.min(chars.len());
    let keep_tail = 2;
    chars
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if i < keep_head || i >= chars.len() - keep_tail {
                *c
            } else {
                '*'
            }
        })
        .collect()
}

/// An email address as kept wherever provider text echoes it: the first character of
/// the local part, `***`, then the domain (`ada@example.com` → `a***@example.com`); a
/// one-character local part keeps none of it, and text without an `@` is all `***`.
pub fn mask_email(address: &str) -> String {
    match address.rsplit_once('@') {
        Some((local, domain)) => {
            let mut chars = local.chars();
            match (chars.next(), chars.next()) {
                (Some(first), Some(_)) => format!("{first}***@{domain}"),
                _ => format!("***@{domain}"),
            }
        }
        None => "***".into(),
    }
}

/// Masks a recipient's contacts wherever `text` (provider-supplied text: error
/// details, bounce reasons) echoes them, the one rule for every detail the gateway
/// stores: the email address, plain or URL-encoded and in any letter case, becomes
/// [`mask_email`]; the number, as `+E.164`, URL-encoded or (seven digits or more) as
/// bare digits, becomes [`mask_phone`].
pub fn scrub_contacts(text: &str, email: Option<&str>, phone: Option<&str>) -> String {
    let mut out = text.to_string();
    if let Some(e) = email.map(str::trim).filter(|e| !e.is_empty()) {
        let masked = mask_email(e);
        let encoded: String = url::form_urlencoded::byte_serialize(e.as_bytes()).collect();
        for form in [e, encoded.as_str()] {
            out = replace_ignoring_ascii_case(&out, form, &masked);
        }
    }
    if let Some(p) = phone.filter(|p| !p.is_empty()) {
        let masked = mask_phone(p);
        let digits = p.trim_start_matches('+');
        for form in [p.to_string(), format!("%2B{digits}")] {
            out = replace_ignoring_ascii_case(&out, &form, &masked);
        }
        if digits.len() >= 7 {
            out = out.replace(digits, masked.trim_start_matches('+'));
        }
    }
    out
}

/// `text` with every occurrence of `needle`, compared without regard to ASCII case,
/// replaced by `with`.
fn replace_ignoring_ascii_case(text: &str, needle: &str, with: &str) -> String {
    if needle.is_empty() {
        return text.to_string();
    }
    // ASCII lower-casing keeps every byte offset, so matches in the lowered copy are
    // matches at the same offsets (on character boundaries) in `text`.
    let lowered = text.to_ascii_lowercase();
    let needle = needle.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (at, _) in lowered.match_indices(&needle) {
        out.push_str(&text[last..at]);
        out.push_str(with);
        last = at + needle.len();
    }
    out.push_str(&text[last..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn digit_pacing_follows_rule_3() {
        assert_eq!(
            pace_digits("Your code is 48291"),
            "Your code is 4, 8, 2, 9, 1"
        );
        assert_eq!(
            pace_digits("Gate 123, flight 4567."),
            "Gate 123, flight 4, 5, 6, 7."
        );
        assert_eq!(pace_digits("1234abc12"), "1, 2, 3, 4abc12");
        assert_eq!(pace_digits(""), "");
        assert_eq!(pace_digits("٣٤٥٦٧"), "٣٤٥٦٧", "only ASCII digits");
        for s in [
            "Your code is 48291",
            "0000 and 12 and 99999",
            "a1b22c333d4444",
        ] {
            assert_eq!(
                pace_digits(&pace_digits(s)),
                pace_digits(s),
                "idempotent: {s}"
            );
        }
    }

    #[test]
    fn pacing_applies_to_digits_from_variables() {
        let p = json!({"code": "48291", "n": 1234})
            .as_object()
            .unwrap()
            .clone();
        assert_eq!(
            script("Code {{code}}, ref {{n}}", Some(&p)).unwrap(),
            "Code 4, 8, 2, 9, 1, ref 1, 2, 3, 4"
        );
        let missing = script("Hi {{name}}, code {{code}} {{pin}}", Some(&p)).unwrap_err();
        assert_eq!(missing.to_string(), "missing template variables: name, pin");
    }

    #[test]
    fn language_normalisation_follows_rule_4() {
        assert_eq!(normalize_language(Some("en_US")), "en-US");
        assert_eq!(normalize_language(Some("en")), "en-US");
        assert_eq!(normalize_language(None), "en-US");
        assert_eq!(normalize_language(Some("  ")), "en-US");
        assert_eq!(normalize_language(Some("EN_gb")), "en-GB");
        assert_eq!(normalize_language(Some("de")), "de");
        assert_eq!(normalize_language(Some("pt-br")), "pt-BR");
        assert_eq!(normalize_language(Some("zh-Hant-TW")), "zh-Hant-TW");
    }

    #[test]
    fn masked_numbers_keep_no_plaintext() {
        assert_eq!(mask_phone("+14155550123"), "+141******23");
        assert_eq!(mask_phone("+4915112345678"), "+491********78");
        assert_eq!(mask_phone("+123"), "****");
        assert!(!mask_phone("+14155550123").contains("5550"));
    }

    #[test]
    fn masked_emails_keep_the_first_letter_and_the_domain() {
        assert_eq!(mask_email("ada@example.com"), "a***@example.com");
        assert_eq!(mask_email("a@example.com"), "***@example.com");
        assert_eq!(mask_email("Zoë.K@mail.test"), "Z***@mail.test");
        assert_eq!(mask_email("no-at-sign"), "***");
        assert_eq!(mask_email(""), "***");
    }

    #[test]
    fn contacts_are_masked_in_every_form_providers_echo() {
        let email = Some("Gone+news@Acme.test");
        let phone = Some("+14155550123");
        for text in [
            "550 mailbox Gone+news@Acme.test unknown",
            "550 mailbox gone+news@acme.test unknown",
            "to=Gone%2Bnews%40Acme.test rejected",
            "to=gone%2bnews%40acme.test rejected",
            "number +14155550123 invalid",
            "To=%2B14155550123 rejected",
            "To=%2b14155550123 rejected",
            "number 14155550123 unreachable",
        ] {
            let out = scrub_contacts(text, email, phone);
            let lower = out.to_ascii_lowercase();
            assert!(!lower.contains("gone+news"), "{out}");
            assert!(!lower.contains("gone%2bnews"), "{out}");
            assert!(!out.contains("4155550123"), "{out}");
        }
        assert_eq!(
            scrub_contacts(
                "bounce: ada@example.com is full",
                Some("ada@example.com"),
                None
            ),
            "bounce: a***@example.com is full"
        );
        assert_eq!(
            scrub_contacts("café ADA@EXAMPLE.COM", Some("ada@example.com"), None),
            "café a***@example.com"
        );
        // Others' addresses and text without contacts are left alone.
        assert_eq!(
            scrub_contacts("bob@example.com", Some("ada@example.com"), Some("")),
            "bob@example.com"
        );
        assert_eq!(scrub_contacts("x", None, None), "x");
        assert_eq!(scrub_contacts("x", Some(" "), None), "x");
    }
}
