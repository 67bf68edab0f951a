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

/// How many times a call that got no answer is made again, under the same idempotency
/// key, before its attempt counts as failed and the next provider is tried. Without an
/// answer the provider may have taken the message: a provider that de-duplicates
/// answers the resend with its first answer, where a fallback (another provider, or
/// another attempt's key) would send the person a second message. Once: a provider
/// that does not de-duplicate gets at most one copy more than before.
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

/// A provider call that did not end in an acceptance.
#[derive(Debug)]
pub(super) struct Failure {
    pub code: String,
    pub detail: String,
    /// No answer came: the provider may have taken the message ([`RESENDS`]).
    pub unanswered: bool,
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
    /// (a provider's own refusal, such as a 503, is an answer; a fallback is safe).
    pub fn rejected(r: types::Rejection) -> Self {
        let unanswered = UNANSWERED.contains(&r.code.as_str());
        Self {
            code: r.code,
            detail: r.detail,
            unanswered,
        }
    }

    /// Whether the call is made again under the same key, after `resends` so far.
    pub fn resend(&self, resends: u32) -> bool {
        self.unanswered && resends < RESENDS
    }

    /// Whether the provider says it holds a request under the attempt's key, for a call
    /// under a key `used_before` (a resend or a resumed attempt): then the attempt is
    /// neither failed nor followed by a fallback, but asked again later under the key
    /// (a fresh key cannot be in use: a 409 to it is an ordinary refusal). A resumed
    /// attempt counts as a repeat even if the worker before never made its call (no
    /// slot came free, or it died first): nothing tells the two apart.
    pub fn held(&self, used_before: bool) -> bool {
        used_before && self.code == HELD
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
mod tests {
    use super::*;
    use crate::ids::{EventId, WorkspaceId};
    use crate::routing::Priority;

    fn envelope(channels: Vec<Channel>, key_mode: KeyMode) -> Envelope {
        let request = serde_json::from_value(json!({
            "name": "welcome",
            "to": {"subscriberId": "alice", "email": "alice@acme.test", "phone": "+14155550123"},
            "payload": {"first": "Alice"}
        }))
        .unwrap();
        Envelope {
            v: 1,
            event_id: EventId::parse("evt_0a").unwrap(),
            workspace_id: WorkspaceId::parse("ws_0b").unwrap(),
            key_mode,
            priority: Priority::Normal,
            channels,
            accepted_at: Utc::now(),
            request,
        }
    }

    fn welcome(promotional: bool) -> Workflow {
        serde_json::from_value(json!({
            "name": "welcome", "promotional": promotional,
            "email": {"subject": "Hi", "text": "Hello {{ first }}"},
            "sms": {"text": "Hello {{ first }}"},
            "voice": {"script": "Hello {{ first }}"}
        }))
        .unwrap()
    }

    /// The bundled plugins' default routes, as the registry gives them.
    fn defaults() -> &'static BTreeMap<String, Vec<String>> {
        static DEFAULTS: std::sync::OnceLock<BTreeMap<String, Vec<String>>> =
            std::sync::OnceLock::new();
        DEFAULTS.get_or_init(|| {
            [
                ("email", &["prova", "provb"][..]),
                ("sms", &["provc", "provd"]),
                ("push", &["prova"]),
                ("whatsapp", &["provd"]),
                ("voice", &["prove", "provc", "provd"]),
            ]
            .into_iter()
            .map(|(c, slugs)| (c.to_string(), slugs.iter().map(|s| s.to_string()).collect()))
            .collect()
        })
    }

    fn no_circuits() -> &'static HashMap<(String, String), Verdict> {
        static NONE: std::sync::OnceLock<HashMap<(String, String), Verdict>> =
            std::sync::OnceLock::new();
        NONE.get_or_init(HashMap::new)
    }

