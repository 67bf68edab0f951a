//! Workflow templates rendered from a trigger's `payload` with minijinja (Jinja syntax):
//! `{{ name }}`, dotted paths (`{{ user.name }}`), filters (`{{ name | title }}`),
//! conditionals (`{% if vip %}…{% endif %}`) and loops over payload lists.
//!
//! Strings are inserted as they are, numbers and booleans as their JSON text (`true`),
//! `null` as nothing, lists and objects as their JSON text; in email HTML every inserted value is
//! HTML-escaped. A template whose syntax is wrong is refused when it is applied
//! ([`check`]); rendering is bounded (fuel), so no template can hold a worker.

use minijinja::value::{Serde, ValueKind};
use minijinja::{AutoEscape, Environment, ErrorKind, UndefinedBehavior, Value};
use serde_json::Map;
use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, LazyLock, Mutex};

/// How values are escaped when inserted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escape {
    /// As is (sms, push, voice, text email).
    None,
    /// HTML-escaped (email HTML bodies).
    Html,
}

/// What an undefined variable does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undefined {
    /// Renders as nothing (and an attribute of it too): the spec's silent behaviour for
    /// every channel but voice.
    Empty,
    /// Fails the render, listing every variable the payload lacks (spec voice rule 5).
    /// Testing one in `{% if %}` is allowed: that is how a template asks.
    Fail,
}

/// Placeholders the payload does not provide, sorted and without repeats.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("missing template variables: {}", .0.iter().cloned().collect::<Vec<_>>().join(", "))]
pub struct MissingKeys(pub BTreeSet<String>);

/// Why a template did not render.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// Variables the payload lacks ([`Undefined::Fail`] only).
    #[error(transparent)]
    Missing(MissingKeys),
    /// The template is broken, or failed while rendering (a filter given the wrong
    /// kind of value, the fuel spent); the text says where.
    #[error("template error: {0}")]
    Invalid(String),
}

/// A template's syntax error: where and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("template syntax error on line {line}: {detail}")]
pub struct SyntaxError {
    /// 1-based line of the template.
    pub line: usize,
    /// What is wrong.
    pub detail: String,
}

/// Instructions one render may run: far above any real notification, far below a
/// template that would keep a worker busy.
const FUEL: u64 = 200_000;

/// One environment per (escape, undefined) pair, built once.
static ENVIRONMENTS: LazyLock<[Environment<'static>; 4]> = LazyLock::new(|| {
    [
        environment(Escape::None, Undefined::Empty),
        environment(Escape::None, Undefined::Fail),
        environment(Escape::Html, Undefined::Empty),
        environment(Escape::Html, Undefined::Fail),
    ]
});

fn environment(escape: Escape, undefined: Undefined) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_auto_escape_callback(move |_| match escape {
        Escape::None => AutoEscape::None,
        Escape::Html => AutoEscape::Html,
    });
    env.set_undefined_behavior(match undefined {
        Undefined::Empty => UndefinedBehavior::Chainable,
        Undefined::Fail => UndefinedBehavior::SemiStrict,
    });
    env.set_fuel(Some(FUEL));
    // A template's last newline is part of the message, as it always was.
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .keep_trailing_newline(true)
            .build()
            .expect("the default delimiters"),
    );
    env.set_formatter(|out, state, value| {
        if value.is_none() {
            return Ok(());
        }
        // JSON's words, not Python's (`True`): the payload is JSON.
        if value.kind() == ValueKind::Bool {
            let text = if value.is_true() { "true" } else { "false" };
            return minijinja::escape_formatter(out, state, &Value::from(text));
        }
        if matches!(value.kind(), ValueKind::Seq | ValueKind::Map) {
            let json = serde_json::to_string(value)
                .map_err(|e| minijinja::Error::new(ErrorKind::BadSerialization, e.to_string()))?;
            return minijinja::escape_formatter(out, state, &Value::from(json));
        }
        minijinja::escape_formatter(out, state, value)
    });
    env
}

/// The index of an (escape, undefined) pair in [`ENVIRONMENTS`] and [`COMPILED`].
fn index(escape: Escape, undefined: Undefined) -> usize {
    match (escape, undefined) {
        (Escape::None, Undefined::Empty) => 0,
        (Escape::None, Undefined::Fail) => 1,
        (Escape::Html, Undefined::Empty) => 2,
        (Escape::Html, Undefined::Fail) => 3,
    }
}

