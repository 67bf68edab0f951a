//! What a plugin says about itself (`info()`): checked when it is loaded, and the
//! `User-Agent` its outbound requests carry.

use super::egress::AllowList;
use super::types;

/// The `User-Agent` of a plugin's outbound requests (unless it sets its own): the
/// gateway, the plugin's slug and version, and the first 16 hex digits of its digest,
/// so a provider (or the simulator) can tell which build called.
pub(super) fn user_agent(info: &types::ProviderInfo, digest: &str) -> String {
    format!(
        "switchboard/{} ({}/{}; {})",
        env!("CARGO_PKG_VERSION"),
        info.slug,
        info.version,
        &digest[..digest.len().min(16)]
    )
}

/// What a plugin is taken to be until its `info()` has answered.
pub(super) fn placeholder_info() -> types::ProviderInfo {
    types::ProviderInfo {
        slug: "(loading)".into(),
        display_name: String::new(),
        version: String::new(),
        channels: vec![],
        config_keys: vec![],
        outbound_hosts: vec![],
        signature_tolerance_seconds: None,
    }
}

/// Checks what a plugin says about itself.
pub fn validate_info(info: &types::ProviderInfo) -> Result<(), String> {
    let slug_ok = !info.slug.is_empty()
        && info.slug.len() <= 32
        && info.slug.starts_with(|c: char| c.is_ascii_lowercase())
        && info
            .slug
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !slug_ok {
        return Err(format!(
            "slug {:?} must be 1-32 characters of a-z, 0-9 and '-', starting with a letter",
            info.slug
        ));
    }
    if info.display_name.trim().is_empty() {
        return Err("display-name is empty".into());
    }
    let parts: Vec<&str> = info
        .version
        .split(['-', '+'])
        .next()
        .unwrap_or("")
        .split('.')
        .collect();
    if parts.len() != 3
        || parts
            .iter()
            .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!(
            "version {:?} is not a semantic version",
            info.version
        ));
    }
    if info.channels.is_empty() {
        return Err("serves no channel".into());
    }
    AllowList::new(&info.outbound_hosts).map_err(|e| format!("outbound-hosts: {e}"))?;
    Ok(())
}
