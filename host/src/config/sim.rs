//! `[sim]`: the provider simulator's settings, as plain data (the simulator checks
//! them when it starts, `SimConfig::validate`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// Longest delay or timeout the simulator accepts (10 minutes).
pub const MAX_DELAY_MS: u64 = 600_000;

/// Failure injection for one provider. Rates are probabilities in 0..=1.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SimFaults {
    /// Send requests refused (the provider answers an error).
    pub reject_rate: f64,
    /// Send requests left hanging for `sim.timeout_ms` (the plugin's HTTP timeout fires).
    pub timeout_rate: f64,
    /// Accepted emails that bounce (callback `BOUNCED_HARD`).
    pub bounce_rate: f64,
    /// Accepted calls that end busy.
    pub busy_rate: f64,
    /// Accepted calls that end unanswered.
    pub no_answer_rate: f64,
}

/// Simulator settings (`[sim]`); settings left out keep their defaults.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    /// Where the simulator listens (`switchboard sim`, and `dev` unless disabled).
    pub listen: SocketAddr,
    /// Start the simulator inside `switchboard dev` and route the dev workspace to it.
    pub in_dev: bool,
    /// Gateway base URL callbacks are posted to (`switchboard sim`; `dev` uses its own).
    pub gateway_url: String,
    /// Delay before the first callback of a message, milliseconds.
    pub callback_delay_ms: u64,
    /// Delay between successive callbacks of one message (voice call states), ms.
    pub state_interval_ms: u64,
    /// How long a request chosen to time out hangs, milliseconds.
    pub timeout_ms: u64,
    /// Tries per callback: a 5xx answer or no answer is retried after 200 ms,
    /// doubling up to 5 s between tries, as providers retry their webhooks.
    pub callback_tries: u32,
    /// Callbacks posted at once, over as many kept-alive connections; the others wait
    /// their turn. A provider posts its webhooks through a bounded pool of senders, and
    /// unbounded, a burst of deliveries opened a connection per callback (over 12,000
    /// at once in `bench/delivery.sh`), each holding buffers on both ends.
    pub callback_concurrency: u32,
    /// Webhook secret per provider slug, used to sign callbacks.
    pub secrets: BTreeMap<String, String>,
    /// Failure injection per provider slug.
    pub providers: BTreeMap<String, SimFaults>,
    /// Failure injection per plugin build, named by the first 16 hex digits of its
    /// digest (as `switchboard plugin list` shows it and the plugin's requests carry it
    /// in their `User-Agent`): a build listed here gets these faults instead of its
    /// provider's, e.g. a canary version that the provider bounces.
    pub builds: BTreeMap<String, SimFaults>,
    /// E.164 numbers whose calls end `DND` (suppressed by the carrier).
    pub dnd_numbers: Vec<String>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8090".parse().expect("valid address"),
            in_dev: true,
            gateway_url: "http://127.0.0.1:8080".into(),
            callback_delay_ms: 300,
            state_interval_ms: 100,
            timeout_ms: 60_000,
            callback_tries: 5,
            callback_concurrency: 128,
            secrets: BTreeMap::new(),
            providers: BTreeMap::new(),
            builds: BTreeMap::new(),
            dnd_numbers: Vec::new(),
        }
    }
}
