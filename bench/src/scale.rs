//! `palisade-bench scale`: what a big table and many waiters cost, on a
//! real 3-node cluster (mutual TLS between peers, plain HTTP clients).
//!
//! 1. Empty table: renew/s and p99 at `--concurrency`, the nodes' RSS.
//! 2. `--leases` held leases (ttl 1 h) granted, then `--watchers` idle
//!    watches (spread over the three nodes, re-issued as they return; one
//!    refused over the node's waiting seats, a 429, waits its Retry-After
//!    and is counted in `watches_refused_during_run`; with
//!    `--watchers-per-address N` they come from loopback addresses
//!    127.0.0.2 and up, N from each, as many clients' watches would,
//!    instead of all from the renewals' own address), and
//!    the same renew load again: the ratio is what the table and the
//!    watchers cost. RSS and disk with the table.
//! 3. The held leases released, then `--names` distinct names each
//!    acquired and released once; after `--reclaim-after-ms` (passed to
//!    the nodes) and a margin, the table is empty again: RSS then, against
//!    the empty-table RSS of step 1.

use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use palisade_local_cluster::{make_certs, Cluster, ClusterConfig, Logs, PeerAuth};
use palisade_plumbing::sync::lock;
use serde_json::{json, Value};

use crate::election::{disk_bytes, holder_token, post, renew, rss_kib};
use crate::load::{http_client, http_client_from, load, print_table, Failover, Figures};

#[derive(Debug, Args)]
pub struct ScaleBench {
    /// Held leases in step 2.
    #[arg(long, default_value_t = 100_000)]
    leases: usize,
    /// Idle watchers in step 2.
    #[arg(long, default_value_t = 5_000)]
    watchers: usize,
    /// Passed to the nodes as `--snapshot-every` (0: the node's default).
    #[arg(long, default_value_t = 0)]
    snapshot_every: u64,
    /// Watchers per client address in step 2, from 127.0.0.2 up (0: all
    /// from the bench's own address, which the renewals share).
    #[arg(long, default_value_t = 0)]
    watchers_per_address: usize,
    /// Distinct names acquired and released once in step 3 (0 skips it).
    #[arg(long, default_value_t = 1_000_000)]
    names: usize,
    /// The nodes' `--reclaim-after-ms`.
    #[arg(long, default_value_t = 10_000)]
    reclaim_after_ms: u64,
    /// The nodes' `--max-requests` (0: the node's default, 4 096, whose
    /// pool for calls that wait — an eighth of it, 512 per node — holds
    /// about a third of 5 000 watchers: the rest are refused 429 and come
    /// back after `Retry-After` all through the run).
    #[arg(long, default_value_t = 0)]
    max_requests: u64,
    /// Renewing tasks.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Seconds per renew measurement.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `count` calls of `op(i)` from `tasks` tasks; returns the seconds.
async fn spread<F, Fut>(count: usize, tasks: usize, op: F) -> f64
where
    F: Fn(usize) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (op, next) = (op.clone(), next.clone());
        handles.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= count {
                    return;
                }
                op(i).await;
            }
        }));
    }
    for handle in handles {
        let _ = handle.await;
    }
    started.elapsed().as_secs_f64()
}

