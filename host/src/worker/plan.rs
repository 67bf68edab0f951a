//! What a delivery does next, as a plain function of what is known: the event, the
//! subscriber's preferences, the workflow, the routes and the attempts recorded so far.
//!
//! The dispatcher asks [`next`] after every step it records, so a redelivery resumes
//! where the last one stopped, and a fresh message's first step can be decided before
//! the claim and written in the claim's own transaction (see
//! [`crate::store::Delivery::claim_message`]).

use crate::circuits::Verdict;
use crate::ingest::Envelope;
use crate::model::{
    AttemptRecord, AttemptState, AttemptWrite, KeyMode, MessageStatus, MessageUpdate,
    NewTimelineEntry, Preferences, ProviderRoute, Step, StepStatus,
};
use crate::plugins::types;
use crate::routing::{self, Channel};
use crate::voice;
use crate::workflow::{self, BuildError, Workflow};
use chrono::Utc;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// Message-level error code when every provider and channel failed.
pub const DISPATCH_FAILED: &str = "DISPATCH_FAILED";
/// Message-level error code when delivery was withheld.
pub const SUPPRESSED: &str = "SUPPRESSED";

/// Whether `channel` may be used under `prefs` for `category`: a category rule for
/// the channel wins over the channel flag; absent both, it is allowed.
pub fn allowed(prefs: &Preferences, category: &str, channel: Channel) -> bool {
    prefs
        .categories
        .get(category)
        .and_then(|flags| flags.get(channel.as_str()))
        .or_else(|| prefs.channels.get(channel.as_str()))
        .copied()
        .unwrap_or(true)
}

/// Masks what provider-supplied text may echo before it is stored: the recipient's
/// contacts (email address and number, in the forms [`voice::scrub_contacts`] knows)
/// and the route's config values (credentials), so no stored detail (message error
/// detail, timeline entry, attempt record) keeps them.
pub(super) fn scrub(
    text: &str,
    email: Option<&str>,
    phone: Option<&str>,
    secrets: &[&str],
) -> String {
    let mut out = voice::scrub_contacts(text, email, phone);
    // Short values (ids like `AC1`, flags) would mask ordinary words.
    for secret in secrets.iter().filter(|s| s.len() >= 6) {
        out = out.replace(secret, "***");
    }
    out
}

/// Everything a plan depends on besides the attempts.
pub(super) struct Context<'a> {
    pub envelope: &'a Envelope,
    /// The subscriber's preferences, read right before the claim.
    pub prefs: Preferences,
    /// The workflow; `Err` with the reason when it is stored but invalid.
    pub workflow: Result<Option<Workflow>, String>,
    /// The workspace's provider routes by channel.
    pub routes: &'a BTreeMap<String, Vec<ProviderRoute>>,
    /// Each channel's providers when the workspace configures none (by channel name,
    /// from the loaded plugins: [`crate::plugins::bundled::default_route`]).
    pub defaults: &'a BTreeMap<String, Vec<String>>,
    /// Verdicts of the circuits that are not closed, by (provider, channel): a
    /// provider skipped by its circuit goes to the end of its channel's chain.
    pub circuits: &'a HashMap<(String, String), Verdict>,
    /// Whether the recipient's number is on the DND list, once looked up.
    pub dnd_listed: Option<bool>,
}

/// A provider call to make.
#[derive(Debug, Clone)]
pub(super) struct Call {
    pub channel: Channel,
    pub route: ProviderRoute,
    pub content: types::Content,
    pub attempt_no: i32,
    /// Providers of the channel moved to the end by their circuit, with why, for the
    /// timeline ("provc skipped: circuit open, ...").
    pub skipped: Vec<String>,
}

/// The next thing a delivery does.
#[derive(Debug)]
pub(super) enum Action {
    /// Record `step`, which ends the message with `status`.
    Finish { step: Step, status: MessageStatus },
    /// Look up whether the recipient's number is on the DND list, then plan again.
    CheckDnd,
    /// Record `step` (the attempt `started`), then make the call.
    Start { step: Step, call: Box<Call> },
    /// Make again the call an earlier delivery started and never finished.
    Resume(Box<Call>),
}

impl Action {
    /// The step to record before anything else happens.
    pub fn step(&self) -> Option<&Step> {
        match self {
            Action::Finish { step, .. } | Action::Start { step, .. } => Some(step),
            Action::CheckDnd | Action::Resume(_) => None,
        }
    }
}

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

impl Hold {
    /// The detail a held attempt keeps while it stays `started` ([`held_step`]).
    fn attempt_detail(self) -> String {
        format!("held: {}", self.code())
    }

