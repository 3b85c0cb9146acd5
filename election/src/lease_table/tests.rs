//! Tests of apply: every command, and a property test of apply as a whole.
use std::collections::HashMap;

use proptest::prelude::*;

use super::command::*;
use super::record::*;
use super::table::*;
use palisade_names::{FencingToken, LeaseName};

fn name(lease: &str) -> LeaseName {
    LeaseName::new(lease).expect("lease name")
}

fn acquire(lease: &str, holder: &str) -> Command {
    Command::Acquire {
        lease: name(lease),
        holder: holder.into(),
        ttl_ms: 1000,
        secret: None,
        terms: Terms::default(),
        preempt: false,
        delay_seen: None,
        principal: None,
    }
}

#[test]
fn grant_is_idempotent_for_the_holder_and_refused_to_others() {
    let mut table = LeaseTable::default();
    assert_eq!(
        table.apply(5, &acquire("a", "x")),
        CommandResult::Granted {
            token: FencingToken(5),
            ttl_ms: 1000,
            new_grant: true,
            grant_index: 5
        }
    );
    assert_eq!(
        table.apply(6, &acquire("a", "x")),
        CommandResult::Granted {
            token: FencingToken(5),
            ttl_ms: 1000,
            new_grant: false,
            grant_index: 6
        }
    );
    assert_eq!(
        table.apply(7, &acquire("a", "y")),
        CommandResult::Held {
            holder: "x".into(),
            token: FencingToken(5)
        }
    );
    let release = |holder: &str, token| Command::Release {
        lease: name("a"),
        holder: holder.into(),
        token: FencingToken(token),
        grant_index: None,
        secret: None,
    };
    assert_eq!(table.apply(8, &release("y", 5)), CommandResult::Lost);
    assert_eq!(table.apply(9, &release("x", 4)), CommandResult::Lost);
    assert_eq!(table.apply(10, &release("x", 5)), CommandResult::Freed);
    assert_eq!(
        table.apply(11, &acquire("a", "y")),
        CommandResult::Granted {
            token: FencingToken(11),
            ttl_ms: 1000,
            new_grant: true,
            grant_index: 11
        }
    );
    assert_eq!(table.leases["a"].transitions, 3);
}

#[test]
fn a_release_from_a_replaced_handle_frees_nothing() {
    // x acquires (index 5), acquires again (index 8: same token, a new
    // handle); the first handle's late release must not free the second.
    let mut table = LeaseTable::default();
    table.apply(5, &acquire("a", "x"));
    table.apply(8, &acquire("a", "x"));
    let release = |grant_index| Command::Release {
        lease: name("a"),
        holder: "x".into(),
        token: FencingToken(5),
        grant_index,
        secret: None,
    };
    assert_eq!(table.apply(9, &release(Some(5))), CommandResult::Lost);
    assert_eq!(table.leases["a"].holder.as_deref(), Some("x"));
    assert_eq!(table.apply(10, &release(Some(8))), CommandResult::Freed);
    // Without a grant index (older clients) the token alone decides.
    table.apply(11, &acquire("a", "x"));
    assert_eq!(table.apply(12, &release(None)), CommandResult::Lost);
    let release11 = Command::Release {
        lease: name("a"),
        holder: "x".into(),
        token: FencingToken(11),
        grant_index: None,
        secret: None,
    };
    assert_eq!(table.apply(13, &release11), CommandResult::Freed);
}

#[test]
fn only_the_secret_opens_a_grant_and_a_repeat_never_shortens_it() {
    let secret = |c: &str| {
        Some(SecretHash::of(
            &palisade_names::GrantSecret::new(&c.repeat(32)).expect("secret"),
        ))
    };
    let acquire = |holder: &str, ttl_ms, s| Command::Acquire {
        lease: name("a"),
        holder: holder.into(),
        ttl_ms,
        secret: s,
        terms: Terms::default(),
        preempt: false,
        delay_seen: None,
        principal: None,
    };
    let mut table = LeaseTable::default();
    table.apply(5, &acquire("x", 60_000, secret("k")));
    // Everything GET shows (holder, token) and the grant index, without
    // the secret: no repeat, no release, no shorter ttl.
    for thief in [None, secret("j")] {
        assert_eq!(
            table.apply(6, &acquire("x", 1000, thief)),
            CommandResult::Held {
                holder: "x".into(),
                token: FencingToken(5)
            }
        );
        let release = Command::Release {
            lease: name("a"),
            holder: "x".into(),
            token: FencingToken(5),
            grant_index: Some(5),
            secret: thief,
        };
        assert_eq!(table.apply(7, &release), CommandResult::Lost);
    }
    assert_eq!(table.leases["a"].ttl_ms, 60_000);
    assert_eq!(table.leases["a"].holder.as_deref(), Some("x"));
    // The holder itself, with a shorter ttl: the same grant, the longer ttl.
    assert_eq!(
        table.apply(8, &acquire("x", 1000, secret("k"))),
        CommandResult::Granted {
            token: FencingToken(5),
            ttl_ms: 60_000,
            new_grant: false,
            grant_index: 8
        }
    );
    let release = Command::Release {
        lease: name("a"),
        holder: "x".into(),
        token: FencingToken(5),
        grant_index: Some(8),
        secret: secret("k"),
    };
    assert_eq!(table.apply(9, &release), CommandResult::Freed);
}

