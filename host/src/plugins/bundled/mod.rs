//! The five provider plugins, built for `wasm32-wasip2` by the host's build script and
//! embedded in the binary, so running the gateway needs no separate build step.
//! This registration, with the known answers for their providers' schemes
//! ([`known_answers`]), is the only place that names them.

pub mod known_answers;

/// A plugin shipped inside the `switchboard` binary.
#[derive(Debug, Clone, Copy)]
pub struct BundledPlugin {
    /// The slug the plugin reports in `info()`.
    pub slug: &'static str,
    /// The component bytes.
    pub wasm: &'static [u8],
}

/// Every bundled provider plugin, in the order a channel's default route lists them
/// ([`default_route`]): this registration is the one place that names them.
pub const BUNDLED: &[BundledPlugin] = &[
    BundledPlugin {
        slug: "prova",
        wasm: include_bytes!(concat!(
            env!("SWITCHBOARD_WASM_DIR"),
            "/switchboard_plugin_prova.wasm"
        )),
    },
    BundledPlugin {
        slug: "provb",
        wasm: include_bytes!(concat!(
            env!("SWITCHBOARD_WASM_DIR"),
            "/switchboard_plugin_provb.wasm"
        )),
    },
    BundledPlugin {
        slug: "prove",
        wasm: include_bytes!(concat!(
            env!("SWITCHBOARD_WASM_DIR"),
            "/switchboard_plugin_prove.wasm"
        )),
    },
    BundledPlugin {
        slug: "provc",
        wasm: include_bytes!(concat!(
            env!("SWITCHBOARD_WASM_DIR"),
            "/switchboard_plugin_provc.wasm"
        )),
    },
    BundledPlugin {
        slug: "provd",
        wasm: include_bytes!(concat!(
            env!("SWITCHBOARD_WASM_DIR"),
            "/switchboard_plugin_provd.wasm"
        )),
    },
];

/// The providers a channel is sent through when a workspace configures none: the
/// bundled plugins whose loaded version serves it (`serves(slug)`, from its
/// `info().channels`), in the order of [`BUNDLED`], without configuration.
pub fn default_route(serves: impl Fn(&str) -> bool) -> Vec<String> {
    BUNDLED
        .iter()
        .filter(|b| serves(b.slug))
        .map(|b| b.slug.to_string())
        .collect()
}

/// The bundled plugin with `slug`, if any.
pub fn find(slug: &str) -> Option<&'static BundledPlugin> {
    BUNDLED.iter().find(|p| p.slug == slug)
}

/// Directory holding every component the build produced, test fixtures included.
pub const WASM_DIR: &str = env!("SWITCHBOARD_WASM_DIR");

/// Where the build script put the native builds of the bundled plugins (and of the
/// native test fixtures): the same providers as trusted native libraries, for tests
/// and the wasm-versus-native benchmark. Not embedded in the binary.
pub const NATIVE_DIR: &str = env!("SWITCHBOARD_NATIVE_DIR");

/// The native library built from crate `krate` (e.g. `switchboard-plugin-provc`).
pub fn native_library(krate: &str) -> std::path::PathBuf {
    std::path::Path::new(NATIVE_DIR).join(format!(
        "{}{}{}",
        std::env::consts::DLL_PREFIX,
        krate.replace('-', "_"),
        std::env::consts::DLL_SUFFIX
    ))
}
