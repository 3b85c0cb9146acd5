//! Where the gateway gets the election cluster's public keys.
//!
//! Either one PEM file (offline; `kid` is not consulted) or the cluster's
//! `/v1/jwks`, cached, refreshed in the background, and refetched on demand
//! when a token names an unknown `kid`.
//!
//! An unknown `kid` is never refused on the strength of a stale cache: the
//! request waits (at most `wait`) for a fetch that *started after* it
//! arrived, so a token from a key the cluster installed or rotated a moment
//! ago verifies. Concurrent requests share one fetch, and fetches start at
//! most once per `min_refetch`, so a flood of made-up `kid`s costs the
//! cluster a bounded trickle of requests. Only when a fresh JWKS lacks the
//! `kid` is the token refused (401); when no node answered, the gateway says
//! 503 and the client retries.
//!
//! Each successful fetch replaces the key set: a key the cluster retired
//! (after every token it signed expired) stops being trusted.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::DecodingKey;
use tokio::sync::watch;

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

    /// Whether a token signed under `kid` is still trusted without a fetch
    /// (its key is in the cached set; always, for a PEM key).
    pub fn trusts(&self, kid: Option<&str>) -> bool {
        match (self, kid) {
            (KeySource::Pem(_), _) => true,
            (KeySource::Jwks(cache), Some(kid)) => cache.cached(kid).is_some(),
            (KeySource::Jwks(_), None) => false,
        }
    }

    /// The key for `kid`, fetching the JWKS again if it is unknown.
    pub async fn key_for(&self, kid: Option<&str>) -> KeyLookup {
        match (self, kid) {
            (KeySource::Pem(key), _) => KeyLookup::Found(key.clone()),
            (KeySource::Jwks(cache), Some(kid)) => cache.key_for(kid).await,
            (KeySource::Jwks(_), None) => KeyLookup::Unknown,
        }
    }
}

/// What looking a key up found.
#[derive(Debug, Clone)]
pub enum KeyLookup {
    /// The key.
    Found(DecodingKey),
    /// A fresh JWKS does not hold it (or the token names no `kid`).
    Unknown,
    /// No election node answered in time; the key may exist.
    Unreachable(String),
}

/// The fetch rounds: numbered, one at a time; a caller waits for a round
/// numbered above the last one started when it asked.
#[derive(Debug, Default)]
struct Rounds {
    started: u64,
    running: bool,
    last_start: Option<Instant>,
}

/// The JWKS of the election cluster, cached.
#[derive(Debug)]
pub struct JwksCache {
    /// Election node base URLs, tried in order.
    endpoints: Vec<String>,
    client: reqwest::Client,
    keys: RwLock<HashMap<String, DecodingKey>>,
    rounds: Mutex<Rounds>,
    /// The number and outcome of the last finished round.
    finished: watch::Sender<(u64, Result<usize, String>)>,
    /// The least time between the starts of two fetches.
    min_refetch: Duration,
    /// The longest a request waits for a fresh fetch.
    wait: Duration,
}

impl JwksCache {
    /// A cache with no keys yet; call [`JwksCache::refresh`] or let
    /// [`JwksCache::key_for`] fetch on demand. Fetches start at most once
    /// per `min_refetch`; a request waits at most `wait` for one.
    pub fn new(endpoints: Vec<String>, min_refetch: Duration, wait: Duration) -> Self {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_millis(500))
            .build()
            .unwrap_or_default();
        Self {
            endpoints,
            client,
            keys: RwLock::new(HashMap::new()),
            rounds: Mutex::default(),
            finished: watch::channel((0, Ok(0))).0,
            min_refetch,
            wait,
        }
    }

    /// Trusts only `ca` for `https://` election endpoints.
    #[must_use]
    pub fn with_ca(mut self, ca: reqwest::Certificate) -> Self {
        self.client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_millis(500))
            .add_root_certificate(ca)
            .build()
            .unwrap_or_default();
        self
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

    async fn key_for(self: &Arc<Self>, kid: &str) -> KeyLookup {
        if let Some(key) = self.cached(kid) {
            return KeyLookup::Found(key);
        }
        let outcome = match tokio::time::timeout(self.wait, self.fresh_round()).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!(
                "no JWKS fetch finished within {} ms",
                self.wait.as_millis()
            )),
        };
        match (self.cached(kid), outcome) {
            (Some(key), _) => KeyLookup::Found(key),
            (None, Ok(_)) => KeyLookup::Unknown,
            (None, Err(err)) => KeyLookup::Unreachable(err),
        }
    }

    /// Waits for a fetch that starts after this call, starting one if none
    /// runs; its outcome.
    async fn fresh_round(self: &Arc<Self>) -> Result<usize, String> {
        let needed = self.lock_rounds().started + 1;
        let mut finished = self.finished.subscribe();
        loop {
            self.start_round();
            let (number, outcome) = finished.borrow_and_update().clone();
            if number >= needed {
                return outcome;
            }
            if finished.changed().await.is_err() {
                return Err("the JWKS cache was dropped".into());
            }
        }
    }

    fn lock_rounds(&self) -> std::sync::MutexGuard<'_, Rounds> {
        self.rounds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts a fetch round in the background unless one runs. The task
    /// outlives a caller that stops waiting, so a round always finishes.
    fn start_round(self: &Arc<Self>) {
        let (number, delay) = {
            let mut rounds = self.lock_rounds();
            if rounds.running {
                return;
            }
            rounds.running = true;
            rounds.started += 1;
            let delay = rounds.last_start.map_or(Duration::ZERO, |at| {
                self.min_refetch.saturating_sub(at.elapsed())
            });
            (rounds.started, delay)
        };
        let cache = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            cache.lock_rounds().last_start = Some(Instant::now());
            let outcome = cache.fetch().await;
            if let Err(err) = &outcome {
                tracing::warn!(%err, "cannot fetch the JWKS");
            }
            cache.lock_rounds().running = false;
            let _previous = cache.finished.send_replace((number, outcome));
        });
    }

    /// Fetches now, as a round of its own (waiting for one that runs).
    ///
    /// # Errors
    /// A description of why no endpoint gave a usable JWKS.
    pub async fn refresh(self: &Arc<Self>) -> Result<usize, String> {
        self.fresh_round().await
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
                    let keys: HashMap<_, _> = usable_keys(&set).into_iter().collect();
                    let count = keys.len();
                    // The published set replaces the cached one, so a
                    // retired key stops being trusted; an empty set (a
                    // cluster that has no key yet) changes nothing.
                    if count > 0 {
                        if let Ok(mut cached) = self.keys.write() {
                            *cached = keys;
                        }
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
