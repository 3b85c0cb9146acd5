//! [`Client`]: the election cluster (and optionally a gateway) over HTTP, with
//! bounded retries.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::lease::Lease;
use crate::model::{Grant, GrantId, LeaseInfo, Object};
use crate::transport::Transport;
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
    /// The only CA trusted for `https://` endpoints and gateway (instead of
    /// none: the SDK carries no public roots). Set with
    /// [`ClientConfig::with_ca_file`].
    pub ca: Option<reqwest::Certificate>,
    /// This client's API key, sent as `x-palisade-key` on every request to
    /// servers that run with an access policy. Set with
    /// [`ClientConfig::with_api_key`]; `Debug` never shows it.
    pub api_key: Option<ApiKey>,
    /// Speak HTTP/2 to the nodes and the gateway (h2c on `http://`, h2 by
    /// ALPN on `https://`): every request of this client, all its leases'
    /// renewals included, shares one connection per server. Default true;
    /// false for HTTP/1.1 only (e.g. a proxy in between that speaks
    /// nothing else).
    pub http2: bool,
    /// Renewals of this client's leases that fall due together go in one
    /// batch request (`POST /v1/renew`), each answered on its own. Default
    /// true.
    pub batch_renewals: bool,
}

/// An API key (`Debug` shows only that there is one).
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// The key itself, to send.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
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
            ca: None,
            api_key: None,
            http2: true,
            batch_renewals: true,
        }
    }

    /// Sends `key` as this client's API key (`x-palisade-key`), e.g. the
    /// contents of `admin.key` from `palisade dev` or `palisade policy init`.
    ///
    /// # Errors
    /// [`Error::BadRequest`] when the key cannot be a header value.
    pub fn with_api_key(mut self, key: &str) -> Result<Self, Error> {
        let key = key.trim();
        if key.is_empty() || reqwest::header::HeaderValue::from_str(key).is_err() {
            return Err(Error::BadRequest(
                "an API key must be non-empty visible ASCII".into(),
            ));
        }
        self.api_key = Some(ApiKey(key.to_owned()));
        Ok(self)
    }

    /// The configuration the environment describes, as the CLI reads it:
    /// `PALISADE_ELECTION` (comma-separated URLs; default the `palisade dev`
    /// nodes on 127.0.0.1:7001-7003), `PALISADE_GATEWAY` (default
    /// `http://127.0.0.1:8080`), `PALISADE_CA` (a CA file), `PALISADE_API_KEY`
    /// or `PALISADE_API_KEY_FILE` (the API key).
    ///
    /// # Errors
    /// [`Error::BadRequest`] when the CA or key file is unusable.
    pub fn from_env() -> Result<Self, Error> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let election = var("PALISADE_ELECTION").unwrap_or_else(|| {
            "http://127.0.0.1:7001,http://127.0.0.1:7002,http://127.0.0.1:7003".into()
        });
        let gateway = var("PALISADE_GATEWAY").unwrap_or_else(|| "http://127.0.0.1:8080".into());
        let mut config =
            Self::new(election.split(',').map(|e| e.trim().to_owned())).with_gateway(gateway);
        if let Some(ca) = var("PALISADE_CA") {
            config = config.with_ca_file(std::path::Path::new(&ca))?;
        }
        let key = match (var("PALISADE_API_KEY"), var("PALISADE_API_KEY_FILE")) {
            (Some(key), _) => Some(key),
            (None, Some(path)) => Some(
                std::fs::read_to_string(&path)
                    .map_err(|e| Error::BadRequest(format!("{path}: {e}")))?,
            ),
            (None, None) => None,
        };
        if let Some(key) = key {
            config = config.with_api_key(key.lines().next().unwrap_or(""))?;
        }
        Ok(config)
    }

    /// Trusts the CA in the PEM file `path` (e.g. `ca.pem` from `palisade
    /// certs init`) for `https://` endpoints.
    ///
    /// # Errors
    /// [`Error::BadRequest`] naming the file when it is unreadable or not a
    /// PEM certificate.
    pub fn with_ca_file(mut self, path: &std::path::Path) -> Result<Self, Error> {
        let pem = std::fs::read(path)
            .map_err(|e| Error::BadRequest(format!("{}: {e}", path.display())))?;
        let ca = reqwest::Certificate::from_pem(&pem)
            .map_err(|e| Error::BadRequest(format!("{}: {e}", path.display())))?;
        self.ca = Some(ca);
        Ok(self)
    }

    /// Sets the gateway URL.
    #[must_use]
    pub fn with_gateway(mut self, gateway: impl Into<String>) -> Self {
        self.gateway = Some(gateway.into());
        self
    }
}