/// Acquires `lease` (ttl `ttl_ms`), retrying 503s for a few seconds.
async fn acquire(client: &reqwest::Client, base: &str, lease: &str, ttl_ms: u64) -> Option<Value> {
    let url = format!("{base}/v1/leases/{lease}/acquire");
    for _ in 0..50 {
        if let Some(grant) = post(client, &url, &json!({"holder": "bench", "ttl_ms": ttl_ms})).await
        {
            return Some(grant);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

async fn release(client: &reqwest::Client, base: &str, lease: &str, grant: &Value) {
    let url = format!("{base}/v1/leases/{lease}/release");
    let _ = post(client, &url, &holder_token(grant)).await;
}

/// Renew load: one held lease per task, renewed back to back.
async fn renew_load(
    client: &reqwest::Client,
    base: &str,
    (tag, what): (&str, &str),
    concurrency: usize,
    duration: Duration,
) -> Figures {
    let mut grants = Vec::new();
    for task in 0..concurrency {
        let lease = format!("renew-{tag}-{task}");
        let grant = acquire(client, base, &lease, 60_000).await;
        grants.push(grant.as_ref().map_or(Value::Null, holder_token));
    }
    let grants = Arc::new(grants);
    let (c, base, tag) = (client.clone(), base.to_owned(), tag.to_owned());
    load(
        &format!("renew, {what}"),
        concurrency,
        duration,
        move |task, _| {
            let (c, base, held) = (c.clone(), base.clone(), grants.clone());
            let lease = format!("renew-{tag}-{task}");
            async move { renew(&c, &base, &lease, &held[task]).await }
        },
    )
    .await
}

/// Leases in the leader's table (pages through the list).
async fn table_size(client: &reqwest::Client, base: &str) -> u64 {
    let mut count = 0;
    let mut after: Option<String> = None;
    loop {
        let mut url = format!("{base}/v1/leases?limit=1000");
        if let Some(after) = &after {
            url.push_str(&format!("&after={after}"));
        }
        let Ok(answer) = client.get(&url).send().await else {
            return count;
        };
        let Ok(page) = answer.json::<Value>().await else {
            return count;
        };
        count += page["leases"].as_array().map_or(0, Vec::len) as u64;
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return count,
        }
    }
}

/// The report's figures, in the order they are taken.
type Report = serde_json::Map<String, Value>;

pub async fn run(args: ScaleBench, palisade: &Path) -> anyhow::Result<ExitCode> {
    let dir = tempfile::tempdir()?;
    let config = cluster_config(&args, palisade, dir.path())?;
    let client = http_client(Duration::from_secs(10), 256)?;
    let cluster = Cluster::start(palisade, config)?;
    let Some(leader) = Failover::leader(&cluster, &client).await else {
        anyhow::bail!("the cluster did not elect a leader");
    };
    let bench = Scale {
        base: cluster.url(leader),
        args: &args,
        client: &client,
        cluster: &cluster,
        duration: Duration::from_secs(args.seconds),
    };
    let mut report = Report::new();
    let mut results = Vec::new();

    // 1. Empty table.
    report.insert("rss_kib_empty".into(), json!(rss_kib(&cluster)));
    results.push(bench.renewals(("empty", "empty table")).await);

    // 2. A big table and idle watchers.
    let grants = bench.grant_table(&mut report).await;
    results.push(bench.renewals_while_watched(&mut report).await?);

    // 3. Release everything; a million names used once; reclaimed.
    bench.release_table(&grants).await;
    if args.names > 0 {
        bench.names_once(&mut report).await;
    }
    bench.await_reclamation(&mut report).await;

    if args.json {
        let out = json!({"load": results, "footprint": report});
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_table(&results);
        for (key, value) in &report {
            println!("{key}: {value}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The 3-node cluster in `dir`: peers on mutual TLS, the nodes' flags from
/// the bench's.
fn cluster_config(args: &ScaleBench, palisade: &Path, dir: &Path) -> anyhow::Result<ClusterConfig> {
    let certs = dir.join("certs");
    make_certs(palisade, &certs, 3, &[])?;
    let mut config = ClusterConfig::new(dir, 3, PeerAuth::Certs(certs));
    for node in &mut config.nodes {
        node.env = vec![("RUST_LOG".into(), "error".into())];
        node.logs = Logs::Inherit;
        node.args = vec![
            "--reclaim-after-ms".into(),
            args.reclaim_after_ms.to_string(),
        ];
        if args.snapshot_every > 0 {
            node.args.push("--snapshot-every".into());
            node.args.push(args.snapshot_every.to_string());
        }
        if args.max_requests > 0 {
            node.args.push("--max-requests".into());
            node.args.push(args.max_requests.to_string());
        }
    }
    Ok(config)
}

/// What every step of the bench shares.
struct Scale<'a> {
    args: &'a ScaleBench,
    client: &'a reqwest::Client,
    cluster: &'a Cluster,
    /// The leader's URL, where the leases are granted and renewed.
    base: String,
    /// How long each renew measurement runs.
    duration: Duration,
}

impl Scale<'_> {
    /// [`renew_load`] on the leader at `--concurrency`.
    async fn renewals(&self, (tag, what): (&str, &str)) -> Figures {
        let concurrency = self.args.concurrency;
        renew_load(
            self.client,
            &self.base,
            (tag, what),
            concurrency,
            self.duration,
        )
        .await
    }

    /// Each node's bytes on disk.
    fn disk_per_node(&self) -> Value {
        json!(self
            .cluster
            .ids()
            .map(|id| disk_bytes(&self.cluster.setup(id).data_dir))
            .collect::<Vec<_>>())
    }

    /// Grants `--leases` leases (ttl 1 h) from 64 tasks; answers their
    /// grants (null where an acquire failed).
    async fn grant_table(&self, report: &mut Report) -> Arc<std::sync::Mutex<Vec<Value>>> {
        let grants: Arc<std::sync::Mutex<Vec<Value>>> =
            Arc::new(std::sync::Mutex::new(vec![Value::Null; self.args.leases]));
        let (c, b, g) = (self.client.clone(), self.base.clone(), grants.clone());
        let seconds = spread(self.args.leases, 64, move |i| {
            let (c, b, g) = (c.clone(), b.clone(), g.clone());
            async move {
                if let Some(grant) = acquire(&c, &b, &format!("big-{i}"), 3_600_000).await {
                    lock(&g)[i] = grant;
                }
            }
        })
        .await;
        report.insert("grant_seconds".into(), json!(seconds));
        report.insert("rss_kib_with_table".into(), json!(rss_kib(self.cluster)));
        report.insert(
            "disk_bytes_per_node_with_table".into(),
            self.disk_per_node(),
        );
        grants
    }

    /// The renew load again, with `--watchers` idle watches on the table.
    async fn renewals_while_watched(&self, report: &mut Report) -> anyhow::Result<Figures> {
        let args = self.args;
        let watchers = Watchers::start(args, self.cluster).await?;
        // Let them all arrive and settle into waiting.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let label = format!("{} leases + {} watchers", args.leases, args.watchers);
        let figures = self.renewals(("loaded", &label)).await;
        report.insert(
            "rss_kib_with_table_and_watchers".into(),
            json!(rss_kib(self.cluster)),
        );
        report.insert(
            "watch_answers_during_run".into(),
            json!(watchers.answered.load(Ordering::Relaxed)),
        );
        report.insert(
            "watches_refused_during_run".into(),
            json!(watchers.refused.load(Ordering::Relaxed)),
        );
        watchers.stop();
        Ok(figures)
    }

    /// Releases the leases [`Self::grant_table`] granted.
    async fn release_table(&self, grants: &std::sync::Mutex<Vec<Value>>) {
        let held: Vec<Value> = std::mem::take(&mut *lock(grants));
        let held = Arc::new(held);
        let (c, b, h) = (self.client.clone(), self.base.clone(), held.clone());
        spread(self.args.leases, 64, move |i| {
            let (c, b, h) = (c.clone(), b.clone(), h.clone());
            async move {
                if !h[i].is_null() {
                    release(&c, &b, &format!("big-{i}"), &h[i]).await;
                }
            }
        })
        .await;
    }

    /// `--names` distinct names, each acquired and released once.
    async fn names_once(&self, report: &mut Report) {
        let (c, b) = (self.client.clone(), self.base.clone());
        let seconds = spread(self.args.names, 64, move |i| {
            let (c, b) = (c.clone(), b.clone());
            async move {
                let lease = format!("name-{i}");
                if let Some(grant) = acquire(&c, &b, &lease, 60_000).await {
                    release(&c, &b, &lease, &grant).await;
                }
            }
        })
        .await;
        report.insert("names".into(), json!(self.args.names));
        report.insert("names_seconds".into(), json!(seconds));
        report.insert("rss_kib_after_names".into(), json!(rss_kib(self.cluster)));
        report.insert(
            "table_after_names".into(),
            json!(table_size(self.client, &self.base).await),
        );
    }

    /// Waits for reclamation: the table back to (about) empty, bounded.
    async fn await_reclamation(&self, report: &mut Report) {
        let waited = Instant::now();
        let limit = Duration::from_millis(self.args.reclaim_after_ms) + Duration::from_secs(120);
        let mut left = table_size(self.client, &self.base).await;
        while left > 2 * self.args.concurrency as u64 && waited.elapsed() < limit {
            tokio::time::sleep(Duration::from_secs(2)).await;
            left = table_size(self.client, &self.base).await;
        }
        report.insert("table_after_reclaim".into(), json!(left));
        report.insert(
            "reclaim_wait_seconds".into(),
            json!(waited.elapsed().as_secs_f64()),
        );
        report.insert("rss_kib_after_reclaim".into(), json!(rss_kib(self.cluster)));
        report.insert(
            "disk_bytes_per_node_after_reclaim".into(),
            self.disk_per_node(),
        );
    }
}

/// The idle watchers of step 2: their tasks, counting what the nodes
/// answer and refuse, until stopped.
struct Watchers {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Their clients, kept until the watchers stop.
    clients: Vec<reqwest::Client>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    answered: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
}

impl Watchers {
    /// Starts `--watchers` watches spread over the nodes, a hundred at a
    /// time 10 ms apart.
    async fn start(args: &ScaleBench, cluster: &Cluster) -> anyhow::Result<Self> {
        let mut watchers = Self {
            tasks: Vec::new(),
            clients: watch_clients(args.watchers, args.watchers_per_address)?,
            stop: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            answered: Arc::new(AtomicU64::new(0)),
            refused: Arc::new(AtomicU64::new(0)),
        };
        let urls: Vec<String> = cluster.urls();
        for w in 0..args.watchers {
            let per = args.watchers_per_address.max(1);
            let client = &watchers.clients[(w / per).min(watchers.clients.len() - 1)];
            let url = format!(
                "{}/v1/leases/big-{}/watch?index={}&wait_ms=60000",
                urls[w % urls.len()],
                w % args.leases.max(1),
                u64::MAX
            );
            watchers.tasks.push(tokio::spawn(watch(
                client.clone(),
                url,
                watchers.stop.clone(),
                watchers.answered.clone(),
                watchers.refused.clone(),
            )));
            if w % 100 == 99 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        Ok(watchers)
    }

    /// Stops every watcher and drops their clients.
    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.abort();
        }
        drop(self.clients);
    }
}

/// One watcher: watches `url` again each time it returns, until `stop`,
/// counting the answers and the refusals.
async fn watch(
    c: reqwest::Client,
    url: String,
    stop: Arc<std::sync::atomic::AtomicBool>,
    answered: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
) {
    while !stop.load(Ordering::Relaxed) {
        match c.get(&url).send().await {
            Ok(answer) if answer.status().is_success() => {
                let _ = answer.bytes().await;
                answered.fetch_add(1, Ordering::Relaxed);
            }
            // Over the node's waiting seats (429 with Retry-After):
            // back off as a client should, never spin.
            Ok(answer) => {
                refused.fetch_add(1, Ordering::Relaxed);
                let after = answer
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                    .unwrap_or(1)
                    .max(1);
                tokio::time::sleep(Duration::from_secs(after)).await;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The watchers' clients: one from the bench's own address, or one per
/// `per_address` watchers, each from its own loopback address.
fn watch_clients(watchers: usize, per_address: usize) -> anyhow::Result<Vec<reqwest::Client>> {
    let timeout = Duration::from_secs(90);
    if per_address == 0 {
        return Ok(vec![http_client(timeout, watchers)?]);
    }
    (0..watchers.div_ceil(per_address).max(1))
        .map(|k| {
            let n =
                u16::try_from(k + 2).map_err(|_| anyhow::anyhow!("too many watcher addresses"))?;
            let [hi, lo] = n.to_be_bytes();
            let local = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, hi, lo));
            http_client_from(timeout, per_address, Some(local))
        })
        .collect()
}
