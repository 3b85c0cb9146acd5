//! The peer listener's gate: a peer request is admitted only from a current
//! member whose certificate names it and whose incarnation is the one first
//! seen ([`authenticate`]).

use std::sync::Arc;

use std::collections::HashSet;
use std::sync::Mutex;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use openraft::async_runtime::WatchReceiver;
use palisade_serve::certs::node_name;
use palisade_serve::tls::certificate_names;
use palisade_serve::PeerCertificate;

use super::incarnation::{Incarnations, INCARNATION_HEADER};
use super::settings::{PeerSettings, SETTINGS_HEADER};
use crate::error::ApiError;
use crate::raft::{NodeId, Raft};

use super::dialer::FROM_HEADER;

/// Which node sent a peer request, once [`authenticate`] has checked it.
#[derive(Debug, Clone, Copy)]
pub struct PeerId(pub NodeId);

/// What the peer listener's gate needs.
#[derive(Debug, Clone)]
pub(super) struct PeerGate {
    raft: Arc<Raft>,
    incarnations: Arc<Incarnations>,
    /// The settings this node announces and checks (`settings.rs`).
    settings: Arc<PeerSettings>,
    /// Whether a client certificate must name the sender (mutual TLS).
    tls: bool,
    /// Refusals already logged, one line per (node, reason).
    logged: Arc<Mutex<HashSet<String>>>,
}

impl PeerGate {
    /// The gate of a node whose Raft is `raft`; `tls`: a client certificate
    /// must name the sender.
    pub(super) fn new(
        raft: Arc<Raft>,
        (incarnations, settings): (Arc<Incarnations>, Arc<PeerSettings>),
        tls: bool,
    ) -> Self {
        Self {
            raft,
            incarnations,
            settings,
            tls,
            logged: Arc::default(),
        }
    }

    fn refuse(&self, reason: String) -> Response {
        let mut logged = palisade_plumbing::sync::lock(&self.logged);
        if logged.len() > 1024 {
            logged.clear();
        }
        if logged.insert(reason.clone()) {
            tracing::warn!(%reason, "peer request refused (logged once per peer and reason)");
        }
        ApiError::Forbidden(reason).into_response()
    }

    fn is_member(&self, id: NodeId) -> bool {
        self.raft
            .metrics()
            .borrow_watched()
            .membership_config
            .membership()
            .nodes()
            .any(|(member, _)| *member == id)
    }
}

/// Admits a peer request only from a current member (voter or learner)
/// whose certificate (with TLS) names the node it claims to be, that is
/// the incarnation first seen for it (it has not lost its data) and whose
/// settings agree with this node's (`settings.rs`); answers carry this
/// node's incarnation and settings.
pub(super) async fn authenticate(
    State(gate): State<PeerGate>,
    mut request: Request,
    next: Next,
) -> Response {
    let from = request
        .headers()
        .get(FROM_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<NodeId>().ok());
    let Some(from) = from else {
        return gate.refuse(format!("a peer request without {FROM_HEADER}"));
    };
    if gate.tls {
        let named = request
            .extensions()
            .get::<PeerCertificate>()
            .is_some_and(|cert| certificate_names(&cert.0, &node_name(from)));
        if !named {
            return gate.refuse(format!("the client certificate does not name node {from}"));
        }
    }
    if !gate.is_member(from) {
        return gate.refuse(format!("node {from} is not a member"));
    }
    let incarnation = request
        .headers()
        .get(INCARNATION_HEADER)
        .and_then(|v| v.to_str().ok());
    if let Err(reason) = gate.incarnations.check(from, incarnation) {
        return gate.refuse(reason);
    }
    let announced = request
        .headers()
        .get(SETTINGS_HEADER)
        .and_then(|v| v.to_str().ok());
    // Recorded either way; refused, except the standing exchange, which is
    // how `cluster add` and a peer meeting this node learn what it runs
    // (and name the difference) before anything else is allowed.
    let settled = gate.settings.check(from, announced);
    if let Err(reason) = settled {
        if request.uri().path() != "/raft/standing" {
            return gate.refuse(reason);
        }
    }
    request.extensions_mut().insert(PeerId(from));
    let mut response = next.run(request).await;
    if let Ok(mine) = http::HeaderValue::from_str(gate.incarnations.mine()) {
        response.headers_mut().insert(INCARNATION_HEADER, mine);
    }
    response
        .headers_mut()
        .insert(SETTINGS_HEADER, gate.settings.header());
    response
}
