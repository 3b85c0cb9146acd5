//! `palisade-bench etcd`: the same work against etcd, in the same run
//! conditions, for side-by-side ratios: a 3-node etcd on loopback (durable,
//! default fsync) for lease grant + put + revoke cycles, keepalives and
//! failover, and a single-node etcd for plain puts — through its JSON
//! gateway, and, built with `--features etcd-grpc`, through its native gRPC
//! client as well (`etcd_grpc.rs`; `--hold-leases N` adds N leases on one
//! keepalive stream each and the leader's CPU per keepalive).
//! Needs `etcd` on PATH (Debian: `apt-get install etcd-server`).

use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use base64::Engine;
use clap::Args;
use serde_json::{json, Value};

use crate::load::{
    failover_summary, failovers, http_client, load, print_table, transport_error, Failover,
    Figures, LoadArgs, OpResult,
};

#[derive(Debug, Args)]
pub struct EtcdBench {
    #[command(flatten)]
    load: LoadArgs,
    /// Failover trials.
    #[arg(long, default_value_t = 10)]
    failovers: usize,
    /// Value size for puts, in bytes.
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
    /// With the gRPC client: also hold this many leases on one keepalive
    /// stream each, renewed every ttl/3, and measure the leader's CPU.
    #[arg(long, default_value_t = 0)]
    hold_leases: usize,
    /// Their ttl, in seconds.
    #[arg(long, default_value_t = 3)]
    hold_ttl_secs: i64,
    /// Seconds measured.
    #[arg(long, default_value_t = 20)]
    hold_seconds: u64,
}

/// An etcd cluster on loopback: per node its process (`None` while
/// killed), client port and peer port.
struct Etcd {
    dir: tempfile::TempDir,
    nodes: Vec<(Option<Child>, u16, u16)>,
}

