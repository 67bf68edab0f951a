//! The HTTP API: one router per resource, one error type.

pub mod error;
pub mod health;

use crate::AppState;
use axum::Router;
pub use error::ApiError;

/// The whole API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(health::router())
        .fallback(|| async { ApiError::NotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
}
