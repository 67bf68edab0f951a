//! `/v1/admin/plugins`: the plugin registry over HTTP, for keys with the `admin` scope
//! (`switchboard keys create --scope admin`). Application keys get 403 `FORBIDDEN`.

use super::ApiError;
use super::extract::Caller;
use crate::AppState;
use crate::model::ApiKeyRecord;
use crate::plugins::install::{self, InstallOutcome};
use crate::plugins::registry::{Registry, Source};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

/// A plugin serving a slug right now, in this process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LoadedPlugin {
    /// Slug.
    pub slug: String,
    /// Version from `info()`.
    pub version: String,
    /// Hex SHA-256 of the component.
    pub digest: String,
    /// `bundled`, `directory` or `installed`.
    pub source: String,
    /// `wasm` (a sandboxed component) or `native` (a trusted native library).
    pub kind: String,
    /// The `switchboard:provider` WIT version it was built against (`0.1.0`,
    /// `0.2.0`; a native library: the one its ABI carries).
    pub wit_version: String,
    /// Channels served.
    pub channels: Vec<String>,
    /// The canary serving a share of this slug's events beside it, if one runs.
    pub canary: Option<ServingCanary>,
}

/// A canary version serving beside the active one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ServingCanary {
    /// Version from `info()`.
    pub version: String,
    /// Hex SHA-256 of the component.
    pub digest: String,
    /// Share of the slug's events it serves, 1-99.
    pub percent: i64,
    /// When its trial began (RFC 3339).
    pub since: String,
}

/// An installed version (stored in the database).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InstalledVersion {
    /// Slug.
    pub slug: String,
    /// Version.
    pub version: String,
    /// Hex SHA-256 of the component.
    pub digest: String,
    /// `wasm` (a sandboxed component) or `native` (a trusted native library).
    pub kind: String,
    /// `active`, `standby`, `rejected` or `canary`.
    pub state: String,
    /// While a canary: the share of the slug's events it serves, 1-99.
    pub canary_percent: Option<i64>,
    /// While a canary: when its trial began (RFC 3339).
    pub canary_since: Option<String>,
    /// How its last canary trial ended (`promoted: ...`, `rolled back: ...`).
    pub canary_result: Option<String>,
    /// Who installed it: `cli:<user>`, `api:<key id>`, `console:<key id>` or
    /// `dir:<file>`; a tenant's admin sees only the part before the colon (the
    /// operator's names and keys are not theirs to see).
    pub installed_by: String,
    /// When (RFC 3339).
    pub installed_at: String,
    /// Hosts it declares.
    pub outbound_hosts: Vec<String>,
}

/// `GET /v1/admin/plugins`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PluginListing {
    /// What serves each slug in this process.
    pub loaded: Vec<LoadedPlugin>,
    /// Every installed version, newest first.
    pub installed: Vec<InstalledVersion>,
}

/// `POST /v1/admin/plugins` success.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InstallResponse {
    /// `ACTIVE`, or `CANARY` when installed with `canary`: every process switches
    /// when it hears the swap announced, and within `plugins.sync_ms` in any case.
    pub status: String,
    /// Slug.
    pub slug: String,
    /// Version.
    pub version: String,
    /// Hex SHA-256 of the component.
    pub digest: String,
    /// The installed version it replaced, if any (`null` for a canary).
    pub previous: Option<String>,
    /// A canary's share of the slug's events.
    pub canary_percent: Option<u8>,
}

/// `POST /v1/admin/plugins` query.
#[derive(Debug, Default, Deserialize)]
pub struct InstallQuery {
    /// Allow outbound hosts the active version does not declare.
    #[serde(default)]
    pub approve_hosts: bool,
    /// Install as a canary serving this share (1-99 %) of the slug's events.
    pub canary: Option<u8>,
}

/// Routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/plugins", get(list_plugins).post(install_plugin))
        .route("/v1/admin/plugins/{slug}/rollback", post(rollback))
}

/// Whether a key has the `admin` scope.
pub fn is_admin(key: &ApiKeyRecord) -> bool {
    key.scopes
        .iter()
        .any(|s| s == crate::auth::SCOPE_ADMIN || s == crate::auth::SCOPE_OPERATOR)
}

