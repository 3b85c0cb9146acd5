//! The fault suite's checker: reads worker histories, the harness's fault
//! log and the final gateway state, and names every violation of S1-S4 and
//! L1 it finds.

use std::collections::HashMap;

use serde::Deserialize;

use crate::linearizable::{self, Kind, Op, Verdict};

/// A held interval, as the holder's SDK reported `is_held` (CLOCK_MONOTONIC ns).
#[derive(Debug, Clone, Deserialize)]
pub struct Held {
    pub lease: String,
    pub holder: String,
    pub token: u64,
    pub from: u64,
    pub to: u64,
}

/// One write attempt.
#[derive(Debug, Clone, Deserialize)]
pub struct Write {
    pub lease: String,
    pub holder: String,
    pub key: String,
    pub value: String,
    pub seq: u64,
    pub token: u64,
    pub invoke: u64,
    pub complete: u64,
    pub ok: bool,
    pub error: Option<String>,
    /// The gateway's version of an accepted write (its commit order).
    #[serde(default)]
    pub version: Option<u64>,
}

impl Write {
    /// Refused for sure (by the fence, or locally before sending): it cannot
    /// have changed anything. Other failures (transport) have unknown outcome.
    fn surely_refused(&self) -> bool {
        self.error.as_deref().is_some_and(|e| {
            e.contains("fenced") || e.contains("lease lost") || e.contains("stale")
        })
    }
}

/// One read of a key through the gateway (by any worker, holder or not).
#[derive(Debug, Clone, Deserialize)]
pub struct Read {
    pub key: String,
    /// What it returned (None: absent); meaningless unless `ok`.
    pub value: Option<String>,
    pub invoke: u64,
    pub complete: u64,
    pub ok: bool,
}

/// One injected fault, as the harness logged it (CLOCK_MONOTONIC ns).
#[derive(Debug, Clone)]
pub struct Fault {
    pub kind: &'static str,
    pub from: u64,
    pub healed: u64,
}

/// Everything the checker reads.
#[derive(Debug, Default)]
pub struct History {
    pub held: Vec<Held>,
    pub writes: Vec<Write>,
    pub reads: Vec<Read>,
    pub faults: Vec<Fault>,
    /// Final value of every key at the gateway (None: absent).
    pub finals: HashMap<String, Option<String>>,
}

/// The liveness bounds L1 is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// No lease is without a holder for longer than this, anywhere between
    /// its first grant and its last.
    pub max_gap_ns: u64,
    /// After a fault heals, every lease has a holder again within this
    /// (unless the next fault starts first).
    pub recovery_ns: u64,
}

impl History {
    /// Every lease that was granted at least once, sorted.
    pub fn leases(&self) -> Vec<&str> {
        let mut leases: Vec<&str> = self.held.iter().map(|h| h.lease.as_str()).collect();
        leases.sort_unstable();
        leases.dedup();
        leases
    }

    /// Parses JSON lines written by `palisade worker --history`.
    pub fn add_lines(&mut self, text: &str) {
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let value: serde_json::Value =
                serde_json::from_str(line).expect("history line is JSON");
            match value["op"].as_str() {
                Some("held") => self.held.push(serde_json::from_value(value).expect("held")),
                Some("write") => self
                    .writes
                    .push(serde_json::from_value(value).expect("write")),
                Some("read") => self
                    .reads
                    .push(serde_json::from_value(value).expect("read")),
                other => panic!("unknown history op {other:?}"),
            }
        }
    }
}

/// Runs every check; returns the violations (empty: all properties hold).
pub fn check(history: &History, bounds: Bounds) -> Vec<String> {
    let mut violations = Vec::new();
    check_fenced_writes_never_go_back(history, &mut violations);
    check_tokens_grow_and_name_one_holder(history, &mut violations);
    check_holders_never_overlap(history, &mut violations);
    check_acknowledged_writes_survive(history, &mut violations);
    check_linearizable(history, &mut violations);
    check_leases_are_granted_again(history, bounds, &mut violations);
    for fault in recoveries(history, bounds.recovery_ns) {
        if let Recovery::Late { lease, after_ns } = fault.1 {
            violations.push(format!(
                "L1: {lease} had no holder {} ms after {} healed (bound {} ms)",
                after_ns / 1_000_000,
                fault.0.kind,
                bounds.recovery_ns / 1_000_000
            ));
        }
    }
    violations
}