    /// Whether `attempt` was held because its provider took the message unreadably:
    /// however a later call of it fails, the provider has the message, and its resend
    /// was made ([`Failure::then`]).
    pub(super) fn taken(attempt: &AttemptRecord) -> bool {
        attempt.state == AttemptState::Started
            && attempt.detail.as_deref() == Some(Self::Unreadable.attempt_detail().as_str())
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
                "the provider still answered that it holds a request under the attempt's \
                 idempotency key (409), so the message was not sent elsewhere (a second \
                 copy); the provider may deliver it"
            }
            Self::Unreadable => {
                "the provider answered that it took the message (2xx) in a form the plugin \
                 could not read, and no later call under the attempt's idempotency key got \
                 a readable answer, so the message was not sent elsewhere (a second copy); \
                 the provider may deliver it"
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
    /// `used_before` this call (a resend, or a resumed attempt), when an earlier call of
    /// the attempt was answered 2xx unreadably (`taken`).
    ///
    /// A call without an answer, or with an unreadable 2xx, is made again under the
    /// same key (a provider that de-duplicates answers with its first answer). A
    /// provider that says it holds a request under a key used before (409; a fresh key
    /// cannot be in use, so a 409 to it is an ordinary refusal), or that took the
    /// message, is not followed by a fallback: the attempt is asked again later. A
    /// resumed attempt counts as a repeat even if the worker before never made its call
    /// (no slot came free, or it died first): nothing tells the two apart.
    pub fn then(&self, resends: u32, used_before: bool, taken: bool) -> Then {
        if (self.unanswered || self.taken()) && resends < RESENDS {
            Then::Resend
        } else if used_before && self.code == HELD {
            Then::Hold(Hold::KeyInUse)
        } else if taken || self.taken() {
            Then::Hold(Hold::Unreadable)
        } else {
            Then::Fail
        }
    }
}

/// The step that hands a held attempt back ([`Hold`]): the lease released, the
/// attempt left `started` with why in its detail (so the next delivery knows;
/// [`Hold::taken`]), and a `queued` entry saying why the message waits.
pub(super) fn held_step(channel: Channel, slug: &str, attempt_no: i32, hold: Hold) -> Step {
    let detail = json!({"channel": channel.as_str(), "attempt": attempt_no,
        "held": hold.code(),
        "reason": "the provider has the message under the attempt's key: not sent elsewhere"});
    Step {
        attempt: Some(AttemptWrite::Finish {
            attempt_no,
            state: AttemptState::Started,
            provider_message_id: None,
            cost_micro_usd: 0,
            detail: Some(hold.attempt_detail()),
        }),
        message: MessageUpdate {
            release_lease: true,
            ..Default::default()
        },
        timeline: vec![entry(StepStatus::Queued, Some(slug), detail)],
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
            channel: Some(ch.into()),
            provider: Some(slug.into()),
            provider_message_id: Some(answer.provider_message_id),
            cost_add_micro_usd: answer.cost,
            release_lease: true,
            ..Default::default()
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
        message: MessageUpdate::default(),
        timeline: vec![entry(StepStatus::Failed, Some(slug), entry_detail)],
    }
}

/// One plan in progress: what was tried, for the final error detail.
struct Planner<'c, 'a> {
    ctx: &'c Context<'a>,
    attempts: &'c [AttemptRecord],
    /// "sms via provc: http-503 ..." for the final error detail.
    tried: Vec<String>,
}

/// The next action of a delivery that is not dispatched yet, given the attempts
/// recorded so far and whether its subscriber is erased.
pub(super) fn next(ctx: &Context<'_>, erased: bool, attempts: &[AttemptRecord]) -> Action {
    let mut planner = Planner {
        ctx,
        attempts,
        tried: Vec::new(),
    };
    if erased {
        return planner.suppress("subscriber was erased: delivery withheld".into());
    }
    planner.plan()
}

impl Planner<'_, '_> {
    /// Ends the message with `status`, an error code and detail, and one timeline entry.
    fn finish(
        &self,
        status: MessageStatus,
        code: &str,
        detail: String,
        channel: Option<Channel>,
    ) -> Action {
        let to = &self.ctx.envelope.request.to;
        let detail = scrub(&detail, to.email.as_deref(), to.phone.as_deref(), &[]);
        let mut timeline = json!({"error_code": code, "reason": detail});
        if let Some(c) = channel {
            timeline["channel"] = json!(c.as_str());
        }
        let step = Step {
            attempt: None,
            message: MessageUpdate {
                status: Some(status),
                channel: channel.map(|c| c.as_str().to_string()),
                error_code: Some(code.to_string()),
                error_detail: Some(detail),
                release_lease: true,
                ..Default::default()
            },
            timeline: vec![entry(StepStatus::Failed, None, timeline)],
        };
        Action::Finish { step, status }
    }

