//! The requests the election benchmark (and `scale.rs`) sends to a node:
//! acquire+release cycles, single and batch renewals, and the SDK's handle
//! on a grant, each as one operation for the load engine.

use palisade_local_cluster::Cluster;
use serde_json::{json, Value};

use crate::load::{transport_error, OpResult};

/// One request for a load loop: `Err(kind)` on failure.
pub(super) async fn call(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<&Value>,
) -> Result<Value, String> {
    let mut request = client.request(method, url);
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.map_err(|e| transport_error(&e))?;
    let status = response.status();
    if !status.is_success() {
        let code: Value = response.json().await.unwrap_or(Value::Null);
        return Err(format!(
            "http {} {}",
            status.as_u16(),
            code["error"].as_str().unwrap_or("")
        ));
    }
    response.json().await.map_err(|_| "bad body".to_owned())
}

/// What renew and release present for `grant`: its holder, token and
/// secret (the node chose the secret, since the acquire named none).
pub(crate) fn holder_token(grant: &Value) -> Value {
    json!({"holder": "bench", "token": grant["token"], "secret": grant["secret"]})
}

/// Acquire then release `lease`.
pub(super) async fn cycle(client: &reqwest::Client, base: &str, lease: &str) -> OpResult {
    let acquire = json!({"holder": "bench", "ttl_ms": 10_000});
    let grant = call(
        client,
        reqwest::Method::POST,
        &format!("{base}/v1/leases/{lease}/acquire"),
        Some(&acquire),
    )
    .await?;
    call(
        client,
        reqwest::Method::POST,
        &format!("{base}/v1/leases/{lease}/release"),
        Some(&holder_token(&grant)),
    )
    .await
    .map(drop)
}

/// The lease task `task` holds for the renew runs at `concurrency` (each level
/// its own: a level's leases are still held, under their own secrets, when
/// the next level starts).
pub(super) fn renew_lease(concurrency: usize, task: usize) -> String {
    format!("renew-c{concurrency}-{task}")
}

/// Renew `lease`, presenting `held` (its [`holder_token`]).
pub(crate) async fn renew(
    client: &reqwest::Client,
    base: &str,
    lease: &str,
    held: &Value,
) -> OpResult {
    call(
        client,
        reqwest::Method::POST,
        &format!("{base}/v1/leases/{lease}/renew"),
        Some(held),
    )
    .await
    .map(drop)
}

/// An SDK client of `cluster`, as a service would configure it (`stream`:
/// renewals over the renewal stream, the default; else as requests).
pub(super) fn sdk_client(cluster: &Cluster, stream: bool) -> palisade_client::Client {
    let mut config = palisade_client::ClientConfig::new(cluster.urls());
    config.renew_stream = stream;
    palisade_client::Client::new(config)
}

/// The SDK's handle on `lease`'s grant that `held` (a [`holder_token`])
/// names.
pub(super) fn grant_id(lease: &str, held: &Value) -> palisade_client::GrantId {
    palisade_client::GrantId {
        lease: lease.to_owned(),
        holder: "bench".to_owned(),
        token: held["token"].as_u64().unwrap_or(0),
        grant_index: None,
        secret: held["secret"]
            .as_str()
            .and_then(|s| palisade_client::GrantSecret::new(s).ok()),
    }
}

/// For each of `concurrency` tasks, the body of a batch renewal of
/// `batch` leases it holds (acquired here, 64 at a time).
pub(super) async fn batch_leases(
    client: &reqwest::Client,
    base: &str,
    concurrency: usize,
    batch: usize,
) -> anyhow::Result<Vec<Value>> {
    let names: Vec<String> = (0..concurrency * batch)
        .map(|i| format!("batch-c{concurrency}-{i}"))
        .collect();
    let mut entries = Vec::new();
    for chunk in names.chunks(64) {
        let body = json!({"holder": "bench", "ttl_ms": 60_000});
        let urls: Vec<String> = chunk
            .iter()
            .map(|name| format!("{base}/v1/leases/{name}/acquire"))
            .collect();
        let grants =
            futures::future::join_all(urls.iter().map(|url| post(client, url, &body))).await;
        for (name, grant) in chunk.iter().zip(grants) {
            let Some(grant) = grant else {
                anyhow::bail!("could not acquire {name} for the batch renewals");
            };
            let mut entry = holder_token(&grant);
            entry["lease"] = json!(name);
            entries.push(entry);
        }
    }
    Ok(entries
        .chunks(batch.max(1))
        .map(|renewals| json!({ "renewals": renewals }))
        .collect())
}

/// One batch renewal: every lease in it must be renewed.
pub(super) async fn renew_batch(client: &reqwest::Client, base: &str, body: &Value) -> OpResult {
    let answer = call(
        client,
        reqwest::Method::POST,
        &format!("{base}/v1/renew"),
        Some(body),
    )
    .await?;
    let results = answer["results"].as_array().ok_or("bad body")?;
    match results.iter().find(|r| r["status"] != 200) {
        None => Ok(()),
        Some(refused) => Err(format!(
            "renewal {} {}",
            refused["status"],
            refused["error"].as_str().unwrap_or("")
        )),
    }
}

/// POSTs `body` to `url`: the answer's JSON, or none on any failure.
pub(crate) async fn post(client: &reqwest::Client, url: &str, body: &Value) -> Option<Value> {
    let response = client.post(url).json(body).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}
