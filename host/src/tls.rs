//! TLS files for a connection to a backend (PostgreSQL, NATS, Redis): the CA that signs
//! the server's certificate, and a client certificate when the server asks for one.
//! Plain data, read by each backend's connect; TLS itself is asked for by the backend's
//! URL (`sslmode=` for PostgreSQL, `rediss://` for Redis, `tls://` for NATS).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Makes ring the process's TLS crypto provider, once. rustls picks one by itself only
/// when exactly one is compiled in, and a dependency enabling another (test tools do)
/// would otherwise turn every TLS connection into a panic. Called before each backend
/// connects; a provider installed earlier by the embedding program stays.
pub fn ensure_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// PEM files; each `None` by default (the system's roots, no client certificate).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct TlsFiles {
    /// CA certificate(s) the server's certificate must chain to, instead of the
    /// system's roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (chain), for servers that verify clients; needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key.
    pub key_file: Option<PathBuf>,
}

/// The client certificate and key files, when both are set.
pub type ClientPair<'a> = Option<(&'a Path, &'a Path)>;

impl TlsFiles {
    /// Whether any file is set.
    pub fn is_set(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    /// Checks the settings under `prefix` (e.g. `store.tls`): a certificate needs its
    /// key and the other way round, and every file named must exist. The error names
    /// the setting.
    pub fn validate(&self, prefix: &str) -> Result<(), String> {
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => return Err(format!("{prefix}.cert_file needs {prefix}.key_file")),
            (None, Some(_)) => return Err(format!("{prefix}.key_file needs {prefix}.cert_file")),
            _ => {}
        }
        for (name, file) in [
            ("ca_file", &self.ca_file),
            ("cert_file", &self.cert_file),
            ("key_file", &self.key_file),
        ] {
            if let Some(file) = file
                && !file.is_file()
            {
                return Err(format!("{prefix}.{name}: no file {}", file.display()));
            }
        }
        Ok(())
    }

    /// The client certificate and its key, when set.
    pub fn client(&self) -> ClientPair<'_> {
        Some((self.cert_file.as_deref()?, self.key_file.as_deref()?))
    }

    /// Reads `file` (a setting under `prefix`), naming it on failure.
    pub fn read(prefix: &str, name: &str, file: &Path) -> Result<Vec<u8>, String> {
        std::fs::read(file).map_err(|e| format!("{prefix}.{name} ({}): {e}", file.display()))
    }
}

/// The `sslmode` a PostgreSQL connection given `files` (`store.tls`) must use instead
/// of the URL's; `None` keeps the URL's. Files and no mode: `verify-full`; a CA and
/// `require`: `verify-ca`, as libpq. A mode that would not use the files is an error
/// naming the settings.
pub fn pg_mode_with_files(url: &str, files: &TlsFiles) -> Result<Option<&'static str>, String> {
    if !files.is_set() {
        return Ok(None);
    }
    match pg_sslmode(url).as_deref() {
        None => Ok(Some("verify-full")),
        Some("require") if files.ca_file.is_some() => Ok(Some("verify-ca")),
        Some("require" | "verify-ca" | "verify-full") => Ok(None),
        Some(other) => Err(format!(
            "store.tls needs TLS: store.url's sslmode={other} would not use it (use \
             require, verify-ca or verify-full, or leave sslmode out)"
        )),
    }
}

/// The `sslmode` a PostgreSQL URL names, if any.
fn pg_sslmode(url: &str) -> Option<String> {
    url::Url::parse(url)
        .ok()?
        .query_pairs()
        .find(|(k, _)| k == "sslmode")
        .map(|(_, v)| v.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_needs_its_key_and_files_must_exist() {
        assert!(TlsFiles::default().validate("store.tls").is_ok());
        assert!(!TlsFiles::default().is_set());
        let dir = tempfile::tempdir().unwrap();
        let pem = dir.path().join("x.pem");
        std::fs::write(&pem, "-").unwrap();
        let cert_only = TlsFiles {
            cert_file: Some(pem.clone()),
            ..TlsFiles::default()
        };
        assert_eq!(
            cert_only.validate("broker.tls").unwrap_err(),
            "broker.tls.cert_file needs broker.tls.key_file"
        );
        let key_only = TlsFiles {
            key_file: Some(pem.clone()),
            ..TlsFiles::default()
        };
        assert!(
            key_only
                .validate("x")
                .unwrap_err()
                .contains("x.key_file needs")
        );
        let missing = TlsFiles {
            ca_file: Some(dir.path().join("nope.pem")),
            ..TlsFiles::default()
        };
        let err = missing.validate("counters.tls").unwrap_err();
        assert!(err.starts_with("counters.tls.ca_file: no file"), "{err}");
        let both = TlsFiles {
            ca_file: Some(pem.clone()),
            cert_file: Some(pem.clone()),
            key_file: Some(pem.clone()),
        };
        assert!(both.validate("x").is_ok());
        assert_eq!(both.client(), Some((pem.as_path(), pem.as_path())));
        assert!(both.is_set());
    }

    #[test]
    fn the_sslmode_is_read_from_the_query_only() {
        assert_eq!(
            pg_sslmode("postgres://u@h/db?application_name=x&sslmode=require").as_deref(),
            Some("require")
        );
        assert_eq!(pg_sslmode("postgres://u:sslmode=disable@h/db"), None);
        assert_eq!(pg_sslmode("postgres://u@h/db"), None);
    }
}
