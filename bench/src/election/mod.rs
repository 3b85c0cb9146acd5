//! `palisade-bench election`: a real 3-node cluster on loopback (temp dirs,
//! durable, mutual TLS between peers unless `--insecure-peers`), driven over
//! HTTP.
//!
//! - acquire+release cycles/s over many lease names, and renew/s on held
//!   leases, at each concurrency, over HTTP/2 (one connection, as the SDK
//!   runs); renew/s over HTTP/1.1 (a connection per task) for comparison;
//!   and renewals/s through `POST /v1/renew` batches of `--batch` leases
//!   per task (what an SDK client holding many leases sends);
//! - failover: SIGKILL the Raft leader under light load, time until the first
//!   successful acquire through a survivor (restarting the victim between
//!   trials);
//! - with `--ops N`: N acquire+release cycles, then disk use and the nodes' RSS.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use palisade_local_cluster::{make_certs, Cluster, ClusterConfig, Logs, PeerAuth};
use serde_json::{json, Value};

use crate::load::{
    failover_summary, failovers, http2_client, http_client, load, print_table, transport_error,
    Failover, LoadArgs, OpResult,
};

#[derive(Debug, Args)]
pub struct ElectionBench {
    #[command(flatten)]
    load: LoadArgs,
    /// Failover trials.
    #[arg(long, default_value_t = 10)]
    failovers: usize,
    /// Also run this many acquire+release cycles and report disk and RSS.
    #[arg(long)]
    ops: Option<u64>,
    /// Run peer traffic in plaintext (`--insecure-peers`), to measure what
    /// mutual TLS between peers costs.
    #[arg(long)]
    insecure_peers: bool,
    /// Serve clients over TLS (`--client-tls`) and enforce a policy (the
    /// bench calls as its `admin` principal), to measure what client TLS
    /// and authorization cost. Needs peer certificates (not with
    /// --insecure-peers).
    #[arg(long, conflicts_with = "insecure_peers")]
    secure_clients: bool,
    /// Leases per batch renewal request (each task holds this many).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Only the rows whose name starts with this (e.g. `renew sdk`, to
    /// profile one path).
    #[arg(long)]
    only: Option<String>,
}

