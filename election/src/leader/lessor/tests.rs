//! Tests of the lessor on tokio's paused clock.

use super::*;
use crate::lease_table::command::{Command, Terms};

fn name(lease: &str) -> LeaseName {
    LeaseName::new(lease).expect("lease name")
}

/// A plain acquire of `lease` by `holder` for `ttl_ms`.
fn acquire(lease: &str, holder: &str, ttl_ms: u64) -> Command {
    Command::Acquire {
        lease: name(lease),
        holder: holder.into(),
        ttl_ms,
        secret: None,
        terms: Terms::default(),
        preempt: false,
        delay_seen: None,
        principal: None,
    }
}

fn table_with(lease: &str, holder: &str, index: u64, ttl_ms: u64) -> LeaseTable {
    let mut table = LeaseTable::default();
    table.apply(index, &acquire(lease, holder, ttl_ms));
    table
}

fn touched(names: &[&str]) -> Touched {
    Touched {
        all: false,
        names: names.iter().map(|n| name(n)).collect(),
    }
}

/// A reservation (unclaimed handover) is tracked as one; its claim keeps
/// the token but is tracked afresh with the claimant's ttl, so an
/// `Expire` already due for the reservation is not proposed for the
/// claim, and one in flight says `unclaimed` (and misses the claim).
#[tokio::test(start_paused = true)]
async fn a_claimed_reservation_is_tracked_afresh() {
    let lessor = Lessor::default();
    lessor.promote(1);
    let mut table = table_with("a", "x", 5, 60_000);
    if let Some(record) = table.leases.get_mut(&name("a")) {
        record.token = FencingToken(6);
        record.reserved = true;
        record.ttl_ms = 1000;
    }
    let _ = lessor.reconcile(&table);
    assert!(lessor.is_reservation(&name("a"), FencingToken(6)));
    tokio::time::advance(Duration::from_millis(1001)).await;
    // Due: the Expire goes out for the unclaimed reservation...
    let due = lessor.reconcile_changes(&table, &touched(&[]));
    assert_eq!(due, vec![(name("a"), FencingToken(6))]);
    assert!(lessor.is_reservation(&name("a"), FencingToken(6)));
    // ...and the claim commits first (same token, 3 s ttl).
    if let Some(record) = table.leases.get_mut(&name("a")) {
        record.reserved = false;
        record.ttl_ms = 3000;
    }
    assert!(lessor
        .reconcile_changes(&table, &touched(&["a"]))
        .is_empty());
    assert!(!lessor.is_reservation(&name("a"), FencingToken(6)));
    // The Expire did not apply (it was for the reservation): re-armed,
    // the claim's own deadline holds.
    lessor.expire_failed(&name("a"), FencingToken(6));
    assert!(lessor.reconcile_changes(&table, &touched(&[])).is_empty());
    assert!(lessor
        .renew(&name("a"), FencingToken(6), Duration::from_secs(3), None)
        .is_ok());
    tokio::time::advance(Duration::from_millis(3001)).await;
    assert_eq!(
        lessor.reconcile_changes(&table, &touched(&[])),
        vec![(name("a"), FencingToken(6))]
    );
    assert!(!lessor.is_reservation(&name("a"), FencingToken(6)));
}