/// S1: in the gateway's commit order (versions), the tokens of a lease's
/// accepted writes never go down; and an accepted write never carries a
/// token below one acknowledged before it was invoked, on the same lease.
fn check_fenced_writes_never_go_back(history: &History, violations: &mut Vec<String>) {
    let mut committed: Vec<&Write> = history
        .writes
        .iter()
        .filter(|w| w.ok && w.version.is_some())
        .collect();
    committed.sort_by_key(|w| (w.lease.as_str(), w.version));
    for pair in committed.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.lease == b.lease && b.token < a.token {
            violations.push(format!(
                "S1: on {} the gateway committed token {} ({} seq {}, version {:?}) after token {} ({} seq {}, version {:?})",
                a.lease, b.token, b.holder, b.seq, b.version, a.token, a.holder, a.seq, a.version
            ));
        }
    }
    let mut accepted: Vec<&Write> = history.writes.iter().filter(|w| w.ok).collect();
    accepted.sort_by_key(|w| w.complete);
    for (i, earlier) in accepted.iter().enumerate() {
        for later in &accepted[i + 1..] {
            if later.lease == earlier.lease
                && earlier.complete < later.invoke
                && later.token < earlier.token
            {
                violations.push(format!(
                    "S1: {} accepted token {} (seq {}) after token {} was acknowledged on lease {}",
                    later.holder, later.token, later.seq, earlier.token, later.lease
                ));
            }
        }
    }
}

/// S2: a token belongs to one holder; later grants carry higher tokens.
fn check_tokens_grow_and_name_one_holder(history: &History, violations: &mut Vec<String>) {
    let mut owner: HashMap<(&str, u64), &str> = HashMap::new();
    for held in &history.held {
        if let Some(other) = owner.insert((&held.lease, held.token), &held.holder) {
            if other != held.holder {
                violations.push(format!(
                    "S2: token {} of {} granted to {other} and {}",
                    held.token, held.lease, held.holder
                ));
            }
        }
    }
    let mut by_lease: HashMap<&str, Vec<&Held>> = HashMap::new();
    for held in &history.held {
        by_lease.entry(&held.lease).or_default().push(held);
    }
    for grants in by_lease.values_mut() {
        grants.sort_by_key(|h| h.from);
        for pair in grants.windows(2) {
            if pair[1].token < pair[0].token {
                violations.push(format!(
                    "S2: on {} token {} ({}) was granted after token {} ({})",
                    pair[1].lease, pair[1].token, pair[1].holder, pair[0].token, pair[0].holder
                ));
            }
        }
    }
}

/// S3: two holders' held intervals never overlap on one lease.
fn check_holders_never_overlap(history: &History, violations: &mut Vec<String>) {
    for (i, a) in history.held.iter().enumerate() {
        for b in &history.held[i + 1..] {
            if a.lease == b.lease && a.holder != b.holder && a.from < b.to && b.from < a.to {
                violations.push(format!(
                    "S3: {} (token {}) and {} (token {}) both held {} for {} ms",
                    a.holder,
                    a.token,
                    b.holder,
                    b.token,
                    a.lease,
                    (a.to.min(b.to) - a.from.max(b.from)) / 1_000_000
                ));
            }
        }
    }
}

/// S4: every key ends with the last acknowledged write, or a later one whose
/// outcome was unknown; nothing acknowledged is lost.
fn check_acknowledged_writes_survive(history: &History, violations: &mut Vec<String>) {
    let mut by_key: HashMap<&str, Vec<&Write>> = HashMap::new();
    for write in &history.writes {
        by_key.entry(&write.key).or_default().push(write);
    }
    for (key, writes) in by_key {
        let Some(last_acked) = writes.iter().filter(|w| w.ok).max_by_key(|w| w.complete) else {
            continue;
        };
        let candidates: Vec<&&Write> = writes
            .iter()
            .filter(|w| !w.surely_refused() && w.invoke >= last_acked.invoke)
            .collect();
        let final_value = history.finals.get(key).cloned().flatten();
        let explained = final_value
            .as_deref()
            .is_some_and(|v| candidates.iter().any(|w| w.value == v));
        if !explained {
            violations.push(format!(
                "S4: {key} ends as {final_value:?}, but {:?} was acknowledged last",
                last_acked.value
            ));
        }
    }
}

