//! `{{key}}` placeholders rendered from a trigger's `payload`.

use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// How values are escaped when inserted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escape {
    /// As is (sms, push, voice, text email).
    None,
    /// HTML-escaped (email HTML bodies).
    Html,
}

/// Placeholders the payload does not provide, sorted and without repeats.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("missing template variables: {}", .0.iter().cloned().collect::<Vec<_>>().join(", "))]
pub struct MissingKeys(pub BTreeSet<String>);

/// Renders `{{key}}` (spaces inside the braces allowed) from `payload`. Strings are
/// inserted as they are, other JSON values as their JSON text, `null` as nothing. An
/// unterminated `{{` is kept literally. Every missing key is reported, not just the first.
pub fn render(
    template: &str,
    payload: Option<&Map<String, Value>>,
    escape: Escape,
) -> Result<String, MissingKeys> {
    let (out, missing) = render_inner(template, payload, escape);
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(MissingKeys(missing))
    }
}

/// Like [`render`], but a missing key renders as nothing: the spec makes undefined
/// variables a failure only on the voice path.
pub fn render_lenient(
    template: &str,
    payload: Option<&Map<String, Value>>,
    escape: Escape,
) -> String {
    render_inner(template, payload, escape).0
}

fn render_inner(
    template: &str,
    payload: Option<&Map<String, Value>>,
    escape: Escape,
) -> (String, BTreeSet<String>) {
    let mut out = String::with_capacity(template.len());
    let mut missing = BTreeSet::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[start..]);
            rest = "";
            break;
        };
        let key = after[..end].trim();
        match payload.and_then(|p| p.get(key)) {
            Some(value) => {
                let text = match value {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                };
                match escape {
                    Escape::None => out.push_str(&text),
                    Escape::Html => out.push_str(&html_escape(&text)),
                }
            }
            None => {
                missing.insert(key.to_string());
            }
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    (out, missing)
}

fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lenient_rendering_drops_missing_keys() {
        let payload = serde_json::json!({"a": "x"});
        let p = payload.as_object();
        assert_eq!(render_lenient("{{a}}-{{b}}!", p, Escape::None), "x-!");
        assert!(render("{{a}}-{{b}}!", p, Escape::None).is_err());
    }
    use serde_json::json;

    fn payload(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn renders_values_and_reports_every_missing_key() {
        let p = payload(json!({"name": "Ada", "n": 3, "flag": true, "nothing": null}));
        assert_eq!(
            render(
                "Hi {{name}}, {{ n }} items {{flag}}{{nothing}}",
                Some(&p),
                Escape::None
            )
            .unwrap(),
            "Hi Ada, 3 items true"
        );
        let err = render("{{b}} {{a}} {{b}} {{name}}", Some(&p), Escape::None).unwrap_err();
        assert_eq!(err.0.into_iter().collect::<Vec<_>>(), vec!["a", "b"]);
        assert!(render("{{x}}", None, Escape::None).is_err());
        assert_eq!(
            render("no placeholders {{ open", None, Escape::None).unwrap(),
            "no placeholders {{ open"
        );
    }

    #[test]
    fn html_escaping_only_when_asked() {
        let p = payload(json!({"x": "<b>&\"'"}));
        assert_eq!(
            render("{{x}}", Some(&p), Escape::Html).unwrap(),
            "&lt;b&gt;&amp;&quot;&#39;"
        );
        assert_eq!(render("{{x}}", Some(&p), Escape::None).unwrap(), "<b>&\"'");
    }
}
