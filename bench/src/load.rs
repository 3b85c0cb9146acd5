//! The load engine: `op` from many tasks for a duration, latency
//! percentiles and errors by kind; the table; and the failover trials every
//! replicated system runs the same way.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

/// The flags every load benchmark takes.
#[derive(Debug, Args)]
pub struct LoadArgs {
    /// Concurrency levels to run.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub concurrency: Vec<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl LoadArgs {
    /// How long each measurement runs.
    pub fn duration(&self) -> Duration {
        Duration::from_secs(self.seconds)
    }
}

/// One measured run.
#[derive(Debug, Serialize)]
pub struct Figures {
    what: String,
    concurrency: usize,
    ops: u64,
    errors: u64,
    errors_by_kind: BTreeMap<String, u64>,
    ops_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
    /// Each node's CPU over the run, in percent of one core (when measured).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    node_cpu_percent: Vec<f64>,
    /// Each server process's CPU time per operation, in microseconds (when
    /// measured): what an operation costs, whatever the machine's other
    /// load did to its throughput.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    cpu_us_per_op: Vec<f64>,
}

impl Figures {
    /// Operations per second.
    pub fn ops_per_sec(&self) -> f64 {
        self.ops_per_sec
    }
}

/// What one benchmark operation reports: `Err(kind)` names the failure kind
/// (`"http 503"`, `"transport"`, ...), counted per kind.
pub type OpResult = Result<(), String>;

/// Runs `op` from `concurrency` tasks for `duration`.
pub async fn load<F, Fut>(what: &str, concurrency: usize, duration: Duration, op: F) -> Figures
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = OpResult> + Send,
{
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = BTreeMap::<String, u64>::new();
            let mut i = 0u64;
            while Instant::now() < deadline {
                let began = Instant::now();
                match op(task, i).await {
                    Ok(()) => latencies.push(began.elapsed()),
                    Err(kind) => *errors.entry(kind).or_default() += 1,
                }
                i += 1;
            }
            (latencies, errors)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = BTreeMap::<String, u64>::new();
    for task in tasks {
        if let Ok((l, e)) = task.await {
            latencies.extend(l);
            for (kind, count) in e {
                *errors.entry(kind).or_default() += count;
            }
        }
    }
    figures(what, concurrency, latencies, errors, start.elapsed())
}

/// The figures of `latencies` (one per successful op) over `elapsed`.
pub fn figures(
    what: &str,
    concurrency: usize,
    mut latencies: Vec<Duration>,
    errors_by_kind: BTreeMap<String, u64>,
    elapsed: Duration,
) -> Figures {
    latencies.sort_unstable();
    let pick = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0, |d| d.as_micros() as u64)
    };
    Figures {
        what: what.to_owned(),
        concurrency,
        ops: latencies.len() as u64,
        errors: errors_by_kind.values().sum(),
        errors_by_kind,
        ops_per_sec: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50_us: pick(0.50),
        p99_us: pick(0.99),
        p999_us: pick(0.999),
        node_cpu_percent: Vec::new(),
        cpu_us_per_op: Vec::new(),
    }
}

impl Figures {
    /// Counts `per_op` operations for each one measured (a batch request
    /// that renews `per_op` leases); latencies stay per request.
    #[must_use]
    pub fn per_op(mut self, per_op: u64) -> Self {
        self.ops *= per_op;
        self.ops_per_sec *= per_op as f64;
        self
    }

    /// The same, with each process's CPU time used over the run (`before`
    /// and `after` it, `wall` long): in percent of one core, and per
    /// operation.
    #[must_use]
    pub fn with_process_cpu(
        mut self,
        before: &[Duration],
        after: &[Duration],
        wall: Duration,
    ) -> Self {
        let used: Vec<Duration> = before
            .iter()
            .zip(after)
            .map(|(b, a)| a.saturating_sub(*b))
            .collect();
        let wall = wall.as_secs_f64().max(1e-9);
        let ops = self.ops.max(1) as f64;
        self.node_cpu_percent = used
            .iter()
            .map(|u| 100.0 * u.as_secs_f64() / wall)
            .collect();
        self.cpu_us_per_op = used.iter().map(|u| u.as_secs_f64() * 1e6 / ops).collect();
        self
    }
}

/// Runs `row` and adds the CPU time the processes `pids` used meanwhile
/// ([`Figures::with_process_cpu`]; a process that cannot be read counts
/// none).
pub async fn measured_cpu(
    pids: &[u32],
    row: impl std::future::Future<Output = Figures>,
) -> Figures {
    let cpu = || -> Vec<Duration> {
        pids.iter()
            .map(|pid| crate::cpu::cpu_time(*pid).unwrap_or_default())
            .collect()
    };
    let (before, started) = (cpu(), std::time::Instant::now());
    let figures = row.await;
    let wall = started.elapsed();
    figures.with_process_cpu(&before, &cpu(), wall)
}

