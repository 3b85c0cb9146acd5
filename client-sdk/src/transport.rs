//! [`Transport`]: what a [`Client`](crate::Client) and its
//! [`Lease`](crate::Lease)s share — the HTTP client, the one retry loop for
//! election calls, the calls on one grant, the gateway calls, and the
//! release gates. Everything above builds on it; it knows none of them:
//! its configuration (`transport/config.rs`), the answers it maps to
//! errors (`transport/answer.rs`) and the release gates
//! (`transport/release_gates.rs`) live beneath it.
//!
//! A call on one lease is a [`Target`]: with several partitions it goes
//! first to its partition's leader (`transport/partitions.rs`), and its
//! answer moves that partition's leader alone; every other call, and every
//! call while the map is unknown or the cluster has one partition, goes to
//! the preferred endpoint, which follows the leader a follower names.

pub(crate) mod answer;
pub(crate) mod config;
mod gateway;
mod nodes;
pub(crate) mod partitions;
pub(crate) mod release_gates;
mod routes;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};

use crate::error::Error;
use crate::model::GrantId;
use answer::Answer;
use config::{ClientConfig, API_KEY_HEADER};
use nodes::NodeIds;
use release_gates::{ReleaseGate, ReleaseGates};

/// The header a follower adds to the answer it forwarded from the leader:
/// the leader's node id.
pub(crate) const FORWARDED_BY_FOLLOWER: &str = "x-palisade-leader";
/// The longest a node is given to tell its id ([`NodeIds`]).
pub(crate) const ASK_ID_TIMEOUT: Duration = Duration::from_millis(500);

/// The HTTP side of one client, shared by the client and its leases.
#[derive(Debug)]
pub(crate) struct Transport {
    /// What the client was built with (timeouts, retry budget, endpoints).
    pub(crate) config: ClientConfig,
    /// One connection pool for the nodes and the gateway (HTTP/2: one
    /// connection per server).
    http: reqwest::Client,
    /// The endpoint that answered last, or the leader a follower named;
    /// tried first next time (an index into the endpoints, modulo their
    /// number).
    preferred: AtomicUsize,
    /// Which node each endpoint is, to follow a follower's leader hint,
    /// and the partition map.
    nodes: Arc<NodeIds>,
    /// Answers that a follower forwarded (named the leader in
    /// [`FORWARDED_BY_FOLLOWER`]): see [`partitions::Partitions`].
    forwarded: AtomicU64,
    /// Background releases in progress, which acquires of the same lease
    /// and holder wait for.
    release_gates: ReleaseGates,
}

/// A call that belongs to one partition (of a cluster with several): it
/// goes first to that partition's leader, when known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target {
    /// The partition.
    pub(crate) partition: usize,
    /// Whether only the partition's leader answers it (a follower
    /// forwards, naming the leader): then an answer tells who leads.
    pub(crate) leader_only: bool,
}

/// A transport failure of one gateway request (not retried).
fn unavailable(url: &str, err: &reqwest::Error) -> Error {
    Error::Unavailable {
        attempts: 1,
        elapsed: Duration::ZERO,
        last: format!("{url}: {err}"),
    }
}

impl Transport {
    pub(crate) fn new(config: ClientConfig) -> Self {
        let mut builder = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .connect_timeout(config.request_timeout.min(Duration::from_millis(500)));
        builder = if config.http2 {
            // One connection per server carries every request; a silent
            // connection is found by pings, not only by a request's timeout.
            builder
                .http2_prior_knowledge()
                .http2_adaptive_window(true)
                .http2_keep_alive_interval(Duration::from_secs(1))
                .http2_keep_alive_timeout(config.request_timeout)
        } else {
            builder.http1_only()
        };
        if let Some(ca) = &config.ca {
            builder = builder.add_root_certificate(ca.clone());
        }
        if let Some(identity) = &config.identity {
            builder = builder.identity(identity.0.clone());
        }
        if let Some(key) = &config.api_key {
            // Sent on every election and gateway request; marked sensitive
            // so it never shows in reqwest's Debug output.
            if let Ok(mut value) = reqwest::header::HeaderValue::from_str(key.expose()) {
                value.set_sensitive(true);
                let mut headers = reqwest::header::HeaderMap::new();
                headers.insert(API_KEY_HEADER, value);
                builder = builder.default_headers(headers);
            }
        }
        let http = builder.build().unwrap_or_default();
        Self {
            nodes: NodeIds::new(config.endpoints.len()),
            config,
            http,
            preferred: AtomicUsize::new(0),
            forwarded: AtomicU64::new(0),
            release_gates: ReleaseGates::default(),
        }
    }

