//! API keys: generation, hashing, bearer parsing and the resolved-key cache.
//!
//! Only the SHA-256 of a key is stored; the raw key is printed once at creation. The
//! cache is keyed by that digest (never the key).
//!
//! Revocation reaches every process at once: [`revoke`] marks the key in the store and
//! announces its digest ([`crate::announce`]: a NATS subject in production, an
//! in-process channel when embedded); every serving process hears it and refuses the
//! key from its next request on. The store stays the source of truth: each process
//! also polls `revocations_since` every [`REVOCATION_POLL`] (a missed announcement, a
//! revocation made from the embedded CLI). A trigger re-checks its key right before it
//! commits, and the other writes (preferences, erasure, plugin installs) re-read it
//! from the store, so an in-flight request with a revoked key fails with 401.

use crate::announce::{Announcer, Heard};
use crate::crypto::constant_time_eq;
use crate::ids::ApiKeyId;
use crate::model::{ApiKeyRecord, KeyMode, NewApiKey};
use crate::store::{StoreError, Tenancy};
use futures::stream::BoxStream;
use rand::RngCore;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a resolved key is trusted without asking the store again.
pub const CACHE_TTL: Duration = Duration::from_secs(30);
/// How often revocations are pulled from the store.
pub const REVOCATION_POLL: Duration = Duration::from_millis(200);

/// Prefix of live keys.
pub const LIVE_PREFIX: &str = "svc_sk_live_";
/// Prefix of test keys.
pub const TEST_PREFIX: &str = "svc_sk_test_";

/// Reads the plugin registry (`GET /v1/admin/plugins`, MCP `list_plugins`). A key
/// without scopes is an application key: every other `/v1/` route, never `/v1/admin/*`.
pub const SCOPE_ADMIN: &str = "admin";

/// The gateway operator's authority: installs plugins over the API
/// (`POST /v1/admin/plugins`). Plugins serve every tenant, so this is never a tenant's
/// scope; only the CLI on the host mints it, and it includes `admin`. Approving new
/// outbound hosts is not part of it: only `switchboard plugin install --approve-hosts`
/// on the host does that.
pub const SCOPE_OPERATOR: &str = "operator";

/// Every scope a key may carry.
pub const SCOPES: &[&str] = &[SCOPE_ADMIN, SCOPE_OPERATOR];

/// A new raw key (`svc_sk_live_` or `svc_sk_test_` and 48 hex digits) and what to store.
pub fn generate_key(workspace: &crate::ids::WorkspaceId, mode: KeyMode) -> (String, NewApiKey) {
    let mut secret = [0u8; 24];
    rand::rng().fill_bytes(&mut secret);
    let prefix = match mode {
        KeyMode::Live => LIVE_PREFIX,
        KeyMode::Test => TEST_PREFIX,
    };
    let raw = format!("{prefix}{}", hex::encode(secret));
    let record = NewApiKey {
        id: ApiKeyId::generate(),
        workspace: workspace.clone(),
        mode,
        hash: digest(&raw),
        hint: format!("{prefix}…{}", &raw[raw.len() - 4..]),
        created_at: chrono::Utc::now(),
        scopes: Vec::new(),
    };
    (raw, record)
}

/// SHA-256 of a raw key.
pub fn digest(raw: &str) -> [u8; 32] {
    Sha256::digest(raw.as_bytes()).into()
}

/// Why a request is not authenticated. Every variant is a 401 `UNAUTHORIZED`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization` header.
    #[error("missing bearer token: send `Authorization: Bearer <API_KEY>`")]
    Missing,
    /// Not `Bearer svc_sk_(live|test)_…`.
    #[error(
        "malformed Authorization header: expected `Bearer svc_sk_live_…` or `Bearer svc_sk_test_…`"
    )]
    Malformed,
    /// Unknown or revoked key.
    #[error("unrecognised or revoked API key")]
    Unrecognised,
}

