//! Host-native implementations of the five bundled providers' webhook signature
//! schemes, byte-for-byte what each plugin's `sign-webhook` / `verify-signature` does
//! (`plugins/*/src/lib.rs`, with the SDK's `signature` helpers):
//!
//! | slug | headers | signed content |
//! |---|---|---|
//! | `prova` | `provA-id`, `provA-timestamp`, `provA-signature: v1,<base64>` (several, space-separated) | `{id}.{timestamp}.{body}`, 300 s tolerance |
//! | `provb` | `producer-signature: ts=<ts>;s=<hex>;s-algorithm=HmacSHA256` | `{ts}.{body}`, 300 s tolerance |
//! | `provc` | `X-provC-Signature: <hex>` | body |
//! | `provd` | `X-provD-Signature: <base64>` | body |
//! | `prove` | `X-Hub-Signature: sha256=<hex>` | body |
//!
//! All tags are HMAC-SHA256 keyed with the secret's UTF-8 bytes. Header names compare
//! case-insensitively and the first occurrence wins, as in the SDK's `Headers`.
//!
//! Verification allocates nothing: tags are decoded into stack buffers and prefixed
//! content is fed to the MAC piecewise. Error precedence matches the plugins exactly
//! (e.g. provA: missing header, then malformed timestamp, empty id, no usable `v1`
//! tag, then a stale timestamp, then a mismatch). A tag that does not decode and one
//! that decodes to the wrong length are the same error in every plugin, so both are
//! `None` from the decoders here.

use crate::crypto::{constant_time_eq, hmac_sha256};
use crate::plugins::types::SignatureError;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Tolerated clock skew for provA and provB signed timestamps (their `TOLERANCE_SECS`).
pub const TOLERANCE_SECS: u64 = 300;
/// The five slugs with a native scheme.
pub const SLUGS: [&str; 5] = ["prova", "provb", "provc", "provd", "prove"];

const PROVA_ID: &str = "provA-id";
const PROVA_TIMESTAMP: &str = "provA-timestamp";
const PROVA_SIGNATURE: &str = "provA-signature";
const PROVB_HEADER: &str = "producer-signature";
const PROVC_HEADER: &str = "X-provC-Signature";
const PROVD_HEADER: &str = "X-provD-Signature";
const PROVE_HEADER: &str = "X-Hub-Signature";

const TAG_LEN: usize = 32;
type Tag = [u8; TAG_LEN];

/// The headers provider `slug` sends for `body` signed with `secret` at `timestamp`;
/// `None` for a slug that is not one of the bundled five.
pub fn sign(
    slug: &str,
    secret: &str,
    body: &[u8],
    timestamp: u64,
) -> Option<Vec<(String, String)>> {
    let key = secret.as_bytes();
    let b64 = &base64::engine::general_purpose::STANDARD;
    Some(match slug {
        "prova" => {
            let ts = timestamp.to_string();
            // The message id is derived from the body and time, as the plugin does.
            let id_tag = hmac_sha256(ts.as_bytes(), body);
            let mut id = String::with_capacity(4 + 24);
            id.push_str("msg_");
            id.push_str(&hex::encode(&id_tag[..12]));
            let tag = hmac_parts(key, &[id.as_bytes(), b".", ts.as_bytes(), b".", body]);
            let mut sig = String::with_capacity(3 + 44);
            sig.push_str("v1,");
            b64.encode_string(tag, &mut sig);
            vec![
                (PROVA_ID.into(), id),
                (PROVA_TIMESTAMP.into(), ts),
                (PROVA_SIGNATURE.into(), sig),
            ]
        }
        "provb" => {
            let ts = timestamp.to_string();
            let tag = hmac_parts(key, &[ts.as_bytes(), b".", body]);
            vec![(
                PROVB_HEADER.into(),
                format!("ts={ts};s={};s-algorithm=HmacSHA256", hex::encode(tag)),
            )]
        }
        "provc" => vec![(PROVC_HEADER.into(), hex::encode(hmac_sha256(key, body)))],
        "provd" => vec![(PROVD_HEADER.into(), b64.encode(hmac_sha256(key, body)))],
        "prove" => {
            let mut value = String::with_capacity(7 + 64);
            value.push_str("sha256=");
            value.push_str(&hex::encode(hmac_sha256(key, body)));
            vec![(PROVE_HEADER.into(), value)]
        }
        _ => return None,
    })
}

