//! Priority and channel choice: plain functions, no I/O.
//!
//! Orders (the spec gives only "voice before SMS when urgent, SMS before voice
//! otherwise"; the rest is Switchboard's decision, by typical reach and price):
//! - reachability (CRITICAL, HIGH, or `voice_primary`): voice, sms, whatsapp, push, email;
//! - cost (NORMAL, LOW): push, email, whatsapp, sms, voice.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Resolved priority.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    PartialOrd,
    Ord,
    utoipa::ToSchema,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum Priority {
    /// 0.
    Critical,
    /// 1.
    High,
    /// 2 (default).
    Normal,
    /// 3.
    Low,
}

impl Priority {
    /// Parses `X-Priority-Override`, ignoring case and surrounding space; anything
    /// else (or nothing) is `NORMAL`, silently, as the spec says.
    pub fn from_header(value: Option<&str>) -> Self {
        match value.map(|v| v.trim().to_ascii_uppercase()).as_deref() {
            Some("CRITICAL") => Priority::Critical,
            Some("HIGH") => Priority::High,
            Some("LOW") => Priority::Low,
            _ => Priority::Normal,
        }
    }

    /// CRITICAL and HIGH are urgent.
    pub fn is_urgent(self) -> bool {
        matches!(self, Priority::Critical | Priority::High)
    }

    /// The MessageDto integer: 0 = Critical … 3 = Low.
    pub fn as_i32(self) -> i32 {
        match self {
            Priority::Critical => 0,
            Priority::High => 1,
            Priority::Normal => 2,
            Priority::Low => 3,
        }
    }

    /// The spec's upper-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "CRITICAL",
            Priority::High => "HIGH",
            Priority::Normal => "NORMAL",
            Priority::Low => "LOW",
        }
    }
}

/// A delivery channel.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    PartialOrd,
    Ord,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Channel {
    /// SMS.
    Sms,
    /// Email.
    Email,
    /// Mobile push.
    Push,
    /// WhatsApp.
    Whatsapp,
    /// Voice call.
    Voice,
}

impl Channel {
    /// Every channel, in the spec's order.
    pub const ALL: [Channel; 5] = [
        Channel::Sms,
        Channel::Email,
        Channel::Push,
        Channel::Whatsapp,
        Channel::Voice,
    ];

    /// The spec's lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Sms => "sms",
            Channel::Email => "email",
            Channel::Push => "push",
            Channel::Whatsapp => "whatsapp",
            Channel::Voice => "voice",
        }
    }
}

/// Urgent order.
pub const REACHABILITY_ORDER: [Channel; 5] = [
    Channel::Voice,
    Channel::Sms,
    Channel::Whatsapp,
    Channel::Push,
    Channel::Email,
];
/// Non-urgent order.
pub const COST_ORDER: [Channel; 5] = [
    Channel::Push,
    Channel::Email,
    Channel::Whatsapp,
    Channel::Sms,
    Channel::Voice,
];

/// What routing needs to know about a trigger.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reach<'a> {
    /// `to.email`.
    pub email: Option<&'a str>,
    /// `to.phone`.
    pub phone: Option<&'a str>,
    /// Number of `to.deviceTokens`.
    pub device_tokens: usize,
    /// `overrides.voice` present (even empty).
    pub voice_override: bool,
    /// `overrides.whatsapp` present (even empty).
    pub whatsapp_override: bool,
    /// `overrides.extraParams`.
    pub extra_params: Option<&'a BTreeMap<String, String>>,
}

/// Why no channel could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "recipient has no contact details for any channel: set to.email, to.phone or to.deviceTokens"
)]
pub struct NoContact;

/// E.164 as the spec's voice rule 1 states it: `+`, country code, digits only. The same
/// check the plugins use, from the SDK.
pub use switchboard_sdk::validate::is_e164;

