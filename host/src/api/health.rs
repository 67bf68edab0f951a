//! `GET /v1/health`.

use crate::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;

/// The spec's HealthStatus.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct HealthStatus {
    /// `OK` or `DRAINING`.
    pub status: String,
    /// Service identifier.
    pub service: String,
    /// Semantic version of the running binary.
    pub version: String,
    /// `development`, `staging` or `production`.
    pub environment: String,
    /// Seconds since boot finished.
    pub uptime_seconds: i64,
    /// Broker connectivity; while false, accepted events wait in the outbox. The
    /// embedded queue of `dev` is always connected.
    pub nats_connected: bool,
}

/// Routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/health", get(health))
}

/// Liveness and drain state; no authentication.
#[utoipa::path(get, operation_id = "getHealth", path = "/v1/health", tag = "health",
    responses(
        (status = 200, description = "Accepting work", body = HealthStatus),
        (status = 503, description = "Draining after a termination signal", body = HealthStatus),
    ))]
pub async fn health(State(state): State<AppState>) -> (StatusCode, Json<HealthStatus>) {
    let draining = state.draining.load(Ordering::SeqCst);
    let status = if draining {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (
        status,
        Json(HealthStatus {
            status: if draining { "DRAINING" } else { "OK" }.into(),
            service: "switchboard".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            environment: state.config.environment.as_str().into(),
            uptime_seconds: state.started.elapsed().as_secs() as i64,
            nats_connected: state.ingest.broker.connected(),
        }),
    )
}
