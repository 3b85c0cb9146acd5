//! What an operator sees of the gateway: Prometheus metrics (`GET /metrics`)
//! and the fencing audit — every write refused for a stale token is logged
//! with its lease, key, token, the fence, the JWT's holder and the peer
//! address, and counted per lease (`GET /v1/fences/{lease}` shows the count
//! and the last one). That is how the paused old leader still trying to
//! write is found. The audit is the store's capability
//! ([`FencingAudit`]): in this process's memory, or shared by every gateway
//! of one PostgreSQL database.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use palisade_store::{FencingAudit, MemoryAudit, Refusal, StoreError, StoreHooks};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::schema::Refusals;

/// Labels of a write's outcome.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    op: &'static str,
    result: &'static str,
}

/// Labels of a request's duration.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: &'static str,
    /// From a closed set ([`method_label`]): a made-up method must not
    /// mint a series of its own.
    method: &'static str,
    status: u16,
}

/// The label of `method`: the methods the gateway serves, else `other`.
fn method_label(method: &http::Method) -> &'static str {
    match *method {
        http::Method::GET => "GET",
        http::Method::PUT => "PUT",
        http::Method::POST => "POST",
        http::Method::DELETE => "DELETE",
        http::Method::HEAD => "HEAD",
        http::Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// The gateway's metrics and fencing audit.
#[derive(Debug)]
pub struct Observer {
    registry: Registry,
    fence_raises: Counter,
    store_fsync: Histogram,
    writes: Family<WriteLabels, Counter>,
    requests: Family<RequestLabels, Histogram>,
    /// Where the fencing audit is kept: this process's memory, or the
    /// store's when every gateway on it shares one.
    audit: Arc<dyn FencingAudit>,
}

impl Default for Observer {
    fn default() -> Self {
        let mut registry = Registry::default();
        let writes = Family::<WriteLabels, Counter>::default();
        let requests = Family::<RequestLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.000_05, 2.0, 16))) as fn() -> Histogram,
        );
        registry.register(
            "palisade_gateway_writes",
            "Fenced writes (put, delete, fence bump) by outcome",
            writes.clone(),
        );
        let fence_raises = Counter::default();
        registry.register(
            "palisade_gateway_fence_raises",
            "Writes that raised a lease's fence (a new holder's first write)",
            fence_raises.clone(),
        );
        let store_fsync = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        registry.register_with_unit(
            "palisade_gateway_store_fsync_duration",
            "Store flush (fsync) time; one flush covers many writes",
            Unit::Seconds,
            store_fsync.clone(),
        );
        registry.register_with_unit(
            "palisade_gateway_request_duration",
            "Request duration by route, method and status",
            Unit::Seconds,
            requests.clone(),
        );
        Self {
            registry,
            fence_raises,
            store_fsync,
            writes,
            requests,
            audit: Arc::new(MemoryAudit::default()),
        }
    }
}

impl Observer {
    /// Hooks for the store: count fence raises, time flushes.
    pub fn store_hooks(&self) -> StoreHooks {
        let (raises, fsync) = (self.fence_raises.clone(), self.store_fsync.clone());
        StoreHooks {
            on_flush: Some(std::sync::Arc::new(move |took: Duration| {
                fsync.observe(took.as_secs_f64());
            })),
            on_fence_raised: Some(std::sync::Arc::new(move || {
                raises.inc();
            })),
        }
    }

    /// Keeps the fencing audit in `audit` (a store's, which every gateway
    /// on it sees) instead of this process's memory.
    pub fn with_audit(mut self, audit: Arc<dyn FencingAudit>) -> Self {
        self.audit = audit;
        self
    }

    /// Records a write refused because `refused.token` is below the fence,
    /// and logs it. An audit that cannot be written is logged too: the
    /// refusal itself stands.
    pub async fn refused(&self, lease: &str, refused: Refusal) {
        tracing::warn!(
            target: "palisade::fence",
            lease,
            key = %refused.key,
            token = refused.token,
            fence = refused.fence,
            holder = %refused.holder,
            peer = refused.peer.as_deref().unwrap_or("-"),
            "refused a write with a stale token"
        );
        if let Err(err) = self.audit.record(lease, &refused).await {
            tracing::warn!(lease, %err, "the fencing audit missed a refusal");
        }
    }

    /// `lease`'s refused writes.
    ///
    /// # Errors
    /// When the audit cannot be read.
    pub async fn refusals(&self, lease: &str) -> Result<Refusals, StoreError> {
        Ok(self
            .audit
            .refusals(lease)
            .await?
            .map(Refusals::from)
            .unwrap_or_default())
    }

    /// Leases with refused writes, the most recently refused first (at
    /// most `limit`), each with its refusals.
    ///
    /// # Errors
    /// When the audit cannot be read.
    pub async fn all_refusals(&self, limit: usize) -> Result<Vec<(String, Refusals)>, StoreError> {
        let recent = self.audit.recent(limit).await?;
        Ok(recent
            .into_iter()
            .map(|r| (r.lease.clone(), Refusals::from(r)))
            .collect())
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }

    fn observe(&self, route: &'static str, method: &http::Method, status: u16, took: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                route,
                method: method_label(method),
                status,
            })
            .observe(took.as_secs_f64());
        let op = match (route, method) {
            ("/v1/objects", &http::Method::PUT) => "put",
            ("/v1/objects", &http::Method::DELETE) => "delete",
            ("/v1/fences", &http::Method::POST) => "fence_bump",
            _ => return,
        };
        let result = match status {
            200..=299 => "accepted",
            400 => "bad_request",
            401 => "unauthorized",
            403 => "forbidden",
            408 => "timeout",
            409 => "stale_token",
            413 => "too_large",
            500..=599 => "error",
            _ => "other",
        };
        self.writes.get_or_create(&WriteLabels { op, result }).inc();
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The route a path belongs to (a fixed set: no per-key labels).
fn route_of(path: &str) -> &'static str {
    [
        "/v1/objects",
        "/v1/fences",
        "/healthz",
        "/livez",
        "/readyz",
        "/metrics",
    ]
    .into_iter()
    .find(|route| path.starts_with(route))
    .unwrap_or("other")
}

/// Middleware: times every request and counts write outcomes.
pub async fn measure(
    State(observer): State<std::sync::Arc<Observer>>,
    request: Request,
    next: Next,
) -> Response {
    let route = route_of(request.uri().path());
    let method = request.method().clone();
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    observer.observe(
        route,
        &method,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// `GET /metrics`.
pub async fn metrics(State(observer): State<std::sync::Arc<Observer>>) -> Response {
    (
        [(
            http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        observer.render(),
    )
        .into_response()
}

#[cfg(test)]
mod label_tests {
    use crate::observe::method_label;

    #[test]
    fn made_up_methods_share_one_label() {
        for made_up in ["FOO", "BREW", "X-1", "PROPFIND"] {
            let method = http::Method::from_bytes(made_up.as_bytes()).expect("method");
            assert_eq!(method_label(&method), "other");
        }
        assert_eq!(method_label(&http::Method::PUT), "PUT");
    }
}
