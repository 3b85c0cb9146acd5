//! The HTTP probes that tell whether a node is ready.

use serde_json::Value;

/// Whether the election node at `base` says it is the Raft leader
/// (`/v1/cluster`).
pub async fn leads(client: &reqwest::Client, base: &str) -> bool {
    get_json(client, &format!("{base}/v1/cluster"))
        .await
        .is_some_and(|cluster| cluster["state"] == "Leader")
}

/// Whether the election node at `base` serves a signing key (`/v1/jwks`):
/// the cluster's key is installed, so grants can be signed and gateways can
/// verify them.
pub async fn signing_key_installed(client: &reqwest::Client, base: &str) -> bool {
    get_json(client, &format!("{base}/v1/jwks"))
        .await
        .is_some_and(|jwks| jwks["keys"].as_array().is_some_and(|keys| !keys.is_empty()))
}

/// Whether `base/healthz` answers 2xx.
pub async fn healthy(client: &reqwest::Client, base: &str) -> bool {
    client
        .get(format!("{base}/healthz"))
        .send()
        .await
        .is_ok_and(|response| response.status().is_success())
}

async fn get_json(client: &reqwest::Client, url: &str) -> Option<Value> {
    client.get(url).send().await.ok()?.json().await.ok()
}
