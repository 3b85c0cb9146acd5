//! `palisade bench gateway`: fenced-PUT throughput and latency through a real
//! gateway process, beside the storage engine's own ceiling and one fsync.
//!
//! It starts `palisade gateway` (this same binary) on a temp dir with a fresh
//! key, drives 1 KiB PUTs with one JWT per writer (as a lease holder would),
//! then measures, in this process, sled inserting the same values from 64
//! tasks that each await a flush, and a bare write+fsync loop.

use std::io::{BufRead, BufReader, Write};
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Fenced PUT through a gateway vs. the engine's ceiling.
    Gateway(GatewayBench),
    /// Acquire/release and renew throughput, and failover time, on a real
    /// 3-node cluster of this binary.
    Election(super::bench_election::ElectionBench),
    /// The same work against etcd (needs `etcd` on PATH), for ratios.
    Etcd(super::bench_etcd::EtcdBench),
}

#[derive(Debug, Args)]
pub struct GatewayBench {
    /// Concurrency levels to run.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    concurrency: Vec<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
    /// Where to put the data (default: a temp dir on the same disk as /tmp).
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// One measured run.
#[derive(Debug, Serialize)]
pub(crate) struct Figures {
    what: String,
    concurrency: usize,
    ops: u64,
    errors: u64,
    errors_by_kind: std::collections::BTreeMap<String, u64>,
    ops_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
}

/// What one benchmark operation reports: `Err(kind)` names the failure kind
/// (`"http 503"`, `"transport"`, ...), counted per kind.
pub(crate) type OpResult = Result<(), String>;

/// Runs `op` from `concurrency` tasks for `duration`.
pub(crate) async fn load<F, Fut>(
    what: &str,
    concurrency: usize,
    duration: Duration,
    op: F,
) -> Figures
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
            let mut errors = std::collections::BTreeMap::<String, u64>::new();
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
    let mut errors = std::collections::BTreeMap::<String, u64>::new();
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

/// min/median/max of failover windows, in ms.
pub(crate) fn failover_summary(windows: &mut [Duration]) -> serde_json::Value {
    windows.sort_unstable();
    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    serde_json::json!({
        "trials": windows.len(),
        "min_ms": windows.first().map(ms),
        "median_ms": windows.get(windows.len() / 2).map(ms),
        "max_ms": windows.last().map(ms),
    })
}

/// Prints figures as an aligned table.
pub(crate) fn print_table(results: &[Figures]) {
    println!(
        "{:<36} {:>5} {:>10} {:>9} {:>9} {:>9} {:>7}",
        "what", "conc", "ops/s", "p50 us", "p99 us", "p99.9 us", "errors"
    );
    for r in results {
        println!(
            "{:<36} {:>5} {:>10.0} {:>9} {:>9} {:>9} {:>7}",
            r.what, r.concurrency, r.ops_per_sec, r.p50_us, r.p99_us, r.p999_us, r.errors
        );
        for (kind, count) in &r.errors_by_kind {
            println!("    {count} x {kind}");
        }
    }
}

pub(crate) fn figures(
    what: &str,
    concurrency: usize,
    mut latencies: Vec<Duration>,
    errors_by_kind: std::collections::BTreeMap<String, u64>,
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
    }
}

pub async fn run(command: BenchCommand) -> anyhow::Result<ExitCode> {
    match command {
        BenchCommand::Gateway(args) => gateway(args).await,
        BenchCommand::Election(args) => super::bench_election::run(args).await,
        BenchCommand::Etcd(args) => super::bench_etcd::run(args).await,
    }
}

