//! What the integration tests share: the real `palisade` binary started
//! through `palisade-local-cluster` (port 0, temp dirs), test tokens signed
//! with a test key, and HTTP helpers.
#![allow(dead_code)]

pub mod partitions;
pub mod pg;
pub mod watch;

use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::SigningKey;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use palisade_local_cluster::{ClusterConfig, GatewayKeys, Node, NodeSetup, NodeSpec, PeerAuth};
use palisade_names::{LeaseClaims, ISSUER};

/// Taken by every test of the `load` binary for its whole run: each loads
/// the machine's two cores (floods, power cuts, big tables), and a second
/// one beside it would turn its bounds into timing luck.
pub static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long a starting node has to print its `listening on` line.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `palisade args` to its end (stdin closed, `RUST_LOG=warn`): its
/// exit code and stderr.
pub fn run_palisade(args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(palisade())
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run palisade");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The binary under test.
fn palisade() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_palisade"))
}

/// A running node and the URL it printed; killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct Process {
    pub node: Node,
    /// The `http://host:port` it printed.
    pub url: String,
}

impl Process {
    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        self.node.kill();
    }
}

/// Starts `spec` and waits for it to print `listening on http://…`.
pub fn spawn_node(spec: NodeSpec) -> Process {
    let mut node = Node::start(palisade(), spec).expect("start palisade");
    let url = node
        .wait_listening(LISTEN_TIMEOUT)
        .expect("palisade starts listening");
    Process { node, url }
}

/// A gateway on port 0 over `data_dir`, verifying with `key`.
pub fn spawn_gateway(data_dir: &Path, key: &TestKey) -> Process {
    spawn_node(NodeSpec::gateway(
        "127.0.0.1:0",
        data_dir.to_owned(),
        GatewayKeys::PublicKey(key.pem_path.clone()),
    ))
}

/// What clients of a secured cluster need: the CA its servers' certificates
/// chain to and the API keys of its principals — `admin` (everything),
/// `orders` and `intruder` (each: acquire and read leases named `orders.*`).
#[derive(Debug, Clone)]
pub struct Access {
    /// The cluster CA (`certs/ca.pem`).
    pub ca: std::path::PathBuf,
    /// The certificates directory (`--certs`).
    pub certs: std::path::PathBuf,
    /// The policy file.
    pub policy: std::path::PathBuf,
    /// The directory of the policy file and the principals' key files.
    pub keys: std::path::PathBuf,
}

impl Access {
    fn new(dir: &Path) -> Self {
        use palisade_serve::policy::{add, operator, Rules};
        let keys = dir.join("policy");
        add(&keys, "admin", &operator()).expect("policy: admin");
        let orders = Rules {
            acquire: vec!["orders.".into()],
            read: vec!["orders.".into()],
            ..Rules::default()
        };
        add(&keys, "orders", &orders).expect("policy: orders");
        // Another service with the same rights: it must not pass for orders.
        add(&keys, "intruder", &orders).expect("policy: intruder");
        Self {
            ca: dir.join("certs").join("ca.pem"),
            certs: dir.join("certs"),
            policy: keys.join("policy.json"),
            keys,
        }
    }

    /// The API key file of `principal`.
    pub fn key_file(&self, principal: &str) -> std::path::PathBuf {
        self.keys.join(format!("{principal}.key"))
    }

    /// The API key of `principal`.
    pub fn key(&self, principal: &str) -> String {
        palisade_serve::policy::read_key(&self.key_file(principal)).expect("key file")
    }

    /// An HTTP client that trusts the CA and sends `principal`'s key.
    pub fn http(&self, principal: &str) -> reqwest::Client {
        self.http_with_timeout(principal, Duration::from_secs(5))
    }

    /// As [`Access::http`], with another request timeout.
    pub fn http_with_timeout(&self, principal: &str, timeout: Duration) -> reqwest::Client {
        let pem = std::fs::read(&self.ca).expect("ca.pem");
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            palisade_client::API_KEY_HEADER,
            self.key(principal).parse().expect("header"),
        );
        reqwest::Client::builder()
            .timeout(timeout)
            .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("pem"))
            .default_headers(headers)
            .build()
            .expect("client")
    }

    /// An SDK client for `cluster` (and `gateway`) as `principal`.
    pub fn sdk(
        &self,
        cluster: &Cluster,
        gateway: Option<&Process>,
        principal: &str,
    ) -> palisade_client::Client {
        let mut config = palisade_client::ClientConfig::new(cluster.urls())
            .with_ca_file(&self.ca)
            .expect("ca")
            .with_api_key(&self.key(principal))
            .expect("key");
        config.gateway = gateway.map(|g| g.url.clone());
        palisade_client::Client::new(config)
    }

    /// How a gateway for `cluster` starts: over TLS, enforcing the policy,
    /// fetching keys from the nodes' https:// JWKS.
    pub fn gateway_for(&self, cluster: &Cluster, data_dir: &Path) -> NodeSpec {
        let mut spec = gateway_for(cluster, data_dir);
        spec.args.extend([
            "--certs".to_owned(),
            self.certs.display().to_string(),
            "--policy".to_owned(),
            self.policy.display().to_string(),
        ]);
        spec
    }

    /// The flags a `palisade` client command needs to reach the cluster as
    /// `principal`.
    pub fn cli_args(&self, principal: &str) -> Vec<String> {
        vec![
            "--ca".to_owned(),
            self.ca.display().to_string(),
            "--api-key-file".to_owned(),
            self.key_file(principal).display().to_string(),
        ]
    }
}