fn env(escape: Escape, undefined: Undefined) -> &'static Environment<'static> {
    &ENVIRONMENTS[index(escape, undefined)]
}

/// Template texts kept at most, and their bytes at most: past either, a cache starts
/// over, so many or large templates cost compiles, never memory. A text larger than
/// [`KEPT_TEXT`] is compiled for each render (in a fresh copy of its environment) and
/// dropped after it.
const CACHED: usize = 512;
const CACHED_BYTES: usize = 4 << 20;
const KEPT_TEXT: usize = 64 << 10;

/// The name a compiled template has in its own environment (minijinja's own for a
/// template made from a string; errors name no template either way).
const NAME: &str = "<string>";

/// Compiled templates by text, each in an environment of its own (a copy of its
/// pair's). A workflow's templates are the same for every message, and compiling them
/// again was about a quarter of a render's time.
struct Compiled {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    by_text: HashMap<String, Arc<Environment<'static>>>,
    bytes: usize,
}

impl Compiled {
    fn new() -> Self {
        Self {
            kept: Mutex::new(Kept::default()),
        }
    }

    /// `template` compiled in a copy of `base`: kept from an earlier call, or compiled
    /// now (outside the lock) and kept.
    fn get(
        &self,
        base: &Environment<'static>,
        template: &str,
    ) -> Result<Arc<Environment<'static>>, minijinja::Error> {
        let lock = || self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(env) = lock().by_text.get(template) {
            return Ok(env.clone());
        }
        let mut env = base.clone();
        env.add_template_owned(NAME, template.to_string())?;
        let env = Arc::new(env);
        if template.len() > KEPT_TEXT {
            return Ok(env);
        }
        let mut kept = lock();
        if kept.by_text.len() >= CACHED || kept.bytes + template.len() > CACHED_BYTES {
            *kept = Kept::default();
        }
        if kept
            .by_text
            .insert(template.to_string(), env.clone())
            .is_none()
        {
            kept.bytes += template.len();
        }
        Ok(env)
    }

    #[cfg(test)]
    fn len(&self) -> (usize, usize) {
        let kept = self.kept.lock().unwrap();
        (kept.by_text.len(), kept.bytes)
    }
}

/// Compiled templates, per (escape, undefined) pair as [`ENVIRONMENTS`].
static COMPILED: LazyLock<[Compiled; 4]> =
    LazyLock::new(|| std::array::from_fn(|_| Compiled::new()));

/// The context variable holding the whole payload, for keys Jinja cannot name.
const PAYLOAD: &str = "__payload__";

/// `{{ key }}` whose key Jinja would not read as a name (`order-id`, `2fa`, or a key
/// with dots that the payload holds as it is) becomes a lookup of that literal key, as
/// placeholders always were. Returns the template and those keys.
fn literal_keys<'t>(
    template: &'t str,
    payload: Option<&Map<String, serde_json::Value>>,
) -> (Cow<'t, str>, Vec<String>) {
    let literal = |key: &str| {
        !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-')
            && (key.contains('-')
                || key.starts_with(|c: char| c.is_ascii_digit())
                || (key.contains('.') && payload.is_some_and(|p| p.contains_key(key))))
    };
    let mut keys = Vec::new();
    let mut out = String::new();
    // `template[..copied]` is in `out` already. Text is copied only up to a key that is
    // rewritten, so a template with none (the usual case) is never copied.
    let mut copied = 0;
    let mut at = 0;
    while let Some(start) = template[at..].find("{{").map(|i| at + i) {
        let Some(end) = template[start + 2..].find("}}").map(|i| start + 2 + i) else {
            break;
        };
        let key = template[start + 2..end].trim();
        if literal(key) {
            out.push_str(&template[copied..start]);
            out.push_str(&format!("{{{{ {PAYLOAD}[\"{key}\"] }}}}"));
            keys.push(key.to_string());
            copied = end + 2;
        }
        at = end + 2;
    }
    if keys.is_empty() {
        return (Cow::Borrowed(template), keys);
    }
    out.push_str(&template[copied..]);
    (Cow::Owned(out), keys)
}

/// Checks a template's syntax, for a workflow being applied.
pub fn check(template: &str) -> Result<(), SyntaxError> {
    let (template, _) = literal_keys(template, None);
    env(Escape::None, Undefined::Empty)
        .template_from_str(&template)
        .map(|_| ())
        .map_err(|e| SyntaxError {
            line: e.line().unwrap_or(1),
            detail: e.detail().unwrap_or("invalid template").to_string(),
        })
}