async fn gateway(args: GatewayBench) -> anyhow::Result<ExitCode> {
    let temp = match &args.data_dir {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir()?,
    };
    let signing = ed25519_dalek::SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let pem_path = temp.path().join("public.pem");
    std::fs::write(
        &pem_path,
        signing
            .verifying_key()
            .to_public_key_pem(Default::default())
            .context("encode public key")?,
    )?;
    let encoding =
        EncodingKey::from_ed_der(signing.to_pkcs8_der().context("encode key")?.as_bytes());

    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(["gateway", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(temp.path().join("gateway"))
        .arg("--public-key")
        .arg(&pem_path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .context("start the gateway")?;
    let stdout = child.stdout.take().context("gateway stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let Some(url) = line
        .split("listening on ")
        .nth(1)
        .map(|u| u.trim().to_owned())
    else {
        let _ = child.kill();
        bail!("the gateway did not start: {line:?}");
    };

    let mut results = Vec::new();
    let value = vec![b'v'; args.value_bytes];
    let duration = Duration::from_secs(args.seconds);
    let mut token = 1;
    for &concurrency in &args.concurrency {
        token += 1;
        results.push(put_load(&url, &encoding, token, concurrency, duration, &value).await);
    }
    let _ = child.kill();
    let _ = child.wait();

    results.push(store_direct(temp.path(), 64, duration, &value).await?);
    results.push(sled_ceiling(temp.path(), 64, duration, &value).await?);
    results.push(fsync_loop(temp.path(), duration, &value)?);

    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        print_table(&results);
    }
    Ok(ExitCode::SUCCESS)
}

async fn put_load(
    url: &str,
    key: &EncodingKey,
    token: u64,
    concurrency: usize,
    duration: Duration,
    value: &[u8],
) -> Figures {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let claims = serde_json::json!({
        "iss": "palisade", "sub": "bench", "lease": "bench", "token": token,
        "iat": now, "exp": now + 3600,
    });
    let jwt =
        jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, key).unwrap_or_default();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default();
    let value = bytes::Bytes::copy_from_slice(value);
    let url = url.to_owned();
    load(
        "gateway fenced PUT (HTTP, durable)",
        concurrency,
        duration,
        move |task, i| {
            let (client, jwt, value, url) =
                (client.clone(), jwt.clone(), value.clone(), url.clone());
            async move {
                client
                    .put(format!("{url}/v1/objects/bench/{task}/{}", i % 100))
                    .bearer_auth(&jwt)
                    .body(value)
                    .send()
                    .await
                    .map_err(|_| "transport".to_owned())
                    .and_then(|r| match r.status().as_u16() {
                        200 => Ok(()),
                        status => Err(format!("http {status}")),
                    })
            }
        },
    )
    .await
}

/// The fenced store without HTTP or JWT: what the gateway could reach.
async fn store_direct(
    dir: &std::path::Path,
    concurrency: usize,
    duration: Duration,
    value: &[u8],
) -> anyhow::Result<Figures> {
    use palisade_store::{FencedStore, FencingToken, ObjectKey, SledStore, SledStoreConfig};
    let store = Arc::new(SledStore::open(&SledStoreConfig::new(dir.join("direct")))?);
    let value = value.to_vec();
    Ok(load(
        "fenced store put (no HTTP, durable)",
        concurrency,
        duration,
        move |task, i| {
            let (store, value) = (store.clone(), value.clone());
            async move {
                let key = ObjectKey::new(&format!("bench/{task}/{}", i % 100))
                    .map_err(|e| e.to_string())?;
                store
                    .put(&key, value, FencingToken(1))
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
        },
    )
    .await)
}

async fn sled_ceiling(
    dir: &std::path::Path,
    concurrency: usize,
    duration: Duration,
    value: &[u8],
) -> anyhow::Result<Figures> {
    let db = sled::Config::new().path(dir.join("ceiling")).open()?;
    let tree = Arc::new(db.open_tree("objects")?);
    let value = sled::IVec::from(value);
    Ok(load(
        "sled insert + flush (ceiling)",
        concurrency,
        duration,
        move |task, i| {
            let (tree, value) = (tree.clone(), value.clone());
            async move {
                let key = format!("bench/{task}/{}", i % 100);
                // Not `flush_async`: on sled 0.34 64 concurrent flush_async
                // calls deadlock its IO thread pool (seen here).
                let flushing = tree.clone();
                tree.insert(key.as_bytes(), value)
                    .map_err(|e| e.to_string())?;
                match tokio::task::spawn_blocking(move || flushing.flush()).await {
                    Ok(Ok(_)) => Ok(()),
                    _ => Err("flush".to_owned()),
                }
            }
        },
    )
    .await)
}

fn fsync_loop(dir: &std::path::Path, duration: Duration, value: &[u8]) -> anyhow::Result<Figures> {
    let mut file = std::fs::File::create(dir.join("fsync"))?;
    let start = Instant::now();
    let mut latencies = Vec::new();
    while start.elapsed() < duration.min(Duration::from_secs(2)) {
        let began = Instant::now();
        file.write_all(value)?;
        file.sync_all()?;
        latencies.push(began.elapsed());
    }
    Ok(figures(
        "write 1 KiB + fsync (one file)",
        1,
        latencies,
        Default::default(),
        start.elapsed(),
    ))
}
