//! `/v1/webhook-endpoints`: where a workspace's delivery events are posted. Any key of
//! the workspace manages its endpoints; each is signed with a secret of its own
//! (`whsec_…`, shown when the endpoint is created and when it is rotated, never
//! listed). Validation is plain functions ([`crate::outbound`]); each handler makes
//! one store call.

use super::ApiError;
use super::error::ErrorBody;
use super::extract::{Caller, Json};
use super::messages::format_time;
use crate::AppState;
use crate::events;
use crate::ids::EndpointId;
use crate::outbound::policy::{self, UrlPolicy};
use crate::outbound::sign;
use crate::store::{Endpoint, EndpointPatch};
use axum::Router;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::{Deserialize, Deserializer, Serialize};

/// Endpoints one workspace may have: every event is posted to each subscribed one.
pub const MAX_ENDPOINTS: usize = 50;
/// Longest description accepted.
pub const MAX_DESCRIPTION_LEN: usize = 500;
/// Default and largest page of `GET /v1/webhook-endpoints`.
pub const DEFAULT_LIMIT: u32 = 20;
/// Largest page of `GET /v1/webhook-endpoints`.
pub const MAX_LIMIT: u32 = 100;

/// Routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/webhook-endpoints", post(create).get(list))
        .route(
            "/v1/webhook-endpoints/{endpointId}",
            get(read).patch(update).delete(remove),
        )
        .route(
            "/v1/webhook-endpoints/{endpointId}/rotate-secret",
            post(rotate_secret),
        )
}

/// An endpoint as the API shows it (its secret only when it is made).
/// (No `Debug`: it may carry the secret.)
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct EndpointDto {
    /// `ep_…`.
    pub id: String,
    /// Where events are posted.
    pub url: String,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The event types it receives; absent for every type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_types: Option<Vec<String>>,
    /// Receives nothing while true.
    pub disabled: bool,
    /// Why the gateway disabled it (absent when a caller did, or when enabled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_reason: Option<String>,
    /// RFC 3339, UTC.
    #[schema(format = DateTime)]
    pub created_at: String,
    /// RFC 3339, UTC.
    #[schema(format = DateTime)]
    pub updated_at: String,
    /// The signing secret: in the answer to the create only. Keep it; it is not shown
    /// again (rotate to get a new one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

impl EndpointDto {
    fn of(e: &Endpoint) -> Self {
        Self {
            id: e.id.to_string(),
            url: e.url.clone(),
            description: e.description.clone(),
            event_types: e.event_types.clone(),
            disabled: e.disabled,
            disabled_reason: e.disabled_reason.clone(),
            created_at: format_time(&e.created_at),
            updated_at: format_time(&e.updated_at),
            secret: None,
        }
    }
}

/// `POST /v1/webhook-endpoints`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEndpointRequest {
    /// `https://…` (`http://` and internal addresses only where the deployment allows
    /// them; always in `dev`). No credentials in it.
    #[schema(max_length = 2048, pattern = r"^https?://[^\s\u0000-\u001F\u007F]+$")]
    pub url: String,
    /// Free text (up to 500 characters).
    #[serde(default)]
    #[schema(max_length = 500)]
    pub description: Option<String>,
    /// The event types to receive (at least one, no repeats); absent or null for every
    /// type.
    #[serde(default)]
    #[schema(min_items = 1, max_items = 9, value_type = Option<Vec<EventType>>)]
    pub event_types: Option<Vec<String>>,
    /// Create it disabled.
    #[serde(default)]
    pub disabled: bool,
}

impl crate::ingest::JsonBody for CreateEndpointRequest {}

/// A delivery event type: one of [`crate::events::EVENT_TYPES`] (the document's
/// `enum` is filled in from that list, so it is written once).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // documents the strings; requests carry them as text
pub struct EventType(String);

