//! `POST /v1/mcp`: an operator tool endpoint for AI agents, JSON-RPC 2.0 style.
//!
//! - `tools/list` → `result.tools`: name, description and input schema of each tool.
//! - `tools/call` with `params: {name, arguments}` → `result.content` (one text item
//!   holding the JSON) and `result.structuredContent`:
//!   - `gateway_status` (no arguments): `{status, version, uptime_seconds, nats_connected, outbox_depth}`;
//!   - `idempotency_inspect` (no arguments): `{tracked_keys}` of the caller's workspace;
//!   - an unknown tool answers `result.isError = true` with a text explaining it.
//! - An unknown method answers 200 with `result.error = {code: -32601, message}`.
//!
//! `id` echoes the request's `id` when it sent a non-negative integer; otherwise the
//! gateway assigns one.

use super::ApiError;
use super::extract::{Caller, Json};
use crate::AppState;
use axum::Router;
use axum::extract::State;
use axum::routing::post;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The spec's McpRequest.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct McpRequest {
    /// `tools/list` or `tools/call`.
    pub method: String,
    /// Method parameters.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub params: Option<Value>,
    /// Optional correlation id to echo (a non-negative integer).
    #[serde(default)]
    #[schema(value_type = Option<u64>)]
    pub id: Option<Value>,
}

/// The spec's McpResponse.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct McpResponse {
    /// Always `2.0`.
    pub jsonrpc: String,
    /// Method result.
    #[schema(value_type = Object)]
    pub result: Value,
    /// Correlation id.
    pub id: u64,
}

/// Routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/mcp", post(mcp))
}

/// Operator tools for AI agents (see the module docs for each tool).
#[utoipa::path(post, path = "/v1/mcp", tag = "mcp", request_body = McpRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Result, or an error object inside `result`", body = McpResponse),
        (status = 401, description = "Missing or unrecognised key", body = crate::api::error::ErrorBody),
    ))]
pub async fn mcp(
    State(state): State<AppState>,
    caller: Caller,
    Json(request): Json<McpRequest>,
) -> Result<axum::Json<McpResponse>, ApiError> {
    let id = request
        .id
        .as_ref()
        .and_then(Value::as_u64)
        .unwrap_or_else(|| NEXT_ID.fetch_add(1, Ordering::Relaxed));
    let result = match request.method.as_str() {
        "tools/list" => json!({"tools": [
            {"name": "gateway_status", "description": "Uptime, version, broker connectivity and outbox depth of this gateway.",
             "inputSchema": {"type": "object", "properties": {}, "additionalProperties": false}},
            {"name": "idempotency_inspect", "description": "Number of idempotency keys tracked (pending or completed).",
             "inputSchema": {"type": "object", "properties": {}, "additionalProperties": false}},
        ]}),
        "tools/call" => {
            let name = request
                .params
                .as_ref()
                .and_then(|p| p.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("");
            match call(&state, &caller, name).await {
                Ok(structured) => {
                    json!({"content": [{"type": "text", "text": structured.to_string()}], "structuredContent": structured, "isError": false})
                }
                Err(message) => {
                    json!({"content": [{"type": "text", "text": message}], "isError": true})
                }
            }
        }
        other => {
            json!({"error": {"code": -32601, "message": format!("method not found: {other:?}; use tools/list or tools/call")}})
        }
    };
    Ok(axum::Json(McpResponse {
        jsonrpc: "2.0".into(),
        result,
        id,
    }))
}

async fn call(state: &AppState, caller: &Caller, tool: &str) -> Result<Value, String> {
    match tool {
        "gateway_status" => {
            let outbox = state
                .ingest
                .store
                .outbox_depth()
                .await
                .map_err(|e| e.to_string())?;
            Ok(json!({
                "status": if state.draining.load(Ordering::SeqCst) { "DRAINING" } else { "OK" },
                "version": env!("CARGO_PKG_VERSION"),
                "uptime_seconds": state.started.elapsed().as_secs(),
                "nats_connected": state.ingest.broker.connected(),
                "outbox_depth": outbox,
            }))
        }
        "idempotency_inspect" => {
            let tracked = state
                .ingest
                .idempotency
                .tracked(caller.key.workspace.as_str())
                .await
                .map_err(|e| e.to_string())?;
            Ok(json!({"tracked_keys": tracked}))
        }
        "" => Err("tools/call needs params.name".into()),
        other => Err(format!("unknown tool {other:?}; see tools/list")),
    }
}
