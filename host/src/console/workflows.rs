//! Workflows: the list, and a preview of each channel's content rendered from a
//! sample payload exactly as a worker would build it (voice shows the paced script, a
//! voice variable the payload lacks shows the error the message would fail with).

use super::{bad_path, page_context, query_value, render, signed_in, to_sign_in};
use crate::AppState;
use crate::api::ApiError;
use crate::ids::{EventId, WorkspaceId};
use crate::ingest::{Envelope, Recipient, TriggerRequest};
use crate::model::KeyMode;
use crate::plugins::types::Content;
use crate::routing::Priority;
use crate::workflow::{Workflow, build_content};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use minijinja::value::Serde;
use minijinja::{Value, context};
use serde::Serialize;
use serde_json::Map;

/// A workflow as the list shows it.
#[derive(Serialize)]
struct Row {
    name: String,
    href: String,
    description: Option<String>,
    channels: Vec<&'static str>,
    updated_at: String,
    error: Option<String>,
}

pub(super) async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Some((key, cookie)) = signed_in(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    let rows: Vec<Row> = state
        .ingest
        .store
        .list_workflows(&key.workspace)
        .await
        .map_err(ApiError::from_store_read)?
        .into_iter()
        .map(|(name, definition, updated_at)| {
            let parsed = serde_json::from_value::<Workflow>(definition);
            Row {
                description: parsed.as_ref().ok().and_then(|w| w.description.clone()),
                channels: parsed
                    .as_ref()
                    .map(|w| w.channels().iter().map(|c| c.as_str()).collect())
                    .unwrap_or_default(),
                error: parsed.err().map(|e| e.to_string()),
                updated_at: crate::api::messages::format_time(&updated_at),
                href: href(&name),
                name,
            }
        })
        .collect();
    let header = page_context(&state, &key, &cookie);
    let ctx = context! { workflows => Value::from(Serde(&rows)), ..header };
    Ok(render("workflows.html", ctx)?.into_response())
}

/// The preview's path: a name's `/` must stay inside the one path segment.
pub(super) fn href(name: &str) -> String {
    let encoded: String = url::form_urlencoded::byte_serialize(name.as_bytes()).collect();
    format!("/console/workflows/{encoded}")
}

/// One channel of a preview: the rendered fields, or why the content cannot be built.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(super) struct ChannelPreview {
    channel: &'static str,
    fields: Vec<(&'static str, String)>,
    error: Option<String>,
}

/// The recipient a preview renders for: every contact present, none of them real.
fn sample_recipient() -> Recipient {
    Recipient {
        subscriber_id: "preview".into(),
        email: Some("preview@example.com".into()),
        phone: Some("+15555550100".into()),
        device_tokens: Some(vec!["preview-device-token".into()]),
    }
}

/// A payload with a placeholder value for each variable the workflow's templates read
/// (`user.name` becomes `{"user": {"name": "user.name"}}`).
pub(super) fn sample_payload(workflow: &Workflow) -> Map<String, serde_json::Value> {
    let texts = serde_json::to_value(workflow).unwrap_or_default();
    let mut strings = Vec::new();
    collect_strings(&texts, &mut strings);
    let mut payload = Map::new();
    for path in strings.iter().flat_map(|t| crate::template::variables(t)) {
        let mut parts: Vec<&str> = path.split('.').collect();
        let last = parts.pop().unwrap_or_default();
        let mut slot = &mut payload;
        for part in parts {
            let next = slot
                .entry(part.to_string())
                .or_insert_with(|| serde_json::Value::Object(Map::new()));
            if !next.is_object() {
                *next = serde_json::Value::Object(Map::new());
            }
            slot = next.as_object_mut().expect("made an object above");
        }
        slot.entry(last.to_string())
            .or_insert_with(|| serde_json::Value::String(path.clone()));
    }
    payload
}

fn collect_strings(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_strings(v, out)),
        serde_json::Value::Object(map) => map.values().for_each(|v| collect_strings(v, out)),
        _ => {}
    }
}

/// Every channel of `workflow` rendered from `payload` as a worker would build it.
pub(super) fn channel_previews(
    workflow: &Workflow,
    workspace: &WorkspaceId,
    payload: Map<String, serde_json::Value>,
) -> Vec<ChannelPreview> {
    let channels = workflow.channels();
    let envelope = Envelope {
        v: 1,
        event_id: EventId::generate(),
        workspace_id: workspace.clone(),
        key_mode: KeyMode::Test,
        priority: Priority::Normal,
        channels: channels.clone(),
        accepted_at: chrono::Utc::now(),
        request: TriggerRequest {
            name: workflow.name.clone(),
            to: sample_recipient(),
            category: None,
            payload: Some(payload),
            overrides: None,
        },
    };
    channels
        .into_iter()
        .map(
            |channel| match build_content(Some(workflow), channel, &envelope) {
                Ok(content) => ChannelPreview {
                    channel: channel.as_str(),
                    fields: fields(content),
                    error: None,
                },
                Err(e) => ChannelPreview {
                    channel: channel.as_str(),
                    fields: Vec::new(),
                    error: Some(format!("{} ({})", e, e.code())),
                },
            },
        )
        .collect()
}

