//! Reaching NATS: server URLs, TLS and credentials, for the JetStream broker and for the
//! announcers of short-lived processes.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::{ConnectOptions, ServerAddr};
use serde::{Deserialize, Serialize};

use super::BrokerError;
use crate::tls::TlsFiles;

/// How long one TCP/TLS/handshake attempt may take when connecting.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(3);
/// Upper bound on the whole start-up connect, DNS included (async-nats does not time
/// out name resolution), so a missing NATS is reported in seconds, not hung on.
const STARTUP_CONNECT_DEADLINE: Duration = Duration::from_secs(5);

/// How the gateway proves who it is to NATS: at most one way. With none set, userinfo
/// in the URL is used (`nats://user:password@host`, or `nats://token@host`).
#[derive(Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct NatsAuth {
    /// User name (with `password`).
    pub user: Option<String>,
    /// Password of `user`.
    pub password: Option<String>,
    /// Token.
    pub token: Option<String>,
    /// NKey seed (`SU…`): the client signs the server's nonce with it.
    pub nkey_seed: Option<String>,
    /// A `.creds` file (a user JWT and its NKey seed), as `nsc` writes them.
    pub credentials_file: Option<PathBuf>,
}

/// Secrets never reach a log: only which settings are present.
impl std::fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |v: &Option<String>| v.as_ref().map(|_| "***");
        f.debug_struct("NatsAuth")
            .field("user", &self.user)
            .field("password", &shown(&self.password))
            .field("token", &shown(&self.token))
            .field("nkey_seed", &shown(&self.nkey_seed))
            .field("credentials_file", &self.credentials_file)
            .finish()
    }
}

/// Which credentials a connection presents (at most one kind).
#[derive(Debug, PartialEq, Eq)]
enum Credentials<'a> {
    None,
    UserPassword(&'a str, &'a str),
    Token(&'a str),
    NKey(&'a str),
    File(&'a std::path::Path),
}

impl NatsAuth {
    /// The one kind of credentials set, else those in the first server's URL. The error
    /// names the settings (under `broker.auth`) that conflict.
    fn credentials<'a>(&'a self, servers: &'a [ServerAddr]) -> Result<Credentials<'a>, String> {
        let mut set = Vec::new();
        match (&self.user, &self.password) {
            (Some(user), Some(password)) => set.push(Credentials::UserPassword(user, password)),
            (Some(_), None) => return Err("broker.auth.user needs broker.auth.password".into()),
            (None, Some(_)) => return Err("broker.auth.password needs broker.auth.user".into()),
            (None, None) => {}
        }
        if let Some(token) = &self.token {
            set.push(Credentials::Token(token));
        }
        if let Some(seed) = &self.nkey_seed {
            set.push(Credentials::NKey(seed));
        }
        if let Some(file) = &self.credentials_file {
            set.push(Credentials::File(file));
        }
        if set.len() > 1 {
            return Err(
                "set one of broker.auth's user + password, token, nkey_seed or \
                 credentials_file, not several"
                    .into(),
            );
        }
        if let Some(one) = set.pop() {
            return Ok(one);
        }
        let Some(first) = servers.first() else {
            return Ok(Credentials::None);
        };
        Ok(match (first.username(), first.password()) {
            (Some(user), Some(password)) => Credentials::UserPassword(user, password),
            (Some(token), None) => Credentials::Token(token),
            _ => Credentials::None,
        })
    }
}

/// Where NATS is and how to reach it: `[broker]`'s `url`, `tls` and `auth`.
#[derive(Debug, Clone, Copy)]
pub struct NatsTarget<'a> {
    /// One server URL (`nats://` or `tls://`) or several separated by commas.
    pub url: &'a str,
    /// TLS files; any of them (or a `tls://` URL) makes TLS required.
    pub tls: &'a TlsFiles,
    /// Credentials.
    pub auth: &'a NatsAuth,
}

impl<'a> NatsTarget<'a> {
    /// `url` with no TLS files and no credentials beyond the URL's.
    pub fn plain(url: &'a str) -> Self {
        static NONE: (TlsFiles, NatsAuth) = (
            TlsFiles {
                ca_file: None,
                cert_file: None,
                key_file: None,
            },
            NatsAuth {
                user: None,
                password: None,
                token: None,
                nkey_seed: None,
                credentials_file: None,
            },
        );
        Self {
            url,
            tls: &NONE.0,
            auth: &NONE.1,
        }
    }
}

/// Connects a NATS client named `name`, failing within a few seconds, with an error
/// naming the (redacted) URL, when no server can be reached or the credentials or TLS
/// settings are refused.
pub(crate) async fn connect_client(
    target: NatsTarget<'_>,
    name: &str,
) -> Result<async_nats::Client, BrokerError> {
    crate::tls::ensure_crypto_provider();
    let shown = redact_url(target.url);
    let servers = parse_servers(target.url)
        .map_err(|err| BrokerError(format!("invalid NATS URL {shown}: {err}")))?;

    // Defaults kept on purpose: `retry_on_initial_connect` stays off, so the first
    // connect fails fast instead of retrying in the background, and `max_reconnects`
    // stays unlimited, so the client reconnects forever once it is up.
    let mut options = ConnectOptions::new()
        .name(name)
        .connection_timeout(CONNECTION_TIMEOUT);
    options = match target.auth.credentials(&servers).map_err(BrokerError)? {
        Credentials::None => options,
        Credentials::UserPassword(user, password) => {
            options.user_and_password(user.into(), password.into())
        }
        Credentials::Token(token) => options.token(token.into()),
        Credentials::NKey(seed) => options.nkey(seed.into()),
        Credentials::File(file) => options.credentials_file(file).await.map_err(|e| {
            BrokerError(format!(
                "broker.auth.credentials_file ({}): {e}",
                file.display()
            ))
        })?,
    };
    let tls = target.tls;
    tls.validate("broker.tls").map_err(BrokerError)?;
    if tls.is_set() {
        options = options.require_tls(true);
    }
    if let Some(ca) = &tls.ca_file {
        options = options.add_root_certificates(ca.clone());
    }
    if let Some((cert, key)) = tls.client() {
        options = options.add_client_certificate(cert.to_path_buf(), key.to_path_buf());
    }
    // The credentials are in the options now: the client logs its server addresses,
    // so they go without the URL's userinfo.
    let servers: Vec<ServerAddr> = servers.into_iter().map(without_userinfo).collect();
    match tokio::time::timeout(STARTUP_CONNECT_DEADLINE, options.connect(servers)).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(err)) => Err(BrokerError(format!(
            "cannot connect to NATS at {shown}: {err}"
        ))),
        Err(_elapsed) => Err(BrokerError(format!(
            "cannot connect to NATS at {shown}: no connection within {}s",
            STARTUP_CONNECT_DEADLINE.as_secs()
        ))),
    }
}