/// A signing key with its public half in a PEM file.
pub struct TestKey {
    signing: EncodingKey,
    pub pem_path: std::path::PathBuf,
}

impl TestKey {
    pub fn new(dir: &Path) -> Self {
        let key = SigningKey::from_bytes(&rand::random::<[u8; 32]>());
        let pem = key
            .verifying_key()
            .to_public_key_pem(Default::default())
            .expect("pem");
        let pem_path = dir.join("public.pem");
        std::fs::write(&pem_path, pem).expect("write pem");
        Self {
            signing: EncodingKey::from_ed_der(key.to_pkcs8_der().expect("der").as_bytes()),
            pem_path,
        }
    }

    /// A lease JWT valid for a minute.
    pub fn jwt(&self, lease: &str, token: u64) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        let claims = LeaseClaims {
            iss: ISSUER.to_owned(),
            sub: "test".to_owned(),
            lease: lease.to_owned(),
            token,
            iat: now,
            exp: now + 60,
        };
        jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, &self.signing).expect("sign")
    }
}

/// Free loopback ports (bound, then released).
pub fn free_ports(n: usize) -> Vec<u16> {
    palisade_local_cluster::free_ports(n).expect("free ports")
}

/// How the tests run node `id` of a cluster in `dir`: on `host` with free
/// ports, dialing its peers from `host` too (so the fault suite's
/// partitions can cut it), data in `dir/node<id>`, logs discarded.
pub fn node_setup(dir: &Path, id: u64, host: &str) -> NodeSetup {
    NodeSetup {
        host: host.to_owned(),
        source_ip: true,
        ..NodeSetup::new(dir.join(format!("node{id}")))
    }
}

/// Election timing slower than the default (heartbeat 100 ms, election
/// timeout 600..1200 ms, so ttls from 2 s), for tests whose attack must run
/// on one leader for seconds: on a loaded machine the default's 60..120 ms
/// timeout moves leadership every few seconds.
pub const STEADY_LEADER: [&str; 6] = [
    "--heartbeat-ms",
    "100",
    "--election-timeout-ms",
    "600..1200",
    "--min-ttl-ms",
    "2000",
];

/// Runs `palisade certs init` into `dir`: certificates for nodes 1..=4 (a
/// [`Cluster`] runs 1..=3; node 4's is for tests of a non-member).
pub fn make_certs(dir: &Path) {
    make_certs_for(dir, &["127.0.0.1"]);
}

/// As [`make_certs`], server certificates valid for `ips` (the hosts the
/// nodes listen on, which TLS clients dial).
pub fn make_certs_for(dir: &Path, ips: &[&str]) {
    palisade_local_cluster::make_certs(palisade(), dir, 4, ips).expect("palisade certs init");
}

/// A three-node election cluster of real processes on loopback, with mutual
/// TLS between peers (certificates in `dir/certs`). Every start of a node
/// waits for its `listening on` line; what the tests add to
/// [`palisade_local_cluster::Cluster`] is that failures panic.
pub struct Cluster {
    inner: palisade_local_cluster::Cluster,
    /// Peer listener ports.
    pub peer_ports: Vec<u16>,
}

impl Cluster {
    pub fn start(dir: &Path) -> Self {
        Self::start_with(
            dir,
            (1..=3).map(|id| node_setup(dir, id, "127.0.0.1")).collect(),
        )
    }

    /// Starts three nodes, node `i + 1` as `setups[i]` says.
    pub fn start_with(dir: &Path, setups: Vec<NodeSetup>) -> Self {
        Self::start_configured(dir, setups, None)
    }

    /// Starts three nodes as `setups` say, serving clients over TLS and
    /// enforcing a policy with the principals of [`Access`].
    pub fn start_secure(dir: &Path, setups: Vec<NodeSetup>) -> (Self, Access) {
        let access = Access::new(dir);
        let cluster = Self::start_configured(dir, setups, Some(&access));
        (cluster, access)
    }

