//! The MCP tools: one table that both fronts of `/v1/mcp` (the MCP server and the
//! legacy `{method, params}` body) list and call. Every tool is read-only and sees
//! the caller's workspace only; `list_plugins` is for `admin` keys.

use crate::AppState;
use crate::api::ApiError;
use crate::api::admin::{is_admin, plugin_listing};
use crate::api::messages::{self, ListParams, format_time};
use crate::config::BrokerBackend;
use crate::model::ApiKeyRecord;
use futures::future::BoxFuture;
use rmcp::handler::server::common::schema_for_type;
use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Default window of `delivery_stats`, in minutes.
pub const DEFAULT_WINDOW_MINUTES: u32 = 60;
/// Longest window of `delivery_stats`: 7 days.
pub const MAX_WINDOW_MINUTES: u32 = 7 * 24 * 60;

/// Why a call produced no result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolError {
    /// The arguments do not fit the tool: a JSON-RPC "invalid params" error.
    InvalidArguments(String),
    /// The tool ran and failed (or the key may not call it): an `isError` result the
    /// agent reads.
    Failed(String),
}

impl ToolError {
    /// The explanation.
    pub fn message(&self) -> &str {
        match self {
            Self::InvalidArguments(m) | Self::Failed(m) => m,
        }
    }
}

type Run = for<'a> fn(
    &'a AppState,
    &'a ApiKeyRecord,
    JsonObject,
) -> BoxFuture<'a, Result<Value, ToolError>>;

/// One tool: what `tools/list` shows and what `tools/call` runs.
pub struct ToolSpec {
    /// Name.
    pub name: &'static str,
    description: &'static str,
    admin_only: bool,
    input_schema: fn() -> Arc<JsonObject>,
    run: Run,
}

/// Every tool, in the order `tools/list` shows them.
static TOOLS: [ToolSpec; 6] = [
    ToolSpec {
        name: "gateway_status",
        description: "Status of this gateway process: OK or DRAINING, version, uptime in \
                      seconds, which broker it uses and whether it is connected.",
        admin_only: false,
        input_schema: schema_for_type::<NoArguments>,
        run: gateway_status,
    },
    ToolSpec {
        name: "idempotency_inspect",
        description: "Number of idempotency keys your workspace has tracked (pending or \
                      completed, kept 24 hours after completion).",
        admin_only: false,
        input_schema: schema_for_type::<NoArguments>,
        run: idempotency_inspect,
    },
    ToolSpec {
        name: "get_message",
        description: "One message of your workspace by event id (evt_<hex> or a UUID), with \
                      its delivery timeline, oldest step first.",
        admin_only: false,
        input_schema: schema_for_type::<GetMessageArguments>,
        run: get_message,
    },
    ToolSpec {
        name: "list_messages",
        description: "Messages of your workspace, newest first, with the filters of \
                      GET /v1/messages; pass next_cursor back as cursor (with the same \
                      filters) for the next page.",
        admin_only: false,
        input_schema: schema_for_type::<ListParams>,
        run: list_messages,
    },
    ToolSpec {
        name: "delivery_stats",
        description: "Messages of your workspace created in the last window_minutes (default \
                      60, at most 10080 = 7 days), counted by status, channel and provider.",
        admin_only: false,
        input_schema: schema_for_type::<DeliveryStatsArguments>,
        run: delivery_stats,
    },
    ToolSpec {
        name: "list_plugins",
        description: "Provider plugins: what serves each slug in this process, and every \
                      installed version (as GET /v1/admin/plugins). Admin keys only.",
        admin_only: true,
        input_schema: schema_for_type::<NoArguments>,
        run: list_plugins,
    },
];

/// The tools `key` may call, in table order.
pub fn visible(key: &ApiKeyRecord) -> impl Iterator<Item = &'static ToolSpec> + '_ {
    TOOLS.iter().filter(|t| !t.admin_only || is_admin(key))
}

/// The tool named `name`, whether or not the caller may call it.
pub fn find(name: &str) -> Option<&'static ToolSpec> {
    TOOLS.iter().find(|t| t.name == name)
}

impl ToolSpec {
    /// The MCP description: name, description, input schema, read-only hints.
    pub fn tool(&self) -> Tool {
        Tool::new(self.name, self.description, (self.input_schema)()).with_annotations(
            ToolAnnotations::new()
                .read_only(true)
                .destructive(false)
                .idempotent(true)
                .open_world(false),
        )
    }

