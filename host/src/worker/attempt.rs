//! One attempt's provider call, as a plain function of its answers: what a failed call
//! is followed by (the same call again under the attempt's key, the attempt held, or
//! failed so the next provider may be tried), and the steps that record the outcome.
//!
//! The dispatcher makes the calls ([`super::dispatch`]); what a delivery does next,
//! once an attempt has ended, is [`super::plan`]'s.

use crate::model::{
    AttemptRecord, AttemptState, AttemptWrite, MessageStatus, MessageUpdate, NewTimelineEntry,
    Step, StepStatus,
};
use crate::plugins::types;
use crate::routing::Channel;
use chrono::Utc;
use serde_json::json;
use std::time::Duration;

/// A timeline entry now.
pub(super) fn entry(
    status: StepStatus,
    provider: Option<&str>,
    detail: serde_json::Value,
) -> NewTimelineEntry {
    NewTimelineEntry {
        status,
        occurred_at: Utc::now(),
        provider: provider.map(str::to_string),
        detail: Some(detail),
    }
}

/// A provider's acceptance of an attempt.
pub(super) struct Answer {
    pub provider_message_id: String,
    pub cost: i64,
    /// `(version, first 16 hex digits of the digest)` of the plugin that sent it;
    /// `None` when it was recorded before (a redelivery finishing the message).
    pub plugin: Option<(String, String)>,
    /// Calls made again under the attempt's key before this answer came ([`RESENDS`]).
    pub resends: u32,
}

/// How many times a call that got no answer (or an unreadable 2xx) is made again, under
/// the same idempotency key, in one delivery of its attempt, before the attempt counts
/// as failed (or, after a 2xx, is held; [`Failure::then`]). Without an answer the
/// provider may have taken the message: a provider that de-duplicates answers the
/// resend with its first answer, where a fallback (another provider, or another
/// attempt's key) would send the person a second message. Once: a provider that does
/// not de-duplicate gets at most one copy more than before.
pub(super) const RESENDS: u32 = 1;

/// The pause before a resend.
pub(super) const RESEND_PAUSE: Duration = Duration::from_millis(500);

/// Rejection codes of a plugin whose request got no answer from the provider: the
/// SDK's, for a timeout and a cut or refused connection.
const UNANSWERED: [&str; 2] = ["timeout", "transport"];

/// The rejection code of a provider's 409: to a call under a key used before (a resend,
/// or a resumed attempt), "a request under this key is in progress", as idempotency
/// keys are commonly answered. The provider has the message, taken or being taken.
const HELD: &str = "http-409";

/// The SDK's rejection code for a 2xx answer whose body the plugin could not read (a
/// body over the host's cap reaches the plugin empty, so it ends here too): the
/// provider took the message, but its id is unknown.
const UNREADABLE: &str = "invalid-response";

/// A provider call that did not end in an acceptance.
#[derive(Debug)]
pub(super) struct Failure {
    pub code: String,
    pub detail: String,
    /// No answer came: the provider may have taken the message ([`RESENDS`]).
    pub unanswered: bool,
}

/// What follows a failed call of an attempt ([`Failure::then`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Then {
    /// Call again under the same key, after [`RESEND_PAUSE`].
    Resend,
    /// Leave the attempt `started`, to be asked again under its key later.
    Hold(Hold),
    /// The attempt failed: the next provider or channel may be tried.
    Fail,
}

/// Why an attempt is held rather than failed: the provider has the message, so a
/// fallback would send the person a second one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// It answered a call under a key used before with 409: a request under the key
    /// is under way.
    KeyInUse,
    /// It answered 2xx, but with a body the plugin could not read.
    Unreadable,
}

