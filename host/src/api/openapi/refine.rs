//! What the derived document cannot say by itself, stated from the same constants the
//! server checks with: rules across fields (a recipient needs a contact detail, a
//! preference update needs something to set), identifier formats, the statuses every
//! operation shares, and an example request per operation. Fuzzers and SDK generators
//! read this document, so it must accept exactly what the server accepts.

use crate::api::subscribers::{CHANNELS, MAX_CATEGORIES, MAX_CATEGORY_LEN};
use crate::ingest::{MAX_NAME_LEN, MAX_PAYLOAD_DEPTH, MAX_SUBSCRIBER_LEN, SUBSCRIBER_ID_PATTERN};
use crate::model::MessageStatus;
use crate::routing::Channel;
use serde_json::{Map, Value, json};

/// `evt_` and lower-case hex, or a UUID as the `uuid` crate reads one (simple,
/// hyphenated, braced or `urn:uuid:`; either case): what `GET /v1/events/{eventId}` takes.
const EVENT_ID_PATTERN: &str = concat!(
    "^(evt_[0-9a-f]{1,64}|[0-9A-Fa-f]{32}",
    "|(urn:uuid:)?[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}",
    "|\\{[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\\})$"
);

/// Text without control characters (what every stored string must be).
const NO_CONTROL: &str = r"^[^\u0000-\u001F\u007F-\u009F]*$";

/// Text with at least one character that is not white space.
const NOT_BLANK: &str = r"\S";

pub(super) fn refine(doc: &mut Value) {
    schemas(&mut doc["components"]["schemas"]);
    let Some(paths) = doc["paths"].as_object_mut() else {
        return;
    };
    // The same callback route with the workspace named in the URL: one handler, so the
    // derive documents it once.
    if let Some(mut item) = paths.get("/v1/webhooks/{provider}").cloned() {
        let post = &mut item["post"];
        post["operationId"] = json!("receiveWebhookForWorkspace");
        post["summary"] = json!(
            "Receives one provider callback for a named workspace: only \
            that workspace's secret and the provider-wide one are tried."
        );
        if let Some(params) = post["parameters"].as_array_mut() {
            params.insert(
                1,
                json!({"name": "workspace", "in": "path", "required": true,
                "description": "The workspace's name, as configured in the provider's callback URL",
                "schema": {"type": "string", "minLength": 1}}),
            );
        }
        paths.insert("/v1/webhooks/{provider}/{workspace}".into(), item);
    }
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, operation) in item.iter_mut() {
            operation_statuses(operation);
            if path == "/v1/mcp" {
                operation["responses"]["200"]["content"]["application/json"]["schema"] = json!({
                    "anyOf": [
                        {"$ref": "#/components/schemas/McpResponse"},
                        {"$ref": "#/components/schemas/JsonRpcResponse"},
                    ]
                });
            }
            parameters(operation);
            // Raw component bytes: a binary string, whatever the declared type.
            if let Some(content) = operation
                .get_mut("requestBody")
                .and_then(|b| b.get_mut("content"))
                .and_then(Value::as_object_mut)
                && content.remove("application/wasm").is_some()
            {
                let binary = json!({"schema": {"type": "string", "format": "binary"}});
                content.insert("application/wasm".into(), binary.clone());
                content.insert("application/octet-stream".into(), binary);
            }
            if let Some(example) = example(method, path) {
                operation["requestBody"]["content"]["application/json"]["example"] = example;
            }
        }
    }
}

fn subscriber_id(description: &str) -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_SUBSCRIBER_LEN,
        "pattern": SUBSCRIBER_ID_PATTERN,
        "description": description,
        "example": "user-42",
    })
}

