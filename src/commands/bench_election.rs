//! `palisade bench election`: a real 3-node cluster of this binary on
//! loopback (temp dirs, durable), driven over HTTP.
//!
//! - acquire+release cycles/s over many lease names, and renew/s on held
//!   leases, at each concurrency;
//! - failover: SIGKILL the Raft leader under light load, time until the first
//!   successful acquire through a survivor (restarting the victim between
//!   trials);
//! - with `--ops N`: N acquire+release cycles, then disk use and the nodes' RSS.

use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};

use super::bench::{failover_summary, load, print_table, OpResult};

#[derive(Debug, Args)]
pub struct ElectionBench {
    /// Concurrency levels.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    concurrency: Vec<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Failover trials.
    #[arg(long, default_value_t = 10)]
    failovers: usize,
    /// Also run this many acquire+release cycles and report disk and RSS.
    #[arg(long)]
    ops: Option<u64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

struct Node {
    child: Option<Child>,
    port: u16,
}

struct BenchCluster {
    dir: tempfile::TempDir,
    nodes: Vec<Node>,
    peers: String,
}

impl BenchCluster {
    fn start() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let listeners: Vec<_> = (0..3)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
            .collect::<Result<_, _>>()?;
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()))
            .collect::<Result<_, _>>()?;
        drop(listeners);
        let peers = ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Self {
            dir,
            nodes: ports
                .into_iter()
                .map(|port| Node { child: None, port })
                .collect(),
            peers,
        };
        for id in 1..=3 {
            cluster.start_node(id)?;
        }
        Ok(cluster)
    }

    fn start_node(&mut self, id: usize) -> anyhow::Result<()> {
        let node = &mut self.nodes[id - 1];
        node.child = Some(
            Command::new(std::env::current_exe()?)
                .args([
                    "election",
                    "--id",
                    &id.to_string(),
                    "--listen",
                    &format!("127.0.0.1:{}", node.port),
                    "--peers",
                    &self.peers,
                    "--data-dir",
                ])
                .arg(self.dir.path().join(format!("node{id}")))
                .env("RUST_LOG", "error")
                .stdout(Stdio::null())
                .spawn()?,
        );
        Ok(())
    }

    fn kill(&mut self, id: usize) {
        if let Some(mut child) = self.nodes[id - 1].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn url(&self, id: usize) -> String {
        format!("http://127.0.0.1:{}", self.nodes[id - 1].port)
    }

    async fn leader(&self, client: &reqwest::Client) -> Option<usize> {
        for _ in 0..200 {
            for id in 1..=3 {
                if self.nodes[id - 1].child.is_none() {
                    continue;
                }
                if let Ok(response) = client
                    .get(format!("{}/v1/cluster", self.url(id)))
                    .send()
                    .await
                {
                    if let Ok(body) = response.json::<Value>().await {
                        if body["state"] == "Leader" {
                            let has_key = client
                                .get(format!("{}/v1/jwks", self.url(id)))
                                .send()
                                .await
                                .ok();
                            if let Some(r) = has_key {
                                if r.json::<Value>().await.is_ok_and(|k| {
                                    k["keys"].as_array().is_some_and(|a| !a.is_empty())
                                }) {
                                    return Some(id);
                                }
                            }
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    fn rss_kib(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter_map(|n| n.child.as_ref())
            .map(|c| {
                std::fs::read_to_string(format!("/proc/{}/status", c.id()))
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

    fn disk_bytes(&self) -> u64 {
        fn walk(path: &std::path::Path) -> u64 {
            std::fs::read_dir(path)
                .map(|entries| {
                    entries
                        .filter_map(Result::ok)
                        .map(|e| match e.metadata() {
                            Ok(m) if m.is_dir() => walk(&e.path()),
                            Ok(m) => m.len(),
                            Err(_) => 0,
                        })
                        .sum()
                })
                .unwrap_or(0)
        }
        walk(self.dir.path())
    }
}

impl Drop for BenchCluster {
    fn drop(&mut self) {
        for id in 1..=3 {
            self.kill(id);
        }
    }
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
    let response = request.send().await.map_err(|e| {
        if e.is_timeout() {
            "timeout".to_owned()
        } else {
            "transport".to_owned()
        }
    })?;
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
    let release = json!({"holder": "bench", "token": grant["token"]});
    call(
        client,
        reqwest::Method::POST,
        &format!("{base}/v1/leases/{lease}/release"),
        Some(&release),
    )
    .await
    .map(drop)
}

/// Renew the lease `renew-{task}` held with `token`.
async fn renew(client: &reqwest::Client, base: &str, task: usize, token: u64) -> OpResult {
    let body = json!({"holder": "bench", "token": token});
    call(
        client,
        reqwest::Method::POST,
        &format!("{base}/v1/leases/renew-{task}/renew"),
        Some(&body),
    )
    .await
    .map(drop)
}

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> Option<Value> {
    let response = client.post(url).json(body).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}

pub async fn run(args: ElectionBench) -> anyhow::Result<ExitCode> {
    let mut cluster = BenchCluster::start()?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(128)
        .build()?;
    let Some(leader) = cluster.leader(&client).await else {
        anyhow::bail!("the cluster did not elect a leader");
    };
    let duration = Duration::from_secs(args.seconds);
    let mut results = Vec::new();
    for &concurrency in &args.concurrency {
        let base = cluster.url(leader);
        let c = client.clone();
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
        // Renew (and the mix): one held lease per task.
        let mut tokens = Vec::new();
        for task in 0..concurrency {
            let grant = post(
                &client,
                &format!("{}/v1/leases/renew-{task}/acquire", cluster.url(leader)),
                &json!({"holder": "bench", "ttl_ms": 60_000}),
            )
            .await;
            tokens.push(grant.and_then(|g| g["token"].as_u64()).unwrap_or(0));
        }
        let tokens = std::sync::Arc::new(tokens);
        let (c, base, held) = (client.clone(), cluster.url(leader), tokens.clone());
        results.push(
            load("renew", concurrency, duration, move |task, _| {
                let (c, base, token) = (c.clone(), base.clone(), held[task]);
                async move { renew(&c, &base, task, token).await }
            })
            .await,
        );
        let (c, base, held) = (client.clone(), cluster.url(leader), tokens.clone());
        results.push(
            load(
                "mix 70% renew/20% cycle/10% get",
                concurrency,
                duration,
                move |task, i| {
                    let (c, base, token) = (c.clone(), base.clone(), held[task]);
                    async move {
                        match i % 10 {
                            0..=6 => renew(&c, &base, task, token).await,
                            7 | 8 => cycle(&c, &base, &format!("mix-{task}-{}", i % 64)).await,
                            _ => call(
                                &c,
                                reqwest::Method::GET,
                                &format!("{base}/v1/leases/renew-{task}"),
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

    let mut failovers = Vec::new();
    for trial in 0..args.failovers {
        let Some(leader) = cluster.leader(&client).await else {
            anyhow::bail!("no leader before trial {trial}")
        };
        let survivor = (1..=3).find(|id| *id != leader).unwrap_or(1);
        let killed = Instant::now();
        cluster.kill(leader);
        let short = reqwest::Client::builder()
            .timeout(Duration::from_millis(300))
            .build()?;
        let elapsed = loop {
            let url = format!(
                "{}/v1/leases/failover-{trial}/acquire",
                cluster.url(survivor)
            );
            if post(&short, &url, &json!({"holder": "bench", "ttl_ms": 5000}))
                .await
                .is_some()
            {
                break killed.elapsed();
            }
            if killed.elapsed() > Duration::from_secs(10) {
                anyhow::bail!("no acquire within 10 s of killing the leader");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        failovers.push(elapsed);
        cluster.start_node(leader)?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let mut footprint = None;
    if let Some(ops) = args.ops {
        let Some(leader) = cluster.leader(&client).await else {
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
                            &json!({"holder": "bench", "token": grant["token"]}),
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
            "disk_bytes_all_nodes": cluster.disk_bytes(),
            "rss_kib_per_node": cluster.rss_kib(),
        }));
    }

    let failover = failover_summary(&mut failovers);
    if args.json {
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
