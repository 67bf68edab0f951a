//! The loaded plugins, by slug: the bundled five, then any component in the plugins
//! directory (which replaces a bundled plugin of the same slug), then the versions
//! installed with `switchboard plugin install` (which replace both while active).
//! Trusted native libraries (see [`super::native`]) follow the same rules: a process
//! opens one only for a slug in its `plugins.native_trusted`.
//!
//! ## Hot swap
//! Installed versions live in the database. Every process re-reads the active set
//! ([`Registry::follow`]) when a swap is announced (over NATS in production, see
//! [`super::announce`]) and at least every `plugins.sync_ms`, and swaps a slug's entry
//! when its active digest changes. A swap replaces one map entry under a write lock: calls already
//! running hold their own handle on the old instance and finish on it, calls that start
//! after the swap get the new one. The new version is compiled (or read from the
//! compiled-artifact cache, keyed by digest) before the lock is taken, so the swap
//! itself never waits on compilation.
//!
//! ## Canaries
//! A slug may also have a canary version (`switchboard plugin install --canary N`),
//! loaded and followed the same way: [`Registry::pick`] gives an event the canary or
//! the stable version as [`super::trial::arm_of`] says.

use super::bundled::BUNDLED;
use super::runtime::{Grants, Plugin, PluginRuntime};
use super::trial::{Arm, Trial};
use crate::config::PluginsConfig;
use crate::store::CanaryTrial;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

/// Where a plugin came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Embedded in the binary.
    Bundled,
    /// A file in the plugins directory.
    Directory(PathBuf),
    /// Installed with `switchboard plugin install` (stored in the database).
    Installed {
        /// Who installed it.
        by: String,
    },
}

/// A loaded plugin and its origin.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The plugin.
    pub plugin: Plugin,
    /// Its origin.
    pub source: Source,
}

/// What [`Registry::pick`] chose for an event.
#[derive(Debug, Clone)]
pub struct Picked {
    /// The version that sends it.
    pub plugin: Plugin,
    /// The trial arm its sends and receipts count in, while its slug has a canary.
    pub trial: Option<Trial>,
    /// The canary's arm, when the event was the canary's but the canary does not
    /// serve its channel.
    pub missed: Option<Trial>,
}

/// Plugins by slug.
pub struct Registry {
    runtime: PluginRuntime,
    entries: RwLock<BTreeMap<String, Entry>>,
    /// [`Registry::default_routes`], worked out again whenever `entries` changes (a
    /// delivery reads it; only a swap changes it).
    defaults: RwLock<Arc<BTreeMap<String, Vec<String>>>>,
    /// Running canaries by slug: the trial and its loaded version.
    canaries: RwLock<BTreeMap<String, (CanaryTrial, Plugin)>>,
    /// Bundled and directory plugins, what a slug falls back to when its installed
    /// version is deactivated.
    base: BTreeMap<String, Entry>,
    grants: BTreeMap<String, Vec<String>>,
    /// Native versions this process will not open (not trusted), already reported.
    refused: std::sync::Mutex<std::collections::HashSet<String>>,
    /// One sync at a time: a slow load from an earlier sync must not swap in a version
    /// a later one has already replaced.
    syncing: tokio::sync::Mutex<()>,
}

