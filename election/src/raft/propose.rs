//! [`Proposer`]: the one way a command goes through the log, used by the
//! client API and by the leader's own duties (expiry, key install).

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};

use super::types::{NodeId, TypeConfig};
use super::Raft;
use crate::lease_table::command::{Command, CommandResult};

/// Why a proposal did not apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// No quorum, no leadership, or leadership moved: the caller may retry.
    #[error("{0}")]
    NoQuorum(String),
    /// Raft refused the write for a reason of its own (a membership change
    /// already in progress, an unknown learner).
    #[error("{0}")]
    Refused(String),
    /// Raft failed in a way a retry will not fix (storage, shutdown).
    #[error("{0}")]
    Fatal(String),
}

/// Proposes commands on this node's Raft and waits for them to apply.
#[derive(Debug, Clone)]
pub struct Proposer {
    raft: Arc<Raft>,
    /// This node, to tell "I am a leader not yet able to write" apart from
    /// "another node leads".
    me: NodeId,
    /// How long a proposal may take before the caller gets
    /// [`ProposeError::NoQuorum`].
    timeout: Duration,
    /// Counts proposals that did not apply.
    failures: prometheus_client::metrics::counter::Counter,
    /// The history bound stamped into every entry (`--history-len`).
    history_len: u16,
}

impl Proposer {
    /// A proposer for `raft` (node `me`) whose proposals give up after
    /// `timeout`.
    pub fn new(
        raft: Arc<Raft>,
        me: NodeId,
        timeout: Duration,
        failures: prometheus_client::metrics::counter::Counter,
        history_len: u16,
    ) -> Self {
        Self {
            raft,
            me,
            timeout,
            history_len,
            failures,
        }
    }

    /// Proposes `command` and waits for it to apply. A fresh leader may refuse
    /// writes for a moment (`ForwardToLeader` without a leader, while its
    /// leader lease is not yet established): that is retried until the
    /// timeout.
    ///
    /// # Errors
    /// [`ProposeError`]: not committed within the timeout, not the leader,
    /// the entry was discarded by a leader change, or a fatal Raft error.
    pub async fn propose(&self, command: Command) -> Result<CommandResult, ProposeError> {
        // The time the lease history shows (never a deadline: those are
        // measured on each node's monotonic clock), and the history's bound,
        // so that every node trims it alike.
        let command = command.stamped_with(crate::signing::unix_ms(), Some(self.history_len));
        let response = self
            .write(|| self.raft.client_write(command.clone()))
            .await
            .inspect_err(|_| {
                self.failures.inc();
            })?;
        Ok(response.data)
    }

    /// Runs a write (`attempt`: a proposal, a membership change) and retries
    /// a fresh leader's transient refusals until the timeout. Other refusals
    /// are the caller's to map.
    ///
    /// # Errors
    /// [`ProposeError`] as for [`Proposer::propose`]; a refusal that is not
    /// about leadership (e.g. a membership change in progress) is
    /// [`ProposeError::Refused`].
    pub async fn write<T, F, Fut>(&self, attempt: F) -> Result<T, ProposeError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<
            Output = Result<T, RaftError<TypeConfig, ClientWriteError<TypeConfig>>>,
        >,
    {
        const PAUSE: Duration = Duration::from_millis(10);
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            match tokio::time::timeout_at(deadline, attempt()).await {
                Err(_) => {
                    return Err(ProposeError::NoQuorum(format!(
                        "not committed within {} ms: no quorum",
                        self.timeout.as_millis()
                    )))
                }
                Ok(Ok(response)) => return Ok(response),
                Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))))
                    if forward.leader_id.is_none() || forward.leader_id == Some(self.me) =>
                {
                    if tokio::time::Instant::now() + PAUSE >= deadline {
                        return Err(ProposeError::NoQuorum(
                            "this node cannot confirm its leadership".into(),
                        ));
                    }
                    tokio::time::sleep(PAUSE).await;
                }
                Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward)))) => {
                    return Err(ProposeError::NoQuorum(format!(
                        "leadership moved to node {:?}; retry there",
                        forward.leader_id
                    )))
                }
                Ok(Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(_)))) => {
                    return Err(ProposeError::NoQuorum(
                        "leadership changed while proposing; retry".into(),
                    ))
                }
                Ok(Err(RaftError::APIError(refused))) => {
                    return Err(ProposeError::Refused(refused.to_string()))
                }
                Ok(Err(err)) => return Err(ProposeError::Fatal(err.to_string())),
            }
        }
    }
}