    fn suppress(&self, detail: String) -> Action {
        self.finish(MessageStatus::Suppressed, SUPPRESSED, detail, None)
    }

    fn plan(&mut self) -> Action {
        let env = self.ctx.envelope;
        let category = env.category();
        let (mut channels, opted_out): (Vec<Channel>, Vec<Channel>) = env
            .channels
            .iter()
            .partition(|c| allowed(&self.ctx.prefs, category, **c));
        // The channel of an attempt left `started` goes first (its provider first in
        // it: `by_circuits`): a channel before it that has gained a provider, or been
        // allowed again, would otherwise send a second message beside it.
        channels.sort_by_key(|c| !self.started(c.as_str(), None));
        if channels.is_empty() {
            let names: Vec<_> = opted_out.iter().map(|c| c.as_str()).collect();
            return self.suppress(format!(
                "subscriber opted out of {} (category {category:?})",
                names.join(", ")
            ));
        }
        let workflow = match &self.ctx.workflow {
            Ok(w) => w.as_ref(),
            Err(e) => {
                return self.finish(
                    MessageStatus::Failed,
                    workflow::WORKFLOW_NOT_FOUND,
                    format!("workflow {:?} is stored but invalid: {e}", env.request.name),
                    None,
                );
            }
        };
        let promotional = workflow::is_promotional(workflow, category);
        let mut first = true;
        for channel in channels {
            let to = &env.request.to;
            if let Some(problem) = routing::contact_problem(
                channel,
                to.email.as_deref(),
                to.phone.as_deref(),
                to.device_tokens.as_deref(),
            ) {
                self.tried.push(format!("{}: {problem}", channel.as_str()));
                continue;
            }
            let content = match workflow::build_content(workflow, channel, env) {
                Ok(c) => c,
                // Spec voice rule 5: no call, the event ends FAILED, whatever else remains.
                Err(e @ BuildError::VoiceVariablesMissing(_)) => {
                    let detail = format!("event {}: {e}; no call placed", env.event_id);
                    return self.finish(MessageStatus::Failed, e.code(), detail, Some(channel));
                }
                Err(e) if first => {
                    return self.finish(
                        MessageStatus::Failed,
                        e.code(),
                        e.to_string(),
                        Some(channel),
                    );
                }
                Err(e) => {
                    self.tried.push(format!("{}: {e}", channel.as_str()));
                    continue;
                }
            };
            if channel == Channel::Voice && promotional {
                // Spec: promotional voice to a DND-screened number ends SUPPRESSED;
                // falling back to another channel would contact the same person anyway.
                match self.ctx.dnd_listed {
                    None => return Action::CheckDnd,
                    Some(true) => {
                        let phone = to.phone.as_deref().unwrap_or_default();
                        return self.suppress(format!(
                            "promotional voice call to {} withheld: the number is on the DND list",
                            voice::mask_phone(phone)
                        ));
                    }
                    Some(false) => {}
                }
            }
            first = false;
            let (route, skipped) = self.by_circuits(channel, self.route_for(channel));
            if route.is_empty() {
                self.tried
                    .push(format!("{}: no provider configured", channel.as_str()));
                continue;
            }
            // A test key goes through every check above, as a live key does; only the
            // provider call is left out.
            if env.key_mode == KeyMode::Test {
                return self.test_send(channel, &route[0].provider);
            }
            for route in route {
                if let Some(action) = self.attempt(channel, route, &content, &skipped) {
                    return action;
                }
            }
        }
        let detail = format!("all providers failed; tried {}", self.tried.join("; "));
        self.finish(MessageStatus::Failed, DISPATCH_FAILED, detail, None)
    }

    /// The channel's providers: the workspace's route or the default one, with the
    /// trigger's preferred email provider moved first when it is in the route.
    fn route_for(&self, channel: Channel) -> Vec<ProviderRoute> {
        let mut route = self
            .ctx
            .routes
            .get(channel.as_str())
            .cloned()
            .unwrap_or_else(|| {
                let slugs = self.ctx.defaults.get(channel.as_str());
                slugs
                    .into_iter()
                    .flatten()
                    .map(|slug| ProviderRoute {
                        provider: slug.clone(),
                        config: BTreeMap::new(),
                    })
                    .collect()
            });
        let preferred = self
            .ctx
            .envelope
            .request
            .overrides
            .as_ref()
            .and_then(|o| o.email.as_ref())
            .and_then(|e| e.provider.as_deref());
        if let (Channel::Email, Some(p)) = (channel, preferred)
            && let Some(i) = route
                .iter()
                .position(|r| r.provider.eq_ignore_ascii_case(p))
        {
            let r = route.remove(i);
            route.insert(0, r);
        }
        route
    }