/// L1: a lease is never without a holder for longer than `max_gap_ns`
/// between its first grant and its last — except across chained faults (a
/// gap that overlaps two or more), where every leader change restarts the
/// grant's deadline (etcd's Promote) and a fault may start before the last
/// one recovered: such a gap must end within `recovery_ns` of the last of
/// those faults healing.
fn check_leases_are_granted_again(history: &History, bounds: Bounds, violations: &mut Vec<String>) {
    let leases = history.leases();
    for lease in leases {
        for (from, to) in gaps(history, lease) {
            let overlapping: Vec<&Fault> = history
                .faults
                .iter()
                .filter(|f| f.from < to && f.healed > from)
                .collect();
            let last_heal = overlapping.iter().map(|f| f.healed).max().unwrap_or(from);
            let (allowed_to, rule) = if overlapping.len() >= 2 {
                (
                    last_heal + bounds.recovery_ns,
                    "after the last of its faults healed",
                )
            } else {
                (from + bounds.max_gap_ns, "")
            };
            if to > allowed_to {
                violations.push(format!(
                    "L1: {lease} had no holder for {} ms (bound {} ms{})",
                    (to - from) / 1_000_000,
                    (allowed_to - from) / 1_000_000,
                    if rule.is_empty() {
                        String::new()
                    } else {
                        format!(", {rule}")
                    }
                ));
            }
        }
    }
}

/// The stretches (from, to) in which `lease` had no holder, between its
/// first grant and its last.
pub fn gaps(history: &History, lease: &str) -> Vec<(u64, u64)> {
    let mut held: Vec<&Held> = history.held.iter().filter(|h| h.lease == lease).collect();
    held.sort_by_key(|h| h.from);
    let mut out = Vec::new();
    let mut covered_to = held.first().map_or(0, |h| h.to);
    for h in held.iter().skip(1) {
        if h.from > covered_to {
            out.push((covered_to, h.from));
        }
        covered_to = covered_to.max(h.to);
    }
    out
}

