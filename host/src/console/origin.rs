//! What a console request says about where it came from: over HTTPS (so the session
//! cookie is `Secure`), and from the console's own page or another site's (a sign-in
//! posted by another site is refused). Plain functions of the request's headers.

use axum::http::{HeaderMap, header};

/// Whether the browser reached the gateway over HTTPS, as the proxy that ended TLS
/// says: the first entry of `X-Forwarded-Proto` (a chain of proxies may append its
/// own hops after the client's) or the first element's `proto` of RFC 7239
/// `Forwarded`.
pub(super) fn came_over_https(headers: &HeaderMap) -> bool {
    let forwarded_proto = first_entry(headers, "x-forwarded-proto")
        .is_some_and(|first| first.eq_ignore_ascii_case("https"));
    forwarded_proto || forwarded(headers, "proto").is_some_and(|p| p.eq_ignore_ascii_case("https"))
}

/// The first entry of a comma-separated header, trimmed.
fn first_entry<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(str::trim)
}

/// The parameter `name` of the first element of RFC 7239 `Forwarded`, unquoted.
fn forwarded<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    first_entry(headers, header::FORWARDED.as_str())?
        .split(';')
        .filter_map(|pair| pair.split_once('='))
        .find(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        .map(|(_, value)| value.trim().trim_matches('"'))
}

/// Whether the browser says this request was sent by a page of another site: its
/// `Sec-Fetch-Site`, or, from a browser too old to send that, an `Origin` whose host
/// is not the one the request was sent to (its `Host`, or behind a proxy the first
/// `X-Forwarded-Host` or RFC 7239 `Forwarded` `host`). A request naming neither (curl,
/// a script) is not a browser's cross-site form, and passes.
pub(super) fn from_another_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return site.as_bytes() == b"cross-site" || site.as_bytes() == b"same-site";
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    // A sandboxed frame or a privacy redirect says `null`: no page of ours.
    let Some(origin_host) = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, host)| host)
    else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    // Behind a proxy the browser's host is the one the proxy was asked for.
    let proxied = [
        first_entry(headers, "x-forwarded-host"),
        forwarded(headers, "host"),
    ];
    ![host]
        .into_iter()
        .chain(proxied)
        .flatten()
        .any(|h| h.eq_ignore_ascii_case(origin_host))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn https_is_what_the_first_proxy_saw() {
        for (pairs, https) in [
            (vec![], false),
            (vec![("x-forwarded-proto", "https")], true),
            (vec![("x-forwarded-proto", "HTTPS")], true),
            (vec![("x-forwarded-proto", "https, http")], true),
            (vec![("x-forwarded-proto", "http, https")], false),
            (vec![("x-forwarded-proto", "http")], false),
            (
                vec![("forwarded", "for=192.0.2.1;proto=https;by=proxy")],
                true,
            ),
            (vec![("forwarded", "Proto=\"HTTPS\"")], true),
            (vec![("forwarded", "proto=http, proto=https")], false),
            (vec![("forwarded", "for=192.0.2.1")], false),
        ] {
            assert_eq!(came_over_https(&headers(&pairs)), https, "{pairs:?}");
        }
    }

    #[test]
    fn another_site_is_told_by_fetch_metadata_else_by_origin() {
        for (pairs, foreign) in [
            (vec![], false),
            (vec![("sec-fetch-site", "same-origin")], false),
            (vec![("sec-fetch-site", "none")], false),
            (vec![("sec-fetch-site", "cross-site")], true),
            (vec![("sec-fetch-site", "same-site")], true),
            // Fetch metadata wins over an Origin it agrees with or not.
            (
                vec![
                    ("sec-fetch-site", "same-origin"),
                    ("origin", "https://evil.example"),
                    ("host", "gw.example"),
                ],
                false,
            ),
            (
                vec![("origin", "https://gw.example"), ("host", "gw.example")],
                false,
            ),
            (
                vec![
                    ("origin", "http://GW.example:8080"),
                    ("host", "gw.example:8080"),
                ],
                false,
            ),
            (
                vec![("origin", "https://evil.example"), ("host", "gw.example")],
                true,
            ),
            (
                vec![
                    ("origin", "https://gw.example:8443"),
                    ("host", "gw.example"),
                ],
                true,
            ),
            (vec![("origin", "null"), ("host", "gw.example")], true),
            (
                vec![
                    ("origin", "https://gw.example"),
                    ("host", "10.0.0.5:3000"),
                    ("x-forwarded-host", "gw.example"),
                ],
                false,
            ),
            (
                vec![
                    ("origin", "https://gw.example"),
                    ("host", "10.0.0.5:3000"),
                    ("forwarded", "for=192.0.2.1;host=\"gw.example\";proto=https"),
                ],
                false,
            ),
            (vec![("origin", "https://gw.example")], true),
        ] {
            assert_eq!(from_another_site(&headers(&pairs)), foreign, "{pairs:?}");
        }
    }
}
