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
    if text.chars().count() > MAX_URL_LEN {
        return Err(format!("url is longer than {MAX_URL_LEN} characters"));
    }
    // As written, not as a lenient parser would repair it (it drops white space and
    // reads `https:host` as `https://host`).
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("url must not contain white space or control characters".into());
    }
    if !(text.starts_with("https://") || text.starts_with("http://")) {
        let scheme = text.split(':').next().unwrap_or_default();
        return Err(format!("url must start with https:// (not {scheme:?})"));
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

/// What a refused address is, and how to allow it.
pub const INTERNAL: &str = "a loopback, private, link-local or otherwise internal address \
                            (set webhook_endpoints.allow_private_networks to allow it)";

/// Refuses an address of the gateway's own networks unless the policy allows them.
pub fn check_ip(ip: IpAddr, policy: UrlPolicy) -> Result<(), String> {
    if policy.allow_private || is_public(ip) {
        Ok(())
    } else {
        Err(format!("{ip} is {INTERNAL}"))
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
        // 192.0.0.0/24, protocol assignments; 192.88.99.0/24, 6to4 relays.
        || (a == 192 && b == 0 && ip.octets()[2] == 0)
        || (a == 192 && b == 88 && ip.octets()[2] == 99)
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    // Addresses that carry an IPv4 address reach it: judge that one. IPv4-compatible
    // ::a.b.c.d, NAT64 64:ff9b::a.b.c.d, 6to4 2002:AABB:CCDD::.
    if s[..6] == [0; 6] {
        return is_public_v4(embedded(s[6], s[7]));
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_public_v4(embedded(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        return is_public_v4(embedded(s[1], s[2]));
    }
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        // fc00::/7 unique local, fe80::/10 link-local, fec0::/10 site-local,
        // 64:ff9b:1::/48 local NAT64, 2001::/32 Teredo, 2001:db8::/32 documentation.
        || (s[0] & 0xfe00) == 0xfc00
        || (s[0] & 0xffc0) == 0xfe80
        || (s[0] & 0xffc0) == 0xfec0
        || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1)
        || (s[0] == 0x2001 && (s[1] == 0 || s[1] == 0x0db8)))
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
        assert!(
            check_url("https://[64:ff9b::5db8:d822]/", PRODUCTION).is_ok(),
            "NAT64 of a public address"
        );
        assert!(
            check_url("https://[2002:5db8:d822::1]/", PRODUCTION).is_ok(),
            "6to4 of a public address"
        );
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
            "https://[::127.0.0.1]/",
            "https://[64:ff9b::a00:1]/",
            "https://[64:ff9b:1::1]/",
            "https://[2002:a00:1::1]/",
            "https://[2001:0:1::1]/",
            "https://[fec0::1]/",
            "https://192.0.0.8/",
            "https://192.88.99.1/",
            "https://2130706433/",
            "https://0x7f.1/",
            "https:example.com",
            "HTTPS://example.com/",
            " https://example.com/",
            "https://example.com/\tx",
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
