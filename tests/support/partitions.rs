//! Clusters of several partitions as the tests see them: how their nodes
//! start, each partition's leader, and a lease's partition.

use std::path::Path;
use std::time::{Duration, Instant};

use palisade_local_cluster::NodeSetup;
use serde_json::Value;

use super::{node_setup, STEADY_LEADER};

/// Node `id` of a cluster in `dir` on `host`, running `partitions`
/// partitions with steady timing (a loaded machine does not move
/// leadership on its own).
pub fn steady_node(dir: &Path, id: u64, host: &str, partitions: u32) -> NodeSetup {
    let mut setup = node_setup(dir, id, host);
    setup.args = STEADY_LEADER.iter().map(|a| a.to_string()).collect();
    setup
        .args
        .extend(["--partitions".into(), partitions.to_string()]);
    setup
}

/// Three [`steady_node`]s on 127.0.0.1.
pub fn steady_nodes(dir: &Path, partitions: u32) -> Vec<NodeSetup> {
    (1..=3)
        .map(|id| steady_node(dir, id, "127.0.0.1", partitions))
        .collect()
}

/// Each partition's (leader, term) as the node at `url` sees it; `None`
/// when it does not answer or a partition has no leader.
pub async fn leaders(client: &reqwest::Client, url: &str) -> Option<Vec<(u64, u64)>> {
    let view: Value = client
        .get(format!("{url}/v1/cluster"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    view["partitions"]
        .as_array()?
        .iter()
        .map(|p| Some((p["leader"].as_u64()?, p["term"].as_u64()?)))
        .collect()
}

/// Polls the node at `url` (bounded by `within`) until every partition has
/// a leader that `good` accepts; the leaders and how long it took.
pub async fn until_led(
    client: &reqwest::Client,
    url: &str,
    within: Duration,
    good: impl Fn(&[(u64, u64)]) -> bool,
) -> (Vec<(u64, u64)>, Duration) {
    let started = Instant::now();
    let mut seen = None;
    while started.elapsed() < within {
        seen = leaders(client, url).await;
        if seen.as_deref().is_some_and(&good) {
            return (seen.unwrap_or_default(), started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("partitions not led as wanted within {within:?}: {seen:?}");
}

/// The partition of `name` among `partitions`: 64-bit FNV-1a of the name,
/// modulo the count (README, "Partitions"), written here again rather than
/// taken from the code under test.
pub fn partition_of(name: &str, partitions: u32) -> u32 {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    u32::try_from(hash % u64::from(partitions)).expect("below the count")
}
