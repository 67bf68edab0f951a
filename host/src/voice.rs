//! The voice pipeline's pure rules (spec voice rules 3-6): digit pacing, language
//! normalisation, the script, cost, and the masked recipient kept in receipts.

use crate::template::{self, Escape, MissingKeys};
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
pub fn script(template: &str, payload: Option<&Map<String, Value>>) -> Result<String, MissingKeys> {
    template::render(template, payload, Escape::None).map(|s| pace_digits(&s))
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
}