/// Verifies provider `slug`'s signature; `None` for a slug that is not bundled.
pub fn verify(
    slug: &str,
    secret: &str,
    headers: &[(String, String)],
    body: &[u8],
    now: u64,
) -> Option<Result<(), SignatureError>> {
    let key = secret.as_bytes();
    Some(match slug {
        "prova" => verify_prova(key, headers, body, now),
        "provb" => verify_provb(key, headers, body, now),
        "provc" => {
            header(headers, PROVC_HEADER).and_then(|v| check_body_tag(key, body, decode_hex(v)))
        }
        "provd" => {
            header(headers, PROVD_HEADER).and_then(|v| check_body_tag(key, body, decode_base64(v)))
        }
        "prove" => header(headers, PROVE_HEADER).and_then(|v| {
            let hex = v.strip_prefix("sha256=").ok_or(SignatureError::Malformed)?;
            check_body_tag(key, body, decode_hex(hex))
        }),
        _ => return None,
    })
}

fn verify_prova(
    key: &[u8],
    headers: &[(String, String)],
    body: &[u8],
    now: u64,
) -> Result<(), SignatureError> {
    let id = header(headers, PROVA_ID)?;
    let timestamp = header(headers, PROVA_TIMESTAMP)?;
    let signatures = header(headers, PROVA_SIGNATURE)?;
    let ts = parse_timestamp(timestamp)?;
    if id.is_empty() {
        return Err(SignatureError::Malformed);
    }
    // Entries of other versions are skipped, as are v1 entries that do not decode to
    // a 32-byte tag; at least one usable v1 tag must remain.
    let mut tags = signatures
        .split_whitespace()
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .filter_map(decode_base64)
        .peekable();
    if tags.peek().is_none() {
        return Err(SignatureError::Malformed);
    }
    check_timestamp(ts, now)?;
    // The plugin signs the timestamp header as sent, not the parsed number.
    let expected = hmac_parts(
        key,
        &[id.as_bytes(), b".", timestamp.as_bytes(), b".", body],
    );
    let mut matched = false;
    for tag in tags {
        // No short-circuit: every candidate is compared.
        matched |= constant_time_eq(&tag, &expected);
    }
    if matched {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

fn verify_provb(
    key: &[u8],
    headers: &[(String, String)],
    body: &[u8],
    now: u64,
) -> Result<(), SignatureError> {
    let value = header(headers, PROVB_HEADER)?;
    let (mut ts, mut sig, mut algorithm) = (None, None, None);
    for part in value.split(';') {
        let (k, v) = part
            .trim()
            .split_once('=')
            .ok_or(SignatureError::Malformed)?;
        match k {
            "ts" => ts = Some(v),
            "s" => sig = Some(v),
            "s-algorithm" => algorithm = Some(v),
            _ => {}
        }
    }
    let (Some(ts), Some(sig), Some("HmacSHA256")) = (ts, sig, algorithm) else {
        return Err(SignatureError::Malformed);
    };
    let timestamp = parse_timestamp(ts)?;
    let tag = decode_hex(sig).ok_or(SignatureError::Malformed)?;
    check_timestamp(timestamp, now)?;
    let expected = hmac_parts(key, &[ts.as_bytes(), b".", body]);
    mismatch_unless(constant_time_eq(&expected, &tag))
}

/// provC, provD, provE: a tag over the raw body.
fn check_body_tag(key: &[u8], body: &[u8], tag: Option<Tag>) -> Result<(), SignatureError> {
    let tag = tag.ok_or(SignatureError::Malformed)?;
    mismatch_unless(constant_time_eq(&hmac_sha256(key, body), &tag))
}

fn mismatch_unless(ok: bool) -> Result<(), SignatureError> {
    if ok {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// The first value of header `name`, compared case-insensitively; `Missing` if absent.
fn header<'a>(headers: &'a [(String, String)], name: &str) -> Result<&'a str, SignatureError> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .ok_or(SignatureError::Missing)
}

/// HMAC-SHA256 over the concatenation of `parts`, without building it.
fn hmac_parts(key: &[u8], parts: &[&[u8]]) -> Tag {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// A 32-byte tag from hex (either case, surrounding whitespace trimmed, as the SDK's
/// `decode_hex`); `None` if it is not hex or not 32 bytes.
fn decode_hex(s: &str) -> Option<Tag> {
    let mut tag = [0u8; TAG_LEN];
    hex::decode_to_slice(s.trim(), &mut tag).ok()?;
    Some(tag)
}

/// A 32-byte tag from standard base64, canonically padded or unpadded (as the SDK's
/// `decode_base64`); `None` if it does not decode or is not 32 bytes.
fn decode_base64(s: &str) -> Option<Tag> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
    let s = s.trim();
    // Room for more than a tag, so an over-long input is seen as such, not as an error
    // that depends on the engine's output-size estimate.
    let mut buf = [0u8; TAG_LEN + 16];
    let len = STANDARD
        .decode_slice(s, &mut buf)
        .or_else(|_| STANDARD_NO_PAD.decode_slice(s, &mut buf))
        .ok()?;
    if len != TAG_LEN {
        return None;
    }
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&buf[..TAG_LEN]);
    Some(tag)
}

/// Epoch seconds: 1 to 20 ASCII digits after trimming, fitting a `u64` (the SDK's
/// `parse_timestamp`).
fn parse_timestamp(s: &str) -> Result<u64, SignatureError> {
    let s = s.trim();
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SignatureError::Malformed);
    }
    s.parse().map_err(|_| SignatureError::Malformed)
}