/// Why `channel` cannot carry a message to these contact details, if it cannot. The
/// worker checks this before any provider call, with live and test keys alike, so a test
/// key ends where a live key would (the bundled plugins refuse the same addresses).
/// The answer never repeats the address itself.
pub fn contact_problem(
    channel: Channel,
    email: Option<&str>,
    phone: Option<&str>,
    device_tokens: Option<&[String]>,
) -> Option<&'static str> {
    use switchboard_sdk::validate::is_email;
    match channel {
        Channel::Email if !email.is_some_and(is_email) => Some("to.email is not an email address"),
        Channel::Sms | Channel::Whatsapp | Channel::Voice if !phone.is_some_and(is_e164) => {
            Some("to.phone is not an E.164 number (+, country code, digits only)")
        }
        Channel::Push if !device_tokens.is_some_and(|t| t.iter().any(|t| !t.trim().is_empty())) => {
            Some("to.deviceTokens holds no token")
        }
        _ => None,
    }
}

/// Channels the contact details make eligible.
///
/// - email: `to.email` non-empty; push: at least one device token;
/// - sms: `to.phone` non-empty;
/// - whatsapp: a phone and `overrides.whatsapp` present (a template is needed);
/// - voice (rule 1): `to.phone` is E.164 and `overrides.voice` is present.
pub fn eligible(reach: &Reach<'_>) -> Vec<Channel> {
    let nonempty = |s: Option<&str>| s.is_some_and(|s| !s.trim().is_empty());
    let mut out = Vec::new();
    if nonempty(reach.email) {
        out.push(Channel::Email);
    }
    if reach.device_tokens > 0 {
        out.push(Channel::Push);
    }
    if nonempty(reach.phone) {
        out.push(Channel::Sms);
        if reach.whatsapp_override {
            out.push(Channel::Whatsapp);
        }
        if reach.voice_override && reach.phone.is_some_and(is_e164) {
            out.push(Channel::Voice);
        }
    }
    out
}

