//! The relations `ElectionConfig::validate` checks, and derived settings.

use super::*;

#[test]
fn peers_parse_and_bad_ones_are_named() {
    let peers = parse_peers("1=127.0.0.1:7001, 2=h:7002").expect("ok");
    assert_eq!(peers[&2], "h:7002");
    for bad in ["", "1", "x=h:1", "1=h", "1=h:1,1=h:2", "1=http://h:1"] {
        assert!(parse_peers(bad).is_err(), "{bad}");
    }
}

#[test]
fn defaults_validate_and_broken_relations_are_named() {
    let peers = parse_peers("1=127.0.0.1:7001").expect("ok");
    let config = ElectionConfig::new(
        1,
        "127.0.0.1:7101".parse().expect("addr"),
        "/tmp".into(),
        peers,
    );
    config.validate().expect("defaults are valid");
    let mut shared_port = config.clone();
    shared_port.peer_listen = Some(config.listen);
    assert!(shared_port
        .validate()
        .expect_err("port")
        .contains("client port"));
    let mut bad = config.clone();
    bad.ttl_range.0 = bad.election_timeout.1;
    assert!(bad.validate().expect_err("ttl").contains("ttl"));
    for len in [0, 256] {
        let mut bad = config.clone();
        bad.history_len = len;
        let err = bad.validate().expect_err("history length");
        assert!(err.contains("--history-len must be in 1..=255"), "{err}");
    }
    let mut bad = config.clone();
    bad.placement.priority = Placement::MAX_PRIORITY + 1;
    assert!(bad.validate().expect_err("priority").contains("priority"));
    let mut bad = config.clone();
    bad.timing_seed = Some(1);
    bad.election_timeout = (Duration::from_millis(100), Duration::from_millis(101));
    assert!(bad.validate().expect_err("seed").contains("timing-seed"));
    let mut bad = config.clone();
    bad.lease_margin = Some(Duration::from_millis(1));
    assert!(bad
        .validate()
        .expect_err("drift")
        .contains("--lease-margin-ms"));
    let mut bad = config.clone();
    bad.lease_margin = Some(Duration::from_millis(45));
    assert!(bad.validate().expect_err("lease").contains("heartbeat"));
    let mut good = config.clone();
    good.lease_margin = Some(Duration::from_millis(12));
    assert_eq!(good.validate(), Ok(()));
    assert_eq!(good.renew_lease().usable(), Duration::from_millis(48));
    let mut bad = config.clone();
    bad.placement.checks = 0;
    assert!(bad.validate().expect_err("checks").contains("check"));
    let mut bad = config;
    bad.id = 9;
    assert!(bad.validate().is_err());
}

/// A timing seed pins each node's timeout inside the range, the same on
/// every call, distinct between nodes by at least half a slot; another
/// seed moves them; no seed leaves the range alone.
#[test]
fn a_timing_seed_pins_distinct_timeouts() {
    let peers = parse_peers("1=h:1,2=h:2,3=h:3").expect("ok");
    let node = |id, seed| {
        let mut config = ElectionConfig::new(
            id,
            "127.0.0.1:7101".parse().expect("addr"),
            "/tmp".into(),
            peers.clone(),
        );
        config.timing_seed = seed;
        config.raft_election_timeout()
    };
    assert_eq!(node(1, None), (60, 120));
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..200u64 {
        let mut timeouts: Vec<u64> = (1..=3)
            .map(|id| {
                let (min, max) = node(id, Some(seed));
                assert_eq!(max, min + 1);
                assert!((60..120).contains(&min), "seed {seed}: {min}");
                assert_eq!(node(id, Some(seed)), (min, max), "replayable");
                min
            })
            .collect();
        seen.insert(timeouts.clone());
        timeouts.sort_unstable();
        assert!(
            timeouts.windows(2).all(|w| w[1] - w[0] >= 10),
            "seed {seed}: {timeouts:?}"
        );
    }
    assert!(
        seen.len() > 50,
        "seeds hardly vary the timeouts: {}",
        seen.len()
    );
}

/// Each partition draws its timeouts from the seed XOR its id: the same
/// on every call, group 0's the seed's own, and the partitions of one
/// node do not all share one timeout.
#[test]
fn each_partition_has_its_own_reproducible_timeouts() {
    use crate::group_id::GroupId;
    let peers = parse_peers("1=h:1,2=h:2,3=h:3").expect("ok");
    let mut config = ElectionConfig::new(
        2,
        "127.0.0.1:7101".parse().expect("addr"),
        "/tmp".into(),
        peers,
    );
    config.timing_seed = Some(42);
    config.partitions = 8;
    assert_eq!(
        config.group_election_timeout(GroupId::ZERO),
        config.raft_election_timeout()
    );
    let timeouts: Vec<(u64, u64)> = GroupId::all(8)
        .map(|g| config.group_election_timeout(g))
        .collect();
    let again: Vec<(u64, u64)> = GroupId::all(8)
        .map(|g| config.group_election_timeout(g))
        .collect();
    assert_eq!(timeouts, again, "replayable");
    let distinct: std::collections::BTreeSet<_> = timeouts.iter().collect();
    assert!(distinct.len() > 1, "every partition the same: {timeouts:?}");
    let mut bad = config.clone();
    bad.partitions = 0;
    assert!(bad.validate().expect_err("zero").contains("--partitions"));
    bad.partitions = crate::group_id::MAX_PARTITIONS + 1;
    assert!(bad.validate().expect_err("many").contains("--partitions"));
}
