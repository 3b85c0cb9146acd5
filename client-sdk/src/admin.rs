//! The cluster operator's calls on [`Client`]: signing-key rotation and
//! membership changes (`palisade cluster rotate-key|add|remove`).

use std::time::Duration;

use serde_json::{json, Value};

use crate::client::Client;
use crate::error::Error;

impl Client {
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
    /// As [`Client::add_member_within`].
    pub async fn add_member(&self, id: u64, addr: &str) -> Result<Value, Error> {
        self.add_member_within(id, addr, Duration::from_secs(60))
            .await
    }

    /// Adds node `id` (peer address `addr`): as a learner that must catch
    /// up within `wait`, then as a voter. A learner that does not (nothing
    /// answers at `addr`, say) is removed again and the voters stay as
    /// they were.
    ///
    /// # Errors
    /// [`Error::Protocol`] with 409: `not_caught_up` (why, in the
    /// message), `id` already a voter, or a change in progress;
    /// [`Error::Unavailable`].
    pub async fn add_member_within(
        &self,
        id: u64,
        addr: &str,
        wait: Duration,
    ) -> Result<Value, Error> {
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        let body = json!({ "id": id, "addr": addr, "wait_ms": wait_ms });
        self.transport
            .election(
                reqwest::Method::POST,
                "/v1/cluster/members",
                Some(&body),
                wait,
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
}