/// True for the gateway operator's key (see [`crate::auth::SCOPE_OPERATOR`]).
pub fn is_operator(key: &ApiKeyRecord) -> bool {
    key.scopes.iter().any(|s| s == crate::auth::SCOPE_OPERATOR)
}

/// Installing or rolling back a plugin changes it for every tenant.
fn require_operator(caller: &Caller) -> Result<(), ApiError> {
    require_operator_key(&caller.key)
}

/// [`require_operator`] for a key resolved otherwise (the console's session).
pub fn require_operator_key(key: &ApiKeyRecord) -> Result<(), ApiError> {
    if is_operator(key) {
        Ok(())
    } else {
        Err(ApiError::Forbidden(OPERATOR_ONLY.into()))
    }
}

/// Why a plugin swap was refused to a key without the `operator` scope.
const OPERATOR_ONLY: &str = "installing or rolling back a plugin changes it for every \
     tenant: it needs the operator's key (switchboard keys create --scope operator, on the host)";

fn require_admin(caller: &Caller) -> Result<(), ApiError> {
    if is_admin(&caller.key) {
        Ok(())
    } else {
        Err(ApiError::Forbidden(
            "this route needs a key with the `admin` scope (switchboard keys create --scope admin)"
                .into(),
        ))
    }
}

