//! `switchboard:provider@0.2.0` (`wit/provider/v0.2.0`, frozen).

use super::super::sandbox::HostState;
use super::super::types;
use bindings::switchboard::provider::types as g;
use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit/provider/v0.2.0",
        world: "provider",
        imports: {
            "switchboard:provider/host.http-request": async,
            default: trappable,
        },
        exports: { default: async },
    });
}

super::calls!();

super::conversions_since_0_1_0!(Message {
    event_id,
    idempotency_key,
    subscriber_id,
    content: into,
    extra_params
});
