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
#[derive(Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
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
