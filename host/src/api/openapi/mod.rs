//! `GET /v1/openapi.json`: the OpenAPI 3.1 document, generated from the code.
//! A committed copy lives in `docs/openapi.json`; a test fails when they drift
//! (`SWITCHBOARD_UPDATE_OPENAPI=1 cargo test -p switchboard --test cli openapi` rewrites it).

use crate::AppState;
use axum::routing::get;
use axum::{Json, Router};
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};

mod refine;

/// The document.
#[derive(OpenApi)]
#[openapi(
    info(title = "Switchboard", description = "Notification gateway with sandboxed provider plugins"),
    paths(
        super::events::trigger,
        super::events::bulk,
        super::messages::get_event,
        super::messages::list_messages,
        super::subscribers::update_preferences,
        super::subscribers::erase_subscriber,
        super::health::health,
        super::health::ready,
        super::mcp::mcp,
        super::webhooks::receive,
        super::admin::list_plugins,
        super::admin::install_plugin,
        super::admin::rollback,
        super::endpoints::create,
        super::endpoints::list,
        super::endpoints::read,
        super::endpoints::update,
        super::endpoints::remove,
        super::endpoints::rotate_secret,
        super::endpoint_deliveries::test,
        super::endpoint_deliveries::list,
        super::endpoint_deliveries::retry,
    ),
    components(schemas(crate::receipts::TelemetryReceiptEvent)),
    servers((url = "/", description = "This gateway")),
    modifiers(&BearerAuth),
    tags(
        (name = "events", description = "Triggering notifications"),
        (name = "messages", description = "Recorded messages and their timelines"),
        (name = "subscribers", description = "Preferences and erasure"),
        (name = "health", description = "Liveness and readiness"),
        (name = "mcp", description = "Operator tools for AI agents"),
        (name = "webhooks", description = "Provider delivery receipts, authenticated by the provider's signature"),
        (name = "admin", description = "The plugin registry; keys with the `admin` scope"),
        (name = "webhook-endpoints", description = "Where a workspace's delivery events are posted, signed per the Standard Webhooks specification"),
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("svc_sk_live_… or svc_sk_test_…"))
                    .build(),
            ),
        );
    }
}

/// The document as pretty JSON, as committed.
pub fn document() -> String {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    let mut doc = serde_json::to_value(doc).expect("the OpenAPI document serialises");
    refine::refine(&mut doc);
    serde_json::to_string_pretty(&doc).expect("the OpenAPI document serialises") + "\n"
}

/// Routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new().route(
        "/v1/openapi.json",
        get(|| async {
            Json(serde_json::from_str::<serde_json::Value>(&document()).unwrap_or_default())
        }),
    )
}