/// Extracts the raw key from an `Authorization` header value.
pub fn parse_bearer(header: Option<&str>) -> Result<&str, AuthError> {
    let header = header.ok_or(AuthError::Missing)?;
    let (scheme, token) = header.trim().split_once(' ').ok_or(AuthError::Malformed)?;
    let token = token.trim();
    let well_formed = scheme.eq_ignore_ascii_case("bearer")
        && (token.starts_with(LIVE_PREFIX) || token.starts_with(TEST_PREFIX))
        && token.len() <= 200
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if well_formed {
        Ok(token)
    } else {
        Err(AuthError::Malformed)
    }
}

/// Resolves bearer keys to their records, with a short-lived cache.
pub struct Authenticator {
    store: Arc<dyn Tenancy>,
    cache: Mutex<HashMap<[u8; 32], (ApiKeyRecord, Instant)>>,
    revoked: Mutex<HashSet<[u8; 32]>>,
    revocation_cursor: Mutex<i64>,
}

impl Authenticator {
    /// An authenticator over `store`; call [`Authenticator::poll_revocations`] regularly.
    pub fn new(store: Arc<dyn Tenancy>) -> Self {
        Self {
            store,
            cache: Mutex::new(HashMap::new()),
            revoked: Mutex::new(HashSet::new()),
            revocation_cursor: Mutex::new(0),
        }
    }

    /// The live record for `raw`, or why not.
    pub async fn authenticate(
        &self,
        raw: &str,
    ) -> Result<Result<ApiKeyRecord, AuthError>, StoreError> {
        self.authenticate_digest(digest(raw)).await
    }

    /// The live record of the key whose SHA-256 is `hash` (a console session holds
    /// the digest, never the key), or why not.
    pub async fn authenticate_digest(
        &self,
        hash: [u8; 32],
    ) -> Result<Result<ApiKeyRecord, AuthError>, StoreError> {
        if self.revoked.lock().unwrap().contains(&hash) {
            return Ok(Err(AuthError::Unrecognised));
        }
        if let Some((record, at)) = self.cache.lock().unwrap().get(&hash)
            && at.elapsed() < CACHE_TTL
        {
            return Ok(Ok(record.clone()));
        }
        let Some(record) = self.store.api_key_by_hash(&hash).await? else {
            return Ok(Err(AuthError::Unrecognised));
        };
        if record.revoked_at.is_some() {
            self.revoked.lock().unwrap().insert(hash);
            return Ok(Err(AuthError::Unrecognised));
        }
        self.cache
            .lock()
            .unwrap()
            .insert(hash, (record.clone(), Instant::now()));
        Ok(Ok(record))
    }

    /// True if the key was revoked since it was resolved, as far as this process
    /// has heard (checked right before a trigger commits).
    pub fn is_revoked(&self, raw: &str) -> bool {
        self.revoked.lock().unwrap().contains(&digest(raw))
    }

    /// True if the store says the key is revoked (or gone): the check before a write
    /// that is not on the trigger path, where a query per request costs nothing.
    pub async fn is_revoked_in_store(&self, raw: &str) -> Result<bool, StoreError> {
        self.is_digest_revoked_in_store(digest(raw)).await
    }

    /// [`Self::is_revoked_in_store`] for a key known by its digest (a console session).
    pub async fn is_digest_revoked_in_store(&self, hash: [u8; 32]) -> Result<bool, StoreError> {
        let revoked = match self.store.api_key_by_hash(&hash).await? {
            Some(record) => record.revoked_at.is_some(),
            None => true,
        };
        if revoked {
            self.forget(&[hash]);
        }
        Ok(revoked)
    }

    /// Revokes a key from a serving process: refused here at once, and announced to
    /// every other process. False when there is no such active key.
    pub async fn revoke(&self, id: &ApiKeyId, announcer: &Announcer) -> Result<bool, StoreError> {
        let hash = self.store.revoke_api_key(id).await?;
        if let Some(hash) = hash {
            self.forget(&[hash]);
            announcer.announce(&hex::encode(hash)).await;
        }
        Ok(hash.is_some())
    }

    /// Refuses these digests from now on.
    fn forget(&self, hashes: &[[u8; 32]]) {
        let mut cache = self.cache.lock().unwrap();
        let mut revoked = self.revoked.lock().unwrap();
        for h in hashes {
            cache.remove(h);
            revoked.insert(*h);
        }
    }

