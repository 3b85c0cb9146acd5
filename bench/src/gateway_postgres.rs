//! `palisade-bench gateway-postgres`: what fencing costs on PostgreSQL, and
//! gateways on PostgreSQL against one on sled.
//!
//! It starts a throwaway PostgreSQL (Debian's binaries, durable settings:
//! fsync and `synchronous_commit` on) and measures, same run, same pool:
//! the fenced put of `PostgresStore` against a plain upsert of the same
//! rows (`put_unfenced_for_benchmark`), each writer on its own lease and
//! all writers on one lease; then 1 KiB PUTs over HTTP through one gateway
//! on PostgreSQL, two gateways on the same database (writers spread over
//! both), and one gateway on sled.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Args;
use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use palisade_local_cluster::{GatewayKeys, Logs, Node, NodeSpec, PostgresServer};
use palisade_names::{LeaseClaims, ISSUER};
use palisade_store::{FencedStore, FencingToken, ObjectKey, PostgresStore, PostgresStoreConfig};

use crate::load::{load, print_table, Figures, LoadArgs};

#[derive(Debug, Args)]
pub struct GatewayPostgresBench {
    #[command(flatten)]
    load: LoadArgs,
    /// Value size in bytes.
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
    /// Where PostgreSQL and sled keep their data (default: under /tmp; the
    /// `postgres` user must be able to reach it when run as root).
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
}

pub async fn run(args: GatewayPostgresBench, palisade: &Path) -> anyhow::Result<ExitCode> {
    let temp = match &args.data_dir {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::Builder::new()
            .prefix("palisade-bench-pg-")
            .tempdir_in("/tmp")?,
    };
    // The postgres user must reach its directory inside (traverse only).
    std::fs::set_permissions(
        temp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )?;
    let mut server = PostgresServer::init(&temp.path().join("pg"), &["max_connections=300"])
        .context("PostgreSQL")?;
    server.start(0).context("start PostgreSQL")?;
    let url = server.url("postgres");
    let value = vec![b'v'; args.value_bytes];
    let duration = args.load.duration();

    let mut config = PostgresStoreConfig::new(&url);
    config.pool_size = 64;
    let store = Arc::new(PostgresStore::connect(&config).await?);
    let mut results = Vec::new();
    for &c in &args.load.concurrency {
        for spread in [Leases::OnePerWriter, Leases::One] {
            let plain = store_load(&store, Write::Plain, spread, c, duration, &value).await;
            let fenced = store_load(&store, Write::Fenced, spread, c, duration, &value).await;
            eprintln!(
                "c={c} {spread:?}: fenced/plain = {:.2}",
                fenced.ops_per_sec() / plain.ops_per_sec().max(1e-9)
            );
            results.extend([plain, fenced]);
        }
    }
    drop(store);

    let signing = ed25519_dalek::SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let pem = temp.path().join("public.pem");
    std::fs::write(
        &pem,
        signing
            .verifying_key()
            .to_public_key_pem(Default::default())?,
    )?;
    let key = EncodingKey::from_ed_der(signing.to_pkcs8_der()?.as_bytes());
    let sled_dir = temp.path().join("sled");
    let setups: [(&str, Vec<Option<&str>>); 3] = [
        ("1 gateway on PostgreSQL", vec![Some(&url)]),
        ("2 gateways on PostgreSQL", vec![Some(&url), Some(&url)]),
        ("1 gateway on sled", vec![None]),
    ];
    for (what, engines) in setups {
        let mut gateways = Vec::new();
        for engine in engines {
            gateways.push(start_gateway(palisade, engine, &sled_dir, &pem)?);
        }
        let urls: Vec<String> = gateways.iter_mut().map(|(_, url)| url.clone()).collect();
        for &c in &args.load.concurrency {
            results.push(http_load(what, &urls, &key, c, duration, &value).await);
        }
        for (mut node, _) in gateways {
            node.kill();
        }
    }
    server.stop("fast");

    if args.load.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        print_table(&results);
    }
    Ok(ExitCode::SUCCESS)
}

/// Which write a store measurement makes.
#[derive(Debug, Clone, Copy)]
enum Write {
    Fenced,
    Plain,
}

