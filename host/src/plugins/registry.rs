//! The loaded plugins, by slug: the bundled five, then any component in the plugins
//! directory (which replaces a bundled plugin of the same slug).

use super::bundled::BUNDLED;
use super::runtime::{Grants, Plugin, PluginRuntime};
use crate::config::PluginsConfig;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::RwLock;

/// Where a plugin came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Embedded in the binary.
    Bundled,
    /// A file in the plugins directory.
    Directory(PathBuf),
}

/// A loaded plugin and its origin.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The plugin.
    pub plugin: Plugin,
    /// Its origin.
    pub source: Source,
}

/// Plugins by slug.
pub struct Registry {
    runtime: PluginRuntime,
    entries: RwLock<BTreeMap<String, Entry>>,
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
            let mut files: Vec<PathBuf> = read
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "wasm"))
                .collect();
            files.sort();
            for path in files {
                let loaded = match std::fs::read(&path) {
                    Ok(bytes) => runtime.load(&bytes, Grants::BySlug(&config.grants)).await,
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
            entries: RwLock::new(entries),
        })
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

    /// Every plugin, by slug.
    pub fn list(&self) -> Vec<Entry> {
        self.entries.read().unwrap().values().cloned().collect()
    }
}
