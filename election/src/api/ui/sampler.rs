//! The status page's sampler: every [`EVERY`] it takes the differences of
//! this node's counters (and the gateway's refused-writes counter) into a
//! [`Sample`] of the node's [`Series`](crate::series::Series).

use std::time::Instant;

use openraft::async_runtime::WatchReceiver;

use super::status::StatusPage;
use crate::api::state::ApiState;
use crate::series::{Sample, EVERY};

/// The counters a sample takes differences of.
#[derive(Debug, Clone, Copy)]
struct Counts {
    renewals: u64,
    grants: u64,
    leader_changes: u64,
    refused: Option<u64>,
    at: Instant,
}

/// Takes a sample of `state` (and of the gateway `status` reads) into its
/// series every [`EVERY`], forever.
pub async fn sample(state: ApiState, status: std::sync::Arc<StatusPage>) {
    let mut before = counts(&state, &status).await;
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let now = counts(&state, &status).await;
        state.series.push(take(&state, &before, &now));
        before = now;
    }
}

/// The counters now (the gateway's if it answers within its bound).
async fn counts(state: &ApiState, status: &StatusPage) -> Counts {
    let metrics = &state.metrics;
    let refused = match &status.gateway {
        Some(reader) => reader.refused_writes().await.ok(),
        None => None,
    };
    Counts {
        renewals: metrics.renewals.get(),
        grants: metrics.grants.get(),
        leader_changes: metrics.leader_changes.get(),
        refused,
        at: Instant::now(),
    }
}

/// The sample of the interval from `before` to `now`.
fn take(state: &ApiState, before: &Counts, now: &Counts) -> Sample {
    let secs = now.at.duration_since(before.at).as_secs_f64().max(0.001);
    let rate = |from: u64, to: u64| to.saturating_sub(from) as f64 / secs;
    let held = state
        .groups()
        .iter()
        .map(|g| g.applied.read(|s| s.table.held()))
        .sum();
    let raft = state.group_zero().raft.metrics().borrow_watched().clone();
    Sample {
        at_ms: crate::signing::unix_ms(),
        renewals: rate(before.renewals, now.renewals),
        grants: rate(before.grants, now.grants),
        refused: before.refused.zip(now.refused).map(|(b, n)| rate(b, n)),
        held,
        waiters: state.waiting(),
        renew_p99_ms: state.metrics.renew_window.take_p99().map(|s| s * 1000.0),
        leader: raft.current_leader,
        leader_changed: now.leader_changes > before.leader_changes,
    }
}
