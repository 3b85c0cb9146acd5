//! [`Client`]: the election cluster (and optionally a gateway) over HTTP, with
//! bounded retries.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::acquire::{acquire, AcquireOptions};
use crate::error::Error;
use crate::lease::Lease;
use crate::model::{Grant, GrantId, LeaseInfo, Object, Transition};
use crate::objects::{ObjectInfo, ObjectPage};
use crate::renew_queue::RenewQueue;
use crate::transport::answer::Answer;
use crate::transport::config::ClientConfig;
use crate::transport::partitions::Partitions;
use crate::transport::Transport;
use crate::watch::{PrefixWatch, Start};
use crate::watch_cursor::WatchCursor;

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
    /// The HTTP client and its retry loop, shared with the leases.
    pub(crate) transport: Arc<Transport>,
    /// Renewals on their way into batches, shared with the leases.
    renewals: Arc<RenewQueue>,
}

impl Client {
    /// A client with `config`.
    pub fn new(config: ClientConfig) -> Self {
        let transport = Arc::new(Transport::new(config));
        Self {
            renewals: Arc::new(RenewQueue::new(transport.clone())),
            transport,
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
        let lock_delayed = !options.lock_delay.is_zero();
        let (grant, sent) = acquire(&self.transport, lease, holder, ttl, wait, options).await?;
        let lease = Lease::start(
            self.transport.clone(),
            self.renewals.clone(),
            (grant, sent),
            lock_delayed,
        );
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
        Ok(acquire(&self.transport, lease, holder, ttl, wait, options)
            .await?
            .0)
    }

    /// Raises the gateway's fence of `grant`'s lease to its token (what a
    /// [`Lease`] does on acquire with `fence_on_acquire`), so a late write
    /// of an earlier holder is refused from now on; the fence.
    ///
    /// # Errors
    /// [`Error::BadRequest`] without a gateway; [`Error::Fenced`] if a newer
    /// token fenced already; the gateway's refusal or unavailability.
    pub async fn fence_grant(&self, grant: &Grant) -> Result<u64, Error> {
        let answer = self
            .transport
            .gateway_write(
                &grant.jwt,
                reqwest::Method::POST,
                &format!("/v1/fences/{}", checked(&grant.lease)?),
                &[],
                None,
            )
            .await?;
        Ok(answer["fence"].as_u64().unwrap_or(0))
    }

    /// Renews a grant once (see [`Lease`] for the automatic way); with
    /// `batch_renewals`, in one request with the client's other renewals
    /// due at the same moment.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the grant is gone, revoked, or `id` does not
    /// carry its secret.
    pub async fn renew_grant(&self, id: &GrantId) -> Result<Grant, Error> {
        // No safe deadline is known here: the retry budget bounds it.
        let deadline = tokio::time::Instant::now() + self.config().retry_budget;
        self.renewals.renew(id, deadline).await
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
        let path = format!("/v1/leases/{}/revoke", checked(lease)?);
        let body = json!({ "token": token });
        let answer = self
            .transport
            .election_on(
                lease,
                true,
                reqwest::Method::POST,
                &path,
                Some(&body),
                Duration::ZERO,
            )
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
        let path = format!("/v1/leases/{}", checked(lease)?);
        self.get_lease_json(lease, true, &path, Duration::ZERO)
            .await?
            .parse()
    }

    /// The lease's last transitions, oldest first (the cluster keeps a
    /// few per lease).
    ///
    /// # Errors
    /// [`Error::NotFound`] if never granted (or free and reclaimed).
    pub async fn history(&self, lease: &str) -> Result<Vec<Transition>, Error> {
        #[derive(serde::Deserialize)]
        struct History {
            history: Vec<Transition>,
        }
        let path = format!("/v1/leases/{}/history", checked(lease)?);
        let history: History = self
            .get_lease_json(lease, true, &path, Duration::ZERO)
            .await?
            .parse()?;
        Ok(history.history)
    }

    /// Every lease the table holds, in name order (fetched page by page).
    ///
    /// # Errors
    /// [`Error::Unavailable`].
    pub async fn list(&self) -> Result<Vec<LeaseInfo>, Error> {
        self.list_prefix("").await
    }

    /// Every lease whose name starts with `prefix`, in name order (fetched
    /// page by page). Under a policy a principal may list only a prefix
    /// inside its rights (`orders.` for a principal of `orders.*`).
    ///
    /// # Errors
    /// [`Error::Forbidden`] for a prefix outside the caller's rights;
    /// [`Error::Unavailable`].
    pub async fn list_prefix(&self, prefix: &str) -> Result<Vec<LeaseInfo>, Error> {
        #[derive(serde::Deserialize)]
        struct Page {
            leases: Vec<LeaseInfo>,
            #[serde(default)]
            next: Option<String>,
        }
        let mut leases = Vec::new();
        let prefix = crate::model::encode_key(prefix);
        let mut path = format!("/v1/leases?prefix={prefix}");
        loop {
            let page: Page = self.get_json(&path, Duration::ZERO).await?.parse()?;
            leases.extend(page.leases);
            match page.next {
                Some(after) => path = format!("/v1/leases?prefix={prefix}&after={after}"),
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
            "/v1/leases/{}/watch?index={index}&wait_ms={}",
            checked(lease)?,
            wait.as_millis()
        );
        // The request itself lasts up to `wait`; any node answers it, the
        // partition's leader first.
        self.get_lease_json(lease, false, &path, wait)
            .await?
            .parse()
    }

    /// Opens one stream of the changes to every lease whose name starts
    /// with `prefix`, after `index` (0: every lease as it is now, then each
    /// change). Served by any node from its applied state; read it with
    /// [`PrefixWatch::next`], and once it ends resume with
    /// [`Client::watch_prefix_from`] from [`PrefixWatch::cursor`] (on a
    /// cluster of one partition, `watch_prefix` from
    /// [`PrefixWatch::index`] does the same).
    ///
    /// # Errors
    /// [`Error::Forbidden`] for a prefix outside the caller's `read` right;
    /// [`Error::Unavailable`] when no node opens it (429 over the caller's
    /// share of waiting calls included).
    ///
    /// With several partitions each has its own log, so one index cannot
    /// say where to resume: there `index` must be 0 (the stream then
    /// follows every partition, as [`Client::watch_prefix_from`] does);
    /// another index is the server's [`Error::BadRequest`].
    pub async fn watch_prefix(&self, prefix: &str, index: u64) -> Result<PrefixWatch, Error> {
        let from = Start::After(WatchCursor::new(vec![index]));
        PrefixWatch::open(&self.transport, prefix, from).await
    }

    /// As [`Client::watch_prefix`], on a cluster of any number of
    /// partitions: one stream follows every partition, each event names
    /// its partition, and `cursor` (the last index read of each partition,
    /// [`PrefixWatch::cursor`] of the stream that ended; empty: from the
    /// start) says where each resumes.
    ///
    /// # Errors
    /// As [`Client::watch_prefix`]; [`Error::BadRequest`] for a cursor of
    /// more partitions than the cluster has.
    pub async fn watch_prefix_from(
        &self,
        prefix: &str,
        cursor: &WatchCursor,
    ) -> Result<PrefixWatch, Error> {
        PrefixWatch::open(&self.transport, prefix, Start::After(cursor.clone())).await
    }

    /// As [`Client::watch_prefix`], of one partition's leases (`0..count`,
    /// [`Client::partitions`]), after `index` of that partition's log; a
    /// cluster with one partition takes `partition` 0.
    ///
    /// # Errors
    /// As [`Client::watch_prefix`]; [`Error::BadRequest`] for a partition
    /// out of range.
    pub async fn watch_prefix_in(
        &self,
        prefix: &str,
        partition: usize,
        index: u64,
    ) -> Result<PrefixWatch, Error> {
        let from = Start::Partition { partition, index };
        PrefixWatch::open(&self.transport, prefix, from).await
    }

    /// What this client knows of the cluster's partitions now: their
    /// count, each one's leader, and how many answers a node forwarded to
    /// a leader (see [`Partitions`]). Asks the nodes again in the
    /// background when it is stale.
    pub fn partitions(&self) -> Partitions {
        self.transport.refresh_map();
        self.transport.partitions()
    }

    /// The partition `lease` belongs to (0 with one partition, or before
    /// the count is known): FNV-1a 64 of its name modulo the count, as the
    /// cluster computes it.
    pub fn partition_of(&self, lease: &str) -> usize {
        self.transport.map().partition(lease).unwrap_or(0)
    }

    /// `/v1/cluster` of the first node that answers.
    ///
    /// # Errors
    /// [`Error::Unavailable`].
    pub async fn cluster(&self) -> Result<Value, Error> {
        // An error answer (a missing or wrong API key: 401) is an error,
        // never a view (the CLI printed a table of zeros).
        self.get_json("/v1/cluster", Duration::ZERO).await?.parse()
    }

    /// The cluster's signing keys (`GET /v1/jwks`): the JWKS a database's
    /// fence checks proofs against ([`crate::postgres::set_keys`]).
    ///
    /// # Errors
    /// [`Error::Unavailable`], or the error the cluster answered.
    pub async fn jwks(&self) -> Result<Value, Error> {
        self.get_json("/v1/jwks", Duration::ZERO).await?.parse()
    }

    /// Reads `key` through the gateway. Reads are not fenced and need no
    /// lease: any process may read what the holders wrote.
    ///
    /// # Errors
    /// [`Error::Unavailable`].
    pub async fn get_object(&self, key: &str) -> Result<Option<Object>, Error> {
        self.transport.get_object(key).await
    }

    /// What `key` is, without its bytes (`HEAD`): its version, token and
    /// size; `None` when there is no object.
    ///
    /// # Errors
    /// [`Error::Unavailable`]; [`Error::Unauthorized`]/[`Error::Forbidden`]
    /// under a policy.
    pub async fn head_object(&self, key: &str) -> Result<Option<ObjectInfo>, Error> {
        self.transport.head_object(key).await
    }

    /// One page (at most `limit`, 1..=1000) of the objects whose keys start
    /// with `prefix`, after `after`, in key order; pass the page's `next`
    /// as `after` for the next one.
    ///
    /// # Errors
    /// [`Error::BadRequest`] for a limit out of range; as
    /// [`Client::head_object`].
    pub async fn list_objects(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<ObjectPage, Error> {
        self.transport.list_objects(prefix, after, limit).await
    }

    /// `GET path`, a call on `lease` (to its partition's leader first).
    async fn get_lease_json(
        &self,
        lease: &str,
        leader_only: bool,
        path: &str,
        extra: Duration,
    ) -> Result<Answer, Error> {
        self.transport
            .election_on(lease, leader_only, reqwest::Method::GET, path, None, extra)
            .await
    }

    async fn get_json(&self, path: &str, extra: Duration) -> Result<Answer, Error> {
        self.transport
            .election(reqwest::Method::GET, path, None, extra)
            .await
    }
}

/// `lease` if it is a valid lease name, for a request path; a
/// [`Error::BadRequest`] saying what is wrong otherwise (a name with '/'
/// would reach another route and be answered "no such route").
fn checked(lease: &str) -> Result<&str, Error> {
    palisade_names::LeaseName::new(lease).map_err(|e| Error::BadRequest(e.to_string()))?;
    Ok(lease)
}
