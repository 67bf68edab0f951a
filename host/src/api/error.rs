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
    /// 415 `UNSUPPORTED_MEDIA_TYPE`.
    #[error("request body must be JSON: send `Content-Type: application/json`")]
    UnsupportedMediaType,
    /// 429 `RATE_LIMIT_EXCEEDED`.
    #[error("{0}")]
    RateLimited(String),
    /// 404 `NOT_FOUND`.
    #[error("no such route")]
    NotFound,
    /// 405 `METHOD_NOT_ALLOWED`.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// 500 `INTERNAL_SERVER_ERROR`; the cause is logged only.
    #[error("internal server error")]
    Internal(#[source] anyhow::Error),
}

/// The spec's ErrorResponse.
#[derive(Debug, Serialize, serde::Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ErrorBody {
    /// Stable machine code.
    pub error: String,
    /// Prose; may change.
    pub message: String,
    /// Repeats the HTTP status.
    pub status_code: u16,
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "BAD_REQUEST"),
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "UNAUTHORIZED"),
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE"),
            ApiError::UnsupportedMediaType => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "UNSUPPORTED_MEDIA_TYPE")
            }
            ApiError::RateLimited(_) => (StatusCode::TOO_MANY_REQUESTS, "RATE_LIMIT_EXCEEDED"),
            ApiError::NotFound => (StatusCode::NOT_FOUND, "NOT_FOUND"),
            ApiError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL_SERVER_ERROR"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.parts();
        if let ApiError::Internal(cause) = &self {
            tracing::error!(error = ?cause, "internal error");
        }
        let body = ErrorBody {
            error: code.into(),
            message: self.to_string(),
            status_code: status.as_u16(),
        };
        (status, Json(body)).into_response()
    }
}

impl From<crate::ingest::IngestError> for ApiError {
    fn from(e: crate::ingest::IngestError) -> Self {
        use crate::ingest::IngestError;
        match e {
            IngestError::Invalid(m) => ApiError::BadRequest(m),
            IngestError::RateLimited(m) => ApiError::RateLimited(m.into()),
            IngestError::Revoked => ApiError::Unauthorized("API key revoked".into()),
            IngestError::Internal(m) => ApiError::Internal(anyhow::anyhow!(m)),
        }
    }
}