impl Registry {
    /// Loads every bundled plugin (a failure is fatal: the binary is broken) and every
    /// `*.wasm` in `config.dir` (a failure is logged and that file skipped).
    pub async fn load(runtime: PluginRuntime, config: &PluginsConfig) -> anyhow::Result<Self> {
        let mut entries = BTreeMap::new();
        for bundled in BUNDLED {
            let plugin = runtime
                .load(bundled.wasm, Grants::BySlug(&config.grants))
                .await
                .map_err(|e| {
                    anyhow::anyhow!("bundled plugin {} failed to load: {e}", bundled.slug)
                })?;
            entries.insert(
                plugin.info().slug.clone(),
                Entry {
                    plugin,
                    source: Source::Bundled,
                },
            );
        }
        if let Some(dir) = &config.dir {
            let read = std::fs::read_dir(dir)
                .map_err(|e| anyhow::anyhow!("plugins.dir {}: {e}", dir.display()))?;
            // Native libraries only where the operator trusts some native plugin; the
            // runtime still refuses one whose slug is not trusted.
            let native = !config.native_trusted.is_empty();
            let mut files: Vec<PathBuf> = read
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.extension().is_some_and(|x| {
                        x == "wasm" || (native && x == std::env::consts::DLL_EXTENSION)
                    })
                })
                .collect();
            files.sort();
            for path in files {
                // A native library is opened only as the slug its file is named for
                // (`<slug>.so`), and only if that slug is trusted.
                let named = path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .filter(|_| path.extension().is_some_and(|x| x != "wasm"));
                let loaded = match std::fs::read(&path) {
                    Ok(bytes) => {
                        runtime
                            .load_as(&bytes, Grants::BySlug(&config.grants), named.as_deref())
                            .await
                    }
                    Err(e) => {
                        tracing::error!(path = %path.display(), error = %e, "cannot read plugin");
                        continue;
                    }
                };
                match loaded {
                    Ok(plugin) => {
                        let slug = plugin.info().slug.clone();
                        if entries.contains_key(&slug) {
                            tracing::warn!(%slug, path = %path.display(), "directory plugin replaces the loaded one");
                        }
                        entries.insert(
                            slug,
                            Entry {
                                plugin,
                                source: Source::Directory(path),
                            },
                        );
                    }
                    Err(e) => {
                        tracing::error!(path = %path.display(), error = %e, "plugin rejected")
                    }
                }
            }
        }
        Ok(Self {
            runtime,
            base: entries.clone(),
            defaults: RwLock::new(Arc::new(default_routes(&entries))),
            entries: RwLock::new(entries),
            canaries: RwLock::default(),
            grants: config.grants.clone(),
            refused: Default::default(),
            syncing: Default::default(),
        })
    }

    /// The bundled or directory plugin of `slug` (what it falls back to).
    pub fn base(&self, slug: &str) -> Option<Plugin> {
        self.base.get(slug).map(|e| e.plugin.clone())
    }

    /// Brings the loaded plugins in line with the installed versions active in
    /// `store`: each slug whose active digest differs from the loaded one is loaded
    /// and swapped in; a slug whose installed version is no longer active goes back to
    /// its base plugin. Returns the slugs swapped. A version that fails to load is
    /// logged and skipped (the slug keeps what it had), and tried again next time.
    pub async fn sync(
        &self,
        store: &dyn crate::store::PluginVersions,
    ) -> anyhow::Result<Vec<String>> {
        let _one_at_a_time = self.syncing.lock().await;
        let active: BTreeMap<String, String> =
            store.active_plugin_versions().await?.into_iter().collect();
        let loaded: Vec<(String, String, bool)> = self
            .entries
            .read()
            .unwrap()
            .iter()
            .map(|(slug, e)| {
                (
                    slug.clone(),
                    e.plugin.digest().to_string(),
                    matches!(e.source, Source::Installed { .. }),
                )
            })
            .collect();
        let mut swapped = Vec::new();
        for (slug, digest) in &active {
            let current = loaded.iter().find(|(s, _, _)| s == slug);
            if current.is_some_and(|(_, d, installed)| d == digest && *installed) {
                continue;
            }
            if let Some((plugin, by)) = self.load_version(store, slug, digest).await? {
                self.swap(slug, plugin, Source::Installed { by });
                swapped.push(slug.clone());
            }
        }
        for (slug, _, installed) in &loaded {
            if *installed && !active.contains_key(slug) {
                let mut entries = self.entries.write().unwrap();
                let old = match self.base.get(slug) {
                    Some(base) => entries.insert(slug.clone(), base.clone()),
                    None => entries.remove(slug),
                };
                retire(old.map(|e| e.plugin), None);
                *self.defaults.write().unwrap() = Arc::new(default_routes(&entries));
                tracing::info!(%slug, "installed version deactivated; back to the base plugin");
                swapped.push(slug.clone());
            }
        }
        self.sync_canaries(store, &mut swapped).await?;
        Ok(swapped)
    }

    /// Loads the running canaries that are new or changed, and drops the ended ones.
    async fn sync_canaries(
        &self,
        store: &dyn crate::store::PluginVersions,
        swapped: &mut Vec<String>,
    ) -> anyhow::Result<()> {
        let trials = store.canary_plugin_versions().await?;
        for trial in &trials {
            let running = self
                .canaries
                .read()
                .unwrap()
                .get(&trial.slug)
                .map(|(t, _)| t == trial);
            if running == Some(true) {
                continue;
            }
            if let Some((plugin, _)) = self.load_version(store, &trial.slug, &trial.digest).await? {
                tracing::info!(
                    slug = %trial.slug, version = %plugin.info().version,
                    digest = %&trial.digest[..16], percent = trial.percent,
                    "canary serving"
                );
                let old = self
                    .canaries
                    .write()
                    .unwrap()
                    .insert(trial.slug.clone(), (trial.clone(), plugin.clone()));
                retire(old.map(|(_, p)| p), Some(&plugin));
                swapped.push(trial.slug.clone());
            }
        }
        // Only the very trials the store runs: a trial that ended (even one whose
        // slug has started another that cannot be loaded here) stops being served.
        let mut canaries = self.canaries.write().unwrap();
        canaries.retain(|slug, (trial, plugin)| {
            let keep = trials.contains(trial);
            if !keep {
                tracing::info!(%slug, "canary ended");
                retire(Some(plugin.clone()), None);
                swapped.push(slug.clone());
            }
            keep
        });
        Ok(())
    }

    /// Loads the stored version `digest` of `slug` as this process may run it, with who
    /// installed it; `None` (logged) when it cannot be: not stored, a native library
    /// this process does not trust, or one that fails to load (tried again next time).
    async fn load_version(
        &self,
        store: &dyn crate::store::PluginVersions,
        slug: &str,
        digest: &str,
    ) -> anyhow::Result<Option<(Plugin, String)>> {
        if self.refused.lock().unwrap().contains(digest) {
            return Ok(None);
        }
        let installed_by = || async {
            Ok::<_, anyhow::Error>(
                store
                    .plugin_versions(Some(slug))
                    .await?
                    .into_iter()
                    .find(|v| v.digest == digest)
                    .map(|v| v.installed_by)
                    .unwrap_or_default(),
            )
        };
        // A canary promoted to active is the instance already serving its share.
        let serving = self
            .canaries
            .read()
            .unwrap()
            .get(slug)
            .filter(|(trial, _)| trial.digest == digest)
            .map(|(_, plugin)| plugin.clone());
        if let Some(plugin) = serving {
            return Ok(Some((plugin, installed_by().await?)));
        }
        let Some(wasm) = store.plugin_wasm(slug, digest).await? else {
            return Ok(None);
        };
        if super::artifact_kind(&wasm) == super::ArtifactKind::Native
            && !self.runtime.trusts_native(slug)
        {
            // Checked before the library is opened. Logged once per version.
            if self.refused.lock().unwrap().insert(digest.to_string()) {
                tracing::error!(
                    %slug, %digest,
                    "the version is a native library and this process does not \
                     trust native {slug} (plugins.native_trusted); keeping the loaded one"
                );
            }
            return Ok(None);
        }
        match self
            .runtime
            .load_as(&wasm, Grants::BySlug(&self.grants), Some(slug))
            .await
        {
            Ok(plugin) if plugin.info().slug == slug => Ok(Some((plugin, installed_by().await?))),
            Ok(plugin) => {
                tracing::error!(
                    %slug, other = %plugin.info().slug,
                    "installed version reports another slug; not loaded"
                );
                Ok(None)
            }
            Err(e) => {
                tracing::error!(%slug, %digest, error = %e, "installed version failed to load");
                Ok(None)
            }
        }
    }

    /// Replaces `slug`'s entry: calls in flight finish on the old instance.
    pub fn swap(&self, slug: &str, plugin: Plugin, source: Source) {
        let version = plugin.info().version.clone();
        let digest = plugin.digest().to_string();
        let mut entries = self.entries.write().unwrap();
        let old = entries.insert(
            slug.to_string(),
            Entry {
                plugin: plugin.clone(),
                source,
            },
        );
        *self.defaults.write().unwrap() = Arc::new(default_routes(&entries));
        drop(entries);
        retire(old.map(|e| e.plugin), Some(&plugin));
        tracing::info!(%slug, %version, digest = %&digest[..16], "plugin swapped in");
    }

    /// Follows the store's active versions until `stop` turns true: at once when a
    /// swap is announced, and every `every` in any case (announcements are best
    /// effort; polling is the safety net).
    pub async fn follow(
        self: std::sync::Arc<Self>,
        store: std::sync::Arc<dyn crate::store::PluginVersions>,
        heard: futures::stream::BoxStream<'static, crate::announce::Heard>,
        every: std::time::Duration,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        use futures::StreamExt;
        let mut heard = heard.fuse();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let announced = tokio::select! {
                _ = tick.tick() => None,
                Some(heard) = heard.next() => {
                    tracing::debug!(slug = %heard.what, "plugin swap announced");
                    // The next poll is a full period away again.
                    tick.reset();
                    Some(heard)
                }
                _ = stop.changed() => return,
            };
            if let Err(e) = self.sync(&*store).await {
                tracing::warn!(error = %e, "cannot read the installed plugin versions");
            }
            if let Some(heard) = announced {
                heard.applied().await;
            }
        }
    }

    /// The runtime plugins run in.
    pub fn runtime(&self) -> &PluginRuntime {
        &self.runtime
    }

    /// The plugin with `slug`.
    pub fn get(&self, slug: &str) -> Option<Plugin> {
        self.entries
            .read()
            .unwrap()
            .get(slug)
            .map(|e| e.plugin.clone())
    }

    /// The version of `slug` that serves `event_id` on `channel`: the canary when the
    /// slug has one and the event falls in its share ([`super::trial::arm_of`]), else
    /// the active one; with the trial's arm when the event is in a trial. A canary
    /// that does not serve the channel does not get the event: the active version
    /// does, and [`Picked::missed`] names the canary's arm, to be counted as its
    /// failed send. `None`: nothing serves the slug.
    pub fn pick(&self, slug: &str, event_id: &str, channel: &str) -> Option<Picked> {
        let in_trial = self
            .canaries
            .read()
            .unwrap()
            .get(slug)
            .and_then(|(trial, canary)| {
                let arm = super::trial::arm_of(
                    slug,
                    event_id,
                    trial.percent,
                    trial.since.timestamp_millis(),
                )?;
                let serving = (arm == Arm::Canary).then(|| canary.clone());
                Some((
                    serving,
                    Trial {
                        slug: slug.to_string(),
                        digest: trial.digest.clone(),
                        since: trial.since,
                        arm,
                    },
                ))
            });
        let stable = |trial, missed| {
            self.get(slug).map(|plugin| Picked {
                plugin,
                trial,
                missed,
            })
        };
        match in_trial {
            Some((Some(canary), trial)) if canary.serves(channel) => Some(Picked {
                plugin: canary,
                trial: Some(trial),
                missed: None,
            }),
            Some((Some(_), trial)) => stable(None, Some(trial)),
            Some((None, trial)) => stable(Some(trial), None),
            None => stable(None, None),
        }
    }

    /// `slug`'s running canary, as this process last read it.
    pub fn canary(&self, slug: &str) -> Option<CanaryTrial> {
        self.canaries
            .read()
            .unwrap()
            .get(slug)
            .map(|(trial, _)| trial.clone())
    }

    /// Every running canary and its loaded version, by slug.
    pub fn canaries(&self) -> Vec<(CanaryTrial, Plugin)> {
        self.canaries.read().unwrap().values().cloned().collect()
    }

    /// Each channel's default route over the plugins loaded now
    /// ([`super::bundled::default_route`]), by channel name.
    pub fn default_routes(&self) -> Arc<BTreeMap<String, Vec<String>>> {
        self.defaults.read().unwrap().clone()
    }

    /// Every plugin, by slug.
    pub fn list(&self) -> Vec<Entry> {
        self.entries.read().unwrap().values().cloned().collect()
    }
}