fn schemas(schemas: &mut Value) {
    // The event types, from the one list the handlers check against.
    schemas["EventType"] = json!({
        "type": "string",
        "enum": crate::events::EVENT_TYPES,
        "description": "A delivery event type.",
    });
    // An endpoint's event types are a set (a repeat is refused).
    for name in ["CreateEndpointRequest", "UpdateEndpointRequest"] {
        schemas[name]["properties"]["event_types"]["uniqueItems"] = json!(true);
    }
    // Stored strings refuse control characters; a payload nests at most 32 levels.
    let trigger = &mut schemas["TriggerRequest"]["properties"];
    trigger["category"] = json!({
        "type": ["string", "null"], "minLength": 1, "maxLength": MAX_NAME_LEN,
        "pattern": SUBSCRIBER_ID_PATTERN,
        "description": "Preference category (defaults to `name`): 1 to 200 characters, not \
            only white space, no control characters.",
    });
    trigger["payload"] = json!({
        "type": ["object", "null"],
        "propertyNames": {"pattern": NO_CONTROL},
        "description": format!("Template variables, any JSON object nested at most \
            {MAX_PAYLOAD_DEPTH} levels deep; keys without control characters. Only the keys \
            are stored."),
    });
    // A recipient needs a contact detail some channel can use (else 400).
    let recipient = &mut schemas["Recipient"];
    for field in ["email", "phone"] {
        recipient["properties"][field]["pattern"] = json!(NO_CONTROL);
    }
    recipient["properties"]["deviceTokens"]["items"]["pattern"] = json!(NO_CONTROL);
    recipient["properties"]["subscriberId"] = subscriber_id(
        "The caller's stable id for the person; the rate-limit bucket. 1 to 256 characters, \
         not only white space, no control characters.",
    );
    recipient["anyOf"] = json!([
        {"required": ["email"], "properties": {"email": {"type": "string", "pattern": NOT_BLANK}}},
        {"required": ["phone"], "properties": {"phone": {"type": "string", "pattern": NOT_BLANK}}},
        {"required": ["deviceTokens"], "properties": {"deviceTokens": {
            "type": "array", "contains": {"type": "string", "pattern": NOT_BLANK}}}},
    ]);
    append(
        recipient,
        " At least one of `email`, `phone` or a non-blank device token is needed \
         (else 400: no contact details).",
    );

    mcp_request(&mut schemas["McpRequest"]);
    schemas["JsonRpcResponse"] = json!({
        "type": "object",
        "description": "A JSON-RPC 2.0 response of the MCP front: `result`, or `error`.",
        "required": ["jsonrpc", "id"],
        "properties": {
            "jsonrpc": {"type": "string", "enum": ["2.0"]},
            "id": {"type": ["integer", "string", "null"]},
            "result": {"type": "object"},
            "error": {"type": "object", "required": ["code", "message"], "properties": {
                "code": {"type": "integer"}, "message": {"type": "string"}, "data": {}}},
        },
        "anyOf": [{"required": ["result"]}, {"required": ["error"]}],
    });

    // A bulk item that is not a valid TriggerRequest fails alone, in a 200 answer.
    schemas["BulkTriggerRequest"]["properties"]["events"]["items"] = json!({
        "anyOf": [{"$ref": "#/components/schemas/TriggerRequest"}, {}],
        "description": "A TriggerRequest. An item that is not one (a missing field, a typo, \
            no contact details) becomes a FAILED result naming the problem; the others are \
            unaffected."
    });

    // A preference update sets at least one flag or replaces at least one category.
    let flags: Map<String, Value> = CHANNELS
        .iter()
        .map(|c| (c.as_str().to_string(), json!({"type": ["boolean", "null"]})))
        .collect();
    let some_flag: Vec<Value> = CHANNELS
        .iter()
        .map(|c| json!({"required": [c.as_str()], "properties": {c.as_str(): {"type": "boolean"}}}))
        .collect();
    let prefs = &mut schemas["UserPreferencesRequest"];
    prefs["properties"]["categories"] = json!({
        "type": ["object", "null"],
        "description": "Category name -> channel name -> flag. Each category sent replaces that \
            category's stored flags wholesale (`{}` clears them); category rules win over channel \
            flags. A `null` flag is the same as leaving the channel out.",
        "maxProperties": MAX_CATEGORIES,
        "propertyNames": {"minLength": 1, "maxLength": MAX_CATEGORY_LEN, "pattern": SUBSCRIBER_ID_PATTERN},
        "additionalProperties": {"type": "object", "properties": flags, "additionalProperties": false},
    });
    prefs["additionalProperties"] = json!(false);
    prefs["anyOf"] = json!([
        {"required": ["channels"], "properties": {"channels": {"type": "object", "anyOf": some_flag}}},
        {"required": ["categories"], "properties": {"categories": {"type": "object", "minProperties": 1}}},
    ]);
}

/// The two fronts of `/v1/mcp`: a JSON-RPC 2.0 request (what the MCP transport reads:
/// `params` an object, `id` an integer or a string, none for a notification), or the
/// legacy `{method, params, id}` without `jsonrpc`, whose `params` and `id` are free.
/// (`id` an integer in the i64 range or a string).
fn mcp_request(schema: &mut Value) {
    schema["properties"]["jsonrpc"] = json!({"type": "string", "enum": ["2.0"],
        "description": "`2.0` for the MCP front; leave it out for the legacy shape."});
    schema["properties"]["params"] =
        json!({"description": "Method parameters; for `tools/call`: `{name, arguments}`."});
    schema["properties"]["id"] =
        json!({"description": "Correlation id (legacy: a non-negative integer is echoed)."});
    schema["anyOf"] = json!([
        // The transport reads an integer id as an i64.
        {"required": ["jsonrpc"], "properties": {
            "id": {"anyOf": [
                {"type": "integer", "minimum": i64::MIN, "maximum": i64::MAX},
                {"type": "string"},
            ]},
            "params": {"type": ["object", "null"]}}},
        {"not": {"required": ["jsonrpc"]}},
    ]);
}