    /// As [`Cluster::start_secure`], with `edit` run on the policy (add
    /// principals) before the nodes start.
    pub fn start_secure_edited(
        dir: &Path,
        setups: Vec<NodeSetup>,
        edit: impl FnOnce(&Access),
    ) -> (Self, Access) {
        let access = Access::new(dir);
        edit(&access);
        let cluster = Self::start_configured(dir, setups, Some(&access));
        (cluster, access)
    }

    fn start_configured(dir: &Path, setups: Vec<NodeSetup>, access: Option<&Access>) -> Self {
        let certs = dir.join("certs");
        let mut hosts: Vec<&str> = setups.iter().map(|s| s.host.as_str()).collect();
        hosts.push("127.0.0.1");
        hosts.dedup();
        make_certs_for(&certs, &hosts);
        let config = ClusterConfig {
            nodes: setups,
            peer_auth: PeerAuth::Certs(certs),
            wait_listening: Some(LISTEN_TIMEOUT),
            client_tls: access.is_some(),
            policy: access.map(|a| a.policy.clone()),
        };
        let inner = palisade_local_cluster::Cluster::start(palisade(), config).expect("cluster");
        let peer_ports = inner.ids().map(|id| inner.setup(id).peer_port).collect();
        Self { inner, peer_ports }
    }

    /// Waits (bounded) until a running node reports a leader, and returns it.
    pub async fn leader(&self, client: &reqwest::Client) -> u64 {
        self.leader_among(client, &[1, 2, 3], 200)
            .await
            .expect("no leader within 10 s")
    }

    /// The leader, once it has kept leading for a while (leadership may move
    /// once just after the start): at most about 10 s more.
    pub async fn settled_leader(&self, client: &reqwest::Client) -> u64 {
        let mut leader = self.leader(client).await;
        for _ in 0..20 {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let now = self.leader(client).await;
            if now == leader {
                break;
            }
            leader = now;
        }
        leader
    }
}

impl Deref for Cluster {
    type Target = palisade_local_cluster::Cluster;

    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

impl DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.inner
    }
}

/// POSTs JSON to an election node once; returns (status, body).
pub async fn post_json_once(
    client: &reqwest::Client,
    url: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let response = client.post(url).json(&body).send().await.expect("request");
    let status = response.status().as_u16();
    (
        status,
        response.json().await.unwrap_or(serde_json::Value::Null),
    )
}