    fn context<'a>(
        envelope: &'a Envelope,
        routes: &'a BTreeMap<String, Vec<ProviderRoute>>,
    ) -> Context<'a> {
        Context {
            envelope,
            prefs: Preferences::default(),
            workflow: Ok(Some(welcome(false))),
            routes,
            defaults: defaults(),
            circuits: no_circuits(),
            dnd_listed: None,
        }
    }

    fn record(no: i32, channel: &str, provider: &str, state: AttemptState) -> AttemptRecord {
        AttemptRecord {
            attempt_no: no,
            channel: channel.into(),
            provider: provider.into(),
            state,
            provider_message_id: (state == AttemptState::Sent).then(|| "pm-1".into()),
            cost_micro_usd: 0,
            detail: (state == AttemptState::Failed).then(|| "http-503: down".into()),
        }
    }

    /// `(status, error code, error detail)` of a finishing action.
    fn finish(action: &Action) -> (MessageStatus, Option<String>, Option<String>) {
        match action {
            Action::Finish { step, status } => (
                *status,
                step.message.error_code.clone(),
                step.message.error_detail.clone(),
            ),
            other => panic!("not a finish: {other:?}"),
        }
    }

    /// `(channel, provider, attempt number)` of a call, and whether it is resumed.
    fn call(action: &Action) -> (&'static str, String, i32, bool) {
        match action {
            Action::Start { call, step } => {
                assert!(matches!(step.attempt, Some(AttemptWrite::Start { .. })));
                assert_eq!(step.message.attempts, Some(call.attempt_no));
                (
                    call.channel.as_str(),
                    call.route.provider.clone(),
                    call.attempt_no,
                    false,
                )
            }
            Action::Resume(call) => (
                call.channel.as_str(),
                call.route.provider.clone(),
                call.attempt_no,
                true,
            ),
            other => panic!("not a call: {other:?}"),
        }
    }

    #[test]
    fn only_an_unanswered_call_is_resent_and_only_so_often() {
        let rejected = |code: &str, retryable| {
            Failure::rejected(types::Rejection {
                code: code.into(),
                detail: "d".into(),
                retryable,
            })
        };
        assert!(rejected("timeout", true).resend(0));
        assert!(rejected("transport", true).resend(RESENDS - 1));
        assert!(!rejected("transport", true).resend(RESENDS), "bounded");
        assert!(
            !rejected("http-503", true).resend(0),
            "an answer, if retryable"
        );
        assert!(!rejected("http-400", false).resend(0));
        assert!(Failure::timed_out(Duration::from_secs(1)).resend(0));
        assert!(!Failure::answered("plugin-error", "trap").resend(0));
    }

    #[test]
    fn an_attempt_left_started_is_resumed_first_whatever_circuits_or_route_say() {
        let env = envelope(vec![Channel::Sms], KeyMode::Live);
        let routes = BTreeMap::new();
        let circuits: HashMap<(String, String), Verdict> = [(
            ("provc".to_string(), "sms".to_string()),
            Verdict::Skip("circuit open".into()),
        )]
        .into();
        let mut ctx = context(&env, &routes);
        ctx.circuits = &circuits;
        // Nothing tried yet: provc's open circuit puts provd first.
        assert_eq!(
            call(&next(&ctx, false, &[])),
            ("sms", "provd".into(), 1, false)
        );
        // provc may have the message: resumed, never provd started beside it.
        let started = [record(1, "sms", "provc", AttemptState::Started)];
        assert_eq!(
            call(&next(&ctx, false, &started)),
            ("sms", "provc".into(), 1, true)
        );
        // Nor when the route has put another provider first since.
        let route = |slug: &str| ProviderRoute {
            provider: slug.into(),
            config: BTreeMap::new(),
        };
        let reordered: BTreeMap<String, Vec<ProviderRoute>> =
            [("sms".to_string(), vec![route("provd"), route("provc")])].into();
        let ctx = context(&env, &reordered);
        assert_eq!(
            call(&next(&ctx, false, &started)),
            ("sms", "provc".into(), 1, true)
        );
        // Nor when a channel before it has gained a provider since its own failed.
        let env = envelope(vec![Channel::Email, Channel::Sms], KeyMode::Live);
        let ctx = context(&env, &routes);
        let second = [
            record(1, "email", "prova", AttemptState::Failed),
            record(2, "sms", "provc", AttemptState::Started),
        ];
        assert_eq!(
            call(&next(&ctx, false, &second)),
            ("sms", "provc".into(), 2, true)
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
        assert!(rejected("http-409").held(true));
        assert!(!rejected("http-409").held(false), "a fresh key: a refusal");
        assert!(!rejected("http-409").resend(0), "an answer: not resent");
        assert!(!rejected("http-400").held(true));
        assert!(!rejected("timeout").held(true));
    }
    #[test]
    fn a_fresh_message_starts_its_first_provider_then_falls_back_in_order() {
        let routes = BTreeMap::new();
        let env = envelope(vec![Channel::Email, Channel::Sms], KeyMode::Live);
        let ctx = context(&env, &routes);
        assert_eq!(
            call(&next(&ctx, false, &[])),
            ("email", "prova".into(), 1, false)
        );
        // Started and not finished (a worker died in the call): the same call again.
        let started = [record(1, "email", "prova", AttemptState::Started)];
        assert_eq!(
            call(&next(&ctx, false, &started)),
            ("email", "prova".into(), 1, true)
        );
        let mut attempts = vec![record(1, "email", "prova", AttemptState::Failed)];
        assert_eq!(
            call(&next(&ctx, false, &attempts)),
            ("email", "provb".into(), 2, false)
        );
        attempts.push(record(2, "email", "provb", AttemptState::Failed));
        assert_eq!(
            call(&next(&ctx, false, &attempts)),
            ("sms", "provc".into(), 3, false)
        );
        attempts.push(record(3, "sms", "provc", AttemptState::Failed));
        attempts.push(record(4, "sms", "provd", AttemptState::Failed));
        let (status, code, detail) = finish(&next(&ctx, false, &attempts));
        assert_eq!(
            (status, code.as_deref()),
            (MessageStatus::Failed, Some(DISPATCH_FAILED))
        );
        assert_eq!(
            detail.as_deref(),
            Some(
                "all providers failed; tried email via prova (http-503: down); email via provb \
                 (http-503: down); sms via provc (http-503: down); sms via provd (http-503: down)"
            )
        );
        // Recorded sent, message not finished: finished as sent, never sent again.
        let sent = [record(1, "email", "prova", AttemptState::Sent)];
        assert_eq!(finish(&next(&ctx, false, &sent)).0, MessageStatus::Sent);
    }

    #[test]
    fn test_keys_end_delivered_without_a_call() {
        let routes = BTreeMap::new();
        let env = envelope(vec![Channel::Sms], KeyMode::Test);
        let action = next(&context(&env, &routes), false, &[]);
        assert_eq!(finish(&action).0, MessageStatus::Delivered);
        let step = action.step().unwrap();
        assert_eq!(step.message.provider.as_deref(), Some("provc"));
        assert_eq!(
            step.message.provider_message_id.as_deref(),
            Some("svc_test_evt_0a")
        );
        assert_eq!(step.timeline.len(), 2);
    }

    #[test]
    fn erasure_opt_outs_and_invalid_workflows_end_without_a_call() {
        let routes = BTreeMap::new();
        let env = envelope(vec![Channel::Sms], KeyMode::Live);
        let mut ctx = context(&env, &routes);
        assert_eq!(
            finish(&next(&ctx, true, &[])).1.as_deref(),
            Some(SUPPRESSED),
            "erased"
        );
        ctx.workflow = Err("bad".into());
        let (status, code, _) = finish(&next(&ctx, false, &[]));
        assert_eq!(
            (status, code.as_deref()),
            (MessageStatus::Failed, Some(workflow::WORKFLOW_NOT_FOUND))
        );
        ctx.prefs.channels.insert("sms".into(), false);
        let (status, _, detail) = finish(&next(&ctx, false, &[]));
        assert_eq!(status, MessageStatus::Suppressed);
        assert!(detail.unwrap().contains("opted out of sms"));
    }

    #[test]
    fn promotional_voice_asks_for_the_dnd_list_first() {
        let routes = BTreeMap::new();
        let env = envelope(vec![Channel::Voice], KeyMode::Live);
        let mut ctx = context(&env, &routes);
        assert_eq!(call(&next(&ctx, false, &[])).1, "prove", "not promotional");
        ctx.workflow = Ok(Some(welcome(true)));
        assert!(matches!(next(&ctx, false, &[]), Action::CheckDnd));
        assert!(next(&ctx, false, &[]).step().is_none());
        ctx.dnd_listed = Some(false);
        assert_eq!(call(&next(&ctx, false, &[])).1, "prove");
        ctx.dnd_listed = Some(true);
        let (status, _, detail) = finish(&next(&ctx, false, &[]));
        assert_eq!(status, MessageStatus::Suppressed);
        assert!(
            !detail.unwrap().contains("4155550123"),
            "the number is masked"
        );
    }

    #[test]
    fn category_rules_win_over_channel_flags() {
        let mut prefs = Preferences::default();
        assert!(allowed(&prefs, "orders", Channel::Sms));
        prefs.channels.insert("sms".into(), false);
        assert!(!allowed(&prefs, "orders", Channel::Sms));
        prefs
            .categories
            .insert("orders".into(), [("sms".to_string(), true)].into());
        assert!(allowed(&prefs, "orders", Channel::Sms));
        assert!(!allowed(&prefs, "marketing", Channel::Sms));
        prefs
            .categories
            .insert("marketing".into(), [("email".to_string(), false)].into());
        assert!(!allowed(&prefs, "marketing", Channel::Email));
        assert!(allowed(&prefs, "marketing", Channel::Push));
    }

    #[test]
    fn contacts_and_credentials_are_scrubbed_from_details() {
        let phone = Some("+14155550123");
        for text in [
            "invalid number +14155550123",
            "To=%2B14155550123 rejected",
            "number 14155550123 unreachable",
        ] {
            let out = scrub(text, None, phone, &[]);
            assert!(!out.contains("4155550123"), "{out}");
        }
        let email = Some("gone@acme.test");
        for text in [
            r#"provider answered 400: {"error":"mailbox gone@acme.test does not exist"}"#,
            "to=gone%40acme.test rejected",
            "550 <GONE@ACME.TEST>: user unknown",
        ] {
            let out = scrub(text, email, phone, &[]);
            assert!(!out.to_ascii_lowercase().contains("gone"), "{out}");
            assert!(out.contains("g***@acme.test"), "{out}");
        }
        let out = scrub(
            "bad key sk_live_abcdef for AC1",
            None,
            None,
            &["sk_live_abcdef", "AC1"],
        );
        assert_eq!(out, "bad key *** for AC1");
        assert_eq!(scrub("x", None, None, &[]), "x");
    }
}