/// A field that is absent (`None`), null (`Some(None)`) or set (`Some(Some(_))`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// A field that may be left out but not given as null (it has nothing to clear): a null
/// is refused as any other value of the wrong type, not taken for "unchanged".
fn not_null<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// `PATCH /v1/webhook-endpoints/{endpointId}`: the fields to change; null clears
/// `description`, and sets `event_types` back to every type. `{}` changes nothing.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateEndpointRequest {
    /// New URL (the create's rules); it cannot be null.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(
        nullable = false,
        max_length = 2048,
        pattern = r"^https?://[^\s\u0000-\u001F\u007F]+$"
    )]
    pub url: Option<String>,
    /// New description; null clears it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>, max_length = 500)]
    pub description: Option<Option<String>>,
    /// New event types; null for every type.
    #[serde(default, deserialize_with = "present")]
    #[schema(min_items = 1, max_items = 9, value_type = Option<Vec<EventType>>)]
    pub event_types: Option<Option<Vec<String>>>,
    /// Disable (true) or enable (false); enabling clears the gateway's reason. It
    /// cannot be null.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false)]
    pub disabled: Option<bool>,
}

impl crate::ingest::JsonBody for UpdateEndpointRequest {}

/// `GET /v1/webhook-endpoints`.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ListEndpointsResponse {
    /// Newest first.
    pub endpoints: Vec<EndpointDto>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `GET /v1/webhook-endpoints` query.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Page size, 1 to 100 (default 20).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
    /// `next_cursor` of the page before.
    #[param(pattern = r"^ep_[0-9a-f]{1,64}$")]
    pub cursor: Option<String>,
}

/// `POST /v1/webhook-endpoints/{endpointId}/rotate-secret`.
/// (No `Debug`: it carries the secret.)
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct RotateSecretResponse {
    /// `ep_…`.
    pub id: String,
    /// The new signing secret (shown once).
    pub secret: String,
    /// Until when the secret before it signs too (RFC 3339, UTC): requests carry a
    /// signature by each, so receivers can switch at their pace.
    #[schema(format = DateTime)]
    pub previous_secret_expires_at: String,
}

/// The checks of a URL and a description, and the event types, as stored.
fn checked_url(url: &str, policy: UrlPolicy) -> Result<String, ApiError> {
    policy::check_url(url, policy)
        .map(|u| u.to_string())
        .map_err(ApiError::BadRequest)
}

fn checked_description(d: Option<String>) -> Result<Option<String>, ApiError> {
    match d {
        Some(d) if d.chars().count() > MAX_DESCRIPTION_LEN => Err(ApiError::BadRequest(format!(
            "description is longer than {MAX_DESCRIPTION_LEN} characters"
        ))),
        other => Ok(other),
    }
}

fn checked_types(types: Option<Vec<String>>) -> Result<Option<Vec<String>>, ApiError> {
    types
        .map(|t| events::check_event_types(&t).map_err(ApiError::BadRequest))
        .transpose()
}

pub(super) fn endpoint_path(
    path: Result<Path<String>, PathRejection>,
) -> Result<EndpointId, ApiError> {
    let Path(id) = path.map_err(|e| ApiError::BadRequest(format!("invalid endpointId: {e}")))?;
    endpoint_id(&id)
}

/// An `endpointId` of a path.
pub(super) fn endpoint_id(id: &str) -> Result<EndpointId, ApiError> {
    EndpointId::parse(id).map_err(|_| {
        ApiError::BadRequest("invalid endpointId: expected ep_ followed by lower-case hex".into())
    })
}

/// A page size of this resource's lists (and its delivery log): 1 to 100, 20 when
/// absent.
pub(super) fn page_limit(limit: Option<u32>) -> Result<u32, ApiError> {
    let limit = limit.unwrap_or(DEFAULT_LIMIT);
    if (1..=MAX_LIMIT).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::BadRequest(format!(
            "limit must be 1 to {MAX_LIMIT}"
        )))
    }
}

pub(super) fn not_found(id: &EndpointId) -> ApiError {
    ApiError::ResourceNotFound(format!("no webhook endpoint {id} in this workspace"))
}

