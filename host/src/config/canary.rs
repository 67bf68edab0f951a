//! `[canary]`: how a canary plugin version is judged (see `crate::canary`).

use serde::{Deserialize, Serialize};

/// Canary-judging settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CanaryConfig {
    /// How long a canary serves before it can be promoted, seconds (it is rolled back
    /// as soon as it is worse by the margin).
    pub window_secs: u64,
    /// Sends the canary needs before it is judged either way.
    pub min_sends: u32,
    /// Percentage points by which the canary's failure rate may exceed the stable
    /// version's: above it the canary is rolled back, at or below it (after
    /// `window_secs`) promoted.
    pub margin_percent: u32,
}

impl Default for CanaryConfig {
    fn default() -> Self {
        Self {
            window_secs: 300,
            min_sends: 100,
            margin_percent: 5,
        }
    }
}

impl CanaryConfig {
    /// Checks ranges; the error names the setting.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=3_600).contains(&self.window_secs) {
            return Err("canary.window_secs must be between 1 and 3600".into());
        }
        if !(1..=1_000_000).contains(&self.min_sends) {
            return Err("canary.min_sends must be between 1 and 1000000".into());
        }
        if self.margin_percent > 100 {
            return Err("canary.margin_percent must be between 0 and 100".into());
        }
        Ok(())
    }
}
