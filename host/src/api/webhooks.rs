//! `POST /v1/webhooks/{provider}`: provider delivery receipts, authenticated by the
//! provider's signature (no API key). The body is taken as raw bytes and handed to
//! the provider's plugin unparsed; see [`crate::webhooks`].

use super::ApiError;
use crate::AppState;
use crate::source_address::SourceAddress;
use crate::webhooks::{WebhookError, failure_path};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::post;
use serde::{Deserialize, Serialize};

/// The spec's WebhookResponse.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WebhookResponse {
    /// Always `ACCEPTED`.
    pub status: String,
    /// The provider slug from the path.
    pub provider: String,
    /// The callback's receipt id, `dlr_<hex>`.
    pub event_id: String,
}

/// The spec's GenericWebhookPayload: what the bundled providers' callbacks carry. Every
/// field is optional; which ones a receipt needs is the provider plugin's rule (the
/// bundled ones need `message_id` and `status`). Documentation only: the body is
/// verified byte-exact before anything parses it.
#[derive(Serialize, utoipa::ToSchema)]
#[allow(dead_code)]
pub struct GenericWebhookPayload {
    /// `email`, `sms`, `push`, `whatsapp` or `voice`.
    channel: Option<String>,
    /// Provider-reported cost in USD.
    cost: Option<f64>,
    /// Provider-reported latency.
    #[schema(minimum = 0, maximum = 2147483647)]
    latency_ms: Option<i32>,
    /// The provider's message id.
    message_id: Option<String>,
    /// Address or device token.
    recipient: Option<String>,
    /// Delivery status (voice providers also send their carrier call states here).
    #[schema(example = "DELIVERED")]
    status: Option<String>,
}

/// One receipt or several in one callback.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum WebhookBody {
    /// One receipt.
    One(GenericWebhookPayload),
    /// Several receipts.
    Many(Vec<GenericWebhookPayload>),
}

/// The webhook route.
pub fn router(max_body_bytes: usize) -> Router<AppState> {
    Router::new()
        .route("/v1/webhooks/{provider}", post(receive))
        .route("/v1/webhooks/{provider}/{workspace}", post(receive))
        .layer(axum::extract::DefaultBodyLimit::max(max_body_bytes))
}

/// Receives one provider callback.
#[utoipa::path(
    post,
    operation_id = "receiveWebhook",
    path = "/v1/webhooks/{provider}",
    tag = "webhooks",
    params(
        ("provider" = String, Path, description = "Provider slug, any case: `provA` .. `provE` (or `prova` .. `prove`), or an installed plugin's"),
        ("provA-id" = Option<String>, Header, description = "provA: the callback's id (signed)"),
        ("provA-timestamp" = Option<String>, Header, description = "provA: epoch seconds (signed; 5 minute window)"),
        ("provA-signature" = Option<String>, Header, description = "provA: `v1,<base64 HMAC-SHA256 of {id}.{timestamp}.{body}>`, several space-separated allowed"),
        ("producer-signature" = Option<String>, Header, description = "provB: `ts=<ts>;s=<hex HMAC-SHA256 of {ts}.{body}>;s-algorithm=HmacSHA256`"),
        ("X-provC-Signature" = Option<String>, Header, description = "provC: hex HMAC-SHA256 of the body"),
        ("X-provD-Signature" = Option<String>, Header, description = "provD: base64 HMAC-SHA256 of the body"),
        ("X-Hub-Signature" = Option<String>, Header, description = "provE: `sha256=<hex HMAC-SHA256 of the body>`"),
    ),
    request_body(content = WebhookBody, description = "The provider's callback, verified byte-exact before it is parsed: one GenericWebhookPayload or an array of them for the bundled providers", content_type = "application/json"),
    responses(
        (status = 200, description = "Verified and on the telemetry stream", body = WebhookResponse),
        (status = 400, description = "Verified, but not a receipt the provider's plugin understands", body = super::error::ErrorBody),
        (status = 401, description = "`INVALID_SIGNATURE`: missing, malformed, wrong or stale signature", body = super::error::ErrorBody),
        (status = 404, description = "No such provider", body = super::error::ErrorBody),
        (status = 413, description = "Body over `webhooks.max_body_bytes` (256 KiB)", body = super::error::ErrorBody),
        (status = 429, description = "Too many failed signatures from this address in the last minute", body = super::error::ErrorBody, headers(("Retry-After" = u64, description = "Seconds until the minute that blocks this address ends"))),
        (status = 500, description = "Encoding, store or broker failure: retry", body = super::error::ErrorBody),
        (status = 503, description = "`SERVICE_UNAVAILABLE`: every callback slot is taken and four callbacks per slot already wait: retry later", body = super::error::ErrorBody),
    )
)]
pub async fn receive(
    State(state): State<AppState>,
    path: Result<Path<Vec<String>>, PathRejection>,
    SourceAddress(source): SourceAddress,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<WebhookResponse>, ApiError> {
    let Path(segments) =
        path.map_err(|e| ApiError::BadRequest(format!("invalid provider in the path: {e}")))?;
    let (provider, workspace) = match segments.as_slice() {
        [provider] => (provider.clone(), None),
        [provider, workspace] => (provider.clone(), Some(workspace.clone())),
        _ => return Err(ApiError::NotFound),
    };
    let failures_path = failure_path(&provider, workspace.as_deref());
    // Counted once its signature fails, not from the start: a provider's good
    // callbacks come in bursts from few addresses, and must not count while checked.
    let attempt = state
        .webhooks
        .failures
        .check(source, &failures_path)
        .map_err(|left| {
            ApiError::RateLimited(
                "too many callbacks with bad signatures from this address: retry later".into(),
                left,
            )
        })?;
    let body = body.map_err(|e| {
        if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge(state.config.webhooks.max_body_bytes)
        } else {
            ApiError::BadRequest(format!("could not read the request body: {e}"))
        }
    })?;
    // Header values that are not visible ASCII cannot be part of any bundled scheme;
    // they are passed on lossily rather than dropped, so a plugin sees every header.
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_string(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    let span = tracing::info_span!("webhook", provider = %provider);
    let received = state
        .webhooks
        .receive(&provider, workspace.as_deref(), &headers, &body);
    let accepted = tracing::Instrument::instrument(received, span)
        .await
        .inspect_err(|e| {
            if let WebhookError::InvalidSignature(_) = e {
                attempt.failed();
            }
        })
        .map_err(|e| match e {
            WebhookError::UnknownProvider(_) => ApiError::ResourceNotFound(e.to_string()),
            WebhookError::InvalidSignature(m) => ApiError::InvalidSignature(m),
            WebhookError::BadRequest(m) => ApiError::BadRequest(m),
            WebhookError::Internal(cause) => ApiError::Internal(cause),
            WebhookError::Busy => ApiError::Busy(e.to_string()),
        })?;
    Ok(axum::Json(WebhookResponse {
        status: "ACCEPTED".into(),
        provider,
        event_id: accepted.receipt_id.to_string(),
    }))
}
