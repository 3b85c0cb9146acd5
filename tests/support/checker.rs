//! The fault suite's checker: reads worker histories and the final gateway
//! state, and names every violation of S1-S4 and L1 it finds.
#![allow(dead_code)]

use std::collections::HashMap;

use serde::Deserialize;

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

/// Everything the checker reads.
#[derive(Debug, Default)]
pub struct History {
    pub held: Vec<Held>,
    pub writes: Vec<Write>,
    /// Final value of every key at the gateway (None: absent).
    pub finals: HashMap<String, Option<String>>,
}

impl History {
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
                other => panic!("unknown history op {other:?}"),
            }
        }
    }
}

/// Runs every check; returns the violations (empty: all properties hold).
pub fn check(history: &History, max_gap_ns: u64) -> Vec<String> {
    let mut violations = Vec::new();
    check_s1(history, &mut violations);
    check_s2(history, &mut violations);
    check_s3(history, &mut violations);
    check_s4(history, &mut violations);
    check_l1(history, max_gap_ns, &mut violations);
    violations
}

/// S1: an accepted write never carries a token below one accepted (and
/// acknowledged) before it was invoked, on the same lease.
fn check_s1(history: &History, violations: &mut Vec<String>) {
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
fn check_s2(history: &History, violations: &mut Vec<String>) {
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
fn check_s3(history: &History, violations: &mut Vec<String>) {
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
fn check_s4(history: &History, violations: &mut Vec<String>) {
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
/// between its first grant and its last.
fn check_l1(history: &History, max_gap_ns: u64, violations: &mut Vec<String>) {
    let mut by_lease: HashMap<&str, Vec<&Held>> = HashMap::new();
    for held in &history.held {
        by_lease.entry(&held.lease).or_default().push(held);
    }
    for (lease, mut grants) in by_lease {
        grants.sort_by_key(|h| h.from);
        let mut covered_to = grants[0].to;
        for held in &grants[1..] {
            if held.from > covered_to && held.from - covered_to > max_gap_ns {
                violations.push(format!(
                    "L1: {lease} had no holder for {} ms (bound {} ms)",
                    (held.from - covered_to) / 1_000_000,
                    max_gap_ns / 1_000_000
                ));
            }
            covered_to = covered_to.max(held.to);
        }
    }
}
