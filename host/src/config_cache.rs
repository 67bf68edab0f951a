//! Configuration as the hot paths read it, cached: a delivery reads its workflow and
//! its workspace's provider routes, and a provider callback its provider's webhook
//! secrets, which change rarely, from memory instead of from the database.
//!
//! A change is followed at once when it is announced (the CLI's `workflows apply`,
//! `providers apply` and `webhooks set-secret` announce on
//! `broker.streams.config_subject`; every gateway and worker process drops its cache
//! on hearing it, and answers), and within [`CONFIG_TTL`]
//! otherwise: an entry is never served older than that, which is the safety net for a
//! change made with the database alone or while the announcement was lost (and, with
//! the embedded broker, for a CLI change: there is no cross-process channel).

use crate::announce::Heard;
use crate::ids::WorkspaceId;
use crate::model::ProviderRoute;
use crate::store::{Configuration, StoreError, WebhookSecret};
use futures::stream::BoxStream;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The oldest a cached entry is served.
pub const CONFIG_TTL: Duration = Duration::from_secs(1);

/// Cached entries beyond this many (per kind) are dropped wholesale: a bound on memory
/// with many workspaces, at the cost of re-reading.
const MAX_ENTRIES: usize = 10_000;

/// A workspace's provider routes, by channel.
pub type Routes = Arc<BTreeMap<String, Vec<ProviderRoute>>>;

type Map<K, V> = Mutex<HashMap<K, (Instant, V)>>;

/// Workflows, provider routes and webhook secrets, read through from a
/// [`Configuration`] store.
pub struct ConfigCache {
    store: Arc<dyn Configuration>,
    ttl: Duration,
    /// Bumped by every invalidation: a read that began before one is not cached.
    generation: AtomicU64,
    workflows: Map<(WorkspaceId, String), Option<Arc<serde_json::Value>>>,
    routes: Map<WorkspaceId, Routes>,
    secrets: Map<String, Arc<Vec<WebhookSecret>>>,
}

impl ConfigCache {
    /// A cache over `store`, entries served for at most [`CONFIG_TTL`].
    pub fn new(store: Arc<dyn Configuration>) -> Arc<Self> {
        Self::with_ttl(store, CONFIG_TTL)
    }

    /// A cache whose entries are served for at most `ttl` (zero: no caching).
    pub fn with_ttl(store: Arc<dyn Configuration>, ttl: Duration) -> Arc<Self> {
        Arc::new(Self {
            store,
            ttl,
            generation: AtomicU64::new(0),
            workflows: Mutex::new(HashMap::new()),
            routes: Mutex::new(HashMap::new()),
            secrets: Mutex::new(HashMap::new()),
        })
    }

    /// The stored definition of workflow `name` of `workspace`, if any.
    pub async fn workflow(
        &self,
        workspace: &WorkspaceId,
        name: &str,
    ) -> Result<Option<Arc<serde_json::Value>>, StoreError> {
        let key = (workspace.clone(), name.to_string());
        self.read_through(&self.workflows, key, async {
            Ok(self.store.workflow(workspace, name).await?.map(Arc::new))
        })
        .await
    }

    /// The workspace's provider routes, by channel.
    pub async fn provider_routes(&self, workspace: &WorkspaceId) -> Result<Routes, StoreError> {
        self.read_through(&self.routes, workspace.clone(), async {
            Ok(Arc::new(self.store.provider_routes(workspace).await?))
        })
        .await
    }

    /// Every webhook secret of `provider` (as [`Configuration::webhook_secrets`]
    /// orders them).
    pub async fn webhook_secrets(
        &self,
        provider: &str,
    ) -> Result<Arc<Vec<WebhookSecret>>, StoreError> {
        self.read_through(&self.secrets, provider.to_string(), async {
            Ok(Arc::new(self.store.webhook_secrets(provider).await?))
        })
        .await
    }

