//! Installing, upgrading and rolling back plugin versions (`switchboard plugin
//! install|rollback`). A version is stored in the database and becomes active only
//! after it passes the conformance kit (a failing version is kept as `rejected` with
//! its report) and, if it asks for outbound hosts the slug's current version does not
//! have (for a new slug, any host), with the operator's approval (without it nothing is stored; install again
//! with `--approve-hosts`). Either way a refused version leaves the current one active. Every
//! process follows the active set ([`super::registry::Registry::follow`]).

use super::conformance::{self, KitOptions};
use super::runtime::{Grants, PluginRuntime};
use crate::store::{NewPluginVersion, PluginState, PluginVersions};
use sha2::{Digest, Sha256};

/// The runtime the conformance kit runs in before an install (and for `plugin
/// check`): the configured limits, short outbound timeouts so the kit's timeout check
/// is quick, no compiled-artifact cache for components not yet accepted, and at least
/// a second of guest time per call, so a busy machine descheduling a call cannot fail
/// a good plugin (the configured budget still applies once it serves).
pub fn kit_runtime_config(config: &crate::config::Config) -> super::RuntimeConfig {
    let floor = std::time::Duration::from_secs(1);
    let mut rt = crate::plugins::RuntimeConfig::from_settings(&config.plugins, &config.data_dir);
    rt.http_timeout = std::time::Duration::from_millis(750);
    rt.guest_time_budget = rt.guest_time_budget.max(floor);
    rt.send_guest_time_budget = rt.send_guest_time_budget.max(floor);
    rt.cache_dir = None;
    rt
}

/// What an install did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallOutcome {
    /// The version is now active (`previous`: the version it replaced, if any).
    Activated {
        /// Slug.
        slug: String,
        /// Version.
        version: String,
        /// Digest.
        digest: String,
        /// The installed version it replaced (`None`: the bundled or directory plugin,
        /// or a new slug).
        previous: Option<String>,
        /// The conformance kit's report (`None`: a stored version activated again,
        /// which the kit passed when it was installed).
        report: Option<String>,
    },
    /// The version is its slug's canary now, serving `percent` % of its events beside
    /// the active version until it is promoted or rolled back (see `crate::canary`).
    Canary {
        /// Slug.
        slug: String,
        /// Version.
        version: String,
        /// Digest.
        digest: String,
        /// Share of the slug's events it serves.
        percent: u8,
    },
    /// Refused; the current version stays active.
    Rejected {
        /// Slug.
        slug: String,
        /// Version.
        version: String,
        /// Why: the conformance report, or the hosts needing approval.
        reason: String,
    },
}