impl Etcd {
    fn start(size: usize) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let ports = palisade_local_cluster::free_ports(2 * size)?;
        let nodes = ports.chunks(2).map(|p| (None, p[0], p[1])).collect();
        let mut etcd = Self { dir, nodes };
        for i in 0..size {
            etcd.start_node(i)?;
        }
        Ok(etcd)
    }

    fn start_node(&mut self, i: usize) -> anyhow::Result<()> {
        let cluster = self
            .nodes
            .iter()
            .enumerate()
            .map(|(j, (_, _, peer))| format!("n{j}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let (_, client, peer) = self.nodes[i];
        let child = Command::new("etcd")
            .args(["--name", &format!("n{i}"), "--data-dir"])
            .arg(self.dir.path().join(format!("n{i}")))
            .args([
                "--listen-client-urls",
                &format!("http://127.0.0.1:{client}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{client}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-cluster",
                &cluster,
                "--initial-cluster-state",
                "new",
                "--log-level",
                "error",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.nodes[i].0 = Some(child);
        Ok(())
    }

    fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.nodes[i].1)
    }
}

impl Failover for Etcd {
    type Node = usize;
    const PREFIX: &'static str = "etcd: ";
    const PROBE: &'static str = "put";
    const LIMIT: Duration = Duration::from_secs(15);
    const SETTLE: Duration = Duration::from_millis(1500);

    /// The index of a node that says it leads (10 s at most).
    async fn leader(&self, client: &reqwest::Client) -> Option<usize> {
        for _ in 0..200 {
            for i in 0..self.nodes.len() {
                if self.nodes[i].0.is_none() {
                    continue;
                }
                let Some(status) = post(
                    client,
                    &format!("{}/v3/maintenance/status", self.url(i)),
                    &json!({}),
                )
                .await
                else {
                    continue;
                };
                if status["leader"] == status["header"]["member_id"] && status["leader"].is_string()
                {
                    return Some(i);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    fn survivor(&self, leader: usize) -> usize {
        (leader + 1) % self.nodes.len()
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        self.start_node(i)
    }

    async fn probe(&self, client: &reqwest::Client, i: usize, trial: usize) -> bool {
        let put = json!({"key": b64(format!("failover-{trial}").as_bytes()), "value": b64(b"x")});
        post(client, &format!("{}/v3/kv/put", self.url(i)), &put)
            .await
            .is_some()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// One request for a load loop: `Err(kind)` on failure.
async fn call(client: &reqwest::Client, url: &str, body: &Value) -> Result<Value, String> {
    let response = client
        .post(url)
        .json(body)
        .send()
        .await
        .map_err(|e| transport_error(&e))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("http {}", status.as_u16()));
    }
    let value: Value = response.json().await.map_err(|_| "bad body".to_owned())?;
    match value.get("error") {
        Some(error) => Err(format!("etcd {}", error.as_str().unwrap_or("error"))),
        None => Ok(value),
    }
}

/// Grant a lease, put `key` with it, revoke it.
async fn cycle(client: &reqwest::Client, base: &str, key: &str, value: &str) -> OpResult {
    let grant = call(
        client,
        &format!("{base}/v3/lease/grant"),
        &json!({"TTL": 10}),
    )
    .await?;
    let id = grant["ID"].clone();
    let put = json!({"key": b64(key.as_bytes()), "value": value, "lease": id});
    call(client, &format!("{base}/v3/kv/put"), &put).await?;
    call(
        client,
        &format!("{base}/v3/lease/revoke"),
        &json!({"ID": id}),
    )
    .await
    .map(drop)
}

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> Option<Value> {
    let response = client.post(url).json(body).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    let value: Value = response.json().await.ok()?;
    value.get("error").is_none().then_some(value)
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub async fn run(args: EtcdBench) -> anyhow::Result<ExitCode> {
    let client = http_client(Duration::from_secs(5), 128)?;
    let duration = args.load.duration();
    let value = b64(&vec![b'v'; args.value_bytes]);
    let mut results = Vec::new();

    let mut cluster = Etcd::start(3)?;
    let Some(leader) = Failover::leader(&cluster, &client).await else {
        anyhow::bail!("etcd elected no leader (is etcd installed?)")
    };
    for &concurrency in &args.load.concurrency {
        let base = cluster.url(leader);
        results.push(cycle_row(&client, &base, concurrency, duration, &value).await);
        let ids = std::sync::Arc::new(grant_leases(&client, &base, concurrency).await);
        results.push(keepalive_row(&client, &base, concurrency, duration, &ids).await);
        results.push(mix_row(&client, &base, concurrency, duration, &ids, &value).await);
    }
    let hold = grpc_rows(&args, &cluster, leader, &mut results).await?;

    let short = http_client(Duration::from_millis(300), 1)?;
    let mut failovers = failovers(&mut cluster, &client, &short, args.failovers).await?;
    drop(cluster);

    let single = Etcd::start(1)?;
    Failover::leader(&single, &client).await;
    let single_pid: Vec<u32> = single.nodes[0]
        .0
        .as_ref()
        .map(Child::id)
        .into_iter()
        .collect();
    for &concurrency in &args.load.concurrency {
        let base = single.url(0);
        let row = single_put_row(&client, &base, concurrency, duration, &value);
        results.push(crate::load::measured_cpu(&single_pid, row).await);
    }

    #[cfg(feature = "etcd-grpc")]
    results.extend(
        crate::etcd_grpc::put_rows(
            &single.url(0),
            &single_pid,
            &args.load.concurrency,
            (duration, args.value_bytes),
        )
        .await?,
    );

    let failover = failover_summary(&mut failovers);
    if args.load.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({ "load": results, "failover": failover, "hold": hold })
            )?
        );
    } else {
        print_table(&results);
        println!("etcd failover (SIGKILL leader -> first put via a survivor): {failover}");
        if !hold.is_null() {
            println!("etcd hold: {hold}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Grant+put+revoke cycles against `base`.
async fn cycle_row(
    client: &reqwest::Client,
    base: &str,
    concurrency: usize,
    duration: Duration,
    value: &str,
) -> Figures {
    let (c, base, cycle_value) = (client.clone(), base.to_owned(), value.to_owned());
    load(
        "etcd grant+put+revoke cycle",
        concurrency,
        duration,
        move |task, i| {
            let (c, base, value) = (c.clone(), base.clone(), cycle_value.clone());
            async move { cycle(&c, &base, &format!("cycle-{task}-{}", i % 64), &value).await }
        },
    )
    .await
}

/// One 60 s lease per task for the keepalive rows: its ID (null if the
/// grant failed).
async fn grant_leases(client: &reqwest::Client, base: &str, concurrency: usize) -> Vec<Value> {
    let mut ids = Vec::new();
    for _ in 0..concurrency {
        let grant = post(
            client,
            &format!("{base}/v3/lease/grant"),
            &json!({"TTL": 60}),
        )
        .await;
        ids.push(grant.map(|g| g["ID"].clone()).unwrap_or(Value::Null));
    }
    ids
}

/// Each task keeps its lease in `ids` alive.
async fn keepalive_row(
    client: &reqwest::Client,
    base: &str,
    concurrency: usize,
    duration: Duration,
    ids: &std::sync::Arc<Vec<Value>>,
) -> Figures {
    let (c, base, held) = (client.clone(), base.to_owned(), ids.clone());
    load(
        "etcd lease keepalive",
        concurrency,
        duration,
        move |task, _| {
            let (c, base, id) = (c.clone(), base.clone(), held[task].clone());
            async move {
                call(
                    &c,
                    &format!("{base}/v3/lease/keepalive"),
                    &json!({"ID": id}),
                )
                .await
                .map(drop)
            }
        },
    )
    .await
}

/// 70% keepalives of the lease in `ids`, 20% cycles, 10% ranges.
async fn mix_row(
    client: &reqwest::Client,
    base: &str,
    concurrency: usize,
    duration: Duration,
    ids: &std::sync::Arc<Vec<Value>>,
    value: &str,
) -> Figures {
    let (c, base, held, value) = (
        client.clone(),
        base.to_owned(),
        ids.clone(),
        value.to_owned(),
    );
    load(
        "etcd mix 70% keepalive/20% cycle/10% range",
        concurrency,
        duration,
        move |task, i| {
            let (c, base, id, value) = (c.clone(), base.clone(), held[task].clone(), value.clone());
            async move {
                match i % 10 {
                    0..=6 => call(
                        &c,
                        &format!("{base}/v3/lease/keepalive"),
                        &json!({"ID": id}),
                    )
                    .await
                    .map(drop),
                    7 | 8 => cycle(&c, &base, &format!("mix-{task}-{}", i % 64), &value).await,
                    _ => call(
                        &c,
                        &format!("{base}/v3/kv/range"),
                        &json!({"key": b64(format!("mix-{task}-0").as_bytes())}),
                    )
                    .await
                    .map(drop),
                }
            }
        },
    )
    .await
}

/// With the gRPC client: its rows against the cluster (appended to
/// `results`) and, with `--hold-leases`, the hold figures (else null).
#[cfg(feature = "etcd-grpc")]
async fn grpc_rows(
    args: &EtcdBench,
    cluster: &Etcd,
    leader: usize,
    results: &mut Vec<Figures>,
) -> anyhow::Result<Value> {
    let duration = args.load.duration();
    let endpoints: Vec<String> = (0..3).map(|i| cluster.url(i)).collect();
    // As `compare.sh` users connect (all endpoints: most calls reach a
    // follower, which forwards them), and at etcd's best: the leader
    // alone.
    let pid = cluster.nodes[leader].0.as_ref().map(Child::id);
    let leader_pid: Vec<u32> = pid.into_iter().collect();
    for (label, given) in [
        ("etcd grpc", endpoints.clone()),
        ("etcd grpc@leader", vec![cluster.url(leader)]),
    ] {
        results.extend(
            crate::etcd_grpc::cluster_rows(
                (&given, &leader_pid),
                label,
                &args.load.concurrency,
                (duration, args.value_bytes),
            )
            .await?,
        );
    }
    if args.hold_leases == 0 {
        return Ok(Value::Null);
    }
    crate::etcd_grpc::hold(
        &endpoints,
        args.hold_leases,
        args.hold_ttl_secs,
        args.hold_seconds,
        || crate::cpu::cpu_time(pid?),
    )
    .await
}

/// Without the gRPC client there are no such rows, and `--hold-leases`
/// is refused.
#[cfg(not(feature = "etcd-grpc"))]
async fn grpc_rows(
    args: &EtcdBench,
    _cluster: &Etcd,
    _leader: usize,
    _results: &mut Vec<Figures>,
) -> anyhow::Result<Value> {
    if args.hold_leases > 0 {
        anyhow::bail!("--hold-leases needs the gRPC client: build with --features etcd-grpc");
    }
    Ok(Value::Null)
}

/// Puts of `value` to a single-node etcd at `base`.
async fn single_put_row(
    client: &reqwest::Client,
    base: &str,
    concurrency: usize,
    duration: Duration,
    value: &str,
) -> Figures {
    let (c, base, value) = (client.clone(), base.to_owned(), value.to_owned());
    load(
        "etcd single-node put",
        concurrency,
        duration,
        move |task, i| {
            let (c, base, value) = (c.clone(), base.clone(), value.clone());
            async move {
                let key = b64(format!("bench/{task}/{}", i % 100).as_bytes());
                call(
                    &c,
                    &format!("{base}/v3/kv/put"),
                    &json!({"key": key, "value": value}),
                )
                .await
                .map(drop)
            }
        },
    )
    .await
}
