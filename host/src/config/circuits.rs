//! `[circuits]`: circuit breakers per provider and channel (see `crate::circuits`).

use serde::{Deserialize, Serialize};

/// Circuit-breaker settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CircuitsConfig {
    /// Count outcomes and open circuits; off, every provider keeps its place.
    pub enabled: bool,
    /// The span failures are counted over, seconds.
    pub window_secs: u64,
    /// Sends a provider needs in the window before its circuit can open.
    pub min_samples: u32,
    /// Failures (rejected, timed out, bounced) per 100 sends that open the circuit.
    pub failure_percent: u32,
    /// How long an open circuit keeps its provider at the end of the chain, seconds.
    pub cooldown_secs: u64,
    /// Sends let through after the cooldown: one failure opens it again, this many
    /// successes close it.
    pub probes: u32,
}

impl Default for CircuitsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            window_secs: 60,
            min_samples: 20,
            failure_percent: 50,
            cooldown_secs: 30,
            probes: 3,
        }
    }
}

impl CircuitsConfig {
    /// Checks ranges; the error names the setting.
    pub fn validate(&self) -> Result<(), String> {
        let check = |ok: bool, setting: &str, want: &str| {
            if ok {
                Ok(())
            } else {
                Err(format!("circuits.{setting} must be {want}"))
            }
        };
        check(
            (1..=3_600).contains(&self.window_secs),
            "window_secs",
            "between 1 and 3600",
        )?;
        check(
            (1..=1_000_000).contains(&self.min_samples),
            "min_samples",
            "between 1 and 1000000",
        )?;
        check(
            (1..=100).contains(&self.failure_percent),
            "failure_percent",
            "between 1 and 100",
        )?;
        check(
            (1..=86_400).contains(&self.cooldown_secs),
            "cooldown_secs",
            "between 1 and 86400",
        )?;
        check(
            (1..=1_000).contains(&self.probes),
            "probes",
            "between 1 and 1000",
        )
    }
}
