//! Installed plugin versions: what each slug may run, and which version serves it.
//!
//! [`PluginVersions`] is what callers use; its rules (a version is inserted standby or
//! rejected and activated separately; activating a rejected or missing version changes
//! nothing; activating the active one changes nothing, not even `activated_at`) and the
//! decoding of rows are written once here, over [`PluginVersionsSql`], which each
//! backend implements with SQL and bindings only. How activation is made atomic is the
//! one thing that truly differs: PostgreSQL locks the slug's rows, SQLite's single
//! writer runs conditional updates one transaction at a time.

use super::StoreError;
use crate::plugins::PluginKind;
use chrono::{DateTime, Utc};

mod postgres;
mod sqlite;
#[cfg(test)]
pub(crate) mod tests;

/// The registry of installed plugin versions.
#[async_trait::async_trait]
pub trait PluginVersions: Send + Sync {
    /// Stores an installed plugin version with its component bytes. False (and nothing
    /// changed) when that slug already has a version with this digest.
    async fn insert_plugin_version(&self, version: &NewPluginVersion) -> Result<bool, StoreError>;
    /// Installed versions (without their bytes), of one slug or all, newest install
    /// first.
    async fn plugin_versions(&self, slug: Option<&str>) -> Result<Vec<PluginVersion>, StoreError>;
    /// The component bytes of one version.
    async fn plugin_wasm(&self, slug: &str, digest: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Makes one version the slug's active one, in one transaction: the slug's current
    /// active version (if another) becomes standby, this one active with
    /// `activated_at` = now. False when there is no such version or it was rejected.
    async fn activate_plugin_version(&self, slug: &str, digest: &str) -> Result<bool, StoreError>;
    /// Turns the slug's active version standby (the slug falls back to its bundled or
    /// directory plugin); false when it had none.
    async fn deactivate_plugin(&self, slug: &str) -> Result<bool, StoreError>;
    /// `(slug, digest)` of every active installed version: what every process polls to
    /// follow swaps.
    async fn active_plugin_versions(&self) -> Result<Vec<(String, String)>, StoreError>;
}

/// What each backend says in SQL. Timestamps are bound in the backend's own form.
#[async_trait::async_trait]
pub(crate) trait PluginVersionsSql: Send + Sync {
    /// Inserts the row unless `(slug, digest)` exists; whether it was inserted.
    async fn insert_version(
        &self,
        version: &NewPluginVersion,
        outbound_hosts: &str,
    ) -> Result<bool, StoreError>;
    /// Rows (without bytes), of one slug or all, newest install first.
    async fn version_rows(&self, slug: Option<&str>) -> Result<Vec<PluginVersionRow>, StoreError>;
    /// The bytes of one version.
    async fn version_bytes(&self, slug: &str, digest: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Atomically: when the version is standby, demotes the slug's active version and
    /// activates this one at `now`, returning `None`; otherwise changes nothing and
    /// returns the version's stored state (`Some(None)` when there is no such version).
    async fn activate_if_standby(
        &self,
        slug: &str,
        digest: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Option<String>>, StoreError>;
    /// Demotes the slug's active version; whether there was one.
    async fn demote_active(&self, slug: &str) -> Result<bool, StoreError>;
    /// `(slug, digest)` of every active version, by slug.
    async fn active_rows(&self) -> Result<Vec<(String, String)>, StoreError>;
}

/// A `plugin_versions` row without its bytes, as [`VERSION_COLUMNS`] selects it.
#[derive(sqlx::FromRow)]
pub(crate) struct PluginVersionRow {
    slug: String,
    version: String,
    digest: String,
    kind: String,
    /// JSON text.
    outbound_hosts: String,
    state: String,
    report: Option<String>,
    installed_by: String,
    installed_at: DateTime<Utc>,
    activated_at: Option<DateTime<Utc>>,
}

/// The columns of a [`PluginVersionRow`]; `{hosts}` is where the backend puts its
/// expression for the hosts as JSON text.
pub(crate) fn version_columns(hosts: &str) -> String {
    format!(
        "slug, version, digest, kind, {hosts} AS outbound_hosts, state, report, installed_by, \
         installed_at, activated_at"
    )
}

#[async_trait::async_trait]
impl<T: PluginVersionsSql> PluginVersions for T {
    async fn insert_plugin_version(&self, version: &NewPluginVersion) -> Result<bool, StoreError> {
        // Activation is `activate_plugin_version`'s (which demotes the slug's other
        // active version and sets `activated_at`).
        if version.state == PluginState::Active {
            return Err(StoreError::Other(format!(
                "plugin version {}@{} must be inserted standby or rejected, then activated",
                version.slug, version.digest
            )));
        }
        let hosts = serde_json::to_string(&version.outbound_hosts)
            .map_err(|e| StoreError::Other(format!("encoding outbound hosts: {e}")))?;
        self.insert_version(version, &hosts).await
    }

    async fn plugin_versions(&self, slug: Option<&str>) -> Result<Vec<PluginVersion>, StoreError> {
        self.version_rows(slug)
            .await?
            .into_iter()
            .map(TryInto::try_into)
            .collect()
    }

    async fn plugin_wasm(&self, slug: &str, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.version_bytes(slug, digest).await
    }

    async fn activate_plugin_version(&self, slug: &str, digest: &str) -> Result<bool, StoreError> {
        match self.activate_if_standby(slug, digest, Utc::now()).await? {
            None => Ok(true),
            // Missing or rejected: nothing to activate. Already active: nothing to change.
            Some(None) => Ok(false),
            Some(Some(state)) => Ok(decode_state(&state)? == PluginState::Active),
        }
    }

    async fn deactivate_plugin(&self, slug: &str) -> Result<bool, StoreError> {
        self.demote_active(slug).await
    }

    async fn active_plugin_versions(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.active_rows().await
    }
}

impl TryFrom<PluginVersionRow> for PluginVersion {
    type Error = StoreError;

    fn try_from(row: PluginVersionRow) -> Result<Self, StoreError> {
        Ok(PluginVersion {
            kind: PluginKind::parse(&row.kind)
                .ok_or_else(|| StoreError::Other(format!("unknown plugin kind {:?}", row.kind)))?,
            outbound_hosts: serde_json::from_str(&row.outbound_hosts)
                .map_err(|e| StoreError::Other(format!("stored outbound_hosts: {e}")))?,
            state: decode_state(&row.state)?,
            slug: row.slug,
            version: row.version,
            digest: row.digest,
            report: row.report,
            installed_by: row.installed_by,
            installed_at: row.installed_at,
            activated_at: row.activated_at,
        })
    }
}

fn decode_state(state: &str) -> Result<PluginState, StoreError> {
    PluginState::parse(state)
        .ok_or_else(|| StoreError::Other(format!("unknown plugin state {state:?}")))
}

/// Where an installed plugin version stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginState {
    /// Serving its slug on every process.
    Active,
    /// Installed and checked, not serving (an earlier or a newer version).
    Standby,
    /// Failed the conformance kit or widened its hosts without approval; never served.
    Rejected,
}

impl PluginState {
    /// Lower-case name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Standby => "standby",
            Self::Rejected => "rejected",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Active, Self::Standby, Self::Rejected]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

/// A plugin version to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPluginVersion {
    /// Slug from `info()`.
    pub slug: String,
    /// Version from `info()`.
    pub version: String,
    /// Hex SHA-256 of the component.
    pub digest: String,
    /// A component or a trusted native library, as the loaded plugin says.
    pub kind: PluginKind,
    /// The component (or native library).
    pub wasm: Vec<u8>,
    /// Hosts the version declares.
    pub outbound_hosts: Vec<String>,
    /// Initial state (`Standby` or `Rejected`; activation is a separate step).
    pub state: PluginState,
    /// Why it was rejected (the conformance report), if it was.
    pub report: Option<String>,
    /// Who installed it (`cli:<user>`, `api:<key id>`, `dir:<file>`).
    pub installed_by: String,
    /// When.
    pub installed_at: DateTime<Utc>,
}

/// A stored plugin version, without its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginVersion {
    /// Slug.
    pub slug: String,
    /// Version.
    pub version: String,
    /// Hex SHA-256 of the component.
    pub digest: String,
    /// A component or a trusted native library.
    pub kind: PluginKind,
    /// Hosts it declares.
    pub outbound_hosts: Vec<String>,
    /// State.
    pub state: PluginState,
    /// Rejection report.
    pub report: Option<String>,
    /// Who installed it.
    pub installed_by: String,
    /// When.
    pub installed_at: DateTime<Utc>,
    /// When it last became active.
    pub activated_at: Option<DateTime<Utc>>,
}
