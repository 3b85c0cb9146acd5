//! A prefix watch across partitions, on real processes (`--partitions 3`):
//! one stream (`GET /v1/watch` without `partition`) replays every lease
//! under the prefix from every partition, each line naming the partition
//! whose log its index is of; the SDK's cursor (one index per partition)
//! resumes it with exactly the changes made while it was closed, from
//! every partition; the CLI prints the same stream; and the queries that
//! cannot say where to resume are refused 400.

use crate::partitioned_dev::Dev;
use crate::support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use palisade_client::{Client, PrefixWatch, WatchEvent};
use serde_json::Value;
use support::partitions::partition_of;

/// Every wait of this file is bounded by this (against a hang, not a
/// timing assertion).
const PATIENCE: Duration = Duration::from_secs(30);
const PARTITIONS: u32 = 3;

/// The next change of `watch` (keep-alives skipped), within [`PATIENCE`].
async fn next_change(watch: &mut PrefixWatch) -> WatchEvent {
    support::watch::next_change(watch, PATIENCE).await
}

/// `(lease, partition, index)` of a change, checked against the lease's
/// own partition and `modify_index`.
fn change(event: &WatchEvent) -> (String, usize, u64) {
    let WatchEvent::Changed {
        partition,
        index,
        lease,
    } = event
    else {
        panic!("not a change: {event:?}");
    };
    assert_eq!(
        *partition,
        partition_of(&lease.lease, PARTITIONS) as usize,
        "{} comes with its own partition",
        lease.lease
    );
    assert_eq!(
        *index, lease.modify_index,
        "the line's index is the lease's"
    );
    (lease.lease.clone(), *partition, *index)
}

/// `count` lease names under `prefix` in every partition.
fn names(prefix: &str, count: usize) -> Vec<String> {
    let mut per = vec![0; PARTITIONS as usize];
    let mut names = Vec::new();
    for i in 0.. {
        let name = format!("{prefix}{i}");
        let k = partition_of(&name, PARTITIONS) as usize;
        if per[k] < count {
            per[k] += 1;
            names.push(name);
        }
        if per.iter().all(|n| *n == count) {
            break;
        }
    }
    names
}

async fn grant(sdk: &Client, lease: &str) -> palisade_client::Grant {
    sdk.acquire_grant(lease, "feeder", Duration::from_secs(600), None)
        .await
        .unwrap_or_else(|e| panic!("acquire {lease}: {e}"))
}

#[tokio::test]
async fn one_watch_follows_every_partition_and_resumes_each_from_its_own_index() {
    let dev = Dev::start();
    let sdk = dev.sdk(false);
    let leases = names("feed.", 2);
    let mut grants = BTreeMap::new();
    for lease in &leases {
        grants.insert(lease.clone(), grant(&sdk, lease).await);
    }
    grant(&sdk, "other.x").await;

    // One stream replays every partition's leases under the prefix.
    let mut watch = sdk.watch_prefix("feed.", 0).await.expect("open");
    let mut seen = BTreeMap::new();
    while seen.len() < leases.len() {
        let (lease, partition, index) = change(&next_change(&mut watch).await);
        assert!(lease.starts_with("feed."), "only the prefix: {lease}");
        seen.insert(lease, (partition, index));
    }
    let cursor = watch.cursor().clone();
    for (lease, (partition, index)) in &seen {
        assert!(
            cursor.index_of(*partition) >= *index,
            "the cursor {cursor} covers {lease} at {index}"
        );
    }
    drop(watch);

    // Changes while no stream is open, in two partitions.
    let fresh = names("feed.late", 1).remove(0);
    grant(&sdk, &fresh).await;
    let freed = leases
        .iter()
        .find(|l| partition_of(l, PARTITIONS) != partition_of(&fresh, PARTITIONS))
        .expect("a lease of another partition");
    sdk.release_grant(&grants[freed].id())
        .await
        .expect("release");

    // Resumed from the cursor: those two changes and nothing before them.
    let mut watch = sdk
        .watch_prefix_from("feed.", &cursor)
        .await
        .expect("resume");
    let mut after = BTreeMap::new();
    while after.len() < 2 {
        let (lease, _, index) = change(&next_change(&mut watch).await);
        assert!(
            lease == fresh || lease == *freed,
            "only what changed after the cursor {cursor}: {lease} at {index}"
        );
        after.insert(lease, index);
    }
    drop(watch);

    refusals(&dev).await;
    cli_prints_every_partition(&dev, leases.len());
}

/// Queries that cannot say where a watch of several partitions resumes.
async fn refusals(dev: &Dev) {
    let http = dev.http();
    for query in [
        "index=5",
        "indexes=1,2,3,4",
        "indexes=1,x",
        "partition=3",
        "partition=1&indexes=0",
        "index=0&indexes=0,0,0",
    ] {
        let url = format!("{}/v1/watch?{query}", dev.urls[0]);
        let answer = http.get(&url).send().await.expect("GET");
        assert_eq!(answer.status(), 400, "{query}");
        let body: Value = answer.json().await.expect("a JSON error");
        assert_eq!(body["error"], "bad_request", "{query}: {body}");
    }
}

/// `palisade lease watch --prefix feed. --json` prints the leases of every
/// partition, each line naming its partition.
fn cli_prints_every_partition(dev: &Dev, leases: usize) {
    let mut watch = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "lease",
            "watch",
            "--prefix",
            "feed.",
            "--json",
            "--election",
        ])
        .arg(dev.urls.join(","))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("palisade lease watch");
    let stdout = watch.stdout.take().expect("stdout");
    // Read on a thread, so a silent stream fails the test instead of
    // hanging it.
    let (lines, read) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let started = Instant::now();
    let mut partitions = std::collections::BTreeSet::new();
    for _ in 0..leases {
        let left = PATIENCE.saturating_sub(started.elapsed());
        let Ok(line) = read.recv_timeout(left) else {
            let _ = watch.kill();
            let _ = watch.wait();
            panic!("lease watch --prefix printed {} lines", partitions.len());
        };
        let line: Value = serde_json::from_str(&line).expect("JSON");
        let name = line["lease"]["lease"].as_str().expect("a lease line");
        assert_eq!(
            line["partition"].as_u64(),
            Some(partition_of(name, PARTITIONS).into()),
            "{line}"
        );
        partitions.insert(line["partition"].as_u64());
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert_eq!(partitions.len(), PARTITIONS as usize, "every partition");
}
