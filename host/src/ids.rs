//! Typed, prefixed identifiers. Nothing stringly-typed crosses a module boundary.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// Why a string is not an id of the expected kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected an id of the form {prefix}<hex>")]
pub struct InvalidId {
    /// The prefix that was expected.
    pub prefix: &'static str,
}

macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// The prefix, e.g. `evt_`.
            pub const PREFIX: &'static str = $prefix;

            /// A new id: the prefix and 32 lower-case hex digits, a UUIDv7 (a millisecond
            /// timestamp, then a counter seeded at random each millisecond, then random
            /// bits), so an id tells roughly when it was made. Time-ordered so that new rows land at the
            /// end of every index keyed by the id: the writes of one batch share a few
            /// pages instead of each touching a random one (on SQLite, where a commit
            /// writes every page it dirtied, embedded deliveries went up by a third to
            /// two thirds). Nothing relies on ids being unguessable: every lookup is
            /// scoped to the caller's workspace.
            pub fn generate() -> Self {
                Self(format!("{}{}", $prefix, uuid::Uuid::now_v7().simple()))
            }

            /// Parses `prefix` followed by 1-64 hex digits (lower-case accepted only).
            pub fn parse(s: &str) -> Result<Self, InvalidId> {
                let hex = s.strip_prefix($prefix).ok_or(InvalidId { prefix: $prefix })?;
                let ok = (1..=64).contains(&hex.len())
                    && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
                if ok { Ok(Self(s.to_string())) } else { Err(InvalidId { prefix: $prefix }) }
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
            /// When a [`Self::generate`]d id was made, epoch milliseconds (its UUIDv7
            /// timestamp); `None` for an id of another shape.
            pub fn created_ms(&self) -> Option<i64> {
                let hex = &self.0[$prefix.len()..];
                if hex.len() != 32 || hex.as_bytes()[12] != b'7' {
                    return None;
                }
                i64::from_str_radix(&hex[..12], 16).ok()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = InvalidId;
            fn from_str(s: &str) -> Result<Self, InvalidId> {
                Self::parse(s)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

prefixed_id!(
    /// A notification event, `evt_<hex>`.
    EventId, "evt_"
);
prefixed_id!(
    /// A workspace, `ws_<hex>`.
    WorkspaceId, "ws_"
);
prefixed_id!(
    /// An API key's public id, `key_<hex>` (never the secret itself).
    ApiKeyId, "key_"
);
prefixed_id!(
    /// A bulk batch, `job_<hex>`.
    JobId, "job_"
);
prefixed_id!(
    /// A delivery receipt, `dlr_<hex>`.
    ReceiptId, "dlr_"
);
prefixed_id!(
    /// A caller's webhook endpoint, `ep_<hex>`.
    EndpointId, "ep_"
);
prefixed_id!(
    /// One delivery event on its way to one webhook endpoint, `whd_<hex>`.
    WebhookDeliveryId, "whd_"
);

/// A provider slug in its canonical form. Slugs are lower-case (`prova`), but callers
/// and operators type them as the spec writes them (`provA`): every place that takes a
/// typed slug (webhook path, CLI, overrides, route files) matches it through this.
pub fn canonical_slug(slug: &str) -> String {
    slug.to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_matched_without_case() {
        assert_eq!(canonical_slug("provA"), "prova");
        assert_eq!(canonical_slug("PROVE"), "prove");
        assert_eq!(canonical_slug("my-plugin2"), "my-plugin2");
    }

    #[test]
    fn generate_parse_roundtrip() {
        let id = EventId::generate();
        assert!(id.as_str().starts_with("evt_") && id.as_str().len() == 36);
        assert_eq!(EventId::parse(id.as_str()).unwrap(), id);
        assert!(EventId::parse("evt_XYZ").is_err());
        assert!(EventId::parse("ws_abc").is_err());
        assert!(EventId::parse("evt_").is_err());
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(serde_json::from_str::<EventId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<WorkspaceId>("\"evt_00\"").is_err());
    }

    #[test]
    fn a_generated_id_tells_when_it_was_made() {
        let before = chrono::Utc::now().timestamp_millis();
        let id = EventId::generate();
        let after = chrono::Utc::now().timestamp_millis();
        let made = id.created_ms().unwrap();
        assert!((before..=after).contains(&made), "{before} {made} {after}");
        // Another shape (a caller's own id, or not a UUIDv7) tells nothing.
        assert_eq!(EventId::parse("evt_abc").unwrap().created_ms(), None);
        let v4 = format!("evt_{}", uuid::Uuid::new_v4().simple());
        assert_eq!(EventId::parse(&v4).unwrap().created_ms(), None);
    }
}