/// What an acquire may ask for beyond holder and ttl (the default asks for
/// nothing; README "Leadership semantics").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AcquireOptions {
    /// 0..=1000. A waiting acquire of a higher priority than a preemptible
    /// holder's preempts it; waiters queue by priority. Equal priority
    /// never preempts.
    pub priority: u32,
    /// A waiting acquire of a higher priority may preempt this grant (its
    /// holder gets [`Error::Preempted`] on its next renewal).
    pub preemptible: bool,
    /// After this grant expires (not after a release) the lease stays
    /// unavailable this long (at most 60 s).
    pub lock_delay: Duration,
    /// The grant is renewed for at most this long after it was granted.
    pub max_hold: Option<Duration>,
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
    transport: Arc<Transport>,
}

impl Client {
    /// A client with `config`.
    pub fn new(config: ClientConfig) -> Self {
        Self {
            transport: Arc::new(Transport::new(config)),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.transport.config
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
        self.acquire_with(lease, holder, ttl, wait, AcquireOptions::default())
            .await
    }

    /// [`Client::acquire`] with a priority, preemptibility, lock-delay or
    /// max-hold.
    ///
    /// # Errors
    /// As [`Client::acquire`]; [`Error::LockDelay`] while a lock-delay holds
    /// the lease back (and the wait, if any, ran out).
    pub async fn acquire_with(
        &self,
        lease: &str,
        holder: &str,
        ttl: Duration,
        wait: Option<Duration>,
        options: AcquireOptions,
    ) -> Result<Lease, Error> {
        // A dropped handle of this lease and holder may still be releasing.
        let gate = self.transport.release_gate(lease, holder);
        drop(gate.lock().await);
        let (grant, sent) = self
            .acquire_slices(lease, holder, ttl, wait, options)
            .await?;
        let lease = Lease::start(self.transport.clone(), grant, sent);
        if self.config().fence_on_acquire && self.config().gateway.is_some() {
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
        self.acquire_grant_with(lease, holder, ttl, wait, AcquireOptions::default())
            .await
    }

    /// [`Client::acquire_grant`] with [`AcquireOptions`].
    ///
    /// # Errors
    /// As [`Client::acquire_with`].
    pub async fn acquire_grant_with(
        &self,
        lease: &str,
        holder: &str,
        ttl: Duration,
        wait: Option<Duration>,
        options: AcquireOptions,
    ) -> Result<Grant, Error> {
        Ok(self
            .acquire_slices(lease, holder, ttl, wait, options)
            .await?
            .0)
    }

    /// Acquires, waiting up to `wait`; the grant and the send time of the
    /// request that got it (where its safe deadline starts).
    async fn acquire_slices(
        &self,
        lease: &str,
        holder: &str,
        ttl: Duration,
        wait: Option<Duration>,
        options: AcquireOptions,
    ) -> Result<(Grant, tokio::time::Instant), Error> {
        palisade_names::LeaseName::new(lease).map_err(|e| Error::BadRequest(e.to_string()))?;
        // Our own secret, the same for every request of this call, so that a
        // retry (its answer lost, or a slice that timed out here but was
        // granted there) is recognised as the same client: the same grant.
        let secret = new_secret();
        let path = format!("/v1/leases/{lease}/acquire");
        // A long wait is asked for in slices of half a request timeout, each
        // request within one request timeout: a request stuck on a leader
        // that died, froze or was cut off costs one request timeout, as any
        // call, not the whole wait.
        let deadline = tokio::time::Instant::now() + wait.unwrap_or_default();
        loop {
            let slice = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .min(self.config().request_timeout / 2);
            let mut body = json!({
                "holder": holder,
                "ttl_ms": ttl.as_millis() as u64,
                "secret": secret.expose(),
            });
            if wait.is_some() {
                body["wait_ms"] = json!(slice.as_millis() as u64);
            }
            if options.priority > 0 {
                body["priority"] = json!(options.priority);
            }
            if options.preemptible {
                body["preemptible"] = json!(true);
            }
            if !options.lock_delay.is_zero() {
                body["lock_delay_ms"] = json!(options.lock_delay.as_millis() as u64);
            }
            if let Some(max_hold) = options.max_hold {
                body["max_hold_ms"] = json!(max_hold.as_millis() as u64);
            }
            // Before the first attempt of this slice: if a retry inside it is
            // what gets the answer, the grant may date from the first one.
            // (A grant made for an earlier slice that timed out here comes
            // back extended from this slice's arrival, as a repeat.)
            let sent = tokio::time::Instant::now();
            let answer = self
                .transport
                .election(reqwest::Method::POST, &path, Some(&body), Duration::ZERO)
                .await?;
            match answer.parse::<Grant>() {
                Ok(mut grant) => {
                    // A cluster that predates secrets answers none: keep ours.
                    grant.secret.get_or_insert(secret);
                    return Ok((grant, sent));
                }
                Err(Error::Held { .. }) if tokio::time::Instant::now() < deadline => {}
                // The node waits out a lock-delay only within the slice.
                Err(Error::LockDelay { retry_after }) if tokio::time::Instant::now() < deadline => {
                    let until = (tokio::time::Instant::now() + retry_after).min(deadline);
                    tokio::time::sleep_until(until).await;
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// Renews a grant once (see [`Lease`] for the automatic way); with
    /// `batch_renewals`, in one request with the client's other renewals
    /// due at the same moment.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the grant is gone, revoked, or `id` does not
    /// carry its secret.
    pub async fn renew_grant(&self, id: &GrantId) -> Result<Grant, Error> {
        self.transport.renew(id).await
    }

    /// Hands a grant to `successor` (see [`Lease::handover_to`], the way
    /// for a held lease); the successor's token.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if `id` does not name the current grant;
    /// [`Error::BadRequest`] for a handover to its own holder.
    pub async fn handover_grant(&self, id: &GrantId, successor: &str) -> Result<u64, Error> {
        self.transport.handover(id, successor).await
    }

    /// Releases a grant. `id` carries the secret and the grant index of the
    /// acquire, so a late release can never free a newer grant.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if `id` does not name the current grant.
    pub async fn release_grant(&self, id: &GrantId) -> Result<(), Error> {
        self.transport.release_grant(id).await
    }

    /// Revokes `lease`'s grant `token` without its secret (an operator's
    /// call, like etcd's `LeaseRevoke`): renewals stop at once, and the lease
    /// is free when the grant's current deadline passes, never earlier.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if `token` is not the current grant.
    pub async fn revoke(&self, lease: &str, token: u64) -> Result<(), Error> {
        let path = format!("/v1/leases/{lease}/revoke");
        let body = json!({ "token": token });
        let answer = self
            .transport
            .election(reqwest::Method::POST, &path, Some(&body), Duration::ZERO)
            .await?;
        match answer.status {
            200 => Ok(()),
            _ => Err(answer.error()),
        }
    }

    /// The lease as the leader sees it.
    ///
    /// # Errors
    /// [`Error::NotFound`] if never granted.
    pub async fn get(&self, lease: &str) -> Result<LeaseInfo, Error> {
        let path = format!("/v1/leases/{lease}");
        self.get_json(&path, Duration::ZERO).await?.parse()
    }

    /// Every lease the table holds, in name order (fetched page by page).
    ///
    /// # Errors
    /// [`Error::Unavailable`].
    pub async fn list(&self) -> Result<Vec<LeaseInfo>, Error> {
        #[derive(serde::Deserialize)]
        struct Page {
            leases: Vec<LeaseInfo>,
            #[serde(default)]
            next: Option<String>,
        }
        let mut leases = Vec::new();
        let mut path = "/v1/leases".to_owned();
        loop {
            let page: Page = self.get_json(&path, Duration::ZERO).await?.parse()?;
            leases.extend(page.leases);
            match page.next {
                Some(after) => path = format!("/v1/leases?after={after}"),
                None => return Ok(leases),
            }
        }
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
        // The request itself lasts up to `wait`.
        self.get_json(&path, wait).await?.parse()
    }

    /// Rotates the cluster's signing key; returns the new key's id.
    ///
    /// # Errors
    /// [`Error::Unavailable`].
    pub async fn rotate_key(&self) -> Result<String, Error> {
        #[derive(serde::Deserialize)]
        struct Rotated {
            kid: String,
        }
        let rotated: Rotated = self
            .transport
            .election(
                reqwest::Method::POST,
                "/v1/cluster/rotate-key",
                Some(&json!({})),
                Duration::ZERO,
            )
            .await?
            .parse()?;
        Ok(rotated.kid)
    }

    /// Adds node `id` (peer address `addr`) to the cluster: as a learner
    /// until it has caught up, then as a voter. Waits up to a minute.
    ///
    /// # Errors
    /// [`Error::Protocol`] with 409 if `id` is already a voter or a change
    /// is in progress; [`Error::Unavailable`].
    pub async fn add_member(&self, id: u64, addr: &str) -> Result<Value, Error> {
        let body = json!({ "id": id, "addr": addr });
        self.transport
            .election(
                reqwest::Method::POST,
                "/v1/cluster/members",
                Some(&body),
                Duration::from_secs(60),
            )
            .await?
            .parse()
    }

    /// Removes node `id` from the cluster (never the last voter).
    ///
    /// # Errors
    /// [`Error::NotFound`] if it is not a member; [`Error::Protocol`] 409
    /// for the last voter; [`Error::Unavailable`].
    pub async fn remove_member(&self, id: u64) -> Result<Value, Error> {
        let path = format!("/v1/cluster/members/{id}");
        self.transport
            .election(
                reqwest::Method::DELETE,
                &path,
                None,
                Duration::from_secs(10),
            )
            .await?
            .parse()
    }

    /// `/v1/cluster` of the first node that answers.
    ///
    /// # Errors
    /// [`Error::Unavailable`].
    pub async fn cluster(&self) -> Result<Value, Error> {
        Ok(self.get_json("/v1/cluster", Duration::ZERO).await?.body)
    }

    /// Reads `key` through the gateway. Reads are not fenced and need no
    /// lease: any process may read what the holders wrote.
    ///
    /// # Errors
    /// [`Error::Unavailable`].
    pub async fn get_object(&self, key: &str) -> Result<Option<Object>, Error> {
        self.transport.get_object(key).await
    }

    async fn get_json(
        &self,
        path: &str,
        extra: Duration,
    ) -> Result<crate::transport::Answer, Error> {
        self.transport
            .election(reqwest::Method::GET, path, None, extra)
            .await
    }
}

/// A fresh grant secret: 256 bits from the OS RNG, as 64 hex digits.
fn new_secret() -> palisade_names::GrantSecret {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    palisade_names::GrantSecret::new(&hex).unwrap_or_else(|_| unreachable!("64 hex digits"))
}