/// Drops the instances kept for `old`'s next calls, now that it no longer serves
/// (unless it is `new` itself, swapped in again).
fn retire(old: Option<Plugin>, new: Option<&Plugin>) {
    if let Some(old) = old
        && new.is_none_or(|new| !old.same_load(new))
    {
        old.forget_kept();
    }
}

/// [`super::bundled::default_route`] for every channel the `entries` serve.
fn default_routes(entries: &BTreeMap<String, Entry>) -> BTreeMap<String, Vec<String>> {
    let mut routes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for bundled in BUNDLED {
        let Some(entry) = entries.get(bundled.slug) else {
            continue;
        };
        for channel in &entry.plugin.info().channels {
            routes
                .entry(super::channel_name(channel).to_string())
                .or_default()
                .push(bundled.slug.to_string());
        }
    }
    routes
}

#[cfg(test)]
impl Registry {
    /// Serves `plugin` as `trial`'s canary, as a sync would have.
    fn start_trial(&self, trial: CanaryTrial, plugin: Plugin) {
        self.canaries
            .write()
            .unwrap()
            .insert(trial.slug.clone(), (trial, plugin));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry of the bundled plugins, as `dev` loads them.
    async fn bundled() -> Registry {
        let runtime = PluginRuntime::new(super::super::RuntimeConfig {
            guest_time_budget: std::time::Duration::from_secs(2),
            ..Default::default()
        })
        .unwrap();
        Registry::load(runtime, &crate::config::Config::default().plugins)
            .await
            .unwrap()
    }

    /// The canary gets the events of its share made since its trial began, on the
    /// channels it serves; on a channel it does not, the active version sends and the
    /// canary's arm is named as missed; older events stay with the active version.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_canary_gets_its_share_on_the_channels_it_serves() {
        let registry = bundled().await;
        let (provd, email_only) = (
            registry.get("provd").unwrap(),
            registry.get("prova").unwrap(),
        );
        let before = crate::ids::EventId::generate();
        let since = chrono::Utc::now() + chrono::Duration::milliseconds(2);
        std::thread::sleep(std::time::Duration::from_millis(5));
        // A version of provD that serves only email and push (here: provA's component).
        registry.start_trial(
            CanaryTrial {
                slug: "provd".into(),
                digest: email_only.digest().into(),
                percent: 50,
                since,
            },
            email_only.clone(),
        );
        let ids: Vec<crate::ids::EventId> =
            (0..64).map(|_| crate::ids::EventId::generate()).collect();
        let share =
            |id: &crate::ids::EventId| super::super::trial::takes_canary("provd", id.as_str(), 50);
        let canary_event = ids.iter().find(|id| share(id)).unwrap();
        let stable_event = ids.iter().find(|id| !share(id)).unwrap();
        let arm = |p: &Option<Trial>| p.as_ref().map(|t| (t.arm, t.digest.clone(), t.since));
        let digest = email_only.digest().to_string();

        let p = registry
            .pick("provd", canary_event.as_str(), "email")
            .unwrap();
        assert_eq!(p.plugin.digest(), email_only.digest());
        assert_eq!(arm(&p.trial), Some((Arm::Canary, digest.clone(), since)));
        assert!(p.missed.is_none());
        // SMS: the canary does not serve it.
        let p = registry
            .pick("provd", canary_event.as_str(), "sms")
            .unwrap();
        assert_eq!(p.plugin.digest(), provd.digest());
        assert!(p.trial.is_none());
        assert_eq!(arm(&p.missed), Some((Arm::Canary, digest.clone(), since)));
        let p = registry
            .pick("provd", stable_event.as_str(), "sms")
            .unwrap();
        assert_eq!(p.plugin.digest(), provd.digest());
        assert_eq!(arm(&p.trial), Some((Arm::Stable, digest.clone(), since)));
        assert!(p.missed.is_none());
        // Made before the trial: the active version, in no arm, whatever the share.
        for channel in ["sms", "email"] {
            let p = registry.pick("provd", before.as_str(), channel).unwrap();
            assert_eq!(p.plugin.digest(), provd.digest());
            assert!(p.trial.is_none() && p.missed.is_none());
        }
        // Another slug has no trial.
        let p = registry
            .pick("provc", canary_event.as_str(), "sms")
            .unwrap();
        assert!(p.trial.is_none() && p.missed.is_none());
        assert!(
            registry
                .pick("nope", canary_event.as_str(), "sms")
                .is_none()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn default_routes_follow_what_the_loaded_plugins_serve() {
        let registry = bundled().await;
        let routes = |r: &Registry| -> Vec<(String, String)> {
            r.default_routes()
                .iter()
                .map(|(c, slugs)| (c.clone(), slugs.join(",")))
                .collect()
        };
        let expected = [
            ("email", "prova,provb"),
            ("push", "prova"),
            ("sms", "provc,provd"),
            ("voice", "prove,provc,provd"),
            ("whatsapp", "provd"),
        ]
        .map(|(c, s)| (c.to_string(), s.to_string()));
        assert_eq!(routes(&registry), expected);
        // A version of provD that serves only email (here: provA's component) leaves the
        // routes of the channels it no longer serves and joins email's, in its place.
        let email_only = registry.get("prova").unwrap();
        registry.swap("provd", email_only, Source::Bundled);
        let expected = [
            ("email", "prova,provb,provd"),
            ("push", "prova,provd"),
            ("sms", "provc"),
            ("voice", "prove,provc"),
        ]
        .map(|(c, s)| (c.to_string(), s.to_string()));
        assert_eq!(routes(&registry), expected);
    }

    /// A swap drops the instances kept for the version it replaces; swapping a version
    /// in again (the same load) keeps its own.
    #[tokio::test]
    async fn a_swap_drops_the_instances_kept_for_the_version_it_replaces() {
        use super::super::session::CallKind;
        let registry = bundled().await;
        let (provc, other) = (
            registry.get("provc").unwrap(),
            registry.get("provd").unwrap(),
        );
        for plugin in [&provc, &other] {
            plugin
                .session_for(CallKind::Quick, "ws_a")
                .await
                .unwrap()
                .normalize_call_state("completed")
                .await
                .unwrap();
        }
        assert_eq!(provc.kept_instances(), 2);
        registry.swap("provc", provc.clone(), Source::Bundled);
        assert_eq!(provc.kept_instances(), 2, "the same load swapped in again");
        registry.swap("provc", other.clone(), Source::Bundled);
        assert_eq!(provc.kept_instances(), 1, "only provD's is left");
        assert!(registry.get("provc").unwrap().same_load(&other));
    }
}
