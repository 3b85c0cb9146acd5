//! [`Dev`]: a `palisade dev --partitions 3` on free ports, for the tests
//! of a partitioned cluster (`sdk_partitions.rs`).

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use palisade_client::{Client, ClientConfig};

/// How long dev may take to start, or a node to show up.
const PATIENCE: Duration = Duration::from_secs(60);

/// A `palisade dev --partitions 3` on free ports; stopped (SIGTERM, then
/// SIGKILL) when dropped.
pub struct Dev {
    child: Child,
    _dir: tempfile::TempDir,
    pub urls: Vec<String>,
    pub key: String,
}

impl Dev {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let ports = support::free_ports(3);
        let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(["dev", "--partitions", "3", "--data-dir"])
            .arg(dir.path())
            .args(["--election-port", &ports[0].to_string()])
            .args(["--peer-port", &ports[1].to_string()])
            .args(["--gateway-port", &ports[2].to_string()])
            .env_remove("PALISADE_API_KEY")
            .env_remove("PALISADE_ELECTION")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn dev");
        let (send, lines) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        let started = Instant::now();
        let mut urls = None;
        while started.elapsed() < PATIENCE {
            let Ok(line) = lines.recv_timeout(Duration::from_millis(200)) else {
                continue;
            };
            if let Some(list) = line.split_whitespace().find_map(|w| {
                w.strip_prefix("PALISADE_ELECTION=")
                    .map(|v| v.split(',').map(str::to_owned).collect::<Vec<_>>())
            }) {
                urls = Some(list);
            }
            if line.contains("Ctrl-C stops everything") {
                break;
            }
        }
        let urls = urls.expect("dev printed no PALISADE_ELECTION");
        let key = std::fs::read_to_string(dir.path().join("admin.key"))
            .expect("admin.key")
            .trim()
            .to_owned();
        Self {
            child,
            _dir: dir,
            urls,
            key,
        }
    }

    /// A plain HTTP client sending the admin key.
    pub fn http(&self) -> reqwest::Client {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            palisade_client::API_KEY_HEADER,
            self.key.parse().expect("key header"),
        );
        reqwest::Client::builder()
            .default_headers(headers)
            .timeout(Duration::from_secs(2))
            .build()
            .expect("http client")
    }

    /// An SDK client of every node, renewing over streams or requests.
    pub fn sdk(&self, renew_stream: bool) -> Client {
        let mut config = ClientConfig::new(self.urls.clone())
            .with_api_key(&self.key)
            .expect("key");
        config.renew_stream = renew_stream;
        Client::new(config)
    }

    /// The URL of node `id` (dev numbers its nodes from 1, in port order).
    pub fn url(&self, id: u64) -> &str {
        &self.urls[usize::try_from(id - 1).expect("id")]
    }

    /// The pid of dev's election node `id`.
    pub fn node_pid(&self, id: u64) -> u32 {
        let started = Instant::now();
        while started.elapsed() < PATIENCE {
            for pid in children(self.child.id()) {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
                if args
                    .windows(2)
                    .any(|w| w[0] == b"--id" && w[1] == id.to_string().as_bytes())
                {
                    return pid;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("dev runs no election node {id}");
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The pids of `parent`'s children.
fn children(parent: u32) -> Vec<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{parent}/task"))
        .into_iter()
        .flatten();
    let lists = tasks
        .map_while(Result::ok)
        .map(|task| std::fs::read_to_string(task.path().join("children")).unwrap_or_default());
    let lists: Vec<String> = lists.collect();
    lists
        .iter()
        .flat_map(|l| l.split_whitespace())
        .filter_map(|p| p.parse().ok())
        .collect()
}
