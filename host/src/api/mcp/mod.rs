//! `POST /v1/mcp`: an MCP server for AI agents that operate this gateway.
//!
//! Every request first authenticates its bearer API key, as every route does (401 in
//! the ErrorResponse shape otherwise). The JSON body then picks one of two fronts:
//!
//! - **MCP** (the body has a `jsonrpc` member): the Streamable HTTP transport of the
//!   official Rust SDK (`rmcp`), stateless (no `Mcp-Session-Id`; every POST stands
//!   alone) and answering JSON, not SSE. It speaks `initialize` (capabilities: tools;
//!   `serverInfo` = `switchboard` and its version), `notifications/initialized` (202),
//!   `ping`, `tools/list` (name, description, JSON Schema `inputSchema` and read-only
//!   hints of each tool the key may call) and `tools/call` (`content` with the result
//!   as JSON text, and `structuredContent`), and the `server/discover` lifecycle of
//!   the 2026-07-28 revision. A tool that fails, or that the key may
//!   not call, answers `isError: true`; an unknown tool or bad arguments are JSON-RPC
//!   errors (-32602, invalid params). A request without an `Accept` header (or with
//!   `*/*`) is served as if it accepted JSON and SSE; HTTP refusals of the transport
//!   (406, 415, ...) keep the ErrorResponse shape. JSON-RPC errors stay JSON-RPC in a
//!   200 (an unknown method included, which the transport would answer 404), except
//!   those the transport answers 400 (an unsupported protocol version, a header that
//!   contradicts the body): those are 400 ErrorResponses with the JSON-RPC message.
//! - **Legacy** (`{method, params, id}` without `jsonrpc`): answered
//!   `{jsonrpc: "2.0", result, id}`: `tools/list`, `tools/call` (`params: {name,
//!   arguments}`; any failure, an unknown tool included, is an `isError` result),
//!   `ping`; any other method gets 200 with `result.error = {code: -32601, message}`.
//!   `id` echoes a non-negative integer `id`, otherwise the gateway assigns one.
//!
//! Both fronts serve the one tool table of [`tools`]. Every tool is read-only and sees
//! only the caller's workspace: `gateway_status`, `idempotency_inspect`,
//! `get_message`, `list_messages`, `delivery_stats`, and for `admin` keys
//! `list_plugins`.

pub mod tools;

use super::ApiError;
use super::extract::{Caller, json_bytes};
use crate::AppState;
use crate::model::ApiKeyRecord;
use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::header::{ACCEPT, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tools::ToolError;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The spec's McpRequest: the legacy body (the MCP front takes any JSON-RPC 2.0
/// message).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct McpRequest {
    /// `initialize`, `ping`, `tools/list` or `tools/call` (with `jsonrpc: "2.0"`, the
    /// MCP front); `ping`, `tools/list` or `tools/call` without it.
    pub method: String,
    /// Method parameters; for `tools/call`: `{name, arguments}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub params: Option<Value>,
    /// Correlation id to echo (legacy: a non-negative integer).
    #[serde(default)]
    #[schema(value_type = Option<u64>)]
    pub id: Option<Value>,
}

/// The spec's McpResponse: the legacy answer (the MCP front answers JSON-RPC 2.0
/// responses).
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

/// Read-only operator tools for AI agents, over MCP (see the module docs).
#[utoipa::path(post, path = "/v1/mcp", tag = "mcp", request_body = McpRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A JSON-RPC response (with `jsonrpc`), or the legacy `{jsonrpc, result, id}` with any error inside `result`", body = McpResponse),
        (status = 202, description = "A JSON-RPC notification or response was accepted"),
        (status = 400, description = "Body not JSON, or refused by the transport", body = crate::api::error::ErrorBody),
        (status = 401, description = "Missing or unrecognised key", body = crate::api::error::ErrorBody),
        (status = 406, description = "An `Accept` header without both `application/json` and `text/event-stream` (no `Accept`, or `*/*`, is fine)", body = crate::api::error::ErrorBody),
        (status = 413, description = "Body too large", body = crate::api::error::ErrorBody),
        (status = 415, description = "Body not `application/json`", body = crate::api::error::ErrorBody),
    ))]
