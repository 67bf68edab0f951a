//! Activity (the message list with the API's filters) and one message's journey.

use super::{bad_path, page_context, render, signed_in, to_sign_in};
use crate::AppState;
use crate::api::ApiError;
use crate::api::messages::{
    ListMessagesResponse, MessageDto, list_page, message_with_timeline, parse_list_query,
};
use crate::model::MessageStatus;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use minijinja::value::Serde;
use minijinja::{Value, context};
use serde::Serialize;

/// The filters as the form shows them back.
#[derive(Default, Serialize)]
struct Filters {
    status: Option<String>,
    channel: Option<String>,
    subscriber_id: Option<String>,
    from: Option<String>,
    to: Option<String>,
    limit: Option<String>,
}

pub(super) async fn activity(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let Some((key, cookie)) = signed_in(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    // The form sends every field; an empty one means "any".
    let pairs: Vec<(String, String)> =
        url::form_urlencoded::parse(raw.as_deref().unwrap_or("").as_bytes())
            .filter(|(_, value)| !value.is_empty())
            .map(|(n, v)| (n.into_owned(), v.into_owned()))
            .collect();
    // `live=0` stops the first page from following new messages.
    let (paused, given): (Vec<_>, Vec<_>) = pairs.into_iter().partition(|(n, _)| n == "live");
    let paused = paused.iter().any(|(_, v)| v == "0");
    let mut filters = Filters::default();
    for (name, value) in &given {
        let slot = match name.as_str() {
            "status" => &mut filters.status,
            "channel" => &mut filters.channel,
            "subscriber_id" | "subscriber" => &mut filters.subscriber_id,
            "from" => &mut filters.from,
            "to" => &mut filters.to,
            "limit" => &mut filters.limit,
            _ => continue,
        };
        *slot = Some(value.clone());
    }
    let query_string = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(given.iter().filter(|(n, _)| n != "cursor"))
        .finish();
    let query_for_page = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(&given)
        .finish();
    let (page, error) = match parse_list_query(Some(&query_for_page)) {
        Ok(query) => match list_page(&*state.ingest.store, &key.workspace, &query).await {
            Ok(page) => (page, None),
            Err(ApiError::BadRequest(e)) => (empty_page(), Some(e)),
            Err(e) => return Err(e),
        },
        Err(e) => (empty_page(), Some(e)),
    };
    let next = page.next_cursor.as_ref().map(|cursor| {
        url::form_urlencoded::Serializer::new(query_string.clone())
            .append_pair("cursor", cursor)
            .finish()
    });
    let header = page_context(&state, &key, &cookie);
    let ctx = context! {
        messages => Value::from(Serde(&page.messages)),
        next => next,
        error => error,
        filters => Value::from(Serde(&filters)),
        filtered => !query_string.is_empty(),
        live => !paused && !given.iter().any(|(n, _)| n == "cursor"),
        statuses => MessageStatus::ALL.map(|s| s.as_str()).to_vec(),
        channels => crate::admin::CHANNELS.map(|c| c.as_str()).to_vec(),
        ..header
    };
    Ok(render("activity.html", ctx)?.into_response())
}

fn empty_page() -> ListMessagesResponse {
    ListMessagesResponse {
        messages: Vec::new(),
        next_cursor: None,
    }
}

/// A timeline step as the journey shows it.
#[derive(Debug, Serialize, PartialEq)]
pub(super) struct Step {
    status: String,
    occurred_at: String,
    provider: Option<String>,
    /// Since the step before (the message's creation for the first), e.g. `+12 ms`.
    after: Option<String>,
    /// The detail's fields, one level deep, as text.
    fields: Vec<(String, String)>,
}

/// `+850 ms`, `+2.4 s`, `+3 min`: a gap a person reads at a glance.
fn gap(ms: i64) -> String {
    match ms {
        ms if ms < 1_000 => format!("+{} ms", ms.max(0)),
        ms if ms < 60_000 => format!("+{:.1} s", ms as f64 / 1_000.0),
        ms => format!("+{} min", ms / 60_000),
    }
}

fn parse_time(text: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

/// The journey of `m`: each step with the time since the one before and its details
/// as fields; and the plugin version that sent it (from the last `sent` step).
pub(super) fn journey(m: &MessageDto) -> (Vec<Step>, Option<String>) {
    let mut previous = parse_time(&m.created_at);
    let mut plugin = None;
    let steps = m
        .events
        .iter()
        .flatten()
        .map(|e| {
            let at = parse_time(&e.occurred_at);
            let after = at
                .zip(previous)
                .map(|(at, before)| gap((at - before).num_milliseconds()));
            previous = at.or(previous);
            let fields = match &e.detail {
                Some(serde_json::Value::Object(map)) => map
                    .iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| {
                        let text = match v {
                            serde_json::Value::String(s) => s.clone(),
                            other => other.to_string(),
                        };
                        (k.clone(), text)
                    })
                    .collect(),
                Some(other) => vec![("detail".into(), other.to_string())],
                None => Vec::new(),
            };
            if let Some(version) = fields
                .iter()
                .find(|(k, _)| k == "plugin_version")
                .map(|(_, v)| v.clone())
            {
                let digest = fields
                    .iter()
                    .find(|(k, _)| k == "plugin_digest")
                    .map(|(_, d)| format!(" ({})", d.chars().take(12).collect::<String>()))
                    .unwrap_or_default();
                plugin = Some(format!(
                    "{} {version}{digest}",
                    e.provider.as_deref().unwrap_or_default()
                ));
            }
            Step {
                status: serde_json::to_value(e.status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                occurred_at: e.occurred_at.clone(),
                provider: e.provider.clone(),
                after,
                fields,
            }
        })
        .collect();
    (steps, plugin)
}

pub(super) async fn message(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path.map_err(bad_path)?;
    let Some((key, cookie)) = signed_in(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    let m: MessageDto = message_with_timeline(&*state.ingest.store, &key.workspace, &id).await?;
    let (steps, plugin) = journey(&m);
    let header = page_context(&state, &key, &cookie);
    let ctx = context! {
        m => Value::from(Serde(&m)),
        steps => Value::from(Serde(&steps)),
        plugin => plugin,
        cost => format!("${:.6}", m.cost_micro_usd as f64 / 1e6),
        ..header
    };
    Ok((StatusCode::OK, render("message.html", ctx)?).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journey_reads_gaps_fields_and_the_plugin_version() {
        let m: MessageDto = serde_json::from_value(serde_json::json!({
            "event_id": "evt_1", "event_name": "welcome", "subscriber_id": "ada",
            "priority": 2, "status": "DELIVERED", "attempts": 1, "cost_micro_usd": 0,
            "test_mode": false, "variables_keys": [],
            "created_at": "2026-11-25T10:00:00.000Z", "updated_at": "2026-11-25T10:00:03.000Z",
            "events": [
                {"seq": 1, "status": "queued", "occurred_at": "2026-11-25T10:00:00.012Z"},
                {"seq": 2, "status": "sent", "occurred_at": "2026-11-25T10:00:01.512Z",
                 "provider": "provc", "detail": {"attempt": 1, "plugin_version": "0.1.0",
                 "plugin_digest": "abcdef0123456789", "resumed": null}},
                {"seq": 3, "status": "delivered", "occurred_at": "2026-11-25T10:02:01.512Z",
                 "provider": "provc", "detail": "carrier said ok"}
            ]
        }))
        .unwrap();
        let (steps, plugin) = journey(&m);
        let after: Vec<_> = steps.iter().map(|s| s.after.clone().unwrap()).collect();
        assert_eq!(after, ["+12 ms", "+1.5 s", "+2 min"]);
        let mut fields = steps[1].fields.clone();
        fields.sort();
        assert_eq!(
            fields,
            vec![
                ("attempt".to_string(), "1".to_string()),
                ("plugin_digest".into(), "abcdef0123456789".into()),
                ("plugin_version".into(), "0.1.0".into()),
            ]
        );
        assert_eq!(
            steps[2].fields,
            vec![("detail".to_string(), "\"carrier said ok\"".to_string())]
        );
        assert_eq!(plugin.as_deref(), Some("provc 0.1.0 (abcdef012345)"));
    }
}
