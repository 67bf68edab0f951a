//! [`DeliverySql`] on SQLite. Every transaction here holds the file's write lock from
//! its start (the group commit begins `IMMEDIATE`), so nothing needs a row lock; the
//! process clock dates leases, stored in the fixed-width text form.
//!
//! The statements a delivery runs every time are written for the connection's handle
//! ([`Direct`]), one row at a time on statements prepared once: the set-based rules then
//! cost one hand-off to sqlx's thread per batch. The rare ones stay sqlx's.

use super::{
    AttemptFinish, AttemptRow, AttemptStart, ClaimRequest, DeliveryBatch, DeliverySql, LeaseRow,
    LeasedUpdate, StepRequest, SubscriberUpsert, claim_all, record_steps_all,
};
use crate::ids::{EventId, WorkspaceId};
use crate::model::{AttemptState, Claim, MessageStatus, NewMessage};
use crate::store::direct::{Direct, map_err as direct_err};
use crate::store::sqlite::{encode_timestamp, map_err, now_text};
use crate::store::{StoreError, now_micros};
use rusqlite::{OptionalExtension, params};
use sqlx::SqliteConnection;
use std::time::Duration;

/// The stored form of now + `lease`; a lease too long to represent is refused.
fn deadline(lease: Duration) -> Result<String, StoreError> {
    chrono::Duration::from_std(lease)
        .ok()
        .and_then(|lease| now_micros().checked_add_signed(lease))
        .map(|t| encode_timestamp(&t))
        .ok_or_else(|| StoreError::Other(format!("lease of {lease:?} is out of range")))
}

#[async_trait::async_trait]
impl DeliveryBatch for SqliteConnection {
    async fn claim_batch(&mut self, requests: &[ClaimRequest]) -> Result<Vec<Claim>, StoreError> {
        claim_all(&mut Direct::new(self), requests).await
    }

    async fn step_batch(
        &mut self,
        requests: &[StepRequest],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        record_steps_all(&mut Direct::new(self), requests).await
    }
}