/// Between full scans the lessor looks only at the leases applies
/// touched: a grant it was told about is tracked and expires, a release
/// it was told about is dropped, and an untold change waits for the
/// periodic full scan (which the change feed makes unnecessary).
#[tokio::test(start_paused = true)]
async fn incremental_reconciles_follow_the_touched_leases() {
    let lessor = Lessor::default();
    lessor.promote(1);
    let empty = LeaseTable::default();
    assert!(
        lessor.reconcile_changes(&empty, &touched(&[])).is_empty(),
        "full scan after promotion"
    );
    let table = table_with("a", "h", 7, 1000);
    assert!(lessor
        .reconcile_changes(&table, &touched(&["a"]))
        .is_empty());
    assert!(
        lessor.remaining_ms(&name("a"), FencingToken(7)).is_some(),
        "tracked"
    );
    // "b" is granted, but nobody says so: not tracked until a full scan.
    let mut both = table.clone();
    both.apply(
        8,
        &Command::Acquire {
            lease: name("b"),
            holder: "h".into(),
            ttl_ms: 1000,
            secret: None,
            terms: Terms::default(),
            preempt: false,
            delay_seen: None,
            principal: None,
        },
    );
    assert!(lessor.reconcile_changes(&both, &touched(&[])).is_empty());
    assert!(lessor.remaining_ms(&name("b"), FencingToken(8)).is_none());
    tokio::time::advance(Duration::from_millis(1001)).await;
    assert_eq!(
        lessor.reconcile_changes(&both, &touched(&[])),
        vec![(name("a"), FencingToken(7))],
        "the touched grant expires"
    );
    for _ in 0..FULL_SCAN_EVERY {
        let _ = lessor.reconcile_changes(&both, &touched(&[]));
    }
    assert!(
        lessor.remaining_ms(&name("b"), FencingToken(8)).is_some(),
        "the full scan found b"
    );
    // A release it is told about drops the grant at once.
    let mut released = both.clone();
    released.leases.remove(&name("b"));
    assert!(lessor
        .reconcile_changes(&released, &touched(&["b"]))
        .is_empty());
    assert!(lessor.remaining_ms(&name("b"), FencingToken(8)).is_none());
    // A follower tracks nothing, whatever it is told.
    lessor.demote();
    assert!(lessor
        .reconcile_changes(
            &both,
            &Touched {
                all: true,
                names: Vec::new()
            }
        )
        .is_empty());
}

fn table_of(held: &HashMap<LeaseName, (FencingToken, tokio::time::Instant)>) -> LeaseTable {
    let mut table = LeaseTable::default();
    for (lease, (token, _)) in held {
        table.leases.insert(
            lease.clone(),
            crate::lease_table::record::LeaseRecord {
                holder: Some("h".into()),
                token: *token,
                ttl_ms: 1000,
                transitions: 1,
                modify_index: token.0,
                grant_index: token.0,
                secret: None,
                revoked: false,
                terms: Terms::default(),
                reserved: false,
                preempted_by: None,
                lock_delayed: false,
                preempted_by_principal: None,
                reserved_principal: None,
                owner: None,
                history: Default::default(),
            },
        );
    }
    table
}

/// The deadline-ordered checks find exactly the passed deadlines, as a
/// walk over every tracked grant would, through grants, renewals with
/// varied ttls, releases and newer grants.
#[tokio::test(start_paused = true)]
async fn due_grants_match_a_full_walk() {
    let lessor = Lessor::default();
    lessor.promote(1);
    let mut expected: HashMap<LeaseName, (FencingToken, tokio::time::Instant)> = HashMap::new();
    let mut next_token = 1;
    let mut seed = 7u64;
    let mut random = move |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    for _round in 0..200 {
        for _ in 0..20 {
            let lease = name(&format!("l{}", random(300)));
            let ttl = Duration::from_millis(50 + random(500));
            let now = tokio::time::Instant::now();
            match expected.get(&lease).copied() {
                Some((token, deadline)) if deadline > now && random(2) == 0 => {
                    lessor.renew(&lease, token, ttl, None).expect("renew");
                    expected.insert(lease, (token, now + ttl));
                }
                Some((token, deadline)) if deadline > now => {
                    // Released: the feed tells the lessor.
                    let _ = token;
                    expected.remove(&lease);
                    let table = table_of(&expected);
                    let _ = lessor.reconcile_changes(&table, &touched(&[lease.as_str()]));
                }
                Some(_) => {}
                None => {
                    next_token += 1;
                    lessor.track_grant(&lease, FencingToken(next_token), ttl);
                    expected.insert(lease, (FencingToken(next_token), now + ttl));
                }
            }
        }
        tokio::time::advance(Duration::from_millis(random(60))).await;
        let now = tokio::time::Instant::now();
        let mut due = lessor.reconcile_changes(&table_of(&expected), &touched(&[]));
        due.sort();
        let mut want: Vec<_> = expected
            .iter()
            .filter(|(_, (_, deadline))| *deadline <= now)
            .map(|(lease, (token, _))| (lease.clone(), *token))
            .collect();
        want.sort();
        assert_eq!(due, want);
        for (lease, _) in want {
            expected.remove(&lease);
            // The Expire applied: the feed drops it.
            let table = table_of(&expected);
            let _ = lessor.reconcile_changes(&table, &touched(&[lease.as_str()]));
        }
    }
}

