//! An endpoint's delivery log and what a caller does with it:
//! `GET /v1/webhook-endpoints/{endpointId}/deliveries` (every event posted or to be
//! posted to it, newest first, each with its tries),
//! `POST …/deliveries/{deliveryId}/retry` (send a finished one again) and
//! `POST /v1/webhook-endpoints/{endpointId}/test` (a made-up event, through the same
//! path as real ones). Workspace-scoped like the endpoints themselves.

use super::ApiError;
use super::endpoints::{endpoint_id, endpoint_path, not_found, page_limit};
use super::error::ErrorBody;
use super::extract::{Caller, Json};
use super::log_cursor;
use super::messages::format_time;
use crate::AppState;
use crate::events;
use crate::ids::{EndpointId, WebhookDeliveryId};
use crate::store::outbound::{OutboundAttempt, OutboundDelivery, OutboundStatus};
use axum::Router;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

/// The type a test event has when the request names none.
pub const DEFAULT_TEST_TYPE: &str = "message.delivered";

/// Routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/webhook-endpoints/{endpointId}/test", post(test))
        .route("/v1/webhook-endpoints/{endpointId}/deliveries", get(list))
        .route(
            "/v1/webhook-endpoints/{endpointId}/deliveries/{deliveryId}/retry",
            post(retry),
        )
}

/// One try of a delivery.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct AttemptDto {
    /// 1 for the first try.
    pub attempt: i32,
    /// When it was made (RFC 3339, UTC).
    #[schema(format = DateTime)]
    pub attempted_at: String,
    /// The endpoint's HTTP status; absent when it did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<i32>,
    /// From the request to the answer or the failure, milliseconds.
    pub latency_ms: i64,
    /// Why there was no answer (refused, timed out, an address the deployment
    /// forbids, the endpoint disabled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When it is tried again; absent when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub next_retry_at: Option<String>,
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DeliveryStatus {
    /// Waiting for its first try or a retry.
    Pending,
    /// The endpoint answered 2xx.
    Succeeded,
    /// Given up: the retry schedule ran out, the endpoint answered 410, or it was
    /// disabled.
    Failed,
}

/// One event for one endpoint, with its tries.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct DeliveryDto {
    /// `whd_…`.
    pub id: String,
    /// The event's id (its `webhook-id` header): the receiver's de-duplication key.
    pub event_id: String,
    /// `message.delivered`, ...
    pub event_type: String,
    /// Where it stands.
    pub status: DeliveryStatus,
    /// When the next try is due; only while pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub next_attempt_at: Option<String>,
    /// The body posted, exactly as signed.
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    /// Every try, oldest first.
    pub attempts: Vec<AttemptDto>,
    /// RFC 3339, UTC.
    #[schema(format = DateTime)]
    pub created_at: String,
    /// RFC 3339, UTC.
    #[schema(format = DateTime)]
    pub updated_at: String,
}

impl DeliveryDto {
    fn of(d: &OutboundDelivery, attempts: &[OutboundAttempt]) -> Self {
        let status = match d.status {
            OutboundStatus::Pending => DeliveryStatus::Pending,
            OutboundStatus::Succeeded => DeliveryStatus::Succeeded,
            OutboundStatus::Failed => DeliveryStatus::Failed,
        };
        Self {
            id: d.id.to_string(),
            event_id: d.event_id.clone(),
            event_type: d.event_type.clone(),
            status,
            next_attempt_at: (status == DeliveryStatus::Pending)
                .then(|| format_time(&d.next_attempt_at)),
            // Written by the gateway as JSON; a body that is not would be a bug.
            payload: serde_json::from_str(&d.body).unwrap_or(serde_json::Value::Null),
            attempts: attempts
                .iter()
                .map(|a| AttemptDto {
                    attempt: a.attempt_no,
                    attempted_at: format_time(&a.attempted_at),
                    status_code: a.status_code,
                    latency_ms: a.latency_ms,
                    error: a.error.clone(),
                    next_retry_at: a.next_retry_at.as_ref().map(format_time),
                })
                .collect(),
            created_at: format_time(&d.created_at),
            updated_at: format_time(&d.updated_at),
        }
    }
}