#[test]
fn a_revoked_grant_is_held_until_it_expires_and_never_extended() {
    let mut table = LeaseTable::default();
    table.apply(3, &acquire("a", "x"));
    let revoke = |token| Command::Revoke {
        lease: name("a"),
        token: FencingToken(token),
    };
    assert_eq!(table.apply(4, &revoke(2)), CommandResult::Lost);
    assert_eq!(table.apply(5, &revoke(3)), CommandResult::Revoked);
    assert_eq!(table.leases["a"].holder.as_deref(), Some("x"));
    assert!(matches!(
        table.apply(6, &acquire("a", "x")),
        CommandResult::Held { .. }
    ));
    let expire = Command::Expire {
        lease: name("a"),
        token: FencingToken(3),
        unclaimed: false,
    };
    assert_eq!(table.apply(7, &expire), CommandResult::Freed);
    assert!(matches!(
        table.apply(8, &acquire("a", "x")),
        CommandResult::Granted {
            new_grant: true,
            ..
        }
    ));
    assert!(!table.leases["a"].revoked, "a new grant starts unrevoked");
}

#[test]
fn reclaim_forgets_only_free_unchanged_leases_and_tokens_keep_rising() {
    let mut table = LeaseTable::default();
    table.apply(3, &acquire("a", "x"));
    table.apply(4, &acquire("b", "x"));
    let release = Command::Release {
        lease: name("a"),
        holder: "x".into(),
        token: FencingToken(3),
        grant_index: None,
        secret: None,
    };
    assert_eq!(table.apply(5, &release), CommandResult::Freed);
    let reclaim = |leases: &[(&str, u64)]| Command::Reclaim {
        leases: leases.iter().map(|(l, m)| (name(l), *m)).collect(),
    };
    // Held, or changed since the index named: left alone.
    table.apply(6, &reclaim(&[("b", 4), ("a", 3), ("nope", 1)]));
    assert!(table.leases.contains_key("a") && table.leases.contains_key("b"));
    table.apply(7, &reclaim(&[("a", 5)]));
    assert!(!table.leases.contains_key("a"), "free and unchanged: gone");
    // The next grant's token is still above every earlier one.
    assert!(matches!(
        table.apply(8, &acquire("a", "y")),
        CommandResult::Granted {
            token: FencingToken(8),
            new_grant: true,
            ..
        }
    ));
}

#[test]
fn expire_frees_only_the_grant_it_names() {
    let mut table = LeaseTable::default();
    table.apply(3, &acquire("a", "x"));
    let expire = |token| Command::Expire {
        lease: name("a"),
        token: FencingToken(token),
        unclaimed: false,
    };
    assert_eq!(table.apply(4, &expire(2)), CommandResult::Lost);
    assert_eq!(table.leases["a"].holder.as_deref(), Some("x"));
    assert_eq!(table.apply(5, &expire(3)), CommandResult::Freed);
    assert_eq!(table.apply(6, &expire(3)), CommandResult::Lost);
    assert_eq!(table.leases["a"].holder, None);
}

fn acquire_with(holder: &str, secret: u8, terms: Terms, preempt: bool) -> Command {
    Command::Acquire {
        lease: name("a"),
        holder: holder.into(),
        ttl_ms: 1000,
        secret: Some(SecretHash::from_bytes([secret; 32])),
        terms,
        preempt,
        delay_seen: None,
        principal: None,
    }
}