/// A lease freed (release or expiry, through the feed) is handed out for
/// reclaiming once `after` has passed, once; one granted again in
/// between, or changed since, is not.
#[tokio::test(start_paused = true)]
async fn free_leases_are_reclaimable_after_the_delay() {
    let after = Duration::from_secs(60);
    let lessor = Lessor::default();
    lessor.promote(1);
    let mut table = table_with("a", "x", 3, 1000);
    table.apply(
        4,
        &Command::Acquire {
            lease: name("b"),
            holder: "x".into(),
            ttl_ms: 1000,
            secret: None,
            terms: Terms::default(),
            preempt: false,
            delay_seen: None,
            principal: None,
        },
    );
    let _ = lessor.reconcile_changes(&table, &touched(&["a", "b"]));
    for (lease, token, index) in [("a", 3, 5), ("b", 4, 6)] {
        table.apply(
            index,
            &Command::Expire {
                lease: name(lease),
                token: FencingToken(token),
                unclaimed: false,
            },
        );
    }
    let _ = lessor.reconcile_changes(&table, &touched(&["a", "b"]));
    tokio::time::advance(after - Duration::from_millis(1)).await;
    assert!(lessor.reclaimable(&table, after, 10).is_empty(), "not yet");
    // "b" is granted again before the delay ends.
    table.apply(
        7,
        &Command::Acquire {
            lease: name("b"),
            holder: "y".into(),
            ttl_ms: 100_000,
            secret: None,
            terms: Terms::default(),
            preempt: false,
            delay_seen: None,
            principal: None,
        },
    );
    let _ = lessor.reconcile_changes(&table, &touched(&["b"]));
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(lessor.reclaimable(&table, after, 10), vec![(name("a"), 5)]);
    assert!(
        lessor.reclaimable(&table, after, 10).is_empty(),
        "handed out once"
    );
    // A full scan finds a free lease whose Reclaim never committed; the
    // delay starts again from the scan.
    let _ = lessor.reconcile(&table);
    assert!(lessor.reclaimable(&table, after, 10).is_empty());
    tokio::time::advance(after).await;
    assert_eq!(lessor.reclaimable(&table, after, 10), vec![(name("a"), 5)]);
    // A follower reclaims nothing.
    lessor.demote();
    let _ = lessor.reconcile(&table);
    assert!(lessor.reclaimable(&table, Duration::ZERO, 10).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_grant_expires_after_its_ttl_and_not_before() {
    let lessor = Lessor::default();
    lessor.promote(1);
    let table = table_with("a", "x", 7, 1000);
    lessor.track_grant(&name("a"), FencingToken(7), Duration::from_millis(1000));
    tokio::time::advance(Duration::from_millis(999)).await;
    assert!(lessor.reconcile(&table).is_empty());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(lessor.reconcile(&table), vec![(name("a"), FencingToken(7))]);
    assert!(lessor.reconcile(&table).is_empty(), "proposed once");
    assert_eq!(
        lessor.renew(
            &name("a"),
            FencingToken(7),
            Duration::from_millis(1000),
            None
        ),
        Err(RenewRefused::Expired)
    );
    lessor.expire_failed(&name("a"), FencingToken(7));
    assert_eq!(
        lessor.reconcile(&table),
        vec![(name("a"), FencingToken(7))],
        "retried after a failure"
    );
}

#[tokio::test(start_paused = true)]
async fn renewals_push_the_deadline() {
    let lessor = Lessor::default();
    lessor.promote(1);
    let table = table_with("a", "x", 3, 1000);
    lessor.track_grant(&name("a"), FencingToken(3), Duration::from_millis(1000));
    for _ in 0..10 {
        tokio::time::advance(Duration::from_millis(600)).await;
        lessor
            .renew(
                &name("a"),
                FencingToken(3),
                Duration::from_millis(1000),
                None,
            )
            .expect("renew");
        assert!(lessor.reconcile(&table).is_empty());
    }
    assert_eq!(lessor.remaining_ms(&name("a"), FencingToken(3)), Some(1000));
}

#[tokio::test(start_paused = true)]
async fn a_new_leader_gives_every_held_lease_a_full_ttl() {
    let lessor = Lessor::default();
    let table = table_with("a", "x", 3, 1000);
    lessor.promote(1);
    lessor.track_grant(&name("a"), FencingToken(3), Duration::from_millis(1000));
    tokio::time::advance(Duration::from_millis(900)).await;
    // Leadership moves away and comes back in a later term.
    lessor.demote();
    assert!(
        lessor.reconcile(&table).is_empty(),
        "a follower expires nothing"
    );
    assert_eq!(
        lessor.renew(
            &name("a"),
            FencingToken(3),
            Duration::from_millis(1000),
            None
        ),
        Err(RenewRefused::NotLeader)
    );
    lessor.promote(2);
    assert!(lessor.reconcile(&table).is_empty());
    tokio::time::advance(Duration::from_millis(999)).await;
    assert!(
        lessor.reconcile(&table).is_empty(),
        "deadline restarted at promotion"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(lessor.reconcile(&table).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_newer_grant_is_not_expired_by_an_older_deadline() {
    let lessor = Lessor::default();
    lessor.promote(1);
    lessor.track_grant(&name("a"), FencingToken(3), Duration::from_millis(1000));
    let newer = table_with("a", "y", 9, 5000);
    tokio::time::advance(Duration::from_millis(2000)).await;
    assert!(
        lessor.reconcile(&newer).is_empty(),
        "token 3 is gone, 9 gets its own ttl"
    );
    tokio::time::advance(Duration::from_millis(5000)).await;
    assert_eq!(lessor.reconcile(&newer), vec![(name("a"), FencingToken(9))]);
}

/// However long the names, one `Reclaim` carries at most
/// `MAX_RECLAIM_BYTES` of them (its log entry never becomes a sled blob);
/// the rest come in the next batches, none lost or repeated.
#[tokio::test(start_paused = true)]
async fn a_reclaim_batch_stays_under_its_byte_bound() {
    let lessor = Lessor::default();
    lessor.promote(1);
    let mut table = LeaseTable::default();
    let names: Vec<String> = (0..1000).map(|i| format!("{i:0>128}")).collect();
    for (i, lease) in names.iter().enumerate() {
        let index = 2 * i as u64 + 1;
        table.apply(
            index,
            &Command::Acquire {
                lease: name(lease),
                holder: "x".into(),
                ttl_ms: 1000,
                secret: None,
                terms: Terms::default(),
                preempt: false,
                delay_seen: None,
                principal: None,
            },
        );
        table.apply(
            index + 1,
            &Command::Expire {
                lease: name(lease),
                token: FencingToken(index),
                unclaimed: false,
            },
        );
    }
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    let _ = lessor.reconcile_changes(&table, &touched(&all));
    let mut reclaimed = std::collections::BTreeSet::new();
    let mut batches = 0;
    loop {
        let batch = lessor.reclaimable(&table, Duration::ZERO, 1000);
        if batch.is_empty() {
            break;
        }
        let bytes: usize = batch.iter().map(|(lease, _)| lease.as_str().len()).sum();
        assert!(bytes <= MAX_RECLAIM_BYTES, "{bytes} bytes in one batch");
        assert!(batch.len() < 1000, "bounded by bytes, not by count");
        for (lease, _) in batch {
            assert!(reclaimed.insert(lease), "handed out twice");
        }
        batches += 1;
    }
    assert_eq!(
        reclaimed.len(),
        1000,
        "every free lease, in {batches} batches"
    );
}

/// Leases that fall due together (a new leader restarted every deadline at
/// once, and their holders are gone) are marked expiring at most
/// `MAX_EXPIRIES_PER_RECONCILE` at a time; the rest go out in the next
/// reconciles, and none is renewable meanwhile.
#[tokio::test(start_paused = true)]
async fn an_expiry_storm_goes_out_in_bounded_batches() {
    let count = 2 * MAX_EXPIRIES_PER_RECONCILE + 50;
    let mut table = LeaseTable::default();
    for i in 0..count {
        table.apply(i as u64 + 1, &acquire(&format!("storm-{i}"), "gone", 1000));
    }
    let lessor = Lessor::default();
    lessor.promote(1);
    assert!(lessor.reconcile(&table).is_empty());
    tokio::time::advance(Duration::from_millis(1001)).await;
    let mut batches = Vec::new();
    let mut marked = std::collections::HashSet::new();
    loop {
        let due = lessor.reconcile_changes(&table, &touched(&[]));
        if due.is_empty() {
            break;
        }
        batches.push(due.len());
        marked.extend(due.into_iter().map(|(lease, _)| lease));
    }
    assert_eq!(
        batches,
        vec![MAX_EXPIRIES_PER_RECONCILE, MAX_EXPIRIES_PER_RECONCILE, 50]
    );
    assert_eq!(marked.len(), count, "each lease is marked once");
    // Still waiting for its turn or not, a passed deadline is not renewable.
    let token = table.leases[&name("storm-0")].token;
    assert_eq!(
        lessor.renew(&name("storm-0"), token, Duration::from_secs(1), None),
        Err(RenewRefused::Expired)
    );
}

/// A new leader counts a free record as free since the stamped time of the
/// change that freed it, not since its own first look: under leader
/// changes more frequent than the reclaim delay, free names are still
/// reclaimed (the one-hour soak's table grew by every name it freed).
#[tokio::test(start_paused = true)]
async fn a_new_leader_reclaims_by_the_time_the_name_was_freed() {
    let after = Duration::from_secs(60);
    let now_ms = crate::signing::unix_ms();
    let mut table = LeaseTable::default();
    for (i, (lease, freed_ago_s)) in [("old", 90), ("recent", 10), ("unstamped", 0)]
        .into_iter()
        .enumerate()
    {
        let index = 2 * i as u64 + 1;
        table.apply(index, &acquire(lease, "h", 1000));
        let token = table.leases[&name(lease)].token;
        let release = Command::Release {
            lease: name(lease),
            holder: "h".into(),
            token,
            grant_index: None,
            secret: None,
        };
        let release = if freed_ago_s > 0 {
            release.stamped(now_ms - freed_ago_s * 1000)
        } else {
            release
        };
        table.apply(index + 1, &release);
        assert!(table.leases[&name(lease)].holder.is_none());
    }
    let lessor = Lessor::default();
    lessor.promote(2);
    assert!(lessor.reconcile(&table).is_empty());
    let first: Vec<_> = lessor.reclaimable(&table, after, 10);
    assert_eq!(
        first.iter().map(|(l, _)| l.as_str()).collect::<Vec<_>>(),
        vec!["old"],
        "only the name freed longer ago than the delay"
    );
    tokio::time::advance(Duration::from_secs(51)).await;
    let second: Vec<_> = lessor.reclaimable(&table, after, 10);
    assert_eq!(
        second.iter().map(|(l, _)| l.as_str()).collect::<Vec<_>>(),
        vec!["recent"]
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    let third: Vec<_> = lessor.reclaimable(&table, after, 10);
    assert_eq!(
        third.iter().map(|(l, _)| l.as_str()).collect::<Vec<_>>(),
        vec!["unstamped"],
        "a change with no stamp counts from the leader's first look"
    );
}

/// The safety net's full scans space out with the table: once a second up
/// to 10 000 leases, every 10 s at 100 000 (a scan holds the lessor, which
/// renewals need).
#[test]
fn full_scans_space_out_with_the_table() {
    assert_eq!(super::full_scan_every(0), FULL_SCAN_EVERY);
    assert_eq!(super::full_scan_every(10_000), FULL_SCAN_EVERY);
    assert_eq!(super::full_scan_every(100_000), 1_000);
    assert_eq!(super::full_scan_every(usize::MAX), u32::MAX);
}

/// A new leader scans the whole table at its first reconcile, however big
/// the table: the spacing of the later scans must not delay the first one,
/// for until it runs no lease of the new term is tracked and none can
/// expire (at 100 000 leases it would have waited 9 s, at a million 99 s).
#[tokio::test(start_paused = true)]
async fn a_new_leader_scans_a_big_table_at_once() {
    let mut table = LeaseTable::default();
    for i in 0..20_000u64 {
        table.apply(i + 1, &acquire(&format!("l{i}"), "h", 1000));
    }
    let last = name("l19999");
    let token = table.leases.get(&last).map(|r| r.token).expect("granted");
    let lessor = Lessor::default();
    lessor.promote(1);
    assert!(lessor.reconcile_changes(&table, &touched(&[])).is_empty());
    assert!(
        lessor.remaining_ms(&last, token).is_some(),
        "tracked at the first reconcile"
    );
    tokio::time::advance(Duration::from_millis(1001)).await;
    assert_eq!(
        lessor.reconcile_changes(&table, &touched(&[])).len(),
        MAX_EXPIRIES_PER_RECONCILE,
        "due at its ttl (as many as a reconcile sends)"
    );
}

/// A new leader gives the leases it finds held a full ttl and the
/// takeover's grace (the old leader's renewals on its lease may reach past
/// a quick takeover), renewed before the first scan or not; the next
/// promotion grants the grace again.
#[tokio::test(start_paused = true)]
async fn a_takeover_adds_its_grace_to_the_leases_it_finds_held() {
    let lessor = Lessor::with_takeover_grace(Duration::from_millis(120));
    let table = table_with("a", "x", 3, 1000);
    lessor.promote(1);
    // Renewed before the first scan: the grace counts too.
    let mut early = table_with("b", "y", 4, 1000);
    early.apply(5, &acquire("a", "x", 1000));
    lessor
        .renew(
            &name("b"),
            FencingToken(4),
            Duration::from_millis(1000),
            None,
        )
        .expect("renewed");
    assert!(lessor.reconcile(&early).is_empty());
    tokio::time::advance(Duration::from_millis(1119)).await;
    assert!(
        lessor.reconcile(&early).is_empty(),
        "ttl + grace not yet out"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    let mut due = lessor.reconcile(&early);
    due.sort();
    assert_eq!(
        due,
        vec![(name("a"), FencingToken(5)), (name("b"), FencingToken(4))]
    );
    lessor.promote(2);
    assert!(lessor.reconcile(&table).is_empty());
    tokio::time::advance(Duration::from_millis(1119)).await;
    assert!(
        lessor.reconcile(&table).is_empty(),
        "a new term, a new grace"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(lessor.reconcile(&table), vec![(name("a"), FencingToken(3))]);
}