/// How the writers' keys fall on leases.
#[derive(Debug, Clone, Copy)]
enum Leases {
    /// Writer `t` writes under lease `b{t}` (one holder per lease).
    OnePerWriter,
    /// Every writer under lease `b` (one holder writing concurrently).
    One,
}

async fn store_load(
    store: &Arc<PostgresStore>,
    write: Write,
    leases: Leases,
    concurrency: usize,
    duration: Duration,
    value: &[u8],
) -> Figures {
    let what = match (write, leases) {
        (Write::Fenced, Leases::OnePerWriter) => "pg fenced put, a lease per writer",
        (Write::Plain, Leases::OnePerWriter) => "pg plain upsert, same rows",
        (Write::Fenced, Leases::One) => "pg fenced put, one lease",
        (Write::Plain, Leases::One) => "pg plain upsert, same rows (one lease)",
    };
    let (store, value) = (store.clone(), value.to_vec());
    load(what, concurrency, duration, move |task, i| {
        let (store, value) = (store.clone(), value.clone());
        async move {
            let lease = match leases {
                Leases::OnePerWriter => format!("b{task}"),
                Leases::One => "b".to_owned(),
            };
            let key = ObjectKey::new(&format!("{lease}/{task}/{}", i % 100))
                .map_err(|e| e.to_string())?;
            let answer = match write {
                Write::Fenced => store.put(&key, value, FencingToken(1)).await.map(drop),
                Write::Plain => store
                    .put_unfenced_for_benchmark(&key, &value, FencingToken(1))
                    .await
                    .map(drop),
            };
            answer.map_err(|e| e.to_string())
        }
    })
    .await
}

/// A gateway on PostgreSQL at `url`, or on sled in `sled_dir`; its URL.
fn start_gateway(
    palisade: &Path,
    postgres: Option<&str>,
    sled_dir: &Path,
    pem: &Path,
) -> anyhow::Result<(Node, String)> {
    let keys = GatewayKeys::PublicKey(pem.to_owned());
    let spec = match postgres {
        Some(url) => {
            let mut spec = NodeSpec::gateway_on_postgres("127.0.0.1:0", url, keys);
            spec.args = vec!["--pg-pool-size".into(), "32".into()];
            spec
        }
        None => NodeSpec::gateway("127.0.0.1:0", sled_dir.to_owned(), keys),
    };
    let mut node = Node::start(
        palisade,
        NodeSpec {
            env: vec![("RUST_LOG".into(), "warn".into())],
            logs: Logs::Inherit,
            ..spec
        },
    )?;
    let url = node
        .wait_listening(Duration::from_secs(30))
        .context("the gateway did not start")?;
    Ok((node, url))
}

/// 1 KiB PUTs, writer `t` under lease `h{t}` with its own JWT, through
/// `urls[t % len]`.
async fn http_load(
    what: &str,
    urls: &[String],
    key: &EncodingKey,
    concurrency: usize,
    duration: Duration,
    value: &[u8],
) -> Figures {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let jwts: Vec<String> = (0..concurrency)
        .map(|t| {
            let claims = LeaseClaims {
                iss: ISSUER.to_owned(),
                sub: "bench".to_owned(),
                lease: format!("h{t}"),
                token: 1,
                iat: now,
                exp: now + 3600,
            };
            jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, key).unwrap_or_default()
        })
        .collect();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default();
    let (jwts, urls) = (Arc::new(jwts), Arc::new(urls.to_vec()));
    let value = bytes::Bytes::copy_from_slice(value);
    let title = format!("{what}: PUT (HTTP)");
    load(&title, concurrency, duration, move |task, i| {
        let (client, jwts, urls, value) =
            (client.clone(), jwts.clone(), urls.clone(), value.clone());
        async move {
            let url = &urls[task % urls.len()];
            client
                .put(format!("{url}/v1/objects/h{task}/{}", i % 100))
                .bearer_auth(&jwts[task])
                .body(value)
                .send()
                .await
                .map_err(|_| "transport".to_owned())
                .and_then(|r| match r.status().as_u16() {
                    200 => Ok(()),
                    status => Err(format!("http {status}")),
                })
        }
    })
    .await
}