#[test]
fn a_handover_reserves_a_higher_token_that_only_the_successor_takes() {
    let mut table = LeaseTable::default();
    table.apply(5, &acquire_with("x", 1, Terms::default(), false));
    let handover = |holder: &str, token, secret: u8, to: &str| Command::Handover {
        lease: name("a"),
        holder: holder.into(),
        token: FencingToken(token),
        secret: Some(SecretHash::from_bytes([secret; 32])),
        to: to.into(),
        to_principal: None,
        window_ms: 3000,
    };
    // Only the holder, with its token and secret, hands over.
    assert_eq!(
        table.apply(6, &handover("x", 5, 9, "y")),
        CommandResult::Lost
    );
    assert_eq!(
        table.apply(7, &handover("x", 4, 1, "y")),
        CommandResult::Lost
    );
    assert_eq!(
        table.apply(8, &handover("z", 5, 1, "y")),
        CommandResult::Lost
    );
    assert_eq!(
        table.apply(9, &handover("x", 5, 1, "y")),
        CommandResult::HandedOver {
            token: FencingToken(9)
        }
    );
    let record = &table.leases["a"];
    assert!(record.reserved_for("y", None) && record.ttl_ms == 3000);
    // The old holder can neither renew, release nor hand over again; a
    // third party is told the lease is y's; a release naming y without
    // a secret opens nothing (the reservation has none yet).
    assert_eq!(
        table.apply(10, &handover("x", 5, 1, "z")),
        CommandResult::Lost
    );
    assert!(matches!(
        table.apply(11, &acquire_with("z", 3, Terms::default(), true)),
        CommandResult::Held { holder, .. } if holder == "y"
    ));
    let release = Command::Release {
        lease: name("a"),
        holder: "y".into(),
        token: FencingToken(9),
        grant_index: None,
        secret: None,
    };
    assert_eq!(table.apply(12, &release), CommandResult::Lost);
    // y takes it with its own secret and ttl: the handover's token.
    assert_eq!(
        table.apply(13, &acquire_with("y", 2, Terms::default(), false)),
        CommandResult::Granted {
            token: FencingToken(9),
            ttl_ms: 1000,
            new_grant: true,
            grant_index: 13
        }
    );
    let record = &table.leases["a"];
    assert!(!record.reserved && record.opens(Some(&SecretHash::from_bytes([2; 32]))));
    // A handover to y that y never takes expires like a grant.
    table.apply(14, &handover("y", 9, 2, "w"));
    assert_eq!(
        table.apply(
            15,
            &Command::Expire {
                lease: name("a"),
                token: FencingToken(14),
                unclaimed: true,
            }
        ),
        CommandResult::Freed
    );
    assert!(table.leases["a"].holder.is_none() && !table.leases["a"].lock_delayed);
}

/// The leader proposes the Expire of a reservation nobody has claimed;
/// the successor's claim (which keeps the reserved token) commits first.
/// The Expire must leave the claimed grant alone: the successor was told
/// it holds the lease.
#[test]
fn an_expiry_of_an_unclaimed_reservation_spares_a_claim_that_came_first() {
    let mut table = LeaseTable::default();
    table.apply(5, &acquire_with("x", 1, Terms::default(), false));
    table.apply(
        6,
        &Command::Handover {
            lease: name("a"),
            holder: "x".into(),
            token: FencingToken(5),
            secret: Some(SecretHash::from_bytes([1; 32])),
            to: "y".into(),
            to_principal: None,
            window_ms: 3000,
        },
    );
    let claimed = table.apply(7, &acquire_with("y", 2, Terms::default(), false));
    assert!(matches!(
        claimed,
        CommandResult::Granted {
            token: FencingToken(6),
            ..
        }
    ));
    let late = Command::Expire {
        lease: name("a"),
        token: FencingToken(6),
        unclaimed: true,
    };
    assert_eq!(table.apply(8, &late), CommandResult::Lost);
    assert_eq!(table.leases["a"].holder.as_deref(), Some("y"));
    // The claimed grant's own expiry (proposed as such) still applies.
    let own = Command::Expire {
        lease: name("a"),
        token: FencingToken(6),
        unclaimed: false,
    };
    assert_eq!(table.apply(9, &own), CommandResult::Freed);
}

/// A waiting acquire of lease "a" by "higher" (secret 4) at priority 9.
fn higher_candidate(high: Terms) -> Command {
    let terms = Terms {
        priority: 9,
        ..high
    };
    acquire_with("higher", 4, terms, true)
}

/// A release of lease "a" by `holder` with `token` and secret byte `secret`.
fn release_of(holder: &str, token: u64, secret: u8) -> Command {
    Command::Release {
        lease: name("a"),
        holder: holder.into(),
        token: FencingToken(token),
        grant_index: None,
        secret: Some(SecretHash::from_bytes([secret; 32])),
    }
}

