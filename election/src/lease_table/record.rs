//! [`LeaseRecord`]: one lease as every node knows it, and the moves a
//! command makes on it. Rules about a record ("may this grant be
//! extended?") live here, so apply and the API ask the same question.

use std::collections::VecDeque;

use palisade_names::{FencingToken, Holder};
use serde::{Deserialize, Serialize};

use super::command::{Presented, SecretHash, Terms};
use super::history::{Standing, Transition};

/// How long a preempted grant's lease, once released or expired, waits for
/// its preemptor's acquire before it is free for anyone (the preemptor's
/// call is waiting and takes it within a commit; this bounds the case where
/// it gave up meanwhile).
pub const PREEMPTION_RESERVATION_MS: u64 = 2_000;

/// One lease as every node knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// The current holder; `None` when free.
    pub holder: Option<Holder>,
    /// The fencing token of the latest grant (kept after release, so the next
    /// grant is visibly higher).
    pub token: FencingToken,
    /// The ttl of the latest grant.
    pub ttl_ms: u64,
    /// How many times the holder changed (grants plus releases and expiries).
    pub transitions: u64,
    /// Log index of the last change; watchers wait for it to pass a value.
    pub modify_index: u64,
    /// Log index of the latest acquire that granted the lease to its holder,
    /// repeated acquires included. A release naming an older one comes from
    /// a handle the holder has since replaced, and frees nothing: a repeated
    /// acquire keeps the token, so the token alone cannot tell them apart.
    #[serde(default)]
    pub grant_index: u64,
    /// The hash of the current grant's secret; renew, release and a repeated
    /// acquire must present the secret. `None` for a grant made before
    /// grants had secrets (then the holder name and token suffice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretHash>,
    /// The current grant was revoked: it is never extended again and expires
    /// at the leader's deadline.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub revoked: bool,
    /// What the current (or last) grant asked for.
    #[serde(default, skip_serializing_if = "Terms::is_default")]
    pub terms: Terms,
    /// The current grant comes from a handover and waits for its holder
    /// (the successor) to take it with an acquire: it has no secret yet,
    /// so nothing but that acquire opens it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reserved: bool,
    /// Who preempted the current grant (it is then also `revoked`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_by: Option<Holder>,
    /// The preemptor's principal, under a policy: the reservation made for
    /// the preemptor opens only to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_by_principal: Option<String>,
    /// The principal a reservation (`reserved`) waits for, under a policy:
    /// only its acquire, naming the holder, takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_principal: Option<String>,
    /// The lease is free because a grant with a lock-delay expired: the
    /// leader keeps it from new grants for `terms.lock_delay_ms` after it
    /// saw it freed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lock_delayed: bool,
    /// The principal of the latest grant, under a policy: the record counts
    /// against its quota of leases (`max_leases` in the policy) until it is
    /// reclaimed, held or free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The last transitions, oldest first ([`super::history`]).
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub history: VecDeque<Transition>,
}

impl LeaseRecord {
    /// Whether `presented` (a hash of what the client sent) opens the current
    /// grant. A grant without a secret (made before secrets) opens to anyone
    /// naming its holder and token.
    pub fn opens(&self, presented: Option<&SecretHash>) -> bool {
        !self.reserved && self.secret.is_none_or(|secret| secret.matches(presented))
    }

    /// Whether the lease waits for `holder`, calling as `principal`, to take
    /// it over (a handover or a preemption): the holder name and, when the
    /// reservation names one, the principal must both match.
    pub fn reserved_for(&self, holder: &str, principal: Option<&str>) -> bool {
        self.reserved
            && !self.revoked
            && self.holder.as_deref() == Some(holder)
            && self
                .reserved_principal
                .as_deref()
                .is_none_or(|wanted| Some(wanted) == principal)
    }