    /// How many times the cache was dropped so far.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Forgets everything cached: the next reads go to the database.
    pub fn invalidate(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.workflows.lock().expect("cache lock").clear();
        self.routes.lock().expect("cache lock").clear();
        self.secrets.lock().expect("cache lock").clear();
    }

    /// Drops the cache on every change `heard` (from
    /// [`crate::announce::Announcer::heard_or_nothing`]) until `stop` turns true.
    pub async fn follow(
        self: Arc<Self>,
        mut heard: BoxStream<'static, Heard>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        use futures::StreamExt;
        loop {
            tokio::select! {
                next = heard.next() => match next {
                    Some(heard) => {
                        self.invalidate();
                        heard.applied().await;
                    }
                    None => return,
                },
                _ = stop.changed() => return,
            }
        }
    }

    async fn read_through<K: Eq + Hash, V: Clone>(
        &self,
        map: &Map<K, V>,
        key: K,
        load: impl std::future::Future<Output = Result<V, StoreError>>,
    ) -> Result<V, StoreError> {
        if let Some((at, value)) = map.lock().expect("cache lock").get(&key)
            && at.elapsed() < self.ttl
        {
            return Ok(value.clone());
        }
        let generation = self.generation.load(Ordering::SeqCst);
        let read_at = Instant::now();
        let value = load.await?;
        let mut map = map.lock().expect("cache lock");
        // Under the lock, so an invalidation either comes after this insert (and
        // clears it) or bumped the generation before it (and this is not kept).
        if self.generation.load(Ordering::SeqCst) == generation && !self.ttl.is_zero() {
            if map.len() >= MAX_ENTRIES {
                map.clear();
            }
            map.insert(key, (read_at, value.clone()));
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::announce::Announcer;
    use crate::model::Tier;
    use crate::store::Store as _;
    use crate::store::Tenancy as _;
    use crate::store::sqlite::SqliteStore;

    async fn store() -> (tempfile::TempDir, Arc<SqliteStore>, WorkspaceId) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("c.db")).await.unwrap();
        store.migrate().await.unwrap();
        let ws = store
            .ensure_workspace("acme", Some(Tier::Paid))
            .await
            .unwrap()
            .id;
        (dir, Arc::new(store), ws)
    }

    fn route(provider: &str) -> Vec<ProviderRoute> {
        vec![ProviderRoute {
            provider: provider.into(),
            config: BTreeMap::new(),
        }]
    }

    fn providers(routes: &Routes) -> Vec<&str> {
        routes["sms"].iter().map(|r| r.provider.as_str()).collect()
    }