    /// Runs the tool for `key`; a tool the key may not call is a failure.
    pub async fn call(
        &self,
        state: &AppState,
        key: &ApiKeyRecord,
        arguments: JsonObject,
    ) -> Result<Value, ToolError> {
        if self.admin_only && !is_admin(key) {
            return Err(ToolError::Failed(format!(
                "{} needs a key with the `admin` scope (switchboard keys create --scope admin)",
                self.name
            )));
        }
        (self.run)(state, key, arguments).await
    }
}

// ---------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------

/// No arguments.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct NoArguments {}

/// `get_message`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct GetMessageArguments {
    /// `evt_<hex>`, or a UUID (read as `evt_` + its 32 hex digits).
    event_id: String,
}

/// `delivery_stats`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct DeliveryStatsArguments {
    /// Minutes back from now, 1 to 10080 (7 days); default 60.
    #[schemars(range(min = 1, max = 10080))]
    window_minutes: Option<u32>,
}

fn arguments<T: DeserializeOwned>(arguments: JsonObject) -> Result<T, ToolError> {
    serde_json::from_value(Value::Object(arguments))
        .map_err(|e| ToolError::InvalidArguments(format!("invalid arguments: {e}")))
}

/// An API error inside a tool: a 400 is the arguments' fault, anything else a
/// failure (internal causes are logged, as the API does).
fn from_api(e: ApiError) -> ToolError {
    match e {
        ApiError::BadRequest(m) => ToolError::InvalidArguments(m),
        ApiError::Internal(ref cause) | ApiError::Unavailable(ref cause) => {
            tracing::error!(error = ?cause, "MCP tool failed");
            ToolError::Failed(e.to_string())
        }
        other => ToolError::Failed(other.to_string()),
    }
}

fn to_value(v: impl serde::Serialize) -> Result<Value, ToolError> {
    serde_json::to_value(v).map_err(|e| ToolError::Failed(format!("result not serialisable: {e}")))
}

// ---------------------------------------------------------------------------------------
// Tools
// ---------------------------------------------------------------------------------------

fn gateway_status<'a>(
    state: &'a AppState,
    _key: &'a ApiKeyRecord,
    args: JsonObject,
) -> BoxFuture<'a, Result<Value, ToolError>> {
    Box::pin(async move {
        let NoArguments {} = arguments(args)?;
        // Process-wide facts only: nothing here counts another workspace's data.
        Ok(json!({
            "status": if state.draining.load(Ordering::SeqCst) { "DRAINING" } else { "OK" },
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_seconds": state.started.elapsed().as_secs(),
            "broker": match state.config.broker.backend {
                BrokerBackend::Nats => "nats",
                BrokerBackend::Embedded => "embedded",
            },
            "nats_connected": state.ingest.broker.connected(),
        }))
    })
}

fn idempotency_inspect<'a>(
    state: &'a AppState,
    key: &'a ApiKeyRecord,
    args: JsonObject,
) -> BoxFuture<'a, Result<Value, ToolError>> {
    Box::pin(async move {
        let NoArguments {} = arguments(args)?;
        let tracked = state
            .ingest
            .idempotency
            .tracked(key.workspace.as_str())
            .await
            .map_err(|e| ToolError::Failed(e.to_string()))?;
        Ok(json!({ "tracked_keys": tracked }))
    })
}

fn get_message<'a>(
    state: &'a AppState,
    key: &'a ApiKeyRecord,
    args: JsonObject,
) -> BoxFuture<'a, Result<Value, ToolError>> {
    Box::pin(async move {
        let GetMessageArguments { event_id } = arguments(args)?;
        let dto = messages::message_with_timeline(&*state.ingest.store, &key.workspace, &event_id)
            .await
            .map_err(from_api)?;
        to_value(dto)
    })
}

fn list_messages<'a>(
    state: &'a AppState,
    key: &'a ApiKeyRecord,
    args: JsonObject,
) -> BoxFuture<'a, Result<Value, ToolError>> {
    Box::pin(async move {
        let query = arguments::<ListParams>(args)?
            .validate()
            .map_err(ToolError::InvalidArguments)?;
        let page = messages::list_page(&*state.ingest.store, &key.workspace, &query)
            .await
            .map_err(from_api)?;
        to_value(page)
    })
}

