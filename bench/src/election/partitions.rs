//! What `--partitions N` changes, measured: which node leads each
//! partition (so each lease's calls go straight to its partition's leader,
//! as the SDKs send them), each node's CPU over a row, the idle cost of N
//! partitions, and the failover of a node that leads k of them.

use std::time::{Duration, Instant};

use palisade_local_cluster::Cluster;
use serde_json::{json, Value};

use super::requests::post;
use crate::cpu::cpu_time;

/// Each partition's leader, and the URL its calls go to.
pub(super) struct Map {
    /// By partition: the node leading it.
    pub leaders: Vec<u64>,
    /// By partition: that node's client URL.
    pub bases: Vec<String>,
}

impl Map {
    /// The URL of `lease`'s partition's leader.
    pub fn base(&self, lease: &str) -> &str {
        &self.bases[partition_of(lease, self.bases.len())]
    }
}

/// The partition of `name` among `partitions` (64-bit FNV-1a of the name,
/// modulo the count; README, "Partitions").
pub(super) fn partition_of(name: &str, partitions: usize) -> usize {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    (hash % partitions as u64) as usize
}

/// Each partition's leader as the node at `url` sees it, if every
/// partition has one.
async fn leaders(client: &reqwest::Client, url: &str) -> Option<Vec<u64>> {
    let view: Value = client
        .get(format!("{url}/v1/cluster"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    match view["partitions"].as_array() {
        Some(parts) => parts.iter().map(|p| p["leader"].as_u64()).collect(),
        None => Some(vec![view["leader"].as_u64()?]),
    }
}

/// The map once placement has settled: every partition led, no node
/// leading more than its share (⌈N / nodes⌉), the same view twice 1 s
/// apart; at most `within`.
pub(super) async fn settled(
    cluster: &Cluster,
    client: &reqwest::Client,
    within: Duration,
) -> anyhow::Result<Map> {
    let started = Instant::now();
    let nodes = cluster.ids().count();
    let mut last: Option<Vec<u64>> = None;
    while started.elapsed() < within {
        let now = leaders(client, &cluster.url(1)).await;
        if let Some(now) = now.filter(|l| {
            let share = l.len().div_ceil(nodes);
            cluster
                .ids()
                .all(|id| l.iter().filter(|leader| **leader == id).count() <= share)
        }) {
            if last.as_ref() == Some(&now) {
                let bases = now.iter().map(|id| cluster.url(*id)).collect();
                return Ok(Map {
                    leaders: now,
                    bases,
                });
            }
            last = Some(now);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    anyhow::bail!("the partitions' leaders did not settle within {within:?}: {last:?}")
}

/// Each running node's CPU time so far.
pub(super) fn node_cpu(cluster: &Cluster) -> Vec<Duration> {
    cluster
        .ids()
        .map(|id| {
            cluster
                .node(id)
                .and_then(|node| cpu_time(node.pid()))
                .unwrap_or_default()
        })
        .collect()
}

/// The CPU each node used between `before` and `after`, over `wall`, in
/// percent of one core.
pub(super) fn cpu_percent(before: &[Duration], after: &[Duration], wall: Duration) -> Vec<f64> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| 100.0 * a.saturating_sub(*b).as_secs_f64() / wall.as_secs_f64())
        .collect()
}

/// A counter's value in the node at `url`'s `/metrics`.
async fn counter(client: &reqwest::Client, url: &str, name: &str) -> f64 {
    let Ok(response) = client.get(format!("{url}/metrics")).send().await else {
        return 0.0;
    };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// What an idle cluster costs over `idle`: per node, CPU (percent of a
/// core), RSS, peer requests/s and heartbeats carried in batches per s.
pub(super) async fn idle_cost(
    cluster: &Cluster,
    client: &reqwest::Client,
    idle: Duration,
) -> Value {
    let urls = cluster.urls();
    let read = |name: &'static str| {
        let urls = urls.clone();
        async move {
            let mut values = Vec::new();
            for url in &urls {
                values.push(counter(client, url, name).await);
            }
            values
        }
    };
    let (cpu, requests, carried) = (
        node_cpu(cluster),
        read("palisade_peer_requests_total").await,
        read("palisade_peer_heartbeats_carried_total").await,
    );
    let started = Instant::now();
    tokio::time::sleep(idle).await;
    let wall = started.elapsed();
    let rate = |before: &[f64], after: &[f64]| -> Vec<f64> {
        before
            .iter()
            .zip(after)
            .map(|(b, a)| ((a - b) / wall.as_secs_f64()).round())
            .collect()
    };
    json!({
        "seconds": wall.as_secs_f64(),
        "cpu_percent": cpu_percent(&cpu, &node_cpu(cluster), wall),
        "rss_kib": super::rss_kib(cluster),
        "peer_requests_per_s": rate(&requests, &read("palisade_peer_requests_total").await),
        "heartbeats_carried_per_s":
            rate(&carried, &read("palisade_peer_heartbeats_carried_total").await),
    })
}

/// SIGKILLs the node that leads the most partitions, then times, for each
/// partition it led, how long until an acquire of a lease of that
/// partition (a name of trial `trial`'s own: a lease acquired in an
/// earlier trial is still held) succeeds through a survivor (polled every 5 ms, 300 ms per
/// request). The node is restarted and placement settles before this
/// returns.
pub(super) async fn failover_of_most(
    cluster: &mut Cluster,
    client: &reqwest::Client,
    short: &reqwest::Client,
    (map, trial): (&Map, usize),
) -> anyhow::Result<Value> {
    let victim = cluster
        .ids()
        .max_by_key(|id| map.leaders.iter().filter(|l| *l == id).count())
        .unwrap_or(1);
    let led: Vec<usize> = (0..map.leaders.len())
        .filter(|k| map.leaders[*k] == victim)
        .collect();
    let survivor = cluster.ids().find(|id| *id != victim).unwrap_or(1);
    let leases: Vec<String> = led
        .iter()
        .map(|k| {
            (0..)
                .map(|i| format!("failover-{trial}-p{k}-{i}"))
                .find(|name| partition_of(name, map.leaders.len()) == *k)
                .unwrap_or_default()
        })
        .collect();
    cluster.kill(victim);
    let killed = Instant::now();
    let mut served = vec![None; leases.len()];
    while served.iter().any(Option::is_none) && killed.elapsed() < Duration::from_secs(15) {
        for (lease, when) in leases.iter().zip(served.iter_mut()) {
            if when.is_none() {
                let url = format!("{}/v1/leases/{lease}/acquire", cluster.url(survivor));
                if post(short, &url, &json!({"holder": "bench", "ttl_ms": 5000}))
                    .await
                    .is_some()
                {
                    *when = Some(killed.elapsed());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cluster.start_node(victim)?;
    settled(cluster, client, Duration::from_secs(60)).await?;
    let ms: Vec<Option<u128>> = served.iter().map(|d| d.map(|d| d.as_millis())).collect();
    Ok(json!({
        "partitions": map.leaders.len(),
        "killed": victim,
        "it_led": led,
        "ms_until_each_served": ms,
    }))
}
