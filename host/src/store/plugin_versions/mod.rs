//! Installed plugin versions: what each slug may run, and which version serves it.
//!
//! [`PluginVersions`] is what callers use; its rules (a version is inserted standby or
//! rejected and activated separately; activating a rejected or missing version changes
//! nothing; activating the active one changes nothing, not even `activated_at`; a
//! canary starts only from standby and only while its slug has none, and ends
//! promoted or rolled back exactly once) and the
//! decoding of rows are written once here, over [`PluginVersionsSql`] and [`SlugSql`],
//! which each backend implements with SQL and bindings only. An activation or the end
//! of a trial reads the slug's versions and changes them in one batch of its own of the
//! store's group commit ([`GroupCommit::run_alone`](crate::store::group::GroupCommit::run_alone)):
//! PostgreSQL locks the slug's rows as it reads them (waiting at most 2 s for them),
//! SQLite's batch holds its one write lock from the start; either way such changes of
//! one slug run one at a time, each on the states the one before it committed. Once
//! queued, such a change runs to its end even if its caller has stopped waiting.

use super::StoreError;
use crate::plugins::PluginKind;
use crate::store::group::{Conn, Grouped};
use chrono::{DateTime, Utc};
use std::sync::Arc;

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
    /// Makes a standby version its slug's canary, serving `percent` (1-99) of the
    /// slug's events from now. Refused (nothing changed) when the version is not
    /// standby or the slug has another canary: [`CanaryStart`] says which.
    async fn start_canary(
        &self,
        slug: &str,
        digest: &str,
        percent: u8,
    ) -> Result<CanaryStart, StoreError>;
    /// Ends the trial of canary `digest` of `slug` that began at `since`, with
    /// `result` recorded: promoted (it becomes the active version, the old one
    /// standby) or rolled back (standby). False, and nothing changed, when that trial
    /// is not running (another process ended it first, or it was ended and started
    /// again: a verdict on the old trial must not end the new one).
    async fn end_canary(
        &self,
        slug: &str,
        digest: &str,
        since: DateTime<Utc>,
        promote: bool,
        result: &str,
    ) -> Result<bool, StoreError>;
    /// Every running canary, by slug: what every process polls beside the active set.
    async fn canary_plugin_versions(&self) -> Result<Vec<CanaryTrial>, StoreError>;
}

/// What [`PluginVersions::start_canary`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CanaryStart {
    /// The version is the slug's canary now.
    Started,
    /// The version is not standby: its state (`None`: no such version).
    NotStandby(Option<PluginState>),
    /// The slug already has a canary: its digest.
    Busy(String),
}

/// A running canary.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct CanaryTrial {
    /// Slug.
    pub slug: String,
    /// The canary version's digest.
    pub digest: String,
    /// Share of the slug's events it serves, 1-99.
    pub percent: i64,
    /// When the trial began.
    pub since: DateTime<Utc>,
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
    /// Demotes the slug's active version; whether there was one.
    async fn demote_active(&self, slug: &str) -> Result<bool, StoreError>;
    /// `(slug, digest)` of every active version, by slug.
    async fn active_rows(&self) -> Result<Vec<(String, String)>, StoreError>;
    /// Makes the version a canary when it is standby and the slug has no canary;
    /// whether it did.
    async fn canary_if_free(
        &self,
        slug: &str,
        digest: &str,
        percent: u8,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError>;
    /// Every canary as a [`CanaryTrial`] (columns `slug, digest, percent, since`), by slug.
    async fn canary_rows(&self) -> Result<Vec<CanaryTrial>, StoreError>;
}

