//! `palisade dev`: a whole local cluster in one command — three election
//! nodes and a gateway, as child processes of this binary on loopback — with
//! the endpoints and a copy-paste walkthrough printed once it is ready.

use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Keep data here instead of a fresh temp dir (reused across runs).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// First election port; nodes use it and the next two.
    #[arg(long, default_value_t = 7001)]
    election_port: u16,
    /// First peer port (Raft RPC, mutual TLS); default: election port + 100.
    #[arg(long)]
    peer_port: Option<u16>,
    /// The gateway's port.
    #[arg(long, default_value_t = 8080)]
    gateway_port: u16,
}

/// Children that get SIGTERM (then SIGKILL) when dropped.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &self.0 {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        for child in &mut self.0 {
            while std::time::Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub async fn run(args: DevArgs) -> anyhow::Result<ExitCode> {
    let temp;
    let root = match &args.data_dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::Builder::new().prefix("palisade-dev-").tempdir()?;
            temp.path().to_owned()
        }
    };
    std::fs::create_dir_all(&root)?;
    let exe = std::env::current_exe()?;
    let ports: Vec<u16> = (0..3).map(|i| args.election_port + i).collect();
    let first_peer_port = args
        .peer_port
        .unwrap_or_else(|| args.election_port.saturating_add(100));
    let peers = (0..3)
        .map(|i| format!("{}=127.0.0.1:{}", i + 1, first_peer_port + i))
        .collect::<Vec<_>>()
        .join(",");
    let election_urls: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let gateway_url = format!("http://127.0.0.1:{}", args.gateway_port);

    // Peers authenticate each other with mutual TLS: the certificates live
    // with the data (made once; a reused --data-dir keeps them).
    let certs = root.join("certs");
    if !certs.join("ca.pem").exists() {
        palisade_serve::certs::init(
            &certs,
            &palisade_serve::certs::Layout {
                nodes: 3,
                dns: vec!["localhost".into()],
                ips: vec![std::net::Ipv4Addr::LOCALHOST.into()],
            },
        )?;
    }

    let mut children = Children(Vec::new());
    let spawn = |name: &str, command_args: Vec<String>| -> anyhow::Result<Child> {
        let log = std::fs::File::create(root.join(format!("{name}.log")))?;
        Command::new(&exe)
            .args(command_args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info,openraft=warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {name}"))
    };
    for (i, port) in ports.iter().enumerate() {
        let id = i + 1;
        children.0.push(spawn(
            &format!("election-{id}"),
            vec![
                "election".into(),
                "--id".into(),
                id.to_string(),
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--data-dir".into(),
                root.join(format!("election-{id}")).display().to_string(),
                "--peers".into(),
                peers.clone(),
                "--certs".into(),
                certs.display().to_string(),
            ],
        )?);
    }
    children.0.push(spawn(
        "gateway",
        vec![
            "gateway".into(),
            "--listen".into(),
            format!("127.0.0.1:{}", args.gateway_port),
            "--data-dir".into(),
            root.join("gateway").display().to_string(),
            "--election".into(),
            election_urls.join(","),
        ],
    )?);

    wait_ready(&election_urls, &gateway_url, &mut children).await?;
    print_walkthrough(&root, &election_urls, &gateway_url);
    super::shutdown_signal().await;
    println!("stopping the cluster...");
    drop(children);
    println!("stopped");
    Ok(ExitCode::SUCCESS)
}

async fn wait_ready(
    elections: &[String],
    gateway: &str,
    children: &mut Children,
) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()?;
    for _ in 0..200 {
        for child in &mut children.0 {
            if let Ok(Some(status)) = child.try_wait() {
                bail!("a cluster process exited early ({status}); see the logs in the data dir (ports in use?)");
            }
        }
        let has_key = async {
            let jwks: serde_json::Value = client
                .get(format!("{}/v1/jwks", elections[0]))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            Some(jwks["keys"].as_array().is_some_and(|k| !k.is_empty()))
        };
        let gateway_up = async {
            client
                .get(format!("{gateway}/healthz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        };
        if has_key.await == Some(true) && gateway_up.await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the cluster was not ready within 20 s")
}

fn print_walkthrough(root: &std::path::Path, elections: &[String], gateway: &str) {
    let e = &elections[0];
    println!(
        "\
Palisade dev cluster is up (data and logs in {root}).

  election nodes: {elections}
  gateway:        {gateway}

Walkthrough: a paused leader's late write is refused.

  # A acquires a 2 s lease and writes with its token
  A=$(curl -s -XPOST -H 'content-type: application/json' -d '{{\"holder\":\"A\",\"ttl_ms\":2000}}' {e}/v1/leases/orders/acquire)
  JWT_A=$(echo \"$A\" | sed 's/.*\"jwt\":\"\\([^\"]*\\)\".*/\\1/')
  curl -s -XPUT -H \"authorization: Bearer $JWT_A\" --data 'from A' {gateway}/v1/objects/orders/state

  # A stops renewing; after 2 s B gets the lease (waiting up to 5 s), raises the fence, writes
  B=$(curl -s -XPOST -H 'content-type: application/json' -d '{{\"holder\":\"B\",\"ttl_ms\":10000,\"wait_ms\":5000}}' {e}/v1/leases/orders/acquire)
  JWT_B=$(echo \"$B\" | sed 's/.*\"jwt\":\"\\([^\"]*\\)\".*/\\1/')
  curl -s -XPOST -H \"authorization: Bearer $JWT_B\" {gateway}/v1/fences/orders
  curl -s -XPUT -H \"authorization: Bearer $JWT_B\" --data 'from B' {gateway}/v1/objects/orders/state

  # A wakes up and writes: 409 stale_token, nothing changed
  curl -s -XPUT -H \"authorization: Bearer $JWT_A\" --data 'late A' {gateway}/v1/objects/orders/state
  curl -s {gateway}/v1/objects/orders/state

  curl -s {e}/v1/cluster      # who leads

Ctrl-C stops everything.",
        root = root.display(),
        elections = elections.join(" "),
    );
}
