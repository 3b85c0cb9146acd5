//! `palisade cluster status|rotate-key|add|remove`, on the SDK.

use crate::output::{complain, say};
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use palisade_client::{Client, Error};

use super::endpoints::Endpoints;
use super::lease_view::{fail, print};

/// `palisade cluster status|rotate-key|add|remove`.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Every node's role, term, applied index and lag, as a table (each
    /// endpoint asked for its own view).
    Status {
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Sign new tokens with a new key; the old one stays published until
    /// every token it signed has expired, then the leader retires it.
    RotateKey {
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Add node ID (peer address PEER_ADDR) as a learner, and make it a
    /// voter once it has caught up. Start the node first (same --peers, its
    /// certificate, an empty data dir).
    Add {
        id: u64,
        peer_addr: String,
        /// How long the node may take to catch up as a learner; if it does
        /// not (unreachable, a typo), it is removed again and the voters
        /// stay as they were.
        #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
        wait_ms: u64,
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Remove node ID from the membership (never the last voter).
    Remove {
        id: u64,
        #[command(flatten)]
        endpoints: Endpoints,
    },
}

pub async fn run(command: ClusterCommand) -> anyhow::Result<ExitCode> {
    let endpoints = match command {
        ClusterCommand::Status { endpoints } => endpoints,
        ClusterCommand::Add {
            id,
            peer_addr,
            wait_ms,
            endpoints,
        } => {
            let wait = std::time::Duration::from_millis(wait_ms);
            let client = endpoints.client()?;
            return Ok(match client.add_member_within(id, &peer_addr, wait).await {
                Ok(answer) => {
                    let readable = format!("node {id} ({peer_addr}) is a voter");
                    print(endpoints.json, &answer, readable);
                    ExitCode::SUCCESS
                }
                Err(err) => fail(&err),
            });
        }
        ClusterCommand::Remove { id, endpoints } => {
            return Ok(match endpoints.client()?.remove_member(id).await {
                Ok(answer) => {
                    print(endpoints.json, &answer, format!("node {id} removed"));
                    ExitCode::SUCCESS
                }
                Err(err) => fail(&err),
            })
        }
        ClusterCommand::RotateKey { endpoints } => {
            return Ok(match endpoints.client()?.rotate_key().await {
                Ok(kid) => {
                    print(
                        endpoints.json,
                        &serde_json::json!({ "kid": kid }),
                        format!("new signing key {kid}"),
                    );
                    ExitCode::SUCCESS
                }
                Err(err) => fail(&err),
            })
        }
    };
    status(&endpoints).await
}

/// `palisade cluster status`: every endpoint's own view, as a table (node,
/// role, term, applied index, lag behind the highest commit index seen,
/// client and peer address); `--json` prints the first answering node's
/// whole document with every node's under `"nodes"`.
async fn status(endpoints: &Endpoints) -> anyhow::Result<ExitCode> {
    let views = ask_every_node(endpoints).await?;
    let answered: Vec<&serde_json::Value> =
        views.iter().filter_map(|(_, v)| v.as_ref().ok()).collect();
    let Some(first) = answered.first() else {
        return Ok(match views.into_iter().find_map(|(_, v)| v.err()) {
            Some(err) => fail(&err),
            None => {
                complain!("error: no election endpoints given");
                ExitCode::from(2)
            }
        });
    };
    if endpoints.json {
        let mut document = (*first).clone();
        document["nodes"] = views
            .iter()
            .map(|(url, view)| match view {
                Ok(view) => view.clone(),
                Err(err) => serde_json::json!({ "url": url, "error": err.to_string() }),
            })
            .collect();
        say!("{document}");
        return Ok(health(&views));
    }
    let commit = answered
        .iter()
        .filter_map(|v| v["commit_index"].as_u64())
        .max()
        .unwrap_or(0);
    print_nodes(&views, commit);
    let leader = answered
        .iter()
        .find_map(|v| v["leader"].as_u64())
        .map_or_else(|| "none".to_owned(), |id| format!("node {id}"));
    say!("leader: {leader}; commit index {commit}");
    print_partitions(&answered);
    if let Some(view) = answered.iter().find(|v| v["leading"] == true) {
        print_members(view);
    }
    Ok(health(&views))
}

/// One row per endpoint, from its own view: node, role, term, applied
/// index, lag behind `commit` (the highest commit index seen), client and
/// peer address; an endpoint that did not answer says why.
fn print_nodes(views: &[(String, Result<serde_json::Value, Error>)], commit: u64) {
    say!(
        "{:<5} {:<11} {:>6} {:>10} {:>6}  {:<28} PEER",
        "NODE",
        "ROLE",
        "TERM",
        "APPLIED",
        "LAG",
        "CLIENT"
    );
    for (url, view) in views {
        match view {
            Ok(view) => {
                let id = view["node_id"].as_u64().unwrap_or(0);
                let applied = view["applied_index"].as_u64().unwrap_or(0);
                let peer = view["members"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|m| m["id"].as_u64() == Some(id))
                    .and_then(|m| m["addr"].as_str())
                    .unwrap_or("-");
                // A node whose Raft state says Leader but that no quorum
                // acknowledges does not act as one.
                let role = match (view["state"].as_str(), view["leading"].as_bool()) {
                    (Some("Leader"), Some(false)) => "Leader?",
                    (state, _) => state.unwrap_or("?"),
                };
                say!(
                    "{:<5} {:<11} {:>6} {:>10} {:>6}  {:<28} {peer}",
                    id,
                    role,
                    view["term"].as_u64().unwrap_or(0),
                    applied,
                    commit.saturating_sub(applied),
                    url,
                );
            }
            Err(err) => say!("{:<5} {:<11} {url}: {err}", "-", "unreachable"),
        }
    }
}

/// Exit 0 only for a healthy cluster: every endpoint answered, a leader
/// acts for every partition, no node names a setting its peers disagree
/// on. Otherwise each problem on stderr (`Leader?` in the table: a node in
/// Raft's Leader state that no quorum acknowledges) and exit 9
/// (unavailable), as `etcdctl endpoint health` fails with a member down or
/// no quorum.
fn health(views: &[(String, Result<serde_json::Value, Error>)]) -> ExitCode {
    let mut problems = Vec::new();
    let answered: Vec<&serde_json::Value> =
        views.iter().filter_map(|(_, v)| v.as_ref().ok()).collect();
    for (url, view) in views {
        if let Err(err) = view {
            problems.push(format!("{url} did not answer: {err}"));
        }
    }
    let partitions = answered
        .iter()
        .filter_map(|v| v["partitions"].as_array().map(Vec::len))
        .max()
        .unwrap_or(1);
    for k in 0..partitions {
        let led = answered.iter().any(|v| {
            let partition = &v["partitions"][k];
            match partition.is_null() {
                true => k == 0 && v["leader"].is_u64(),
                false => partition["leader"].is_u64(),
            }
        });
        if !led {
            problems.push(match partitions {
                1 => "no node knows a leader acting with a quorum".to_owned(),
                _ => format!("partition {k}: no node knows a leader acting with a quorum"),
            });
        }
    }
    for view in &answered {
        for differs in view["settings"]["disagreements"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let id = view["node_id"].as_u64().unwrap_or(0);
            problems.push(format!("node {id}: {}", differs.as_str().unwrap_or("?")));
        }
    }
    if problems.is_empty() {
        return ExitCode::SUCCESS;
    }
    for problem in &problems {
        complain!("unhealthy: {problem}");
    }
    ExitCode::from(crate::exit::UNAVAILABLE)
}

/// With more than one partition: each partition's leader and term, as the
/// answering node that knows the highest term for it saw them, and how
/// many partitions each node leads.
fn print_partitions(answered: &[&serde_json::Value]) {
    let count = answered
        .iter()
        .filter_map(|v| v["partitions"].as_array().map(Vec::len))
        .max()
        .unwrap_or(1);
    if count <= 1 {
        return;
    }
    say!("{count} partitions:");
    say!(
        "  {:<9} {:<8} {:>6} {:>10}",
        "PARTITION",
        "LEADER",
        "TERM",
        "COMMIT"
    );
    for k in 0..count {
        let newest = answered
            .iter()
            .map(|v| &v["partitions"][k])
            .max_by_key(|p| p["term"].as_u64().unwrap_or(0));
        let Some(partition) = newest else { continue };
        let leader = partition["leader"]
            .as_u64()
            .map_or_else(|| "none".to_owned(), |id| format!("node {id}"));
        say!(
            "  {:<9} {:<8} {:>6} {:>10}",
            k,
            leader,
            partition["term"].as_u64().unwrap_or(0),
            partition["commit_index"].as_u64().unwrap_or(0),
        );
    }
}

/// How long `cluster status` waits for one node: nodes are asked all at
/// once, so an unreachable one costs this once, not once per node.
const NODE_TIMEOUT: Duration = Duration::from_secs(2);

/// Every endpoint's own `/v1/cluster`, asked concurrently, each once
/// within [`NODE_TIMEOUT`] (no retries: a node that does not answer is
/// shown unreachable), in the order given.
async fn ask_every_node(
    endpoints: &Endpoints,
) -> anyhow::Result<Vec<(String, Result<serde_json::Value, Error>)>> {
    let mut asks = Vec::new();
    for url in &endpoints.election {
        let mut config = Endpoints {
            election: vec![url.clone()],
            ..endpoints.clone()
        }
        .config()?;
        config.request_timeout = NODE_TIMEOUT;
        config.retry_budget = Duration::ZERO;
        let client = Client::new(config);
        asks.push(tokio::spawn(async move {
            let asked = tokio::time::timeout(NODE_TIMEOUT * 2, client.cluster()).await;
            asked.unwrap_or_else(|_| {
                Err(Error::Unavailable {
                    attempts: 1,
                    elapsed: NODE_TIMEOUT * 2,
                    last: "no answer".into(),
                })
            })
        }));
    }
    let mut views = Vec::new();
    for (url, ask) in endpoints.election.iter().zip(asks) {
        views.push((url.clone(), ask.await?));
    }
    Ok(views)
}

/// The membership as the acting leader `view` sees it: voters and
/// learners, whether each acknowledged a heartbeat in the last second, and
/// how far behind the leader's log it is.
fn print_members(view: &serde_json::Value) {
    let last = view["last_log_index"].as_u64().unwrap_or(0);
    say!(
        "\n{:<5} {:<8} {:<12} {:>8}  PEER",
        "NODE",
        "KIND",
        "REACHABLE",
        "LAG"
    );
    let replication = view["replication"].as_array().cloned().unwrap_or_default();
    for member in view["members"].as_array().into_iter().flatten() {
        let progress = replication
            .iter()
            .find(|r| r["id"] == member["id"])
            .cloned()
            .unwrap_or_default();
        let kind = if member["voter"] == true {
            "voter"
        } else {
            "learner"
        };
        let reachable = match progress["last_ack_ms"].as_u64() {
            Some(ms) if ms < 1_000 => "yes".to_owned(),
            Some(ms) => format!("no ({} s)", ms / 1_000),
            None if member["id"] == view["node_id"] => "leader".to_owned(),
            None => "never".to_owned(),
        };
        let lag = match progress["matched_index"].as_u64() {
            Some(matched) => last.saturating_sub(matched).to_string(),
            None if member["id"] == view["node_id"] => "0".to_owned(),
            None => "all".to_owned(),
        };
        say!(
            "{:<5} {:<8} {:<12} {:>8}  {}",
            member["id"].as_u64().unwrap_or(0),
            kind,
            reachable,
            lag,
            member["addr"].as_str().unwrap_or("-")
        );
    }
}
