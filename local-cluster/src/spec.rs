use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// Which server a node runs, with what only that kind needs.
#[derive(Debug, Clone)]
pub enum Role {
    /// `palisade election`: one member of the Raft cluster.
    Election {
        /// Its id, a key of `peers`.
        id: u64,
        /// The whole initial membership: id to the `host:port` of its peer
        /// listener (this node's entry is where its own listens).
        peers: BTreeMap<u64, String>,
        /// The local IP its connections to peers leave from (`--source-ip`);
        /// `None` leaves the choice to the kernel.
        source_ip: Option<String>,
        /// How peers authenticate each other.
        peer_auth: PeerAuth,
    },
    /// `palisade gateway`.
    Gateway {
        /// Where it gets the keys it verifies tokens with.
        keys: GatewayKeys,
        /// A PostgreSQL URL (`--postgres`) to keep objects in instead of
        /// sled in the data dir.
        postgres: Option<String>,
    },
}

/// How election nodes authenticate each other on the peer port.
#[derive(Debug, Clone)]
pub enum PeerAuth {
    /// Mutual TLS with the certificates in this directory, as made by
    /// `palisade certs init` (`--certs`; see [`crate::make_certs`]).
    Certs(PathBuf),
    /// Plaintext, unauthenticated (`--insecure-peers`).
    Insecure,
}

/// Where a gateway gets its verification keys.
#[derive(Debug, Clone)]
pub enum GatewayKeys {
    /// The cluster's JWKS, from these election node URLs (`--election`).
    Election(Vec<String>),
    /// One Ed25519 public key in a PEM file (`--public-key`).
    PublicKey(PathBuf),
}

/// Where a node's stderr (its logs) goes.
#[derive(Debug, Clone, Default)]
pub enum Logs {
    /// Nowhere.
    #[default]
    Discard,
    /// The parent's stderr.
    Inherit,
    /// This file, appended to (a restarted node's log follows its earlier
    /// life's).
    File(PathBuf),
}

/// Everything needed to start one node, and start it again the same way.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// Which server, and its role-specific settings.
    pub role: Role,
    /// `host:port` to listen on; a gateway may take port 0 (the address it
    /// got is in its `listening on` line).
    pub listen: String,
    /// Its data directory (created by the node if missing).
    pub data_dir: PathBuf,
    /// Extra flags, after the ones the role implies.
    pub args: Vec<String>,
    /// Extra environment (`RUST_LOG`, libfaketime, ...).
    pub env: Vec<(String, String)>,
    /// Where its logs go.
    pub logs: Logs,
}

impl NodeSpec {
    /// A gateway on `listen` over `data_dir`, verifying with `keys`.
    pub fn gateway(listen: impl Into<String>, data_dir: PathBuf, keys: GatewayKeys) -> Self {
        Self {
            role: Role::Gateway {
                keys,
                postgres: None,
            },
            listen: listen.into(),
            data_dir,
            args: Vec::new(),
            env: Vec::new(),
            logs: Logs::Discard,
        }
    }

    /// A gateway on `listen` keeping objects in the PostgreSQL at `url`
    /// (`--postgres`); `data_dir` only names it in messages.
    pub fn gateway_on_postgres(
        listen: impl Into<String>,
        url: impl Into<String>,
        keys: GatewayKeys,
    ) -> Self {
        let mut spec = Self::gateway(listen, PathBuf::new(), keys);
        spec.role = match spec.role {
            Role::Gateway { keys, .. } => Role::Gateway {
                keys,
                postgres: Some(url.into()),
            },
            other => other,
        };
        spec
    }

    /// A short name for messages and log files: `election-<id>` or `gateway`.
    pub fn name(&self) -> String {
        match &self.role {
            Role::Election { id, .. } => format!("election-{id}"),
            Role::Gateway { .. } => "gateway".to_owned(),
        }
    }

    /// The node's command line after the binary: the one place where the
    /// flags every spawned node needs are built.
    pub fn command_line(&self) -> Vec<OsString> {
        let mut line = CommandLine::default();
        match &self.role {
            Role::Election {
                id,
                peers,
                source_ip,
                peer_auth,
            } => {
                line.word("election");
                line.flag("--id", id.to_string());
                line.flag("--listen", &self.listen);
                line.flag("--data-dir", &self.data_dir);
                if let Some(ip) = source_ip {
                    line.flag("--source-ip", ip);
                }
                let peers: Vec<String> = peers
                    .iter()
                    .map(|(id, addr)| format!("{id}={addr}"))
                    .collect();
                line.flag("--peers", peers.join(","));
                match peer_auth {
                    PeerAuth::Certs(dir) => line.flag("--certs", dir),
                    PeerAuth::Insecure => line.word("--insecure-peers"),
                }
            }
            Role::Gateway { keys, postgres } => {
                line.word("gateway");
                line.flag("--listen", &self.listen);
                match postgres {
                    Some(url) => line.flag("--postgres", url),
                    None => line.flag("--data-dir", &self.data_dir),
                }
                match keys {
                    GatewayKeys::Election(urls) => line.flag("--election", urls.join(",")),
                    GatewayKeys::PublicKey(path) => line.flag("--public-key", path),
                }
            }
        }
        for arg in &self.args {
            line.word(arg);
        }
        line.0
    }
}

/// A command line being built.
#[derive(Default)]
struct CommandLine(Vec<OsString>);

impl CommandLine {
    fn word(&mut self, word: impl AsRef<OsStr>) {
        self.0.push(word.as_ref().to_owned());
    }

    fn flag(&mut self, name: &str, value: impl AsRef<OsStr>) {
        self.word(name);
        self.word(value);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::spec::{GatewayKeys, Logs, NodeSpec, PeerAuth, Role};

    fn text(spec: &NodeSpec) -> Vec<String> {
        spec.command_line()
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn an_election_node_gets_its_id_address_and_peers() {
        let spec = NodeSpec {
            role: Role::Election {
                id: 2,
                peers: BTreeMap::from([(1, "127.0.0.1:7101".into()), (2, "127.0.0.1:7102".into())]),
                source_ip: Some("127.0.0.1".into()),
                peer_auth: PeerAuth::Certs("/d/certs".into()),
            },
            listen: "127.0.0.1:7002".into(),
            data_dir: "/d/election-2".into(),
            args: vec!["--heartbeat-ms".into(), "20".into()],
            env: Vec::new(),
            logs: Logs::Discard,
        };
        assert_eq!(
            text(&spec),
            [
                "election",
                "--id",
                "2",
                "--listen",
                "127.0.0.1:7002",
                "--data-dir",
                "/d/election-2",
                "--source-ip",
                "127.0.0.1",
                "--peers",
                "1=127.0.0.1:7101,2=127.0.0.1:7102",
                "--certs",
                "/d/certs",
                "--heartbeat-ms",
                "20"
            ]
        );
        assert_eq!(spec.name(), "election-2");
    }

    #[test]
    fn a_gateway_names_its_key_source() {
        let spec = NodeSpec::gateway(
            "127.0.0.1:0",
            "/d/gateway".into(),
            GatewayKeys::Election(vec!["http://a".into(), "http://b".into()]),
        );
        assert_eq!(
            text(&spec),
            [
                "gateway",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                "/d/gateway",
                "--election",
                "http://a,http://b"
            ]
        );
        let spec = NodeSpec::gateway(
            "127.0.0.1:0",
            "/d/gateway".into(),
            GatewayKeys::PublicKey("/k.pem".into()),
        );
        assert_eq!(text(&spec)[5..], ["--public-key", "/k.pem"]);
    }
}
