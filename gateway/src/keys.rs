//! Where the gateway gets the election cluster's public keys.
//!
//! Either one PEM file (offline; `kid` is not consulted) or the cluster's
//! `/v1/jwks`, cached, refreshed in the background, and refetched on demand
//! when a token names an unknown `kid` — at most once per `min_refetch`, so a
//! flood of made-up `kid`s cannot turn into a flood of requests.

use std::collections::HashMap;
use std::path::Path;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::DecodingKey;
use tokio::sync::Mutex;

/// The public keys tokens may be signed with.
#[derive(Debug)]
pub enum KeySource {
    /// One key from a PEM file; any `kid` is accepted.
    Pem(DecodingKey),
    /// Keys by `kid` from the election cluster.
    Jwks(std::sync::Arc<JwksCache>),
}

impl KeySource {
    /// Loads an Ed25519 public key (SPKI PEM).
    ///
    /// # Errors
    /// A one-line description when the file is missing or not such a key.
    pub fn from_pem_file(path: &Path) -> Result<Self, String> {
        let pem =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let key = DecodingKey::from_ed_pem(&pem)
            .map_err(|e| format!("{} is not an Ed25519 public key PEM: {e}", path.display()))?;
        // jsonwebtoken slices the first 32 bytes without checking; check here.
        match key.try_get_as_bytes() {
            Ok(bytes) if bytes.len() == 32 => Ok(KeySource::Pem(key)),
            _ => Err(format!(
                "{} does not hold a 32-byte Ed25519 key",
                path.display()
            )),
        }
    }

    /// The key for `kid`, fetching the JWKS again if it is unknown.
    pub async fn key_for(&self, kid: Option<&str>) -> Option<DecodingKey> {
        match self {
            KeySource::Pem(key) => Some(key.clone()),
            KeySource::Jwks(cache) => cache.key_for(kid?).await,
        }
    }
}

/// The JWKS of the election cluster, cached.
#[derive(Debug)]
pub struct JwksCache {
    /// Election node base URLs, tried in order.
    endpoints: Vec<String>,
    client: reqwest::Client,
    keys: RwLock<HashMap<String, DecodingKey>>,
    /// When the last fetch was attempted; serializes fetches, too.
    last_fetch: Mutex<Option<Instant>>,
    /// The least time between two fetches triggered by unknown `kid`s.
    min_refetch: Duration,
}

impl JwksCache {
    /// A cache with no keys yet; call [`JwksCache::refresh`] or let
    /// [`JwksCache::key_for`] fetch on demand.
    pub fn new(endpoints: Vec<String>, min_refetch: Duration) -> Self {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap_or_default();
        Self {
            endpoints,
            client,
            keys: RwLock::new(HashMap::new()),
            last_fetch: Mutex::new(None),
            min_refetch,
        }
    }

    /// How many keys are cached.
    pub fn len(&self) -> usize {
        self.keys.read().map(|k| k.len()).unwrap_or(0)
    }

    /// Whether no key is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn cached(&self, kid: &str) -> Option<DecodingKey> {
        self.keys.read().ok()?.get(kid).cloned()
    }

    async fn key_for(&self, kid: &str) -> Option<DecodingKey> {
        if let Some(key) = self.cached(kid) {
            return Some(key);
        }
        self.refresh_if_due().await;
        self.cached(kid)
    }

    /// Fetches unless a fetch happened less than `min_refetch` ago.
    async fn refresh_if_due(&self) {
        let mut last = self.last_fetch.lock().await;
        if last.is_some_and(|at| at.elapsed() < self.min_refetch) {
            return;
        }
        *last = Some(Instant::now());
        if let Err(err) = self.fetch().await {
            tracing::warn!(%err, "cannot refresh the JWKS");
        }
    }

    /// Fetches now (still serialized with other fetches).
    ///
    /// # Errors
    /// A description of why no endpoint gave a usable JWKS.
    pub async fn refresh(&self) -> Result<usize, String> {
        let mut last = self.last_fetch.lock().await;
        *last = Some(Instant::now());
        self.fetch().await
    }

    async fn fetch(&self) -> Result<usize, String> {
        let mut errors = Vec::new();
        for endpoint in &self.endpoints {
            let url = format!("{}/v1/jwks", endpoint.trim_end_matches('/'));
            let set = match self.client.get(&url).send().await {
                Ok(response) if response.status().is_success() => {
                    response.json::<JwkSet>().await.map_err(|e| e.to_string())
                }
                Ok(response) => Err(format!("status {}", response.status())),
                Err(err) => Err(err.to_string()),
            };
            match set {
                Ok(set) => {
                    let keys = usable_keys(&set);
                    let count = keys.len();
                    if let Ok(mut cached) = self.keys.write() {
                        // Keys are only added: a token signed by a retired key
                        // stays verifiable until the gateway restarts.
                        cached.extend(keys);
                    }
                    tracing::debug!(%url, count, "fetched JWKS");
                    return Ok(count);
                }
                Err(err) => errors.push(format!("{url}: {err}")),
            }
        }
        Err(errors.join("; "))
    }

    /// Keeps trying until the first fetch succeeds, then refreshes every
    /// `every`. Runs until the returned task is aborted.
    pub fn spawn_refresher(
        self: &std::sync::Arc<Self>,
        every: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let cache = self.clone();
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(200);
            loop {
                match cache.refresh().await {
                    Ok(0) => {
                        // The cluster is up but has not installed its key yet
                        // (a fresh cluster does so right after electing a
                        // leader): look again soon.
                        tracing::debug!("the election cluster publishes no key yet");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Ok(count) => {
                        tracing::info!(count, "JWKS loaded");
                        tokio::time::sleep(every).await;
                        backoff = Duration::from_millis(200);
                    }
                    Err(err) => {
                        tracing::warn!(%err, "waiting for the election cluster's JWKS");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
        })
    }
}

/// The Ed25519 keys of `set` that have a `kid` and a 32-byte `x`.
fn usable_keys(set: &JwkSet) -> Vec<(String, DecodingKey)> {
    set.keys
        .iter()
        .filter_map(|jwk| {
            let kid = jwk.common.key_id.clone()?;
            let AlgorithmParameters::OctetKeyPair(params) = &jwk.algorithm else {
                return None;
            };
            if params.curve != EllipticCurve::Ed25519 {
                return None;
            }
            let key = DecodingKey::from_ed_components(&params.x).ok()?;
            (key.try_get_as_bytes().ok()?.len() == 32).then_some((kid, key))
        })
        .collect()
}
