//! Workspace configuration: workflows, provider routes, the voice DND list and
//! provider webhook secrets.
//!
//! [`Configuration`] is what callers use; encoding, decoding and the small rules
//! (a provider-wide secret is stored under the empty workspace id) are written once
//! here, over [`ConfigurationSql`], which each backend implements with SQL and
//! bindings only (`postgres.rs`, `sqlite.rs`).

use super::{StoreError, WebhookSecret, decode_json, now_micros};
use crate::ids::WorkspaceId;
use crate::model::{DndEntry, ProviderRoute};
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

mod postgres;
mod sqlite;
#[cfg(test)]
pub(crate) mod tests;

/// A workspace's workflows, routes and DND list, and every provider's webhook secrets.
#[async_trait::async_trait]
pub trait Configuration: Send + Sync {
    /// Creates or replaces a workflow definition (a JSON document).
    async fn put_workflow(
        &self,
        workspace: &WorkspaceId,
        name: &str,
        definition: &serde_json::Value,
    ) -> Result<(), StoreError>;
    /// One workflow's definition.
    async fn workflow(
        &self,
        workspace: &WorkspaceId,
        name: &str,
    ) -> Result<Option<serde_json::Value>, StoreError>;
    /// Every workflow of a workspace, by name (byte order): (name, definition,
    /// updated_at).
    async fn list_workflows(
        &self,
        workspace: &WorkspaceId,
    ) -> Result<Vec<(String, serde_json::Value, DateTime<Utc>)>, StoreError>;

    /// Replaces the provider route of one channel (`sms`, ...).
    async fn put_provider_route(
        &self,
        workspace: &WorkspaceId,
        channel: &str,
        providers: &[ProviderRoute],
    ) -> Result<(), StoreError>;
    /// Every configured channel route of a workspace.
    async fn provider_routes(
        &self,
        workspace: &WorkspaceId,
    ) -> Result<BTreeMap<String, Vec<ProviderRoute>>, StoreError>;

    /// Adds a number (by digest, with its masked form) to the voice DND list; false if
    /// it was already there.
    async fn dnd_add(
        &self,
        workspace: &WorkspaceId,
        phone_hash: &str,
        phone_masked: &str,
    ) -> Result<bool, StoreError>;
    /// Removes a number; false if it was not listed.
    async fn dnd_remove(
        &self,
        workspace: &WorkspaceId,
        phone_hash: &str,
    ) -> Result<bool, StoreError>;
    /// The list, oldest first (ties in insertion order).
    async fn dnd_list(&self, workspace: &WorkspaceId) -> Result<Vec<DndEntry>, StoreError>;
    /// Whether a number (by digest) is listed.
    async fn dnd_contains(
        &self,
        workspace: &WorkspaceId,
        phone_hash: &str,
    ) -> Result<bool, StoreError>;

    /// Creates or replaces the webhook secret of `provider`, for one workspace or (with
    /// `None`) provider-wide.
    async fn put_webhook_secret(
        &self,
        provider: &str,
        workspace: Option<&WorkspaceId>,
        secret: &str,
    ) -> Result<(), StoreError>;
    /// Every webhook secret of `provider`: workspace secrets first (oldest first), the
    /// provider-wide one last.
    async fn webhook_secrets(&self, provider: &str) -> Result<Vec<WebhookSecret>, StoreError>;
}

/// A `workflows` row; `definition` is JSON text.
#[derive(sqlx::FromRow)]
pub(crate) struct WorkflowRow {
    name: String,
    definition: String,
    updated_at: DateTime<Utc>,
}

/// A `provider_routes` row; `providers` is JSON text.
#[derive(sqlx::FromRow)]
pub(crate) struct RouteRow {
    channel: String,
    providers: String,
}

/// A `dnd_numbers` row as listed.
#[derive(sqlx::FromRow)]
pub(crate) struct DndRow {
    phone_masked: String,
    created_at: DateTime<Utc>,
}

/// A `webhook_secrets` row; `workspace_id` is empty for the provider-wide secret.
#[derive(sqlx::FromRow)]
pub(crate) struct SecretRow {
    provider: String,
    workspace_id: String,
    secret: String,
    updated_at: DateTime<Utc>,
}

