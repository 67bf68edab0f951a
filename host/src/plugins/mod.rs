//! Provider plugins: sandboxed WebAssembly components behind the
//! `switchboard:provider` world, every released version of it side by side.
//!
//! - [`types`]: the plugin-facing types, owned by the host.
//! - [`wit`]: one module per supported WIT version, the only code that sees generated
//!   bindings; it converts them to and from [`types`].
//! - [`runtime`]: one wasmtime engine, a sandboxed store per call with memory and
//!   guest-time limits; [`session`]: one live instance; `kept`: instances kept between
//!   one workspace's calls; `sandbox`: what one instance is granted and its host
//!   imports.
//! - [`egress`]: the operator's outbound-host grants.
//! - [`announce`]: swaps announced to every running process (NATS in production).
//! - [`cache`]: compiled components cached on disk by digest.
//! - [`native`]: trusted native plugins (`libloading`), off unless the operator lists
//!   the slug in `plugins.native_trusted`.
//! - [`bundled`]: the five provider plugins embedded in the binary.
//! - [`conformance`]: the contract suite behind `switchboard plugin check`.
//! - [`capture`]: a local HTTP server that records what a plugin sends.
//! - [`scaffold`]: `switchboard plugin new`, a plugin crate to start from.
//! - [`trial`]: which version serves an event while its slug has a canary.

pub mod bundled;
pub mod cache;
pub mod capture;
pub mod conformance;
pub mod egress;
pub mod host_calls;
mod info;
pub mod install;
mod kept;
pub mod native;
pub mod registry;
pub mod runtime;
mod sandbox;
pub mod scaffold;
pub mod session;
pub mod slots;
pub mod trial;
pub mod types;
pub mod wit;

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