/// Prints figures as an aligned table.
pub fn print_table(results: &[Figures]) {
    println!(
        "{:<36} {:>5} {:>10} {:>9} {:>9} {:>9} {:>7}  node CPU %  CPU us/op",
        "what", "conc", "ops/s", "p50 us", "p99 us", "p99.9 us", "errors"
    );
    for r in results {
        let cpu: Vec<String> = r
            .node_cpu_percent
            .iter()
            .map(|p| format!("{p:.0}"))
            .collect();
        let per_op: Vec<String> = r.cpu_us_per_op.iter().map(|u| format!("{u:.1}")).collect();
        println!(
            "{:<36} {:>5} {:>10.0} {:>9} {:>9} {:>9} {:>7}  {:<10} {}",
            r.what,
            r.concurrency,
            r.ops_per_sec,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            r.errors,
            cpu.join("/"),
            per_op.join("/")
        );
        for (kind, count) in &r.errors_by_kind {
            println!("    {count} x {kind}");
        }
    }
}

/// A replicated system whose leader the failover trials kill.
pub trait Failover {
    /// How nodes are named.
    type Node: Copy;
    /// Starts the error messages about this system (`"etcd: "`).
    const PREFIX: &'static str;
    /// What a probe does, for error messages (`"acquire"`, `"put"`).
    const PROBE: &'static str;
    /// How long after the kill a probe through a survivor must succeed.
    const LIMIT: Duration;
    /// How long a restarted node gets to rejoin before the next trial.
    const SETTLE: Duration;

    /// The current leader, once every live node agrees there is one
    /// (bounded).
    async fn leader(&self, client: &reqwest::Client) -> Option<Self::Node>;
    /// A node other than `leader`.
    fn survivor(&self, leader: Self::Node) -> Self::Node;
    /// SIGKILL.
    fn kill(&mut self, node: Self::Node);
    /// Starts a killed node again on its data.
    fn restart(&mut self, node: Self::Node) -> anyhow::Result<()>;
    /// One write through `node` for trial `trial`: true if it succeeded.
    async fn probe(&self, client: &reqwest::Client, node: Self::Node, trial: usize) -> bool;
}

/// `trials` times: SIGKILL the leader, time until the first successful
/// probe through a survivor (polled every 5 ms, 300 ms per request), then
/// restart the victim and let it settle.
///
/// `short` sends the probes (300 ms per request; it carries whatever TLS
/// roots and credentials the cluster needs).
pub async fn failovers<C: Failover>(
    cluster: &mut C,
    client: &reqwest::Client,
    short: &reqwest::Client,
    trials: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut windows = Vec::new();
    for trial in 0..trials {
        let Some(leader) = cluster.leader(client).await else {
            anyhow::bail!("{}no leader before trial {trial}", C::PREFIX)
        };
        let survivor = cluster.survivor(leader);
        let killed = Instant::now();
        cluster.kill(leader);
        let elapsed = loop {
            if cluster.probe(short, survivor, trial).await {
                break killed.elapsed();
            }
            if killed.elapsed() > C::LIMIT {
                anyhow::bail!(
                    "{}no {} within {} s of killing the leader",
                    C::PREFIX,
                    C::PROBE,
                    C::LIMIT.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        windows.push(elapsed);
        cluster.restart(leader)?;
        tokio::time::sleep(C::SETTLE).await;
    }
    Ok(windows)
}

/// min/median/max of failover windows, in ms.
pub fn failover_summary(windows: &mut [Duration]) -> serde_json::Value {
    windows.sort_unstable();
    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    serde_json::json!({
        "trials": windows.len(),
        "min_ms": windows.first().map(ms),
        "median_ms": windows.get(windows.len() / 2).map(ms),
        "max_ms": windows.last().map(ms),
    })
}

/// The failure kind of a request that got no answer.
pub fn transport_error(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        "timeout".to_owned()
    } else {
        "transport".to_owned()
    }
}

/// An HTTP/1.1 client for load: `timeout` per request, up to `idle` pooled
/// connections per host.
pub fn http_client(timeout: Duration, idle: usize) -> anyhow::Result<reqwest::Client> {
    http_client_from(timeout, idle, None)
}

/// [`http_client`] with its connections from `local` (a loopback address
/// other than 127.0.0.1 makes the client another address, as the servers'
/// fairness sees it).
pub fn http_client_from(
    timeout: Duration,
    idle: usize,
    local: Option<std::net::IpAddr>,
) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(timeout)
        .pool_max_idle_per_host(idle)
        .http1_only()
        .local_address(local)
        .build()?)
}

/// An HTTP/2 client (h2c, prior knowledge), as the SDK runs: every
/// request to a host shares one connection.
pub fn http2_client(timeout: Duration) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(timeout)
        .http2_prior_knowledge()
        .build()?)
}
