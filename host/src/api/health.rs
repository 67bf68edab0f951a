//! `GET /v1/health`.

use crate::AppState;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

/// The spec's HealthStatus.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
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
    /// Broker connectivity (no broker is wired yet: always false).
    pub nats_connected: bool,
}

/// Routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/health", get(health))
}

async fn health(State(state): State<AppState>) -> Json<HealthStatus> {
    Json(HealthStatus {
        status: "OK".into(),
        service: "switchboard".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        environment: state.config.environment.as_str().into(),
        uptime_seconds: state.started.elapsed().as_secs() as i64,
        nats_connected: false,
    })
}
