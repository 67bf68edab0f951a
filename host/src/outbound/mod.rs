//! Delivery events to callers: the event types a caller subscribes an endpoint to,
//! how each request is signed ([`sign`], the Standard Webhooks scheme) and which URLs
//! the gateway may post to ([`policy`]).

pub mod event;
pub mod policy;
pub mod send;
pub mod sign;

/// Every event type, in the order the docs list them.
pub const EVENT_TYPES: [&str; 9] = [
    "message.sent",
    "message.delivered",
    "message.failed",
    "message.suppressed",
    "message.bounced",
    "message.complained",
    "message.seen",
    "message.clicked",
    "endpoint.disabled",
];

/// Checks an endpoint's `event_types`: known types, no repeats, at least one (leave
/// the field out for every type). Returns them sorted in [`EVENT_TYPES`] order.
pub fn check_event_types(types: &[String]) -> Result<Vec<String>, String> {
    if types.is_empty() {
        return Err("event_types is empty: leave it out (or null) to receive every type".into());
    }
    let mut known = Vec::new();
    for t in types {
        let Some(position) = EVENT_TYPES.iter().position(|k| k == t) else {
            return Err(format!(
                "unknown event type {t:?} (expected one of {})",
                EVENT_TYPES.join(", ")
            ));
        };
        if known.contains(&position) {
            return Err(format!("event type {t:?} is listed twice"));
        }
        known.push(position);
    }
    known.sort_unstable();
    Ok(known
        .into_iter()
        .map(|i| EVENT_TYPES[i].to_string())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn event_types_are_known_unrepeated_and_sorted() {
        assert_eq!(
            check_event_types(&strings(&["message.failed", "message.sent"])).unwrap(),
            strings(&["message.sent", "message.failed"])
        );
        assert!(check_event_types(&[]).unwrap_err().contains("leave it out"));
        assert!(
            check_event_types(&strings(&["message.lost"]))
                .unwrap_err()
                .contains("unknown")
        );
        let twice = strings(&["message.sent", "message.sent"]);
        assert!(check_event_types(&twice).unwrap_err().contains("twice"));
    }
}
