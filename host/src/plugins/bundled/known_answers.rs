//! Known answers for the bundled providers' webhook schemes and carrier call states,
//! computed here independently of the plugins: the conformance kit checks a plugin
//! claiming one of these slugs against them (`signature.known-answer`,
//! `call-state.*`). Pinned to the providers' documented behaviour, not to the plugins'
//! code, so a plugin that drifts from its provider fails the kit.

use crate::crypto::hmac_sha256;
use crate::plugins::types::DeliveryStatus;
use base64::Engine as _;

/// Whether `slug`'s scheme carries several signatures in one header, space-separated
/// (key rotation): one match suffices.
pub fn rotates_within_one_header(slug: &str) -> bool {
    slug == "prova"
}

/// The five pinned webhook schemes, computed by the host (HMAC-SHA256, secret as UTF-8).
pub fn reference_signature(
    slug: &str,
    secret: &str,
    body: &[u8],
    timestamp: u64,
) -> Option<Vec<(String, String)>> {
    let key = secret.as_bytes();
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let with_prefix = |prefix: &str| {
        let mut data = prefix.as_bytes().to_vec();
        data.extend_from_slice(body);
        data
    };
    let ts = timestamp.to_string();
    Some(match slug {
        "prova" => {
            let id = "msg_kit_reference";
            let tag = hmac_sha256(key, &with_prefix(&format!("{id}.{ts}.")));
            vec![
                ("provA-id".into(), id.into()),
                ("provA-timestamp".into(), ts),
                ("provA-signature".into(), format!("v1,{}", b64(&tag))),
            ]
        }
        "provb" => {
            let tag = hmac_sha256(key, &with_prefix(&format!("{ts}.")));
            vec![(
                "producer-signature".into(),
                format!("ts={ts};s={};s-algorithm=HmacSHA256", hex::encode(tag)),
            )]
        }
        "provc" => vec![(
            "X-provC-Signature".into(),
            hex::encode(hmac_sha256(key, body)),
        )],
        "provd" => vec![("X-provD-Signature".into(), b64(&hmac_sha256(key, body)))],
        "prove" => vec![(
            "X-Hub-Signature".into(),
            format!("sha256={}", hex::encode(hmac_sha256(key, body))),
        )],
        _ => return None,
    })
}

/// The spec's voice call-state table for `slug`, exactly as the spec spells the states.
pub fn spec_call_states(slug: &str) -> Option<&'static [(&'static str, DeliveryStatus)]> {
    use DeliveryStatus::*;
    const PROVC: &[(&str, DeliveryStatus)] = &[
        ("Sent", Queued),
        ("Sending", Queued),
        ("Pending", Queued),
        ("Queued", Queued),
        ("Accepted", Queued),
        ("Submitted", Queued),
        ("In-Progress", Sent),
        ("Ringing", Sent),
        ("Calling", Sent),
        ("Answered", Sent),
        ("Delivered", Delivered),
        ("Completed", Delivered),
        ("Finished", Delivered),
        ("Busy", Failed),
        ("No-Answer", Failed),
        ("Unanswered", Failed),
        ("Failed", Failed),
        ("Rejected", Failed),
        ("Cancelled", Failed),
        ("Missed", Failed),
        ("DND", Suppressed),
        ("Suppressed", Suppressed),
    ];
    const PROVE: &[(&str, DeliveryStatus)] = &[
        ("PENDING", Queued),
        ("PENDING_ACCEPTED", Queued),
        ("PENDING_ENROUTE", Queued),
        ("ACCEPTED", Queued),
        ("RINGING", Sent),
        ("CALL_IN_PROGRESS", Sent),
        ("ESTABLISHED", Sent),
        ("ANSWERED", Sent),
        ("DELIVERED", Delivered),
        ("COMPLETED", Delivered),
        ("FINISHED", Delivered),
        ("BUSY", Failed),
        ("NO_ANSWER", Failed),
        ("UNDELIVERABLE", Failed),
        ("UNDELIVERED", Failed),
        ("EXPIRED", Failed),
        ("REJECTED", Failed),
        ("FAILED", Failed),
        ("DISCARDED", Failed),
        ("DND", Suppressed),
        ("SUPPRESSED", Suppressed),
    ];
    const PROVD: &[(&str, DeliveryStatus)] = &[
        ("queued", Queued),
        ("initiated", Sent),
        ("ringing", Sent),
        ("in-progress", Sent),
        ("completed", Delivered),
        ("busy", Failed),
        ("no-answer", Failed),
        ("failed", Failed),
        ("canceled", Failed),
    ];
    match slug {
        "provc" => Some(PROVC),
        "provd" => Some(PROVD),
        "prove" => Some(PROVE),
        _ => None,
    }
}