    /// Sends one election request, retrying connection failures, timeouts,
    /// 503s and 429s on the next endpoint with backoff and jitter, within the retry
    /// budget. Every other answer (409 included) is returned as is. `extra`
    /// lengthens each attempt's timeout for calls that wait on purpose (a
    /// blocking acquire, a watch).
    pub(crate) async fn election(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        extra: Duration,
    ) -> Result<Answer, Error> {
        self.election_to(None, method, path, body, extra).await
    }

    /// As [`Transport::election`], for a call on one lease: to its
    /// partition's leader first ([`Transport::target`]).
    pub(crate) async fn election_on(
        &self,
        lease: &str,
        leader_only: bool,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        extra: Duration,
    ) -> Result<Answer, Error> {
        let target = self.target(lease, leader_only);
        self.election_to(target, method, path, body, extra).await
    }

    /// As [`Transport::election`], to `target`'s leader first.
    async fn election_to(
        &self,
        target: Option<Target>,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        extra: Duration,
    ) -> Result<Answer, Error> {
        let (status, bytes) = self
            .election_bytes(target, method, path, body, extra)
            .await?;
        Ok(Answer {
            status,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        })
    }

    /// As [`Transport::election`], with any serializable body, answering
    /// the status and the body's bytes (for callers that parse it into
    /// their own types: the batch renewal, the hottest path).
    pub(crate) async fn election_bytes<B: serde::Serialize + ?Sized>(
        &self,
        target: Option<Target>,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
        extra: Duration,
    ) -> Result<(u16, Bytes), Error> {
        let endpoints = &self.config.endpoints;
        if endpoints.is_empty() {
            return Err(Error::BadRequest("no election endpoints configured".into()));
        }
        let started = Instant::now();
        let mut attempts = 0u32;
        let mut backoff = Duration::from_millis(20);
        // The last error a server answered (503, 429): kept to be shown
        // when a later attempt fails without an answer (no_quorum would
        // hide behind "connection refused" of a node that is down).
        let mut answered: Option<String> = None;
        let mut first = Some(self.first_for(target));
        loop {
            let index = first.take().unwrap_or_else(|| self.preferred());
            let url = self.url(index, path);
            attempts += 1;
            let mut request = self
                .http
                .request(method.clone(), &url)
                .timeout(self.config.request_timeout + extra);
            if let Some(body) = body {
                request = request.json(body);
            }
            let failure = match request.send().await {
                Ok(response) if !matches!(response.status().as_u16(), 503 | 429) => {
                    let status = response.status().as_u16();
                    let own = target.is_some_and(|t| t.leader_only) && matches!(status, 200 | 409);
                    if own || response.headers().contains_key(FORWARDED_BY_FOLLOWER) {
                        // A follower forwarded it: ask the leader it named
                        // next time (no hop, and no follower CPU spent
                        // relaying every call).
                        self.note_answer(target, index, response.headers());
                    }
                    // An answer cut mid-body is a transport failure (asked
                    // again, like a lost connection), not a bad answer.
                    match response.bytes().await {
                        Ok(body) => return Ok((status, body)),
                        Err(err) => format!("{url}: {status}, then the answer was cut: {err}"),
                    }
                }
                Ok(response) => {
                    let answer = refusal(&url, response).await;
                    answered = Some(answer.clone());
                    answer
                }
                Err(err) => format!("{url}: {}", error_chain(&err)),
            };
            self.failed(target, index);
            let elapsed = started.elapsed();
            if elapsed + backoff > self.config.retry_budget + extra {
                let last = match answered {
                    Some(answer) if answer != failure => {
                        format!("{failure} (the last server answer: {answer})")
                    }
                    _ => failure,
                };
                return Err(Error::Unavailable {
                    attempts,
                    elapsed,
                    last,
                });
            }
            let jitter =
                Duration::from_millis(rand::random::<u64>() % (backoff.as_millis() as u64 + 1));
            tokio::time::sleep(backoff / 2 + jitter / 2).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    /// The HTTP client (for the renewal stream).
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// How many election endpoints there are.
    pub(crate) fn endpoint_count(&self) -> usize {
        self.config.endpoints.len()
    }

    /// The URL of `path` on endpoint `index` (modulo their number).
    pub(crate) fn url(&self, index: usize, path: &str) -> String {
        let endpoints = &self.config.endpoints;
        let endpoint = endpoints.get(index % endpoints.len().max(1));
        format!("{}{path}", endpoint.map_or("", |e| e.trim_end_matches('/')))
    }

    /// The endpoint tried first now.
    pub(crate) fn preferred(&self) -> usize {
        self.preferred.load(Ordering::Relaxed) % self.endpoint_count().max(1)
    }

    /// Which endpoint is preferred now (for [`Transport::pass_over`]) and
    /// the URL of `path` on it.
    pub(crate) fn preferred_url(&self, path: &str) -> Option<(usize, String)> {
        if self.config.endpoints.is_empty() {
            return None;
        }
        let preferred = self.preferred();
        Some((preferred, self.url(preferred, path)))
    }

    /// Prefers the endpoint after `index` (which refused, failed or is
    /// silent), unless the preferred one is another already.
    pub(crate) fn pass_over(&self, index: usize) {
        let count = self.endpoint_count().max(1);
        let current = self.preferred.load(Ordering::Relaxed);
        if current % count == index % count {
            let _ = self.preferred.compare_exchange(
                current,
                index % count + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// Notes that endpoint `index` answered a call only the leader serves
    /// (`headers` are its answer's): prefers it if it answered itself, the
    /// leader a forwarding follower named if that endpoint is known, else
    /// the next endpoint while the nodes are asked their ids.
    pub(crate) fn note_leader_answer(&self, index: usize, headers: &reqwest::header::HeaderMap) {
        let Some(hint) = headers.get(FORWARDED_BY_FOLLOWER) else {
            self.preferred.store(index, Ordering::Relaxed);
            return;
        };
        let leader = hint.to_str().ok().and_then(|v| v.trim().parse().ok());
        match leader.and_then(|id| self.nodes.endpoint_of(id)) {
            Some(at) if at != index => self.preferred.store(at, Ordering::Relaxed),
            known => {
                if known.is_some() {
                    // It said it was the leader, and forwarded: not so now.
                    self.nodes.forget(index);
                }
                self.pass_over(index);
                self.learn_nodes();
            }
        }
    }

    /// One release request, naming the grant's index when known.
    pub(crate) async fn release_grant(&self, id: &GrantId) -> Result<(), Error> {
        let body = grant_body(id, true);
        let path = format!("/v1/leases/{}/release", id.lease);
        let answer = self
            .election_on(
                &id.lease,
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

    /// The release gate of `lease` and `holder` (see [`ReleaseGates`]).
    pub(crate) fn release_gate(&self, lease: &str, holder: &str) -> ReleaseGate {
        self.release_gates.gate(lease, holder)
    }
}

impl Transport {
    /// Hands `id`'s lease to `successor`; the successor's token.
    pub(crate) async fn handover(&self, id: &GrantId, successor: &str) -> Result<u64, Error> {
        let mut body = grant_body(id, false);
        body["to"] = json!(successor);
        let path = format!("/v1/leases/{}/handover", id.lease);
        let answer = self
            .election_on(
                &id.lease,
                true,
                reqwest::Method::POST,
                &path,
                Some(&body),
                Duration::ZERO,
            )
            .await?;
        let handed: Value = answer.parse()?;
        handed["token"].as_u64().ok_or_else(|| Error::Protocol {
            status: 200,
            message: "a handover answered no token".into(),
        })
    }
}

/// What a refusing node (503, 429) at `url` answered, in one line.
async fn refusal(url: &str, response: reqwest::Response) -> String {
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    format!(
        "{url}: {status} {}: {}",
        body["error"].as_str().unwrap_or("error"),
        body["message"].as_str().unwrap_or("")
    )
}

/// The body of a renew (`with_index` false) or release naming `id`.
pub(crate) fn grant_body(id: &GrantId, with_index: bool) -> Value {
    let mut body = json!({ "holder": id.holder, "token": id.token });
    if let Some(secret) = &id.secret {
        body["secret"] = json!(secret.expose());
    }
    if let (true, Some(grant_index)) = (with_index, id.grant_index) {
        body["grant_index"] = json!(grant_index);
    }
    body
}

/// `err` with its causes: reqwest says "error sending request" and keeps
/// why (connection refused, a timeout, a TLS failure) in its sources.
pub(crate) fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node whose first answer is cut mid-body (the connection closes
    /// after a few bytes of a longer `content-length`) and whose second is
    /// whole: the cut is a transport failure, asked again, not a bad
    /// answer.
    #[tokio::test]
    async fn an_answer_cut_mid_body_is_asked_again() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let whole = r#"{"lease":"cut","holder":null,"token":0,"ttl_ms":0,"transitions":0,"modify_index":0}"#;
        let server = tokio::spawn(async move {
            for attempt in 0..2 {
                let (mut socket, _) = listener.accept().await.expect("accept");
                let mut request = [0u8; 2048];
                let _ = socket.read(&mut request).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    whole.len()
                );
                let body = if attempt == 0 { &whole[..8] } else { whole };
                let _ = socket.write_all(format!("{head}{body}").as_bytes()).await;
                // Closing the first connection cuts its answer short.
            }
        });
        let mut config = ClientConfig::new([url]);
        config.http2 = false;
        let transport = Transport::new(config);
        let answer = transport
            .election(reqwest::Method::GET, "/v1/leases/cut", None, Duration::ZERO)
            .await
            .expect("asked again after the cut");
        assert_eq!(
            (answer.status, answer.body["lease"].as_str()),
            (200, Some("cut"))
        );
        server.await.expect("server");
    }
}
