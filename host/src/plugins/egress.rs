//! Outbound-host grants: a plugin reaches only the hosts the operator allowed.

use url::Url;

/// Hosts one plugin may reach. Entries are `host` (any port) or `host:port`,
/// compared case-insensitively against the request URL. Only `http` and `https`
/// URLs are considered at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<(String, Option<u16>)>,
}

impl AllowList {
    /// Parses `host` / `host:port` entries; an entry that is neither is an error naming it.
    pub fn new<S: AsRef<str>>(entries: &[S]) -> Result<Self, String> {
        let entries = entries
            .iter()
            .map(|e| parse_entry(e.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(Self { entries })
    }

    /// A list that allows nothing.
    pub fn deny_all() -> Self {
        Self::default()
    }

    /// The entries as written, normalised.
    pub fn entries(&self) -> Vec<String> {
        self.entries
            .iter()
            .map(|(h, p)| match p {
                Some(p) => format!("{h}:{p}"),
                None => h.clone(),
            })
            .collect()
    }

    /// Checks `url`; on refusal returns the `host[:port]` that was refused, for the error.
    pub fn check(&self, url: &str) -> Result<Url, String> {
        let parsed = Url::parse(url).map_err(|_| format!("invalid URL {url:?}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!("scheme {}", parsed.scheme()));
        }
        let host = parsed
            .host_str()
            .ok_or_else(|| "URL without host".to_string())?
            .to_ascii_lowercase();
        let port = parsed.port_or_known_default();
        let allowed = self
            .entries
            .iter()
            .any(|(h, p)| *h == host && (p.is_none() || *p == port));
        if allowed {
            Ok(parsed)
        } else {
            Err(match parsed.port() {
                Some(p) => format!("{host}:{p}"),
                None => host,
            })
        }
    }
}

fn parse_entry(entry: &str) -> Result<(String, Option<u16>), String> {
    let entry = entry.trim().to_ascii_lowercase();
    let bad = || format!("invalid allowed host {entry:?}: expected `host` or `host:port`");
    if entry.is_empty() || entry.contains(['/', '@', '?', '#']) {
        return Err(bad());
    }
    // Bracketed IPv6 literal, as `Url::host_str` spells it: `[::1]` or `[::1]:8080`.
    if let Some(rest) = entry.strip_prefix('[') {
        let (addr, after) = rest.split_once(']').ok_or_else(bad)?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(bad)?
                    .parse()
                    .map_err(|_| bad())?,
            ),
        };
        return Ok((format!("[{addr}]"), port));
    }
    match entry.split_once(':') {
        Some((h, p)) if !h.is_empty() => Ok((h.to_string(), Some(p.parse().map_err(|_| bad())?))),
        Some(_) => Err(bad()),
        None => Ok((entry.clone(), None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port_matching() {
        let allow = AllowList::new(&["api.prova.example", "127.0.0.1:9100", "[::1]:80"]).unwrap();
        assert!(
            allow
                .check("https://API.prova.example/v3/mail/send")
                .is_ok()
        );
        assert!(allow.check("http://api.prova.example:8443/x").is_ok());
        assert!(allow.check("http://127.0.0.1:9100/x").is_ok());
        assert_eq!(
            allow.check("http://127.0.0.1:9101/x").unwrap_err(),
            "127.0.0.1:9101"
        );
        assert_eq!(
            allow.check("http://evil.example/x").unwrap_err(),
            "evil.example"
        );
        assert!(allow.check("http://[::1]/x").is_ok());
        assert!(allow.check("file:///etc/passwd").is_err());
        assert!(allow.check("http://api.prova.example.evil.test/").is_err());
        assert!(
            AllowList::deny_all()
                .check("http://127.0.0.1:9100/")
                .is_err()
        );
    }

    #[test]
    fn rejects_entries_that_are_not_hosts() {
        assert!(AllowList::new(&["http://x/"]).is_err());
        assert!(AllowList::new(&["x:notaport"]).is_err());
        assert!(AllowList::new(&[""]).is_err());
        assert_eq!(
            AllowList::new(&["Host.Test:81"]).unwrap().entries(),
            vec!["host.test:81"]
        );
    }
}