/// What a person reads of a channel's content (the recipient is the sample's).
fn fields(content: Content) -> Vec<(&'static str, String)> {
    let pairs = |list: Vec<(String, String)>| {
        list.into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = Vec::new();
    let mut put = |label, value: Option<String>| {
        if let Some(value) = value {
            out.push((label, value));
        }
    };
    match content {
        Content::Email(m) => {
            put("subject", Some(m.subject));
            put("html", m.html);
            put("text", m.text);
        }
        Content::Sms(m) => put("text", Some(m.text)),
        Content::Push(m) => {
            put("title", Some(m.title));
            put("body", Some(m.body));
        }
        Content::Whatsapp(m) => {
            put("template", Some(m.template_name));
            put("language", Some(m.language));
            put("parameters", Some(pairs(m.parameters)));
        }
        Content::Voice(m) => {
            put("script (as spoken)", Some(m.script));
            put("language", Some(m.language));
            put("voice", m.voice_id);
        }
    }
    out
}

pub(super) async fn preview(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let Path(name) = path.map_err(bad_path)?;
    let Some((key, cookie)) = signed_in(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    let definition = state
        .ingest
        .store
        .workflow(&key.workspace, &name)
        .await
        .map_err(ApiError::from_store_read)?
        .ok_or_else(|| {
            ApiError::ResourceNotFound(format!("no workflow {name:?} in this workspace"))
        })?;
    let workflow: Workflow = serde_json::from_value(definition)
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("stored workflow {name:?}: {e}")))?;
    let (payload_text, parsed) = match query_value(raw.as_deref(), "payload") {
        Some(text) if !text.trim().is_empty() => {
            let parsed = serde_json::from_str::<serde_json::Value>(&text)
                .map_err(|e| format!("the sample payload is not JSON: {e}"))
                .and_then(|v| match v {
                    serde_json::Value::Object(map) => Ok(map),
                    _ => Err("the sample payload must be a JSON object".to_string()),
                });
            (text, parsed)
        }
        _ => {
            let sample = sample_payload(&workflow);
            let text = serde_json::to_string_pretty(&sample).unwrap_or_default();
            (text, Ok(sample))
        }
    };
    let (channels, error) = match parsed {
        Ok(payload) => (channel_previews(&workflow, &key.workspace, payload), None),
        Err(e) => (Vec::new(), Some(e)),
    };
    let header = page_context(&state, &key, &cookie);
    let ctx = context! {
        workflow => Value::from(Serde(&workflow)),
        href => href(&name),
        payload => payload_text,
        channels => Value::from(Serde(&channels)),
        error => error,
        ..header
    };
    Ok(render("workflow.html", ctx)?.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn otp() -> Workflow {
        crate::workflow::parse_file(crate::workflow::DEV_EXAMPLES)
            .unwrap()
            .into_iter()
            .find(|w| w.name == "otp")
            .unwrap()
    }

    #[test]
    fn a_name_with_a_slash_stays_one_segment() {
        assert_eq!(
            href("billing/invoice:v2"),
            "/console/workflows/billing%2Finvoice%3Av2"
        );
    }

    #[test]
    fn the_sample_payload_names_every_variable() {
        let mut w = otp();
        w.sms.as_mut().unwrap().text = "{{ code }} for {{ user.name }}".into();
        let sample = sample_payload(&w);
        assert_eq!(
            serde_json::Value::Object(sample),
            serde_json::json!({"code": "code", "user": {"name": "user.name"}})
        );
    }

    #[test]
    fn every_channel_renders_as_a_worker_would_and_voice_is_paced() {
        let ws = WorkspaceId::generate();
        let payload = serde_json::json!({"code": "123456"});
        let got = channel_previews(&otp(), &ws, payload.as_object().unwrap().clone());
        let by = |c: &str| got.iter().find(|p| p.channel == c).unwrap();
        assert_eq!(
            by("sms").fields,
            vec![("text", "Your code is 123456".to_string())]
        );
        let voice = &by("voice").fields[0];
        assert_eq!(voice.0, "script (as spoken)");
        assert!(voice.1.contains("1, 2, 3, 4, 5, 6"), "{voice:?}");
        assert_eq!(by("whatsapp").fields[0], ("template", "otp".to_string()));

        // Voice fails listing what is missing; the other channels stay silent.
        let got = channel_previews(&otp(), &ws, Map::new());
        let voice = got.iter().find(|p| p.channel == "voice").unwrap();
        let error = voice.error.as_deref().unwrap();
        assert!(
            error.contains("code") && error.contains("TEMPLATE_VARIABLES_MISSING"),
            "{error}"
        );
        let sms = got.iter().find(|p| p.channel == "sms").unwrap();
        assert_eq!(sms.fields, vec![("text", "Your code is ".to_string())]);
    }
}
