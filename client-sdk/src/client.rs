//! [`Client`]: the election cluster (and optionally a gateway) over HTTP, with
//! bounded retries.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::lease::{encode_key, unavailable, Lease, Object};
use crate::Error;

/// How a [`Client`] behaves. Build with [`ClientConfig::new`] and adjust.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Election node base URLs (`http://host:port`); any node will do.
    pub endpoints: Vec<String>,
    /// The storage gateway's base URL, for fenced writes.
    pub gateway: Option<String>,
    /// Timeout of one HTTP request. Default 2 s.
    pub request_timeout: Duration,
    /// How long one call keeps retrying transient failures. Default 5 s.
    pub retry_budget: Duration,
    /// The safe deadline is `send time + ttl - margin`, with
    /// `margin = ttl * drift_margin_ratio` (at least 1 ms). It absorbs clock
    /// rate differences between this host and the Raft leader. Default 0.1.
    pub drift_margin_ratio: f64,
    /// Renew every `ttl * renew_ratio`. Default 1/3.
    pub renew_ratio: f64,
    /// Raise the gateway fence right after acquiring (needs `gateway`), so the
    /// previous holder's in-flight writes are refused before this holder
    /// writes anything. Default true.
    pub fence_on_acquire: bool,
}

impl ClientConfig {
    /// Defaults for these election endpoints.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            gateway: None,
            request_timeout: Duration::from_secs(2),
            retry_budget: Duration::from_secs(5),
            drift_margin_ratio: 0.1,
            renew_ratio: 1.0 / 3.0,
            fence_on_acquire: true,
        }
    }

    /// Sets the gateway URL.
    #[must_use]
    pub fn with_gateway(mut self, gateway: impl Into<String>) -> Self {
        self.gateway = Some(gateway.into());
        self
    }
}

/// A lease as the cluster reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    /// The lease name.
    pub lease: String,
    /// The holder, `None` when free.
    pub holder: Option<String>,
    /// The token of the latest grant.
    pub token: u64,
    /// The ttl of the latest grant.
    pub ttl_ms: u64,
    /// How many times the holder changed.
    pub transitions: u64,
    /// Log index of the last change (for [`Client::watch`]).
    pub modify_index: u64,
}

/// A grant as the cluster answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The lease name.
    pub lease: String,
    /// The holder.
    pub holder: String,
    /// The fencing token.
    pub token: u64,
    /// The granted ttl.
    pub ttl_ms: u64,
    /// The signed lease token for the gateway.
    pub jwt: String,
    /// Which acquire this grant came from: a repeated acquire by the holder
    /// keeps the token but gets a new index, and a release naming an older
    /// index frees nothing. `None` from clusters that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_index: Option<u64>,
}

/// The election cluster (and gateway) client. Cheap to clone.
///
/// ```no_run
/// # async fn demo() -> Result<(), palisade_client::Error> {
/// use std::time::Duration;
/// use palisade_client::{Client, ClientConfig};
///
/// let client = Client::new(
///     ClientConfig::new(["http://127.0.0.1:7001", "http://127.0.0.1:7002"])
///         .with_gateway("http://127.0.0.1:8080"),
/// );
/// let lease = client.acquire("cron", "worker-1", Duration::from_secs(5), None).await?;
/// lease.put("cron/last-run", b"2026-11-22".to_vec()).await?;
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) config: ClientConfig,
    pub(crate) http: reqwest::Client,
    /// The endpoint that answered last; tried first next time.
    preferred: AtomicUsize,
    /// One gate per (lease, holder): held by a background release (a dropped
    /// [`Lease`]) until it is done; an acquire for the same pair waits for
    /// it. Otherwise the acquire could be granted the very same token again
    /// (acquire by the holder is idempotent) and the late release would then
    /// free the new grant while its holder believes in it.
    release_gates: std::sync::Mutex<HashMap<(String, String), ReleaseGate>>,
}

/// Held while a lease is being released in the background.
pub(crate) type ReleaseGate = Arc<tokio::sync::Mutex<()>>;

/// One HTTP answer: status and JSON body (Null when not JSON).
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Value,
}

impl Answer {
    pub(crate) fn message(&self) -> String {
        self.body["message"].as_str().unwrap_or("").to_owned()
    }
}

