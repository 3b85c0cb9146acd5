//! `palisade gateway`: the storage gateway server.

use crate::output::{complain, say};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{ArgGroup, Args};
use palisade_gateway::observe::Observer;
use palisade_gateway::{AppParts, AppState, GatewayConfig, JwksCache, KeySource, Verifier};
use palisade_serve::policy::LivePolicy;
use palisade_store::{FencedStore, PostgresStore, PostgresStoreConfig, SledStore, SledStoreConfig};

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("keys").required(true).args(["election", "public_key"])))]
#[command(group(ArgGroup::new("storage").required(true).args(["data_dir", "postgres", "postgres_file"])))]
pub struct GatewayArgs {
    /// Address to listen on (port 0 picks a free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Directory for the object store on sled (created if missing).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Keep objects and fences in PostgreSQL instead (every gateway on the
    /// database shares them): a libpq URL; several hosts with
    /// `target_session_attrs=read-write` follow a promoted standby.
    #[arg(long, env = "PALISADE_GATEWAY_POSTGRES", conflicts_with = "data_dir")]
    postgres: Option<String>,
    /// `--postgres` read from a file (its first line), so a password is not
    /// on the command line or in the environment (both readable in /proc).
    #[arg(long, env = "PALISADE_GATEWAY_POSTGRES_FILE", conflicts_with_all = ["data_dir", "postgres"])]
    postgres_file: Option<PathBuf>,
    #[command(flatten)]
    pg: PostgresArgs,
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
    /// Requests in flight the gateway serves at once (64..=1 000 000); half
    /// of them are shared out per principal (over its share: 429
    /// `over_share`).
    #[arg(long, default_value_t = 4096)]
    max_requests: usize,
}

/// The PostgreSQL engine's pool and timeouts.
#[derive(Debug, Args)]
struct PostgresArgs {
    /// Database connections at most, per gateway.
    #[arg(long, default_value_t = 16)]
    pg_pool_size: usize,
    /// A request waits this long for a free connection, then gets a 503, in ms.
    #[arg(long, default_value_t = 1000)]
    pg_pool_wait_ms: u64,
    /// Connecting to one host, in ms.
    #[arg(long, default_value_t = 2000)]
    pg_connect_timeout_ms: u64,
    /// Every statement, in ms: past it a 503, and the connection is closed.
    #[arg(long, default_value_t = 5000)]
    pg_statement_timeout_ms: u64,
    /// A write waits this long for its lease's lock, then gets a 503, in ms.
    #[arg(long, default_value_t = 3000)]
    pg_lock_timeout_ms: u64,
    /// The CA (PEM) that signed PostgreSQL's certificate: connect over TLS
    /// only, verifying the certificate and the host name.
    #[arg(long, env = "PALISADE_GATEWAY_PG_CA")]
    pg_ca: Option<PathBuf>,
}

impl PostgresArgs {
    fn config(&self, url: &str, max_value_bytes: usize) -> Result<PostgresStoreConfig, String> {
        let mut config = PostgresStoreConfig::new(url);
        if let Some(ca) = &self.pg_ca {
            config.ca_pem =
                Some(std::fs::read(ca).map_err(|e| format!("cannot read {}: {e}", ca.display()))?);
        }
        config.max_value_bytes = max_value_bytes;
        config.pool_size = self.pg_pool_size;
        config.pool_wait = Duration::from_millis(self.pg_pool_wait_ms);
        config.connect_timeout = Duration::from_millis(self.pg_connect_timeout_ms);
        config.statement_timeout = Duration::from_millis(self.pg_statement_timeout_ms);
        config.lock_timeout = Duration::from_millis(self.pg_lock_timeout_ms);
        Ok(config)
    }
}

pub async fn run(args: GatewayArgs) -> anyhow::Result<ExitCode> {
    let (config, policy) = match config_and_policy(&args) {
        Ok(found) => found,
        Err(problem) => {
            complain!("error: {problem}");
            return Ok(ExitCode::from(2));
        }
    };
    let mut refresher = None;
    let keys = match &args.public_key {
        Some(path) => match KeySource::from_pem_file(path) {
            Ok(keys) => keys,
            Err(problem) => {
                complain!("error: {problem}");
                return Ok(ExitCode::from(2));
            }
        },
        None => {
            let (keys, task) = jwks_keys(&args)?;
            refresher = Some(task);
            keys
        }
    };
    let verifier = Arc::new(Verifier::new(keys, args.exp_leeway_secs));
    let observer = Observer::default();
    let postgres = match postgres_url(&args) {
        Ok(url) => url,
        Err(problem) => {
            complain!("error: {problem}");
            return Ok(ExitCode::from(2));
        }
    };
    let served = match (&postgres, &args.data_dir) {
        (Some(url), _) => {
            let pg_config = match postgres_config(&args, url, &config) {
                Ok(pg_config) => pg_config,
                Err(problem) => {
                    complain!("error: {problem}");
                    return Ok(ExitCode::from(2));
                }
            };
            let mut pg_config = pg_config;
            pg_config.hooks = observer.store_hooks();
            let store = Arc::new(
                PostgresStore::connect(&pg_config)
                    .await
                    .context("cannot open the store in PostgreSQL")?,
            );
            let observer = observer.with_audit(store.clone());
            let parts = Parts {
                verifier,
                config,
                policy,
                observer: Arc::new(observer),
            };
            serve_store(store, parts, &args, "postgres").await
        }
        (None, Some(data_dir)) => {
            let store = open_sled(data_dir, args.max_value_bytes, &observer)?;
            let parts = Parts {
                verifier,
                config,
                policy,
                observer: Arc::new(observer),
            };
            serve_store(Arc::new(store), parts, &args, "sled").await
        }
        (None, None) => anyhow::bail!("--data-dir or --postgres is required"),
    };
    if let Some(task) = refresher {
        task.abort();
    }
    served?;
    tracing::info!("gateway stopped");
    Ok(ExitCode::SUCCESS)
}