/// Lists the loaded plugins and the installed versions.
#[utoipa::path(
    get,
    operation_id = "listPlugins",
    path = "/v1/admin/plugins",
    tag = "admin",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Loaded plugins and installed versions", body = PluginListing),
        (status = 401, description = "Missing or unknown key", body = super::error::ErrorBody),
        (status = 403, description = "The key lacks the `admin` scope", body = super::error::ErrorBody),
        (status = 503, description = "Database unavailable", body = super::error::ErrorBody),
    )
)]
pub async fn list_plugins(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<axum::Json<PluginListing>, ApiError> {
    require_admin(&caller)?;
    let listing = plugin_listing(&state).await?;
    Ok(axum::Json(listing.seen_by(&caller.key)))
}

/// What `GET /v1/admin/plugins` lists (the caller's scope is checked before).
pub async fn plugin_listing(state: &AppState) -> Result<PluginListing, ApiError> {
    let versions = state
        .ingest
        .store
        .plugin_versions(None)
        .await
        .map_err(ApiError::from_store_read)?;
    Ok(PluginListing::of(&state.plugins, versions))
}

impl PluginListing {
    /// The listing as `key` may see it: the operator's names, key ids and files (who
    /// installed or promoted a version) only for the operator's key; a tenant's admin
    /// sees how (`cli`, `api`, `console`, `dir`), not who.
    pub fn seen_by(mut self, key: &ApiKeyRecord) -> Self {
        if is_operator(key) {
            return self;
        }
        for v in &mut self.installed {
            v.installed_by = installer_kind(&v.installed_by);
            // Word by word: who promoted a canary need not be a listed installer, and
            // one name may begin another.
            if let Some(result) = &mut v.canary_result {
                *result = without_installers(result);
            }
        }
        self
    }

    /// What serves each slug in `registry`, and the installed `versions`.
    pub fn of(registry: &Registry, versions: Vec<crate::store::PluginVersion>) -> Self {
        let canaries = registry.canaries();
        let loaded = registry
            .list()
            .into_iter()
            .map(|e| LoadedPlugin {
                slug: e.plugin.info().slug.clone(),
                version: e.plugin.info().version.clone(),
                digest: e.plugin.digest().to_string(),
                source: match e.source {
                    Source::Bundled => "bundled",
                    Source::Directory(_) => "directory",
                    Source::Installed { .. } => "installed",
                }
                .into(),
                kind: e.plugin.kind().as_str().into(),
                wit_version: e.plugin.wit_version().into(),
                canary: canaries
                    .iter()
                    .find(|(t, _)| t.slug == e.plugin.info().slug)
                    .map(|(t, p)| ServingCanary {
                        version: p.info().version.clone(),
                        digest: t.digest.clone(),
                        percent: t.percent,
                        since: t.since.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                    }),
                channels: e
                    .plugin
                    .info()
                    .channels
                    .iter()
                    .map(|c| crate::plugins::channel_name(c).to_string())
                    .collect(),
            })
            .collect();
        let installed = versions
            .into_iter()
            .map(|v| InstalledVersion {
                slug: v.slug,
                version: v.version,
                digest: v.digest,
                kind: v.kind.as_str().into(),
                state: v.state.as_str().into(),
                canary_percent: v.canary.map(|(percent, _)| percent),
                canary_since: v
                    .canary
                    .map(|(_, since)| since.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
                canary_result: v.canary_result,
                installed_by: v.installed_by,
                installed_at: v
                    .installed_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                outbound_hosts: v.outbound_hosts,
            })
            .collect();
        PluginListing { loaded, installed }
    }
}

/// The ways a version is installed, as `installed_by` begins (`<way>:<who>`).
const INSTALLERS: [&str; 4] = ["cli", "api", "console", "dir"];

/// The way of a `<way>:<who>` word, if it names one of [`INSTALLERS`].
fn way_of(word: &str) -> Option<&str> {
    let (way, _) = word.split_once(':')?;
    INSTALLERS.contains(&way).then_some(way)
}

/// How a version was installed (`cli`, `api`, `console`, `dir`), without who did it.
fn installer_kind(installed_by: &str) -> String {
    way_of(installed_by).unwrap_or("operator").to_string()
}

/// `text` with each `<way>:<who>` word cut to its way.
fn without_installers(text: &str) -> String {
    text.split(' ')
        .map(|word| way_of(word).unwrap_or(word))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Installs (or upgrades to) the component in the body and activates it once it
/// passes the conformance kit.
#[utoipa::path(
    post,
    operation_id = "installPlugin",
    path = "/v1/admin/plugins",
    tag = "admin",
    security(("bearer" = [])),
    params(
        ("approve_hosts" = Option<bool>, Query, description = "Refused when true (403): new outbound hosts are approved only on the host, with `switchboard plugin install --approve-hosts`"),
        ("canary" = Option<u8>, Query, description = "Install as a canary serving this share of the slug's events, 1 to 99 (%); it is promoted or rolled back on its own"),
    ),
    request_body(content = Vec<u8>, description = "The component (`.wasm`)", content_type = "application/wasm"),
    responses(
        (status = 201, description = "Installed and active, or serving as a canary", body = InstallResponse),
        (status = 400, description = "Not a provider component", body = super::error::ErrorBody),
        (status = 401, description = "Missing or unknown key", body = super::error::ErrorBody),
        (status = 403, description = "The key lacks the `operator` scope, or `approve_hosts` was asked for", body = super::error::ErrorBody),
        (status = 409, description = "A canary was asked for and cannot start: the slug has one running, or this version is active", body = super::error::ErrorBody),
        (status = 422, description = "`PLUGIN_REJECTED`: failed the conformance kit, new hosts without approval (the message is the report), or a native library (installed only with the CLI)", body = super::error::ErrorBody),
    )
)]
pub async fn install_plugin(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<InstallQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, axum::Json<InstallResponse>), ApiError> {
    require_operator(&caller)?;
    let Query(query) = query.map_err(|e| ApiError::BadRequest(format!("invalid query: {e}")))?;
    if query.approve_hosts {
        // A key that could both install code and widen where it may send data would
        // be one stolen secret away from exfiltrating every tenant's credentials.
        return Err(ApiError::Forbidden(
            "new outbound hosts are approved only on the host: \
             switchboard plugin install --approve-hosts"
                .into(),
        ));
    }
    let wasm = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge(state.config.max_body_bytes)
        } else {
            ApiError::BadRequest(format!("could not read the request body: {e}"))
        }
    })?;
    if let Some(percent) = query.canary {
        crate::plugins::trial::check_share(percent).map_err(ApiError::BadRequest)?;
    }
    let by = format!("api:{}", caller.key.id);
    caller.still_valid().await?;
    match install_component(&state, &wasm, &by, query.canary).await? {
        InstallOutcome::Activated {
            slug,
            version,
            digest,
            previous,
            ..
        } => Ok((
            StatusCode::CREATED,
            axum::Json(InstallResponse {
                status: "ACTIVE".into(),
                slug,
                version,
                digest,
                previous,
                canary_percent: None,
            }),
        )),
        InstallOutcome::Canary {
            slug,
            version,
            digest,
            percent,
        } => Ok((
            StatusCode::CREATED,
            axum::Json(InstallResponse {
                status: "CANARY".into(),
                slug,
                version,
                digest,
                previous: None,
                canary_percent: Some(percent),
            }),
        )),
        InstallOutcome::Rejected {
            slug,
            version,
            reason,
        } => Err(ApiError::PluginRejected(format!(
            "{slug} {version} rejected; the current version stays active\n{reason}"
        ))),
    }
}