    /// Whether an attempt on channel `ch` (by `provider`, if given) is left `started`.
    fn started(&self, ch: &str, provider: Option<&str>) -> bool {
        self.attempts.iter().any(|a| {
            a.state == AttemptState::Started
                && a.channel == ch
                && provider.is_none_or(|p| a.provider == p)
        })
    }

    /// `route` with the providers whose circuit says skip moved to its end (still tried
    /// when everything before them failed), and why each was moved. A provider with an
    /// attempt left `started` goes first, whatever its circuit says or wherever the
    /// route puts it now: it may have the message (a worker died in the call, or it
    /// answered that it holds the key), and any other provider would send a second one.
    fn by_circuits(
        &self,
        channel: Channel,
        route: Vec<ProviderRoute>,
    ) -> (Vec<ProviderRoute>, Vec<String>) {
        let ch = channel.as_str();
        let (mut first, mut kept, mut moved, mut why) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for r in route {
            if self.started(ch, Some(&r.provider)) {
                first.push(r);
                continue;
            }
            match self.ctx.circuits.get(&(r.provider.clone(), ch.to_string())) {
                Some(Verdict::Skip(reason)) => {
                    why.push(format!("{} skipped: {reason}", r.provider));
                    moved.push(r);
                }
                _ => kept.push(r),
            }
        }
        first.append(&mut kept);
        first.append(&mut moved);
        (first, why)
    }

    /// Test keys: no plugin call, a synthetic id, zero cost, the same timeline shape.
    fn test_send(&self, channel: Channel, provider: &str) -> Action {
        let id = format!("svc_test_{}", self.ctx.envelope.event_id);
        let p = Some(provider);
        let ch = channel.as_str();
        let step = Step {
            attempt: None,
            message: MessageUpdate {
                status: Some(MessageStatus::Delivered),
                attempts: Some(1),
                channel: Some(ch.into()),
                provider: Some(provider.to_string()),
                provider_message_id: Some(id.clone()),
                release_lease: true,
                ..Default::default()
            },
            timeline: vec![
                entry(
                    StepStatus::Sent,
                    p,
                    json!({"channel": ch, "test_mode": true, "provider_message_id": id}),
                ),
                entry(
                    StepStatus::Delivered,
                    p,
                    json!({"channel": ch, "test_mode": true}),
                ),
            ],
        };
        Action::Finish {
            step,
            status: MessageStatus::Delivered,
        }
    }

    /// The action for this provider, or `None` when an earlier attempt of it failed.
    fn attempt(
        &mut self,
        channel: Channel,
        route: ProviderRoute,
        content: &types::Content,
        skipped: &[String],
    ) -> Option<Action> {
        let slug = route.provider.as_str();
        let ch = channel.as_str();
        let previous = self
            .attempts
            .iter()
            .rev()
            .find(|a| a.channel == ch && a.provider == slug);
        match previous {
            Some(a) if a.state == AttemptState::Failed => {
                self.tried.push(format!(
                    "{ch} via {slug} ({})",
                    a.detail.as_deref().unwrap_or("failed")
                ));
                None
            }
            // Recorded as sent but the message was not finished: cannot happen (one
            // transaction), but never send twice.
            Some(a) if a.state == AttemptState::Sent => {
                let answer = Answer {
                    provider_message_id: a.provider_message_id.clone().unwrap_or_default(),
                    cost: a.cost_micro_usd,
                    plugin: None,
                    resends: 0,
                };
                Some(Action::Finish {
                    step: sent_step(channel, slug, a.attempt_no, answer, false, skipped),
                    status: MessageStatus::Sent,
                })
            }
            Some(a) => Some(Action::Resume(Box::new(Call {
                channel,
                attempt_no: a.attempt_no,
                content: content.clone(),
                route,
                skipped: skipped.to_vec(),
            }))),
            None => {
                let attempt_no = self
                    .attempts
                    .iter()
                    .map(|a| a.attempt_no)
                    .max()
                    .unwrap_or(0)
                    + 1;
                let step = Step {
                    attempt: Some(AttemptWrite::Start {
                        attempt_no,
                        channel: ch.into(),
                        provider: slug.into(),
                    }),
                    message: MessageUpdate {
                        attempts: Some(attempt_no),
                        channel: Some(ch.into()),
                        provider: Some(slug.into()),
                        ..Default::default()
                    },
                    timeline: Vec::new(),
                };
                Some(Action::Start {
                    step,
                    call: Box::new(Call {
                        channel,
                        attempt_no,
                        content: content.clone(),
                        route,
                        skipped: skipped.to_vec(),
                    }),
                })
            }
        }
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