/// What a started attempt's detail keeps for the next delivery of it ([`Kept::of`]).
/// Each is written, and flushed, before the call that could need it: a delivery that
/// ends without writing anything more (no room for its next call, a step refused, the
/// process gone) leaves it for the next one.
const HELD_KEY_IN_USE: &str = "held: http-409";
/// The same, once the attempt's resend was spent.
const HELD_KEY_IN_USE_RESENT: &str = "held: http-409, resent";
/// Taken unreadably: its resend was spent (or found no room) before it was held.
const HELD_TAKEN: &str = "held: invalid-response";
/// Its resend under way ([`resent_step`]), the provider not known to have the message.
const RESENT: &str = "resent: no answer";
/// Its resend under way, the provider having taken the message unreadably.
const RESENT_TAKEN: &str = "resent: invalid-response";
/// Its resend under way, the provider having answered 409 to an earlier call.
const RESENT_KEY_IN_USE: &str = "resent: http-409";

/// What an earlier delivery of an attempt left in its detail for the next one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Kept {
    /// The provider took the message, unreadably: however a later call of the attempt
    /// fails, the provider has it ([`Failure::then`]).
    pub taken: bool,
    /// The provider answered an earlier call under the key 409 (a request under it is
    /// under way): a later call without an answer leaves it held, not failed over
    /// ([`Failure::then`]).
    pub key_in_use: bool,
    /// The attempt's resend was spent ([`RESENDS`]): a later delivery makes one call.
    pub resent: bool,
}

impl Kept {
    /// What `attempt` keeps: nothing unless it is still `started`.
    pub(super) fn of(attempt: &AttemptRecord) -> Self {
        if attempt.state != AttemptState::Started {
            return Self::default();
        }
        let (taken, key_in_use, resent) = match attempt.detail.as_deref() {
            Some(HELD_TAKEN | RESENT_TAKEN) => (true, false, true),
            Some(HELD_KEY_IN_USE) => (false, true, false),
            Some(HELD_KEY_IN_USE_RESENT | RESENT_KEY_IN_USE) => (false, true, true),
            Some(RESENT) => (false, false, true),
            _ => return Self::default(),
        };
        Self {
            taken,
            key_in_use,
            resent,
        }
    }

    /// The resends this keeps as spent.
    pub(super) fn spent(self) -> u32 {
        if self.resent { RESENDS } else { 0 }
    }
}

impl Hold {
    /// The detail a held attempt keeps while it stays `started` ([`held_step`]);
    /// `resent`: its resend was spent, in this delivery or an earlier one.
    fn attempt_detail(self, resent: bool) -> &'static str {
        match (self, resent) {
            (Self::KeyInUse, false) => HELD_KEY_IN_USE,
            (Self::KeyInUse, true) => HELD_KEY_IN_USE_RESENT,
            (Self::Unreadable, _) => HELD_TAKEN,
        }
    }

    /// The code shown on the held round's timeline entry.
    pub fn code(self) -> &'static str {
        match self {
            Self::KeyInUse => HELD,
            Self::Unreadable => UNREADABLE,
        }
    }

    /// What the provider said, for the detail of a message given up while held.
    pub fn why(self) -> &'static str {
        match self {
            Self::KeyInUse => {
                "the provider answered that it holds a request under the attempt's \
                 idempotency key (409), and no later call under it was answered \
                 otherwise, so the message was not sent elsewhere (a second copy); the \
                 provider may deliver it"
            }
            Self::Unreadable => {
                "the provider answered that it took the message (2xx) in a form the plugin \
                 could not read, and no later call under the attempt's idempotency key was \
                 answered with its id, so the message was not sent elsewhere (a second \
                 copy); the provider may deliver it"
            }
        }
    }
}