/// A server address with no user name or password in it.
fn without_userinfo(server: ServerAddr) -> ServerAddr {
    if server.username().is_none() {
        return server;
    }
    let mut url = server.into_inner();
    // Both succeed on a URL with a host, which every server address has.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    ServerAddr::from_url(url).expect("the address parsed before")
}

/// Parses one server URL or a comma-separated list of them.
pub(crate) fn parse_servers(url: &str) -> Result<Vec<ServerAddr>, String> {
    let servers = url
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| part.parse::<ServerAddr>().map_err(|err| err.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    if servers.is_empty() {
        return Err("no server given".into());
    }
    Ok(servers)
}

/// The URL with any `user:password@` replaced, so errors and logs never show credentials.
pub(crate) fn redact_url(url: &str) -> String {
    url.split(',')
        .map(|part| {
            let part = part.trim();
            let host_start = part.find("://").map_or(0, |i| i + 3);
            match part[host_start..].rfind('@') {
                Some(at) => format!(
                    "{}***@{}",
                    &part[..host_start],
                    &part[host_start + at + 1..]
                ),
                None => part.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_redacted_from_urls() {
        assert_eq!(
            redact_url("nats://user:secret@host:4222"),
            "nats://***@host:4222"
        );
        assert_eq!(
            redact_url("host:4222, nats://tok@other"),
            "host:4222,nats://***@other"
        );
        assert_eq!(redact_url("nats://127.0.0.1:1"), "nats://127.0.0.1:1");
        assert!(parse_servers(" , ").is_err());
        assert_eq!(
            parse_servers("nats://a:1,nats://b:2")
                .expect("two servers")
                .len(),
            2
        );
    }

    #[test]
    fn one_kind_of_credentials_else_the_urls() {
        let servers = parse_servers("nats://u:p@a:1,nats://b:2").unwrap();
        let none = NatsAuth::default();
        assert_eq!(
            none.credentials(&servers).unwrap(),
            Credentials::UserPassword("u", "p")
        );
        let token_url = parse_servers("tls://s3cret@a:1").unwrap();
        assert_eq!(
            none.credentials(&token_url).unwrap(),
            Credentials::Token("s3cret")
        );
        let bare = parse_servers("nats://a:1").unwrap();
        assert_eq!(none.credentials(&bare).unwrap(), Credentials::None);

        let token = NatsAuth {
            token: Some("t".into()),
            ..NatsAuth::default()
        };
        assert_eq!(
            token.credentials(&servers).unwrap(),
            Credentials::Token("t"),
            "a setting wins over the URL"
        );
        let both = NatsAuth {
            token: Some("t".into()),
            nkey_seed: Some("SU".into()),
            ..NatsAuth::default()
        };
        assert!(both.credentials(&bare).unwrap_err().contains("not several"));
        let user_only = NatsAuth {
            user: Some("u".into()),
            ..NatsAuth::default()
        };
        assert_eq!(
            user_only.credentials(&bare).unwrap_err(),
            "broker.auth.user needs broker.auth.password"
        );
    }

    #[test]
    fn server_addresses_lose_their_userinfo() {
        let servers = parse_servers("nats://u:p@a:1,tls://tok@b:2,nats://c:3").unwrap();
        let clean: Vec<ServerAddr> = servers.into_iter().map(without_userinfo).collect();
        for (server, (host, port)) in clean.iter().zip([("a", 1), ("b", 2), ("c", 3)]) {
            assert_eq!(server.username(), None);
            assert_eq!(server.password(), None);
            assert_eq!((server.host(), server.port()), (host, port));
        }
        assert!(clean[1].tls_required());
    }

    #[test]
    fn debug_shows_no_secret() {
        let auth = NatsAuth {
            user: Some("svc".into()),
            password: Some("hunter2".into()),
            token: Some("tok3n".into()),
            nkey_seed: Some("SUSEED".into()),
            credentials_file: None,
        };
        let shown = format!("{auth:?}");
        assert!(shown.contains("svc"), "{shown}");
        for secret in ["hunter2", "tok3n", "SUSEED"] {
            assert!(!shown.contains(secret), "{shown}");
        }
    }
}