    /// Ends a preempted grant by reserving the lease for its preemptor, the
    /// way a handover does: a grant with a new (higher) token and no secret
    /// yet, which only the preemptor's acquire takes, for at most
    /// [`PREEMPTION_RESERVATION_MS`] (then it expires like any grant). So
    /// nobody slips in between the release and the preemptor's acquire (a
    /// preempted holder that campaigns again at once would, otherwise).
    /// Returns false, changing nothing, if the grant was not preempted.
    pub(super) fn reserve_for_preemptor(&mut self, index: u64) -> bool {
        let Some(to) = self.preempted_by.take() else {
            return false;
        };
        let principal = self.preempted_by_principal.take();
        self.reserve(to, principal, index, PREEMPTION_RESERVATION_MS);
        true
    }

    /// Ends the current grant with one reserved for `to` (a handover's
    /// successor or a preemptor): the token of the entry at `index`, no
    /// secret until `to`'s acquire takes it, default terms, for `ttl_ms`.
    pub(super) fn reserve(
        &mut self,
        to: Holder,
        principal: Option<String>,
        index: u64,
        ttl_ms: u64,
    ) {
        self.holder = Some(to);
        self.reserved_principal = principal;
        self.token = FencingToken(index);
        self.ttl_ms = ttl_ms;
        self.transitions += 1;
        self.modify_index = index;
        self.grant_index = index;
        self.secret = None;
        self.revoked = false;
        self.terms = Terms::default();
        self.reserved = true;
        self.preempted_by = None;
        self.preempted_by_principal = None;
        self.lock_delayed = false;
    }

    /// Ends the current grant: the lease is free.
    pub(super) fn free(&mut self, index: u64) {
        self.holder = None;
        self.transitions += 1;
        self.modify_index = index;
        self.reserved = false;
        self.reserved_principal = None;
        self.preempted_by = None;
        self.preempted_by_principal = None;
    }

    /// What a transition changes, as it stands now ([`super::history`]).
    pub(super) fn standing(&self) -> Standing {
        Standing {
            holder: self.holder.clone(),
            token: self.token,
            revoked: self.revoked,
            reserved: self.reserved,
        }
    }

    /// When the current grant began (ms since the Unix epoch, the
    /// proposer's clock): the stamp of the acquire, claim or handover that
    /// made it, as its kept history shows. `None` when free, and when that
    /// transition is unstamped or no longer kept.
    pub fn grant_began_ms(&self) -> Option<u64> {
        use super::history::Cause;
        self.holder.as_ref()?;
        self.history
            .iter()
            .rev()
            .find(|t| {
                t.token == self.token
                    && matches!(t.cause, Cause::Acquire | Cause::Claim | Cause::Handover)
            })?
            .at_ms
    }

    /// Whether `holder`, presenting `secret`, may extend the current grant
    /// (a repeated acquire, any token).
    pub(super) fn extensible_by(&self, holder: &str, secret: Option<&SecretHash>) -> bool {
        self.extension(holder, None, secret) == Extension::Open
    }

    /// The rule for extending a grant, in one place: whether `holder`'s
    /// grant (of `token`, when given) may be extended by a caller
    /// presenting `secret` — renewals, repeated acquires and the table's
    /// own checks all ask here. A preempted grant (which is revoked too)
    /// says so first; a revoked one is never extended.
    pub fn extension(
        &self,
        holder: &str,
        token: Option<FencingToken>,
        secret: Option<&SecretHash>,
    ) -> Extension {
        let named = self.holder.as_deref() == Some(holder) && token.is_none_or(|t| t == self.token);
        if !named || !self.opens(secret) {
            return Extension::NotHeld;
        }
        match (&self.preempted_by, self.revoked) {
            (Some(by), _) => Extension::Preempted(by.clone()),
            (None, true) => Extension::Revoked,
            (None, false) => Extension::Open,
        }
    }

    /// The rule for a holder's release, in one place: whether the grant
    /// `grant` presents is the current one, opened by its secret, from a
    /// handle no newer acquire replaced (`grant_index`, when the release
    /// names it, at least the record's). A revoked or preempted grant may
    /// still be released: letting go is what they ask of their holder.
    pub(super) fn releasable_by(&self, grant: Presented, grant_index: Option<u64>) -> bool {
        self.holder.as_deref() == Some(grant.holder)
            && self.token == grant.token
            && self.opens(grant.secret)
            && grant_index.is_none_or(|g| g >= self.grant_index)
    }