impl Failure {
    /// A failure with an answer, or with nothing sent: never resent.
    pub fn answered(code: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            detail: detail.into(),
            unanswered: false,
        }
    }

    /// The gateway's own timeout of a call: no answer.
    pub fn timed_out(after: Duration) -> Self {
        Self {
            code: "timeout".into(),
            detail: format!("no answer within {after:?}"),
            unanswered: true,
        }
    }

    /// A plugin's rejection: unanswered when its code says the provider never answered
    /// (a provider's own refusal, such as a 503, is an answer: a fallback is safe,
    /// unless an earlier call of the attempt was taken, [`Self::then`]).
    pub fn rejected(r: types::Rejection) -> Self {
        let unanswered = UNANSWERED.contains(&r.code.as_str());
        Self {
            code: r.code,
            detail: r.detail,
            unanswered,
        }
    }

    /// Whether the provider answered that it took the message, unreadably.
    pub fn taken(&self) -> bool {
        self.code == UNREADABLE
    }

    /// What follows this failure of a call made after `resends` resends, under a key
    /// `used_before` this call (a resend, or a resumed attempt), given what earlier
    /// calls of the attempt told (`kept`: taken, or answered 409; its `resent` is not
    /// read, `resends` counts them).
    ///
    /// A call without an answer, or with an unreadable 2xx, is made again under the
    /// same key (a provider that de-duplicates answers with its first answer). A
    /// provider that says it holds a request under a key used before (409; a fresh key
    /// cannot be in use, so a 409 to it is an ordinary refusal), or that took the
    /// message, is not followed by a fallback: the attempt is asked again later. Nor is
    /// a call left without an answer after such a 409: the request under way may have
    /// been sent since. An answered refusal after a 409 is the key's own outcome (a
    /// provider that de-duplicates answers a finished request with its result), so it
    /// is failed over. A resumed attempt counts as a repeat even if the worker before
    /// never made its call (no slot came free, or it died first): nothing tells the two
    /// apart.
    pub fn then(&self, resends: u32, used_before: bool, kept: Kept) -> Then {
        if (self.unanswered || self.taken()) && resends < RESENDS {
            Then::Resend
        } else if kept.taken || self.taken() {
            // Before a 409: what the attempt keeps must say the provider took it.
            Then::Hold(Hold::Unreadable)
        } else if (used_before && self.code == HELD) || (kept.key_in_use && self.unanswered) {
            Then::Hold(Hold::KeyInUse)
        } else {
            Then::Fail
        }
    }
}

/// The step written before a call of attempt `attempt_no` is made again under its key
/// ([`Then::Resend`]): the attempt stays `started`, keeping that its resend is spent and
/// whether the provider took the message or answered 409 before (`kept`; [`Kept`]), and
/// the lease is renewed for the call. Flushed before the call, so a delivery that then
/// finds no room for it, or whose later step is refused, cannot leave the next one a
/// resend of its own (a copy more at a provider that does not de-duplicate) or a
/// fallback after a taken call.
pub(super) fn resent_step(attempt_no: i32, kept: Kept) -> Step {
    let detail = if kept.taken {
        RESENT_TAKEN
    } else if kept.key_in_use {
        RESENT_KEY_IN_USE
    } else {
        RESENT
    };
    kept_step(attempt_no, detail)
}

/// The step that keeps why attempt `attempt_no` is held (the provider took the
/// message, or answered 409), and whether its resend was spent (`resent`), learned on a
/// call made after the attempt's last mark was written (its resend, or a resumed call):
/// written, and flushed, before the step that holds it ([`held_step`]), so that one
/// being refused leaves it known.
pub(super) fn mark_step(attempt_no: i32, hold: Hold, resent: bool) -> Step {
    kept_step(attempt_no, hold.attempt_detail(resent))
}

/// Attempt `attempt_no` left `started` with `detail` ([`Kept`]), the lease renewed.
fn kept_step(attempt_no: i32, detail: &str) -> Step {
    Step {
        attempt: Some(AttemptWrite::Finish {
            attempt_no,
            state: AttemptState::Started,
            provider_message_id: None,
            cost_micro_usd: 0,
            detail: Some(detail.into()),
        }),
        ..Default::default()
    }
}

