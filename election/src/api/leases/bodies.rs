//! The request and answer bodies of the lease calls, with their checks
//! (`Checked`: bad input is a 400 before anything is proposed).

use palisade_names::{FencingToken, GrantSecret, Holder, LeaseName};
use serde::{Deserialize, Serialize};

use super::super::extract::{check_token, check_wait, Checked};
use super::super::schema::{HolderParam, LeaseNameParam};
use crate::config::ElectionConfig;
use crate::error::ApiError;
use crate::lease_table::command::{SecretHash, Terms};

/// `POST /v1/leases/{name}/acquire`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(in crate::api) struct AcquireRequest {
    /// Who asks: 1..=256 characters, no control characters, no
    /// bidirectional controls (checked in [`Checked::check`]).
    #[schema(value_type = HolderParam)]
    pub(in crate::api) holder: Holder,
    /// How long the grant lasts without renewal: within the node's
    /// `--min-ttl-ms..=--max-ttl-ms` (the schema states the defaults).
    #[schema(minimum = 500, maximum = 3_600_000)]
    pub(in crate::api) ttl_ms: u64,
    /// Wait up to this long for a held lease (at most the node's max wait,
    /// 60 s).
    #[schema(maximum = 60_000)]
    pub(in crate::api) wait_ms: Option<u64>,
    /// The grant's secret, chosen by the client (so that a retried acquire
    /// is recognised as the same client); the node makes one when absent.
    #[schema(value_type = Option<String>, pattern = "^[A-Za-z0-9_-]{32,128}$")]
    pub(in crate::api) secret: Option<GrantSecret>,
    /// 0..=1000 (default 0). A waiting acquire of a higher priority than a
    /// preemptible holder's preempts it, and waiters queue by priority
    /// (then arrival). Equal priority never preempts.
    #[schema(maximum = 1000)]
    pub(in crate::api) priority: Option<u32>,
    /// Whether a waiting acquire of a higher priority may preempt this
    /// grant (default false).
    pub(in crate::api) preemptible: Option<bool>,
    /// After this grant expires (not after a release), the lease stays
    /// unavailable this long: 0..=60 000 (default 0).
    #[schema(maximum = 60_000)]
    pub(in crate::api) lock_delay_ms: Option<u64>,
    /// The grant is renewed for at most this long after it was granted:
    /// 0 (default: no cap)..=86 400 000.
    #[schema(maximum = 86_400_000)]
    pub(in crate::api) max_hold_ms: Option<u64>,
}

/// A holder name a request brings in (an acquire's, a handover's
/// successor) passes [`Holder::new`]: deserializing a body checks only what
/// a stored holder must pass, not the bidirectional controls.
fn check_new_holder(holder: &Holder) -> Result<(), ApiError> {
    Holder::new(holder.as_str())
        .map(|_| ())
        .map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// The highest acquire priority.
pub const MAX_PRIORITY: u32 = 1000;
/// The longest lock-delay.
pub const MAX_LOCK_DELAY_MS: u64 = 60_000;
/// The longest max-hold.
pub const MAX_HOLD_MS: u64 = 86_400_000;

impl AcquireRequest {
    pub(in crate::api) fn terms(&self) -> Terms {
        Terms {
            priority: self.priority.unwrap_or(0),
            preemptible: self.preemptible.unwrap_or(false),
            lock_delay_ms: self.lock_delay_ms.unwrap_or(0),
            max_hold_ms: self.max_hold_ms.unwrap_or(0),
        }
    }
}

impl Checked for AcquireRequest {
    fn check(&self, config: &ElectionConfig) -> Result<(), ApiError> {
        check_new_holder(&self.holder)?;
        let terms = self.terms();
        if terms.priority > MAX_PRIORITY {
            return Err(ApiError::BadRequest(format!(
                "priority must be in 0..={MAX_PRIORITY}"
            )));
        }
        if terms.lock_delay_ms > MAX_LOCK_DELAY_MS {
            return Err(ApiError::BadRequest(format!(
                "lock_delay_ms must be in 0..={MAX_LOCK_DELAY_MS}"
            )));
        }
        if terms.max_hold_ms > MAX_HOLD_MS {
            return Err(ApiError::BadRequest(format!(
                "max_hold_ms must be in 0..={MAX_HOLD_MS}"
            )));
        }
        let (min, max) = config.ttl_range;
        let ttl = u128::from(self.ttl_ms);
        if ttl < min.as_millis() || ttl > max.as_millis() {
            return Err(ApiError::BadRequest(format!(
                "ttl_ms must be in {}..={}",
                min.as_millis(),
                max.as_millis()
            )));
        }
        check_wait(self.wait_ms.unwrap_or(0), config).map(|_| ())
    }
}

/// `POST /v1/leases/{name}/renew` and `.../release`: names one grant.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(in crate::api) struct HolderToken {
    /// The holder the grant was made to.
    #[schema(value_type = HolderParam)]
    pub(in crate::api) holder: Holder,
    #[schema(value_type = u64)]
    pub(in crate::api) token: FencingToken,
    /// The grant's `grant_index` as the holder's handle knows it (release
    /// only; see `LeaseRecord::grant_index`).
    #[serde(default)]
    pub(in crate::api) grant_index: Option<u64>,
    /// The secret the acquire answered (required for grants that have one).
    #[schema(value_type = Option<String>, pattern = "^[A-Za-z0-9_-]{32,128}$")]
    pub(in crate::api) secret: Option<GrantSecret>,
}

