//! Reading and checking a trigger: decoding with errors that say where, the limits the
//! spec leaves to us, and the channel order.

use super::request::{MAX_NAME_LEN, MAX_SUBSCRIBER_LEN, TriggerRequest};
use crate::routing::{self, Channel, Priority, Reach};
use serde::Deserialize;

/// Decodes a request body (or one bulk item), naming where a problem is: an unknown
/// field (a typo such as `paylaod` or `to.Email`) is refused, never dropped.
pub fn parse_json<'de, T, D>(input: D) -> Result<T, String>
where
    T: Deserialize<'de>,
    D: serde::Deserializer<'de, Error = serde_json::Error>,
{
    serde_path_to_error::deserialize(input).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            inner.to_string()
        } else {
            format!("at `{path}`: {inner}")
        }
    })
}

/// A JSON request body. serde would also read a JSON array as a struct (`"to": ["u1"]`),
/// which the API document forbids: each body names where its objects are, and
/// [`parse_body`] refuses an array there.
pub trait JsonBody: serde::de::DeserializeOwned {
    /// Dotted paths of the body's objects (`""` is the body itself).
    const OBJECTS: &'static [&'static str] = &[""];
}

impl JsonBody for TriggerRequest {
    const OBJECTS: &'static [&'static str] = &[
        "",
        "to",
        "overrides",
        "overrides.email",
        "overrides.sms",
        "overrides.voice",
        "overrides.whatsapp",
    ];
}

/// Decodes a request body (or one bulk item) of type `T`, naming where a problem is.
pub fn parse_body<T: JsonBody>(value: serde_json::Value) -> Result<T, String> {
    for path in T::OBJECTS {
        let mut at = Some(&value);
        for part in path.split('.').filter(|p| !p.is_empty()) {
            at = at.and_then(|v| v.get(part));
        }
        if at.is_some_and(serde_json::Value::is_array) {
            return Err(if path.is_empty() {
                "expected a JSON object, not an array".into()
            } else {
                format!("at `{path}`: expected an object, not an array")
            });
        }
    }
    parse_json(value)
}

/// Deepest nesting of `payload` accepted (the object itself is level 1). The broker
/// message wraps the request, and every reader of it must decode what was accepted.
pub const MAX_PAYLOAD_DEPTH: usize = 32;

/// Checks the fields the spec leaves to us. Limits: `name` 1-200 characters of
/// letters, digits and `._:-/`; `subscriberId` 1-256 characters, no control characters;
/// `category` like a preference category (1-200 characters, not blank, no control
/// characters); no control characters in contacts or payload keys (every one of them is
/// stored, and PostgreSQL refuses NUL); `payload` at most [`MAX_PAYLOAD_DEPTH`] deep.
pub fn validate(request: &TriggerRequest) -> Result<(), String> {
    validate_name(request)?;
    validate_subscriber_id(&request.to.subscriber_id)
        .map_err(|e| format!("to.subscriberId {e}"))?;
    if let Some(category) = &request.category {
        check_text("category", category, MAX_NAME_LEN)?;
    }
    let to = &request.to;
    for (field, value) in [("to.email", &to.email), ("to.phone", &to.phone)] {
        if value.as_deref().is_some_and(has_control) {
            return Err(format!("{field} must not contain control characters"));
        }
    }
    if to.device_tokens.iter().flatten().any(|t| has_control(t)) {
        return Err("to.deviceTokens must not contain control characters".into());
    }
    if let Some(payload) = &request.payload {
        if let Some(key) = payload.keys().find(|k| has_control(k)) {
            return Err(format!(
                "payload key {key:?} must not contain control characters"
            ));
        }
        if depth(payload) > MAX_PAYLOAD_DEPTH {
            return Err(format!(
                "payload nests deeper than {MAX_PAYLOAD_DEPTH} levels"
            ));
        }
    }
    Ok(())
}

fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}

/// A stored name-like text: 1 to `max` characters, not only white space, no control
/// characters (the rule of subscriber ids and categories).
fn check_text(field: &str, s: &str, max: usize) -> Result<(), String> {
    if s.trim().is_empty() || s.chars().count() > max {
        return Err(format!("{field} must be 1 to {max} characters"));
    }
    if has_control(s) {
        return Err(format!("{field} must not contain control characters"));
    }
    Ok(())
}

/// Nesting depth of a payload (the object itself is 1), without recursion.
fn depth(payload: &serde_json::Map<String, serde_json::Value>) -> usize {
    let mut deepest = 1;
    let mut stack: Vec<(&serde_json::Value, usize)> = payload.values().map(|v| (v, 2)).collect();
    while let Some((value, level)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &serde_json::Value>> = match value {
            serde_json::Value::Array(a) => Box::new(a.iter()),
            serde_json::Value::Object(o) => Box::new(o.values()),
            _ => continue,
        };
        deepest = deepest.max(level);
        if level > MAX_PAYLOAD_DEPTH {
            return level;
        }
        stack.extend(children.map(|c| (c, level + 1)));
    }
    deepest
}

fn validate_name(request: &TriggerRequest) -> Result<(), String> {
    let name = request.name.as_str();
    if name.is_empty() || name.chars().count() > MAX_NAME_LEN {
        return Err(format!("name must be 1 to {MAX_NAME_LEN} characters"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._:-/".contains(c))
    {
        return Err("name may contain only letters, digits and . _ : - /".into());
    }
    Ok(())
}

/// A subscriber id, wherever one is given (`to.subscriberId`, paths, filters): 1 to 256
/// characters, not only white space, no control characters ([`SUBSCRIBER_ID_PATTERN`]).
pub fn validate_subscriber_id(s: &str) -> Result<(), String> {
    check_text("", s, MAX_SUBSCRIBER_LEN).map_err(|e| e.trim_start().to_string())
}

/// [`validate_subscriber_id`] as the OpenAPI document states it (with `maxLength`).
pub const SUBSCRIBER_ID_PATTERN: &str = r"^[^\u0000-\u001F\u007F-\u009F]*[^\s\u0000-\u001F\u007F-\u009F][^\u0000-\u001F\u007F-\u009F]*$";

/// The channel order for a request, or the 400 message.
pub fn route(request: &TriggerRequest, priority: Priority) -> Result<Vec<Channel>, String> {
    validate(request)?;
    let overrides = request.overrides.as_ref();
    let reach = Reach {
        email: request.to.email.as_deref(),
        phone: request.to.phone.as_deref(),
        device_tokens: request
            .to
            .device_tokens
            .as_ref()
            .map_or(0, |t| t.iter().filter(|t| !t.trim().is_empty()).count()),
        voice_override: overrides.is_some_and(|o| o.voice.is_some()),
        whatsapp_override: overrides.is_some_and(|o| o.whatsapp.is_some()),
        extra_params: overrides.and_then(|o| o.extra_params.as_ref()),
    };
    routing::channel_order(priority, &reach).map_err(|e| e.to_string())
}