#[async_trait::async_trait]
impl DeliverySql for Direct<'_> {
    async fn insert_messages_if_absent(
        &mut self,
        messages: &[&NewMessage],
    ) -> Result<Vec<String>, StoreError> {
        let mut insert = self
            .statement(
                "INSERT INTO messages (event_id, workspace_id, event_name, subscriber_id, \
                 category, priority, channel, status, test_mode, variables_keys, created_at, \
                 updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11) \
                 ON CONFLICT (event_id) DO NOTHING RETURNING event_id",
            )
            .await?;
        let mut inserted = Vec::new();
        for m in messages {
            let keys = serde_json::to_string(&m.variables_keys)
                .map_err(|e| StoreError::Other(format!("encoding variables_keys: {e}")))?;
            let row = insert
                .query_row(
                    params![
                        m.event_id.as_str(),
                        m.workspace.as_str(),
                        m.event_name,
                        m.subscriber_id,
                        m.category,
                        m.priority,
                        m.channel,
                        m.status,
                        m.test_mode,
                        keys,
                        encode_timestamp(&m.created_at),
                    ],
                    |r| r.get(0),
                )
                .optional()
                .map_err(direct_err)?;
            inserted.extend(row);
        }
        Ok(inserted)
    }

    async fn lock_subscribers(&mut self, _: &[(&WorkspaceId, &str)]) -> Result<(), StoreError> {
        // The write lock, held since the transaction began, covers every row.
        Ok(())
    }

    async fn lease_rows(&mut self, events: &[&str]) -> Result<Vec<LeaseRow>, StoreError> {
        let now = now_text();
        let mut select = self
            .statement(
                "SELECT m.event_id, m.status, MAX(m.attempts, COALESCE(a.attempt_no, 0)), \
                 m.lease_owner, COALESCE(m.lease_until > ?2, 0), a.lease_owner, \
                 COALESCE(a.lease_until > ?2, 0) FROM messages m \
                 LEFT JOIN delivery_attempts a ON a.event_id = m.event_id AND a.attempt_no = \
                 (SELECT MAX(attempt_no) FROM delivery_attempts d WHERE d.event_id = m.event_id) \
                 WHERE m.event_id = ?1",
            )
            .await?;
        let mut rows = Vec::with_capacity(events.len());
        for event in events {
            let row = select
                .query_row(params![event, now], |r| {
                    Ok(LeaseRow {
                        event_id: r.get(0)?,
                        status: r.get(1)?,
                        attempts: r.get(2)?,
                        lease_owner: r.get(3)?,
                        leased: r.get(4)?,
                        attempt_lease_owner: r.get(5)?,
                        attempt_leased: r.get(6)?,
                    })
                })
                .optional()
                .map_err(direct_err)?;
            rows.extend(row);
        }
        Ok(rows)
    }

    async fn take_leases(
        &mut self,
        leases: &[(&str, &str)],
        lease: Duration,
    ) -> Result<(), StoreError> {
        let until = deadline(lease)?;
        let mut update = self
            .statement("UPDATE messages SET lease_until = ?1, lease_owner = ?2 WHERE event_id = ?3")
            .await?;
        for (event, owner) in leases {
            update
                .execute(params![until, owner, event])
                .map_err(direct_err)?;
        }
        Ok(())
    }

    async fn insert_queued_entries(&mut self, events: &[&str]) -> Result<(), StoreError> {
        let mut insert = self
            .statement(
                "INSERT INTO message_events (event_id, status, occurred_at, provider, detail) \
                 SELECT event_id, 'queued', created_at, NULL, json_object('channel', channel) \
                 FROM messages m WHERE event_id = ?1 AND NOT EXISTS \
                 (SELECT 1 FROM message_events e WHERE e.event_id = m.event_id)",
            )
            .await?;
        for event in events {
            insert.execute(params![event]).map_err(direct_err)?;
        }
        Ok(())
    }

    async fn upsert_subscribers(
        &mut self,
        subscribers: &[SubscriberUpsert<'_>],
    ) -> Result<Vec<(String, String)>, StoreError> {
        let now = now_text();
        // No row comes back for a key whose row is a tombstone.
        let mut upsert = self
            .statement(
                "INSERT INTO subscribers (workspace_id, subscriber_key, subscriber_id, email, \
                 phone_masked, device_tokens, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7) \
                 ON CONFLICT (workspace_id, subscriber_key) DO UPDATE SET \
                 subscriber_id = excluded.subscriber_id, email = excluded.email, \
                 phone_masked = excluded.phone_masked, device_tokens = excluded.device_tokens, \
                 updated_at = excluded.updated_at \
                 WHERE subscribers.deleted_at IS NULL \
                 RETURNING workspace_id, subscriber_key",
            )
            .await?;
        let mut live = Vec::with_capacity(subscribers.len());
        for (workspace, key, id, contacts) in subscribers {
            let tokens = if contacts.device_tokens.is_empty() {
                None
            } else {
                Some(
                    serde_json::to_string(&contacts.device_tokens)
                        .map_err(|e| StoreError::Other(format!("encoding device tokens: {e}")))?,
                )
            };
            let row = upsert
                .query_row(
                    params![
                        workspace.as_str(),
                        key,
                        id,
                        contacts.email,
                        contacts.phone_masked,
                        tokens,
                        now,
                    ],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(direct_err)?;
            live.extend(row);
        }
        Ok(live)
    }

    async fn mark_erased(
        &mut self,
        event: &EventId,
        subscriber: &str,
        pseudonym: &str,
    ) -> Result<(), StoreError> {
        self.sqlx().mark_erased(event, subscriber, pseudonym).await
    }

    async fn attempt_rows(&mut self, event: &EventId) -> Result<Vec<AttemptRow>, StoreError> {
        self.sqlx().attempt_rows(event).await
    }

    async fn message_provider(&mut self, event: &EventId) -> Result<Option<String>, StoreError> {
        let provider: Option<Option<String>> = self
            .statement("SELECT provider FROM messages WHERE event_id = ?1")
            .await?
            .query_row(params![event.as_str()], |r| r.get(0))
            .optional()
            .map_err(direct_err)?;
        Ok(provider.flatten())
    }

    async fn update_leased(
        &mut self,
        updates: &[LeasedUpdate<'_>],
    ) -> Result<Vec<String>, StoreError> {
        let now = now_text();
        let mut until = Vec::with_capacity(updates.len());
        for (_, _, lease, update, _) in updates {
            until.push(if update.release_lease {
                None
            } else {
                Some(deadline(*lease)?)
            });
        }
        let mut update = self
            .statement(
                "UPDATE messages SET updated_at = ?1, status = COALESCE(?2, status), \
                 attempts = COALESCE(?3, attempts), channel = COALESCE(?4, channel), \
                 provider = COALESCE(?5, provider), \
                 provider_message_id = COALESCE(?6, provider_message_id), \
                 cost_micro_usd = cost_micro_usd + ?7, error_code = COALESCE(?8, error_code), \
                 error_detail = COALESCE(?9, error_detail), \
                 lease_owner = CASE WHEN ?10 IS NULL THEN NULL ELSE ?12 END, \
                 lease_until = ?10 \
                 WHERE event_id = ?11 AND (?13 OR lease_owner = ?12 \
                 OR (lease_owner IS NULL AND EXISTS (SELECT 1 FROM delivery_attempts d \
                 WHERE d.event_id = ?11 AND d.lease_owner = ?12))) RETURNING event_id",
            )
            .await?;
        let mut updated = Vec::with_capacity(updates.len());
        for ((event, owner, _, u, take), until) in updates.iter().zip(until) {
            let row = update
                .query_row(
                    params![
                        now,
                        u.status.map(MessageStatus::as_str),
                        u.attempts,
                        u.channel,
                        u.provider,
                        u.provider_message_id,
                        u.cost_add_micro_usd,
                        u.error_code,
                        u.error_detail,
                        until,
                        event.as_str(),
                        owner,
                        take,
                    ],
                    |r| r.get(0),
                )
                .optional()
                .map_err(direct_err)?;
            updated.extend(row);
        }
        Ok(updated)
    }

    async fn start_attempts(
        &mut self,
        starts: &[AttemptStart<'_>],
    ) -> Result<Vec<String>, StoreError> {
        let now = now_text();
        let mut insert = self
            .statement(
                "INSERT INTO delivery_attempts (event_id, attempt_no, channel, provider, state, \
                 started_at, lease_owner, lease_until) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
                 ON CONFLICT (event_id, attempt_no) DO NOTHING RETURNING event_id",
            )
            .await?;
        let mut inserted = Vec::with_capacity(starts.len());
        for a in starts {
            let (owner, until) = match a.lease {
                Some((owner, lease)) => (Some(owner), Some(deadline(lease)?)),
                None => (None, None),
            };
            let row = insert
                .query_row(
                    params![
                        a.event.as_str(),
                        a.attempt_no,
                        a.channel,
                        a.provider,
                        AttemptState::Started.as_str(),
                        now,
                        owner,
                        until,
                    ],
                    |r| r.get(0),
                )
                .optional()
                .map_err(direct_err)?;
            inserted.extend(row);
        }
        Ok(inserted)
    }

    async fn finish_attempts(&mut self, finishes: &[AttemptFinish<'_>]) -> Result<u64, StoreError> {
        let now = now_text();
        let mut update = self
            .statement(
                "UPDATE delivery_attempts SET finished_at = ?1, state = ?2, \
                 provider_message_id = ?3, cost_micro_usd = ?4, detail = ?5, \
                 lease_owner = NULL, lease_until = NULL WHERE event_id = ?6 AND attempt_no = ?7",
            )
            .await?;
        let mut finished = 0;
        for f in finishes {
            finished += update
                .execute(params![
                    now,
                    f.state,
                    f.provider_message_id,
                    f.cost_micro_usd,
                    f.detail,
                    f.event,
                    f.attempt_no,
                ])
                .map_err(direct_err)? as u64;
        }
        Ok(finished)
    }

    async fn clear_attempt_leases(&mut self, events: &[&str]) -> Result<(), StoreError> {
        self.sqlx().clear_attempt_leases(events).await
    }
}

/// The hot statements run through a [`Direct`] of their own (one hand-off each, as a
/// statement through sqlx); the rare ones are sqlx's.
#[async_trait::async_trait]
impl DeliverySql for SqliteConnection {
    async fn insert_messages_if_absent(
        &mut self,
        messages: &[&NewMessage],
    ) -> Result<Vec<String>, StoreError> {
        Direct::new(self).insert_messages_if_absent(messages).await
    }

    async fn lock_subscribers(&mut self, keys: &[(&WorkspaceId, &str)]) -> Result<(), StoreError> {
        Direct::new(self).lock_subscribers(keys).await
    }

    async fn lease_rows(&mut self, events: &[&str]) -> Result<Vec<LeaseRow>, StoreError> {
        Direct::new(self).lease_rows(events).await
    }

    async fn take_leases(
        &mut self,
        leases: &[(&str, &str)],
        lease: Duration,
    ) -> Result<(), StoreError> {
        Direct::new(self).take_leases(leases, lease).await
    }

    async fn insert_queued_entries(&mut self, events: &[&str]) -> Result<(), StoreError> {
        Direct::new(self).insert_queued_entries(events).await
    }

    async fn upsert_subscribers(
        &mut self,
        subscribers: &[SubscriberUpsert<'_>],
    ) -> Result<Vec<(String, String)>, StoreError> {
        Direct::new(self).upsert_subscribers(subscribers).await
    }

    async fn mark_erased(
        &mut self,
        event: &EventId,
        subscriber: &str,
        pseudonym: &str,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE messages SET erased_as = ? WHERE event_id = ? AND subscriber_id = ?")
            .bind(pseudonym)
            .bind(event.as_str())
            .bind(subscriber)
            .execute(self)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn attempt_rows(&mut self, event: &EventId) -> Result<Vec<AttemptRow>, StoreError> {
        sqlx::query_as(
            "SELECT attempt_no, channel, provider, state, provider_message_id, cost_micro_usd, \
             detail FROM delivery_attempts WHERE event_id = ? ORDER BY attempt_no",
        )
        .bind(event.as_str())
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn message_provider(&mut self, event: &EventId) -> Result<Option<String>, StoreError> {
        Direct::new(self).message_provider(event).await
    }

    async fn update_leased(
        &mut self,
        updates: &[LeasedUpdate<'_>],
    ) -> Result<Vec<String>, StoreError> {
        Direct::new(self).update_leased(updates).await
    }

    async fn start_attempts(
        &mut self,
        starts: &[AttemptStart<'_>],
    ) -> Result<Vec<String>, StoreError> {
        Direct::new(self).start_attempts(starts).await
    }

    async fn finish_attempts(&mut self, finishes: &[AttemptFinish<'_>]) -> Result<u64, StoreError> {
        Direct::new(self).finish_attempts(finishes).await
    }

    async fn clear_attempt_leases(&mut self, events: &[&str]) -> Result<(), StoreError> {
        // Rare (a lapsed first try's lease taken over, or a step that moved it): one
        // statement per event is fine.
        for event in events {
            sqlx::query(
                "UPDATE delivery_attempts SET lease_owner = NULL, lease_until = NULL \
                 WHERE event_id = ? AND lease_owner IS NOT NULL",
            )
            .bind(event)
            .execute(&mut *self)
            .await
            .map_err(map_err)?;
        }
        Ok(())
    }
}
