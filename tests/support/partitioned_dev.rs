//! [`Dev`]: three election nodes with `--partitions 3` on free ports and
//! steady timing (`STEADY_LEADER`: a loaded machine does not move
//! leadership on its own, which at dev's 60..120 ms election timeout it
//! did every few seconds), for the tests of a partitioned cluster
//! (`sdk_partitions.rs`). No policy: the key it hands out is sent and
//! ignored.

use crate::support;

use std::time::Duration;

use palisade_client::{Client, ClientConfig};

/// Three partitioned nodes; killed when dropped.
pub struct Dev {
    cluster: support::Cluster,
    _dir: tempfile::TempDir,
    pub urls: Vec<String>,
    pub key: String,
}

impl Dev {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let setups = (1..=3)
            .map(|id| {
                let mut setup = support::node_setup(dir.path(), id, "127.0.0.1");
                setup.args = support::STEADY_LEADER
                    .iter()
                    .map(|a| a.to_string())
                    .collect();
                setup.args.extend(["--partitions".into(), "3".into()]);
                setup
            })
            .collect();
        let cluster = support::Cluster::start_with(dir.path(), setups);
        let urls = cluster.urls();
        Self {
            cluster,
            _dir: dir,
            urls,
            key: "no-policy-on-these-nodes".into(),
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

    /// The pid of election node `id`.
    pub fn node_pid(&self, id: u64) -> u32 {
        self.cluster.node(id).expect("a running node").pid()
    }
}