/// The step that hands a held attempt back ([`Hold`]): the lease released, the
/// attempt left `started` with why in its detail, and whether its resend was spent
/// (`resent`), so the next delivery knows ([`Kept`]), and a `queued` entry saying why
/// the message waits.
pub(super) fn held_step(
    channel: Channel,
    slug: &str,
    attempt_no: i32,
    hold: Hold,
    resent: bool,
) -> Step {
    let detail = json!({"channel": channel.as_str(), "attempt": attempt_no,
        "held": hold.code(),
        "reason": "the provider has the message under the attempt's key: not sent elsewhere"});
    Step {
        message: MessageUpdate {
            release_lease: true,
            ..tried(channel, slug, attempt_no)
        },
        timeline: vec![entry(StepStatus::Queued, Some(slug), detail)],
        ..kept_step(attempt_no, hold.attempt_detail(resent))
    }
}

/// What an attempt's start and outcome write on the message row: the attempt counted,
/// its channel and provider. The start may not have (a claim records a fresh message's
/// first start on the attempt's row alone), so every outcome does too.
pub(super) fn tried(channel: Channel, slug: &str, attempt_no: i32) -> MessageUpdate {
    MessageUpdate {
        attempts: Some(attempt_no),
        channel: Some(channel.as_str().into()),
        provider: Some(slug.into()),
        ..Default::default()
    }
}

/// The step that records attempt `attempt_no` as sent and ends the message `SENT`.
pub(super) fn sent_step(
    channel: Channel,
    slug: &str,
    attempt_no: i32,
    answer: Answer,
    resumed: bool,
    skipped: &[String],
) -> Step {
    let ch = channel.as_str();
    let (version, digest) = answer.plugin.unzip();
    let mut detail = json!({"channel": ch, "attempt": attempt_no,
        "provider_message_id": answer.provider_message_id, "cost_micro_usd": answer.cost,
        "plugin_version": version, "plugin_digest": digest});
    if resumed {
        detail["resumed"] = json!(true);
    }
    if answer.resends > 0 {
        detail["resends"] = json!(answer.resends);
    }
    if !skipped.is_empty() {
        detail["skipped"] = json!(skipped);
    }
    Step {
        attempt: Some(AttemptWrite::Finish {
            attempt_no,
            state: AttemptState::Sent,
            provider_message_id: Some(answer.provider_message_id.clone()),
            cost_micro_usd: answer.cost,
            detail: None,
        }),
        message: MessageUpdate {
            status: Some(MessageStatus::Sent),
            provider_message_id: Some(answer.provider_message_id),
            cost_add_micro_usd: answer.cost,
            release_lease: true,
            ..tried(channel, slug, attempt_no)
        },
        timeline: vec![entry(StepStatus::Sent, Some(slug), detail)],
    }
}