/// S4 (reads): per key, the reads and the writes that may have taken effect
/// are linearizable as one register that starts absent.
fn check_linearizable(history: &History, violations: &mut Vec<String>) {
    let mut keys: Vec<&str> = history.reads.iter().map(|r| r.key.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    for key in keys {
        let mut ids: HashMap<&str, u32> = HashMap::new();
        let mut ops: Vec<Op> = Vec::new();
        let mut described: Vec<String> = Vec::new();
        let reads: Vec<&Read> = history
            .reads
            .iter()
            .filter(|r| r.key == key && r.ok)
            .collect();
        let seen: std::collections::HashSet<&str> =
            reads.iter().filter_map(|r| r.value.as_deref()).collect();
        for write in history.writes.iter().filter(|w| w.key == key) {
            // A write refused for sure changed nothing; one of unknown
            // outcome that no read saw can be placed last, where it changes
            // nothing either, so only the seen ones matter.
            if write.surely_refused() || (!write.ok && !seen.contains(write.value.as_str())) {
                continue;
            }
            let id = ids.len() as u32;
            let id = *ids.entry(&write.value).or_insert(id);
            ops.push(Op {
                invoke: write.invoke,
                complete: if write.ok { write.complete } else { u64::MAX },
                kind: Kind::Write(id),
            });
            described.push(format!(
                "write {:?} (token {}, ok {})",
                write.value, write.token, write.ok
            ));
        }
        for read in reads {
            let seen = match read.value.as_deref() {
                None => None,
                Some(value) => match ids.get(value) {
                    Some(id) => Some(*id),
                    None => {
                        violations.push(format!(
                            "S4: a read of {key} returned {value:?}, which no write that may have succeeded wrote"
                        ));
                        continue;
                    }
                },
            };
            ops.push(Op {
                invoke: read.invoke,
                complete: read.complete,
                kind: Kind::Read(seen),
            });
            described.push(format!("read -> {:?}", read.value));
        }
        match linearizable::check(&ops) {
            Verdict::Linearizable => {}
            Verdict::Not { op } => violations.push(format!(
                "S4: reads of {key} are not linearizable ({} ops); no order can place: {} [{}..{}]",
                ops.len(),
                described[op],
                ops[op].invoke,
                ops[op].complete
            )),
            Verdict::Undecided { steps } => violations.push(format!(
                "S4: linearizability of {key} undecided after {steps} steps ({} ops)",
                ops.len()
            )),
        }
    }
}

/// How a lease fared after a fault healed.
#[derive(Debug, Clone, PartialEq)]
pub enum Recovery {
    /// Held again this long after the heal (0: held throughout).
    Within { lease: String, after_ns: u64 },
    /// Not held again within the bound.
    Late { lease: String, after_ns: u64 },
    /// The next fault started before the bound passed, with no holder yet.
    Interrupted { lease: String },
}

/// For every fault and lease: when the lease had a holder again after the
/// fault healed.
pub fn recoveries(history: &History, bound_ns: u64) -> Vec<(Fault, Recovery)> {
    let leases = history.leases();
    let mut faults = history.faults.clone();
    faults.sort_by_key(|f| f.from);
    let mut out = Vec::new();
    for (i, fault) in faults.iter().enumerate() {
        let next_fault = faults.get(i + 1).map_or(u64::MAX, |f| f.from);
        for lease in &leases {
            let held_again = history
                .held
                .iter()
                .filter(|h| h.lease == *lease && h.to >= fault.healed)
                .map(|h| h.from.saturating_sub(fault.healed))
                .min();
            let lease = (*lease).to_owned();
            let recovery = match held_again {
                Some(after_ns) if after_ns <= bound_ns => Recovery::Within { lease, after_ns },
                _ if next_fault < fault.healed + bound_ns => Recovery::Interrupted { lease },
                after => Recovery::Late {
                    lease,
                    after_ns: after.unwrap_or(u64::MAX - fault.healed),
                },
            };
            out.push((fault.clone(), recovery));
        }
    }
    out
}

/// What [`check_holders_ride_through`] holds the holders to.
#[derive(Debug, Clone, Copy)]
pub struct RideThrough {
    /// The faults a holder must ride through (the leader frozen, the leader
    /// cut off).
    pub kinds: &'static [&'static str],
    /// Only faults this short: the lease's ttl less an election and a round
    /// trip (the contract's L2 budget).
    pub budget_ns: u64,
    /// Only when the cluster had settled: the previous fault healed, and
    /// the holder got the lease, at least this long before.
    pub settled_ns: u64,
    /// A lease lost this long after the fault healed is lost to it too.
    pub after_ns: u64,
}

/// L2: a holder whose lease the cluster had settled keeps it through a
/// freeze or a cut of the leader shorter than the budget: no held interval
/// that began `settled_ns` before such a fault ends between the fault's
/// start and `after_ns` after it healed (or the next fault, if sooner).
/// The violations, and how many holders it checked (one per held interval
/// and qualifying fault).
pub fn check_holders_ride_through(history: &History, ride: RideThrough) -> (Vec<String>, usize) {
    let mut faults: Vec<&Fault> = history.faults.iter().collect();
    faults.sort_by_key(|f| f.from);
    let (mut violations, mut checked) = (Vec::new(), 0);
    for (i, fault) in faults.iter().enumerate() {
        let lasted = fault.healed.saturating_sub(fault.from);
        let previous_healed = i.checked_sub(1).map_or(0, |j| faults[j].healed);
        if !ride.kinds.contains(&fault.kind)
            || lasted > ride.budget_ns
            || fault.from < previous_healed + ride.settled_ns
        {
            continue;
        }
        let until = faults
            .get(i + 1)
            .map_or(u64::MAX, |next| next.from)
            .min(fault.healed + ride.after_ns);
        for h in &history.held {
            if h.from + ride.settled_ns <= fault.from && h.to > fault.from {
                checked += 1;
            }
            if h.from + ride.settled_ns <= fault.from && h.to > fault.from && h.to < until {
                violations.push(format!(
                    "L2: {} lost {} (token {}) {} ms into a {} of {} ms",
                    h.holder,
                    h.lease,
                    h.token,
                    (h.to - fault.from) / 1_000_000,
                    fault.kind,
                    lasted / 1_000_000
                ));
            }
        }
    }
    (violations, checked)
}
