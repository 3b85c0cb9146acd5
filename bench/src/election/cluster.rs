//! The cluster the election benchmark runs: clients of a `--secure-clients`
//! cluster, the failover trials' view of it, and its footprint (RSS, disk).

use std::path::{Path, PathBuf};
use std::time::Duration;

use palisade_local_cluster::Cluster;
use serde_json::json;

use super::requests::post;
use crate::load::Failover;

/// What a client of a `--secure-clients` cluster needs: the CA and the
/// `admin` API key, from `palisade policy init`; a client with `timeout`
/// trusting the one and sending the other, and the policy file.
pub(super) fn secure_client(
    palisade: &Path,
    dir: &Path,
    timeout: Duration,
) -> anyhow::Result<(reqwest::Client, PathBuf)> {
    let status = std::process::Command::new(palisade)
        .args(["policy", "init", "--keep-existing", "--dir"])
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "palisade policy init failed: {status}");
    let key = std::fs::read_to_string(dir.join("admin.key"))?;
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-palisade-key", key.trim().parse()?);
    let ca = std::fs::read(dir.join("certs").join("ca.pem"))?;
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .pool_max_idle_per_host(128)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca)?)
        .default_headers(headers)
        .build()?;
    Ok((client, dir.join("policy.json")))
}

impl Failover for Cluster {
    type Node = u64;
    const PREFIX: &'static str = "";
    const PROBE: &'static str = "acquire";
    const LIMIT: Duration = Duration::from_secs(10);
    const SETTLE: Duration = Duration::from_millis(500);

    /// A leader that leads and has its signing key (10 s at most).
    async fn leader(&self, client: &reqwest::Client) -> Option<u64> {
        self.granting_leader(client, 200).await
    }

    fn survivor(&self, leader: u64) -> u64 {
        self.ids().find(|id| *id != leader).unwrap_or(1)
    }

    fn kill(&mut self, node: u64) {
        Cluster::kill(self, node);
    }

    fn restart(&mut self, node: u64) -> anyhow::Result<()> {
        Ok(self.start_node(node)?)
    }

    async fn probe(&self, client: &reqwest::Client, node: u64, trial: usize) -> bool {
        let url = format!("{}/v1/leases/failover-{trial}/acquire", self.url(node));
        post(client, &url, &json!({"holder": "bench", "ttl_ms": 5000}))
            .await
            .is_some()
    }
}

/// Each running node's resident set, in KiB.
pub(crate) fn rss_kib(cluster: &Cluster) -> Vec<u64> {
    cluster
        .ids()
        .filter_map(|id| cluster.node(id))
        .map(|node| {
            std::fs::read_to_string(format!("/proc/{}/status", node.pid()))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find(|l| l.starts_with("VmRSS:"))
                        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
                })
                .unwrap_or(0)
        })
        .collect()
}

/// Bytes in files under `path`.
pub(crate) fn disk_bytes(path: &Path) -> u64 {
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => disk_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}
