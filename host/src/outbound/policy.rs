//! Which URLs the gateway posts delivery events to. In production an endpoint must be
//! `https` (unless `webhook_endpoints.allow_http`) and must not reach the gateway's own
//! network: loopback, private, link-local (cloud metadata lives there), carrier-grade
//! NAT, unspecified, multicast and broadcast addresses are refused (unless
//! `webhook_endpoints.allow_private_networks`). `dev` allows both. The check runs on
//! the URL when an endpoint is saved (a literal address or `localhost`) and on every
//! address a name resolves to when a request is made.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Longest endpoint URL accepted.
pub const MAX_URL_LEN: usize = 2_048;

/// What the deployment allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UrlPolicy {
    /// `http://` URLs.
    pub allow_http: bool,
    /// Addresses of private, loopback and link-local networks.
    pub allow_private: bool,
}

impl UrlPolicy {
    /// The policy of a configuration: everything in development.
    pub fn of(config: &crate::config::Config) -> Self {
        let dev = config.environment == crate::config::Environment::Development;
        Self {
            allow_http: dev || config.webhook_endpoints.allow_http,
            allow_private: dev || config.webhook_endpoints.allow_private_networks,
        }
    }
}

/// Checks an endpoint URL as saved: scheme, no credentials, a host, and a literal
/// address (or `localhost`) against the policy.
pub fn check_url(text: &str, policy: UrlPolicy) -> Result<url::Url, String> {
    if text.len() > MAX_URL_LEN {
        return Err(format!("url is longer than {MAX_URL_LEN} characters"));
    }
    let url = url::Url::parse(text).map_err(|e| format!("url is not a valid URL: {e}"))?;
    match url.scheme() {
        "https" => {}
        "http" if policy.allow_http => {}
        "http" => {
            return Err(
                "url must use https (set webhook_endpoints.allow_http to allow http)".into(),
            );
        }
        other => return Err(format!("url must use https, not {other}")),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("url must not carry credentials: they would be logged and shown".into());
    }
    match url.host() {
        None => Err("url has no host".into()),
        Some(url::Host::Ipv4(ip)) => check_ip(IpAddr::V4(ip), policy).map(|()| url),
        Some(url::Host::Ipv6(ip)) => check_ip(IpAddr::V6(ip), policy).map(|()| url),
        Some(url::Host::Domain(name)) => {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            if !policy.allow_private && (name == "localhost" || name.ends_with(".localhost")) {
                return Err(format!(
                    "url host {name} is this machine (set webhook_endpoints.allow_private_networks to allow it)"
                ));
            }
            Ok(url)
        }
    }
}

/// Refuses an address of the gateway's own networks unless the policy allows them.
pub fn check_ip(ip: IpAddr, policy: UrlPolicy) -> Result<(), String> {
    if policy.allow_private || is_public(ip) {
        Ok(())
    } else {
        Err(format!(
            "{ip} is a loopback, private, link-local or otherwise internal address \
             (set webhook_endpoints.allow_private_networks to allow it)"
        ))
    }
}

fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(v6),
        },
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        || a == 0
        // 100.64.0.0/10, carrier-grade NAT; 198.18.0.0/15, benchmarking.
        || (a == 100 && (64..128).contains(&b))
        || (a == 198 && (18..20).contains(&b))
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        // fc00::/7 unique local, fe80::/10 link-local, 2001:db8::/32 documentation.
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        || (first == 0x2001 && ip.segments()[1] == 0x0db8))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRODUCTION: UrlPolicy = UrlPolicy {
        allow_http: false,
        allow_private: false,
    };
    const DEV: UrlPolicy = UrlPolicy {
        allow_http: true,
        allow_private: true,
    };

    #[test]
    fn production_wants_https_and_a_public_host() {
        assert!(check_url("https://hooks.example.com/sb?x=1", PRODUCTION).is_ok());
        assert!(check_url("https://93.184.216.34/x", PRODUCTION).is_ok());
        for bad in [
            "http://hooks.example.com/",
            "ftp://hooks.example.com/",
            "https://user:pw@hooks.example.com/",
            "https://localhost:8080/",
            "https://api.localhost/",
            "https://127.0.0.1/",
            "https://10.1.2.3/",
            "https://172.16.0.1/",
            "https://192.168.1.1/",
            "https://169.254.169.254/latest/meta-data",
            "https://100.64.0.1/",
            "https://0.0.0.0/",
            "https://[::1]/",
            "https://[fd00::1]/",
            "https://[fe80::1]/",
            "https://[::ffff:127.0.0.1]/",
            "not a url",
        ] {
            assert!(check_url(bad, PRODUCTION).is_err(), "{bad} accepted");
        }
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL_LEN));
        assert!(check_url(&long, PRODUCTION).is_err());
    }

    #[test]
    fn dev_allows_local_receivers() {
        assert!(check_url("http://127.0.0.1:9000/hooks", DEV).is_ok());
        assert!(check_url("http://localhost/hooks", DEV).is_ok());
        assert!(check_url("ftp://localhost/", DEV).is_err());
        assert!(check_url("http://u:p@localhost/", DEV).is_err());
    }

    #[test]
    fn resolved_addresses_are_checked_too() {
        assert!(check_ip("8.8.8.8".parse().unwrap(), PRODUCTION).is_ok());
        assert!(check_ip("2606:4700::1111".parse().unwrap(), PRODUCTION).is_ok());
        assert!(check_ip("10.0.0.1".parse().unwrap(), PRODUCTION).is_err());
        assert!(check_ip("10.0.0.1".parse().unwrap(), DEV).is_ok());
    }
}