/// Creates an endpoint and answers with its signing secret (shown this once).
#[utoipa::path(post, operation_id = "createWebhookEndpoint", path = "/v1/webhook-endpoints", tag = "webhook-endpoints",
    request_body = CreateEndpointRequest,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Created; `secret` is shown this once", body = EndpointDto),
        (status = 400, description = "An invalid URL (scheme, credentials, an address the deployment refuses), description or event type, or the workspace's 50 endpoints reached", body = ErrorBody),
        (status = 401, description = "Missing, malformed or unrecognised key", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 500, description = "Store unavailable; nothing was written", body = ErrorBody),
    ))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    Json(request): Json<CreateEndpointRequest>,
) -> Result<(StatusCode, axum::Json<EndpointDto>), ApiError> {
    let url = checked_url(&request.url, UrlPolicy::of(&state.config))?;
    let description = checked_description(request.description)?;
    let event_types = checked_types(request.event_types)?;
    let store = &state.ingest.store;
    let workspace = &caller.key.workspace;
    let now = crate::store::now_micros();
    let endpoint = Endpoint {
        id: EndpointId::generate(),
        workspace: workspace.clone(),
        url,
        description,
        event_types,
        disabled: request.disabled,
        disabled_reason: None,
        secret: sign::new_secret(),
        previous_secret: None,
        created_at: now,
        updated_at: now,
    };
    caller.still_valid().await?;
    let created = store
        .create_endpoint(&endpoint, MAX_ENDPOINTS)
        .await
        .map_err(ApiError::from_store_write)?;
    if !created {
        return Err(ApiError::BadRequest(format!(
            "this workspace has {MAX_ENDPOINTS} webhook endpoints, the most it may have: delete one first"
        )));
    }
    let mut dto = EndpointDto::of(&endpoint);
    dto.secret = Some(endpoint.secret.clone());
    Ok((StatusCode::CREATED, axum::Json(dto)))
}

/// The workspace's endpoints, newest first (secrets are never listed).
#[utoipa::path(get, operation_id = "listWebhookEndpoints", path = "/v1/webhook-endpoints", tag = "webhook-endpoints",
    params(ListQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A page of endpoints", body = ListEndpointsResponse),
        (status = 400, description = "Invalid `limit` or `cursor`", body = ErrorBody),
        (status = 401, description = "Missing, malformed or unrecognised key", body = ErrorBody),
        (status = 500, description = "Store error", body = ErrorBody),
        (status = 503, description = "Database unavailable", body = ErrorBody),
    ))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<axum::Json<ListEndpointsResponse>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(format!("invalid query: {e}")))?;
    let limit = page_limit(query.limit)?;
    let cursor = query
        .cursor
        .as_deref()
        .map(EndpointId::parse)
        .transpose()
        .map_err(|_| ApiError::BadRequest("invalid cursor".into()))?;
    // One more than the page tells whether there is a next one.
    let mut page = state
        .ingest
        .store
        .list_endpoints(&caller.key.workspace, cursor.as_ref(), limit + 1)
        .await
        .map_err(ApiError::from_store_read)?;
    let more = page.len() > limit as usize;
    page.truncate(limit as usize);
    Ok(axum::Json(ListEndpointsResponse {
        next_cursor: more
            .then(|| page.last().map(|e| e.id.to_string()))
            .flatten(),
        endpoints: page.iter().map(EndpointDto::of).collect(),
    }))
}

/// One endpoint (without its secret).
#[utoipa::path(get, operation_id = "getWebhookEndpoint", path = "/v1/webhook-endpoints/{endpointId}", tag = "webhook-endpoints",
    params(("endpointId" = String, Path, description = "`ep_…`", pattern = r"^ep_[0-9a-f]{1,64}$")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The endpoint", body = EndpointDto),
        (status = 400, description = "Invalid endpointId", body = ErrorBody),
        (status = 401, description = "Missing, malformed or unrecognised key", body = ErrorBody),
        (status = 404, description = "No such endpoint in this workspace", body = ErrorBody),
        (status = 500, description = "Store error", body = ErrorBody),
        (status = 503, description = "Database unavailable", body = ErrorBody),
    ))]
pub async fn read(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
) -> Result<axum::Json<EndpointDto>, ApiError> {
    let id = endpoint_path(path)?;
    let endpoint = state
        .ingest
        .store
        .endpoint(&caller.key.workspace, &id)
        .await
        .map_err(ApiError::from_store_read)?
        .ok_or_else(|| not_found(&id))?;
    Ok(axum::Json(EndpointDto::of(&endpoint)))
}

/// Changes the fields given; `{}` changes nothing.
#[utoipa::path(patch, operation_id = "updateWebhookEndpoint", path = "/v1/webhook-endpoints/{endpointId}", tag = "webhook-endpoints",
    params(("endpointId" = String, Path, description = "`ep_…`", pattern = r"^ep_[0-9a-f]{1,64}$")),
    request_body = UpdateEndpointRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The endpoint as it is now", body = EndpointDto),
        (status = 400, description = "Invalid endpointId, URL, description or event type, or a null url or disabled", body = ErrorBody),
        (status = 401, description = "Missing, malformed or unrecognised key", body = ErrorBody),
        (status = 404, description = "No such endpoint in this workspace", body = ErrorBody),
        (status = 409, description = "Concurrent changes kept winning; nothing was changed", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 500, description = "Store unavailable; nothing was written", body = ErrorBody),
    ))]