/// Checks and installs `wasm`, then activates it, or with `canary` (1-99) makes it a
/// canary serving that share of the slug's events. `runtime` runs the conformance
/// kit (give it short outbound timeouts); `kit` is the kit's provider config.
///
/// Installing a stored version again activates it (or repeats its rejection); with
/// `canary`, starts its trial. Installing a running canary again without `canary`
/// promotes it at once.
pub async fn install(
    store: &dyn PluginVersions,
    runtime: &PluginRuntime,
    wasm: &[u8],
    installed_by: &str,
    approve_hosts: bool,
    canary: Option<u8>,
    kit: &KitOptions,
) -> anyhow::Result<InstallOutcome> {
    if let Some(percent) = canary {
        super::trial::check_share(percent).map_err(anyhow::Error::msg)?;
    }
    let digest = hex::encode(Sha256::digest(wasm));
    let plugin = runtime
        .load_as(wasm, Grants::Declared, kit.native_slug.as_deref())
        .await
        .map_err(|e| anyhow::anyhow!("not a valid provider plugin: {e}"))?;
    let info = plugin.info().clone();
    let (slug, version) = (info.slug.clone(), info.version.clone());
    let versions = store.plugin_versions(Some(&slug)).await?;
    let current = versions.iter().find(|v| v.state == PluginState::Active);
    if let Some(same) = versions.iter().find(|v| v.digest == digest) {
        // Installing a stored version again activates it (or repeats its rejection).
        if same.state == PluginState::Rejected {
            return Ok(InstallOutcome::Rejected {
                slug,
                version,
                reason: same.report.clone().unwrap_or_default(),
            });
        }
        let previous = current
            .filter(|c| c.digest != digest)
            .map(|c| c.version.clone());
        if let Some(percent) = canary {
            return start_canary(store, slug, version, digest, percent).await;
        }
        if let Some((_, since)) = same.canary {
            let why = format!("promoted by {installed_by} before its trial ended");
            if !store.end_canary(&slug, &digest, since, true, &why).await? {
                return Err(crate::store::StoreError::Conflict(format!(
                    "{slug} {version}'s trial ended while it was being promoted; look again"
                ))
                .into());
            }
        } else {
            store.activate_plugin_version(&slug, &digest).await?;
        }
        return Ok(InstallOutcome::Activated {
            slug,
            version,
            digest,
            previous,
            report: None,
        });
    }

    let report = conformance::check(runtime, wasm, &format!("{slug} {version}"), kit).await;
    let rendered = report.render();
    let reason = (!report.passed()).then(|| rendered.clone());
    if reason.is_none() {
        let before: Vec<String> = match current {
            Some(c) => c.outbound_hosts.clone(),
            None => match super::bundled::find(&slug) {
                Some(b) => runtime
                    .load(b.wasm, Grants::Declared)
                    .await
                    .map(|p| p.info().outbound_hosts.clone())
                    .unwrap_or_default(),
                // A new slug has no host approved yet: every one it asks for is new,
                // or an operator key could install a plugin reaching anything at all
                // (the metadata address, a private name) without the host's approval.
                None => Vec::new(),
            },
        };
        let widened: Vec<&String> = info
            .outbound_hosts
            .iter()
            .filter(|h| !before.contains(h))
            .collect();
        if !widened.is_empty() && !approve_hosts {
            // Not stored: the operator's answer is to install it again, approved.
            return Ok(InstallOutcome::Rejected {
                slug: slug.clone(),
                version: version.clone(),
                reason: format!(
                    "{slug} {version} asks for outbound hosts the active version does not \
                     have: {}; install again with --approve-hosts to allow them\n",
                    widened
                        .iter()
                        .map(|h| h.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
    }
    let state = if reason.is_some() {
        PluginState::Rejected
    } else {
        PluginState::Standby
    };
    store
        .insert_plugin_version(&NewPluginVersion {
            slug: slug.clone(),
            version: version.clone(),
            digest: digest.clone(),
            kind: plugin.kind(),
            wasm: wasm.to_vec(),
            outbound_hosts: info.outbound_hosts.clone(),
            state,
            report: reason.clone(),
            installed_by: installed_by.to_string(),
            installed_at: chrono::Utc::now(),
        })
        .await?;
    if let Some(reason) = reason {
        return Ok(InstallOutcome::Rejected {
            slug,
            version,
            reason,
        });
    }
    if let Some(percent) = canary {
        return start_canary(store, slug, version, digest, percent).await;
    }
    let previous = current.map(|c| c.version.clone());
    anyhow::ensure!(
        store.activate_plugin_version(&slug, &digest).await?,
        "{slug} {version} could not be activated"
    );
    Ok(InstallOutcome::Activated {
        slug,
        version,
        digest,
        previous,
        report: Some(rendered),
    })
}

/// Makes the stored version a canary, or says why it cannot be one.
async fn start_canary(
    store: &dyn PluginVersions,
    slug: String,
    version: String,
    digest: String,
    percent: u8,
) -> anyhow::Result<InstallOutcome> {
    use crate::store::CanaryStart;
    let refused = match store.start_canary(&slug, &digest, percent).await? {
        CanaryStart::Started => {
            return Ok(InstallOutcome::Canary {
                slug,
                version,
                digest,
                percent,
            });
        }
        CanaryStart::Busy(other) => format!(
            "{slug} already has a canary ({}): it is promoted or rolled back on its own, or \
             `switchboard plugin rollback {slug}` ends it; {version} is stored, install it \
             again with --canary then",
            &other[..12]
        ),
        CanaryStart::NotStandby(Some(PluginState::Canary)) => {
            format!("{slug} {version} is already the canary of {slug}")
        }
        CanaryStart::NotStandby(Some(PluginState::Active)) => {
            format!("{slug} {version} is the active version: there is nothing to try")
        }
        CanaryStart::NotStandby(state) => format!(
            "{slug} {version} cannot be a canary (it is {})",
            state.map(|s| s.as_str()).unwrap_or("not stored")
        ),
    };
    // Nothing changed, because of the slug's state: the API answers 409.
    Err(crate::store::StoreError::Conflict(refused).into())
}

/// Rolls `slug` back: while it has a canary, ends the canary (the active version keeps
/// serving; `expected` must then be the canary's digest, if given). Otherwise, to the
/// standby version that was active most recently, or, when
/// there is none, to its bundled or directory plugin. Returns what happened, in a line.
/// With `expected`, only when that digest is the active one (a page that showed it):
/// otherwise nothing changes and the error is a [`StoreError::Conflict`].
///
/// [`StoreError::Conflict`]: crate::store::StoreError::Conflict
pub async fn rollback(
    store: &dyn PluginVersions,
    slug: &str,
    expected: Option<&str>,
) -> anyhow::Result<String> {
    let versions = store.plugin_versions(Some(slug)).await?;
    if let Some(canary) = versions.iter().find(|v| v.state == PluginState::Canary)
        && let Some((_, since)) = canary.canary
        && expected.is_none_or(|e| e == canary.digest)
    {
        let why = "rolled back by the operator";
        if !store
            .end_canary(slug, &canary.digest, since, false, why)
            .await?
        {
            return Err(crate::store::StoreError::Conflict(format!(
                "{slug}'s canary ended while rolling it back; nothing was changed, look again"
            ))
            .into());
        }
        return Ok(format!(
            "{slug}: canary {} ({}) rolled back; the active version keeps serving {slug}\n",
            canary.version,
            &canary.digest[..12]
        ));
    }
    let current = versions.iter().find(|v| v.state == PluginState::Active);
    if let Some(expected) = expected
        && current.map(|c| c.digest.as_str()) != Some(expected)
    {
        return Err(crate::store::StoreError::Conflict(format!(
            "the active version of {slug} is not the one expected; nothing was changed: \
             look again (reload the plugins page)"
        ))
        .into());
    }
    let target = versions
        .iter()
        .filter(|v| v.state == PluginState::Standby && v.activated_at.is_some())
        .max_by_key(|v| v.activated_at);
    match (current, target) {
        (Some(c), Some(t)) => {
            if !store.activate_plugin_version(slug, &t.digest).await? {
                // Another swap got there first: say so rather than claim this one.
                return Err(crate::store::StoreError::Conflict(format!(
                    "{slug} changed while rolling back; nothing was changed, look again"
                ))
                .into());
            }
            Ok(format!(
                "{slug}: rolled back from {} ({}) to {} ({})\n",
                c.version,
                &c.digest[..12],
                t.version,
                &t.digest[..12]
            ))
        }
        (Some(c), None) => {
            store.deactivate_plugin(slug).await?;
            Ok(format!(
                "{slug}: {} ({}) deactivated; the bundled or directory plugin serves {slug} again\n",
                c.version,
                &c.digest[..12]
            ))
        }
        (None, _) => anyhow::bail!(
            "{slug} has no active installed version to roll back (see `switchboard plugin list`)"
        ),
    }
}

/// The installed versions, one line each, newest first.
pub fn render_versions(versions: &[crate::store::PluginVersion]) -> String {
    if versions.is_empty() {
        return "no installed versions (`switchboard plugin install <file.wasm>`)\n".into();
    }
    let mut out = format!(
        "{:<10} {:<9} {:<14} {:<7} {:<9} {:<21} {}\n",
        "slug", "version", "digest", "kind", "state", "installed", "by"
    );
    for v in versions {
        out.push_str(&format!(
            "{:<10} {:<9} {:<14} {:<7} {:<9} {:<21} {}\n",
            v.slug,
            v.version,
            &v.digest[..12],
            v.kind.as_str(),
            v.state.as_str(),
            v.installed_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            v.installed_by
        ));
        if let Some((percent, since)) = v.canary {
            out.push_str(&format!(
                "  canary: serves {percent} % of {}'s events since {}\n",
                v.slug,
                since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ));
        }
        if let Some(result) = &v.canary_result {
            out.push_str(&format!("  last canary trial: {result}\n"));
        }
    }
    out
}

/// Installs each `*.wasm` that appears in `dir` with a digest the store does not hold
/// yet (a file already installed, rolled back or rejected is left alone, so a restart
/// never undoes a rollback), checking every `every` until `stop` turns true. Each
/// activation is swapped into `registry` at once; a refused file gets
/// `<file>.rejected.txt` beside it with the reason.
pub async fn watch_dir(
    dir: std::path::PathBuf,
    store: std::sync::Arc<dyn PluginVersions>,
    registry: std::sync::Arc<super::registry::Registry>,
    announcer: crate::announce::Announcer,
    runtime: PluginRuntime,
    every: std::time::Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut seen = std::collections::HashSet::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            tracing::warn!(dir = %dir.display(), "cannot read plugins.watch_dir");
            continue;
        };
        let mut files: Vec<std::path::PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "wasm"))
            .collect();
        files.sort();
        for path in files {
            let Ok(wasm) = std::fs::read(&path) else {
                continue;
            };
            if super::artifact_kind(&wasm) == super::ArtifactKind::Native {
                // Unsandboxed code is installed by an operator, never by dropping a file.
                if seen.insert(hex::encode(Sha256::digest(&wasm))) {
                    let name = path.display().to_string();
                    tracing::warn!(file = %name, "native library in the watched directory refused");
                    let report = path.with_file_name(format!(
                        "{}.rejected.txt",
                        path.file_name().unwrap_or_default().to_string_lossy()
                    ));
                    let _ = std::fs::write(
                        &report,
                        "a native library: the drop box takes WebAssembly components only; \
                         install a trusted native plugin with `switchboard plugin install`\n",
                    );
                }
                continue;
            }
            let digest = hex::encode(Sha256::digest(&wasm));
            if !seen.insert(digest.clone()) {
                continue;
            }
            match store.plugin_versions(None).await {
                Ok(versions) if versions.iter().any(|v| v.digest == digest) => continue,
                Ok(_) => {}
                Err(e) => {
                    // Try again next time.
                    seen.remove(&digest);
                    tracing::warn!(error = %e, "cannot read installed plugin versions");
                    continue;
                }
            }
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let by = format!("dir:{name}");
            match install(
                &*store,
                &runtime,
                &wasm,
                &by,
                false,
                None,
                &KitOptions::default(),
            )
            .await
            {
                Ok(
                    InstallOutcome::Activated { slug, version, .. }
                    | InstallOutcome::Canary { slug, version, .. },
                ) => {
                    tracing::info!(file = %name, %slug, %version, "plugin installed from the watched directory");
                    if let Err(e) = registry.sync(&*store).await {
                        tracing::warn!(error = %e, "plugin sync after install failed");
                    }
                    announcer.announce(&slug).await;
                }
                Ok(InstallOutcome::Rejected {
                    slug,
                    version,
                    reason,
                }) => {
                    tracing::warn!(file = %name, %slug, %version, "plugin from the watched directory rejected");
                    let report = path.with_file_name(format!("{name}.rejected.txt"));
                    if let Err(e) = std::fs::write(&report, &reason) {
                        tracing::warn!(path = %report.display(), error = %e, "cannot write the rejection report");
                    }
                }
                Err(e) if e.downcast_ref::<crate::store::StoreError>().is_some() => {
                    // The database's fault, not the file's: tried again at the next look.
                    seen.remove(&digest);
                    tracing::warn!(file = %name, error = %e, "plugin from the watched directory not stored yet; trying again");
                }
                Err(e) => {
                    tracing::warn!(file = %name, error = %e, "plugin from the watched directory not installed");
                    let report = path.with_file_name(format!("{name}.rejected.txt"));
                    let _ = std::fs::write(&report, format!("{e}\n"));
                }
            }
        }
    }
}
