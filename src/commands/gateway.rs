//! `palisade gateway`: the storage gateway server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{ArgGroup, Args};
use palisade_gateway::{AppState, GatewayConfig, JwksCache, KeySource, Verifier};
use palisade_store::{SledStore, SledStoreConfig};

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("keys").required(true).args(["election", "public_key"])))]
pub struct GatewayArgs {
    /// Address to listen on (port 0 picks a free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Directory for the object store (created if missing).
    #[arg(long)]
    data_dir: PathBuf,
    /// Election node URLs, comma-separated, to fetch signing keys from (/v1/jwks).
    #[arg(long, value_delimiter = ',')]
    election: Vec<String>,
    /// An Ed25519 public key (PEM) to verify tokens offline instead.
    #[arg(long)]
    public_key: Option<PathBuf>,
    /// The largest object, in bytes.
    #[arg(long, default_value_t = 1024 * 1024)]
    max_value_bytes: usize,
    /// A request must arrive and be answered within this many milliseconds.
    #[arg(long, default_value_t = 10_000)]
    request_timeout_ms: u64,
    /// Seconds of clock skew tolerated on a token's `exp`.
    #[arg(long, default_value_t = 1)]
    exp_leeway_secs: u64,
    /// Least time between the starts of two JWKS fetches caused by unknown
    /// key ids, in ms.
    #[arg(long, default_value_t = 100)]
    jwks_refetch_ms: u64,
    /// How long a write with an unknown key id waits for a fresh JWKS before
    /// a 503, in ms.
    #[arg(long, default_value_t = 1000)]
    jwks_wait_ms: u64,
    /// The JWKS is fetched again this often (so a retired key stops being
    /// trusted), in ms.
    #[arg(long, default_value_t = 60_000)]
    jwks_refresh_ms: u64,
    /// A directory from `palisade certs init`: serve over TLS with
    /// gateway.pem, and trust ca.pem for https:// election endpoints.
    #[arg(long, env = "PALISADE_CERTS")]
    certs: Option<PathBuf>,
    /// Who may read and write which leases' objects: the election nodes'
    /// policy file. Without it anyone holding a lease JWT writes, anyone reads.
    #[arg(long, env = "PALISADE_POLICY")]
    policy: Option<PathBuf>,
    /// On shutdown, in-flight requests get this long to finish, in ms.
    #[arg(long, default_value_t = 10_000)]
    drain_timeout_ms: u64,
}

pub async fn run(args: GatewayArgs) -> anyhow::Result<ExitCode> {
    let config = GatewayConfig {
        max_value_bytes: args.max_value_bytes,
        request_timeout: Duration::from_millis(args.request_timeout_ms),
        drain_timeout: Duration::from_millis(args.drain_timeout_ms),
    };
    if let Err(problem) = config.validate() {
        eprintln!("error: {problem}");
        return Ok(ExitCode::from(2));
    }
    let policy = match super::load_policy(args.policy.as_deref(), "gateway") {
        Ok(policy) => policy,
        Err(line) => {
            eprintln!("error: {line}");
            return Ok(ExitCode::from(2));
        }
    };
    let mut refresher = None;
    let keys = match &args.public_key {
        Some(path) => match KeySource::from_pem_file(path) {
            Ok(keys) => keys,
            Err(problem) => {
                eprintln!("error: {problem}");
                return Ok(ExitCode::from(2));
            }
        },
        None => {
            let mut cache = JwksCache::new(
                args.election.clone(),
                Duration::from_millis(args.jwks_refetch_ms),
                Duration::from_millis(args.jwks_wait_ms),
            );
            if let Some(dir) = &args.certs {
                let path = dir.join("ca.pem");
                let pem = std::fs::read(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                let ca = reqwest::Certificate::from_pem(&pem)
                    .with_context(|| format!("{} is not a PEM certificate", path.display()))?;
                cache = cache.with_ca(ca);
            }
            let cache = Arc::new(cache);
            refresher = Some(cache.spawn_refresher(Duration::from_millis(args.jwks_refresh_ms)));
            KeySource::Jwks(cache)
        }
    };
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create {}", args.data_dir.display()))?;
    let observer = Arc::new(palisade_gateway::observe::Observer::default());
    let mut store_config = SledStoreConfig::new(&args.data_dir);
    store_config.max_value_bytes = args.max_value_bytes;
    store_config.hooks = observer.store_hooks();
    let store = SledStore::open(&store_config)
        .with_context(|| format!("cannot open the store in {}", args.data_dir.display()))?;
    let state = AppState {
        store: Arc::new(store),
        verifier: Arc::new(Verifier::new(keys, args.exp_leeway_secs)),
        config: Arc::new(config.clone()),
        policy,
        observer,
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let local = listener.local_addr()?;
    let tls = match &args.certs {
        Some(dir) => Some(palisade_serve::tls::server_config(
            &dir.join("gateway.pem"),
            &dir.join("gateway-key.pem"),
            None,
        )?),
        None => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("palisade gateway listening on {scheme}://{local}");
    tracing::info!(%local, data_dir = %args.data_dir.display(), "gateway started");
    palisade_gateway::serve(
        listener,
        palisade_gateway::router(state),
        tls,
        super::shutdown_signal(),
        config.drain_timeout,
    )
    .await?;
    if let Some(task) = refresher {
        task.abort();
    }
    tracing::info!("gateway stopped");
    Ok(ExitCode::SUCCESS)
}
