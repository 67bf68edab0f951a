//! `[console]`: the operator console's settings.

use serde::{Deserialize, Serialize};

/// Shortest `session_secret` accepted, bytes.
pub const MIN_SESSION_SECRET_LEN: usize = 32;

/// Longest session accepted, minutes (30 days).
pub const MAX_SESSION_MINUTES: u32 = 43_200;

/// Console settings (`[console]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleConfig {
    /// Signs session cookies; set the same value on every gateway behind one address.
    /// Without it each process makes its own at start (sessions end on restart and
    /// hold on that process only). At least [`MIN_SESSION_SECRET_LEN`] bytes: with a
    /// copy of the database's key hashes it would mint a session for any key.
    pub session_secret: Option<String>,
    /// How long a session lasts, minutes (1 to [`MAX_SESSION_MINUTES`]).
    pub session_minutes: u32,
    /// Keys not accepted from one address per minute before that address's sign-ins
    /// are refused (429) until the minute ends, without looking the key up; 0: no
    /// limit. Behind a proxy, list it in `trusted_proxies`, or every sign-in comes from
    /// the proxy's address.
    pub max_failed_sign_ins_per_minute: u32,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            session_secret: None,
            session_minutes: 480,
            max_failed_sign_ins_per_minute: 10,
        }
    }
}