/// Runs the conformance kit on a WebAssembly component and, when it passes, makes it
/// the slug's active version here and announces the swap to every process (the API's
/// install and the console's). The caller has checked the operator's authority.
pub async fn install_component(
    state: &AppState,
    wasm: &[u8],
    installed_by: &str,
    canary: Option<u8>,
) -> Result<InstallOutcome, ApiError> {
    if crate::plugins::artifact_kind(wasm) == crate::plugins::ArtifactKind::Native {
        // An API key must never be a way to run unsandboxed code in the gateway.
        return Err(ApiError::PluginRejected(
            "this is a native library: native plugins run unsandboxed, so only an operator \
             on the host installs them (`switchboard plugin install`, with the slug in \
             `plugins.native_trusted`); the admin API accepts WebAssembly components"
                .into(),
        ));
    }
    let runtime = crate::plugins::PluginRuntime::new(install::kit_runtime_config(&state.config))
        .map_err(ApiError::Internal)?;
    let outcome = install::install(
        &*state.ingest.store,
        &runtime,
        wasm,
        installed_by,
        false,
        canary,
        &Default::default(),
    )
    .await
    .map_err(|e| {
        let text = e.to_string();
        if text.starts_with("not a valid provider plugin") {
            return ApiError::BadRequest(text);
        }
        match e.downcast::<crate::store::StoreError>() {
            Ok(e) => ApiError::from_store_change(e),
            Err(e) => ApiError::Internal(e),
        }
    })?;
    if let InstallOutcome::Activated { slug, .. } | InstallOutcome::Canary { slug, .. } = &outcome {
        swapped(state, slug).await;
    }
    Ok(outcome)
}

/// Rolls `slug` back ([`install::rollback`], from `expected` only when given) and
/// announces the swap; what happened, in a line. The caller has checked the operator's
/// authority.
pub async fn rollback_plugin(
    state: &AppState,
    slug: &str,
    expected: Option<&str>,
) -> Result<String, ApiError> {
    let done = install::rollback(&*state.ingest.store, slug, expected)
        .await
        .map_err(|e| match e.downcast::<crate::store::StoreError>() {
            Ok(e) => ApiError::from_store_change(e),
            Err(e) => ApiError::ResourceNotFound(e.to_string()),
        })?;
    swapped(state, slug).await;
    Ok(done.trim_end().to_string())
}

/// This process switches now; the others when they hear the announcement (or within
/// `plugins.sync_ms`).
async fn swapped(state: &AppState, slug: &str) {
    if let Err(e) = state.plugins.sync(&*state.ingest.store).await {
        tracing::warn!(error = %e, "plugin sync after a swap failed");
    }
    state.announcer.announce(slug).await;
}

/// `POST /v1/admin/plugins/{slug}/rollback` success.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RollbackResponse {
    /// Always `ROLLED_BACK`.
    pub status: String,
    /// Slug.
    pub slug: String,
    /// What happened: the canary rolled back, the version now active, or that the
    /// bundled plugin serves again.
    pub detail: String,
}

