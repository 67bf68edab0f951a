//! Callers' webhook endpoints: where a workspace's delivery events are posted, and the
//! secrets that sign them.
//!
//! [`Endpoints`] is what callers use; the rules (a patch or a rotation applied to what
//! is stored, retried when a concurrent change got there first) and the decoding are
//! written once here, over [`EndpointsSql`], which each backend implements with SQL and
//! bindings only (`postgres.rs`, `sqlite.rs`).

use super::{StoreError, decode_json, now_micros};
use crate::ids::{EndpointId, WorkspaceId};
use chrono::{DateTime, Utc};

pub(crate) mod postgres;
pub(crate) mod sqlite;
#[cfg(test)]
pub(crate) mod tests;

/// A webhook endpoint as stored. Its `Debug` form hides the secrets.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `ep_…`.
    pub id: EndpointId,
    /// The workspace whose events it receives.
    pub workspace: WorkspaceId,
    /// Where events are posted.
    pub url: String,
    /// Free text for people.
    pub description: Option<String>,
    /// The event types it receives; `None` for every type.
    pub event_types: Option<Vec<String>>,
    /// Receives nothing while set.
    pub disabled: bool,
    /// Why it was disabled by the gateway (`None` when a caller disabled it).
    pub disabled_reason: Option<String>,
    /// Signs every request (`whsec_…`).
    pub secret: String,
    /// The secret before the last rotation and until when it still signs.
    pub previous_secret: Option<(String, DateTime<Utc>)>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("id", &self.id)
            .field("workspace", &self.workspace)
            .field("url", &self.url)
            .field("event_types", &self.event_types)
            .field("disabled", &self.disabled)
            .field("secret", &"***")
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// The secrets that sign a request sent at `now`: the current one, and the one
    /// before it while its overlap lasts.
    pub fn signing_secrets(&self, now: DateTime<Utc>) -> Vec<&str> {
        let mut secrets = vec![self.secret.as_str()];
        if let Some((previous, until)) = &self.previous_secret
            && now < *until
        {
            secrets.push(previous.as_str());
        }
        secrets
    }
}

/// A change to an endpoint; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointPatch {
    /// New URL.
    pub url: Option<String>,
    /// New description (`Some(None)` clears it).
    pub description: Option<Option<String>>,
    /// New event types (`Some(None)`: every type).
    pub event_types: Option<Option<Vec<String>>>,
    /// Disable or enable; enabling clears the gateway's reason.
    pub disabled: Option<bool>,
}

/// The rule of a patch, on what is stored.
pub fn apply_patch(endpoint: &mut Endpoint, patch: &EndpointPatch) {
    if let Some(url) = &patch.url {
        endpoint.url = url.clone();
    }
    if let Some(description) = &patch.description {
        endpoint.description = description.clone();
    }
    if let Some(types) = &patch.event_types {
        endpoint.event_types = types.clone();
    }
    if let Some(disabled) = patch.disabled {
        endpoint.disabled = disabled;
        if !disabled {
            endpoint.disabled_reason = None;
        }
    }
}

/// The rule of a rotation: `secret` signs from now on, the old one alongside it until
/// `until` (a rotation during an overlap ends the older secret's).
pub fn apply_rotation(endpoint: &mut Endpoint, secret: String, until: DateTime<Utc>) {
    let old = std::mem::replace(&mut endpoint.secret, secret);
    endpoint.previous_secret = Some((old, until));
}

