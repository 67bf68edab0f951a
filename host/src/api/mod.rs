//! The HTTP API: one router per resource, one error type.

pub mod error;
pub mod events;
pub mod extract;
pub mod health;
pub mod mcp;

use crate::AppState;
use axum::Router;
use axum::extract::DefaultBodyLimit;
pub use error::ApiError;

/// The whole API.
pub fn router(state: AppState) -> Router {
    let limit = state.config.max_body_bytes;
    Router::new()
        .merge(health::router())
        .merge(events::router())
        .merge(mcp::router())
        .fallback(|| async { ApiError::NotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(limit))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}