/// POSTs JSON, retrying 503 (a leader election in progress, which a loaded
/// machine can cause at any time) for up to 5 s.
pub async fn post_json(
    client: &reqwest::Client,
    url: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    for _ in 0..100 {
        let (status, answer) = post_json_once(client, url, body.clone()).await;
        if status != 503 {
            return (status, answer);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    post_json_once(client, url, body).await
}

/// Sends a request built by `build`, retrying 503 for up to 5 s.
pub async fn send_retrying(build: impl Fn() -> reqwest::RequestBuilder) -> reqwest::Response {
    for _ in 0..100 {
        let response = build().send().await.expect("request");
        if response.status() != 503 {
            return response;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    build().send().await.expect("request")
}

/// The grant secret tests use for `holder`: chosen by the client, as the SDK
/// does, so a retried acquire gets the same grant; one per holder, so tests
/// that acquire again as the same holder keep their old meaning.
pub fn test_secret(holder: &str) -> String {
    let hex: String = holder.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{hex:0>32}")
}

/// Acquires until granted or refused for good, retrying 503s (no leader yet)
/// for a bounded time. The grant's secret is [`test_secret`] of `holder`.
pub async fn acquire(
    client: &reqwest::Client,
    base: &str,
    lease: &str,
    holder: &str,
    ttl_ms: u64,
) -> (u16, serde_json::Value) {
    let url = format!("{base}/v1/leases/{lease}/acquire");
    let body = serde_json::json!({
        "holder": holder,
        "ttl_ms": ttl_ms,
        "secret": test_secret(holder),
    });
    for _ in 0..100 {
        let (status, answer) = post_json(client, &url, body.clone()).await;
        if status != 503 {
            return (status, answer);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, last) = post_json(client, &url, body).await;
    panic!("acquire of {lease} at {base} kept answering 503: {last}");
}

/// The key ids a JWKS document publishes, sorted.
pub fn kids_of(jwks: &serde_json::Value) -> Vec<String> {
    let mut kids: Vec<String> = jwks["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .filter_map(|k| k["kid"].as_str().map(str::to_owned))
        .collect();
    kids.sort();
    kids
}

/// The key ids `base`'s `/v1/jwks` publishes now, sorted.
pub async fn published_kids(http: &reqwest::Client, base: &str) -> Vec<String> {
    let jwks: serde_json::Value = get_json(http, &format!("{base}/v1/jwks"), "jwks").await;
    kids_of(&jwks)
}

/// GETs `url` and parses the JSON answer (any status), panicking with
/// `what` if there is none.
pub async fn get_json<T: serde::de::DeserializeOwned>(
    client: &reqwest::Client,
    url: &str,
    what: &str,
) -> T {
    client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client")
}

/// A gateway on port 0 that fetches keys from `cluster`'s JWKS.
pub fn spawn_gateway_for(cluster: &Cluster, data_dir: &Path) -> Process {
    spawn_node(gateway_for(cluster, data_dir))
}

/// How a gateway on port 0 that fetches keys from `cluster`'s JWKS starts.
pub fn gateway_for(cluster: &Cluster, data_dir: &Path) -> NodeSpec {
    NodeSpec::gateway(
        "127.0.0.1:0",
        data_dir.to_owned(),
        GatewayKeys::Election(cluster.urls()),
    )
}

/// An SDK client for `cluster` (and `gateway`), with fence-on-acquire.
pub fn sdk(cluster: &Cluster, gateway: Option<&Process>) -> palisade_client::Client {
    let mut config = palisade_client::ClientConfig::new(cluster.urls());
    config.gateway = gateway.map(|g| g.url.clone());
    palisade_client::Client::new(config)
}

/// Acquires `count` leases named `{prefix}-{i}` on `base` for `ttl_ms`,
/// `clients` at a time; each acquire is retried for up to 10 s (a leader
/// change under this load is not what the callers test). Answers each
/// grant (`lease`, `holder`, `token`, `secret`), for [`release_many`].
pub async fn grant_many(
    client: &reqwest::Client,
    base: &str,
    prefix: &str,
    (count, ttl_ms): (usize, u64),
    clients: usize,
) -> Vec<serde_json::Value> {
    let mut tasks = Vec::new();
    for task in 0..clients {
        let (client, base, prefix) = (client.clone(), base.to_owned(), prefix.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut grants = Vec::new();
            for i in (task..count).step_by(clients) {
                let url = format!("{base}/v1/leases/{prefix}-{i}/acquire");
                let body = serde_json::json!({"holder": format!("h{i}"), "ttl_ms": ttl_ms});
                let granted = post_until(&client, &url, &body, &[200]).await;
                grants.push(granted.unwrap_or_else(|(status, last)| {
                    panic!("acquire {prefix}-{i} failed: last answer {status} {last}")
                }));
            }
            grants
        }));
    }
    let mut grants = Vec::new();
    for task in tasks {
        grants.extend(task.await.expect("acquirer"));
    }
    grants
}

/// Releases `grants` (as [`grant_many`] answered them) through `base`,
/// `clients` at a time; each release is retried for up to 10 s, and a 409
/// (already gone) counts as released.
pub async fn release_many(
    client: &reqwest::Client,
    base: &str,
    grants: Vec<serde_json::Value>,
    clients: usize,
) {
    let grants = std::sync::Arc::new(grants);
    let mut tasks = Vec::new();
    for task in 0..clients {
        let (client, base, grants) = (client.clone(), base.to_owned(), grants.clone());
        tasks.push(tokio::spawn(async move {
            for grant in grants.iter().skip(task).step_by(clients) {
                let lease = grant["lease"].as_str().unwrap_or_default();
                let url = format!("{base}/v1/leases/{lease}/release");
                let body = serde_json::json!({
                    "holder": grant["holder"], "token": grant["token"], "secret": grant["secret"]
                });
                if let Err((status, last)) = post_until(&client, &url, &body, &[200, 409]).await {
                    panic!("release of {lease} failed: last answer {status} {last}");
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("releaser");
    }
}

/// Posts `body` to `url` until it answers one of `accept` (every 50 ms, for
/// up to 10 s); answers that body, or the last status and body if it never did.
async fn post_until(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
    accept: &[u16],
) -> Result<serde_json::Value, (u16, serde_json::Value)> {
    let mut last = (0, serde_json::Value::Null);
    for _ in 0..200 {
        let (status, answer) = post_json_once(client, url, body.clone()).await;
        if accept.contains(&status) {
            return Ok(answer);
        }
        last = (status, answer);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(last)
}

/// Waits (at most `limit`) until node `url` has applied `index`; returns
/// how long that took.
pub async fn caught_up(
    client: &reqwest::Client,
    url: &str,
    index: u64,
    limit: Duration,
) -> Duration {
    let started = std::time::Instant::now();
    while started.elapsed() < limit {
        if let Ok(answer) = client.get(format!("{url}/v1/cluster")).send().await {
            if let Ok(view) = answer.json::<serde_json::Value>().await {
                if view["applied_index"].as_u64().unwrap_or(0) >= index {
                    return started.elapsed();
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url} did not apply index {index} within {limit:?}");
}

/// One sample of a counter in a node's `/metrics` text.
pub async fn counter(client: &reqwest::Client, base: &str, name: &str) -> f64 {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}