impl HolderToken {
    pub(in crate::api) fn secret_hash(&self) -> Option<SecretHash> {
        self.secret.as_ref().map(SecretHash::of)
    }
}

impl Checked for HolderToken {
    fn check(&self, _config: &ElectionConfig) -> Result<(), ApiError> {
        check_token(self.token)
    }
}

/// A grant, as acquire and renew answer it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(in crate::api) struct Grant {
    #[schema(value_type = String)]
    pub(in crate::api) lease: LeaseName,
    #[schema(value_type = String)]
    pub(in crate::api) holder: Holder,
    #[schema(value_type = u64)]
    pub(in crate::api) token: FencingToken,
    pub(in crate::api) ttl_ms: u64,
    /// The lease token: a JWT signed by the cluster's key.
    pub(in crate::api) jwt: String,
    /// The id of the key that signed `jwt`.
    pub(in crate::api) kid: String,
    /// The log index of the acquire this grant answers (release names it).
    pub(in crate::api) grant_index: u64,
    /// The grant's secret: only in the answer to the acquire, never in a
    /// renewal, a read or an error.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub(in crate::api) secret: Option<GrantSecret>,
}

/// What release answers.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(in crate::api) struct Released {
    #[schema(value_type = String)]
    pub(in crate::api) lease: LeaseName,
    pub(in crate::api) released: bool,
    #[schema(value_type = u64)]
    pub(in crate::api) token: FencingToken,
}

/// The most renewals one batch may carry (its body, like every body, is
/// at most 64 KiB: about 400 renewals with typical names, 100 with the
/// longest; the SDK splits by both).
pub const MAX_BATCH_RENEWALS: usize = 256;

/// `POST /v1/renew`: many renewals in one request.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(in crate::api) struct RenewBatch {
    /// 1..=256 renewals, answered in this order.
    #[schema(min_items = 1, max_items = 256)]
    pub(in crate::api) renewals: Vec<BatchRenewal>,
}

/// One renewal of a batch: a lease and the grant it names.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(in crate::api) struct BatchRenewal {
    #[schema(value_type = LeaseNameParam)]
    pub(in crate::api) lease: LeaseName,
    /// The holder the grant was made to.
    #[schema(value_type = HolderParam)]
    pub(in crate::api) holder: Holder,
    #[schema(value_type = u64)]
    pub(in crate::api) token: FencingToken,
    /// The secret the acquire answered (required for grants that have one).
    #[schema(value_type = Option<String>, pattern = "^[A-Za-z0-9_-]{32,128}$")]
    pub(in crate::api) secret: Option<GrantSecret>,
}

/// A batch is checked whole: one malformed renewal (a bad name, holder or
/// token) refuses it all with 400, as the schema says, and renews nothing.
impl Checked for RenewBatch {
    fn check(&self, _config: &ElectionConfig) -> Result<(), ApiError> {
        check_renewals(&self.renewals)
    }
}

/// The rules of a batch's (or a stream frame's) renewals: 1..=256 of them,
/// each token in range.
pub(in crate::api) fn check_renewals(renewals: &[BatchRenewal]) -> Result<(), ApiError> {
    if renewals.is_empty() || renewals.len() > MAX_BATCH_RENEWALS {
        return Err(ApiError::BadRequest(format!(
            "renewals must hold 1..={MAX_BATCH_RENEWALS} entries"
        )));
    }
    for (i, renewal) in renewals.iter().enumerate() {
        check_token(renewal.token)
            .map_err(|e| ApiError::BadRequest(format!("renewals[{i}]: {e}")))?;
    }
    Ok(())
}