#[test]
fn a_waiting_higher_priority_preempts_only_a_preemptible_grant() {
    let low = Terms {
        priority: 1,
        preemptible: true,
        ..Terms::default()
    };
    let high = Terms {
        priority: 5,
        ..Terms::default()
    };
    let mut table = LeaseTable::default();
    table.apply(5, &acquire_with("low", 1, low, false));
    // Equal priority never preempts (stickiness); nor does a caller
    // that does not wait.
    let same = Terms {
        priority: 1,
        ..Terms::default()
    };
    assert!(matches!(
        table.apply(6, &acquire_with("same", 2, same, true)),
        CommandResult::Held { .. }
    ));
    assert!(matches!(
        table.apply(7, &acquire_with("high", 3, high, false)),
        CommandResult::Held { .. }
    ));
    assert_eq!(
        table.apply(8, &acquire_with("high", 3, high, true)),
        CommandResult::Preempting {
            holder: "low".into(),
            token: FencingToken(5)
        }
    );
    let record = &table.leases["a"];
    assert!(record.revoked && record.preempted_by.as_deref() == Some("high"));
    assert_eq!(record.holder.as_deref(), Some("low"), "until it ends");
    // Preempted once: a second candidate only waits.
    assert!(matches!(
        table.apply(9, &higher_candidate(high)),
        CommandResult::Held { .. }
    ));
    // The preempted holder's release ends its grant at once and reserves
    // the lease for the preemptor, with a higher token: a third party
    // (or the old holder campaigning again) finds it held; the
    // preemptor's acquire takes it, with its own secret and ttl.
    assert_eq!(
        table.apply(10, &release_of("low", 5, 1)),
        CommandResult::Freed
    );
    let record = &table.leases["a"];
    assert!(record.reserved_for("high", None) && record.preempted_by.is_none());
    assert_eq!(record.ttl_ms, PREEMPTION_RESERVATION_MS);
    assert!(matches!(
        table.apply(11, &acquire_with("low", 1, low, false)),
        CommandResult::Held { .. }
    ));
    assert_eq!(
        table.apply(12, &acquire_with("high", 3, high, true)),
        CommandResult::Granted {
            token: FencingToken(10),
            ttl_ms: 1000,
            new_grant: true,
            grant_index: 12
        }
    );
    table.apply(13, &release_of("high", 10, 3));
    assert!(table.leases["a"].holder.is_none());
    // A grant that is not preemptible is not preempted by anyone.
    table.apply(14, &acquire_with("high", 3, high, false));
    assert!(matches!(
        table.apply(15, &higher_candidate(high)),
        CommandResult::Held { .. }
    ));
}

/// An acquire proposed while the lease looked held (or free without a
/// delay) must not take a lease that an expiry applied in between left
/// lock-delayed; one that saw that very delay pass may; entries from
/// before the check (`None`) apply as they did.
#[test]
fn an_acquire_that_did_not_see_the_lock_delay_pass_is_refused() {
    let delayed = Terms {
        lock_delay_ms: 2000,
        ..Terms::default()
    };
    let mut table = LeaseTable::default();
    table.apply(5, &acquire_with("x", 1, delayed, false));
    table.apply(
        6,
        &Command::Expire {
            lease: name("a"),
            token: FencingToken(5),
            unclaimed: false,
        },
    );
    let acquire = |seen| Command::Acquire {
        lease: name("a"),
        holder: "y".into(),
        ttl_ms: 1000,
        secret: Some(SecretHash::from_bytes([2; 32])),
        terms: Terms::default(),
        preempt: false,
        delay_seen: seen,
        principal: None,
    };
    assert_eq!(
        table.apply(7, &acquire(Some(0))),
        CommandResult::LockDelayed
    );
    assert_eq!(
        table.apply(8, &acquire(Some(3))),
        CommandResult::LockDelayed
    );
    assert!(table.leases["a"].holder.is_none() && table.leases["a"].lock_delayed);
    assert!(matches!(
        table.apply(9, &acquire(Some(6))),
        CommandResult::Granted {
            token: FencingToken(9),
            ..
        }
    ));
    let mut replayed = LeaseTable::default();
    replayed.apply(5, &acquire_with("x", 1, delayed, false));
    replayed.apply(
        6,
        &Command::Expire {
            lease: name("a"),
            token: FencingToken(5),
            unclaimed: false,
        },
    );
    assert!(matches!(
        replayed.apply(7, &acquire(None)),
        CommandResult::Granted { .. }
    ));
}

#[test]
fn only_an_expiry_leaves_a_lock_delay() {
    let delayed = Terms {
        lock_delay_ms: 2000,
        ..Terms::default()
    };
    let mut table = LeaseTable::default();
    table.apply(5, &acquire_with("x", 1, delayed, false));
    let expire = |token| Command::Expire {
        lease: name("a"),
        token: FencingToken(token),
        unclaimed: false,
    };
    assert_eq!(table.apply(6, &expire(5)), CommandResult::Freed);
    assert!(table.leases["a"].lock_delayed);
    table.apply(7, &acquire_with("y", 2, delayed, false));
    assert!(!table.leases["a"].lock_delayed, "a grant clears it");
    let release = Command::Release {
        lease: name("a"),
        holder: "y".into(),
        token: FencingToken(7),
        grant_index: None,
        secret: Some(SecretHash::from_bytes([2; 32])),
    };
    assert_eq!(table.apply(8, &release), CommandResult::Freed);
    assert!(!table.leases["a"].lock_delayed, "a clean release has none");
}