/// Ends the slug's canary when it has one (the active version keeps serving);
/// otherwise rolls the slug back to the installed version that was active before, or,
/// when there is none, to its bundled (or directory) plugin.
#[utoipa::path(
    post,
    operation_id = "rollbackPlugin",
    path = "/v1/admin/plugins/{slug}/rollback",
    tag = "admin",
    security(("bearer" = [])),
    params(("slug" = String, Path, description = "The plugin's slug (`provc`, ...)")),
    responses(
        (status = 200, description = "Rolled back", body = RollbackResponse),
        (status = 400, description = "The slug is not valid text", body = super::error::ErrorBody),
        (status = 401, description = "Missing or unknown key", body = super::error::ErrorBody),
        (status = 403, description = "The key lacks the `operator` scope", body = super::error::ErrorBody),
        (status = 404, description = "The slug has no canary and no active installed version", body = super::error::ErrorBody),
        (status = 409, description = "A concurrent swap changed the slug's versions; nothing was changed", body = super::error::ErrorBody),
    )
)]
pub async fn rollback(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
) -> Result<axum::Json<RollbackResponse>, ApiError> {
    require_operator(&caller)?;
    let Path(typed) = path.map_err(|e| ApiError::BadRequest(format!("invalid slug: {e}")))?;
    // Typed as the spec writes it (`provC`), matched as stored, as the CLI does.
    let slug = crate::ids::canonical_slug(&typed);
    caller.still_valid().await?;
    let detail = rollback_plugin(&state, &slug, None).await?;
    Ok(axum::Json(RollbackResponse {
        status: "ROLLED_BACK".into(),
        slug,
        detail,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(slug: &str, by: &str, result: Option<&str>) -> InstalledVersion {
        InstalledVersion {
            slug: slug.into(),
            version: "1.0.0".into(),
            digest: "d".into(),
            kind: "wasm".into(),
            state: "active".into(),
            canary_percent: None,
            canary_since: None,
            canary_result: result.map(str::to_string),
            installed_by: by.into(),
            installed_at: "2026-12-03T00:00:00.000Z".into(),
            outbound_hosts: Vec::new(),
        }
    }

    #[test]
    fn a_tenant_admin_sees_how_a_version_was_installed_not_who_did_it() {
        let listing = PluginListing {
            loaded: Vec::new(),
            installed: vec![
                version("provc", "cli:ann", None),
                version(
                    "provc",
                    "api:key_1",
                    Some("promoted: promoted by cli:anna.smith before its trial ended"),
                ),
                version(
                    "provd",
                    "dir:/srv/my plugins/provd.wasm",
                    Some("promoted: promoted by console:key_9 before its trial ended"),
                ),
                version("prove", "unnamed", None),
            ],
        };
        let key = |scope: &str| ApiKeyRecord {
            id: crate::ids::ApiKeyId::generate(),
            workspace: crate::ids::WorkspaceId::generate(),
            tier: crate::model::Tier::Paid,
            mode: crate::model::KeyMode::Live,
            hint: "sb_live_…".into(),
            created_at: chrono::Utc::now(),
            revoked_at: None,
            scopes: vec![scope.into()],
        };
        let (admin, operator) = (
            key(crate::auth::SCOPE_ADMIN),
            key(crate::auth::SCOPE_OPERATOR),
        );

        let seen = listing.clone().seen_by(&admin);
        let by: Vec<&str> = seen
            .installed
            .iter()
            .map(|v| v.installed_by.as_str())
            .collect();
        assert_eq!(by, ["cli", "api", "dir", "operator"]);
        assert_eq!(
            seen.installed[1].canary_result.as_deref(),
            Some("promoted: promoted by cli before its trial ended")
        );
        // A promoter no listed version names is cut too.
        assert_eq!(
            seen.installed[2].canary_result.as_deref(),
            Some("promoted: promoted by console before its trial ended")
        );
        let text = serde_json::to_string(&seen).unwrap();
        for name in ["ann", "smith", "key_1", "key_9", "/srv", "plugins"] {
            assert!(!text.contains(name), "{name}: {text}");
        }
        assert_eq!(listing.clone().seen_by(&operator), listing);
    }
}
