//! `GET /v1/health` (liveness, the spec's) and `GET /v1/health/ready` (readiness: every
//! backend answers).

use crate::AppState;
use crate::api::error::ApiError;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long readiness waits for one backend: a load balancer's probe must get an
/// answer before its own timeout, however a backend fails.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

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
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/health/ready", get(ready))
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

/// One backend that answered readiness.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct BackendCheck {
    /// `store`, `broker` or `counters`.
    pub backend: String,
    /// What serves it: `postgres` or `sqlite`; `nats` or `embedded`; `redis` or `memory`.
    pub kind: String,
    /// Round trip in milliseconds.
    pub latency_ms: u64,
}

/// Every backend answered.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ReadinessStatus {
    /// Always `READY` (a 503 carries an ErrorResponse instead).
    pub status: String,
    /// Store, broker and counters, in that order.
    pub checks: Vec<BackendCheck>,
}

/// What one backend's check found.
#[derive(Debug)]
struct Probe {
    backend: &'static str,
    kind: &'static str,
    latency: Duration,
    /// `None` when it answered; else why not (logged only: this route needs no key).
    failure: Option<String>,
}

/// Readiness for a load balancer or orchestrator: 200 when the store, the broker and the
/// rate-limit counters each answer a round trip within [`READY_TIMEOUT`], else 503
/// `NOT_READY` naming the ones that did not. No authentication.
#[utoipa::path(get, operation_id = "getReadiness", path = "/v1/health/ready", tag = "health",
    responses(
        (status = 200, description = "Every backend answered", body = ReadinessStatus),
        (status = 503, description = "A backend did not answer, or the process is draining \
            (`NOT_READY`; the message names which)", body = crate::api::error::ErrorBody),
    ))]
pub async fn ready(State(state): State<AppState>) -> Result<Json<ReadinessStatus>, ApiError> {
    let config = &state.config;
    let ingest = &state.ingest;
    let (store, broker, counters) = tokio::join!(
        probe("store", config.store.backend.as_str(), async {
            ingest.store.ping().await.map_err(|e| e.to_string())
        }),
        probe("broker", config.broker.backend.as_str(), async {
            ingest.broker.ping().await.map_err(|e| e.to_string())
        }),
        probe("counters", config.counters.backend.as_str(), async {
            ingest.counters.ping().await.map_err(|e| e.to_string())
        }),
    );
    verdict(
        state.draining.load(Ordering::SeqCst),
        [store, broker, counters],
    )
    .map(Json)
}

/// Runs one check under [`READY_TIMEOUT`].
async fn probe(
    backend: &'static str,
    kind: &'static str,
    check: impl Future<Output = Result<(), String>>,
) -> Probe {
    let started = Instant::now();
    let failure = match tokio::time::timeout(READY_TIMEOUT, check).await {
        Ok(Ok(())) => None,
        Ok(Err(cause)) => Some(cause),
        Err(_) => Some(format!("no answer within {READY_TIMEOUT:?}")),
    };
    Probe {
        backend,
        kind,
        latency: started.elapsed(),
        failure,
    }
}

/// Ready when not draining and every probe answered; otherwise the 503 names each
/// backend that failed (its cause goes to the log, not to an unauthenticated caller).
fn verdict(draining: bool, probes: [Probe; 3]) -> Result<ReadinessStatus, ApiError> {
    let failed: Vec<String> = probes
        .iter()
        .filter_map(|p| {
            let cause = p.failure.as_ref()?;
            tracing::warn!(backend = p.backend, kind = p.kind, %cause, "readiness: backend down");
            Some(format!("{} ({})", p.backend, p.kind))
        })
        .collect();
    if !failed.is_empty() {
        return Err(ApiError::NotReady(format!(
            "not ready: {} did not answer",
            failed.join(", ")
        )));
    }
    if draining {
        return Err(ApiError::NotReady(
            "not ready: draining after a termination signal".into(),
        ));
    }
    Ok(ReadinessStatus {
        status: "READY".into(),
        checks: probes
            .into_iter()
            .map(|p| BackendCheck {
                backend: p.backend.into(),
                kind: p.kind.into(),
                latency_ms: p.latency.as_millis() as u64,
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(backend: &'static str, kind: &'static str, failure: Option<&str>) -> Probe {
        Probe {
            backend,
            kind,
            latency: Duration::from_millis(3),
            failure: failure.map(str::to_string),
        }
    }

    fn all_up() -> [Probe; 3] {
        [
            probe("store", "postgres", None),
            probe("broker", "nats", None),
            probe("counters", "redis", None),
        ]
    }

    #[test]
    fn ready_when_every_backend_answers() {
        let status = verdict(false, all_up()).unwrap();
        assert_eq!(status.status, "READY");
        let kinds: Vec<_> = status.checks.iter().map(|c| c.kind.as_str()).collect();
        assert_eq!(kinds, ["postgres", "nats", "redis"]);
        assert!(status.checks.iter().all(|c| c.latency_ms == 3));
    }

    #[test]
    fn names_every_backend_down_without_its_cause() {
        let mut probes = all_up();
        probes[0].failure = Some("postgres://user:secret@db refused".into());
        probes[2].failure = Some("no answer within 2s".into());
        let message = verdict(false, probes).unwrap_err().to_string();
        assert_eq!(
            message,
            "not ready: store (postgres), counters (redis) did not answer"
        );
        assert!(!message.contains("secret"));
    }

    #[test]
    fn draining_is_not_ready() {
        let message = verdict(true, all_up()).unwrap_err().to_string();
        assert!(message.contains("draining"), "{message}");
    }
}