/// The step that records a failed attempt (`code` and `detail` already scrubbed).
pub(super) fn failed_step(
    channel: Channel,
    slug: &str,
    attempt_no: i32,
    code: &str,
    detail: &str,
    skipped: &[String],
) -> Step {
    let ch = channel.as_str();
    let mut entry_detail =
        json!({"channel": ch, "attempt": attempt_no, "code": code, "detail": detail});
    if !skipped.is_empty() {
        entry_detail["skipped"] = json!(skipped);
    }
    Step {
        attempt: Some(AttemptWrite::Finish {
            attempt_no,
            state: AttemptState::Failed,
            provider_message_id: None,
            cost_micro_usd: 0,
            detail: Some(format!("{code}: {detail}")),
        }),
        message: tried(channel, slug, attempt_no),
        timeline: vec![entry(StepStatus::Failed, Some(slug), entry_detail)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::plan::tests::record;

    const NOTHING: Kept = Kept {
        taken: false,
        key_in_use: false,
        resent: false,
    };
    const TAKEN: Kept = Kept {
        taken: true,
        ..NOTHING
    };

    #[test]
    fn only_a_call_without_a_readable_answer_is_resent_and_only_so_often() {
        let rejected = |code: &str, retryable| {
            Failure::rejected(types::Rejection {
                code: code.into(),
                detail: "d".into(),
                retryable,
            })
        };
        let fresh = |f: Failure, resends| f.then(resends, resends > 0, NOTHING);
        assert_eq!(fresh(rejected("timeout", true), 0), Then::Resend);
        assert_eq!(
            fresh(rejected("transport", true), RESENDS - 1),
            Then::Resend
        );
        assert_eq!(
            fresh(rejected("transport", true), RESENDS),
            Then::Fail,
            "bounded"
        );
        assert_eq!(
            fresh(rejected("http-503", true), 0),
            Then::Fail,
            "an answer, if retryable"
        );
        assert_eq!(fresh(rejected("http-400", false), 0), Then::Fail);
        assert_eq!(
            fresh(Failure::timed_out(Duration::from_secs(1)), 0),
            Then::Resend
        );
        assert_eq!(
            fresh(Failure::answered("plugin-error", "trap"), 0),
            Then::Fail
        );
        assert_eq!(
            fresh(rejected("invalid-response", false), 0),
            Then::Resend,
            "taken: its first answer is asked for again"
        );
    }

    #[test]
    fn a_409_holds_the_attempt_only_under_a_key_used_before() {
        let rejected = |code: &str| {
            Failure::rejected(types::Rejection {
                code: code.into(),
                detail: "key in use".into(),
                retryable: false,
            })
        };
        let key_in_use = Then::Hold(Hold::KeyInUse);
        assert_eq!(rejected("http-409").then(0, true, NOTHING), key_in_use);
        assert_eq!(rejected("http-409").then(1, true, NOTHING), key_in_use);
        assert_eq!(
            rejected("http-409").then(0, false, NOTHING),
            Then::Fail,
            "a fresh key: a refusal"
        );
        assert_eq!(rejected("http-400").then(0, true, NOTHING), Then::Fail);
        assert_eq!(rejected("timeout").then(RESENDS, true, NOTHING), Then::Fail);
        // After a 409 kept from an earlier delivery: a call without an answer is resent
        // while it may be, then held, never failed over; an answer is the key's outcome.
        let after_409 = Kept {
            key_in_use: true,
            ..NOTHING
        };
        assert_eq!(rejected("timeout").then(0, true, after_409), Then::Resend);
        assert_eq!(
            rejected("transport").then(RESENDS, true, after_409),
            key_in_use
        );
        assert_eq!(
            Failure::timed_out(Duration::from_secs(1)).then(RESENDS, true, after_409),
            key_in_use
        );
        assert_eq!(
            rejected("http-503").then(RESENDS, true, after_409),
            Then::Fail
        );
        assert_eq!(rejected("http-400").then(0, true, after_409), Then::Fail);
    }

    #[test]
    fn a_2xx_read_as_nothing_is_asked_again_then_held_never_failed_over() {
        let rejected = |code: &str| {
            Failure::rejected(types::Rejection {
                code: code.into(),
                detail: "provider answered 200 with an unreadable body".into(),
                retryable: false,
            })
        };
        let unreadable = Then::Hold(Hold::Unreadable);
        assert!(rejected("invalid-response").taken());
        assert!(!rejected("http-503").taken());
        // Resent once, then held: however the resend fails, the provider took it before.
        assert_eq!(
            rejected("invalid-response").then(RESENDS, true, TAKEN),
            unreadable
        );
        assert_eq!(rejected("timeout").then(RESENDS, true, TAKEN), unreadable);
        assert_eq!(rejected("http-503").then(RESENDS, true, TAKEN), unreadable);
        assert_eq!(
            rejected("http-409").then(RESENDS, true, TAKEN),
            unreadable,
            "kept as taken, whatever answers later"
        );
        // A resumed attempt answered unreadably is asked again at once too.
        assert_eq!(
            rejected("invalid-response").then(0, true, NOTHING),
            Then::Resend
        );
        assert_ne!(Hold::Unreadable.why(), Hold::KeyInUse.why());
        assert_eq!(Hold::Unreadable.code(), "invalid-response");
    }

    #[test]
    fn every_outcome_counts_its_attempt_on_the_message() {
        // The claim may have recorded the attempt's start on the attempt's row alone.
        let answer = Answer {
            provider_message_id: "pm-1".into(),
            cost: 3,
            plugin: None,
            resends: 0,
        };
        for step in [
            sent_step(Channel::Email, "prova", 2, answer, false, &[]),
            failed_step(Channel::Email, "prova", 2, "http-500", "d", &[]),
            held_step(Channel::Email, "prova", 2, Hold::KeyInUse, false),
        ] {
            let m = &step.message;
            assert_eq!(
                (m.attempts, m.channel.as_deref(), m.provider.as_deref()),
                (Some(2), Some("email"), Some("prova")),
                "{step:?}"
            );
        }
    }

    #[test]
    fn a_held_attempt_stays_started_and_remembers_a_taken_message() {
        let held = |hold, resent| {
            let step = held_step(Channel::Sms, "provc", 2, hold, resent);
            let Some(AttemptWrite::Finish { state, detail, .. }) = step.attempt else {
                panic!("no attempt write: {step:?}");
            };
            assert!(step.message.release_lease && step.message.status.is_none());
            assert_eq!(step.timeline[0].status, StepStatus::Queued);
            assert_eq!(
                step.timeline[0].detail.as_ref().unwrap()["held"],
                hold.code()
            );
            let mut attempt = record(2, "sms", "provc", AttemptState::Started);
            assert_eq!(state, attempt.state);
            attempt.detail = detail;
            attempt
        };
        let taken = Kept {
            resent: true,
            ..TAKEN
        };
        let key_in_use = Kept {
            key_in_use: true,
            ..NOTHING
        };
        assert_eq!(Kept::of(&held(Hold::Unreadable, false)), taken);
        assert_eq!(
            Kept::of(&held(Hold::KeyInUse, false)),
            key_in_use,
            "a 409: the resend is not spent"
        );
        assert_eq!(
            Kept::of(&held(Hold::KeyInUse, true)),
            Kept {
                resent: true,
                ..key_in_use
            }
        );
        assert_eq!(
            Kept::of(&record(2, "sms", "provc", AttemptState::Started)),
            Kept::default()
        );
        let mut failed = held(Hold::Unreadable, true);
        failed.state = AttemptState::Failed;
        assert_eq!(Kept::of(&failed), Kept::default());
        assert_eq!((taken.spent(), Kept::default().spent()), (RESENDS, 0));
    }

    /// The step before a resend, and the one before a hold whose reason was learned
    /// after the last mark, keep for the next delivery that the resend is spent and
    /// whether the provider took the message; each renews the lease and writes nothing
    /// on the message or its timeline.
    #[test]
    fn a_resend_or_a_late_taking_is_kept_before_what_follows() {
        let key_in_use = Kept {
            key_in_use: true,
            ..NOTHING
        };
        for (kept, step) in [
            (NOTHING, resent_step(3, NOTHING)),
            (TAKEN, resent_step(3, TAKEN)),
            (key_in_use, resent_step(3, key_in_use)),
            (TAKEN, mark_step(3, Hold::Unreadable, false)),
            (key_in_use, mark_step(3, Hold::KeyInUse, true)),
        ] {
            let Some(AttemptWrite::Finish {
                attempt_no,
                state,
                detail,
                ..
            }) = step.attempt
            else {
                panic!("no attempt write: {step:?}");
            };
            assert_eq!((attempt_no, state), (3, AttemptState::Started));
            assert_eq!(
                step.message,
                MessageUpdate::default(),
                "only the lease renewed"
            );
            assert!(step.timeline.is_empty());
            let mut attempt = record(3, "sms", "provc", AttemptState::Started);
            attempt.detail = detail;
            assert_eq!(
                Kept::of(&attempt),
                Kept {
                    resent: true,
                    ..kept
                }
            );
        }
    }
}