pub async fn mcp(State(state): State<AppState>, request: Request) -> Response {
    serve(state, request)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// The authenticated key, handed to the MCP server in the request's extensions.
#[derive(Clone)]
struct McpCaller(ApiKeyRecord);

async fn serve(state: AppState, request: Request) -> Result<Response, ApiError> {
    let (mut parts, body) = request.into_parts();
    let caller = Caller::from_request_parts(&mut parts, &state).await?;
    let bytes = json_bytes(Request::from_parts(parts.clone(), body), &state).await?;
    let message: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))?;
    if message.is_object() && message.get("jsonrpc").is_none() {
        let request = serde_json::from_value::<McpRequest>(message)
            .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))?;
        return Ok(axum::Json(legacy(&state, &caller.key, request).await).into_response());
    }
    parts.extensions.insert(McpCaller(caller.key));
    default_accept(&mut parts.headers);
    // Any JSON media type passed `json_bytes`; the transport knows only this one.
    parts
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let response = transport(&state)
        .handle(Request::from_parts(parts, Body::from(bytes)))
        .await
        .map(Body::new);
    error_shape(response, state.config.max_body_bytes).await
}

/// The rmcp transport: stateless, JSON answers. Building it is a few allocations, so
/// each request gets its own rather than the router holding one per state.
fn transport(state: &AppState) -> StreamableHttpService<Server, NeverSessionManager> {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_max_request_body_bytes(state.config.max_body_bytes)
        // Host checks guard unauthenticated local servers against DNS rebinding; this
        // one runs under public names and every request carries an API key.
        .disable_allowed_hosts();
    let server = Server {
        state: state.clone(),
    };
    StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    )
}

/// A client that states no preference (no `Accept`, or `*/*`) is served JSON; the
/// transport itself insists on both media types being named.
fn default_accept(headers: &mut HeaderMap) {
    let any = headers
        .get_all(ACCEPT)
        .iter()
        .all(|v| v.to_str().is_ok_and(|v| v.trim() == "*/*"));
    if any {
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
    }
}

/// JSON-RPC's code for a method the server does not have.
const METHOD_NOT_FOUND: i64 = -32601;

/// Puts the transport's HTTP refusals into the ErrorResponse shape. The transport also
/// answers some JSON-RPC errors with an HTTP error status: an unknown method with 404
/// (which an MCP client takes for a lost session), a protocol version or capability it
/// does not support with 400. An unknown method answers 200 with its JSON-RPC error
/// object, as the spec has it; the others become ErrorResponses carrying the JSON-RPC
/// error's message, as every non-2xx answer is.
async fn error_shape(response: Response, max_body: usize) -> Result<Response, ApiError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let is_json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let (mut parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 64 * 1024)
        .await
        .unwrap_or_default();
    let rpc = is_json
        .then(|| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        .flatten();
    let error = rpc.as_ref().map(|rpc| &rpc["error"]);
    if error.and_then(|e| e["code"].as_i64()) == Some(METHOD_NOT_FOUND) {
        parts.status = StatusCode::OK;
        return Ok(Response::from_parts(parts, Body::from(bytes)));
    }
    let text = match error.and_then(|e| e["message"].as_str()) {
        Some(message) => message.to_string(),
        None => String::from_utf8_lossy(&bytes).into_owned(),
    };
    Err(match status {
        StatusCode::BAD_REQUEST => ApiError::BadRequest(text),
        StatusCode::FORBIDDEN => ApiError::Forbidden(text),
        StatusCode::NOT_FOUND => ApiError::ResourceNotFound(text),
        StatusCode::METHOD_NOT_ALLOWED => ApiError::MethodNotAllowed,
        StatusCode::NOT_ACCEPTABLE => ApiError::NotAcceptable(text),
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(max_body),
        // The media type was checked before the transport saw the body: its 415 means
        // the body is JSON but not a JSON-RPC message it can read.
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::BadRequest(
            "not a JSON-RPC 2.0 request: `jsonrpc` \"2.0\", `method` a string, `id` an \
             integer or a string (none for a notification), `params` an object"
                .into(),
        ),
        _ => ApiError::Internal(anyhow::anyhow!("MCP transport answered {status}: {text}")),
    })
}

