//! The Rust SDK on a cluster of three partitions (`palisade dev
//! --partitions 3`), on real processes: each lease's calls and renewals go
//! straight to its partition's leader (P1), and killing the node that
//! leads one partition touches only that partition's leases, which the
//! SDK keeps and renews at the new leader (L2).

use crate::partitioned_dev::Dev;
use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use palisade_client::{Client, ClientConfig, Lease};
use serde_json::Value;
use support::partitions::partition_of;

/// How long any one awaited event may take (a bound against a hang, not a
/// timing assertion).
const PATIENCE: Duration = Duration::from_secs(60);
/// The leases' ttl: renewed every third of it (the SDK's default).
const TTL: Duration = Duration::from_millis(6000);
/// The longest two renewals of a lease on a healthy partition may be
/// apart: less than two renewal periods (a third of the ttl each), so a
/// renewal that missed its turn shows, with slack for a loaded machine.
const HEALTHY_GAP: Duration = Duration::from_millis(3200);
const PARTITIONS: usize = 3;

/// The partition of `lease` as the cluster computes it (written in the
/// tests again, not taken from the SDK).
fn partition(lease: &str) -> usize {
    partition_of(lease, PARTITIONS as u32) as usize
}

/// Which node leads each partition, each node asked whether it does
/// (`leading` in its own `/v1/cluster`); `None` for a partition no live
/// node leads.
async fn leaders_now(dev: &Dev, http: &reqwest::Client) -> Vec<Option<u64>> {
    let mut leaders = vec![None; PARTITIONS];
    for url in &dev.urls {
        let Ok(answer) = http.get(format!("{url}/v1/cluster")).send().await else {
            continue;
        };
        let Ok(view) = answer.json::<Value>().await else {
            continue;
        };
        for (k, part) in view["partitions"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            if part["leading"] == true {
                leaders[k] = view["node_id"].as_u64();
            }
        }
    }
    leaders
}