/// A workspace's webhook endpoints.
#[async_trait::async_trait]
pub trait Endpoints: Send + Sync {
    /// Stores a new endpoint unless its workspace has `most` already (then false).
    /// Creates in one workspace are serialised, so concurrent ones never pass `most`.
    async fn create_endpoint(&self, endpoint: &Endpoint, most: usize) -> Result<bool, StoreError>;
    /// One endpoint of `workspace`.
    async fn endpoint(
        &self,
        workspace: &WorkspaceId,
        id: &EndpointId,
    ) -> Result<Option<Endpoint>, StoreError>;
    /// Up to `limit` endpoints of `workspace`, newest first, older than `before`.
    async fn list_endpoints(
        &self,
        workspace: &WorkspaceId,
        before: Option<&EndpointId>,
        limit: u32,
    ) -> Result<Vec<Endpoint>, StoreError>;
    /// Applies `patch`; the endpoint as it is now, `None` when there is no such
    /// endpoint in `workspace`.
    async fn patch_endpoint(
        &self,
        workspace: &WorkspaceId,
        id: &EndpointId,
        patch: &EndpointPatch,
    ) -> Result<Option<Endpoint>, StoreError>;
    /// Makes `secret` the signing secret, the old one signing too until `until`.
    async fn rotate_endpoint_secret(
        &self,
        workspace: &WorkspaceId,
        id: &EndpointId,
        secret: &str,
        until: DateTime<Utc>,
    ) -> Result<Option<Endpoint>, StoreError>;
    /// Deletes an endpoint; whether there was one.
    async fn delete_endpoint(
        &self,
        workspace: &WorkspaceId,
        id: &EndpointId,
    ) -> Result<bool, StoreError>;
}

/// A `webhook_endpoints` row; `event_types` is JSON text. (No `Debug`: it holds the
/// secrets.)
#[derive(Clone, sqlx::FromRow)]
pub(crate) struct EndpointRow {
    pub(crate) id: String,
    pub(crate) workspace_id: String,
    pub(crate) url: String,
    pub(crate) description: Option<String>,
    pub(crate) event_types: Option<String>,
    pub(crate) disabled: bool,
    pub(crate) disabled_reason: Option<String>,
    pub(crate) secret: String,
    pub(crate) previous_secret: Option<String>,
    pub(crate) previous_expires_at: Option<DateTime<Utc>>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
}

/// What each backend says in SQL.
#[async_trait::async_trait]
pub(crate) trait EndpointsSql: Send + Sync {
    /// Inserts a row unless its workspace has `most` rows already (then false), with
    /// concurrent inserts in one workspace serialised.
    async fn insert_endpoint_row(&self, row: &EndpointRow, most: i64) -> Result<bool, StoreError>;
    /// One row of `workspace`.
    async fn endpoint_row(
        &self,
        workspace: &WorkspaceId,
        id: &str,
    ) -> Result<Option<EndpointRow>, StoreError>;
    /// Up to `limit` rows of `workspace` by `id` descending, below `before`.
    async fn endpoint_rows(
        &self,
        workspace: &WorkspaceId,
        before: Option<&str>,
        limit: i64,
    ) -> Result<Vec<EndpointRow>, StoreError>;
    /// Writes every changeable column of `row` if its stored `updated_at` is still
    /// `seen`; whether it did.
    async fn replace_endpoint_row(
        &self,
        row: &EndpointRow,
        seen: DateTime<Utc>,
    ) -> Result<bool, StoreError>;
    /// Deletes a row of `workspace`; whether there was one.
    async fn delete_endpoint_row(
        &self,
        workspace: &WorkspaceId,
        id: &str,
    ) -> Result<bool, StoreError>;
}

impl TryFrom<EndpointRow> for Endpoint {
    type Error = StoreError;