impl Client {
    /// A client with `config`.
    pub fn new(config: ClientConfig) -> Self {
        let http = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .connect_timeout(config.request_timeout.min(Duration::from_millis(500)))
            .build()
            .unwrap_or_default();
        Self {
            inner: Arc::new(Inner {
                config,
                http,
                preferred: AtomicUsize::new(0),
                release_gates: std::sync::Mutex::default(),
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// Sends one election request, retrying connection failures, timeouts
    /// and 503s on the next endpoint with backoff and jitter, within the retry
    /// budget. Every other answer (409 included) is returned as is.
    pub(crate) async fn election(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, Error> {
        let endpoints = &self.inner.config.endpoints;
        if endpoints.is_empty() {
            return Err(Error::BadRequest("no election endpoints configured".into()));
        }
        let started = Instant::now();
        let mut attempts = 0u32;
        let mut backoff = Duration::from_millis(20);
        loop {
            let index = self.inner.preferred.load(Ordering::Relaxed) % endpoints.len();
            let url = format!("{}{path}", endpoints[index].trim_end_matches('/'));
            attempts += 1;
            let mut request = self.inner.http.request(method.clone(), &url);
            if let Some(body) = body {
                request = request.json(body);
            }
            let failure = match request.send().await {
                Ok(response) if response.status().as_u16() != 503 => {
                    let status = response.status().as_u16();
                    let body = response.json().await.unwrap_or(Value::Null);
                    return Ok(Answer { status, body });
                }
                Ok(response) => {
                    let body: Value = response.json().await.unwrap_or(Value::Null);
                    format!("{url}: 503 {}", body["message"].as_str().unwrap_or(""))
                }
                Err(err) => format!("{url}: {err}"),
            };
            self.inner.preferred.store(index + 1, Ordering::Relaxed);
            let elapsed = started.elapsed();
            if elapsed + backoff > self.inner.config.retry_budget {
                return Err(Error::Unavailable {
                    attempts,
                    elapsed,
                    last: failure,
                });
            }
            let jitter =
                Duration::from_millis(rand::random::<u64>() % (backoff.as_millis() as u64 + 1));
            tokio::time::sleep(backoff / 2 + jitter / 2).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    /// Acquires `lease` for `holder` with `ttl`, waiting up to `wait` for it
    /// to be free (`None`: try once). The returned [`Lease`] renews itself in
    /// the background until released or lost.
    ///
    /// # Errors
    /// [`Error::Held`] if someone else holds it; [`Error::Unavailable`] if no
    /// quorum answered; [`Error::BadRequest`] for a bad name, holder or ttl.
    pub async fn acquire(
        &self,
        lease: &str,
        holder: &str,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Lease, Error> {
        // A dropped handle of this lease and holder may still be releasing.
        let gate = self.release_gate(lease, holder);
        drop(gate.lock().await);
        let sent = tokio::time::Instant::now();
        let grant = self.acquire_grant(lease, holder, ttl, wait).await?;
        let lease = Lease::start(self.clone(), grant, sent);
        if self.inner.config.fence_on_acquire && self.inner.config.gateway.is_some() {
            // If this fails the lease is released on drop; the error says why.
            lease.fence().await?;
        }
        Ok(lease)
    }

    /// One acquire request; the [`Grant`] without a renewing handle (for tools
    /// that manage renewals themselves, like the CLI).
    ///
    /// # Errors
    /// As [`Client::acquire`].
    pub async fn acquire_grant(
        &self,
        lease: &str,
        holder: &str,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Grant, Error> {
        palisade_names::LeaseName::new(lease).map_err(|e| Error::BadRequest(e.to_string()))?;
        let mut body = json!({ "holder": holder, "ttl_ms": ttl.as_millis() as u64 });
        if let Some(wait) = wait {
            body["wait_ms"] = json!(wait.as_millis() as u64);
        }
        let answer = self
            .election(
                reqwest::Method::POST,
                &format!("/v1/leases/{lease}/acquire"),
                Some(&body),
            )
            .await?;
        parse_grant(answer)
    }

    /// Renews a grant once (see [`Lease`] for the automatic way).
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the grant is gone.
    pub async fn renew_grant(&self, lease: &str, holder: &str, token: u64) -> Result<Grant, Error> {
        let body = json!({ "holder": holder, "token": token });
        let answer = self
            .election(
                reqwest::Method::POST,
                &format!("/v1/leases/{lease}/renew"),
                Some(&body),
            )
            .await?;
        parse_grant(answer)
    }

    /// Releases a grant; pass the [`Grant::grant_index`] it came with so that
    /// a late release can never free a newer grant of the same holder.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if it was not held with that token (and index).
    pub async fn release_grant(
        &self,
        lease: &str,
        holder: &str,
        token: u64,
        grant_index: Option<u64>,
    ) -> Result<(), Error> {
        let mut body = json!({ "holder": holder, "token": token });
        if let Some(grant_index) = grant_index {
            body["grant_index"] = json!(grant_index);
        }
        let answer = self
            .election(
                reqwest::Method::POST,
                &format!("/v1/leases/{lease}/release"),
                Some(&body),
            )
            .await?;
        match answer.status {
            200 => Ok(()),
            _ => Err(status_error(&answer)),
        }
    }

    /// The lease as the leader sees it.
    ///
    /// # Errors
    /// [`Error::NotFound`] if never granted.
    pub async fn get(&self, lease: &str) -> Result<LeaseInfo, Error> {
        let answer = self
            .election(reqwest::Method::GET, &format!("/v1/leases/{lease}"), None)
            .await?;
        parse_body(answer)
    }

    /// Every lease ever granted.
    ///
    /// # Errors
    /// [`Error::Unavailable`].
    pub async fn list(&self) -> Result<Vec<LeaseInfo>, Error> {
        let answer = self
            .election(reqwest::Method::GET, "/v1/leases", None)
            .await?;
        if answer.status != 200 {
            return Err(status_error(&answer));
        }
        serde_json::from_value(answer.body["leases"].clone()).map_err(|e| Error::Protocol {
            status: 200,
            message: e.to_string(),
        })
    }

    /// Waits (up to `wait`) for `lease` to change after `index`; returns its
    /// state. Pass the returned `modify_index` as the next `index`.
    ///
    /// # Errors
    /// [`Error::NotFound`] if never granted.
    pub async fn watch(&self, lease: &str, index: u64, wait: Duration) -> Result<LeaseInfo, Error> {
        let path = format!(
            "/v1/leases/{lease}/watch?index={index}&wait_ms={}",
            wait.as_millis()
        );
        // The request itself lasts up to `wait`: give it its own timeout.
        let url_base = &self.inner.config.endpoints;
        let started = Instant::now();
        let mut last = String::new();
        for attempt in 0..url_base.len().max(1) * 3 {
            let url = format!(
                "{}{path}",
                url_base[attempt % url_base.len()].trim_end_matches('/')
            );
            match self
                .inner
                .http
                .get(&url)
                .timeout(wait + self.inner.config.request_timeout)
                .send()
                .await
            {
                Ok(response) if response.status().as_u16() != 503 => {
                    let status = response.status().as_u16();
                    let body = response.json().await.unwrap_or(Value::Null);
                    return parse_body(Answer { status, body });
                }
                Ok(response) => last = format!("{url}: {}", response.status()),
                Err(err) => last = format!("{url}: {err}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(Error::Unavailable {
            attempts: (url_base.len() * 3) as u32,
            elapsed: started.elapsed(),
            last,
        })
    }

    /// `/v1/cluster` of the first node that answers.
    ///
    /// # Errors
    /// [`Error::Unavailable`].
    pub async fn cluster(&self) -> Result<Value, Error> {
        let answer = self
            .election(reqwest::Method::GET, "/v1/cluster", None)
            .await?;
        Ok(answer.body)
    }

    /// Reads `key` through the gateway. Reads are not fenced and need no
    /// lease: any process may read what the holders wrote.
    ///
    /// # Errors
    /// [`Error::Unavailable`].
    pub async fn get_object(&self, key: &str) -> Result<Option<Object>, Error> {
        let url = format!("{}/v1/objects/{}", self.gateway()?, encode_key(key));
        let response = self
            .inner
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| unavailable(&url, &e))?;
        match response.status().as_u16() {
            200 => {
                let header = |name: &str| {
                    response
                        .headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned()
                };
                let version = header("etag");
                let token = header("fencing-token").parse().unwrap_or(0);
                let value = response.bytes().await.map_err(|e| unavailable(&url, &e))?;
                Ok(Some(Object {
                    value,
                    version,
                    token,
                }))
            }
            404 => Ok(None),
            status => {
                let body = response.json().await.unwrap_or(Value::Null);
                Err(status_error(&Answer { status, body }))
            }
        }
    }

    /// The release gate of `lease` and `holder` (see `Inner::release_gates`);
    /// forgets gates nobody holds.
    pub(crate) fn release_gate(&self, lease: &str, holder: &str) -> ReleaseGate {
        let mut gates = self
            .inner
            .release_gates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        gates.retain(|_, gate| Arc::strong_count(gate) > 1);
        gates
            .entry((lease.to_owned(), holder.to_owned()))
            .or_default()
            .clone()
    }

    /// The gateway URL, or an error if none is configured.
    pub(crate) fn gateway(&self) -> Result<&str, Error> {
        self.inner
            .config
            .gateway
            .as_deref()
            .map(|g| g.trim_end_matches('/'))
            .ok_or_else(|| Error::BadRequest("no gateway configured".into()))
    }
}

fn parse_grant(answer: Answer) -> Result<Grant, Error> {
    if answer.status == 200 {
        return serde_json::from_value(answer.body).map_err(|e| Error::Protocol {
            status: 200,
            message: e.to_string(),
        });
    }
    Err(status_error(&answer))
}

fn parse_body<T: serde::de::DeserializeOwned>(answer: Answer) -> Result<T, Error> {
    if answer.status == 200 {
        return serde_json::from_value(answer.body).map_err(|e| Error::Protocol {
            status: 200,
            message: e.to_string(),
        });
    }
    Err(status_error(&answer))
}

/// Maps an error answer to an [`Error`].
pub(crate) fn status_error(answer: &Answer) -> Error {
    match (answer.status, answer.body["error"].as_str()) {
        (409, Some("held")) => Error::Held {
            holder: answer.body["holder"].as_str().unwrap_or("").to_owned(),
            token: answer.body["token"].as_u64().unwrap_or(0),
        },
        (409, Some("lost")) => Error::LeaseLost(answer.message()),
        (409, Some("stale_token")) => Error::Fenced {
            token: answer.body["token"].as_u64().unwrap_or(0),
            fence: answer.body["fence"].as_u64().unwrap_or(0),
        },
        (404, _) => Error::NotFound(answer.message()),
        (400 | 413, _) => Error::BadRequest(answer.message()),
        (403, _) => Error::BadRequest(answer.message()),
        (status, _) => Error::Protocol {
            status,
            message: answer.message(),
        },
    }
}