/// Renders `template` from `payload`.
pub fn render(
    template: &str,
    payload: Option<&Map<String, serde_json::Value>>,
    escape: Escape,
    undefined: Undefined,
) -> Result<String, RenderError> {
    let env = env(escape, undefined);
    let empty = Map::new();
    let payload = payload.unwrap_or(&empty);
    // Compiled after the rewrite, which depends on the payload's keys.
    let (template, literals) = literal_keys(template, Some(payload));
    let kept = COMPILED[index(escape, undefined)]
        .get(env, &template)
        .map_err(invalid)?;
    let compiled = kept.get_template(NAME).map_err(invalid)?;
    let values = Value::from(Serde(payload));
    // The whole payload under its own name only when a literal key needs it.
    let context = if literals.is_empty() {
        values
    } else {
        minijinja::context! { __payload__ => values.clone(), ..values }
    };
    compiled.render(context).map_err(|e| {
        if e.kind() != ErrorKind::UndefinedError {
            return invalid(e);
        }
        let missing: BTreeSet<String> = compiled
            .undeclared_variables(true)
            .into_iter()
            .filter(|path| path != PAYLOAD && !path.starts_with(&format!("{PAYLOAD}.")))
            .filter(|path| !is_global(env, path) && !resolves(payload, path))
            .chain(literals.into_iter().filter(|k| !payload.contains_key(k)))
            .collect();
        if missing.is_empty() {
            // An undefined the static analysis cannot name (an index past a list's
            // end, say): say what minijinja says.
            return invalid(e);
        }
        RenderError::Missing(MissingKeys(missing))
    })
}

/// The variables a template reads, as dotted paths (`user.name`), sorted: what a
/// sample payload for it needs. A template that does not parse reads nothing.
pub fn variables(template: &str) -> BTreeSet<String> {
    let (template, literals) = literal_keys(template, None);
    let env = env(Escape::None, Undefined::Empty);
    let Ok(compiled) = env.template_from_str(&template) else {
        return BTreeSet::new();
    };
    compiled
        .undeclared_variables(true)
        .into_iter()
        .filter(|path| path != PAYLOAD && !path.starts_with(&format!("{PAYLOAD}.")))
        .filter(|path| !is_global(env, path))
        .chain(literals)
        .collect()
}

/// Placeholders only, for text a tenant sends with a trigger (a voice script override):
/// `{{ key }}` or `{{ a.b }}` (the literal key first, then the path) from `payload`,
/// values as [`render`] writes them, an unterminated `{{` kept as text. No expressions,
/// filters, conditions or loops: nothing in it can make a worker compute. Every key the
/// payload lacks is reported.
pub fn render_placeholders(
    template: &str,
    payload: Option<&Map<String, serde_json::Value>>,
) -> Result<String, MissingKeys> {
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
        let value = payload.and_then(|p| {
            p.get(key).or_else(|| {
                let mut parts = key.split('.');
                let first = p.get(parts.next()?)?;
                parts.try_fold(first, |v, part| v.get(part))
            })
        });
        match value {
            Some(serde_json::Value::String(text)) => out.push_str(text),
            Some(serde_json::Value::Null) => {}
            Some(other) => out.push_str(&other.to_string()),
            None => {
                missing.insert(key.to_string());
            }
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(MissingKeys(missing))
    }
}

fn invalid(e: minijinja::Error) -> RenderError {
    let detail = e.detail().unwrap_or("cannot render");
    RenderError::Invalid(match e.line() {
        Some(line) => format!("line {line}: {detail}"),
        None => detail.to_string(),
    })
}

/// Whether `path`'s first name is one of the engine's own functions (`range`, `dict`).
fn is_global(env: &Environment<'_>, path: &str) -> bool {
    let first = path.split('.').next().unwrap_or(path);
    env.globals().any(|(name, _)| name == first)
}

