//! `POST /v1/events/trigger` and `POST /v1/events/bulk`.

use super::ApiError;
use super::error::ErrorBody;
use super::extract::{Caller, Json};
use crate::AppState;
use crate::ingest::{BulkTriggerResponse, TriggerRequest, TriggerResponse};
use crate::routing::Priority;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde::Deserialize;

/// Routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/events/trigger", post(trigger))
        .route("/v1/events/bulk", post(bulk))
}

/// Triggers one notification.
#[utoipa::path(post, operation_id = "triggerEvent", path = "/v1/events/trigger", tag = "events", request_body = TriggerRequest,
    params(
        ("Idempotency-Key" = Option<String>, Header, description = "Replays within 24 h return the original response with 200"),
        ("X-Priority-Override" = Option<String>, Header, description = "CRITICAL, HIGH, NORMAL or LOW; anything else is NORMAL"),
    ),
    security(("bearer" = [])),
    responses(
        (status = 202, description = "Accepted and durable", body = TriggerResponse),
        (status = 200, description = "Idempotent replay", body = TriggerResponse),
        (status = 400, description = "Invalid request or no contact details", body = ErrorBody),
        (status = 401, description = "Missing, malformed or unrecognised key", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 429, description = "Workspace quota or subscriber cap exceeded", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds until the quota counts again (1)"))),
        (status = 500, description = "Counter store, database or encoding failure", body = ErrorBody),
    ))]
pub async fn trigger(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Json(request): Json<TriggerRequest>,
) -> Result<(StatusCode, axum::Json<TriggerResponse>), ApiError> {
    let priority = Priority::from_header(
        headers
            .get("x-priority-override")
            .and_then(|v| v.to_str().ok()),
    );
    let idempotency_key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => {
            // `to_str` also lets a tab through; the key is printable ASCII only.
            let key = v
                .to_str()
                .ok()
                .filter(|k| k.bytes().all(|b| (b' '..=b'~').contains(&b)))
                .ok_or_else(|| {
                    ApiError::BadRequest("Idempotency-Key must be visible ASCII".into())
                })?;
            if key.is_empty() || key.len() > 255 {
                return Err(ApiError::BadRequest(
                    "Idempotency-Key must be 1 to 255 characters".into(),
                ));
            }
            Some(key.to_string())
        }
    };
    // A caller that hangs up drops this future; the acceptance it started must finish
    // anyway, so its idempotency key is always completed or released, never left
    // pending (a retry then replays the event instead of waiting or duplicating it).
    let ingest = state.ingest.clone();
    let accepted = tokio::spawn(async move {
        ingest
            .trigger(&caller.key, request, priority, idempotency_key, || {
                caller.revoked()
            })
            .await
    });
    let (response, replay) = accepted
        .await
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("trigger task failed: {e}")))??;
    let status = if replay {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, axum::Json(response)))
}

/// The spec's BulkTriggerRequest. Items stay raw JSON when parsed, so one bad event
/// fails alone (a FAILED item) instead of failing the request.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkTriggerRequest {
    /// 1 to 5,000 events.
    #[schema(value_type = Vec<TriggerRequest>, min_items = 1, max_items = 5000)]
    events: Vec<serde_json::Value>,
}

impl crate::ingest::JsonBody for BulkTriggerRequest {}

/// Triggers up to 5,000 notifications; each succeeds or fails on its own.
#[utoipa::path(post, operation_id = "triggerBulk", path = "/v1/events/bulk", tag = "events", request_body = BulkTriggerRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Per-event outcomes, even if all failed", body = BulkTriggerResponse),
        (status = 400, description = "Empty or over 5,000 events", body = ErrorBody),
        (status = 401, description = "Missing, malformed or unrecognised key", body = ErrorBody),
        (status = 429, description = "Workspace quota exceeded", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds until the quota counts again (1)"))),
    ))]
pub async fn bulk(
    State(state): State<AppState>,
    caller: Caller,
    Json(body): Json<BulkTriggerRequest>,
) -> Result<axum::Json<BulkTriggerResponse>, ApiError> {
    let response = state
        .ingest
        .bulk(&caller.key, body.events, || caller.revoked())
        .await?;
    Ok(axum::Json(response))
}
