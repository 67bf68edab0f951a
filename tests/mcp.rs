//! `POST /v1/mcp` as an MCP server, driven by the official Rust MCP client (rmcp)
//! and by raw HTTP, on both backend sets: the embedded one (SQLite, the embedded
//! queue, in-process counters) and the production one (PostgreSQL, NATS JetStream,
//! Redis, isolated per test).

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientRequest, ErrorCode, JsonObject, PingRequest,
    ProtocolVersion, ServerResult,
};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientLifecycleMode, ClientServiceExt, ServiceError};
use serde_json::{Value, json};
use switchboard::AppState;
use switchboard::config::Config;
use switchboard::model::{KeyMode, Tier};

mod common;
use common::Backends;

struct Gateway {
    url: String,
    state: AppState,
    config: Config,
    _dir: tempfile::TempDir,
    http: reqwest::Client,
}

type Client = RunningService<RoleClient, ()>;

impl Gateway {
    async fn start(backends: Backends) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config {
            data_dir: dir.path().to_path_buf(),
            ..Config::default()
        };
        common::isolate(&mut config, backends, "mcp").await;
        // No workers: messages stay QUEUED, so the counts below are exact.
        config.worker.enabled = false;
        let state = switchboard::build_state(config.clone())
            .await
            .expect("gateway starts (are PostgreSQL, NATS and Redis running?)");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(switchboard::serve(
            state.clone(),
            listener,
            std::future::pending(),
        ));
        Self {
            url,
            state,
            config,
            _dir: dir,
            http: reqwest::Client::new(),
        }
    }

    async fn key(&self, workspace: &str, scopes: &[&str]) -> String {
        let store = &self.state.ingest.store;
        let ws = store
            .ensure_workspace(workspace, Some(Tier::Paid))
            .await
            .unwrap();
        let (raw, mut record) = switchboard::auth::generate_key(&ws.id, KeyMode::Live);
        record.scopes = scopes.iter().map(|s| s.to_string()).collect();
        store.insert_api_key(&record).await.unwrap();
        raw
    }

    /// Triggers one email with an idempotency key; returns its event id.
    async fn trigger(&self, key: &str, subscriber: &str, idempotency_key: &str) -> String {
        let body = json!({"name": "order-shipped", "to": {"subscriberId": subscriber, "email": "ada@example.com"}, "payload": {"order": "A-1"}});
        let resp = self
            .http
            .post(format!("{}/v1/events/trigger", self.url))
            .bearer_auth(key)
            .header("Idempotency-Key", idempotency_key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
        let body: Value = resp.json().await.unwrap();
        body["eventId"].as_str().unwrap().to_string()
    }

    /// A connected MCP client: `initialize` + `notifications/initialized`, or the
    /// `server/discover` lifecycle of 2026-07-28.
    async fn client(&self, key: &str, lifecycle: ClientLifecycleMode) -> Client {
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(format!("{}/v1/mcp", self.url))
                .auth_header(key),
        );
        ().serve_with_lifecycle(transport, lifecycle)
            .await
            .expect("the MCP client connects")
    }

    /// A POST to /v1/mcp accepting JSON and SSE, with `headers`: (status, body).
    async fn post_with(&self, key: &str, headers: &[(&str, &str)], body: &Value) -> (u16, Value) {
        let mut req = self
            .http
            .post(format!("{}/v1/mcp", self.url))
            .bearer_auth(key)
            .header("accept", "application/json, text/event-stream")
            .json(body);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let resp = req.send().await.unwrap();
        (resp.status().as_u16(), resp.json().await.unwrap())
    }

    /// A raw POST to /v1/mcp: (status, content type, body).
    async fn post(
        &self,
        key: Option<&str>,
        accept: Option<&str>,
        body: &Value,
    ) -> (u16, String, Value) {
        let mut req = self.http.post(format!("{}/v1/mcp", self.url)).json(body);
        if let Some(key) = key {
            req = req.bearer_auth(key);
        }
        if let Some(accept) = accept {
            req = req.header("accept", accept);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let text = resp.text().await.unwrap();
        (
            status,
            content_type,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn cleanup(self) {
        if self.config.broker.backend == switchboard::config::BrokerBackend::Nats {
            let js = async_nats::jetstream::new(
                async_nats::connect(&self.config.broker.url).await.unwrap(),
            );
            let _ = js.delete_stream(&self.config.broker.streams.critical).await;
            let _ = js.delete_stream(&self.config.broker.streams.bulk).await;
        }
    }
}

fn initialize() -> ClientLifecycleMode {
    ClientLifecycleMode::Initialize
}

fn args(v: Value) -> JsonObject {
    v.as_object().expect("an object").clone()
}

async fn call(client: &Client, tool: &'static str, arguments: Value) -> CallToolResult {
    try_call(client, tool, arguments)
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

async fn try_call(
    client: &Client,
    tool: &'static str,
    arguments: Value,
) -> Result<CallToolResult, ServiceError> {
    client
        .call_tool(CallToolRequestParams::new(tool).with_arguments(args(arguments)))
        .await
}

/// The structured result of a successful call, checked against its text content.
fn structured(result: &CallToolResult) -> Value {
    assert_eq!(result.is_error, Some(false), "{result:?}");
    let value = result
        .structured_content
        .clone()
        .expect("structuredContent");
    let text = result.content[0].as_text().expect("text content");
    assert_eq!(serde_json::from_str::<Value>(&text.text).unwrap(), value);
    value
}

fn error_text(result: &CallToolResult) -> String {
    assert_eq!(result.is_error, Some(true), "{result:?}");
    result.content[0].as_text().expect("text").text.clone()
}

fn invalid_params(outcome: Result<CallToolResult, ServiceError>) -> String {
    match outcome {
        Err(ServiceError::McpError(e)) if e.code == ErrorCode::INVALID_PARAMS => {
            e.message.to_string()
        }
        other => panic!("expected invalid params, got {other:?}"),
    }
}

both!(
    a_client_initialises_lists_and_calls_every_tool,
    the_discover_lifecycle_works_too,
    raw_exchanges_and_the_legacy_body,
    workspaces_never_see_each_other,
);

async fn a_client_initialises_lists_and_calls_every_tool(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", &["admin"]).await;
    let first = gw.trigger(&key, "ada", "k1").await;
    let second = gw.trigger(&key, "bob", "k2").await;

    let client = gw.client(&key, initialize()).await;
    let info = client.peer_info().expect("initialize result");
    let server = info.server_info.as_ref().expect("serverInfo");
    assert_eq!(server.name, "switchboard");
    assert_eq!(server.version, env!("CARGO_PKG_VERSION"));
    assert!(info.capabilities.tools.is_some());
    assert_eq!(
        info.protocol_version,
        ProtocolVersion::LATEST_WITH_INITIALIZE
    );
    let pong = client
        .send_request(ClientRequest::PingRequest(PingRequest::default()))
        .await
        .expect("ping");
    assert!(matches!(pong, ServerResult::EmptyResult(_)), "{pong:?}");

    let tools = client.list_all_tools().await.expect("tools/list");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
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
    for tool in &tools {
        assert_eq!(tool.input_schema.get("type"), Some(&json!("object")));
        assert!(tool.description.as_deref().is_some_and(|d| !d.is_empty()));
        assert_eq!(
            tool.annotations.as_ref().unwrap().read_only_hint,
            Some(true)
        );
    }

    let status = structured(&call(&client, "gateway_status", json!({})).await);
    assert_eq!(status["status"], "OK");
    assert_eq!(status["nats_connected"], true);
    assert_eq!(
        status["broker"],
        if b == Backends::Embedded {
            "embedded"
        } else {
            "nats"
        }
    );
    assert!(status["uptime_seconds"].is_u64());
    assert!(status.get("outbox_depth").is_none(), "{status}");

    let idem = structured(&call(&client, "idempotency_inspect", json!({})).await);
    assert_eq!(idem, json!({"tracked_keys": 2}));

    let message = structured(&call(&client, "get_message", json!({"event_id": first})).await);
    assert_eq!(message["event_id"], first.as_str());
    assert_eq!(message["status"], "QUEUED");
    assert_eq!(message["events"][0]["status"], "queued");

    let page = structured(&call(&client, "list_messages", json!({"limit": 1})).await);
    assert_eq!(page["messages"][0]["event_id"], second.as_str());
    assert!(page["messages"][0].get("events").is_none());
    let cursor = page["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_string();
    let rest = structured(
        &call(
            &client,
            "list_messages",
            json!({"limit": 1, "cursor": cursor}),
        )
        .await,
    );
    assert_eq!(rest["messages"][0]["event_id"], first.as_str());
    let filtered = structured(
        &call(
            &client,
            "list_messages",
            json!({"subscriber_id": "bob", "status": "queued", "channel": "EMAIL"}),
        )
        .await,
    );
    assert_eq!(filtered["messages"].as_array().unwrap().len(), 1);

    let stats = structured(&call(&client, "delivery_stats", json!({})).await);
    assert_eq!(stats["window_minutes"], 60);
    assert_eq!(stats["total"], 2);
    assert_eq!(stats["by_status"], json!({"QUEUED": 2}));
    assert_eq!(stats["by_channel"], json!({"email": 2}));
    assert_eq!(stats["by_provider"], json!({}));
    assert_eq!(
        stats["groups"],
        json!([{"status": "QUEUED", "channel": "email", "provider": null, "count": 2}])
    );
    let week = structured(&call(&client, "delivery_stats", json!({"window_minutes": 10080})).await);
    assert_eq!(week["total"], 2);

    let plugins = structured(&call(&client, "list_plugins", json!({})).await);
    assert!(
        !plugins["loaded"].as_array().unwrap().is_empty(),
        "{plugins}"
    );
    assert!(plugins["installed"].is_array());

    // Bad arguments and unknown tools are JSON-RPC errors; a tool that runs and
    // finds nothing is a tool error.
    for (tool, arguments) in [
        ("delivery_stats", json!({"window_minutes": 0})),
        ("delivery_stats", json!({"window_minutes": 10081})),
        ("get_message", json!({})),
        ("get_message", json!({"event_id": "nope"})),
        ("list_messages", json!({"status": "SENDING"})),
        ("list_messages", json!({"limit": 101})),
        ("list_messages", json!({"cursor": "abc"})),
        ("gateway_status", json!({"verbose": true})),
        ("rm_rf", json!({})),
    ] {
        invalid_params(try_call(&client, tool, arguments).await);
    }
    let missing = call(
        &client,
        "get_message",
        json!({"event_id": "evt_0123456789abcdef0123456789abcdef"}),
    )
    .await;
    assert!(error_text(&missing).contains("no event"));

    client.cancel().await.unwrap();
    gw.cleanup().await;
}

/// The 2026-07-28 lifecycle (no `initialize`, per-request metadata) lists and calls.
async fn the_discover_lifecycle_works_too(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", &[]).await;
    let client = gw
        .client(
            &key,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await;
    let tools = client.list_all_tools().await.expect("tools/list");
    assert_eq!(tools.len(), 5, "no list_plugins for a non-admin key");
    let status = structured(&call(&client, "gateway_status", json!({})).await);
    assert_eq!(status["status"], "OK");
    client.cancel().await.unwrap();
    gw.cleanup().await;
}

async fn raw_exchanges_and_the_legacy_body(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", &[]).await;
    let both = Some("application/json, text/event-stream");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}});

    let (s, ct, body) = gw.post(Some(&key), both, &init).await;
    assert_eq!((s, ct.as_str()), (200, "application/json"), "{body}");
    assert_eq!(body["jsonrpc"], "2.0");
    assert_eq!(body["id"], 1);
    assert_eq!(body["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(body["result"]["serverInfo"]["name"], "switchboard");
    assert!(body["result"]["capabilities"]["tools"].is_object());
    let (s, _, _) = gw
        .post(
            Some(&key),
            both,
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )
        .await;
    assert_eq!(s, 202);

    // No Accept header: served as JSON all the same.
    let list = json!({"jsonrpc": "2.0", "id": "a", "method": "tools/list"});
    let (s, _, body) = gw.post(Some(&key), None, &list).await;
    assert_eq!((s, &body["id"]), (200, &json!("a")), "{body}");
    assert_eq!(body["result"]["tools"].as_array().unwrap().len(), 5);
    let (s, _, body) = gw
        .post(
            Some(&key),
            None,
            &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "nope"}}),
        )
        .await;
    assert_eq!((s, &body["error"]["code"]), (200, &json!(-32602)), "{body}");
    // An unknown method is a JSON-RPC error in a 200, as the spec has it (the transport
    // answers 404, which an MCP client takes for a lost session).
    for method in ["resources/list", "prompts/list", "made/up"] {
        let unknown = json!({"jsonrpc": "2.0", "id": 9, "method": method});
        let (s, _, body) = gw.post(Some(&key), both, &unknown).await;
        assert_eq!(
            (s, &body["id"], &body["error"]["code"]),
            (200, &json!(9), &json!(-32601)),
            "{method}: {body}"
        );
    }
    // The same on the 2026-07-28 revision's per-request path, where the transport
    // answers an unknown method 404.
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let (status, body) = gw
        .post_with(
            &key,
            &[
                ("mcp-protocol-version", "2026-07-28"),
                ("mcp-method", "resources/list"),
            ],
            &json!({"jsonrpc": "2.0", "id": 10, "method": "resources/list",
                "params": {"_meta": meta}}),
        )
        .await;
    assert_eq!(
        (status, &body["id"], &body["error"]["code"]),
        (200, &json!(10), &json!(-32601)),
        "{body}"
    );
    // A JSON-RPC error the transport answers 400 is an ErrorResponse like every 400.
    let (status, body) = gw
        .post_with(&key, &[("mcp-protocol-version", "2025-03-26")], &init)
        .await;
    assert_eq!(
        (status, &body["error"], &body["status_code"]),
        (400, &json!("BAD_REQUEST"), &json!(400)),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("does not match"),
        "{body}"
    );
    assert_eq!(body.as_object().unwrap().len(), 3, "{body}");
    // An integer id written with a zero fraction is an integer all the same, read
    // exactly (2^51..2^52, where a fast float parser is half a unit off).
    let (s, _, body) = gw
        .post(
            Some(&key),
            None,
            &json!({"jsonrpc": "2.0", "id": -3698700529089954.0, "method": "tools/list", "params": null}),
        )
        .await;
    assert_eq!(
        (s, &body["id"]),
        (200, &json!(-3698700529089954_i64)),
        "{body}"
    );

    // HTTP refusals keep the ErrorResponse shape.
    let (s, _, body) = gw.post(Some(&key), Some("text/html"), &list).await;
    assert_eq!(
        (s, &body["error"], &body["status_code"]),
        (406, &json!("NOT_ACCEPTABLE"), &json!(406)),
        "{body}"
    );
    let (s, _, body) = gw.post(None, both, &init).await;
    assert_eq!(
        (s, &body["error"], &body["status_code"]),
        (401, &json!("UNAUTHORIZED"), &json!(401)),
        "{body}"
    );
    let (s, _, body) = gw.post(Some("svc_sk_live_nope"), both, &list).await;
    assert_eq!((s, &body["error"]), (401, &json!("UNAUTHORIZED")), "{body}");
    let resp = gw
        .http
        .post(format!("{}/v1/mcp", gw.url))
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "BAD_REQUEST");
    let resp = gw
        .http
        .get(format!("{}/v1/mcp", gw.url))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["error"],
        "METHOD_NOT_ALLOWED"
    );

    // The legacy body (no `jsonrpc`) keeps its shape.
    let (s, _, body) = gw
        .post(Some(&key), None, &json!({"method": "tools/list", "id": 7}))
        .await;
    assert_eq!(
        (s, &body["jsonrpc"], &body["id"]),
        (200, &json!("2.0"), &json!(7))
    );
    let names: Vec<&str> = body["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 5);
    assert!(names.contains(&"gateway_status") && !names.contains(&"list_plugins"));
    assert!(body["result"]["tools"][0]["inputSchema"].is_object());
    let (s, _, body) = gw
        .post(Some(&key), None, &json!({"method": "tools/list"}))
        .await;
    assert_eq!(s, 200);
    assert!(body["id"].is_u64() && body["result"]["tools"].is_array());
    let (s, _, body) = gw
        .post(
            Some(&key),
            None,
            &json!({"method": "resources/list", "id": 3}),
        )
        .await;
    assert_eq!((s, &body["id"]), (200, &json!(3)));
    assert_eq!(body["result"]["error"]["code"], -32601);
    assert!(body["result"]["error"]["message"].is_string());
    let (_, _, body) = gw
        .post(
            Some(&key),
            None,
            &json!({"method": "tools/call", "params": {"name": "idempotency_inspect"}}),
        )
        .await;
    assert_eq!(body["result"]["isError"], false);
    assert_eq!(
        body["result"]["structuredContent"],
        json!({"tracked_keys": 0})
    );
    for params in [
        json!({"name": "rm_rf"}),
        json!({"name": "list_plugins"}),
        json!({"name": "get_message", "arguments": {"event_id": 5}}),
        json!({}),
    ] {
        let (s, _, body) = gw
            .post(
                Some(&key),
                None,
                &json!({"method": "tools/call", "params": params}),
            )
            .await;
        assert_eq!(
            (s, &body["result"]["isError"]),
            (200, &json!(true)),
            "{body}"
        );
    }
    let (s, _, body) = gw.post(None, None, &json!({"method": "tools/list"})).await;
    assert_eq!((s, &body["error"]), (401, &json!("UNAUTHORIZED")));
    gw.cleanup().await;
}