    /// The rule for a handover, in one place: only a grant that could be
    /// extended ([`Self::extension`] is `Open` for its holder, token and
    /// secret) may name its successor; a revoked or preempted one ends as
    /// it was told to.
    pub(super) fn handed_over_by(&self, grant: Presented) -> bool {
        self.extension(grant.holder, Some(grant.token), grant.secret) == Extension::Open
    }

    /// A lease never granted before, about to be asked for at `index`.
    pub(super) fn never_granted(index: u64, ttl_ms: u64) -> Self {
        Self {
            holder: None,
            token: FencingToken(0),
            ttl_ms,
            transitions: 0,
            modify_index: index,
            grant_index: index,
            secret: None,
            revoked: false,
            terms: Terms::default(),
            reserved: false,
            preempted_by: None,
            preempted_by_principal: None,
            reserved_principal: None,
            lock_delayed: false,
            owner: None,
            history: VecDeque::new(),
        }
    }

    /// Grants the free lease to `holder` at `index`: the entry's index is
    /// the new token.
    pub(super) fn grant(
        &mut self,
        index: u64,
        holder: &Holder,
        ttl_ms: u64,
        secret: Option<SecretHash>,
        terms: Terms,
    ) {
        self.holder = Some(holder.clone());
        self.token = FencingToken(index);
        self.ttl_ms = ttl_ms;
        self.transitions += 1;
        self.modify_index = index;
        self.grant_index = index;
        self.secret = secret;
        self.revoked = false;
        self.terms = terms;
        self.reserved = false;
        self.reserved_principal = None;
        self.preempted_by = None;
        self.preempted_by_principal = None;
        self.lock_delayed = false;
    }

    /// The successor of a handover (or a preemptor) takes the grant
    /// reserved for it: the reservation's (higher) token, its own secret,
    /// ttl and terms.
    pub(super) fn claim(
        &mut self,
        index: u64,
        ttl_ms: u64,
        secret: Option<SecretHash>,
        terms: Terms,
    ) {
        self.reserved = false;
        self.reserved_principal = None;
        self.secret = secret;
        self.ttl_ms = ttl_ms;
        self.terms = terms;
        self.modify_index = index;
        self.grant_index = index;
    }

    /// Whether a waiting acquire asking for `terms` (and to preempt) may
    /// preempt the current grant: a higher priority than a preemptible grant
    /// that is neither revoked nor a reservation.
    pub(super) fn preemptible_by(&self, terms: &Terms, preempt: bool) -> bool {
        preempt
            && self.terms.preemptible
            && terms.priority > self.terms.priority
            && !self.revoked
            && !self.reserved
    }

    /// Revokes the current grant for `preemptor`, who takes the lease when
    /// it ends ([`Self::reserve_for_preemptor`]).
    pub(super) fn preempt(&mut self, index: u64, preemptor: &Holder, principal: Option<&str>) {
        self.revoked = true;
        self.preempted_by = Some(preemptor.clone());
        self.preempted_by_principal = principal.map(str::to_owned);
        self.modify_index = index;
    }

    /// Whether an acquire that saw the lease freed at `delay_seen` must wait
    /// out a lock-delay first: the lease is lock-delayed, and the acquire
    /// did not wait for this very freeing (the leader's lessor times it).
    pub(super) fn lock_delay_unseen(&self, delay_seen: Option<u64>) -> bool {
        self.lock_delayed && delay_seen.is_some_and(|seen| seen != self.modify_index)
    }
}

/// Whether a grant may be extended ([`LeaseRecord::extension`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extension {
    /// It may: the caller holds it, with its secret, and it is neither
    /// revoked nor preempted.
    Open,
    /// Preempted by this holder: it ends at its deadline.
    Preempted(Holder),
    /// Revoked: it ends at its deadline.
    Revoked,
    /// The caller does not hold it (another holder or token, a wrong
    /// secret, a reservation not yet claimed, no grant).
    NotHeld,
}