/// What each backend says in SQL. JSON arrives as text; timestamps are bound in the
/// backend's own form.
#[async_trait::async_trait]
pub(crate) trait ConfigurationSql: Send + Sync {
    /// Inserts or replaces a workflow.
    async fn upsert_workflow(
        &self,
        workspace: &WorkspaceId,
        name: &str,
        definition: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;
    /// One workflow's definition.
    async fn workflow_definition(
        &self,
        workspace: &WorkspaceId,
        name: &str,
    ) -> Result<Option<String>, StoreError>;
    /// A workspace's workflows in byte order of their names.
    async fn workflow_rows(&self, workspace: &WorkspaceId) -> Result<Vec<WorkflowRow>, StoreError>;
    /// Inserts or replaces a channel's route.
    async fn upsert_route(
        &self,
        workspace: &WorkspaceId,
        channel: &str,
        providers: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;
    /// A workspace's routes.
    async fn route_rows(&self, workspace: &WorkspaceId) -> Result<Vec<RouteRow>, StoreError>;
    /// Inserts a DND number unless listed; whether a row was inserted.
    async fn insert_dnd(
        &self,
        workspace: &WorkspaceId,
        phone_hash: &str,
        phone_masked: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError>;
    /// Deletes a DND number; whether a row was deleted.
    async fn delete_dnd(
        &self,
        workspace: &WorkspaceId,
        phone_hash: &str,
    ) -> Result<bool, StoreError>;
    /// A workspace's DND rows, oldest first, ties in insertion order.
    async fn dnd_rows(&self, workspace: &WorkspaceId) -> Result<Vec<DndRow>, StoreError>;
    /// Whether a DND row exists.
    async fn dnd_exists(
        &self,
        workspace: &WorkspaceId,
        phone_hash: &str,
    ) -> Result<bool, StoreError>;
    /// Inserts or replaces a secret (`workspace_id` empty: provider-wide).
    async fn upsert_secret(
        &self,
        provider: &str,
        workspace_id: &str,
        secret: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;
    /// A provider's secrets: workspace ones oldest first, then the provider-wide one.
    async fn secret_rows(&self, provider: &str) -> Result<Vec<SecretRow>, StoreError>;
}

fn encode<T: serde::Serialize + ?Sized>(value: &T, what: &str) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Other(format!("encoding {what}: {e}")))
}

#[async_trait::async_trait]
impl<T: ConfigurationSql> Configuration for T {
    async fn put_workflow(
        &self,
        workspace: &WorkspaceId,
        name: &str,
        definition: &serde_json::Value,
    ) -> Result<(), StoreError> {
        let definition = encode(definition, "workflow")?;
        self.upsert_workflow(workspace, name, &definition, now_micros())
            .await
    }

    async fn workflow(
        &self,
        workspace: &WorkspaceId,
        name: &str,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        self.workflow_definition(workspace, name)
            .await?
            .map(|d| decode_json(&d, "workflow definition"))
            .transpose()
    }

    async fn list_workflows(
        &self,
        workspace: &WorkspaceId,
    ) -> Result<Vec<(String, serde_json::Value, DateTime<Utc>)>, StoreError> {
        self.workflow_rows(workspace)
            .await?
            .into_iter()
            .map(|row| {
                let definition = decode_json(&row.definition, "workflow definition")?;
                Ok((row.name, definition, row.updated_at))
            })
            .collect()
    }

    async fn put_provider_route(
        &self,
        workspace: &WorkspaceId,
        channel: &str,
        providers: &[ProviderRoute],
    ) -> Result<(), StoreError> {
        let providers = encode(providers, "provider route")?;
        self.upsert_route(workspace, channel, &providers, now_micros())
            .await
    }

    async fn provider_routes(
        &self,
        workspace: &WorkspaceId,
    ) -> Result<BTreeMap<String, Vec<ProviderRoute>>, StoreError> {
        self.route_rows(workspace)
            .await?
            .into_iter()
            .map(|row| Ok((row.channel, decode_json(&row.providers, "provider route")?)))
            .collect()
    }

    async fn dnd_add(
        &self,
        workspace: &WorkspaceId,
        phone_hash: &str,
        phone_masked: &str,
    ) -> Result<bool, StoreError> {
        self.insert_dnd(workspace, phone_hash, phone_masked, now_micros())
            .await
    }

    async fn dnd_remove(
        &self,
        workspace: &WorkspaceId,
        phone_hash: &str,
    ) -> Result<bool, StoreError> {
        self.delete_dnd(workspace, phone_hash).await
    }

    async fn dnd_list(&self, workspace: &WorkspaceId) -> Result<Vec<DndEntry>, StoreError> {
        Ok(self
            .dnd_rows(workspace)
            .await?
            .into_iter()
            .map(|row| DndEntry {
                phone_masked: row.phone_masked,
                created_at: row.created_at,
            })
            .collect())
    }

    async fn dnd_contains(
        &self,
        workspace: &WorkspaceId,
        phone_hash: &str,
    ) -> Result<bool, StoreError> {
        self.dnd_exists(workspace, phone_hash).await
    }

    async fn put_webhook_secret(
        &self,
        provider: &str,
        workspace: Option<&WorkspaceId>,
        secret: &str,
    ) -> Result<(), StoreError> {
        // The empty id stands for "provider-wide": a key column cannot hold NULL.
        let workspace_id = workspace.map_or("", WorkspaceId::as_str);
        self.upsert_secret(provider, workspace_id, secret, now_micros())
            .await
    }

    async fn webhook_secrets(&self, provider: &str) -> Result<Vec<WebhookSecret>, StoreError> {
        self.secret_rows(provider)
            .await?
            .into_iter()
            .map(|row| {
                Ok(WebhookSecret {
                    provider: row.provider,
                    workspace: match row.workspace_id.as_str() {
                        "" => None,
                        ws => Some(WorkspaceId::parse(ws).map_err(super::corrupt)?),
                    },
                    secret: row.secret,
                    updated_at: row.updated_at,
                })
            })
            .collect()
    }
}