/// What a batch renewal answers: one result per renewal, in order.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(in crate::api) struct RenewResults {
    pub(in crate::api) results: Vec<RenewResult>,
}

/// One renewal's answer: the status a single renewal would have had, and
/// the grant (200) or the error's fields.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(in crate::api) struct RenewResult {
    #[schema(value_type = String)]
    pub(in crate::api) lease: LeaseName,
    pub(in crate::api) status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(in crate::api) grant: Option<Grant>,
    /// The error code (`lost`, `forbidden`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(in crate::api) error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(in crate::api) message: Option<String>,
}

/// `POST /v1/leases/{name}/handover`: the holder names its successor.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(in crate::api) struct HandoverRequest {
    /// The current holder.
    #[schema(value_type = HolderParam)]
    pub(in crate::api) holder: Holder,
    /// Its grant's token.
    #[schema(value_type = u64)]
    pub(in crate::api) token: FencingToken,
    /// Its grant's secret.
    #[schema(value_type = Option<String>, pattern = "^[A-Za-z0-9_-]{32,128}$")]
    pub(in crate::api) secret: Option<GrantSecret>,
    /// The successor: another holder name.
    #[schema(value_type = HolderParam)]
    pub(in crate::api) to: Holder,
    /// The successor's principal (under a policy): only an acquire with its
    /// API key, naming `to`, takes the lease. Default: the caller's own.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
    )]
    pub(in crate::api) to_principal: Option<String>,
    /// How long the lease waits for the successor's acquire:
    /// 500..=60 000 (default 10 000). Unclaimed, the reservation expires
    /// and the lease is free.
    #[schema(minimum = 500, maximum = 60_000)]
    pub(in crate::api) window_ms: Option<u64>,
}

/// The default and bounds of a handover's reservation window.
pub(in crate::api) const HANDOVER_WINDOW_MS: (u64, u64, u64) = (500, 10_000, 60_000);

impl Checked for HandoverRequest {
    fn check(&self, _config: &ElectionConfig) -> Result<(), ApiError> {
        check_token(self.token)?;
        check_new_holder(&self.to)?;
        if self.to_principal.as_ref().is_some_and(|p| {
            p.is_empty() || p.chars().count() > 128 || p.chars().any(char::is_control)
        }) {
            return Err(ApiError::BadRequest(
                "to_principal must be 1..=128 characters, no control characters".into(),
            ));
        }
        if self.to == self.holder {
            // Well-formed, but not a change this lease can make: 409.
            return Err(ApiError::Conflict(
                "a handover names another holder than the current one".into(),
            ));
        }
        let (min, _, max) = HANDOVER_WINDOW_MS;
        if self.window_ms.is_some_and(|w| !(min..=max).contains(&w)) {
            return Err(ApiError::BadRequest(format!(
                "window_ms must be in {min}..={max}"
            )));
        }
        Ok(())
    }
}

/// What a handover answers.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(in crate::api) struct HandedOver {
    #[schema(value_type = String)]
    pub(in crate::api) lease: LeaseName,
    /// The successor.
    #[schema(value_type = String)]
    pub(in crate::api) to: Holder,
    /// The successor's fencing token (higher than the old holder's): its
    /// acquire is granted with it.
    #[schema(value_type = u64)]
    pub(in crate::api) token: FencingToken,
    /// How long the lease is reserved for the successor.
    pub(in crate::api) window_ms: u64,
}

/// `POST /v1/leases/{name}/revoke`: names the grant by its token.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(in crate::api) struct RevokeRequest {
    #[schema(value_type = u64)]
    pub(in crate::api) token: FencingToken,
}

impl Checked for RevokeRequest {
    fn check(&self, _config: &ElectionConfig) -> Result<(), ApiError> {
        check_token(self.token)
    }
}

/// What revoke answers.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(in crate::api) struct Revoked {
    #[schema(value_type = String)]
    pub(in crate::api) lease: LeaseName,
    pub(in crate::api) revoked: bool,
    #[schema(value_type = u64)]
    pub(in crate::api) token: FencingToken,
    /// When the grant runs out, as the leader sees it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(in crate::api) expires_in_ms: Option<u64>,
}
