//! Provider plugins: sandboxed WebAssembly components behind the
//! `switchboard:provider@0.1.0` world.
//!
//! - [`runtime`]: one wasmtime engine, a fresh sandboxed store per call with memory and
//!   guest-time limits, the host imports.
//! - [`egress`]: the operator's outbound-host grants.
//! - [`announce`]: swaps announced to every running process (NATS in production).
//! - [`cache`]: compiled components cached on disk by digest.
//! - [`native`]: trusted native plugins (`libloading`), off unless the operator lists
//!   the slug in `plugins.native_trusted`.
//! - [`bundled`]: the five provider plugins embedded in the binary.
//! - [`conformance`]: the contract suite behind `switchboard plugin check`.
//! - [`capture`]: a local HTTP server that records what a plugin sends.
//! - [`scaffold`]: `switchboard plugin new`, a plugin crate to start from.

pub mod bundled;
pub mod cache;
pub mod capture;
pub mod conformance;
pub mod egress;
pub mod host_calls;
pub mod install;
pub mod native;
pub mod registry;
pub mod runtime;
pub mod scaffold;

/// Host-side bindings generated from the WIT world.
pub mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit/provider/v0.1.0",
        world: "provider",
        imports: {
            "switchboard:provider/host.http-request": async,
            default: trappable,
        },
        exports: { default: async },
        // Serde: native plugins exchange these types in postcard form (`plugins::native`).
        additional_derives: [Clone, PartialEq, serde::Serialize, serde::Deserialize],
    });
}

/// The plugin-facing types, as the host sees them.
pub mod types {
    pub use super::bindings::switchboard::provider::types::*;
}

pub use native::{ArtifactKind, artifact_kind};
pub use runtime::{Grants, Plugin, PluginError, PluginKind, PluginRuntime, RuntimeConfig};

/// The spec's lower-case channel name.
pub fn channel_name(channel: &types::Channel) -> &'static str {
    match channel {
        types::Channel::Sms => "sms",
        types::Channel::Email => "email",
        types::Channel::Push => "push",
        types::Channel::Whatsapp => "whatsapp",
        types::Channel::Voice => "voice",
    }
}