    fn try_from(row: EndpointRow) -> Result<Self, StoreError> {
        Ok(Endpoint {
            id: EndpointId::parse(&row.id).map_err(super::corrupt)?,
            workspace: WorkspaceId::parse(&row.workspace_id).map_err(super::corrupt)?,
            url: row.url,
            description: row.description,
            event_types: row
                .event_types
                .map(|t| decode_json(&t, "event_types"))
                .transpose()?,
            disabled: row.disabled,
            disabled_reason: row.disabled_reason,
            secret: row.secret,
            previous_secret: row.previous_secret.zip(row.previous_expires_at),
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }
}

fn to_row(e: &Endpoint) -> Result<EndpointRow, StoreError> {
    Ok(EndpointRow {
        id: e.id.to_string(),
        workspace_id: e.workspace.to_string(),
        url: e.url.clone(),
        description: e.description.clone(),
        event_types: e
            .event_types
            .as_ref()
            .map(|t| {
                serde_json::to_string(t)
                    .map_err(|e| StoreError::Other(format!("encoding event_types: {e}")))
            })
            .transpose()?,
        disabled: e.disabled,
        disabled_reason: e.disabled_reason.clone(),
        secret: e.secret.clone(),
        previous_secret: e.previous_secret.as_ref().map(|(s, _)| s.clone()),
        previous_expires_at: e.previous_secret.as_ref().map(|(_, t)| *t),
        created_at: e.created_at,
        updated_at: e.updated_at,
    })
}

/// Concurrent changes one change gives way to before it reports a conflict.
const CHANGE_TRIES: usize = 8;

/// Reads the endpoint, applies `change`, and writes it if nobody changed it since;
/// again from a fresh read when somebody did.
async fn change<T: EndpointsSql + ?Sized>(
    sql: &T,
    workspace: &WorkspaceId,
    id: &EndpointId,
    change: impl Fn(&mut Endpoint),
) -> Result<Option<Endpoint>, StoreError> {
    for _ in 0..CHANGE_TRIES {
        let Some(row) = sql.endpoint_row(workspace, id.as_str()).await? else {
            return Ok(None);
        };
        let seen = row.updated_at;
        let mut endpoint = Endpoint::try_from(row)?;
        change(&mut endpoint);
        // Strictly later than what was seen, so the next change's check tells them apart.
        endpoint.updated_at = now_micros().max(seen + chrono::Duration::microseconds(1));
        if sql.replace_endpoint_row(&to_row(&endpoint)?, seen).await? {
            return Ok(Some(endpoint));
        }
    }
    Err(StoreError::Conflict(format!(
        "endpoint {id} kept changing; try again"
    )))
}

#[async_trait::async_trait]
impl<T: EndpointsSql> Endpoints for T {
    async fn create_endpoint(&self, endpoint: &Endpoint, most: usize) -> Result<bool, StoreError> {
        let most = i64::try_from(most).unwrap_or(i64::MAX);
        self.insert_endpoint_row(&to_row(endpoint)?, most).await
    }

    async fn endpoint(
        &self,
        workspace: &WorkspaceId,
        id: &EndpointId,
    ) -> Result<Option<Endpoint>, StoreError> {
        self.endpoint_row(workspace, id.as_str())
            .await?
            .map(Endpoint::try_from)
            .transpose()
    }

    async fn list_endpoints(
        &self,
        workspace: &WorkspaceId,
        before: Option<&EndpointId>,
        limit: u32,
    ) -> Result<Vec<Endpoint>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.endpoint_rows(workspace, before.map(|b| b.as_str()), i64::from(limit))
            .await?
            .into_iter()
            .map(Endpoint::try_from)
            .collect()
    }

    async fn patch_endpoint(
        &self,
        workspace: &WorkspaceId,
        id: &EndpointId,
        patch: &EndpointPatch,
    ) -> Result<Option<Endpoint>, StoreError> {
        change(self, workspace, id, |e| apply_patch(e, patch)).await
    }

    async fn rotate_endpoint_secret(
        &self,
        workspace: &WorkspaceId,
        id: &EndpointId,
        secret: &str,
        until: DateTime<Utc>,
    ) -> Result<Option<Endpoint>, StoreError> {
        change(self, workspace, id, |e| {
            apply_rotation(e, secret.to_string(), until)
        })
        .await
    }

    async fn delete_endpoint(
        &self,
        workspace: &WorkspaceId,
        id: &EndpointId,
    ) -> Result<bool, StoreError> {
        self.delete_endpoint_row(workspace, id.as_str()).await
    }
}
