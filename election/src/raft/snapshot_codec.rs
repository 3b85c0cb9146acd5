//! The snapshot encoding: what snapshots are stored and sent as.
//!
//! JSON of the whole state costs ~250 bytes per lease and, sent as a JSON
//! array of numbers, ~4x that on the wire; past a few thousand leases a
//! snapshot outgrew every limit and a lagging follower could never catch up.
//! This encoding is a small JSON header (everything but the leases: the last
//! applied log id, the membership, the signing keys) followed by one compact
//! binary record per lease (~60 bytes plus its name and holder):
//!
//! ```text
//! "PALSNAP1" | u32 header length | header JSON | records...
//! record: u8 name length | name | u8 flags (1 holder, 2 secret, 4 revoked,
//!         8 extra, 16 owner, 32 history) | [u16 holder length | holder]
//!         | [u16 owner length | owner] | u64 token, ttl_ms,
//!         transitions, modify_index, grant_index | [32 bytes secret hash]
//!         | [u16 extra length | extra JSON] | [u8 count | transitions...]
//! transition: u8 cause (its place in `Cause::ALL`) | u64 index, token,
//!         at_ms (0: none) | u16 holder length (0: none) | holder
//! ```
//!
//! `extra` holds the rarely set fields (a grant's terms, a handover's
//! reservation, who preempted it, a lock-delay) as JSON, so a lease that
//! uses none of them costs nothing more.
//!
//! Integers are little-endian. [`decode`] also reads the JSON snapshots of
//! earlier versions, and refuses malformed input with an error (it comes
//! from an authenticated peer, but never panics on it).

use std::collections::VecDeque;
use std::io;

use palisade_names::{FencingToken, Holder, LeaseName};
use serde::{Deserialize, Serialize};

use super::applied::AppliedState;
use super::types::TypeConfig;
use crate::lease_table::command::{SecretHash, Terms};
use crate::lease_table::history::{Cause, Transition};
use crate::lease_table::record::LeaseRecord;
use crate::lease_table::table::LeaseTable;

const MAGIC: &[u8; 8] = b"PALSNAP1";
const HOLDER: u8 = 1;
const SECRET: u8 = 2;
const REVOKED: u8 = 4;
const EXTRA: u8 = 8;
const OWNER: u8 = 16;
const HISTORY: u8 = 32;

/// A record's rarely set fields (`extra` in the encoding).
#[derive(Default, PartialEq, Serialize, Deserialize)]
struct Extra {
    #[serde(default, skip_serializing_if = "Terms::is_default")]
    terms: Terms,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    reserved: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    preempted_by: Option<Holder>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    lock_delayed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    preempted_by_principal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reserved_principal: Option<String>,
}

impl Extra {
    fn of(record: &LeaseRecord) -> Self {
        Self {
            terms: record.terms,
            reserved: record.reserved,
            preempted_by: record.preempted_by.clone(),
            lock_delayed: record.lock_delayed,
            preempted_by_principal: record.preempted_by_principal.clone(),
            reserved_principal: record.reserved_principal.clone(),
        }
    }
}

/// Everything but the leases.
#[derive(Serialize, Deserialize)]
struct Header {
    last_applied: Option<openraft::alias::LogIdOf<TypeConfig>>,
    membership: openraft::alias::StoredMembershipOf<TypeConfig>,
    /// The table without its leases.
    table: LeaseTable,
    /// How many lease records follow.
    leases: u64,
}

fn bad(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("snapshot: {what}"))
}

/// Encodes `state`.
///
/// # Errors
/// A name or holder longer than the encoding allows (the API never admits
/// one), or a header that cannot be serialized.
pub fn encode(state: &AppliedState) -> io::Result<Vec<u8>> {
    let header = Header {
        last_applied: state.last_applied,
        membership: state.membership.clone(),
        table: state.table.clone_without_leases(),
        leases: state.table.leases.len() as u64,
    };
    let header = serde_json::to_vec(&header).map_err(bad)?;
    let mut out = Vec::with_capacity(16 + header.len() + state.table.leases.len() * 96);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&u32::try_from(header.len()).map_err(bad)?.to_le_bytes());
    out.extend_from_slice(&header);
    for (name, record) in &state.table.leases {
        let name = name.as_str().as_bytes();
        out.push(u8::try_from(name.len()).map_err(|_| bad("lease name too long"))?);
        out.extend_from_slice(name);
        let mut flags = 0;
        if record.holder.is_some() {
            flags |= HOLDER;
        }
        if record.secret.is_some() {
            flags |= SECRET;
        }
        if record.revoked {
            flags |= REVOKED;
        }
        if record.owner.is_some() {
            flags |= OWNER;
        }
        if !record.history.is_empty() {
            flags |= HISTORY;
        }
        let extra = Extra::of(record);
        let extra = if extra == Extra::default() {
            None
        } else {
            flags |= EXTRA;
            Some(serde_json::to_vec(&extra).map_err(bad)?)
        };
        out.push(flags);
        if let Some(holder) = &record.holder {
            put_text(&mut out, holder, "holder")?;
        }
        if let Some(owner) = &record.owner {
            put_text(&mut out, owner, "owner")?;
        }
        for n in [
            record.token.0,
            record.ttl_ms,
            record.transitions,
            record.modify_index,
            record.grant_index,
        ] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        if let Some(secret) = &record.secret {
            out.extend_from_slice(secret.bytes());
        }
        if let Some(extra) = extra {
            let len = u16::try_from(extra.len()).map_err(|_| bad("extra too long"))?;
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&extra);
        }
        if !record.history.is_empty() {
            write_history(&mut out, &record.history)?;
        }
    }
    Ok(out)
}

