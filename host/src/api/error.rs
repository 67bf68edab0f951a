//! The one API error type: every non-2xx body is `{error, message, status_code}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error answer. Internal causes are logged, never sent to the client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400 `BAD_REQUEST`.
    #[error("{0}")]
    BadRequest(String),
    /// 401 `UNAUTHORIZED`.
    #[error("{0}")]
    Unauthorized(String),
    /// 413 `PAYLOAD_TOO_LARGE`.
    #[error("request body larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// 413 `PAYLOAD_TOO_LARGE`: one event larger than a queued event may be.
    #[error("{0}")]
    EventTooLarge(String),
    /// 415 `UNSUPPORTED_MEDIA_TYPE`.
    #[error("request body must be JSON: send `Content-Type: application/json`")]
    UnsupportedMediaType,
    /// 401 `INVALID_SIGNATURE`: a webhook signature was missing, malformed, wrong or
    /// stale.
    #[error("{0}")]
    InvalidSignature(String),
    /// 403 `FORBIDDEN`: the key lacks the scope the route needs.
    #[error("{0}")]
    Forbidden(String),
    /// 422 `PLUGIN_REJECTED`: an uploaded plugin failed the conformance kit or asked
    /// for hosts without approval; the message is the report.
    #[error("{0}")]
    PluginRejected(String),
    /// 429 `RATE_LIMIT_EXCEEDED`, with `Retry-After`: when the window that refused the
    /// request ends, in whole seconds (at least 1).
    #[error("{0}")]
    RateLimited(String, std::time::Duration),
    /// 404 `NOT_FOUND`: no such route.
    #[error("no such route")]
    NotFound,
    /// 404 `NOT_FOUND`: the route exists, the resource does not (or belongs to another
    /// workspace: the answer does not tell which).
    #[error("{0}")]
    ResourceNotFound(String),
    /// 406 `NOT_ACCEPTABLE`: the `Accept` header names no media type the route answers
    /// with.
    #[error("{0}")]
    NotAcceptable(String),
    /// 405 `METHOD_NOT_ALLOWED`.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// 409 `CONFLICT`: the resource changed under the request (a concurrent change got
    /// there first); nothing was changed: read it again and retry.
    #[error("{0}")]
    Conflict(String),
    /// 500 `INTERNAL_SERVER_ERROR`; the cause is logged only.
    #[error("internal server error")]
    Internal(#[source] anyhow::Error),
    /// 503 `SERVICE_UNAVAILABLE`: the database is unreachable; the cause is logged only.
    #[error("database unavailable: retry with backoff")]
    Unavailable(#[source] anyhow::Error),
    /// 503 `SERVICE_UNAVAILABLE`: the process is handling all it can of this kind of
    /// request; the message says so. Nothing was done: retry later.
    #[error("{0}")]
    Busy(String),
    /// 503 `NOT_READY`: readiness failed; the message names the backends that did not
    /// answer (their causes are logged only), or says the process is draining.
    #[error("{0}")]
    NotReady(String),
}

/// The spec's ErrorResponse.
#[derive(Debug, Serialize, serde::Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[schema(example = json!({"error": "BAD_REQUEST", "message": "invalid JSON body: at `to`: unknown field `Email`", "status_code": 400}))]
pub struct ErrorBody {
    /// Stable machine code: branch on this.
    #[schema(value_type = ErrorCode)]
    pub error: String,
    /// Prose; may change.
    pub message: String,
    /// Repeats the HTTP status.
    #[schema(minimum = 400, maximum = 599)]
    pub status_code: u16,
}

/// Every `error` code an answer can carry (`IDEMPOTENCY_CONFLICT` is defined by the
/// contract and never produced: payloads of a reused key are not compared).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// 400.
    BadRequest,
    /// 401: missing, malformed, unrecognised or revoked key.
    Unauthorized,
    /// 401: a webhook signature did not verify.
    InvalidSignature,
    /// 403: the key lacks a scope.
    Forbidden,
    /// 404.
    NotFound,
    /// 405.
    MethodNotAllowed,
    /// 406: an MCP client that accepts neither JSON nor SSE.
    NotAcceptable,
    /// 409 (never produced).
    IdempotencyConflict,
    /// 409: the resource changed under the request; nothing was changed.
    Conflict,
    /// 413.
    PayloadTooLarge,
    /// 415.
    UnsupportedMediaType,
    /// 422: a plugin failed the conformance kit.
    PluginRejected,
    /// 429.
    RateLimitExceeded,
    /// 500: retry with the same idempotency key.
    InternalServerError,
    /// 503.
    ServiceUnavailable,
    /// 503: `GET /v1/health/ready` found a backend down, or the process draining.
    NotReady,
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "BAD_REQUEST"),
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "UNAUTHORIZED"),
            ApiError::InvalidSignature(_) => (StatusCode::UNAUTHORIZED, "INVALID_SIGNATURE"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "FORBIDDEN"),
            ApiError::PluginRejected(_) => (StatusCode::UNPROCESSABLE_ENTITY, "PLUGIN_REJECTED"),
            ApiError::PayloadTooLarge(_) | ApiError::EventTooLarge(_) => {
                (StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE")
            }
            ApiError::UnsupportedMediaType => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "UNSUPPORTED_MEDIA_TYPE")
            }
            ApiError::RateLimited(..) => (StatusCode::TOO_MANY_REQUESTS, "RATE_LIMIT_EXCEEDED"),
            ApiError::NotFound | ApiError::ResourceNotFound(_) => {
                (StatusCode::NOT_FOUND, "NOT_FOUND")
            }
            ApiError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "CONFLICT"),
            ApiError::NotAcceptable(_) => (StatusCode::NOT_ACCEPTABLE, "NOT_ACCEPTABLE"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL_SERVER_ERROR"),
            ApiError::Unavailable(_) | ApiError::Busy(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "SERVICE_UNAVAILABLE")
            }
            ApiError::NotReady(_) => (StatusCode::SERVICE_UNAVAILABLE, "NOT_READY"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.parts();
        match &self {
            ApiError::Internal(cause) => tracing::error!(error = ?cause, "internal error"),
            ApiError::Unavailable(cause) => tracing::error!(error = ?cause, "database unavailable"),
            _ => {}
        }
        let body = ErrorBody {
            error: code.into(),
            message: self.to_string(),
            status_code: status.as_u16(),
        };
        let mut response = (status, Json(body)).into_response();
        if let ApiError::RateLimited(_, after) = &self {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(retry_after_secs(*after)),
            );
        }
        response
    }
}