    #[tokio::test]
    async fn served_from_memory_until_the_ttl_or_an_announcement() {
        let (_dir, store, ws) = store().await;
        store
            .put_provider_route(&ws, "sms", &route("provc"))
            .await
            .unwrap();
        store
            .put_workflow(&ws, "welcome", &serde_json::json!({"v": 1}))
            .await
            .unwrap();
        // Long enough for the writes and reads below to fit in it on a loaded machine.
        let ttl = Duration::from_secs(3);
        let cache = ConfigCache::with_ttl(store.clone(), ttl);
        let announcer = Announcer::local();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let heard = announcer.subscribe().await.unwrap();
        let follower = tokio::spawn(cache.clone().follow(heard, stopped));

        assert_eq!(
            providers(&cache.provider_routes(&ws).await.unwrap()),
            ["provc"]
        );
        assert_eq!(
            cache.workflow(&ws, "welcome").await.unwrap().as_deref(),
            Some(&serde_json::json!({"v": 1}))
        );
        assert_eq!(cache.workflow(&ws, "nope").await.unwrap(), None);

        // Changed in the database alone: the cache still serves the old values...
        store
            .put_provider_route(&ws, "sms", &route("provd"))
            .await
            .unwrap();
        store
            .put_workflow(&ws, "welcome", &serde_json::json!({"v": 2}))
            .await
            .unwrap();
        store
            .put_workflow(&ws, "nope", &serde_json::json!({"v": 1}))
            .await
            .unwrap();
        assert_eq!(
            providers(&cache.provider_routes(&ws).await.unwrap()),
            ["provc"]
        );
        assert_eq!(cache.workflow(&ws, "nope").await.unwrap(), None);
        // ...until its entries are older than the TTL.
        tokio::time::sleep(ttl + Duration::from_millis(300)).await;
        let reloaded = Instant::now();
        assert_eq!(
            providers(&cache.provider_routes(&ws).await.unwrap()),
            ["provd"]
        );
        assert_eq!(
            cache.workflow(&ws, "welcome").await.unwrap().as_deref(),
            Some(&serde_json::json!({"v": 2}))
        );
        assert!(cache.workflow(&ws, "nope").await.unwrap().is_some());

        // Announced: followed at once.
        store
            .put_provider_route(&ws, "sms", &route("prova"))
            .await
            .unwrap();
        announcer.announce(ws.as_str()).await;
        // Before the entries reloaded above run out, so that only the announcement can
        // have done it.
        let deadline = reloaded + ttl - Duration::from_millis(200);
        loop {
            let now = providers(&cache.provider_routes(&ws).await.unwrap()).join(",");
            if now == "prova" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "announcement not followed: {now}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.send(true).unwrap();
        follower.await.unwrap();
    }

    /// A rotated webhook secret: the old one verifies until the rotation is announced
    /// (or the TTL runs out), the new one from then on.
    #[tokio::test]
    async fn webhook_secrets_follow_an_announced_rotation() {
        let (_dir, store, ws) = store().await;
        store
            .put_webhook_secret("provc", None, "whsec_old")
            .await
            .unwrap();
        let cache = ConfigCache::with_ttl(store.clone(), Duration::from_secs(60));
        let announcer = Announcer::local();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let heard = announcer.subscribe().await.unwrap();
        let follower = tokio::spawn(cache.clone().follow(heard, stopped));
        let secrets = |all: &[WebhookSecret]| -> Vec<String> {
            all.iter().map(|s| s.secret.clone()).collect()
        };
        assert_eq!(
            secrets(&cache.webhook_secrets("provc").await.unwrap()),
            ["whsec_old"]
        );
        store
            .put_webhook_secret("provc", None, "whsec_new")
            .await
            .unwrap();
        store
            .put_webhook_secret("provc", Some(&ws), "whsec_ws")
            .await
            .unwrap();
        assert_eq!(
            secrets(&cache.webhook_secrets("provc").await.unwrap()),
            ["whsec_old"],
            "served from memory"
        );
        let before = cache.generation();
        announcer.announce("provc").await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while cache.generation() == before {
            assert!(Instant::now() < deadline, "announcement not followed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            secrets(&cache.webhook_secrets("provc").await.unwrap()),
            ["whsec_ws", "whsec_new"]
        );
        assert!(cache.webhook_secrets("provd").await.unwrap().is_empty());
        stop.send(true).unwrap();
        follower.await.unwrap();
    }

    #[tokio::test]
    async fn a_read_that_began_before_an_invalidation_is_not_kept() {
        let (_dir, store, ws) = store().await;
        store
            .put_provider_route(&ws, "sms", &route("provc"))
            .await
            .unwrap();
        let cache = ConfigCache::with_ttl(store.clone(), Duration::from_secs(60));
        let generation = cache.generation.load(Ordering::SeqCst);
        // As if an invalidation landed while this read was in flight.
        let stale = cache
            .read_through(&cache.routes, ws.clone(), async {
                cache.invalidate();
                Ok(Arc::new(BTreeMap::from([(
                    "sms".to_string(),
                    route("old"),
                )])))
            })
            .await
            .unwrap();
        assert_eq!(providers(&stale), ["old"]);
        assert_eq!(cache.generation.load(Ordering::SeqCst), generation + 1);
        assert_eq!(
            providers(&cache.provider_routes(&ws).await.unwrap()),
            ["provc"]
        );
    }
}
