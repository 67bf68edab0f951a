//! `[console]`: the operator console's settings.

use serde::{Deserialize, Serialize};

/// Console settings (`[console]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleConfig {
    /// Signs session cookies; set the same value on every gateway behind one address.
    /// Without it each process makes its own at start (sessions end on restart and
    /// hold on that process only).
    pub session_secret: Option<String>,
    /// How long a session lasts, minutes.
    pub session_minutes: u32,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            session_secret: None,
            session_minutes: 480,
        }
    }
}