    /// Pulls new revocations from the store and evicts them from the cache.
    pub async fn poll_revocations(&self) -> Result<usize, StoreError> {
        let since = *self.revocation_cursor.lock().unwrap();
        let (hashes, cursor) = self.store.revocations_since(since).await?;
        self.forget(&hashes);
        let mut newest = self.revocation_cursor.lock().unwrap();
        *newest = (*newest).max(cursor);
        Ok(hashes.len())
    }

    /// Follows revocations forever (spawn it): a digest `heard` (subscribed to before
    /// the process serves, [`Announcer::heard_or_nothing`]) is refused at once, then
    /// the store is polled; the store is also polled every [`REVOCATION_POLL`] in any
    /// case. Announcements are heard and answered beside
    /// the polls, never behind a slow one: the announcer stops waiting for answers
    /// after a short quiet spell.
    pub async fn follow_revocations(self: Arc<Self>, mut heard: BoxStream<'static, Heard>) {
        use futures::StreamExt;
        let poll_now = tokio::sync::Notify::new();
        let listen = async {
            while let Some(heard) = heard.next().await {
                // Refused before anything else runs; anything that is not a digest
                // (a gap in the in-process channel) just triggers the poll.
                if let Some(hash) = parse_digest(&heard.what) {
                    self.forget(&[hash]);
                }
                heard.applied().await;
                poll_now.notify_one();
            }
        };
        let poll = async {
            let mut tick = tokio::time::interval(REVOCATION_POLL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = poll_now.notified() => {}
                }
                if let Err(e) = self.poll_revocations().await {
                    tracing::warn!(error = %e, "cannot poll key revocations");
                }
            }
        };
        tokio::join!(listen, poll);
    }
}

/// Revokes a key and announces it to every serving process (when there is an
/// announcer; otherwise they follow within [`REVOCATION_POLL`]). False when there is
/// no such active key. A serving process revokes through
/// [`Authenticator::revoke`], which also refuses the key itself at once.
pub async fn revoke(
    store: &dyn Tenancy,
    id: &ApiKeyId,
    announcer: Option<&Announcer>,
) -> Result<bool, StoreError> {
    let hash = store.revoke_api_key(id).await?;
    if let (Some(hash), Some(announcer)) = (hash, announcer) {
        announcer.announce(&hex::encode(hash)).await;
    }
    Ok(hash.is_some())
}

fn parse_digest(hex_digest: &str) -> Option<[u8; 32]> {
    hex::decode(hex_digest).ok()?.try_into().ok()
}

/// Constant-time check that a stored hash belongs to a raw key.
pub fn matches(raw: &str, stored: &[u8; 32]) -> bool {
    constant_time_eq(&digest(raw), stored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_the_spec_prefixes_and_only_the_hash_is_kept() {
        let ws = crate::ids::WorkspaceId::generate();
        let (raw, record) = generate_key(&ws, KeyMode::Test);
        assert!(raw.starts_with("svc_sk_test_") && raw.len() == TEST_PREFIX.len() + 48);
        assert!(matches(&raw, &record.hash));
        assert!(
            !record.hint.contains(&raw[12..40]),
            "the hint must not reveal the key"
        );
        let (live, _) = generate_key(&ws, KeyMode::Live);
        assert!(live.starts_with("svc_sk_live_"));
        assert_ne!(raw, generate_key(&ws, KeyMode::Test).0);
    }

    #[test]
    fn bearer_parsing() {
        let key = "svc_sk_live_0123456789abcdef";
        assert_eq!(parse_bearer(Some(&format!("Bearer {key}"))), Ok(key));
        assert_eq!(parse_bearer(Some(&format!("bearer  {key} "))), Ok(key));
        assert_eq!(parse_bearer(None), Err(AuthError::Missing));
        assert_eq!(parse_bearer(Some(key)), Err(AuthError::Malformed));
        assert_eq!(parse_bearer(Some("Basic abc")), Err(AuthError::Malformed));
        assert_eq!(
            parse_bearer(Some("Bearer sk_live_x")),
            Err(AuthError::Malformed)
        );
        assert_eq!(
            parse_bearer(Some("Bearer svc_sk_live_a;drop")),
            Err(AuthError::Malformed)
        );
    }
}