/// What each backend says in SQL inside a batch of the group commit, for the changes
/// that depend on the slug's other versions.
#[async_trait::async_trait]
pub(crate) trait SlugSql: Send {
    /// Every version of `slug`, by digest; on PostgreSQL locked to the end of the batch
    /// (in digest order, the same for every caller, so two changes cannot deadlock).
    async fn slug_states(&mut self, slug: &str) -> Result<Vec<SlugState>, StoreError>;
    /// Turns the slug's active version, if any, standby.
    async fn demote_active_in(&mut self, slug: &str) -> Result<(), StoreError>;
    /// Makes the version active, activated at `now`.
    async fn set_active(
        &mut self,
        slug: &str,
        digest: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;
    /// Clears the version's trial, records `result`, and puts it in `state` (activated
    /// at `now` when that is [`PluginState::Active`]).
    async fn end_trial(
        &mut self,
        slug: &str,
        digest: &str,
        state: PluginState,
        result: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;
}

/// One version of a slug as [`SlugSql::slug_states`] reads it.
#[derive(sqlx::FromRow)]
pub(crate) struct SlugState {
    digest: String,
    state: String,
    canary_since: Option<DateTime<Utc>>,
}

/// What activating `digest` does, given its slug's versions: `Ok(())` when it is
/// standby (activate it); otherwise its stored state (`None` when there is no such
/// version), and nothing changes.
fn activation(states: Vec<SlugState>, digest: &str) -> Result<(), Option<String>> {
    let state = states
        .into_iter()
        .find(|s| s.digest == digest)
        .map(|s| s.state);
    match state.as_deref() {
        Some(s) if s == PluginState::Standby.as_str() => Ok(()),
        _ => Err(state),
    }
}

/// Whether `digest` is its slug's canary in the trial that began at `since`.
fn trial_running(states: &[SlugState], digest: &str, since: DateTime<Utc>) -> bool {
    states.iter().any(|s| {
        s.digest == digest
            && s.state == PluginState::Canary.as_str()
            && s.canary_since == Some(since)
    })
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
    canary_percent: Option<i64>,
    canary_since: Option<DateTime<Utc>>,
    canary_result: Option<String>,
}

/// The columns of a [`PluginVersionRow`]; `{hosts}` is where the backend puts its
/// expression for the hosts as JSON text.
pub(crate) fn version_columns(hosts: &str) -> String {
    format!(
        "slug, version, digest, kind, {hosts} AS outbound_hosts, state, report, installed_by, \
         installed_at, activated_at, canary_percent, canary_since, canary_result"
    )
}

#[async_trait::async_trait]
impl<T> PluginVersions for T
where
    T: PluginVersionsSql + Grouped,
    Conn<T>: SlugSql,
{
    async fn insert_plugin_version(&self, version: &NewPluginVersion) -> Result<bool, StoreError> {
        // Activation is `activate_plugin_version`'s (which demotes the slug's other
        // active version and sets `activated_at`).
        if matches!(version.state, PluginState::Active | PluginState::Canary) {
            return Err(StoreError::Other(format!(
                "plugin version {}@{} must be inserted standby or rejected, then activated \
                 (or made a canary)",
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
        let args = Arc::new((slug.to_string(), digest.to_string()));
        let now = Utc::now();
        let refused = self
            .group()
            .run_alone(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move {
                    let (slug, digest) = &*args;
                    let states = conn.slug_states(slug).await?;
                    if let Err(state) = activation(states, digest) {
                        return Ok(Some(state));
                    }
                    // The old active version first: the unique index on active rows
                    // is checked row by row.
                    conn.demote_active_in(slug).await?;
                    conn.set_active(slug, digest, now).await?;
                    Ok(None)
                })
            }))
            .await?;
        match refused {
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

    async fn start_canary(
        &self,
        slug: &str,
        digest: &str,
        percent: u8,
    ) -> Result<CanaryStart, StoreError> {
        crate::plugins::trial::check_share(percent).map_err(StoreError::Other)?;
        if self
            .canary_if_free(slug, digest, percent, Utc::now())
            .await?
        {
            return Ok(CanaryStart::Started);
        }
        // Nothing was written: say why.
        let versions = self.plugin_versions(Some(slug)).await?;
        let state = versions
            .iter()
            .find(|v| v.digest == digest)
            .map(|v| v.state);
        match versions
            .into_iter()
            .find(|v| v.state == PluginState::Canary)
        {
            Some(other) if state == Some(PluginState::Standby) => {
                Ok(CanaryStart::Busy(other.digest))
            }
            _ => Ok(CanaryStart::NotStandby(state)),
        }
    }

    async fn end_canary(
        &self,
        slug: &str,
        digest: &str,
        since: DateTime<Utc>,
        promote: bool,
        result: &str,
    ) -> Result<bool, StoreError> {
        let args = Arc::new((slug.to_string(), digest.to_string(), result.to_string()));
        let now = Utc::now();
        self.group()
            .run_alone(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move {
                    let (slug, digest, result) = &*args;
                    let states = conn.slug_states(slug).await?;
                    if !trial_running(&states, digest, since) {
                        return Ok(false);
                    }
                    let state = if promote {
                        conn.demote_active_in(slug).await?;
                        PluginState::Active
                    } else {
                        PluginState::Standby
                    };
                    conn.end_trial(slug, digest, state, result, now).await?;
                    Ok(true)
                })
            }))
            .await
    }

    async fn canary_plugin_versions(&self) -> Result<Vec<CanaryTrial>, StoreError> {
        self.canary_rows().await
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
            canary: match (row.canary_percent, row.canary_since) {
                (Some(percent), Some(since)) => Some((percent, since)),
                _ => None,
            },
            canary_result: row.canary_result,
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
    /// Serving a share of its slug's events beside the active version while the two
    /// are compared; promoted or rolled back on its own (see `crate::canary`).
    Canary,
}

impl PluginState {
    /// Lower-case name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Standby => "standby",
            Self::Rejected => "rejected",
            Self::Canary => "canary",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Active, Self::Standby, Self::Rejected, Self::Canary]
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
    /// While it is a canary: the share of events it serves (1-99) and since when.
    pub canary: Option<(i64, DateTime<Utc>)>,
    /// How its last canary trial ended, if it had one.
    pub canary_result: Option<String>,
}
