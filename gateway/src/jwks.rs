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
//! A fetch asks every endpoint at once, and each answer says how current
//! its key set is (`applied_index`: the log index it is as of). The newest
//! answer wins, and it replaces the cached set only if it is at least as
//! new as the set cached: so a node that lags (cut off from its peers, or
//! still starting) can neither hide a key the cluster has committed — a
//! valid token is accepted as long as any reachable node has its key — nor
//! bring back a key the cluster retired.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk};
use jsonwebtoken::DecodingKey;
use palisade_plumbing::sync::{lock, read, write};
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

/// A key set and the log index it is as of.
#[derive(Debug, Default)]
struct KeySet {
    applied_index: u64,
    keys: HashMap<String, DecodingKey>,
}

/// A `/v1/jwks` answer: the keys, and the index they are as of (0 from a
/// node that does not say).
#[derive(Debug, serde::Deserialize)]
struct Published {
    keys: Vec<Jwk>,
    #[serde(default)]
    applied_index: u64,
}

/// The JWKS of the election cluster, cached.
#[derive(Debug)]
pub struct JwksCache {
    /// Election node base URLs, tried in order.
    endpoints: Vec<String>,
    client: reqwest::Client,
    keys: RwLock<KeySet>,
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
            keys: RwLock::default(),
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
        read(&self.keys).keys.len()
    }

    /// The log index the cached key set is as of.
    pub fn applied_index(&self) -> u64 {
        read(&self.keys).applied_index
    }

    /// The trusted key ids, sorted, and the log index they are as of.
    pub fn trusted(&self) -> (Vec<String>, u64) {
        let set = read(&self.keys);
        let mut kids: Vec<String> = set.keys.keys().cloned().collect();
        kids.sort();
        (kids, set.applied_index)
    }

    /// Whether no key is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn cached(&self, kid: &str) -> Option<DecodingKey> {
        read(&self.keys).keys.get(kid).cloned()
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
        lock(&self.rounds)
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

    /// Asks every endpoint at once and keeps the newest key set, unless the
    /// cached one is newer; the number of keys cached after.
    async fn fetch(&self) -> Result<usize, String> {
        let answers =
            futures_util::future::join_all(self.endpoints.iter().map(|e| self.fetch_one(e))).await;
        let mut newest: Option<Published> = None;
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(published)
                    if newest
                        .as_ref()
                        .is_none_or(|n| published.applied_index > n.applied_index) =>
                {
                    newest = Some(published);
                }
                Ok(_) => {}
                Err(err) => errors.push(err),
            }
        }
        let Some(newest) = newest else {
            return Err(errors.join("; "));
        };
        let keys: HashMap<_, _> = usable_keys(&newest.keys).into_iter().collect();
        let mut cached = write(&self.keys);
        // An empty set (a cluster that has no key yet) changes nothing, and
        // an older set than the cached one never replaces it.
        if !keys.is_empty() && newest.applied_index >= cached.applied_index {
            *cached = KeySet {
                applied_index: newest.applied_index,
                keys,
            };
        }
        tracing::debug!(
            applied_index = newest.applied_index,
            count = cached.keys.len(),
            "fetched JWKS"
        );
        Ok(cached.keys.len())
    }

    /// One endpoint's published keys.
    async fn fetch_one(&self, endpoint: &str) -> Result<Published, String> {
        let url = format!("{}/v1/jwks", endpoint.trim_end_matches('/'));
        match self.client.get(&url).send().await {
            Ok(response) if response.status().is_success() => response
                .json::<Published>()
                .await
                .map_err(|e| format!("{url}: {e}")),
            Ok(response) => Err(format!("{url}: status {}", response.status())),
            Err(err) => Err(format!("{url}: {err}")),
        }
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

/// The Ed25519 keys of `keys` that have a `kid` and a 32-byte `x`.
fn usable_keys(keys: &[Jwk]) -> Vec<(String, DecodingKey)> {
    keys.iter()
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

#[cfg(test)]
mod tests;