/// `GET /v1/webhook-endpoints/{endpointId}/deliveries`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ListDeliveriesResponse {
    /// Newest first.
    pub deliveries: Vec<DeliveryDto>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `GET /v1/webhook-endpoints/{endpointId}/deliveries` query.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Page size, 1 to 100 (default 20).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
    /// `next_cursor` of the page before, unchanged (opaque).
    #[param(pattern = r"^[A-Za-z0-9_-]{22}$")]
    pub cursor: Option<String>,
}

/// `POST /v1/webhook-endpoints/{endpointId}/test`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TestEventRequest {
    /// The event's type (default `message.delivered`); sent whatever the endpoint
    /// subscribed to.
    #[serde(default)]
    #[schema(value_type = Option<super::endpoints::EventType>)]
    pub event_type: Option<String>,
}

impl crate::ingest::JsonBody for TestEventRequest {}

/// 404 unless the workspace has the endpoint.
async fn existing(state: &AppState, caller: &Caller, id: &EndpointId) -> Result<(), ApiError> {
    state
        .ingest
        .store
        .endpoint(&caller.key.workspace, id)
        .await
        .map_err(ApiError::from_store_read)?
        .map(|_| ())
        .ok_or_else(|| not_found(id))
}

/// Posts a made-up event (test mode, a fresh id) to the endpoint, through the same
/// queue, signing and retries as real events; its delivery shows in the log.
#[utoipa::path(post, operation_id = "testWebhookEndpoint", path = "/v1/webhook-endpoints/{endpointId}/test", tag = "webhook-endpoints",
    params(("endpointId" = String, Path, description = "`ep_…`", pattern = r"^ep_[0-9a-f]{1,64}$")),
    request_body = TestEventRequest,
    security(("bearer" = [])),
    responses(
        (status = 202, description = "Queued; the delivery as it is now", body = DeliveryDto),
        (status = 400, description = "Invalid endpointId or event type", body = ErrorBody),
        (status = 401, description = "Missing, malformed or unrecognised key", body = ErrorBody),
        (status = 404, description = "No such endpoint in this workspace", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 429, description = "Workspace quota exceeded (a test event counts as a request); nothing was queued", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
        (status = 500, description = "Store or counter store unavailable; nothing was queued", body = ErrorBody),
    ))]
pub async fn test(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    Json(request): Json<TestEventRequest>,
) -> Result<(StatusCode, axum::Json<DeliveryDto>), ApiError> {
    let id = endpoint_path(path)?;
    let kind = request
        .event_type
        .unwrap_or_else(|| DEFAULT_TEST_TYPE.to_string());
    events::check_event_types(std::slice::from_ref(&kind)).map_err(ApiError::BadRequest)?;
    caller.still_valid().await?;
    // It sends a request to a URL of the caller's choosing: it counts like a trigger.
    state.ingest.admit_request(&caller.key).await?;
    let delivery = state
        .ingest
        .store
        .send_test_event(&caller.key.workspace, &id, &kind)
        .await
        .map_err(ApiError::from_store_write)?
        .ok_or_else(|| not_found(&id))?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(DeliveryDto::of(&delivery, &[])),
    ))
}