/// `Retry-After` for a wait of `after`: whole seconds, rounded up (a client that waits
/// that long is not refused again), at least one.
pub fn retry_after_secs(after: std::time::Duration) -> u64 {
    (after.as_secs() + u64::from(after.subsec_nanos() > 0)).max(1)
}

impl ApiError {
    /// A store failure on a read endpoint (`GET /v1/events/{eventId}`,
    /// `GET /v1/messages`): the database being unreachable is 503, anything else 500.
    pub fn from_store_read(e: crate::store::StoreError) -> Self {
        match e {
            crate::store::StoreError::Unavailable(_) => ApiError::Unavailable(e.into()),
            other => ApiError::Internal(other.into()),
        }
    }

    /// A store failure on a write endpoint (preferences, erasure): always 500, as the
    /// spec lists no 503 there.
    pub fn from_store_write(e: crate::store::StoreError) -> Self {
        ApiError::Internal(e.into())
    }

    /// A store failure on a change that checks what it changes (an endpoint's patch or
    /// rotation, a plugin rollback): losing to a concurrent change is 409, anything
    /// else as [`ApiError::from_store_write`].
    pub fn from_store_change(e: crate::store::StoreError) -> Self {
        match e {
            crate::store::StoreError::Conflict(m) => ApiError::Conflict(m),
            other => ApiError::from_store_write(other),
        }
    }
}

impl From<crate::ingest::IngestError> for ApiError {
    fn from(e: crate::ingest::IngestError) -> Self {
        use crate::ingest::IngestError;
        match e {
            IngestError::Invalid(m) => ApiError::BadRequest(m),
            IngestError::TooLarge(m) => ApiError::EventTooLarge(m),
            // The quotas count per second.
            IngestError::RateLimited(m) => {
                ApiError::RateLimited(m.into(), std::time::Duration::from_secs(1))
            }
            IngestError::Revoked => ApiError::Unauthorized("API key revoked".into()),
            IngestError::Internal(m) => ApiError::Internal(anyhow::anyhow!(m)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    async fn body(e: ApiError) -> (u16, ErrorBody) {
        let response = e.into_response();
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[test]
    fn every_code_produced_is_documented() {
        let schema = serde_json::to_value(<ErrorCode as utoipa::PartialSchema>::schema()).unwrap();
        let codes: Vec<&str> = schema["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let produced = [
            ApiError::BadRequest(String::new()),
            ApiError::Unauthorized(String::new()),
            ApiError::PayloadTooLarge(1),
            ApiError::EventTooLarge(String::new()),
            ApiError::UnsupportedMediaType,
            ApiError::InvalidSignature(String::new()),
            ApiError::Forbidden(String::new()),
            ApiError::PluginRejected(String::new()),
            ApiError::RateLimited(String::new(), std::time::Duration::ZERO),
            ApiError::NotFound,
            ApiError::ResourceNotFound(String::new()),
            ApiError::Conflict(String::new()),
            ApiError::MethodNotAllowed,
            ApiError::NotAcceptable(String::new()),
            ApiError::Internal(anyhow::anyhow!("x")),
            ApiError::Unavailable(anyhow::anyhow!("x")),
            ApiError::NotReady(String::new()),
        ];
        for e in produced {
            assert!(
                codes.contains(&e.parts().1),
                "{} is not documented",
                e.parts().1
            );
        }
    }

    #[tokio::test]
    async fn store_errors_map_to_503_or_500_without_leaking_the_cause() {
        let (s, b) = body(ApiError::from_store_read(StoreError::Unavailable(
            "postgres://secret@db".into(),
        )))
        .await;
        assert_eq!(
            (s, b.error.as_str(), b.status_code),
            (503, "SERVICE_UNAVAILABLE", 503)
        );
        assert!(!b.message.contains("secret"));
        let (s, b) = body(ApiError::from_store_read(StoreError::Other("boom".into()))).await;
        assert_eq!((s, b.error.as_str()), (500, "INTERNAL_SERVER_ERROR"));
        assert!(!b.message.contains("boom"));
        let (s, _) = body(ApiError::from_store_write(StoreError::Unavailable(
            "x".into(),
        )))
        .await;
        assert_eq!(s, 500, "writes report an unavailable store as 500");
        let (s, b) = body(ApiError::ResourceNotFound("no such event".into())).await;
        assert_eq!(
            (s, b.error.as_str(), b.message.as_str()),
            (404, "NOT_FOUND", "no such event")
        );
    }
}