// ---------------------------------------------------------------------------------------
// MCP front
// ---------------------------------------------------------------------------------------

/// The MCP server behind the transport: one per request.
#[derive(Clone)]
struct Server {
    state: AppState,
}

/// The key [`serve`] authenticated, from the HTTP parts the transport hands over.
fn caller(context: &RequestContext<RoleServer>) -> Result<&ApiKeyRecord, ErrorData> {
    context
        .extensions
        .get::<Parts>()
        .and_then(|parts| parts.extensions.get::<McpCaller>())
        .map(|c| &c.0)
        .ok_or_else(|| ErrorData::internal_error("request without an authenticated key", None))
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "switchboard",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "Read-only operator tools for this Switchboard gateway; every tool sees only \
                 the workspace of the API key in use.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let key = caller(&context)?;
        Ok(ListToolsResult::with_all_items(
            tools::visible(key).map(tools::ToolSpec::tool).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let key = caller(&context)?;
        let spec = tools::find(&request.name).ok_or_else(|| {
            ErrorData::invalid_params(
                format!("unknown tool {:?}; see tools/list", request.name),
                None,
            )
        })?;
        let arguments = request.arguments.unwrap_or_default();
        match spec.call(&self.state, key, arguments).await {
            Ok(value) => Ok(CallToolResult::structured(value).into()),
            Err(ToolError::Failed(message)) => {
                Ok(CallToolResult::error(vec![ContentBlock::text(message)]).into())
            }
            Err(ToolError::InvalidArguments(message)) => {
                Err(ErrorData::invalid_params(message, None))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Legacy front
// ---------------------------------------------------------------------------------------

async fn legacy(state: &AppState, key: &ApiKeyRecord, request: McpRequest) -> McpResponse {
    let id = request
        .id
        .as_ref()
        .and_then(Value::as_u64)
        .unwrap_or_else(|| NEXT_ID.fetch_add(1, Ordering::Relaxed));
    let result = match request.method.as_str() {
        "tools/list" => {
            json!({"tools": tools::visible(key).map(tools::ToolSpec::tool).collect::<Vec<_>>()})
        }
        "tools/call" => match legacy_call(state, key, request.params).await {
            Ok(value) => json!({
                "content": [{"type": "text", "text": value.to_string()}],
                "structuredContent": value,
                "isError": false,
            }),
            Err(e) => json!({"content": [{"type": "text", "text": e.message()}], "isError": true}),
        },
        "ping" => json!({}),
        other => json!({"error": {
            "code": METHOD_NOT_FOUND,
            "message": format!("method not found: {other:?}; use tools/list or tools/call"),
        }}),
    };
    McpResponse {
        jsonrpc: "2.0".into(),
        result,
        id,
    }
}

async fn legacy_call(
    state: &AppState,
    key: &ApiKeyRecord,
    params: Option<Value>,
) -> Result<Value, ToolError> {
    let params = params.unwrap_or_default();
    let name = params.get("name").and_then(Value::as_str).unwrap_or("");
    if name.is_empty() {
        return Err(ToolError::InvalidArguments(
            "tools/call needs params.name".into(),
        ));
    }
    let spec = tools::find(name).ok_or_else(|| {
        ToolError::InvalidArguments(format!("unknown tool {name:?}; see tools/list"))
    })?;
    let arguments = match params.get("arguments") {
        None | Some(Value::Null) => JsonObject::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(_) => {
            return Err(ToolError::InvalidArguments(
                "params.arguments must be an object".into(),
            ));
        }
    };
    spec.call(state, key, arguments).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_is_filled_only_without_a_preference() {
        let mut none = HeaderMap::new();
        default_accept(&mut none);
        assert_eq!(none[ACCEPT], "application/json, text/event-stream");
        let mut any = HeaderMap::new();
        any.insert(ACCEPT, HeaderValue::from_static("*/*"));
        default_accept(&mut any);
        assert_eq!(any[ACCEPT], "application/json, text/event-stream");
        let mut html = HeaderMap::new();
        html.insert(ACCEPT, HeaderValue::from_static("text/html"));
        default_accept(&mut html);
        assert_eq!(html[ACCEPT], "text/html");
    }
}