/// Whether a dotted path names a value of the payload (`null` counts: it renders as
/// nothing, it is not missing).
fn resolves(payload: &Map<String, serde_json::Value>, path: &str) -> bool {
    let mut parts = path.split('.');
    let Some(mut value) = parts.next().and_then(|first| payload.get(first)) else {
        return false;
    };
    for part in parts {
        match value.get(part) {
            Some(next) => value = next,
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {

    #[test]
    fn variables_are_the_paths_a_template_reads() {
        let got = variables(
            "{{ name | title }} {% if user.vip %}{{ user.name }}{% endif %} {{order-id}} {{ range(3) }}",
        );
        let want: BTreeSet<String> = ["name", "order-id", "user.name", "user.vip"]
            .map(String::from)
            .into();
        assert_eq!(got, want);
        assert!(
            variables("{% if %}").is_empty(),
            "a syntax error reads nothing"
        );
    }
    use super::*;
    use serde_json::{Value, json};

    fn payload(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn lenient(t: &str, p: &Map<String, Value>, escape: Escape) -> String {
        render(t, Some(p), escape, Undefined::Empty).unwrap()
    }

    #[test]
    fn renders_values_paths_filters_and_conditionals() {
        let p = payload(json!({
            "name": "ada", "n": 3, "flag": true, "nothing": null,
            "user": {"name": "Ada", "tier": "gold"}, "items": ["a", "b"], "obj": {"k": 1}
        }));
        assert_eq!(
            lenient(
                "Hi {{name}}, {{ n }} items {{flag}}{{nothing}}",
                &p,
                Escape::None
            ),
            "Hi ada, 3 items true"
        );
        assert_eq!(
            lenient(
                "{{ user.name }} ({{ user.tier | upper }})",
                &p,
                Escape::None
            ),
            "Ada (GOLD)"
        );
        assert_eq!(lenient("{{ name | title }}", &p, Escape::None), "Ada");
        assert_eq!(
            lenient(
                "{% if user.tier == 'gold' %}VIP {% endif %}{% for i in items %}[{{ i }}]{% endfor %}",
                &p,
                Escape::None
            ),
            "VIP [a][b]"
        );
        assert_eq!(
            lenient("{{ items }} {{ obj }}", &p, Escape::None),
            r#"["a","b"] {"k":1}"#
        );
    }

    #[test]
    fn undefined_is_silent_except_when_asked_to_fail() {
        let p = payload(json!({"a": "x", "user": {"name": "Ada"}}));
        assert_eq!(
            lenient("{{a}}-{{b}}-{{ c.d.e }}-{{ user.age }}!", &p, Escape::None),
            "x---!"
        );
        let err = render(
            "{{b}} {{a}} {{b}} {{ user.age }} {{ user.name }} {{ range(2) }}",
            Some(&p),
            Escape::None,
            Undefined::Fail,
        )
        .unwrap_err();
        let RenderError::Missing(keys) = err else {
            panic!("{err:?}")
        };
        assert_eq!(
            keys.0.into_iter().collect::<Vec<_>>(),
            vec!["b", "user.age"]
        );
        assert!(matches!(
            render("{{x}}", None, Escape::None, Undefined::Fail),
            Err(RenderError::Missing(_))
        ));
        // Asking is allowed: a conditional on an absent key is false.
        assert_eq!(
            render(
                "{% if promo %}{{ promo }}{% else %}none{% endif %}",
                Some(&p),
                Escape::None,
                Undefined::Fail
            )
            .unwrap(),
            "none"
        );
    }

    #[test]
    fn keys_jinja_cannot_name_are_looked_up_literally() {
        let p = payload(json!({"order-id": "A-1", "2fa": 7, "user.name": "flat", "trail": "x"}));
        assert_eq!(
            lenient(
                "#{{order-id}} {{ 2fa }} {{ user.name }} {{ gone-key }}.",
                &p,
                Escape::None
            ),
            "#A-1 7 flat ."
        );
        assert!(check("{{order-id}}").is_ok());
        let err = render(
            "{{ order-id }} {{ no-such }}",
            Some(&p),
            Escape::None,
            Undefined::Fail,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "missing template variables: no-such");
        // The last newline stays.
        assert_eq!(lenient("{{ trail }}\n", &p, Escape::None), "x\n");
    }

    #[test]
    fn placeholders_only_for_tenant_text() {
        let p = payload(json!({"code": "123", "user": {"name": "Ada"}, "a.b": 1}));
        assert_eq!(
            render_placeholders(
                "{{code}} {{ user.name }} {{a.b}} {% if x %} {{ open",
                Some(&p)
            )
            .unwrap(),
            "123 Ada 1 {% if x %} {{ open"
        );
        let err = render_placeholders("{{ code | upper }} {{ x }}", Some(&p)).unwrap_err();
        assert_eq!(
            err.0.into_iter().collect::<Vec<_>>(),
            vec!["code | upper", "x"],
            "no filters: the text between the braces is a key"
        );
    }

    #[test]
    fn html_escaping_only_when_asked() {
        let p = payload(json!({"x": "<b>&\"'"}));
        assert_eq!(
            lenient("<p>{{x}}</p>", &p, Escape::Html),
            "<p>&lt;b&gt;&amp;&quot;&#x27;</p>"
        );
        assert_eq!(lenient("{{x}}", &p, Escape::None), "<b>&\"'");
    }

    #[test]
    fn syntax_errors_name_the_line_and_broken_renders_fail() {
        assert!(check("Hi {{ name }}").is_ok());
        let err = check("line one\n{% if x %}never closed").unwrap_err();
        assert_eq!(err.line, 2, "{err}");
        assert!(
            err.to_string()
                .starts_with("template syntax error on line 2: ")
        );
        assert!(check("{{ open").is_err());
        let err = render("{{ open", None, Escape::None, Undefined::Empty).unwrap_err();
        assert!(matches!(err, RenderError::Invalid(_)), "{err:?}");
        // Runaway templates run out of fuel instead of holding a worker.
        let err = render(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
            None,
            Escape::None,
            Undefined::Empty,
        )
        .unwrap_err();
        assert!(matches!(err, RenderError::Invalid(_)), "{err:?}");
    }

    /// A template is compiled once and then serves every payload, including one whose
    /// literal dotted key changes how the template is read.
    #[test]
    fn a_compiled_template_serves_every_payload() {
        let t = "Hi {{ user.name }} {{ a.b }}";
        let nested = payload(json!({"user": {"name": "Ada"}, "a": {"b": 1}}));
        let literal = payload(json!({"user": {"name": "Bo"}, "a.b": 2}));
        for _ in 0..2 {
            assert_eq!(lenient(t, &nested, Escape::None), "Hi Ada 1");
            assert_eq!(lenient(t, &literal, Escape::None), "Hi Bo 2");
        }
        let base = environment(Escape::None, Undefined::Empty);
        let compiled = Compiled::new();
        let first = compiled.get(&base, t).unwrap();
        let again = compiled.get(&base, t).unwrap();
        assert!(Arc::ptr_eq(&first, &again), "compiled once");
        assert_eq!(compiled.len(), (1, t.len()));
        assert!(compiled.get(&base, "{{ open").is_err());
        assert_eq!(
            compiled.len(),
            (1, t.len()),
            "a broken template is not kept"
        );
    }

    /// Past its bounds (texts, bytes) the cache starts over instead of growing, and a
    /// text too large to keep is compiled but not kept.
    #[test]
    fn the_compiled_templates_are_bounded() {
        let base = environment(Escape::None, Undefined::Empty);
        let compiled = Compiled::new();
        for i in 0..CACHED + 10 {
            compiled.get(&base, &format!("{{{{ x }}}} {i:04}")).unwrap();
            assert!(compiled.len().0 <= CACHED);
        }
        assert_eq!(compiled.len().0, 10);

        let compiled = Compiled::new();
        let large = |i: usize| format!("{i:04} {{{{ x }}}} {}", "y".repeat(KEPT_TEXT - 20));
        let kept = CACHED_BYTES / large(0).len();
        for i in 0..kept + 3 {
            compiled.get(&base, &large(i)).unwrap();
            assert!(compiled.len().1 <= CACHED_BYTES);
        }
        assert_eq!(compiled.len().0, 3);

        let compiled = Compiled::new();
        let huge = format!("{{{{ x }}}} {}", "y".repeat(KEPT_TEXT));
        let env = compiled.get(&base, &huge).unwrap();
        assert!(env.get_template(NAME).is_ok());
        assert_eq!(compiled.len(), (0, 0), "too large to keep");
    }

    /// The rewrite keeps every other byte where it was: text and other tags between
    /// rewritten keys, the text after the last one, an unclosed `{{`. A template with
    /// no key to rewrite is given back as it is, not copied.
    #[test]
    fn the_rewrite_changes_only_literal_keys() {
        let p = payload(json!({"a": 1}));
        let (t, keys) = literal_keys("{{ x-1 }} and {{ name }}, {{2fa}}! {{ open", Some(&p));
        assert_eq!(
            t,
            "{{ __payload__[\"x-1\"] }} and {{ name }}, {{ __payload__[\"2fa\"] }}! {{ open"
        );
        assert_eq!(keys, ["x-1", "2fa"]);
        let (t, keys) = literal_keys("Hi {{ name }} {% if a %}y{% endif %}", Some(&p));
        assert!(matches!(t, Cow::Borrowed(_)));
        assert!(keys.is_empty());
    }
}