/// A table snapshotted before leases were keyed by `LeaseName` and tokens
/// were `FencingToken`s reads back, and writes out the same bytes.
#[test]
fn the_snapshot_format_is_unchanged() {
    let old = r#"{"leases":{"jobs":{"holder":"w-1","token":7,"ttl_ms":1500,"transitions":1,"modify_index":7,"grant_index":9}},"signing_key":{"kid":"k1","secret":[1,2]}}"#;
    let table: LeaseTable = serde_json::from_str(old).expect("old snapshot");
    assert_eq!(table.leases["jobs"].token, FencingToken(7));
    assert_eq!(serde_json::to_string(&table).expect("encode"), old);
    // Before `grant_index` existed.
    let older = r#"{"leases":{"jobs":{"holder":null,"token":7,"ttl_ms":1500,"transitions":2,"modify_index":8}},"signing_key":null}"#;
    let table: LeaseTable = serde_json::from_str(older).expect("older snapshot");
    assert_eq!(table.leases["jobs"].grant_index, 0);
}

#[test]
fn a_rotated_key_is_published_until_retired_and_the_current_one_never_is() {
    let mut table = LeaseTable::default();
    let secret = crate::lease_table::command::KeySecret(vec![1; 32]);
    table.apply(
        1,
        &Command::InstallKey {
            kid: "k1".into(),
            secret: secret.clone(),
        },
    );
    let rotate = |kid: &str| Command::RotateKey {
        kid: kid.into(),
        secret: secret.clone(),
    };
    table.apply(2, &rotate("k2"));
    table.apply(3, &rotate("k3"));
    table.apply(4, &rotate("k3"));
    let kids = |t: &LeaseTable| {
        t.published_keys()
            .map(|k| k.kid.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(kids(&table), ["k3", "k2", "k1"]);
    table.apply(5, &Command::RetireKey { kid: "k1".into() });
    table.apply(6, &Command::RetireKey { kid: "k3".into() });
    assert_eq!(
        kids(&table),
        ["k3", "k2"],
        "the signing key is never retired"
    );
}

#[test]
fn the_first_key_stays() {
    let mut table = LeaseTable::default();
    let install = |kid: &str| Command::InstallKey {
        kid: kid.into(),
        secret: crate::lease_table::command::KeySecret(vec![1; 32]),
    };
    table.apply(1, &install("k1"));
    table.apply(2, &install("k2"));
    assert_eq!(
        table.signing_key.as_ref().map(|k| k.kid.as_str()),
        Some("k1")
    );
}

fn command() -> impl Strategy<Value = Command> {
    let lease = prop::sample::select(vec!["a", "b"]);
    let holder = prop::sample::select(vec!["x", "y", "z"]);
    prop_oneof![
        (lease.clone(), holder.clone()).prop_map(|(l, h)| acquire(l, h)),
        // With terms: preemption (and its reservation), lock-delays, and
        // the delay an acquire saw pass.
        (
            lease.clone(),
            holder.clone(),
            (
                0u32..3,
                any::<bool>(),
                prop::sample::select(vec![0u64, 1000])
            ),
            any::<bool>(),
            prop::option::of(0u64..40),
            prop::sample::select(vec![None, Some("p"), Some("q")]),
        )
            .prop_map(
                |(l, h, (priority, preemptible, lock_delay_ms), preempt, seen, principal)| {
                    Command::Acquire {
                        lease: name(l),
                        holder: h.into(),
                        ttl_ms: 1000,
                        secret: None,
                        terms: Terms {
                            priority,
                            preemptible,
                            lock_delay_ms,
                            ..Terms::default()
                        },
                        preempt,
                        delay_seen: seen,
                        principal: principal.map(str::to_owned),
                    }
                }
            ),
        (lease.clone(), holder, 0u64..40, prop::option::of(0u64..40)).prop_map(|(l, h, t, g)| {
            Command::Release {
                lease: name(l),
                holder: h.into(),
                token: FencingToken(t),
                grant_index: g,
                secret: None,
            }
        }),
        (lease.clone(), 0u64..40, any::<bool>()).prop_map(|(l, t, u)| Command::Expire {
            lease: name(l),
            token: FencingToken(t),
            unclaimed: u,
        }),
        (lease, 0u64..40).prop_map(|(l, m)| Command::Reclaim {
            leases: vec![(name(l), m)],
        }),
    ]
}

proptest! {
    /// Tokens strictly increase per lease over grants, a grant never goes
    /// to a second holder while the first holds, and replaying the same log
    /// gives the same table (determinism).
    #[test]
    fn tokens_increase_and_holders_are_exclusive(commands in prop::collection::vec(command(), 1..200)) {
        let mut table = LeaseTable::default();
        let mut last_token: HashMap<LeaseName, FencingToken> = HashMap::new();
        for (i, command) in commands.iter().enumerate() {
            let index = i as u64 + 1;
            let before = table.clone();
            let result = table.apply(index, command);
            // The count of records per owner stays what the records say.
            let mut recounted = table.clone();
            recounted.index_owners();
            prop_assert_eq!(&recounted, &table, "owner counts drifted");
            if let Command::Reclaim { leases } = command {
                for (lease, _) in leases {
                    let held = before.leases.get(lease).is_some_and(|r| r.holder.is_some());
                    prop_assert!(!held || table.leases.contains_key(lease), "reclaimed a held lease");
                }
            }
            if let (Command::Acquire { lease, holder, .. }, CommandResult::Granted { token, new_grant, .. }) = (command, &result) {
                let previous = before.leases.get(lease).and_then(|r| r.holder.clone());
                if *new_grant {
                    // A reservation (handover, preemption) is taken by
                    // its claimant with the reserved token.
                    let principal = match command {
                        Command::Acquire { principal, .. } => principal.as_deref(),
                        _ => None,
                    };
                    let claimed = before.leases.get(lease).is_some_and(|r| r.reserved_for(holder, principal));
                    if !claimed {
                        prop_assert_eq!(previous, None, "granted while held");
                    }
                    let last = last_token.insert(lease.clone(), *token).unwrap_or_default();
                    prop_assert!(*token > last, "token {} not above {}", token, last);
                } else {
                    prop_assert_eq!(previous.as_deref(), Some(holder.as_str()));
                }
            }
        }
        let mut replay = LeaseTable::default();
        for (i, command) in commands.iter().enumerate() {
            replay.apply(i as u64 + 1, command);
        }
        prop_assert_eq!(replay, table);
    }
}

/// An acquire of lease "a" by `holder` with secret byte `secret`, calling as
/// `principal`, waiting (so it may preempt) with `priority`.
fn acquire_as(holder: &str, secret: u8, principal: &str, priority: u32) -> Command {
    Command::Acquire {
        lease: name("a"),
        holder: holder.into(),
        ttl_ms: 1000,
        secret: Some(SecretHash::from_bytes([secret; 32])),
        terms: Terms {
            priority,
            preemptible: true,
            ..Terms::default()
        },
        preempt: priority > 0,
        delay_seen: None,
        principal: Some(principal.into()),
    }
}

#[test]
fn a_reservation_opens_only_to_the_named_principal() {
    let mut table = LeaseTable::default();
    table.apply(5, &acquire_as("x", 1, "team", 0));
    let handover = Command::Handover {
        lease: name("a"),
        holder: "x".into(),
        token: FencingToken(5),
        secret: Some(SecretHash::from_bytes([1; 32])),
        to: "y".into(),
        to_principal: Some("team".into()),
        window_ms: 3000,
    };
    assert!(matches!(
        table.apply(6, &handover),
        CommandResult::HandedOver { .. }
    ));
    // Another principal naming the successor is told the lease is held.
    assert!(matches!(
        table.apply(7, &acquire_as("y", 2, "intruder", 0)),
        CommandResult::Held { .. }
    ));
    assert!(matches!(
        table.apply(8, &acquire_as("y", 3, "team", 0)),
        CommandResult::Granted {
            token: FencingToken(6),
            new_grant: true,
            ..
        }
    ));

    // A preemption's reservation is the preemptor principal's.
    assert!(matches!(
        table.apply(9, &acquire_as("boss", 4, "ops", 10)),
        CommandResult::Preempting { .. }
    ));
    let release = Command::Release {
        lease: name("a"),
        holder: "y".into(),
        token: FencingToken(6),
        grant_index: None,
        secret: Some(SecretHash::from_bytes([3; 32])),
    };
    assert_eq!(table.apply(10, &release), CommandResult::Freed);
    assert!(table.leases["a"].reserved_for("boss", Some("ops")));
    assert!(!table.leases["a"].reserved_for("boss", Some("intruder")));
    assert!(matches!(
        table.apply(11, &acquire_as("boss", 5, "intruder", 10)),
        CommandResult::Held { .. }
    ));
    assert!(matches!(
        table.apply(12, &acquire_as("boss", 4, "ops", 10)),
        CommandResult::Granted {
            token: FencingToken(10),
            ..
        }
    ));
}

#[test]
fn the_history_records_every_cause_with_its_stamp_and_keeps_the_last_few() {
    use super::history::{Cause, HISTORY_LEN};
    let low = Terms {
        priority: 1,
        preemptible: true,
        ..Terms::default()
    };
    let high = Terms {
        priority: 5,
        ..Terms::default()
    };
    let handover = Command::Handover {
        lease: name("a"),
        holder: "high".into(),
        token: FencingToken(10),
        secret: Some(SecretHash::from_bytes([3; 32])),
        to: "succ".into(),
        to_principal: None,
        window_ms: 3000,
    };
    let expire = |token, unclaimed| Command::Expire {
        lease: name("a"),
        token: FencingToken(token),
        unclaimed,
    };
    let revoke = Command::Revoke {
        lease: name("a"),
        token: FencingToken(15),
    };
    let mut table = LeaseTable::default();
    let steps = [
        (5, acquire_with("low", 1, low, false)),
        (7, acquire_with("other", 2, low, false)), // held: no transition
        (8, acquire_with("high", 3, high, true)),
        (10, release_of("low", 5, 1)),
        (12, acquire_with("high", 3, high, true)),
        (13, handover),
        (14, expire(13, true)),
        (15, acquire_with("x", 6, Terms::default(), false)),
        (16, revoke),
        (17, expire(15, false)),
    ];
    for (index, command) in steps {
        table.apply(index, &command.stamped(1_000 + index));
    }
    let history = &table.leases["a"].history;
    let seen: Vec<(u64, Cause, Option<&str>, u64)> = history
        .iter()
        .map(|t| (t.index, t.cause, t.holder.as_deref(), t.token.0))
        .collect();
    assert_eq!(
        history.len(),
        HISTORY_LEN,
        "the oldest (low's acquire) dropped out"
    );
    assert_eq!(
        seen,
        vec![
            (8, Cause::Preempt, Some("low"), 5),
            (10, Cause::Release, Some("low"), 5),
            (12, Cause::Claim, Some("high"), 10),
            (13, Cause::Handover, Some("succ"), 13),
            (14, Cause::Expire, Some("succ"), 13),
            (15, Cause::Acquire, Some("x"), 15),
            (16, Cause::Revoke, Some("x"), 15),
            (17, Cause::Expire, Some("x"), 15),
        ]
    );
    assert!(history.iter().all(|t| t.at_ms == Some(1_000 + t.index)));
    // A bare (older) entry has no time; the history survives the snapshot.
    table.apply(18, &acquire_with("y", 7, Terms::default(), false));
    assert_eq!(table.leases["a"].history.back().and_then(|t| t.at_ms), None);
    let state = crate::raft::applied::AppliedState {
        table: table.clone(),
        ..Default::default()
    };
    let bytes = crate::raft::snapshot_codec::encode(&state).expect("encode");
    let decoded = crate::raft::snapshot_codec::decode(&bytes).expect("decode");
    assert_eq!(decoded.table.leases["a"].history, table.leases["a"].history);
}

/// The history's bound travels in each entry (`Command::Stamped`), so two
/// nodes applying the same log keep the same history whatever their own
/// `--history-len`: a leader with 3 stamps 3, the next with 5 stamps 5,
/// and entries from before the flag keep the default 8.
#[test]
fn the_history_is_trimmed_by_the_bound_each_entry_carries_alike_on_every_node() {
    use super::history::HISTORY_LEN;
    let mut log = Vec::new();
    let mut index = 0;
    let mut churn = |log: &mut Vec<Command>, bound: Option<u16>, rounds: u64| {
        for _ in 0..rounds {
            for command in [acquire_with("w", 1, Terms::default(), false), {
                index += 2;
                release_of("w", index - 1, 1)
            }] {
                let stamped = match bound {
                    Some(n) => command.stamped_with(1_000 + index, Some(n)),
                    None => command.stamped(1_000 + index),
                };
                log.push(stamped);
            }
        }
    };
    churn(&mut log, None, 6);
    let old_entries = log.len();
    churn(&mut log, Some(3), 2);
    churn(&mut log, Some(5), 4);
    // One node applies the entries as proposed, the other as it reads them
    // back from its log (JSON), as a follower or a restart does.
    let mut leader = LeaseTable::default();
    let mut follower = LeaseTable::default();
    let mut lengths = Vec::new();
    for (i, command) in log.iter().enumerate() {
        let index = i as u64 + 1;
        leader.apply(index, command);
        let stored = serde_json::to_vec(command).expect("encode");
        let read: Command = serde_json::from_slice(&stored).expect("decode");
        follower.apply(index, &read);
        lengths.push(leader.leases["a"].history.len());
        assert_eq!(leader.leases["a"].history, follower.leases["a"].history);
    }
    assert_eq!(
        lengths[old_entries - 1],
        HISTORY_LEN,
        "unbounded entries keep 8"
    );
    assert_eq!(lengths[old_entries], 3, "a lower bound trims at once");
    assert_eq!(
        *lengths.last().expect("some"),
        5,
        "a higher one lets it grow"
    );
    // An entry written before the bound existed reads back without one.
    let old = r#"{"Stamped":{"at_ms":5,"command":{"RetireKey":{"kid":"k"}}}}"#;
    let old: Command = serde_json::from_str(old).expect("an old entry still reads");
    assert_eq!(old.unstamped().0.history_len(), HISTORY_LEN);
}

#[test]
fn a_history_of_the_largest_bound_survives_the_snapshot() {
    use super::history::MAX_HISTORY_LEN;
    let bound = u16::try_from(MAX_HISTORY_LEN).expect("fits");
    let mut table = LeaseTable::default();
    let mut index = 0;
    while table
        .leases
        .get("a")
        .is_none_or(|r| r.history.len() < MAX_HISTORY_LEN)
    {
        index += 1;
        let command = if index % 2 == 1 {
            acquire_with("w", 1, Terms::default(), false)
        } else {
            release_of("w", index - 1, 1)
        };
        table.apply(index, &command.stamped_with(index, Some(bound)));
    }
    if table.leases["a"].holder.is_some() {
        index += 1;
        table.apply(
            index,
            &release_of("w", index - 1, 1).stamped_with(index, Some(bound)),
        );
    }
    let last = acquire_with("w", 1, Terms::default(), false);
    table.apply(index + 1, &last.stamped_with(7, Some(bound)));
    assert_eq!(table.leases["a"].history.len(), MAX_HISTORY_LEN);
    assert_eq!(
        table.leases["a"].grant_began_ms(),
        Some(7),
        "the acquire's stamp"
    );
    let state = crate::raft::applied::AppliedState {
        table: table.clone(),
        ..Default::default()
    };
    let bytes = crate::raft::snapshot_codec::encode(&state).expect("encode");
    let decoded = crate::raft::snapshot_codec::decode(&bytes).expect("decode");
    assert_eq!(decoded.table.leases["a"].history, table.leases["a"].history);
}

/// The extension rule, asked of the record: the holder with its token and
/// secret may extend; another holder, token or secret may not; a revoked
/// grant says so, and a preempted one names its preemptor first.
#[test]
fn a_record_says_whether_its_grant_may_be_extended() {
    use crate::lease_table::command::SecretHash;
    use crate::lease_table::record::{Extension, LeaseRecord};
    use palisade_names::{FencingToken, GrantSecret, Holder};
    let secret = GrantSecret::new("0123456789abcdef0123456789abcdef").expect("secret");
    let wrong = GrantSecret::new("fedcba9876543210fedcba9876543210").expect("secret");
    let (hash, other) = (SecretHash::of(&secret), SecretHash::of(&wrong));
    let mut record = LeaseRecord::never_granted(5, 1000);
    record.holder = Some(Holder::new("A").expect("holder"));
    record.token = FencingToken(5);
    record.secret = Some(hash);
    let ask = |r: &LeaseRecord, holder: &str, token: Option<u64>, secret: &SecretHash| {
        r.extension(holder, token.map(FencingToken), Some(secret))
    };
    assert_eq!(ask(&record, "A", Some(5), &hash), Extension::Open);
    assert_eq!(ask(&record, "A", None, &hash), Extension::Open);
    assert_eq!(ask(&record, "A", Some(4), &hash), Extension::NotHeld);
    assert_eq!(ask(&record, "B", Some(5), &hash), Extension::NotHeld);
    assert_eq!(ask(&record, "A", Some(5), &other), Extension::NotHeld);
    record.revoked = true;
    assert_eq!(ask(&record, "A", Some(5), &hash), Extension::Revoked);
    record.preempted_by = Some(Holder::new("boss").expect("holder"));
    assert_eq!(
        ask(&record, "A", Some(5), &hash),
        Extension::Preempted(Holder::new("boss").expect("holder"))
    );
}

/// The release and handover rules, asked of the record: the holder with
/// its token and secret may release, even a revoked grant, but not from a
/// handle an acquire since replaced; only a grant that could be extended
/// may be handed over.
#[test]
fn a_record_says_who_may_release_and_hand_over() {
    use crate::lease_table::command::{Presented, SecretHash};
    use crate::lease_table::record::LeaseRecord;
    use palisade_names::{FencingToken, GrantSecret, Holder};
    let secret = GrantSecret::new("0123456789abcdef0123456789abcdef").expect("secret");
    let wrong = GrantSecret::new("fedcba9876543210fedcba9876543210").expect("secret");
    let (hash, other) = (SecretHash::of(&secret), SecretHash::of(&wrong));
    let mut record = LeaseRecord::never_granted(5, 1000);
    record.holder = Some(Holder::new("A").expect("holder"));
    record.token = FencingToken(5);
    record.grant_index = 7;
    record.secret = Some(hash);
    let grant = |holder, token, secret| Presented {
        holder,
        token: FencingToken(token),
        secret: Some(secret),
    };
    assert!(record.releasable_by(grant("A", 5, &hash), None));
    assert!(record.releasable_by(grant("A", 5, &hash), Some(7)));
    assert!(
        !record.releasable_by(grant("A", 5, &hash), Some(6)),
        "a replaced handle"
    );
    assert!(!record.releasable_by(grant("A", 4, &hash), None));
    assert!(!record.releasable_by(grant("B", 5, &hash), None));
    assert!(!record.releasable_by(grant("A", 5, &other), None));
    assert!(record.handed_over_by(grant("A", 5, &hash)));
    assert!(!record.handed_over_by(grant("A", 4, &hash)));
    assert!(!record.handed_over_by(grant("A", 5, &other)));
    record.revoked = true;
    assert!(
        record.releasable_by(grant("A", 5, &hash), None),
        "revoked: let go"
    );
    assert!(
        !record.handed_over_by(grant("A", 5, &hash)),
        "revoked: no successor"
    );
}