/// Waits until every partition has a leader, preferably each a different
/// node (the cluster spreads them; on a loaded machine placement may take
/// longer than this waits, and the test then kills a node leading more
/// than partition 0, checking the partitions it does not lead).
async fn spread_leaders(dev: &Dev, http: &reqwest::Client) {
    let started = Instant::now();
    loop {
        let now = leaders_now(dev, http).await;
        let mut distinct: Vec<u64> = now.iter().flatten().copied().collect();
        distinct.sort_unstable();
        distinct.dedup();
        let all_led = now.iter().all(Option::is_some);
        if all_led && (distinct.len() == PARTITIONS || started.elapsed() > PATIENCE / 3) {
            return;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "partitions without a leader: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each partition's term, the highest any node reports.
async fn terms(dev: &Dev, http: &reqwest::Client) -> Vec<u64> {
    let mut terms = vec![0; PARTITIONS];
    for url in &dev.urls {
        let Ok(answer) = http.get(format!("{url}/v1/cluster")).send().await else {
            continue;
        };
        let view: Value = answer.json().await.unwrap_or_default();
        for (k, part) in view["partitions"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            terms[k] = terms[k].max(part["term"].as_u64().unwrap_or(0));
        }
    }
    terms
}

/// Waits until the cluster's leaders are spread and every client's map
/// names them; the leaders.
async fn converged(dev: &Dev, http: &reqwest::Client, clients: &[&Client]) -> Vec<u64> {
    let started = Instant::now();
    loop {
        let now = leaders_now(dev, http).await;
        let maps: Vec<_> = clients.iter().map(|c| c.partitions().leaders).collect();
        if now.iter().all(Option::is_some) && maps.iter().all(|map| *map == now) {
            return now.into_iter().flatten().collect();
        }
        assert!(
            started.elapsed() < PATIENCE,
            "the SDK's maps {maps:?}, the cluster {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET url` until it answers 200 (a leader confirming its lease may
/// answer 503 for a moment); its body.
async fn get_ok(http: &reqwest::Client, url: &str) -> Value {
    let started = Instant::now();
    loop {
        if let Ok(answer) = http.get(url).send().await {
            if answer.status() == 200 {
                return answer.json().await.expect("json");
            }
        }
        assert!(started.elapsed() < PATIENCE, "{url} never answered 200");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two lease names in each partition, `{prefix}-{i}`, by partition.
fn names(prefix: &str, per_partition: usize) -> Vec<Vec<String>> {
    let mut by_partition = vec![Vec::new(); PARTITIONS];
    let mut names = (0..).map(|i| format!("{prefix}-{i}"));
    while by_partition
        .iter()
        .any(|n: &Vec<String>| n.len() < per_partition)
    {
        let name = names.next().expect("endless");
        let part = &mut by_partition[partition(&name)];
        if part.len() < per_partition {
            part.push(name);
        }
    }
    by_partition
}

/// Acquires every name for `holder`; the leases, by partition.
async fn acquire_all(client: &Client, names: &[Vec<String>], holder: &str) -> Vec<Vec<Lease>> {
    let mut leases = Vec::new();
    for part in names {
        let mut held = Vec::new();
        for name in part {
            let lease = client
                .acquire(name, holder, TTL, Some(Duration::from_secs(10)))
                .await
                .unwrap_or_else(|e| panic!("acquire {name}: {e}"));
            held.push(lease);
        }
        leases.push(held);
    }
    leases
}

/// Every lease of `sets` (each by partition) with its partition.
fn flat<'a>(sets: &[&'a [Vec<Lease>]]) -> Vec<(usize, &'a Lease)> {
    sets.iter()
        .flat_map(|set| {
            set.iter()
                .enumerate()
                .flat_map(|(k, part)| part.iter().map(move |lease| (k, lease)))
        })
        .collect()
}

/// Watches `flat` leases for `window`, sampling their deadlines: every
/// lease stays held, and the longest time between two renewals (a
/// deadline that moved) of each partition's leases is answered, by
/// partition.
async fn watch_renewals(
    (dev, http): (&Dev, &reqwest::Client),
    flat: &[(usize, &Lease)],
    window: Duration,
) -> Vec<Duration> {
    let started = tokio::time::Instant::now();
    let mut last: Vec<(tokio::time::Instant, tokio::time::Instant)> =
        flat.iter().map(|(_, l)| (l.deadline(), started)).collect();
    let mut gaps = vec![Duration::ZERO; PARTITIONS];
    while started.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = tokio::time::Instant::now();
        for ((k, lease), (deadline, moved)) in flat.iter().zip(&mut last) {
            if !lease.is_held() {
                // Without a gateway, fence() answers only why it is lost.
                let why = lease.fence().await;
                let mut views = Vec::new();
                for url in &dev.urls {
                    if let Ok(answer) = http.get(format!("{url}/v1/cluster")).send().await {
                        let view: Value = answer.json().await.unwrap_or_default();
                        views.push((view["node_id"].clone(), view["partitions"].clone()));
                    }
                }
                panic!(
                    "{} (partition {k}) was lost {:?} into the window, the last renewal {:?} \
                     ago: {why:?}; the nodes' views: {views:?}",
                    lease.name(),
                    started.elapsed(),
                    now - *moved,
                );
            }
            if lease.deadline() > *deadline {
                gaps[*k] = gaps[*k].max(now - *moved);
                *deadline = lease.deadline();
                *moved = now;
            }
        }
    }
    let end = tokio::time::Instant::now();
    for ((k, _), (_, moved)) in flat.iter().zip(&last) {
        gaps[*k] = gaps[*k].max(end - *moved);
    }
    gaps
}

/// Each node's value of the counter `name`, in node order.
async fn counters(dev: &Dev, http: &reqwest::Client, name: &str) -> Vec<f64> {
    let each = dev.urls.iter().map(|url| support::counter(http, url, name));
    futures::future::join_all(each).await
}

/// Leases in all three partitions are acquired and renewed by the SDK;
/// each lease's calls go to its partition's leader: renewal requests
/// come back with no `x-palisade-leader` (nothing forwarded) once the
/// client knows the map, and the renewal streams open one on each
/// partition leader. Then the node leading one partition is killed
/// (SIGKILL): every lease stays held, the other partitions' leases renew
/// with no gap longer than usual, and the failed-over partition's leases
/// renew at its new leader.
#[tokio::test]
async fn each_lease_renews_at_its_partitions_leader_and_a_failover_touches_only_its_own() {
    let dev = Dev::start();
    let http = dev.http();
    spread_leaders(&dev, &http).await;
    let streams_before = counters(&dev, &http, "palisade_lease_renew_streams_total").await;

    // One client renewing over streams, one over requests; and, to show
    // that a forwarded call is seen, one that knows only partition 0's
    // leader's endpoint (the other partitions' calls are forwarded).
    let streaming = dev.sdk(true);
    let requesting = dev.sdk(false);
    let started = Instant::now();
    let home = loop {
        if let Some(leader) = leaders_now(&dev, &http).await[0] {
            break leader;
        }
        assert!(started.elapsed() < PATIENCE, "partition 0 has no leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut config = ClientConfig::new([dev.url(home)])
        .with_api_key(&dev.key)
        .expect("key");
    config.renew_stream = false;
    let one_node = Client::new(config);
    let by_stream = acquire_all(&streaming, &names("streamed", 2), "s").await;
    let by_request = acquire_all(&requesting, &names("requested", 1), "r").await;
    let by_one_node = acquire_all(&one_node, &names("one-node", 1), "o").await;
    let leaders = converged(&dev, &http, &[&streaming, &requesting]).await;
    for (k, part) in by_stream.iter().enumerate() {
        for lease in part {
            assert_eq!(streaming.partition_of(lease.name()), k, "the SDK's hash");
            let url = format!("{}/v1/leases/{}", dev.url(leaders[k]), lease.name());
            let info = get_ok(&http, &url).await;
            assert_eq!(info["partition"], k, "the cluster's hash: {info}");
        }
    }

    // A steady while: nothing forwarded, every lease renewed on time.
    let terms_before = terms(&dev, &http).await;
    let forwarded_before = requesting.partitions().forwarded;
    let one_node_before = one_node.partitions().forwarded;
    let renewals_before = counters(&dev, &http, "palisade_lease_renewals_total").await;
    let all = flat(&[&by_stream, &by_request]);
    let gaps = watch_renewals((&dev, &http), &all, Duration::from_secs(6)).await;
    let forwarded_after = requesting.partitions().forwarded;
    let terms_after = terms(&dev, &http).await;
    let elections: u64 = terms_after
        .iter()
        .zip(&terms_before)
        .map(|(a, b)| a - b)
        .sum();
    let one_node_after = one_node.partitions().forwarded;
    let renewals_after = counters(&dev, &http, "palisade_lease_renewals_total").await;
    let streams_after = counters(&dev, &http, "palisade_lease_renew_streams_total").await;
    eprintln!(
        "steady: {elections} new terms; forwarded {forwarded_before} -> {forwarded_after} (one-node client: \
         {one_node_before} -> {one_node_after}); renewals per node \
         {renewals_before:?} -> {renewals_after:?}; streams per node {streams_before:?} -> \
         {streams_after:?}; longest gaps {gaps:?}"
    );
    // A leadership move (a new term: placement moves leaders home) costs
    // at most a forwarded renewal or two of that partition before the
    // client follows it; none otherwise.
    assert!(
        forwarded_after - forwarded_before <= 2 * elections,
        "renewal requests were forwarded once the map was known ({elections} new terms)"
    );
    assert!(
        one_node_after >= one_node_before + 2,
        "the one-node client's renewals of partitions 1 and 2 were not seen forwarded"
    );
    for (node, (after, before)) in streams_after.iter().zip(&streams_before).enumerate() {
        assert!(after > before, "no renewal stream on node {}", node + 1);
    }
    for (node, (after, before)) in renewals_after.iter().zip(&renewals_before).enumerate() {
        assert!(after > before, "node {} renewed nothing", node + 1);
    }
    for gap in &gaps {
        assert!(*gap < HEALTHY_GAP, "a renewal gap of {gap:?}: {gaps:?}");
    }

    drop(by_one_node);

    // Kill the node leading partition 0.
    let victim = leaders[0];
    let pid = dev.node_pid(victim);
    Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
    let killed = Instant::now();
    let (gaps, (new_leader, learned)) = tokio::join!(
        watch_renewals((&dev, &http), &all, Duration::from_secs(7)),
        failed_over(&dev, &http, &streaming, &by_stream[0], victim),
    );
    eprintln!(
        "after killing node {victim} (partition 0's leader): longest gaps {gaps:?}; the SDK \
         renewed partition 0 at node {new_leader}, learned {learned:?} after the kill"
    );
    let untouched: Vec<usize> = (0..PARTITIONS).filter(|k| leaders[*k] != victim).collect();
    assert!(!untouched.is_empty(), "node {victim} led every partition");
    for k in untouched {
        assert!(
            gaps[k] < HEALTHY_GAP,
            "partition {k} was disturbed by node {victim}'s failover: {gaps:?}"
        );
    }
    for lease in by_stream.iter().chain(&by_request).flatten() {
        assert!(lease.is_held(), "{} lost after the failover", lease.name());
    }
    assert!(killed.elapsed() < PATIENCE);
}

/// Waits until the node that leads partition 0 now is not `victim` and
/// `client`'s map names it, then until each of `leases` (partition 0's)
/// renewed after that: the new leader and how long after the call the
/// client knew it. (Watched while it happens: the killed node, restarted
/// by dev, takes partition 0 back a few seconds later.)
async fn failed_over(
    dev: &Dev,
    http: &reqwest::Client,
    client: &Client,
    leases: &[Lease],
    victim: u64,
) -> (u64, Duration) {
    let started = Instant::now();
    let (leader, learned) = loop {
        let now = leaders_now(dev, http).await;
        let known = client.partitions().leaders[0];
        match (now[0], known) {
            (Some(leader), Some(seen)) if leader == seen && leader != victim => {
                break (leader, started.elapsed());
            }
            _ => {}
        }
        assert!(
            started.elapsed() < PATIENCE,
            "partition 0: {now:?} vs the SDK's {known:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let deadlines: Vec<_> = leases.iter().map(Lease::deadline).collect();
    while leases
        .iter()
        .zip(&deadlines)
        .any(|(lease, before)| lease.deadline() <= *before)
    {
        assert!(
            started.elapsed() < PATIENCE,
            "partition 0's leases never renewed again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (leader, learned)
}