fn delivery_stats<'a>(
    state: &'a AppState,
    key: &'a ApiKeyRecord,
    args: JsonObject,
) -> BoxFuture<'a, Result<Value, ToolError>> {
    Box::pin(async move {
        let DeliveryStatsArguments { window_minutes } = arguments(args)?;
        let minutes = window_minutes.unwrap_or(DEFAULT_WINDOW_MINUTES);
        if !(1..=MAX_WINDOW_MINUTES).contains(&minutes) {
            return Err(ToolError::InvalidArguments(format!(
                "window_minutes must be from 1 to {MAX_WINDOW_MINUTES} (7 days)"
            )));
        }
        let since = chrono::Utc::now() - chrono::Duration::minutes(i64::from(minutes));
        let groups = state
            .ingest
            .store
            .delivery_stats(&key.workspace, since)
            .await
            .map_err(|e| from_api(ApiError::from_store_read(e)))?;
        let mut by_status = BTreeMap::<&str, u64>::new();
        let mut by_channel = BTreeMap::<&str, u64>::new();
        let mut by_provider = BTreeMap::<&str, u64>::new();
        for g in &groups {
            *by_status.entry(g.status.as_str()).or_default() += g.count;
            *by_channel.entry(&g.channel).or_default() += g.count;
            if let Some(p) = &g.provider {
                *by_provider.entry(p).or_default() += g.count;
            }
        }
        let rows: Vec<Value> = groups
            .iter()
            .map(|g| json!({"status": g.status.as_str(), "channel": g.channel, "provider": g.provider, "count": g.count}))
            .collect();
        Ok(json!({
            "window_minutes": minutes,
            "since": format_time(&since),
            "total": groups.iter().map(|g| g.count).sum::<u64>(),
            "by_status": by_status,
            "by_channel": by_channel,
            "by_provider": by_provider,
            "groups": rows,
        }))
    })
}

fn list_plugins<'a>(
    state: &'a AppState,
    key: &'a ApiKeyRecord,
    args: JsonObject,
) -> BoxFuture<'a, Result<Value, ToolError>> {
    Box::pin(async move {
        let NoArguments {} = arguments(args)?;
        let listing = plugin_listing(state).await.map_err(from_api)?;
        to_value(listing.seen_by(key))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_has_an_object_schema_and_read_only_hints() {
        let mut names = Vec::new();
        for spec in &TOOLS {
            let tool = spec.tool();
            assert_eq!(
                tool.input_schema.get("type"),
                Some(&json!("object")),
                "{}",
                spec.name
            );
            let hints = tool.annotations.expect("annotations");
            assert_eq!(hints.read_only_hint, Some(true));
            assert_eq!(hints.destructive_hint, Some(false));
            names.push(spec.name);
        }
        assert_eq!(
            names,
            [
                "gateway_status",
                "idempotency_inspect",
                "get_message",
                "list_messages",
                "delivery_stats",
                "list_plugins"
            ]
        );
    }

    #[test]
    fn schemas_describe_the_arguments() {
        let schema = |name| Value::Object((find(name).unwrap().input_schema)().as_ref().clone());
        let get = schema("get_message");
        assert_eq!(get["required"], json!(["event_id"]));
        assert_eq!(get["additionalProperties"], json!(false));
        let list = schema("list_messages");
        for p in [
            "status",
            "channel",
            "subscriber_id",
            "from",
            "to",
            "limit",
            "cursor",
        ] {
            assert!(list["properties"].get(p).is_some(), "{p}: {list}");
        }
        assert_eq!(list["properties"]["limit"]["maximum"], json!(100));
        let stats = schema("delivery_stats");
        assert_eq!(
            stats["properties"]["window_minutes"]["maximum"],
            json!(10080)
        );
        assert_eq!(
            schema("gateway_status")["additionalProperties"],
            json!(false)
        );
    }

    #[test]
    fn arguments_are_checked() {
        let object = |v: Value| v.as_object().unwrap().clone();
        assert!(matches!(
            arguments::<NoArguments>(object(json!({"x": 1}))),
            Err(ToolError::InvalidArguments(_))
        ));
        assert!(arguments::<NoArguments>(JsonObject::new()).is_ok());
        assert!(matches!(
            arguments::<GetMessageArguments>(JsonObject::new()),
            Err(ToolError::InvalidArguments(m)) if m.contains("event_id")
        ));
        assert!(matches!(
            arguments::<DeliveryStatsArguments>(object(json!({"window_minutes": "60"}))),
            Err(ToolError::InvalidArguments(_))
        ));
    }
}
