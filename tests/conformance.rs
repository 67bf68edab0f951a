//! The conformance kit against every bundled plugin, and against a plugin whose
//! signature check is broken.

use std::time::Duration;
use switchboard::plugins::bundled::{BUNDLED, WASM_DIR};
use switchboard::plugins::conformance::{self, KitOptions};
use switchboard::plugins::{PluginRuntime, RuntimeConfig};

fn runtime() -> PluginRuntime {
    // Generous guest time: a loaded CI machine may deschedule a call past the 50 ms
    // default, which the kit would report as a failed check.
    PluginRuntime::new(RuntimeConfig {
        http_timeout: Duration::from_millis(300),
        guest_time_budget: Duration::from_secs(5),
        send_guest_time_budget: Duration::from_secs(5),
        ..RuntimeConfig::default()
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bundled_plugin_conforms() {
    let rt = runtime();
    assert_eq!(BUNDLED.len(), 5);
    for plugin in BUNDLED {
        let report =
            conformance::check(&rt, plugin.wasm, plugin.slug, &KitOptions::default()).await;
        println!("{}", report.render());
        assert!(
            report.passed(),
            "{} does not conform:\n{}",
            plugin.slug,
            report.render()
        );
        assert!(
            report.checks.len() > 30,
            "suspiciously few checks for {}",
            plugin.slug
        );
        assert!(
            report
                .checks
                .iter()
                .any(|c| c.name == "signature.known-answer" && c.detail.contains("pinned"))
        );
        assert!(report.subject.starts_with(plugin.slug));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_signature_check_fails_with_a_clear_report() {
    let wasm = std::fs::read(format!(
        "{WASM_DIR}/switchboard_fixture_broken_signature.wasm"
    ))
    .unwrap();
    let report = conformance::check(&runtime(), &wasm, "broken", &KitOptions::default()).await;
    assert!(!report.passed());
    let failed: Vec<&str> = report.failures().map(|c| c.name.as_str()).collect();
    for expected in [
        "signature.tampered-body",
        "signature.wrong-secret",
        "signature.rotation.old-under-new",
    ] {
        assert!(
            failed.contains(&expected),
            "{expected} should fail; failed: {failed:?}"
        );
    }
    // Everything not about signatures still passes: the report pinpoints the bug.
    assert!(
        failed.iter().all(|n| n.starts_with("signature.")),
        "{failed:?}"
    );
    let text = report.render();
    assert!(
        text.contains("FAIL signature.tampered-body: verified although one body byte was flipped"),
        "{text}"
    );
    assert!(text.contains("DOES NOT CONFORM"));
}

#[tokio::test]
async fn a_file_that_is_not_a_plugin_fails_at_load() {
    let report =
        conformance::check(&runtime(), b"not wasm", "junk.wasm", &KitOptions::default()).await;
    assert!(!report.passed());
    assert_eq!(report.checks.len(), 1);
    assert_eq!(report.checks[0].name, "load");
    assert_eq!(report.subject, "junk.wasm");
}

#[tokio::test]
async fn reference_vectors_pin_the_five_schemes() {
    // provE's pinned scheme: `sha256=<hex HMAC-SHA256(secret, body)>`; RFC 4231 case 2 key/data.
    let h = conformance::reference_signature("prove", "Jefe", b"what do ya want for nothing?", 0)
        .unwrap();
    assert_eq!(
        h[0].1,
        "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
    let h = conformance::reference_signature("provb", "Jefe", b"x", 1700000000).unwrap();
    assert!(h[0].1.starts_with("ts=1700000000;s=") && h[0].1.ends_with(";s-algorithm=HmacSHA256"));
    assert!(conformance::reference_signature("provz", "k", b"", 0).is_none());
    assert_eq!(conformance::spec_call_states("provd").unwrap().len(), 9);
}

/// Components built against `switchboard:provider@0.1.0` (from the 0.1.0 SDK, kept as
/// fixtures) still load and conform; the kit looks for the event id in their requests,
/// the only key 0.1.0 has. The bundled plugins are on 0.2.0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wit_0_1_0_components_load_and_conform_beside_0_2_0_ones() {
    let rt = runtime();
    for slug in ["prova", "provc"] {
        let path = format!(
            "{}/../tests/fixtures/wit-v0.1.0/{slug}.wasm",
            env!("CARGO_MANIFEST_DIR")
        );
        let wasm = std::fs::read(&path).unwrap();
        let plugin = rt
            .load(&wasm, switchboard::plugins::Grants::Declared)
            .await
            .unwrap();
        assert_eq!(
            (plugin.info().slug.as_str(), plugin.wit_version()),
            (slug, "0.1.0")
        );
        let report = conformance::check(&rt, &wasm, slug, &KitOptions::default()).await;
        assert!(report.passed(), "{}", report.render());
        assert!(
            report
                .checks
                .iter()
                .any(|c| c.name == "send.sms.idempotency"
                    && c.detail == "event id passed to the provider")
                || report
                    .checks
                    .iter()
                    .any(|c| c.name == "send.email.idempotency"
                        && c.detail == "event id passed to the provider"),
            "{}",
            report.render()
        );
    }
    for plugin in BUNDLED {
        let loaded = rt
            .load(plugin.wasm, switchboard::plugins::Grants::Declared)
            .await
            .unwrap();
        assert_eq!(loaded.wit_version(), "0.2.0", "{}", plugin.slug);
    }
}

/// A file that exports no supported world is refused naming every version tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_of_no_supported_version_is_refused_clearly() {
    // A component that exports nothing at all: valid, but no provider world.
    let empty = wat_component();
    let err = runtime()
        .load(&empty, switchboard::plugins::Grants::Declared)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("does not export a provider world this host supports (0.2.0, 0.1.0)"),
        "{err}"
    );
}

/// The smallest valid component: `(component)`, in its binary form.
fn wat_component() -> Vec<u8> {
    // Preamble of a component (magic, version 0x0d, layer 1), no sections.
    vec![0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00]
}
