//! The kit's webhook-signature checks: the plugin's own signatures, mutated, must be
//! refused; the host's known answers for bundled schemes must be accepted.

use super::{Attempt, Kit, OLD_SECRET, SECRET};
use crate::plugins::bundled::known_answers::{reference_signature, rotates_within_one_header};
use crate::plugins::runtime::PluginError;
use crate::plugins::types::SignatureError;

impl Kit<'_> {
    async fn verify(
        &self,
        secret: &str,
        headers: &[(String, String)],
        body: &[u8],
        now: u64,
    ) -> Result<Result<(), SignatureError>, PluginError> {
        self.plugin
            .verify_signature(secret, headers, body, now)
            .await
    }

    /// Expects a refusal; `want` narrows which one.
    async fn expect_refused(
        &mut self,
        name: &str,
        what: &str,
        attempt: Attempt<'_>,
        want: Option<SignatureError>,
    ) {
        let Attempt {
            secret,
            headers,
            body,
            now,
        } = attempt;
        match self.verify(secret, headers, body, now).await {
            Ok(Ok(())) => self.record(name, false, format!("verified although {what}")),
            Ok(Err(e)) if want.is_none() || want == Some(e) => {
                self.pass(name, format!("refused ({}) when {what}", error_name(e)))
            }
            Ok(Err(e)) => self.record(
                name,
                false,
                format!(
                    "refused with {} when {what}; expected {}",
                    error_name(e),
                    want.map(error_name).unwrap_or_default()
                ),
            ),
            Err(e) => self.record(
                name,
                false,
                format!("{e} when {what} (must refuse, not fail)"),
            ),
        }
    }

    pub(super) async fn signatures(&mut self) {
        let body =
            br#"{"message_id":"kit-msg-0001","status":"DELIVERED","recipient":"kit@example.com"}"#
                .to_vec();
        let now = self.now;
        let signed = match self.plugin.sign_webhook(SECRET, &body, now).await {
            Ok(h) if !h.is_empty() => h,
            Ok(_) => {
                return self.record("signature.sign", false, "sign-webhook returned no headers");
            }
            Err(e) => return self.record("signature.sign", false, e.to_string()),
        };
        self.pass(
            "signature.sign",
            format!(
                "headers [{}]",
                signed
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        match self.verify(SECRET, &signed, &body, now).await {
            Ok(Ok(())) => self.pass("signature.valid", "a correctly signed body verifies"),
            Ok(Err(e)) => self.record(
                "signature.valid",
                false,
                format!("refused its own valid signature: {}", error_name(e)),
            ),
            Err(e) => self.record("signature.valid", false, e.to_string()),
        }
        let mut tampered = body.clone();
        tampered[12] ^= 0x01;
        self.expect_refused(
            "signature.tampered-body",
            "one body byte was flipped",
            Attempt {
                secret: SECRET,
                headers: &signed,
                body: &tampered,
                now,
            },
            Some(SignatureError::Mismatch),
        )
        .await;
        let mut longer = body.clone();
        longer.push(b' ');
        self.expect_refused(
            "signature.extended-body",
            "a byte was appended to the body",
            Attempt {
                secret: SECRET,
                headers: &signed,
                body: &longer,
                now,
            },
            None,
        )
        .await;
        self.expect_refused(
            "signature.wrong-secret",
            "verified with another secret",
            Attempt {
                secret: "whsec_someone_else",
                headers: &signed,
                body: &body,
                now,
            },
            Some(SignatureError::Mismatch),
        )
        .await;
        self.expect_refused(
            "signature.no-headers",
            "no headers were sent",
            Attempt {
                secret: SECRET,
                headers: &[],
                body: &body,
                now,
            },
            Some(SignatureError::Missing),
        )
        .await;
        for i in 0..signed.len() {
            let name = signed[i].0.clone();
            let mut without = signed.clone();
            without.remove(i);
            self.expect_refused(
                &format!("signature.missing.{name}"),
                &format!("header {name} was missing"),
                Attempt {
                    secret: SECRET,
                    headers: &without,
                    body: &body,
                    now,
                },
                None,
            )
            .await;
            let value = signed[i].1.clone();
            let mutations: Vec<(&str, String)> = vec![
                (
                    "truncated",
                    value
                        .chars()
                        .take(value.chars().count().saturating_sub(2))
                        .collect(),
                ),
                ("extended", format!("{value}00")),
                ("empty", String::new()),
                ("garbage", "garbage !@#$%^&*()".into()),
                ("control-bytes", "\u{1}\u{2}\u{7f}".into()),
                ("huge", "A".repeat(64 * 1024)),
            ];
            for (kind, mutated) in mutations {
                if mutated == value {
                    continue;
                }
                let mut headers = signed.clone();
                headers[i].1 = mutated;
                self.expect_refused(
                    &format!("signature.{kind}.{name}"),
                    &format!("header {name} was {kind}"),
                    Attempt {
                        secret: SECRET,
                        headers: &headers,
                        body: &body,
                        now,
                    },
                    None,
                )
                .await;
            }
        }
        // Secret rotation: a signature made with the previous secret verifies under it
        // and not under the current one (the host tries each configured secret).
        match self.plugin.sign_webhook(OLD_SECRET, &body, now).await {
            Ok(old) => {
                self.expect_refused(
                    "signature.rotation.old-under-new",
                    "signed with the previous secret and checked with the current one",
                    Attempt {
                        secret: SECRET,
                        headers: &old,
                        body: &body,
                        now,
                    },
                    Some(SignatureError::Mismatch),
                )
                .await;
                match self.verify(OLD_SECRET, &old, &body, now).await {
                    Ok(Ok(())) => self.pass(
                        "signature.rotation.old-under-old",
                        "previous secret still verifies its own signatures",
                    ),
                    other => self.record(
                        "signature.rotation.old-under-old",
                        false,
                        format!("{other:?}"),
                    ),
                }
            }
            Err(e) => self.record("signature.rotation", false, e.to_string()),
        }
        let tolerance = self.plugin.info().signature_tolerance_seconds;
        match tolerance {
            None => self.pass(
                "signature.timestamps",
                "scheme signs no timestamp (none declared)",
            ),
            Some(tol) => {
                let tol = u64::from(tol);
                for (name, ts, ok) in [
                    (
                        "signature.timestamp.stale",
                        now.saturating_sub(tol + 60),
                        false,
                    ),
                    ("signature.timestamp.future", now + tol + 60, false),
                    (
                        "signature.timestamp.inside-window",
                        now.saturating_sub(tol.saturating_sub(5)),
                        true,
                    ),
                ] {
                    let headers = match self.plugin.sign_webhook(SECRET, &body, ts).await {
                        Ok(h) => h,
                        Err(e) => {
                            self.record(name, false, e.to_string());
                            continue;
                        }
                    };
                    if ok {
                        match self.verify(SECRET, &headers, &body, now).await {
                            Ok(Ok(())) => {
                                self.pass(name, format!("signed {}s ago: accepted", now - ts))
                            }
                            other => self.record(
                                name,
                                false,
                                format!("signed {}s ago (tolerance {tol}s): {other:?}", now - ts),
                            ),
                        }
                    } else {
                        self.expect_refused(
                            name,
                            &format!(
                                "the timestamp was {}s off (tolerance {tol}s)",
                                ts.abs_diff(now)
                            ),
                            Attempt {
                                secret: SECRET,
                                headers: &headers,
                                body: &body,
                                now,
                            },
                            Some(SignatureError::TimestampOutOfRange),
                        )
                        .await;
                    }
                }
            }
        }
    }

    /// Vectors computed by the host for the five pinned schemes.
    pub(super) async fn known_answers(&mut self) {
        let slug = self.plugin.info().slug.clone();
        let body = br#"{"message_id":"kit-msg-0001","status":"DELIVERED"}"#;
        let now = self.now;
        let Some(headers) = reference_signature(&slug, SECRET, body, now) else {
            return self.pass(
                "signature.known-answer",
                format!("no pinned scheme for slug {slug:?}; generic checks only"),
            );
        };
        match self.verify(SECRET, &headers, body, now).await {
            Ok(Ok(())) => self.pass(
                "signature.known-answer",
                format!("accepts the pinned {slug} scheme computed by the host"),
            ),
            other => self.record(
                "signature.known-answer",
                false,
                format!("refused a correct {slug} signature computed by the host: {other:?}"),
            ),
        }
        if rotates_within_one_header(&slug) {
            // Rotation inside one header: an unknown-version entry, the old and the new signature.
            let old = reference_signature(&slug, OLD_SECRET, body, now).unwrap();
            let new_sig = &headers[2].1;
            let mut both = headers.clone();
            both[2].1 = format!("v2,ignored {} {new_sig}", old[2].1);
            match self.verify(SECRET, &both, body, now).await {
                Ok(Ok(())) => self.pass(
                    "signature.known-answer.multiple",
                    "several space-separated signatures: one match suffices",
                ),
                other => self.record(
                    "signature.known-answer.multiple",
                    false,
                    format!("{other:?}"),
                ),
            }
        }
    }
}

fn error_name(e: SignatureError) -> &'static str {
    match e {
        SignatureError::Missing => "missing",
        SignatureError::Malformed => "malformed",
        SignatureError::Mismatch => "mismatch",
        SignatureError::TimestampOutOfRange => "timestamp-out-of-range",
    }
}