/// The order in which channels will be attempted; the first is the response's
/// `channel`. Rule 2: voice first only when urgent or `voice_primary` is `true`/`1`;
/// otherwise the cost order applies (SMS before voice).
pub fn channel_order(priority: Priority, reach: &Reach<'_>) -> Result<Vec<Channel>, NoContact> {
    let eligible = eligible(reach);
    if eligible.is_empty() {
        return Err(NoContact);
    }
    let base: &[Channel] = if priority.is_urgent() {
        &REACHABILITY_ORDER
    } else {
        &COST_ORDER
    };
    let mut order: Vec<Channel> = base
        .iter()
        .copied()
        .filter(|c| eligible.contains(c))
        .collect();
    let voice_primary = reach
        .extra_params
        .and_then(|p| p.get("voice_primary"))
        .is_some_and(|v| v == "true" || v == "1");
    if voice_primary && let Some(i) = order.iter().position(|c| *c == Channel::Voice) {
        let voice = order.remove(i);
        order.insert(0, voice);
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reach<'a>(
        email: Option<&'a str>,
        phone: Option<&'a str>,
        tokens: usize,
        voice: bool,
    ) -> Reach<'a> {
        Reach {
            email,
            phone,
            device_tokens: tokens,
            voice_override: voice,
            ..Reach::default()
        }
    }

    #[test]
    fn contact_problems_are_found_per_channel() {
        let tokens = vec!["tok".to_string()];
        let ok = |c, e, p, t| contact_problem(c, e, p, t).is_none();
        assert!(ok(Channel::Email, Some("a@example.com"), None, None));
        assert!(!ok(Channel::Email, Some("not-an-email"), None, None));
        assert!(ok(Channel::Sms, None, Some("+14155550123"), None));
        assert!(!ok(Channel::Sms, None, Some("415 555 0123"), None));
        assert!(!ok(Channel::Whatsapp, None, Some("+1 415 555 0123"), None));
        assert!(ok(Channel::Push, None, None, Some(&tokens)));
        assert!(!ok(Channel::Push, None, None, Some(&[" ".to_string()])));
        let problem = contact_problem(Channel::Email, Some("x y@example.com"), None, None);
        assert!(
            !problem.unwrap().contains("x y"),
            "the address is never repeated"
        );
    }

    #[test]
    fn priority_header_parsing() {
        assert_eq!(Priority::from_header(Some("CRITICAL")), Priority::Critical);
        assert_eq!(Priority::from_header(Some(" high ")), Priority::High);
        assert_eq!(Priority::from_header(Some("LOW")), Priority::Low);
        assert_eq!(Priority::from_header(Some("URGENT!!")), Priority::Normal);
        assert_eq!(Priority::from_header(None), Priority::Normal);
        assert_eq!(Priority::Critical.as_i32(), 0);
        assert_eq!(Priority::Low.as_i32(), 3);
    }

    #[test]
    fn voice_needs_e164_and_the_override() {
        assert!(eligible(&reach(None, Some("+14155550100"), 0, true)).contains(&Channel::Voice));
        assert!(!eligible(&reach(None, Some("+14155550100"), 0, false)).contains(&Channel::Voice));
        for bad in [
            "+1 415 555 0100",
            "+1-415-555-0100",
            "(415) 5550100",
            "004155550100",
            "+0415",
        ] {
            let e = eligible(&reach(None, Some(bad), 0, true));
            assert!(!e.contains(&Channel::Voice), "{bad}");
            assert!(e.contains(&Channel::Sms), "{bad} still reaches sms");
        }
    }

    #[test]
    fn urgent_takes_reachability_order_others_cost_order() {
        let r = reach(Some("a@b.test"), Some("+14155550100"), 1, true);
        assert_eq!(
            channel_order(Priority::Critical, &r).unwrap(),
            vec![Channel::Voice, Channel::Sms, Channel::Push, Channel::Email]
        );
        assert_eq!(
            channel_order(Priority::High, &r).unwrap()[0],
            Channel::Voice
        );
        assert_eq!(
            channel_order(Priority::Normal, &r).unwrap(),
            vec![Channel::Push, Channel::Email, Channel::Sms, Channel::Voice]
        );
        let phone_only = reach(None, Some("+14155550100"), 0, true);
        assert_eq!(
            channel_order(Priority::Low, &phone_only).unwrap(),
            vec![Channel::Sms, Channel::Voice]
        );
        assert_eq!(
            channel_order(Priority::Critical, &phone_only).unwrap(),
            vec![Channel::Voice, Channel::Sms]
        );
    }

    #[test]
    fn voice_primary_puts_voice_first_for_normal_priority() {
        let mut params = BTreeMap::new();
        params.insert("voice_primary".to_string(), "1".to_string());
        let r = Reach {
            extra_params: Some(&params),
            ..reach(Some("a@b.test"), Some("+14155550100"), 0, true)
        };
        assert_eq!(
            channel_order(Priority::Normal, &r).unwrap()[0],
            Channel::Voice
        );
        params.insert("voice_primary".to_string(), "yes".to_string());
        let r = Reach {
            extra_params: Some(&params),
            ..reach(None, Some("+14155550100"), 0, true)
        };
        assert_eq!(
            channel_order(Priority::Normal, &r).unwrap()[0],
            Channel::Sms
        );
        // voice_primary without a voice-eligible phone changes nothing.
        let r = Reach {
            extra_params: Some(&params),
            ..reach(Some("a@b.test"), None, 0, true)
        };
        assert_eq!(
            channel_order(Priority::Normal, &r).unwrap(),
            vec![Channel::Email]
        );
    }

    #[test]
    fn no_contact_is_an_error_and_empty_values_do_not_count() {
        assert_eq!(
            channel_order(Priority::Normal, &reach(None, None, 0, true)),
            Err(NoContact)
        );
        assert_eq!(
            channel_order(Priority::Normal, &reach(Some(" "), Some(""), 0, true)),
            Err(NoContact)
        );
        let wa = Reach {
            whatsapp_override: true,
            ..reach(None, Some("+14155550100"), 0, false)
        };
        assert_eq!(
            channel_order(Priority::Normal, &wa).unwrap(),
            vec![Channel::Whatsapp, Channel::Sms]
        );
    }
}