/// The endpoint's delivery log, newest first, each delivery with its tries.
#[utoipa::path(get, operation_id = "listWebhookDeliveries", path = "/v1/webhook-endpoints/{endpointId}/deliveries", tag = "webhook-endpoints",
    params(
        ("endpointId" = String, Path, description = "`ep_…`", pattern = r"^ep_[0-9a-f]{1,64}$"),
        ListQuery,
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A page of deliveries", body = ListDeliveriesResponse),
        (status = 400, description = "Invalid endpointId, `limit` or `cursor`", body = ErrorBody),
        (status = 401, description = "Missing, malformed or unrecognised key", body = ErrorBody),
        (status = 404, description = "No such endpoint in this workspace", body = ErrorBody),
        (status = 500, description = "Store error", body = ErrorBody),
        (status = 503, description = "Database unavailable", body = ErrorBody),
    ))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<axum::Json<ListDeliveriesResponse>, ApiError> {
    let id = endpoint_path(path)?;
    let Query(query) = query.map_err(|e| ApiError::BadRequest(format!("invalid query: {e}")))?;
    let limit = page_limit(query.limit)?;
    existing(&state, &caller, &id).await?;
    let cursor = match &query.cursor {
        Some(c) => Some(
            log_cursor::open(cursor_secret(&state).await?, &id, c).ok_or_else(|| {
                ApiError::BadRequest(
                    "invalid cursor: pass back a `next_cursor` of this endpoint's log unchanged"
                        .into(),
                )
            })?,
        ),
        None => None,
    };
    // One more than the page tells whether there is a next one.
    let mut page = state
        .ingest
        .store
        .list_deliveries(&caller.key.workspace, &id, cursor, limit + 1)
        .await
        .map_err(ApiError::from_store_read)?;
    let more = page.len() > limit as usize;
    page.truncate(limit as usize);
    let next_cursor = match (more, page.last()) {
        (true, Some((last, _))) => Some(log_cursor::seal(
            cursor_secret(&state).await?,
            &id,
            last.seq,
        )),
        _ => None,
    };
    Ok(axum::Json(ListDeliveriesResponse {
        next_cursor,
        deliveries: page.iter().map(|(d, a)| DeliveryDto::of(d, a)).collect(),
    }))
}

/// The secret the log's cursors are sealed with ([`log_cursor`]): read from the
/// database once per process (it never changes).
async fn cursor_secret(state: &AppState) -> Result<&[u8; 32], ApiError> {
    state
        .log_cursor_secret
        .get_or_try_init(|| state.ingest.store.gateway_secret(log_cursor::SECRET))
        .await
        .map_err(ApiError::from_store_read)
}

/// Sends a finished delivery (succeeded or failed) again, now: a new try with the
/// same event id, so a receiver that has it already can tell.
#[utoipa::path(post, operation_id = "retryWebhookDelivery", path = "/v1/webhook-endpoints/{endpointId}/deliveries/{deliveryId}/retry", tag = "webhook-endpoints",
    params(
        ("endpointId" = String, Path, description = "`ep_…`", pattern = r"^ep_[0-9a-f]{1,64}$"),
        ("deliveryId" = String, Path, description = "`whd_…`", pattern = r"^whd_[0-9a-f]{1,64}$"),
    ),
    security(("bearer" = [])),
    responses(
        (status = 202, description = "Queued again; the delivery as it is now", body = DeliveryDto),
        (status = 400, description = "Invalid endpointId or deliveryId", body = ErrorBody),
        (status = 401, description = "Missing, malformed or unrecognised key", body = ErrorBody),
        (status = 404, description = "No such delivery of this endpoint in this workspace", body = ErrorBody),
        (status = 409, description = "The delivery is still pending: it is tried on its schedule", body = ErrorBody),
        (status = 429, description = "Workspace quota exceeded (a retry counts as a request); nothing was queued", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
        (status = 500, description = "Store or counter store unavailable; nothing was queued", body = ErrorBody),
    ))]
pub async fn retry(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<(StatusCode, axum::Json<DeliveryDto>), ApiError> {
    let Path((endpoint, delivery)) =
        path.map_err(|e| ApiError::BadRequest(format!("invalid path: {e}")))?;
    let endpoint = endpoint_id(&endpoint)?;
    let delivery = WebhookDeliveryId::parse(&delivery).map_err(|_| {
        ApiError::BadRequest("invalid deliveryId: expected whd_ followed by lower-case hex".into())
    })?;
    caller.still_valid().await?;
    state.ingest.admit_request(&caller.key).await?;
    let (retried, attempts) = state
        .ingest
        .store
        .retry_delivery(&caller.key.workspace, &endpoint, &delivery)
        .await
        .map_err(ApiError::from_store_change)?
        .ok_or_else(|| {
            ApiError::ResourceNotFound(format!(
                "no delivery {delivery} of webhook endpoint {endpoint} in this workspace"
            ))
        })?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(DeliveryDto::of(&retried, &attempts)),
    ))
}
