//! Idempotency keys at acceptance: claiming a key (waiting out a request that holds
//! it), publishing under the event id the key is bound to, and recording a response
//! the key store could not take at once.

use super::{Envelope, IngestError};
use crate::broker::Publish;
use crate::idempotency::{Claim, IdempotencyStore};
use crate::ids::EventId;
use crate::model::NewMessage;
use std::sync::Arc;
use std::time::Duration;

/// How long a request waits for a concurrent request holding the same idempotency key.
const PENDING_WAIT: Duration = Duration::from_secs(10);

/// What a claimed key asks of the request.
pub(super) enum Claimed {
    /// Answer with this stored response (200).
    Replay(Vec<u8>),
    /// Accept the event under this id.
    Accept(EventId),
}

/// Claims `key` for an event prepared as `event`, waiting up to [`PENDING_WAIT`] for a
/// request that holds it.
pub(super) async fn claim(
    idempotency: &dyn IdempotencyStore,
    workspace: &str,
    key: &str,
    event: &EventId,
) -> Result<Claimed, IngestError> {
    let deadline = tokio::time::Instant::now() + PENDING_WAIT;
    loop {
        match idempotency.claim(workspace, key, event).await {
            Ok(Claim::Fresh(bound)) => return Ok(Claimed::Accept(bound)),
            Ok(Claim::Replay(body)) => return Ok(Claimed::Replay(body)),
            Ok(Claim::Pending) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(Claim::Pending) => {
                return Err(IngestError::Internal(
                    "a request with this idempotency key is still in progress".into(),
                ));
            }
            Err(e) => return Err(IngestError::Internal(e.to_string())),
        }
    }
}

/// The prepared event under `event` instead of the id it was prepared with (nothing
/// to do for that id): a retry of a key whose first request failed publishes under the
/// id that request may have published, so the broker and the workers see one event.
pub(super) fn rebind(
    message: &mut NewMessage,
    publish: &mut Publish,
    event: EventId,
) -> Result<(), IngestError> {
    if event == message.event_id {
        return Ok(());
    }
    let encoding = |e: serde_json::Error| IngestError::Internal(format!("encoding: {e}"));
    let mut envelope: Envelope = serde_json::from_slice(&publish.payload).map_err(encoding)?;
    envelope.event_id = event;
    publish.payload = serde_json::to_vec(&envelope).map_err(encoding)?.into();
    publish.msg_id = envelope.event_id.to_string();
    *message = envelope.message();
    Ok(())
}

/// Records an accepted event's response under its idempotency key after a failed
/// attempt, retrying (100 ms, doubling to 2 s) while the key's claim still holds it
/// (`claim_ends`, with two seconds to spare), so a retry replays it. Past that time
/// another request may hold the key (under the same event id), so the response is not
/// written over its work; a retry then publishes the event again under its id.
pub(super) fn complete_later(
    idempotency: Arc<dyn IdempotencyStore>,
    workspace: &str,
    key: &str,
    body: Vec<u8>,
    claim_ends: tokio::time::Instant,
) {
    let (workspace, key) = (workspace.to_string(), key.to_string());
    tokio::spawn(async move {
        // An attempt may take a second (the store's own bound), and a second is spare.
        let last_start = claim_ends - Duration::from_secs(2);
        let mut wait = Duration::from_millis(100);
        loop {
            tokio::time::sleep(wait).await;
            if tokio::time::Instant::now() >= last_start {
                tracing::error!(
                    "could not record idempotent response: a retry with its key publishes the event again under its id"
                );
                return;
            }
            match idempotency.complete(&workspace, &key, &body).await {
                Ok(()) => return,
                Err(_) => wait = (wait * 2).min(Duration::from_secs(2)),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::StreamClass;

    /// A rebound event is the same event under the new id: its record, its
    /// de-duplication id and the id inside what the workers receive.
    #[test]
    fn a_rebound_event_carries_the_bound_id_everywhere() {
        let request: super::super::TriggerRequest = serde_json::from_value(serde_json::json!({
            "name": "welcome",
            "to": {"subscriberId": "sub_1", "email": "a@example.com"},
            "payload": {"k": "v"}
        }))
        .unwrap();
        let envelope = Envelope {
            v: 1,
            event_id: EventId::generate(),
            workspace_id: crate::ids::WorkspaceId::generate(),
            key_mode: crate::model::KeyMode::Live,
            priority: crate::routing::Priority::Normal,
            channels: vec![crate::routing::Channel::Email],
            accepted_at: chrono::Utc::now(),
            request,
        };
        let mut message = envelope.message();
        let mut publish = Publish {
            class: StreamClass::Bulk,
            subject: "s".into(),
            msg_id: envelope.event_id.to_string(),
            payload: serde_json::to_vec(&envelope).unwrap().into(),
        };
        let bound = EventId::generate();
        rebind(&mut message, &mut publish, bound.clone()).unwrap();
        let published: Envelope = serde_json::from_slice(&publish.payload).unwrap();
        assert_eq!(
            published,
            Envelope {
                event_id: bound.clone(),
                ..envelope.clone()
            }
        );
        assert_eq!(publish.msg_id, bound.to_string());
        assert_eq!(
            message,
            Envelope {
                event_id: bound,
                ..envelope
            }
            .message()
        );
    }
}
