//! `palisade-bench gateway`: fenced-PUT throughput and latency through a
//! real gateway process, beside the storage engine's own ceiling and one
//! fsync.
//!
//! It starts `palisade gateway` on a temp dir with a fresh key, drives
//! 1 KiB PUTs with one JWT per writer (as a lease holder would), then the
//! same PUTs each conditional on the version the writer's last one wrote
//! (`If-Match`, the first `If-None-Match: *`); then, once every row has
//! written its keys, listings of 100-key pages from a random place among
//! them; then measures, in this process, the fenced store without HTTP, sled inserting
//! the same values from 64 tasks that each await a flush, and a bare
//! write+fsync loop.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Args;
use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use palisade_local_cluster::{GatewayKeys, Logs, Node, NodeSpec};
use palisade_names::{LeaseClaims, ISSUER};

use crate::load::{figures, load, measured_cpu, print_table, Figures, LoadArgs};

#[derive(Debug, Args)]
pub struct GatewayBench {
    #[command(flatten)]
    load: LoadArgs,
    /// Value size in bytes.
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
    /// Where to put the data (default: a temp dir on the same disk as /tmp).
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
}

pub async fn run(args: GatewayBench, palisade: &Path) -> anyhow::Result<ExitCode> {
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

    let mut gateway = Node::start(
        palisade,
        NodeSpec {
            env: vec![("RUST_LOG".into(), "warn".into())],
            logs: Logs::Inherit,
            ..NodeSpec::gateway(
                "127.0.0.1:0",
                temp.path().join("gateway"),
                GatewayKeys::PublicKey(pem_path),
            )
        },
    )?;
    let url = gateway
        .wait_listening(Duration::from_secs(30))
        .context("the gateway did not start")?;

    let mut results = Vec::new();
    let value = vec![b'v'; args.value_bytes];
    let duration = args.load.duration();
    let mut token = 1;
    for &concurrency in &args.load.concurrency {
        token += 1;
        let gateway_pid = [gateway.pid()];
        let put = put_load(&url, &encoding, token, concurrency, duration, &value);
        results.push(measured_cpu(&gateway_pid, put).await);
        let jwt = bench_jwt(&encoding, token);
        let conditional = conditional_load(&url, &jwt, concurrency, duration, &value);
        results.push(measured_cpu(&gateway_pid, conditional).await);
    }
    // Once every PUT row has written its keys: `bench/{task}/{0..100}` for
    // every task of the largest row.
    let writers = args.load.concurrency.iter().copied().max().unwrap_or(1);
    for &concurrency in &args.load.concurrency {
        results.push(list_load(&url, writers, concurrency, duration).await);
    }
    gateway.kill();

    results.push(store_direct(temp.path(), 64, duration, &value).await?);
    results.push(sled_ceiling(temp.path(), 64, duration, &value).await?);
    results.push(fsync_loop(temp.path(), duration, &value)?);

    if args.load.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        print_table(&results);
    }
    Ok(ExitCode::SUCCESS)
}

/// A lease JWT for the `bench` lease at `token`, good for an hour.
fn bench_jwt(key: &EncodingKey, token: u64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let claims = LeaseClaims {
        iss: ISSUER.to_owned(),
        sub: "bench".to_owned(),
        lease: "bench".to_owned(),
        token,
        iat: now,
        exp: now + 3600,
    };
    jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, key).unwrap_or_default()
}

fn http_client(concurrency: usize) -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default()
}

/// Each writer PUTs its own key, each time conditional on the version its
/// last PUT answered (the first: `If-None-Match: *`), as a compare-and-set
/// loop does; a 412 would count as an error.
async fn conditional_load(
    url: &str,
    jwt: &str,
    concurrency: usize,
    duration: Duration,
    value: &[u8],
) -> Figures {
    use std::sync::atomic::{AtomicU64, Ordering};
    let client = http_client(concurrency);
    let versions: Arc<Vec<AtomicU64>> =
        Arc::new((0..concurrency).map(|_| AtomicU64::new(0)).collect());
    let value = bytes::Bytes::copy_from_slice(value);
    let (url, jwt) = (url.to_owned(), jwt.to_owned());
    // A key of its own per run, so the first PUT finds nothing there.
    let run = rand::random::<u32>();
    load(
        "gateway conditional PUT (If-Match, durable)",
        concurrency,
        duration,
        move |task, _| {
            let (client, jwt, value, url, versions) = (
                client.clone(),
                jwt.clone(),
                value.clone(),
                url.clone(),
                versions.clone(),
            );
            async move {
                let last = versions[task].load(Ordering::Relaxed);
                let request = client
                    .put(format!("{url}/v1/objects/bench/cas-{run}/{task}"))
                    .bearer_auth(&jwt)
                    .body(value);
                let request = if last == 0 {
                    request.header("if-none-match", "*")
                } else {
                    request.header("if-match", last.to_string())
                };
                let answer = request.send().await.map_err(|_| "transport".to_owned())?;
                if answer.status().as_u16() != 200 {
                    return Err(format!("http {}", answer.status().as_u16()));
                }
                let written: serde_json::Value =
                    answer.json().await.map_err(|_| "body".to_owned())?;
                let version = written["version"].as_u64().ok_or("no version")?;
                versions[task].store(version, Ordering::Relaxed);
                Ok(())
            }
        },
    )
    .await
}

/// Pages of 100 keys under `bench/`, each from a random key among those the
/// PUT rows' `writers` tasks wrote (`bench/{task}/{n}`, n < 100).
async fn list_load(url: &str, writers: usize, concurrency: usize, duration: Duration) -> Figures {
    let client = http_client(concurrency);
    let url = url.to_owned();
    load(
        "gateway listing, 100-key page",
        concurrency,
        duration,
        move |_, _| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let after = format!(
                    "bench/{}/{}",
                    rand::random::<u32>() as usize % writers.max(1),
                    rand::random::<u32>() % 100
                );
                let answer = client
                    .get(format!("{url}/v1/objects"))
                    .query(&[("prefix", "bench/"), ("after", &after), ("limit", "100")])
                    .send()
                    .await
                    .map_err(|_| "transport".to_owned())?;
                if answer.status().as_u16() != 200 {
                    return Err(format!("http {}", answer.status().as_u16()));
                }
                answer
                    .bytes()
                    .await
                    .map(drop)
                    .map_err(|_| "body".to_owned())
            }
        },
    )
    .await
}

async fn put_load(
    url: &str,
    key: &EncodingKey,
    token: u64,
    concurrency: usize,
    duration: Duration,
    value: &[u8],
) -> Figures {
    let jwt = bench_jwt(key, token);
    let client = http_client(concurrency);
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
    dir: &Path,
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

/// The engine's ceiling: raw sled, no fence check, no lock, no group
/// commit; each task awaits its own flush. The one place outside
/// `store/src/sled_store.rs` that names sled: the store's API has no way to
/// reach beneath the fence, which is what this measures.
async fn sled_ceiling(
    dir: &Path,
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

fn fsync_loop(dir: &Path, duration: Duration, value: &[u8]) -> anyhow::Result<Figures> {
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