/// Appends a lease's history (see the module's layout).
fn write_history(out: &mut Vec<u8>, history: &VecDeque<Transition>) -> io::Result<()> {
    out.push(u8::try_from(history.len()).map_err(|_| bad("history too long"))?);
    for t in history {
        let cause = Cause::ALL.iter().position(|c| *c == t.cause).unwrap_or(0);
        out.push(cause as u8);
        for n in [t.index, t.token.0, t.at_ms.unwrap_or(0)] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        put_text(out, t.holder.as_deref().unwrap_or(""), "holder")?;
    }
    Ok(())
}

/// Appends `u16 length | text`.
fn put_text(out: &mut Vec<u8>, text: &str, what: &str) -> io::Result<()> {
    let len = u16::try_from(text.len()).map_err(|_| bad(format!("{what} too long")))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    Ok(())
}

/// Reads what [`write_history`] wrote.
fn read_history(reader: &mut Reader<'_>) -> io::Result<VecDeque<Transition>> {
    let count = reader.take(1)?[0] as usize;
    let mut history = VecDeque::with_capacity(count);
    for _ in 0..count {
        let cause = reader.take(1)?[0] as usize;
        let cause = *Cause::ALL
            .get(cause)
            .ok_or_else(|| bad(format!("unknown history cause {cause}")))?;
        let (index, token, at_ms) = (reader.u64()?, reader.u64()?, reader.u64()?);
        let holder = reader.text()?;
        history.push_back(Transition {
            index,
            at_ms: (at_ms != 0).then_some(at_ms),
            cause,
            holder: (!holder.is_empty())
                .then(|| Holder::stored(holder))
                .transpose()
                .map_err(bad)?,
            token: FencingToken(token),
        });
    }
    Ok(history)
}

/// Decodes what [`encode`] wrote, or an older JSON snapshot.
///
/// # Errors
/// [`io::ErrorKind::InvalidData`] naming what is wrong.
pub fn decode(bytes: &[u8]) -> io::Result<AppliedState> {
    let Some(body) = bytes.strip_prefix(MAGIC.as_slice()) else {
        let mut state: AppliedState = serde_json::from_slice(bytes).map_err(bad)?;
        state.table.index_owners();
        return Ok(state);
    };
    let mut reader = Reader(body);
    let header_len = u32::from_le_bytes(reader.array()?) as usize;
    let header: Header = serde_json::from_slice(reader.take(header_len)?).map_err(bad)?;
    let mut table = header.table;
    for _ in 0..header.leases {
        let (name, record) = read_record(&mut reader)?;
        if table.leases.insert(name, record).is_some() {
            return Err(bad("a lease appears twice"));
        }
    }
    if !reader.0.is_empty() {
        return Err(bad(format!(
            "{} bytes after the last lease",
            reader.0.len()
        )));
    }
    table.index_owners();
    Ok(AppliedState {
        last_applied: header.last_applied,
        membership: header.membership,
        table,
    })
}

/// Reads one lease record (see the module's layout).
fn read_record(reader: &mut Reader<'_>) -> io::Result<(LeaseName, LeaseRecord)> {
    let name_len = reader.take(1)?[0] as usize;
    let name = std::str::from_utf8(reader.take(name_len)?).map_err(bad)?;
    let name = LeaseName::new(name).map_err(bad)?;
    let flags = reader.take(1)?[0];
    let holder = if flags & HOLDER != 0 {
        Some(Holder::stored(reader.text()?).map_err(bad)?)
    } else {
        None
    };
    let owner = if flags & OWNER != 0 {
        Some(reader.text()?.to_owned())
    } else {
        None
    };
    let mut numbers = [0u64; 5];
    for n in &mut numbers {
        *n = reader.u64()?;
    }
    let [token, ttl_ms, transitions, modify_index, grant_index] = numbers;
    let secret = if flags & SECRET != 0 {
        Some(SecretHash::from_bytes(reader.array()?))
    } else {
        None
    };
    let extra: Extra = if flags & EXTRA != 0 {
        let len = u16::from_le_bytes(reader.array()?) as usize;
        serde_json::from_slice(reader.take(len)?).map_err(bad)?
    } else {
        Extra::default()
    };
    let history = if flags & HISTORY != 0 {
        read_history(reader)?
    } else {
        VecDeque::new()
    };
    let record = LeaseRecord {
        holder,
        token: FencingToken(token),
        ttl_ms,
        transitions,
        modify_index,
        grant_index,
        secret,
        revoked: flags & REVOKED != 0,
        terms: extra.terms,
        reserved: extra.reserved,
        preempted_by: extra.preempted_by,
        lock_delayed: extra.lock_delayed,
        preempted_by_principal: extra.preempted_by_principal,
        reserved_principal: extra.reserved_principal,
        owner,
        history,
    };
    Ok((name, record))
}