pub async fn update(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    Json(request): Json<UpdateEndpointRequest>,
) -> Result<axum::Json<EndpointDto>, ApiError> {
    let id = endpoint_path(path)?;
    let patch = EndpointPatch {
        url: request
            .url
            .map(|u| checked_url(&u, UrlPolicy::of(&state.config)))
            .transpose()?,
        description: request.description.map(checked_description).transpose()?,
        event_types: request.event_types.map(checked_types).transpose()?,
        disabled: request.disabled,
    };
    caller.still_valid().await?;
    let store = &state.ingest.store;
    let endpoint = if patch == EndpointPatch::default() {
        store
            .endpoint(&caller.key.workspace, &id)
            .await
            .map_err(ApiError::from_store_read)?
    } else {
        store
            .patch_endpoint(&caller.key.workspace, &id, &patch)
            .await
            .map_err(ApiError::from_store_change)?
    };
    let endpoint = endpoint.ok_or_else(|| not_found(&id))?;
    Ok(axum::Json(EndpointDto::of(&endpoint)))
}

/// Deletes an endpoint: nothing more is posted to it.
#[utoipa::path(delete, operation_id = "deleteWebhookEndpoint", path = "/v1/webhook-endpoints/{endpointId}", tag = "webhook-endpoints",
    params(("endpointId" = String, Path, description = "`ep_…`", pattern = r"^ep_[0-9a-f]{1,64}$")),
    security(("bearer" = [])),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Invalid endpointId", body = ErrorBody),
        (status = 401, description = "Missing, malformed or unrecognised key", body = ErrorBody),
        (status = 404, description = "No such endpoint in this workspace", body = ErrorBody),
        (status = 500, description = "Store unavailable; nothing was deleted", body = ErrorBody),
    ))]
pub async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let id = endpoint_path(path)?;
    caller.still_valid().await?;
    let deleted = state
        .ingest
        .store
        .delete_endpoint(&caller.key.workspace, &id)
        .await
        .map_err(ApiError::from_store_write)?;
    if deleted {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(not_found(&id))
    }
}

/// A new signing secret; the one before it keeps signing beside it for
/// `webhook_endpoints.secret_overlap_secs` (a day by default).
#[utoipa::path(post, operation_id = "rotateWebhookEndpointSecret", path = "/v1/webhook-endpoints/{endpointId}/rotate-secret", tag = "webhook-endpoints",
    params(("endpointId" = String, Path, description = "`ep_…`", pattern = r"^ep_[0-9a-f]{1,64}$")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Rotated; `secret` is shown this once", body = RotateSecretResponse),
        (status = 400, description = "Invalid endpointId", body = ErrorBody),
        (status = 401, description = "Missing, malformed or unrecognised key", body = ErrorBody),
        (status = 404, description = "No such endpoint in this workspace", body = ErrorBody),
        (status = 409, description = "Concurrent changes kept winning; nothing was changed", body = ErrorBody),
        (status = 500, description = "Store unavailable; nothing was written", body = ErrorBody),
    ))]
pub async fn rotate_secret(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
) -> Result<axum::Json<RotateSecretResponse>, ApiError> {
    let id = endpoint_path(path)?;
    let secret = sign::new_secret();
    // Bounded by the configuration's check (30 days), so this cannot overflow.
    let overlap = chrono::Duration::seconds(
        i64::try_from(state.config.webhook_endpoints.secret_overlap_secs)
            .unwrap_or(0)
            .min(crate::config::MAX_SECRET_OVERLAP_SECS as i64),
    );
    let until = crate::store::now_micros() + overlap;
    caller.still_valid().await?;
    let endpoint = state
        .ingest
        .store
        .rotate_endpoint_secret(&caller.key.workspace, &id, &secret, until)
        .await
        .map_err(ApiError::from_store_change)?
        .ok_or_else(|| not_found(&id))?;
    Ok(axum::Json(RotateSecretResponse {
        id: endpoint.id.to_string(),
        secret,
        previous_secret_expires_at: format_time(&until),
    }))
}
