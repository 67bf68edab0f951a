//! Webhook endpoints: the workspace's endpoints, each endpoint's delivery log (every
//! try with its status, latency and error), and the two actions a caller takes from
//! it: send a test event, retry a finished delivery. Creating and changing endpoints
//! stays with the API (the secret is shown once, to the program that keeps it).

use super::{
    Csrf, bad_form, bad_path, check_csrf, page_context, render, signed_in, signed_in_to_write,
    to_sign_in,
};
use crate::AppState;
use crate::api::ApiError;
use crate::api::endpoint_deliveries::DEFAULT_TEST_TYPE;
use crate::api::messages::format_time;
use crate::ids::{EndpointId, WebhookDeliveryId};
use crate::store::outbound::OutboundStatus;
use axum::extract::rejection::{FormRejection, PathRejection};
use axum::extract::{Form, Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use minijinja::value::Serde;
use minijinja::{Value, context};
use serde::Serialize;

/// Deliveries the log page shows (the API pages through all of them).
const LOG_PAGE: u32 = 50;

#[derive(Serialize)]
struct EndpointRow {
    id: String,
    url: String,
    description: Option<String>,
    event_types: String,
    disabled: bool,
    disabled_reason: Option<String>,
    created_at: String,
}

#[derive(Serialize)]
struct TryRow {
    attempt: i32,
    at: String,
    status_code: Option<i32>,
    latency_ms: i64,
    error: Option<String>,
    next_retry_at: Option<String>,
}

#[derive(Serialize)]
struct DeliveryRow {
    id: String,
    event_id: String,
    event_type: String,
    status: &'static str,
    finished: bool,
    created_at: String,
    tries: Vec<TryRow>,
}

fn endpoint_id(id: &str) -> Result<EndpointId, ApiError> {
    EndpointId::parse(id).map_err(|_| ApiError::BadRequest(format!("invalid endpoint id {id:?}")))
}

fn not_found(id: &EndpointId) -> ApiError {
    ApiError::ResourceNotFound(format!("no webhook endpoint {id} in this workspace"))
}

pub(super) async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Some((key, cookie)) = signed_in(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    let rows: Vec<EndpointRow> = state
        .ingest
        .store
        .list_endpoints(
            &key.workspace,
            None,
            crate::api::endpoints::MAX_ENDPOINTS as u32,
        )
        .await
        .map_err(ApiError::from_store_read)?
        .into_iter()
        .map(|e| EndpointRow {
            id: e.id.to_string(),
            url: e.url,
            description: e.description,
            event_types: e
                .event_types
                .map_or_else(|| "every type".to_string(), |t| t.join(", ")),
            disabled: e.disabled,
            disabled_reason: e.disabled_reason,
            created_at: format_time(&e.created_at),
        })
        .collect();
    let header = page_context(&state, &key, &cookie);
    let ctx = context! { endpoints => Value::from(Serde(&rows)), ..header };
    Ok(render("endpoints.html", ctx)?.into_response())
}

pub(super) async fn log(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path.map_err(bad_path)?;
    let id = endpoint_id(&id)?;
    let Some((key, cookie)) = signed_in(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    let store = &state.ingest.store;
    let endpoint = store
        .endpoint(&key.workspace, &id)
        .await
        .map_err(ApiError::from_store_read)?
        .ok_or_else(|| not_found(&id))?;
    let deliveries: Vec<DeliveryRow> = store
        .list_deliveries(&key.workspace, &id, None, LOG_PAGE)
        .await
        .map_err(ApiError::from_store_read)?
        .into_iter()
        .map(|(d, tries)| DeliveryRow {
            id: d.id.to_string(),
            event_id: d.event_id,
            event_type: d.event_type,
            status: d.status.as_str(),
            finished: d.status != OutboundStatus::Pending,
            created_at: format_time(&d.created_at),
            tries: tries
                .into_iter()
                .map(|t| TryRow {
                    attempt: t.attempt_no,
                    at: format_time(&t.attempted_at),
                    status_code: t.status_code,
                    latency_ms: t.latency_ms,
                    error: t.error,
                    next_retry_at: t.next_retry_at.as_ref().map(format_time),
                })
                .collect(),
        })
        .collect();
    let header = page_context(&state, &key, &cookie);
    let ctx = context! {
        endpoint => context! {
            id => endpoint.id.as_str(),
            url => endpoint.url,
            disabled => endpoint.disabled,
            disabled_reason => endpoint.disabled_reason,
        },
        deliveries => Value::from(Serde(&deliveries)),
        test_type => DEFAULT_TEST_TYPE,
        ..header
    };
    Ok(render("endpoint.html", ctx)?.into_response())
}

/// Queues a test event for an endpoint of the signed-in workspace.
pub(super) async fn test(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    form: Result<Form<Csrf>, FormRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path.map_err(bad_path)?;
    let id = endpoint_id(&id)?;
    let Form(form) = form.map_err(bad_form)?;
    let Some((key, cookie)) = signed_in_to_write(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    check_csrf(&state, &cookie, &form)?;
    // Counted as the API's test event is: it sends a request to the endpoint's URL.
    state.ingest.admit_request(&key).await?;
    state
        .ingest
        .store
        .send_test_event(&key.workspace, &id, DEFAULT_TEST_TYPE)
        .await
        .map_err(ApiError::from_store_write)?
        .ok_or_else(|| not_found(&id))?;
    Ok(Redirect::to(&format!("/console/endpoints/{id}")).into_response())
}

/// Sends a finished delivery of an endpoint of the signed-in workspace again.
pub(super) async fn retry(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
    form: Result<Form<Csrf>, FormRejection>,
) -> Result<Response, ApiError> {
    let Path((id, delivery)) = path.map_err(bad_path)?;
    let id = endpoint_id(&id)?;
    let delivery = WebhookDeliveryId::parse(&delivery)
        .map_err(|_| ApiError::BadRequest(format!("invalid delivery id {delivery:?}")))?;
    let Form(form) = form.map_err(bad_form)?;
    let Some((key, cookie)) = signed_in_to_write(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    check_csrf(&state, &cookie, &form)?;
    state.ingest.admit_request(&key).await?;
    state
        .ingest
        .store
        .retry_delivery(&key.workspace, &id, &delivery)
        .await
        .map_err(ApiError::from_store_change)?
        .ok_or_else(|| {
            ApiError::ResourceNotFound(format!("no delivery {delivery} of endpoint {id}"))
        })?;
    Ok(Redirect::to(&format!("/console/endpoints/{id}")).into_response())
}
