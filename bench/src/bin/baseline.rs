//! The "bare handler" baseline: an axum server whose `POST /v1/events/trigger` parses
//! the same JSON body as the gateway and answers 202 with a response of the same
//! shape, doing nothing else (no auth lookup, rate limit, database, broker).
//! Its throughput is the ceiling the gateway's ingestion is compared with.

use axum::Router;
use axum::extract::Json;
use axum::http::{HeaderMap, StatusCode, header::AUTHORIZATION};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Parser;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

#[derive(Parser, Debug)]
#[command(name = "baseline", about = "Bare axum trigger handler, for comparison")]
struct Args {
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
}

/// The gateway's TriggerRequest (same field names; unknown fields ignored the same way).
#[allow(dead_code)] // parsed for the cost of parsing, not read
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TriggerRequest {
    name: String,
    to: Recipient,
    #[serde(default)]
    category: Option<String>,
    #[serde(default)]
    payload: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    overrides: Option<serde_json::Value>,
}

#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Recipient {
    subscriber_id: String,
    #[serde(default)]
    email: Option<String>,
    #[serde(default)]
    phone: Option<String>,
    #[serde(default)]
    device_tokens: Option<Vec<String>>,
}

/// Same shape as the gateway's TriggerResponse.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TriggerResponse {
    event_id: String,
    status: &'static str,
    priority: &'static str,
    channel: &'static str,
    timestamp: String,
}

async fn trigger(headers: HeaderMap, Json(request): Json<TriggerRequest>) -> Response {
    let bearer = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("Bearer ") && v.len() > 7);
    if !bearer {
        return (StatusCode::UNAUTHORIZED, "missing bearer key").into_response();
    }
    if request.name.is_empty() || request.to.subscriber_id.trim().is_empty() {
        return (
            StatusCode::BAD_REQUEST,
            "name and to.subscriberId are required",
        )
            .into_response();
    }
    let channel = if request.to.email.is_some() {
        "email"
    } else {
        "sms"
    };
    let response = TriggerResponse {
        event_id: format!("evt_{}", uuid::Uuid::new_v4().simple()),
        status: "QUEUED",
        priority: "NORMAL",
        channel,
        timestamp: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    };
    (StatusCode::ACCEPTED, axum::Json(response)).into_response()
}

async fn health() -> &'static str {
    "ok"
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let app = Router::new()
        .route("/v1/events/trigger", post(trigger))
        .route("/v1/health", get(health));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
    println!("baseline listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    Ok(())
}