fn check_timestamp(timestamp: u64, now: u64) -> Result<(), SignatureError> {
    if timestamp.abs_diff(now) > TOLERANCE_SECS {
        Err(SignatureError::TimestampOutOfRange)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::bundled;
    use crate::plugins::{Grants, Plugin, PluginRuntime, RuntimeConfig};

    const NOW: u64 = 1_700_000_000;
    const SECRET: &str = "whsec_native_test";
    const BODY: &[u8] = br#"{"message_id":"m-1","status":"DELIVERED","recipient":"ada@example.test","channel":"email"}"#;

    async fn load_all() -> Vec<(&'static str, Plugin)> {
        // A generous guest-time budget: wall-clock budgets flake on a loaded machine.
        let runtime = PluginRuntime::new(RuntimeConfig {
            guest_time_budget: std::time::Duration::from_secs(5),
            max_instances: 8,
            ..RuntimeConfig::default()
        })
        .expect("runtime");
        let mut plugins = Vec::new();
        for slug in SLUGS {
            let wasm = bundled::find(slug).expect("bundled").wasm;
            let plugin = runtime.load(wasm, Grants::Declared).await.expect("loads");
            plugins.push((slug, plugin));
        }
        plugins
    }

    fn tamper(body: &[u8]) -> Vec<u8> {
        let mut b = body.to_vec();
        b[2] ^= 0x01;
        b
    }

    #[test]
    fn unknown_slugs_have_no_native_scheme() {
        assert!(sign("nope", SECRET, BODY, NOW).is_none());
        assert!(verify("nope", SECRET, &[], BODY, NOW).is_none());
        assert!(verify("PROVA", SECRET, &[], BODY, NOW).is_none());
    }

    #[test]
    fn native_matches_the_hosts_reference_schemes() {
        for slug in SLUGS {
            let native = sign(slug, SECRET, BODY, NOW).unwrap();
            let reference =
                crate::plugins::conformance::reference_signature(slug, SECRET, BODY, NOW).unwrap();
            if slug == "prova" {
                // The reference uses a fixed id; the scheme is the same, so each verifies.
                assert_eq!(verify(slug, SECRET, &reference, BODY, NOW), Some(Ok(())));
                assert_eq!(native[0].0, reference[0].0);
                assert!(native[0].1.starts_with("msg_") && native[0].1.len() == 28);
                assert_eq!(native[1], reference[1]);
            } else {
                assert_eq!(native, reference, "{slug}");
            }
            assert_eq!(verify(slug, SECRET, &native, BODY, NOW), Some(Ok(())));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn native_and_plugin_schemes_agree_both_ways() {
        for (slug, plugin) in load_all().await {
            // Native sign -> the plugin verifies; and byte-identical headers.
            let native = sign(slug, SECRET, BODY, NOW).unwrap();
            let by_plugin = plugin.sign_webhook(SECRET, BODY, NOW).await.unwrap();
            assert_eq!(
                native, by_plugin,
                "{slug}: native and plugin sign differently"
            );
            assert_eq!(
                plugin
                    .verify_signature(SECRET, &native, BODY, NOW)
                    .await
                    .unwrap(),
                Ok(()),
                "{slug}: plugin refuses native signature"
            );
            // Plugin sign -> native verifies.
            assert_eq!(
                verify(slug, SECRET, &by_plugin, BODY, NOW),
                Some(Ok(())),
                "{slug}: native refuses plugin signature"
            );
            // Header names are case-insensitive.
            let shouted: Vec<(String, String)> = by_plugin
                .iter()
                .map(|(k, v)| (k.to_ascii_uppercase(), v.clone()))
                .collect();
            assert_eq!(verify(slug, SECRET, &shouted, BODY, NOW), Some(Ok(())));

            // A tampered body: Mismatch from both.
            let tampered = tamper(BODY);
            assert_eq!(
                verify(slug, SECRET, &native, &tampered, NOW),
                Some(Err(SignatureError::Mismatch)),
                "{slug}"
            );
            assert_eq!(
                plugin
                    .verify_signature(SECRET, &native, &tampered, NOW)
                    .await
                    .unwrap(),
                Err(SignatureError::Mismatch),
                "{slug}"
            );
            // A wrong secret: Mismatch from both.
            assert_eq!(
                verify(slug, "other", &native, BODY, NOW),
                Some(Err(SignatureError::Mismatch))
            );
            // Missing headers: Missing from both.
            assert_eq!(
                verify(slug, SECRET, &[], BODY, NOW),
                Some(Err(SignatureError::Missing))
            );
            assert_eq!(
                plugin
                    .verify_signature(SECRET, &[], BODY, NOW)
                    .await
                    .unwrap(),
                Err(SignatureError::Missing)
            );
            // Each header dropped in turn, and each header mangled: same answer as the plugin.
            for i in 0..native.len() {
                let mut dropped = native.clone();
                dropped.remove(i);
                let expected = plugin
                    .verify_signature(SECRET, &dropped, BODY, NOW)
                    .await
                    .unwrap();
                assert_eq!(
                    expected,
                    Err(SignatureError::Missing),
                    "{slug} without #{i}"
                );
                assert_eq!(verify(slug, SECRET, &dropped, BODY, NOW), Some(expected));
            }
            // Timestamps: provA and provB refuse stale and future ones; others ignore time.
            let stale = sign(slug, SECRET, BODY, NOW - 301).unwrap();
            let future = sign(slug, SECRET, BODY, NOW + 301).unwrap();
            let edge = sign(slug, SECRET, BODY, NOW - 300).unwrap();
            for (headers, name) in [(&stale, "stale"), (&future, "future"), (&edge, "edge")] {
                let by_plugin = plugin
                    .verify_signature(SECRET, headers, BODY, NOW)
                    .await
                    .unwrap();
                let native = verify(slug, SECRET, headers, BODY, NOW).unwrap();
                assert_eq!(native, by_plugin, "{slug} {name}");
                let timed = matches!(slug, "prova" | "provb");
                let want = if timed && name != "edge" {
                    Err(SignatureError::TimestampOutOfRange)
                } else {
                    Ok(())
                };
                assert_eq!(native, want, "{slug} {name}");
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn malformed_headers_get_the_plugins_answer() {
        let plugins = load_all().await;
        let cases: Vec<(&str, Vec<(&str, String)>)> = vec![
            (
                "prova",
                vec![
                    ("provA-id", "msg_1".into()),
                    ("provA-timestamp", NOW.to_string()),
                    ("provA-signature", "v1,@@@".into()),
                ],
            ),
            (
                "prova",
                vec![
                    ("provA-id", "".into()),
                    ("provA-timestamp", NOW.to_string()),
                    ("provA-signature", "v1,AAAA".into()),
                ],
            ),
            (
                "prova",
                vec![
                    ("provA-id", "x".into()),
                    ("provA-timestamp", "17e8".into()),
                    ("provA-signature", "v1,AAAA".into()),
                ],
            ),
            (
                "prova",
                vec![
                    ("provA-id", "x".into()),
                    ("provA-timestamp", format!(" {NOW} ")),
                    (
                        "provA-signature",
                        format!("v2,abc v1,{} v1,zz", "A".repeat(43)),
                    ),
                ],
            ),
            (
                "prova",
                vec![
                    ("provA-id", "x".into()),
                    ("provA-timestamp", (NOW - 1000).to_string()),
                    ("provA-signature", "v0,AAAA".into()),
                ],
            ),
            (
                "prova",
                vec![
                    ("provA-id", "x".into()),
                    ("provA-timestamp", (NOW - 1000).to_string()),
                    ("provA-signature", format!("v1,{}=", "A".repeat(43))),
                ],
            ),
            ("provb", vec![("producer-signature", "garbage".into())]),
            (
                "provb",
                vec![(
                    "producer-signature",
                    format!("ts={NOW};s=abcd;s-algorithm=HmacSHA256"),
                )],
            ),
            (
                "provb",
                vec![(
                    "producer-signature",
                    format!("ts={NOW};s={};s-algorithm=HmacSHA1", "0".repeat(64)),
                )],
            ),
            (
                "provb",
                vec![(
                    "producer-signature",
                    format!(
                        "ts={};s={};s-algorithm=HmacSHA256",
                        NOW - 999,
                        "0".repeat(64)
                    ),
                )],
            ),
            (
                "provb",
                vec![(
                    "producer-signature",
                    format!(
                        " ts={NOW} ; s={} ;s-algorithm=HmacSHA256;x=1",
                        "0".repeat(64)
                    ),
                )],
            ),
            (
                "provb",
                vec![(
                    "producer-signature",
                    format!("ts=;s={};s-algorithm=HmacSHA256", "0".repeat(64)),
                )],
            ),
            ("provc", vec![("x-provc-signature", "0".repeat(62))]),
            (
                "provc",
                vec![("x-provc-signature", format!(" {} ", "A".repeat(64)))],
            ),
            ("provc", vec![("x-provc-signature", "zz".into())]),
            ("provd", vec![("x-provd-signature", "not base64!".into())]),
            ("provd", vec![("x-provd-signature", "AAAA".into())]),
            ("provd", vec![("x-provd-signature", "A".repeat(43))]),
            ("provd", vec![("x-provd-signature", "A".repeat(88))]),
            ("prove", vec![("x-hub-signature", "0".repeat(64))]),
            (
                "prove",
                vec![("x-hub-signature", format!("sha256={}", "0".repeat(64)))],
            ),
            ("prove", vec![("x-hub-signature", "sha256=xyz".into())]),
        ];
        for (slug, headers) in cases {
            let plugin = &plugins.iter().find(|(s, _)| *s == slug).unwrap().1;
            let headers: Vec<(String, String)> = headers
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            let expected = plugin
                .verify_signature(SECRET, &headers, BODY, NOW)
                .await
                .unwrap();
            assert_eq!(
                verify(slug, SECRET, &headers, BODY, NOW),
                Some(expected),
                "{slug} {headers:?}"
            );
        }
    }

    #[test]
    fn prova_accepts_any_of_several_signatures() {
        let new = sign("prova", "whsec_new", BODY, NOW).unwrap();
        let old = sign("prova", "whsec_old", BODY, NOW).unwrap();
        let mut both = new.clone();
        both[2].1 = format!("{} v2,ignored {}", old[2].1, new[2].1);
        assert_eq!(verify("prova", "whsec_new", &both, BODY, NOW), Some(Ok(())));
        assert_eq!(verify("prova", "whsec_old", &both, BODY, NOW), Some(Ok(())));
        assert_eq!(
            verify("prova", "whsec_other", &both, BODY, NOW),
            Some(Err(SignatureError::Mismatch))
        );
    }

    #[test]
    fn missing_stale_and_tampered_natively() {
        for slug in SLUGS {
            let headers = sign(slug, SECRET, BODY, NOW).unwrap();
            assert_eq!(
                verify(slug, SECRET, &headers, &tamper(BODY), NOW),
                Some(Err(SignatureError::Mismatch))
            );
            assert_eq!(
                verify(
                    slug,
                    SECRET,
                    &[("content-type".into(), "application/json".into())],
                    BODY,
                    NOW
                ),
                Some(Err(SignatureError::Missing))
            );
        }
        for slug in ["prova", "provb"] {
            let stale = sign(slug, SECRET, BODY, NOW - 600).unwrap();
            assert_eq!(
                verify(slug, SECRET, &stale, BODY, NOW),
                Some(Err(SignatureError::TimestampOutOfRange))
            );
        }
    }
}
