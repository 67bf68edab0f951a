//! `switchboard:provider@0.1.0` (`wit/provider/v0.1.0`, frozen).

use super::super::sandbox::HostState;
use super::super::types;
use bindings::switchboard::provider::types as g;
use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit/provider/v0.1.0",
        world: "provider",
        imports: {
            "switchboard:provider/host.http-request": async,
            default: trappable,
        },
        exports: { default: async },
    });
}

super::calls!();

super::conversions_since_0_1_0!();

/// 0.1.0 has no `idempotency-key`: its plugins key by `event-id`, as they always did.
impl From<types::Message> for g::Message {
    fn from(m: types::Message) -> Self {
        Self {
            event_id: m.event_id,
            subscriber_id: m.subscriber_id,
            content: m.content.into(),
            extra_params: m.extra_params,
        }
    }
}
