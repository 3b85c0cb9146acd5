//! The HTTP probes that tell whether a node is ready.

use serde_json::Value;

/// The term the election node at `base` leads, if it says it is the Raft
/// leader (`/v1/cluster`). Two
/// nodes may say so at once: one cut off from its peers while it led keeps
/// saying it until it hears of the newer term, and the newer term's leader
/// is the one that can commit.
pub async fn leading_term(client: &reqwest::Client, base: &str) -> Option<u64> {
    get_json(client, &format!("{base}/v1/cluster"))
        .await
        .filter(|cluster| cluster["state"] == "Leader")
        .map(|cluster| cluster["term"].as_u64().unwrap_or(0))
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