/// Reads from a byte slice, refusing to read past its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(bad("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u64(&mut self) -> io::Result<u64> {
        self.array().map(u64::from_le_bytes)
    }

    /// `u16 length | UTF-8 text`.
    fn text(&mut self) -> io::Result<&'a str> {
        let len = u16::from_le_bytes(self.array()?) as usize;
        std::str::from_utf8(self.take(len)?).map_err(bad)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::lease_table::command::Command;
    use palisade_names::GrantSecret;

    /// A state with `n` leases in every shape: held with a secret, free,
    /// revoked, and a grant from before secrets.
    pub(crate) fn state(n: u64) -> AppliedState {
        let mut state = AppliedState::default();
        state.table.apply(
            1,
            &Command::InstallKey {
                kid: "k1".into(),
                secret: crate::lease_table::command::KeySecret(vec![7; 32]),
            },
        );
        for i in 0..n {
            let name = LeaseName::new(&format!("lease-{i}")).expect("name");
            let secret = GrantSecret::new(&format!("{:0>43}", i)).expect("secret");
            state.table.leases.insert(
                name,
                LeaseRecord {
                    holder: (i % 3 != 0)
                        .then(|| Holder::new(&format!("holder-{i}")).expect("holder")),
                    token: FencingToken(i + 2),
                    ttl_ms: 1000 + i,
                    transitions: i * 2,
                    modify_index: i + 10,
                    grant_index: i + 2,
                    secret: (i % 2 == 0).then(|| SecretHash::of(&secret)),
                    revoked: i % 5 == 0,
                    // The rare fields, on a few records (each alone on some).
                    terms: Terms {
                        priority: u32::from(i % 41 == 1) * 3,
                        preemptible: i % 41 == 1,
                        lock_delay_ms: if i % 43 == 2 { 500 } else { 0 },
                        max_hold_ms: if i % 47 == 3 { 9_000 } else { 0 },
                    },
                    reserved: i % 53 == 4,
                    preempted_by: (i % 59 == 5)
                        .then(|| Holder::new(&format!("p-{i}")).expect("holder")),
                    lock_delayed: i % 61 == 6,
                    preempted_by_principal: (i % 59 == 5).then(|| format!("team-{i}")),
                    reserved_principal: (i % 53 == 4).then(|| format!("team-{i}")),
                    owner: (i % 4 != 3).then(|| format!("team-{}", i % 7)),
                    // A history of 0 to 8 transitions, every cause, some
                    // without a time or a holder.
                    history: (0..i % 9)
                        .map(|j| Transition {
                            index: i + j,
                            at_ms: (j % 3 != 0).then_some(1_700_000_000_000 + i),
                            cause: Cause::ALL[(i + j) as usize % Cause::ALL.len()],
                            holder: (j % 4 != 1)
                                .then(|| Holder::new(&format!("h-{j}")).expect("holder")),
                            token: FencingToken(i + j),
                        })
                        .collect(),
                },
            );
        }
        state.table.index_owners();
        state.last_applied = Some(
            serde_json::from_value(serde_json::json!({
                "leader_id": {"term": 3, "node_id": 1},
                "index": n + 10
            }))
            .expect("log id"),
        );
        state
    }

    #[test]
    fn a_state_reads_back_the_same() {
        for n in [0, 1, 7, 1000] {
            let state = state(n);
            let bytes = encode(&state).expect("encode");
            let back = decode(&bytes).expect("decode");
            assert_eq!(back.table, state.table, "{n} leases");
            assert_eq!(back.last_applied, state.last_applied);
            assert_eq!(back.membership, state.membership);
        }
    }

    #[test]
    fn it_is_much_smaller_than_json() {
        let state = state(1000);
        let binary = encode(&state).expect("encode").len();
        let json = serde_json::to_vec(&state).expect("json").len();
        assert!(binary * 2 < json, "binary {binary} bytes, JSON {json}");
    }

    #[test]
    fn older_json_snapshots_still_read() {
        let state = state(5);
        let json = serde_json::to_vec(&state).expect("json");
        assert_eq!(decode(&json).expect("decode").table, state.table);
    }

    #[test]
    fn malformed_input_is_an_error_never_a_panic() {
        let bytes = encode(&state(20)).expect("encode");
        for cut in [0, 5, 8, 11, 12, 40, bytes.len() - 1] {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(decode(&extra).is_err(), "trailing bytes");
        // Every single-byte corruption decodes to an error or a state; none panics.
        for i in 0..bytes.len() {
            let mut corrupt = bytes.clone();
            corrupt[i] ^= 0xa5;
            let _ = decode(&corrupt);
        }
        // A bad name inside a record is refused.
        let mut bad_name = bytes;
        let at = bad_name
            .windows(7)
            .position(|w| w == b"lease-0")
            .expect("a name");
        bad_name[at] = b'/';
        assert!(decode(&bad_name).is_err());
    }
}