/// A second workspace's key sees none of the first's messages, keys or counts, and
/// a non-admin key neither sees nor may call `list_plugins`.
async fn workspaces_never_see_each_other(b: Backends) {
    let gw = Gateway::start(b).await;
    let acme = gw.key("acme", &["admin"]).await;
    let globex = gw.key("globex", &[]).await;
    let event = gw.trigger(&acme, "ada", "shared-key").await;
    gw.trigger(&acme, "bob", "other-key").await;

    let client = gw.client(&globex, initialize()).await;
    let names: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(!names.iter().any(|n| n == "list_plugins"), "{names:?}");
    let idem = structured(&call(&client, "idempotency_inspect", json!({})).await);
    assert_eq!(idem["tracked_keys"], 0);
    let page = structured(&call(&client, "list_messages", json!({})).await);
    assert_eq!(page["messages"], json!([]));
    let stats =
        structured(&call(&client, "delivery_stats", json!({"window_minutes": 10080})).await);
    assert_eq!((&stats["total"], &stats["groups"]), (&json!(0), &json!([])));
    let foreign = call(&client, "get_message", json!({"event_id": event})).await;
    assert!(error_text(&foreign).contains("no event"));
    let refused = call(&client, "list_plugins", json!({})).await;
    assert!(error_text(&refused).contains("admin"));
    // A cursor of the other workspace is refused too.
    let acme_client = gw.client(&acme, initialize()).await;
    let acme_page = structured(&call(&acme_client, "list_messages", json!({"limit": 1})).await);
    let cursor = acme_page["next_cursor"].as_str().unwrap().to_string();
    invalid_params(
        try_call(
            &client,
            "list_messages",
            json!({"limit": 1, "cursor": cursor}),
        )
        .await,
    );

    // The same idempotency key in the second workspace is its own.
    gw.trigger(&globex, "carol", "shared-key").await;
    let idem = structured(&call(&client, "idempotency_inspect", json!({})).await);
    assert_eq!(idem["tracked_keys"], 1);
    let idem = structured(&call(&acme_client, "idempotency_inspect", json!({})).await);
    assert_eq!(idem["tracked_keys"], 2);

    client.cancel().await.unwrap();
    acme_client.cancel().await.unwrap();
    gw.cleanup().await;
}
