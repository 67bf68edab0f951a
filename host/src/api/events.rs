//! `POST /v1/events/trigger` and `POST /v1/events/bulk`.

use super::ApiError;
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

async fn trigger(
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
            let key = v.to_str().map_err(|_| {
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
    let (response, replay) = state
        .ingest
        .trigger(&caller.key, request, priority, idempotency_key, || {
            caller.revoked()
        })
        .await?;
    let status = if replay {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, axum::Json(response)))
}

/// Items are parsed one by one, so one bad event fails alone.
#[derive(Deserialize)]
struct BulkBody {
    events: Vec<serde_json::Value>,
}

async fn bulk(
    State(state): State<AppState>,
    caller: Caller,
    Json(body): Json<BulkBody>,
) -> Result<axum::Json<BulkTriggerResponse>, ApiError> {
    let response = state
        .ingest
        .bulk(&caller.key, body.events, || caller.revoked())
        .await?;
    Ok(axum::Json(response))
}