fn append(schema: &mut Value, text: &str) {
    let description = schema["description"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    schema["description"] = json!(description + text);
}

/// The statuses every operation of a kind can answer: 401 where a key is needed, 400,
/// 413 and 415 where a JSON body is read, 500 everywhere but liveness and readiness
/// (which answer 200 or 503 whatever fails).
fn operation_statuses(operation: &mut Value) {
    let keyed = operation["security"]
        .as_array()
        .is_some_and(|s| !s.is_empty());
    let json_body = operation["requestBody"]["content"]
        .get("application/json")
        .is_some();
    let liveness =
        operation["operationId"] == "getHealth" || operation["operationId"] == "getReadiness";
    let responses = &mut operation["responses"];
    let mut ensure = |status: &str, description: &str| {
        if responses.get(status).is_none() {
            responses[status] = json!({
                "description": description,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
            });
        }
    };
    if keyed {
        ensure("401", "Missing, malformed, unrecognised or revoked key");
        ensure(
            "503",
            "The key could not be checked (database unavailable): retry with backoff",
        );
    }
    if json_body {
        ensure(
            "400",
            "The body is not valid JSON or not the documented shape (the message says where)",
        );
        ensure("413", "Body too large");
        ensure("415", "Not JSON: send `Content-Type: application/json`");
    }
    if !liveness {
        ensure(
            "500",
            "Internal failure: safe to retry (with the same idempotency key for triggers)",
        );
    }
}

/// Identifier formats and filter values, from the rules the handlers apply.
fn parameters(operation: &mut Value) {
    let Some(parameters) = operation
        .get_mut("parameters")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for p in parameters {
        let description = p["description"].as_str().unwrap_or_default().to_string();
        let schema = match p["name"].as_str().unwrap_or_default() {
            "subscriberId" | "subscriber_id" | "subscriber" => subscriber_id(&description),
            "eventId" => json!({"type": "string", "pattern": EVENT_ID_PATTERN,
                "example": "evt_5b1f0c2a9d8e4f3a8c7b6a5d4e3f2a1b"}),
            "status" if p["in"] == "query" => {
                either_case(MessageStatus::ALL.iter().map(|s| s.as_str()))
            }
            "channel" if p["in"] == "query" => either_case(Channel::ALL.iter().map(|c| c.as_str())),
            "cursor"
                if description.contains("next_cursor") && p["schema"]["pattern"].is_string() =>
            {
                continue;
            }
            "cursor" => json!({"type": "string", "minLength": 1}),
            // What `HeaderValue::to_str` takes, 1 to 255 characters (the ends are
            // trimmed by HTTP itself).
            "Idempotency-Key" => json!({"type": "string", "minLength": 1, "maxLength": 255,
                "pattern": "^[!-~]([ -~]*[!-~])?$"}),
            _ => continue,
        };
        p["schema"] = schema;
    }
}

/// A filter value the server reads in all lower or all upper case.
fn either_case<'a>(names: impl Iterator<Item = &'a str> + Clone) -> Value {
    let names: Vec<String> = names
        .clone()
        .map(str::to_ascii_uppercase)
        .chain(names.map(str::to_ascii_lowercase))
        .collect();
    json!({"type": "string", "enum": names})
}

/// One example request body per operation that takes one.
fn example(method: &str, path: &str) -> Option<Value> {
    Some(match (method, path) {
        ("post", "/v1/events/trigger") => json!({
            "name": "welcome",
            "to": {"subscriberId": "user-42", "email": "ada@example.com"},
            "payload": {"name": "Ada"}
        }),
        ("post", "/v1/events/bulk") => json!({"events": [
            {"name": "welcome", "to": {"subscriberId": "user-42", "email": "ada@example.com"}},
            {"name": "otp", "to": {"subscriberId": "user-43", "phone": "+14155550123"},
             "payload": {"code": "482910"}}
        ]}),
        ("put", "/v1/users/{subscriberId}/preferences") => json!({
            "channels": {"sms": false},
            "categories": {"promotions": {"email": false}}
        }),
        ("post", "/v1/mcp") => json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        ("post", "/v1/webhooks/{provider}") => json!({
            "message_id": "pa-7f3c", "status": "DELIVERED", "channel": "email",
            "recipient": "ada@example.com", "latency_ms": 840
        }),
        _ => return None,
    })
}