/// What a client of a `--secure-clients` cluster needs: the CA and the
/// `admin` API key, from `palisade policy init`; a client with `timeout`
/// trusting the one and sending the other, and the policy file.
fn secure_client(
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

/// One request for a load loop: `Err(kind)` on failure.
async fn call(
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
async fn cycle(client: &reqwest::Client, base: &str, lease: &str) -> OpResult {
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
fn renew_lease(concurrency: usize, task: usize) -> String {
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
fn sdk_client(cluster: &Cluster, stream: bool) -> palisade_client::Client {
    let mut config = palisade_client::ClientConfig::new(cluster.urls());
    config.renew_stream = stream;
    palisade_client::Client::new(config)
}

/// The SDK's handle on `lease`'s grant that `held` (a [`holder_token`])
/// names.
fn grant_id(lease: &str, held: &Value) -> palisade_client::GrantId {
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
async fn batch_leases(
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
async fn renew_batch(client: &reqwest::Client, base: &str, body: &Value) -> OpResult {
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

pub(crate) async fn post(client: &reqwest::Client, url: &str, body: &Value) -> Option<Value> {
    let response = client.post(url).json(body).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}

pub async fn run(args: ElectionBench, palisade: &Path) -> anyhow::Result<ExitCode> {
    let dir = tempfile::tempdir()?;
    let peer_auth = if args.insecure_peers {
        PeerAuth::Insecure
    } else {
        let certs = dir.path().join("certs");
        make_certs(palisade, &certs, 3, &[])?;
        PeerAuth::Certs(certs)
    };
    let mut config = ClusterConfig::new(dir.path(), 3, peer_auth);
    for node in &mut config.nodes {
        node.env = vec![("RUST_LOG".into(), "error".into())];
        node.logs = Logs::Inherit;
    }
    // `client` speaks HTTP/2 (by ALPN over TLS), `http1` HTTP/1.1.
    let (client, http1, short) = if args.secure_clients {
        let (client, policy) = secure_client(palisade, dir.path(), Duration::from_secs(5))?;
        let (short, _) = secure_client(palisade, dir.path(), Duration::from_millis(300))?;
        config.client_tls = true;
        config.policy = Some(policy);
        (client, None, short)
    } else {
        (
            http2_client(Duration::from_secs(5))?,
            Some(http_client(Duration::from_secs(5), 128)?),
            http_client(Duration::from_millis(300), 1)?,
        )
    };
    let mut cluster = Cluster::start(palisade, config)?;
    let Some(leader) = Failover::leader(&cluster, &client).await else {
        anyhow::bail!("the cluster did not elect a leader");
    };
    let duration = args.load.duration();
    let mut results = Vec::new();
    let wanted = |what: &str| args.only.as_deref().is_none_or(|p| what.starts_with(p));
    for &concurrency in &args.load.concurrency {
        let base = cluster.url(leader);
        let c = client.clone();
        if wanted("acquire+release cycle") {
            results.push(
                load(
                    "acquire+release cycle",
                    concurrency,
                    duration,
                    move |task, i| {
                        let (c, base) = (c.clone(), base.clone());
                        async move { cycle(&c, &base, &format!("cycle-{task}-{}", i % 64)).await }
                    },
                )
                .await,
            );
        }
        // Renew (and the mix): one held lease per task.
        let mut grants = Vec::new();
        for task in 0..concurrency {
            let grant = post(
                &client,
                &format!(
                    "{}/v1/leases/{}/acquire",
                    cluster.url(leader),
                    renew_lease(concurrency, task)
                ),
                &json!({"holder": "bench", "ttl_ms": 60_000}),
            )
            .await;
            grants.push(grant.as_ref().map_or(Value::Null, holder_token));
        }
        let grants = std::sync::Arc::new(grants);
        let (c, base, held) = (client.clone(), cluster.url(leader), grants.clone());
        if wanted("renew") {
            results.push(
                load("renew", concurrency, duration, move |task, _| {
                    let (c, base, held) = (c.clone(), base.clone(), held.clone());
                    let lease = renew_lease(concurrency, task);
                    async move { renew(&c, &base, &lease, &held[task]).await }
                })
                .await,
            );
        }
        if let Some(http1) = http1.as_ref().filter(|_| wanted("renew http/1.1")) {
            let (c, base, held) = (http1.clone(), cluster.url(leader), grants.clone());
            results.push(
                load("renew http/1.1", concurrency, duration, move |task, _| {
                    let (c, base, held) = (c.clone(), base.clone(), held.clone());
                    let lease = renew_lease(concurrency, task);
                    async move { renew(&c, &base, &lease, &held[task]).await }
                })
                .await,
            );
        }
        // The SDK's own renewal path: each task renews its lease through one
        // `Client`, which batches what falls due together: over its renewal
        // stream (the default), and as requests.
        let ids = std::sync::Arc::new(
            grants
                .iter()
                .enumerate()
                .map(|(task, held)| grant_id(&renew_lease(concurrency, task), held))
                .collect::<Vec<_>>(),
        );
        for (what, stream) in [
            ("renew sdk (stream)", true),
            ("renew sdk (requests)", false),
        ] {
            if args.secure_clients || !wanted(what) {
                continue;
            }
            let sdk = std::sync::Arc::new(sdk_client(&cluster, stream));
            let ids = ids.clone();
            results.push(
                load(what, concurrency, duration, move |task, _| {
                    let (sdk, ids) = (sdk.clone(), ids.clone());
                    async move {
                        sdk.renew_grant(&ids[task])
                            .await
                            .map(drop)
                            .map_err(|e| format!("sdk {e}").chars().take(60).collect())
                    }
                })
                .await,
            );
        }
        let what = format!("renew batch x{}", args.batch);
        if wanted(&what) {
            let batches = std::sync::Arc::new(
                batch_leases(&client, &cluster.url(leader), concurrency, args.batch).await?,
            );
            let (c, base) = (client.clone(), cluster.url(leader));
            results.push(
                load(&what, concurrency, duration, move |task, _| {
                    let (c, base, batches) = (c.clone(), base.clone(), batches.clone());
                    async move { renew_batch(&c, &base, &batches[task]).await }
                })
                .await
                .per_op(args.batch as u64),
            );
        }
        let (c, base, held) = (client.clone(), cluster.url(leader), grants.clone());
        if wanted("mix") {
            results.push(
                load(
                    "mix 70% renew/20% cycle/10% get",
                    concurrency,
                    duration,
                    move |task, i| {
                        let (c, base, held) = (c.clone(), base.clone(), held.clone());
                        let lease = renew_lease(concurrency, task);
                        async move {
                            match i % 10 {
                                0..=6 => renew(&c, &base, &lease, &held[task]).await,
                                7 | 8 => cycle(&c, &base, &format!("mix-{task}-{}", i % 64)).await,
                                _ => call(
                                    &c,
                                    reqwest::Method::GET,
                                    &format!("{base}/v1/leases/{lease}"),
                                    None,
                                )
                                .await
                                .map(drop),
                            }
                        }
                    },
                )
                .await,
            );
        }
    }

    let mut failovers = failovers(&mut cluster, &client, &short, args.failovers).await?;

    let mut footprint = None;
    if let Some(ops) = args.ops {
        let Some(leader) = Failover::leader(&cluster, &client).await else {
            anyhow::bail!("no leader for --ops")
        };
        let base = cluster.url(leader);
        let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for task in 0..32 {
            let (c, base, done) = (client.clone(), base.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = 0u64;
                while done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < ops {
                    let lease = format!("soak-{task}-{}", i % 16);
                    if let Some(grant) = post(
                        &c,
                        &format!("{base}/v1/leases/{lease}/acquire"),
                        &json!({"holder": "bench", "ttl_ms": 10_000}),
                    )
                    .await
                    {
                        let _ = post(
                            &c,
                            &format!("{base}/v1/leases/{lease}/release"),
                            &holder_token(&grant),
                        )
                        .await;
                    }
                    i += 1;
                }
            }));
        }
        for task in tasks {
            let _ = task.await;
        }
        footprint = Some(json!({
            "cycles": ops,
            "log_entries": ops * 2,
            "seconds": started.elapsed().as_secs_f64(),
            "disk_bytes_all_nodes": cluster
                .ids()
                .map(|id| disk_bytes(&cluster.setup(id).data_dir))
                .sum::<u64>(),
            "rss_kib_per_node": rss_kib(&cluster),
        }));
    }

    let failover = failover_summary(&mut failovers);
    if args.load.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({ "load": results, "failover": failover, "footprint": footprint })
            )?
        );
    } else {
        print_table(&results);
        println!("failover (SIGKILL leader -> first acquire via a survivor): {failover}");
        if let Some(footprint) = footprint {
            println!("footprint: {footprint}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