/// The gateway's configuration from its flags, validated, and its policy.
fn config_and_policy(
    args: &GatewayArgs,
) -> Result<(GatewayConfig, Option<Arc<LivePolicy>>), String> {
    let config = GatewayConfig {
        max_value_bytes: args.max_value_bytes,
        request_timeout: Duration::from_millis(args.request_timeout_ms),
        drain_timeout: Duration::from_millis(args.drain_timeout_ms),
        max_requests: args.max_requests,
    };
    config.validate()?;
    let policy = super::policy::load_policy(args.policy.as_deref(), "gateway")?;
    Ok((config, policy))
}

/// The election's signing keys, fetched from its JWKS (trusting the CA in
/// --certs for https://) and kept fresh by the returned task.
fn jwks_keys(args: &GatewayArgs) -> anyhow::Result<(KeySource, tokio::task::JoinHandle<()>)> {
    let mut cache = JwksCache::new(
        args.election.clone(),
        Duration::from_millis(args.jwks_refetch_ms),
        Duration::from_millis(args.jwks_wait_ms),
    );
    if let Some(dir) = &args.certs {
        let path = dir.join("ca.pem");
        let pem =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let ca = reqwest::Certificate::from_pem(&pem)
            .with_context(|| format!("{} is not a PEM certificate", path.display()))?;
        cache = cache.with_ca(ca);
    }
    let cache = Arc::new(cache);
    let refresher = cache.spawn_refresher(Duration::from_millis(args.jwks_refresh_ms));
    Ok((KeySource::Jwks(cache), refresher))
}

/// PostgreSQL's URL, from --postgres or the first line of --postgres-file;
/// none when objects live on sled.
fn postgres_url(args: &GatewayArgs) -> Result<Option<String>, String> {
    match (&args.postgres, &args.postgres_file) {
        (Some(url), _) => Ok(Some(url.clone())),
        (None, Some(file)) => super::first_line_of(file, "--postgres-file")
            .map(Some)
            .map_err(|e| e.to_string()),
        (None, None) => Ok(None),
    }
}

/// The PostgreSQL store's configuration from the --pg-* flags, checked,
/// with statements timing out before requests do.
fn postgres_config(
    args: &GatewayArgs,
    url: &str,
    config: &GatewayConfig,
) -> Result<PostgresStoreConfig, String> {
    let pg_config = args.pg.config(url, args.max_value_bytes).and_then(|c| {
        c.validate()?;
        c.driver_config().map_err(|e| e.to_string())?;
        Ok(c)
    })?;
    if pg_config.statement_timeout >= config.request_timeout {
        return Err("--pg-statement-timeout-ms must be below --request-timeout-ms".to_owned());
    }
    Ok(pg_config)
}

/// What the gateway's state holds besides its store.
struct Parts {
    verifier: Arc<Verifier>,
    config: GatewayConfig,
    policy: Option<Arc<LivePolicy>>,
    observer: Arc<Observer>,
}

/// The store on sled in `data_dir`.
fn open_sled(
    data_dir: &std::path::Path,
    max_value_bytes: usize,
    observer: &Observer,
) -> anyhow::Result<SledStore> {
    // The store holds every object: every file and directory this process
    // creates is its owner's alone (the store also makes its dir 0700).
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    let mut store_config = SledStoreConfig::new(data_dir);
    store_config.max_value_bytes = max_value_bytes;
    store_config.hooks = observer.store_hooks();
    SledStore::open(&store_config)
        .with_context(|| format!("cannot open the store in {}", data_dir.display()))
}

/// Serves the gateway's API over `store` until a shutdown signal.
async fn serve_store<S: FencedStore>(
    store: Arc<S>,
    parts: Parts,
    args: &GatewayArgs,
    engine: &'static str,
) -> anyhow::Result<()> {
    let config = parts.config;
    let state = AppState::new(AppParts {
        store,
        verifier: parts.verifier,
        config: Arc::new(config.clone()),
        policy: parts.policy,
        observer: parts.observer,
    });
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let local = listener.local_addr()?;
    // A client may present a certificate from the CA: a policy may name it
    // as a principal (`certificates`).
    let tls = match &args.certs {
        Some(dir) => Some(palisade_serve::tls::server_config_with(
            &dir.join("gateway.pem"),
            &dir.join("gateway-key.pem"),
            palisade_serve::tls::ClientCerts::Optional(&dir.join("ca.pem")),
        )?),
        None => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    say!("palisade gateway listening on {scheme}://{local}");
    tracing::info!(%local, engine, "gateway started");
    palisade_gateway::serve(
        listener,
        palisade_gateway::router(state),
        tls,
        crate::shutdown::shutdown_signal(),
        config.drain_timeout,
        config.max_requests,
    )
    .await?;
    Ok(())
}
