//! The HTTP API: one router per resource, one error type.

pub mod admin;
pub mod endpoint_deliveries;
pub mod endpoints;
pub mod error;
pub mod events;
pub mod extract;
pub mod health;
mod log_cursor;
pub mod mcp;
pub mod messages;
pub mod openapi;
pub mod subscribers;
pub mod webhooks;

use crate::AppState;
use crate::metrics::{RequestLabels, RouteLabels};
use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::HeaderValue;
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
        .merge(webhooks::router(state.config.webhooks.max_body_bytes))
        .merge(admin::router())
        .merge(endpoints::router())
        .merge(endpoint_deliveries::router())
        .merge(mcp::router())
        .merge(openapi::router())
        .merge(crate::console::router())
        .fallback(|| async { ApiError::NotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(state.clone(), record))
        .layer(
            tower_http::trace::TraceLayer::new_for_http().make_span_with(|r: &Request| {
                let id = r.headers().get(REQUEST_ID).and_then(|v| v.to_str().ok());
                // The route, not the path: a path names subscribers (whose ids must
                // leave no trace once they are erased) and carries query strings.
                let route = r
                    .extensions()
                    .get::<axum::extract::MatchedPath>()
                    .map_or("(no route)", |p| p.as_str());
                tracing::info_span!("request", method = %r.method(), route,
                    request_id = id.unwrap_or_default())
            }),
        )
        .layer(middleware::from_fn(request_id))
        .with_state(state)
}

/// The header that names a request in logs and answers.
pub const REQUEST_ID: &str = "x-request-id";

/// A caller's own request id, if it is one we can log safely: 1 to 128 characters of
/// letters, digits and `-_.:/+=@`.
fn sane_request_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/+=@".contains(&b))
}

/// Every answer carries `X-Request-Id`: the caller's own when it sent a sane one, else
/// a new one; the request's log span carries the same id.
async fn request_id(mut request: Request, next: Next) -> Response {
    let id = match request.headers().get(REQUEST_ID).map(|v| v.to_str()) {
        Some(Ok(id)) if sane_request_id(id) => id.to_string(),
        _ => uuid::Uuid::new_v4().to_string(),
    };
    let value = HeaderValue::from_str(&id).expect("a sane id is a valid header value");
    request.headers_mut().insert(REQUEST_ID, value.clone());
    let mut response = next.run(request).await;
    response.headers_mut().insert(REQUEST_ID, value);
    response
}

/// `/metrics` alone, for `metrics_listen`.
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(render_metrics))
        .layer(middleware::from_fn(request_id))
        .with_state(state)
}

/// Each stream's depth, as the broker reports it within the readiness timeout (the
/// metrics scrape and the console's overview).
pub async fn stream_depths(state: &AppState) -> Result<Vec<(String, u64)>, String> {
    match tokio::time::timeout(health::READY_TIMEOUT, state.ingest.broker.depths()).await {
        Ok(Ok(depths)) => Ok(depths),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the broker did not report stream depths in time".into()),
    }
}

async fn render_metrics(
    State(state): State<AppState>,
) -> ([(&'static str, &'static str); 1], String) {
    let metrics = &state.ingest.metrics;
    // Read at the scrape: a broker that does not answer leaves the last depths.
    match stream_depths(&state).await {
        Ok(depths) => {
            for (stream, n) in depths {
                metrics
                    .queue_depth
                    .get_or_create(&crate::metrics::StreamLabels { stream })
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        Err(e) => tracing::warn!(error = %e, "metrics: stream depths unavailable"),
    }
    // Circuits as last read by this process; closed ones drop out.
    metrics.circuit_state.clear();
    let now = crate::circuits::now_ms();
    for ((provider, channel), opened) in state.circuits.snapshot().iter() {
        let labels = crate::metrics::CircuitLabels {
            provider: provider.clone(),
            channel: channel.clone(),
        };
        let value = if opened.half_open(now) { 2 } else { 1 };
        metrics.circuit_state.get_or_create(&labels).set(value);
    }
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.render(),
    )
}

/// The method as a metric label: the standard ones by name, any other as `OTHER` (a
/// client may send any token as a method, and each would be a new series kept for good).
fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "OTHER",
    }
}

/// Counts and times every request by its route pattern.
async fn record(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "(unmatched)".into());
    let method = method_label(request.method()).to_string();
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

#[cfg(test)]
mod tests {
    #[test]
    fn methods_outside_the_standard_ones_share_one_label() {
        use axum::http::Method;
        assert_eq!(super::method_label(&Method::PATCH), "PATCH");
        for odd in ["X0", "get", "PROPFIND"] {
            let method = Method::from_bytes(odd.as_bytes()).unwrap();
            assert_eq!(super::method_label(&method), "OTHER", "{odd}");
        }
    }

    #[test]
    fn request_ids_are_echoed_only_when_safe_to_log() {
        use super::sane_request_id as ok;
        assert!(ok("req-123") && ok("3f1c9a7e-5e0b-4d8e-9a57-0c1c2f6f7b10") && ok("a/b:c=d@e"));
        assert!(!ok("") && !ok("has space") && !ok("line\nbreak") && !ok("quote\""));
        assert!(ok(&"x".repeat(128)) && !ok(&"x".repeat(129)));
    }
}
