//! Writing delivery events: which endpoints receive a status change and the body each
//! gets ([`emit`], inside the change's transaction), and the made-up event a test
//! sends ([`test_event`]).

use super::{NewDelivery, OutboundSql};
use crate::events::{self, EndpointDisabled, Event, MessageData};
use crate::ids::{EventId, WebhookDeliveryId};
use crate::model::MessageStatus;
use crate::store::{StoreError, decode_json, now_micros};
use chrono::{DateTime, Utc};

pub(super) fn encode(value: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Other(format!("encoding an event: {e}")))
}

pub(super) fn event_types(text: Option<&str>) -> Result<Option<Vec<String>>, StoreError> {
    text.map(|t| decode_json(t, "event_types")).transpose()
}

/// Records, on `conn` inside the transaction that made them, the delivery events of
/// message status changes `(message, status)` (in the order they happened): one per
/// change a caller can act on and enabled endpoint of the message's workspace
/// subscribed to its type. Each body carries the message's public fields as the
/// transaction leaves them, with the status of its change. Costs one read when no
/// endpoint is subscribed.
pub(crate) async fn emit<C: OutboundSql + ?Sized>(
    conn: &mut C,
    changes: &[(&EventId, MessageStatus)],
) -> Result<(), StoreError> {
    let wanted: Vec<(&EventId, MessageStatus, &'static str)> = changes
        .iter()
        .filter_map(|(event, status)| events::event_type(*status).map(|k| (*event, *status, k)))
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let mut ids: Vec<&str> = wanted.iter().map(|(e, _, _)| e.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    let rows = conn.subscriptions(&ids).await?;
    if rows.is_empty() {
        return Ok(());
    }
    let at = now_micros();
    let mut inserts = Vec::new();
    for (event, status, kind) in wanted {
        for row in rows.iter().filter(|r| r.event_id == event.as_str()) {
            if !events::wants(event_types(row.event_types.as_deref())?.as_deref(), kind) {
                continue;
            }
            let data = MessageData {
                event_id: row.event_id.clone(),
                event_name: row.event_name.clone(),
                subscriber_id: row.subscriber_id.clone(),
                status,
                channel: row.channel.clone(),
                provider: row.provider.clone(),
                error_code: row.error_code.clone(),
                cost_micro_usd: row.cost_micro_usd,
                test_mode: row.test_mode,
            };
            let Some(event) = Event::of(data, at) else {
                continue;
            };
            inserts.push(NewDelivery {
                id: WebhookDeliveryId::generate().to_string(),
                endpoint_id: row.endpoint_id.clone(),
                workspace_id: row.workspace_id.clone(),
                event_id: event.id.clone(),
                message_id: Some(row.event_id.clone()),
                event_type: event.kind.clone(),
                body: encode(&event)?,
                created_at: at,
            });
        }
    }
    if !inserts.is_empty() {
        conn.insert_deliveries(&inserts).await?;
    }
    Ok(())
}

/// The test event an endpoint gets from [`Outbound::send_test_event`](super::Outbound::send_test_event): a made-up
/// message in test mode, with a fresh id each time.
pub fn test_event(kind: &str, at: DateTime<Utc>) -> Result<(String, String), StoreError> {
    if kind == "endpoint.disabled" {
        let mut event =
            EndpointDisabled::new("ep_test", "https://example.com/webhooks", "test", at);
        // A fresh id each time, as for the made-up messages.
        event.id = format!("ep_test.disabled.{}", uuid::Uuid::new_v4().simple());
        return Ok((event.id.clone(), encode(&event)?));
    }
    let status = MessageStatus::ALL
        .iter()
        .copied()
        .find(|s| events::event_type(*s) == Some(kind))
        .ok_or_else(|| StoreError::Other(format!("unknown event type {kind:?}")))?;
    let data = MessageData {
        event_id: EventId::generate().to_string(),
        event_name: "test".into(),
        subscriber_id: "test-subscriber".into(),
        status,
        channel: Some("email".into()),
        provider: None,
        error_code: None,
        cost_micro_usd: 0,
        test_mode: true,
    };
    let event = Event::of(data, at)
        .ok_or_else(|| StoreError::Other(format!("{kind} has no message status")))?;
    Ok((event.id.clone(), encode(&event)?))
}
