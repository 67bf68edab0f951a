//! The HTTP API: one router per resource, one error type.

pub mod admin;
pub mod error;
pub mod events;
pub mod extract;
pub mod health;
pub mod mcp;
pub mod messages;
pub mod openapi;
pub mod subscribers;
pub mod webhooks;

use crate::AppState;
use crate::metrics::{RequestLabels, RouteLabels};
use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
pub use error::ApiError;

/// The whole API (with `/metrics` unless it has its own listener).
pub fn router(state: AppState) -> Router {
    let limit = state.config.max_body_bytes;
    let own_metrics = state.config.metrics_listen.is_none();
    let mut router = Router::new();
    if own_metrics {
        router = router.route("/metrics", get(render_metrics));
    }
    router
        .merge(health::router())
        .merge(events::router())
        .merge(messages::router())
        .merge(subscribers::router())
        .merge(webhooks::router())
        .merge(admin::router())
        .merge(mcp::router())
        .merge(openapi::router())
        .fallback(|| async { ApiError::NotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(state.clone(), record))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

/// `/metrics` alone, for `metrics_listen`.
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(render_metrics))
        .with_state(state)
}

async fn render_metrics(
    State(state): State<AppState>,
) -> ([(&'static str, &'static str); 1], String) {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.ingest.metrics.render(),
    )
}

/// Counts and times every request by its route pattern.
async fn record(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "(unmatched)".into());
    let method = request.method().to_string();
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    let metrics = &state.ingest.metrics;
    metrics
        .latency
        .get_or_create(&RouteLabels {
            route: route.clone(),
        })
        .observe(started.elapsed().as_secs_f64());
    metrics
        .requests
        .get_or_create(&RequestLabels {
            route,
            method,
            status: response.status().as_u16(),
        })
        .inc();
    response
}
