//! `switchboard plugin new <slug>`: a plugin crate to start from, with a working
//! `Provider` impl (an SMS provider with an HMAC-signed webhook), native tests, and
//! build instructions. It builds with `cargo build --target wasm32-wasip2 --release`
//! and passes `switchboard plugin check` as generated.

use std::path::{Path, PathBuf};

const CARGO_TOML: &str = include_str!("scaffold/Cargo.toml.tmpl");
const LIB_RS: &str = include_str!("scaffold/lib.rs.tmpl");
const README: &str = include_str!("scaffold/README.md.tmpl");
const GITIGNORE: &str = include_str!("scaffold/gitignore.tmpl");
const TOOLCHAIN: &str = include_str!("scaffold/rust-toolchain.toml.tmpl");

/// Where the SDK sources were when this binary was built (`None` once they are gone,
/// e.g. an installed binary on another machine: pass `--sdk`).
pub fn default_sdk_path() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk");
    path.join("Cargo.toml")
        .is_file()
        .then(|| path.canonicalize().unwrap_or(path))
}

/// Checks a new plugin's slug: 2 to 32 characters, a lower-case letter first, then
/// lower-case letters, digits and `-`.
pub fn check_slug(slug: &str) -> anyhow::Result<()> {
    let ok = (2..=32).contains(&slug.len())
        && slug.starts_with(|c: char| c.is_ascii_lowercase())
        && slug
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    anyhow::ensure!(
        ok,
        "invalid slug {slug:?}: use 2 to 32 lower-case letters, digits and -, starting with a letter"
    );
    Ok(())
}

/// Writes the crate for `slug` into `dir` (created; it must not exist or be empty),
/// depending on the SDK at `sdk`. Returns the files written.
pub fn create(slug: &str, dir: &Path, sdk: &Path) -> anyhow::Result<Vec<PathBuf>> {
    check_slug(slug)?;
    if dir.exists() {
        let empty = std::fs::read_dir(dir)
            .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?
            .next()
            .is_none();
        anyhow::ensure!(
            empty,
            "{} already exists and is not empty; choose another --dir",
            dir.display()
        );
    }
    anyhow::ensure!(
        sdk.join("Cargo.toml").is_file(),
        "no switchboard-sdk at {} (pass --sdk <path to the sdk folder>)",
        sdk.display()
    );
    let crate_name = format!("switchboard-plugin-{slug}");
    let header = format!(
        "X-{}-Signature",
        slug.split('-')
            .map(|part| {
                let mut c = part.chars();
                c.next()
                    .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("-")
    );
    let sdk = sdk.to_string_lossy().replace('\\', "/");
    let fill = |template: &str| {
        template
            .replace("{{crate_file}}", &crate_name.replace('-', "_"))
            .replace("{{crate}}", &crate_name)
            .replace("{{slug}}", slug)
            .replace("{{header}}", &header)
            .replace("{{sdk}}", &sdk)
    };
    let files = [
        ("Cargo.toml", fill(CARGO_TOML)),
        ("src/lib.rs", fill(LIB_RS)),
        ("README.md", fill(README)),
        (".gitignore", GITIGNORE.to_string()),
        ("rust-toolchain.toml", TOOLCHAIN.to_string()),
    ];
    let mut written = Vec::new();
    for (name, text) in files {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| anyhow::anyhow!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&path, text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_checked_and_files_filled_in() {
        assert!(check_slug("acme-sms").is_ok());
        for bad in ["", "a", "Acme", "1acme", "acme_sms", "acme sms"] {
            assert!(check_slug(bad).is_err(), "{bad:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        let sdk = default_sdk_path().expect("the SDK sources are beside the host");
        let out = dir.path().join("acme-sms");
        let files = create("acme-sms", &out, &sdk).unwrap();
        assert_eq!(files.len(), 5);
        let lib = std::fs::read_to_string(out.join("src/lib.rs")).unwrap();
        assert!(lib.contains("slug: \"acme-sms\".into()"));
        assert!(lib.contains("\"X-Acme-Sms-Signature\""));
        assert!(!lib.contains("{{"), "every placeholder is filled");
        let manifest = std::fs::read_to_string(out.join("Cargo.toml")).unwrap();
        assert!(manifest.contains("name = \"switchboard-plugin-acme-sms\""));
        assert!(!manifest.contains("{{"));
        // Never over an existing crate.
        let err = create("acme-sms", &out, &sdk).unwrap_err().to_string();
        assert!(err.contains("not empty"), "{err}");
    }
}
