//! What the integration tests share: spawning the real `palisade` binary on
//! port 0 and temp dirs, and signing test tokens.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::SigningKey;
use jsonwebtoken::{Algorithm, EncodingKey, Header};

/// A child process that is killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct Process {
    pub child: Child,
    /// The `http://host:port` it printed.
    pub url: String,
}

impl Process {
    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `palisade ARGS` and waits for it to print `listening on http://…`.
pub fn spawn_server(args: &[&str]) -> Process {
    spawn_server_env(args, &[])
}

/// [`spawn_server`] with extra environment variables.
pub fn spawn_server_env(args: &[&str], env: &[(String, String)]) -> Process {
    let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn palisade");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.split("listening on ").nth(1) {
                let _ = tx.send(url.trim().to_owned());
            }
        }
    });
    let url = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(url) => url,
        Err(_) => {
            let _ = child.kill();
            panic!("palisade {args:?} did not start listening within 30 s");
        }
    };
    Process { child, url }
}

/// A gateway on port 0 over `data_dir`, verifying with `key`.
pub fn spawn_gateway(data_dir: &Path, key: &TestKey) -> Process {
    spawn_server(&[
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data_dir.to_str().expect("utf8 path"),
        "--public-key",
        key.pem_path.to_str().expect("utf8 path"),
    ])
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
        let claims = serde_json::json!({
            "iss": "palisade", "sub": "test", "lease": lease,
            "token": token, "iat": now, "exp": now + 60,
        });
        jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, &self.signing).expect("sign")
    }
}

/// Free loopback ports (bound, then released: peers must know every port
/// before any node starts).
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect()
}

/// How one node of a [`Cluster`] runs.
#[derive(Debug, Clone)]
pub struct NodeSetup {
    /// The IP it listens on and dials its peers from.
    pub host: String,
    /// Extra environment (e.g. libfaketime).
    pub env: Vec<(String, String)>,
}

impl Default for NodeSetup {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            env: Vec::new(),
        }
    }
}

/// Runs `palisade certs init` into `dir`: certificates for nodes 1..=4 (a
/// [`Cluster`] runs 1..=3; node 4's is for tests of a non-member).
pub fn make_certs(dir: &Path) {
    let status = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["certs", "init", "--nodes", "4", "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .status()
        .expect("palisade certs init");
    assert!(status.success(), "palisade certs init failed");
}

/// A three-node election cluster of real processes on loopback, with mutual
/// TLS between peers (certificates in `dir/certs`).
pub struct Cluster {
    pub dir: std::path::PathBuf,
    /// Client API ports.
    pub ports: Vec<u16>,
    /// Peer listener ports.
    pub peer_ports: Vec<u16>,
    pub setups: Vec<NodeSetup>,
    pub nodes: Vec<Option<Process>>,
}

impl Cluster {
    pub fn start(dir: &Path) -> Self {
        Self::start_with(dir, vec![NodeSetup::default(); 3])
    }

    /// Starts three nodes, node `i + 1` as `setups[i]` says.
    pub fn start_with(dir: &Path, setups: Vec<NodeSetup>) -> Self {
        let mut ports = free_ports(6);
        let peer_ports = ports.split_off(3);
        make_certs(&dir.join("certs"));
        let mut cluster = Self {
            dir: dir.to_owned(),
            ports,
            peer_ports,
            setups,
            nodes: vec![None, None, None],
        };
        for id in 1..=3 {
            cluster.start_node(id);
        }
        cluster
    }

    fn addr(&self, id: u64) -> String {
        let index = (id - 1) as usize;
        format!("{}:{}", self.setups[index].host, self.ports[index])
    }

    /// Where node `id`'s peers reach it.
    pub fn peer_addr(&self, id: u64) -> String {
        let index = (id - 1) as usize;
        format!("{}:{}", self.setups[index].host, self.peer_ports[index])
    }

    fn peers(&self) -> String {
        (1..=3)
            .map(|id| format!("{id}={}", self.peer_addr(id)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts (or restarts) node `id` on its data dir.
    pub fn start_node(&mut self, id: u64) {
        let index = (id - 1) as usize;
        let setup = &self.setups[index];
        let data = self.dir.join(format!("node{id}"));
        let process = spawn_server_env(
            &[
                "election",
                "--id",
                &id.to_string(),
                "--listen",
                &self.addr(id),
                "--source-ip",
                &setup.host,
                "--data-dir",
                data.to_str().expect("utf8"),
                "--peers",
                &self.peers(),
                "--certs",
                self.dir.join("certs").to_str().expect("utf8"),
            ],
            &setup.env,
        );
        self.nodes[index] = Some(process);
    }

    /// SIGKILLs node `id`.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut process) = self.nodes[(id - 1) as usize].take() {
            process.kill();
        }
    }

    /// Sends `signal` (e.g. "STOP", "CONT") to node `id`.
    pub fn signal(&self, id: u64, signal: &str) {
        let process = self.nodes[(id - 1) as usize]
            .as_ref()
            .expect("node is running");
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &process.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    pub fn url(&self, id: u64) -> String {
        format!("http://{}", self.addr(id))
    }

    pub fn urls(&self) -> Vec<String> {
        (1..=3).map(|id| self.url(id)).collect()
    }

    /// Waits (bounded) until a running node reports a leader, and returns it.
    pub async fn leader(&self, client: &reqwest::Client) -> u64 {
        self.leader_among(client, &[1, 2, 3], 200)
            .await
            .expect("no leader within 10 s")
    }

    /// A running node among `ids` that says it leads, polled up to `polls`
    /// times 50 ms apart.
    pub async fn leader_among(
        &self,
        client: &reqwest::Client,
        ids: &[u64],
        polls: u32,
    ) -> Option<u64> {
        for _ in 0..polls {
            for id in ids.iter().copied() {
                if self.nodes[(id - 1) as usize].is_none() {
                    continue;
                }
                let Ok(response) = client
                    .get(format!("{}/v1/cluster", self.url(id)))
                    .send()
                    .await
                else {
                    continue;
                };
                let Ok(body) = response.json::<serde_json::Value>().await else {
                    continue;
                };
                if body["state"] == "Leader" {
                    return Some(id);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
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

pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client")
}

/// A gateway on port 0 that fetches keys from `cluster`'s JWKS.
pub fn spawn_gateway_for(cluster: &Cluster, data_dir: &Path) -> Process {
    spawn_server(&[
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data_dir.to_str().expect("utf8"),
        "--election",
        &cluster.urls().join(","),
    ])
}

/// An SDK client for `cluster` (and `gateway`), with fence-on-acquire.
pub fn sdk(cluster: &Cluster, gateway: Option<&Process>) -> palisade_client::Client {
    let mut config = palisade_client::ClientConfig::new(cluster.urls());
    config.gateway = gateway.map(|g| g.url.clone());
    palisade_client::Client::new(config)
}
