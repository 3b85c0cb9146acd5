//! S1, S2 and S4 against power loss: every election node and the gateway
//! keep their data dir on a mount of `palisade-lazyfs` (lazyfs/), which
//! holds what was written but not fsynced in memory, as a page cache does,
//! and throws it away on a cut. kill -9 alone never tests this: the kernel
//! still writes what a killed process left in its cache.
//!
//! Under load (grants, renewals and releases over the election API with
//! real HTTP; fenced PUTs with the grants' JWTs; "keeper" grants of fresh
//! leases, never released), at seeded moments the processes on one or
//! more mounts are SIGKILLed and reaped, the mounts' power is cut (every
//! unsynced write lost, or the last one of one file torn to a prefix), and
//! the processes start again on the same mounts. The cuts: the gateway;
//! one election node (the leader or a follower); all three election nodes
//! at once; everything at once. After the run:
//! - S4 grants: every acknowledged keeper grant is still held by its
//!   holder with its token; a new grant of each contended lease has a
//!   token above every acknowledged one;
//! - S2: no token was acknowledged to two grants; a grant asked for after
//!   another was acknowledged has a higher token;
//! - S4 writes: every key ends with its last acknowledged write or one
//!   not finished before that write started (acknowledged or of unknown
//!   outcome), never an older one, never a refused one; a key written once
//!   per grant is never missing;
//! - S1: the gateway never acknowledged a write whose token is below one it
//!   acknowledged earlier (after every gateway cut a write with an old,
//!   still-valid JWT is sent: it must be refused), and each fence ends at
//!   least at the highest acknowledged token;
//! - restarted nodes rejoin: each catches up with the leader's applied
//!   index, and the cluster elects a leader after a full cut.
//!
//! `PALISADE_POWER_SECS` (default 30) of load and cuts, every kind at least
//! once; `PALISADE_POWER_SEED=N` replays the schedule (which cuts, when,
//! lose or tear, which file is torn; the interleaving of real processes
//! stays free); `PALISADE_POWER_MODES=lose` (or `tear`) makes every cut
//! one kind (default: either, by the seed), and `none` makes every cut a
//! plain kill -9 (nothing lost: the control run, which must pass). Needs root and /dev/fuse (skipped otherwise, unless
//! `PALISADE_FAULT_STRICT=1`). A violation fails the test and keeps the
//! histories and the node logs in `target/tmp/power-histories/<seed>/`.

#[path = "support/lazyfs.rs"]
mod lazyfs;
use crate::support;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lazyfs::{can_mount, lazyfs_binary, LazyMount};
use palisade_local_cluster::{Logs, NodeSpec};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};
use support::{free_ports, gateway_for, node_setup, spawn_node, test_secret, Cluster, Process};

/// The contended leases' ttl.
const TTL_MS: u64 = 3000;
/// Leases the grantors contend for.
const LEASES: [&str; 4] = ["p0", "p1", "p2", "p3"];
/// Concurrent grantors.
const GRANTORS: usize = 3;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The binary under test.
fn support_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_palisade"))
}

/// The processes and their mounts. Fields drop in order: processes first,
/// then the mounts under them.
struct Rig {
    gateway: Option<Process>,
    cluster: Cluster,
    gateway_spec: NodeSpec,
    /// election-1, election-2, election-3, gateway.
    mounts: Vec<LazyMount>,
    logs: PathBuf,
    starts: HashMap<String, u32>,
}

const GATEWAY: usize = 3;

impl Rig {
    fn start(dir: &Path, binary: &Path, seed: u64) -> Self {
        let names = ["election-1", "election-2", "election-3", "gateway"];
        let mounts: Vec<LazyMount> = names
            .iter()
            .map(|name| LazyMount::start(binary, dir, name))
            .collect();
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs).expect("logs dir");
        let setups = (1..=3u64)
            .map(|id| {
                let mut setup = node_setup(dir, id, "127.0.0.1");
                setup.data_dir = mounts[id as usize - 1].mount.join("data");
                setup.logs = Logs::File(logs.join(format!("election-{id}.log")));
                setup.args = vec![
                    "--snapshot-every".into(),
                    "300".into(),
                    "--timing-seed".into(),
                    seed.to_string(),
                ];
                setup
            })
            .collect();
        let cluster = Cluster::start_with(dir, setups);
        let mut gateway_spec = gateway_for(&cluster, &mounts[GATEWAY].mount.join("data"));
        gateway_spec.listen = format!("127.0.0.1:{}", free_ports(1)[0]);
        // Old JWTs stay valid signatures: only the fence may refuse them.
        gateway_spec.args = vec!["--exp-leeway-secs".into(), "3600".into()];
        gateway_spec.logs = Logs::File(logs.join("gateway.log"));
        let gateway = Some(spawn_node(gateway_spec.clone()));
        Self {
            gateway,
            cluster,
            gateway_spec,
            mounts,
            logs,
            starts: HashMap::new(),
        }
    }

    /// Keeps the log of `name`'s previous run before it starts again.
    fn keep_log(&mut self, name: &str) {
        let count = self.starts.entry(name.to_owned()).or_insert(0);
        *count += 1;
        let _ = std::fs::rename(
            self.logs.join(format!("{name}.log")),
            self.logs.join(format!("{name}.{count}.log")),
        );
    }

    fn gateway_url(&self) -> String {
        format!("http://{}", self.gateway_spec.listen)
    }
}

/// The test's clock: ms since the start.
#[derive(Debug, Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn ms(&self) -> u64 {
        self.0.elapsed().as_millis() as u64
    }
}

#[derive(Debug, Clone, Serialize)]
struct GrantRec {
    lease: String,
    holder: String,
    token: u64,
    invoke_ms: u64,
    ack_ms: u64,
    keeper: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
enum Outcome {
    /// In flight, or its answer was lost: it may or may not have happened.
    Unknown,
    /// 200, with the version.
    Acked(u64),
    /// An answer that changed nothing (409, 401, ...).
    Refused(u16),
    /// Never reached the gateway (connection refused).
    NotSent,
}

#[derive(Debug, Clone, Serialize)]
struct WriteRec {
    key: String,
    lease: String,
    value: String,
    token: u64,
    invoke_ms: u64,
    /// When the answer came (`None` while unknown).
    complete_ms: Option<u64>,
    outcome: Outcome,
}

#[derive(Debug, Clone, Serialize)]
struct FaultRec {
    number: usize,
    kind: String,
    mode: String,
    start_ms: u64,
    end_ms: u64,
    /// lazyfs's answer per mount cut.
    cuts: Vec<String>,
    /// ms until the restarted node(s) caught up or a leader was back.
    recovery_ms: Option<u64>,
}

/// What the load tasks share.
struct Shared {
    clock: Clock,
    client: reqwest::Client,
    urls: Vec<String>,
    gateway: String,
    grants: Mutex<Vec<GrantRec>>,
    writes: Mutex<Vec<WriteRec>>,
    /// Every grant's JWT by token (for the stale-write probe).
    jwts: Mutex<BTreeMap<u64, (String, String)>>,
    stop: AtomicBool,
}

/// An election call's result.
enum Sent {
    Answer(u16, Value),
    /// No node took the connection.
    NoConnection,
    /// Sent, answer lost.
    Unknown,
}

impl Shared {
    /// POSTs to a node (a random one first; the next on a refused
    /// connection).
    async fn post(&self, path: &str, body: &Value, rng: &mut StdRng) -> Sent {
        let first = rng.gen_range(0..self.urls.len());
        for i in 0..self.urls.len() {
            let url = &self.urls[(first + i) % self.urls.len()];
            match self
                .client
                .post(format!("{url}{path}"))
                .json(body)
                .send()
                .await
            {
                Ok(response) => {
                    let status = response.status().as_u16();
                    return match response.json::<Value>().await {
                        Ok(body) => Sent::Answer(status, body),
                        Err(_) if status == 200 => Sent::Unknown,
                        Err(_) => Sent::Answer(status, Value::Null),
                    };
                }
                Err(err) if err.is_connect() => continue,
                Err(_) => return Sent::Unknown,
            }
        }
        Sent::NoConnection
    }

    /// A fenced PUT, recorded from its invocation on.
    async fn put(&self, key: &str, lease: &str, token: u64, jwt: &str, value: String) -> Outcome {
        let index = {
            let mut writes = self.writes.lock().expect("writes");
            writes.push(WriteRec {
                key: key.to_owned(),
                lease: lease.to_owned(),
                value: value.clone(),
                token,
                invoke_ms: self.clock.ms(),
                complete_ms: None,
                outcome: Outcome::Unknown,
            });
            writes.len() - 1
        };
        let response = self
            .client
            .put(format!("{}/v1/objects/{key}", self.gateway))
            .bearer_auth(jwt)
            .body(value)
            .send()
            .await;
        let outcome = match response {
            Ok(r) if r.status() == 200 => match r.json::<Value>().await {
                Ok(answer) => Outcome::Acked(answer["version"].as_u64().unwrap_or(0)),
                Err(_) => Outcome::Unknown,
            },
            Ok(r) if r.status().is_server_error() => Outcome::Unknown,
            Ok(r) => Outcome::Refused(r.status().as_u16()),
            Err(err) if err.is_connect() => Outcome::NotSent,
            Err(_) => Outcome::Unknown,
        };
        let mut writes = self.writes.lock().expect("writes");
        if outcome != Outcome::Unknown {
            writes[index].complete_ms = Some(self.clock.ms());
        }
        writes[index].outcome = outcome;
        outcome
    }

    fn record_grant(&self, grant: GrantRec, jwt: &str) {
        self.jwts
            .lock()
            .expect("jwts")
            .insert(grant.token, (grant.lease.clone(), jwt.to_owned()));
        self.grants.lock().expect("grants").push(grant);
    }
}

/// What an acquire answered, when it granted.
struct Granted {
    token: u64,
    jwt: String,
    grant_index: Option<u64>,
}

async fn acquire(
    sh: &Shared,
    lease: &str,
    holder: &str,
    ttl_ms: u64,
    keeper: bool,
    rng: &mut StdRng,
) -> Option<Granted> {
    let invoke_ms = sh.clock.ms();
    let body = json!({"holder": holder, "ttl_ms": ttl_ms, "secret": test_secret(holder)});
    let Sent::Answer(200, grant) = sh
        .post(&format!("/v1/leases/{lease}/acquire"), &body, rng)
        .await
    else {
        return None;
    };
    let token = grant["token"].as_u64()?;
    let jwt = grant["jwt"].as_str()?.to_owned();
    sh.record_grant(
        GrantRec {
            lease: lease.to_owned(),
            holder: holder.to_owned(),
            token,
            invoke_ms,
            ack_ms: sh.clock.ms(),
            keeper,
        },
        &jwt,
    );
    Some(Granted {
        token,
        jwt,
        grant_index: grant["grant_index"].as_u64(),
    })
}

/// Takes a contended lease, writes with its JWT (a key of its own, then
/// shared keys), renews once, releases; over and over.
async fn grantor(sh: Arc<Shared>, task: usize, mut rng: StdRng) {
    let mut n = 0u64;
    while !sh.stop.load(Ordering::SeqCst) {
        n += 1;
        let lease = LEASES[rng.gen_range(0..LEASES.len())];
        let holder = format!("g{task}-{n}");
        let Some(grant) = acquire(&sh, lease, &holder, TTL_MS, false, &mut rng).await else {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(10..60))).await;
            continue;
        };
        let secret = test_secret(&holder);
        let mut keys = vec![format!("{lease}/once/{holder}")];
        keys.extend((0..3).map(|_| format!("{lease}/k{}", rng.gen_range(0..2))));
        for (j, key) in keys.iter().enumerate() {
            if j == 2 {
                let body = json!({"holder": holder, "token": grant.token, "secret": secret});
                if let Sent::Answer(409, _) = sh
                    .post(&format!("/v1/leases/{lease}/renew"), &body, &mut rng)
                    .await
                {
                    break;
                }
            }
            let value = format!("{holder}:{}:{j}", grant.token);
            match sh.put(key, lease, grant.token, &grant.jwt, value).await {
                Outcome::Acked(_) | Outcome::Refused(_) => {}
                Outcome::Unknown | Outcome::NotSent => break,
            }
        }
        let mut body = json!({"holder": holder, "token": grant.token, "secret": secret});
        if let Some(index) = grant.grant_index {
            body["grant_index"] = json!(index);
        }
        let _ = sh
            .post(&format!("/v1/leases/{lease}/release"), &body, &mut rng)
            .await;
    }
}

/// Grants a fresh lease every 250 ms for an hour, never released, and
/// writes one object under it: every other one 160 KiB, which sled keeps
/// in a blob file of its own (above ~128 KiB), not in its log.
async fn keeper(sh: Arc<Shared>, mut rng: StdRng) {
    let mut n = 0u64;
    while !sh.stop.load(Ordering::SeqCst) {
        n += 1;
        let lease = format!("keep-{n}");
        if let Some(grant) = acquire(&sh, &lease, "keeper", 3_600_000, true, &mut rng).await {
            let pad = if n % 2 == 0 { 160 * 1024 } else { 0 };
            let value = format!("keeper:{}:{}", grant.token, "x".repeat(pad));
            sh.put(
                &format!("{lease}/v"),
                &lease,
                grant.token,
                &grant.jwt,
                value,
            )
            .await;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gateway,
    OneNode,
    AllNodes,
    Everything,
}

const KINDS: [Kind; 4] = [
    Kind::Gateway,
    Kind::OneNode,
    Kind::AllNodes,
    Kind::Everything,
];

/// The node that leads, if one does within `polls` × 50 ms.
async fn leader(rig: &Rig, client: &reqwest::Client, polls: u32) -> Option<u64> {
    rig.cluster.granting_leader(client, polls).await
}

async fn applied_index(client: &reqwest::Client, url: &str) -> Option<u64> {
    let answer = client.get(format!("{url}/v1/cluster")).send().await.ok()?;
    answer.json::<Value>().await.ok()?["applied_index"].as_u64()
}

/// Waits until node `id` has applied what the leader had; the time it took.
async fn catch_up(rig: &Rig, client: &reqwest::Client, id: u64, limit: Duration) -> Option<u64> {
    let started = Instant::now();
    let leader = leader(rig, client, 600).await?;
    let target = applied_index(client, &rig.cluster.url(leader)).await?;
    while started.elapsed() < limit {
        if applied_index(client, &rig.cluster.url(id))
            .await
            .is_some_and(|index| index >= target)
        {
            return Some(started.elapsed().as_millis() as u64);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// One cut: kill the processes on the mounts, cut them, start again.
async fn cut(
    rig: &mut Rig,
    sh: &Shared,
    kind: Kind,
    mode: &str,
    rng: &mut StdRng,
    number: usize,
    violations: &mut Vec<String>,
) -> FaultRec {
    let client = &sh.client;
    let start_ms = sh.clock.ms();
    let (nodes, gateway): (Vec<u64>, bool) = match kind {
        Kind::Gateway => (vec![], true),
        Kind::OneNode => {
            // The leader half the time, else a random node.
            let current = leader(rig, client, 20).await;
            let id = match current {
                Some(id) if rng.gen_bool(0.5) => id,
                _ => rng.gen_range(1..=3),
            };
            (vec![id], false)
        }
        Kind::AllNodes => (vec![1, 2, 3], false),
        Kind::Everything => (vec![1, 2, 3], true),
    };
    let mut cuts = Vec::new();
    tokio::task::block_in_place(|| {
        if gateway {
            if let Some(mut g) = rig.gateway.take() {
                g.kill();
            }
        }
        for &id in &nodes {
            rig.cluster.kill(id);
        }
        // Mode "none": kill -9 only (the control run: the kernel's cache,
        // here lazyfs's, keeps what the processes wrote).
        // A tear picks its file and cut point from the seed and the mount:
        // mounts cut together do not tear alike.
        let command = |mount: usize| match mode.strip_prefix("tear ") {
            Some(seed) => format!(
                "cut tear {}",
                seed.parse::<u64>().unwrap_or(0).wrapping_add(mount as u64)
            ),
            None if mode == "none" => "stats".to_owned(),
            None => format!("cut {mode}"),
        };
        if gateway {
            cuts.push(format!(
                "gateway: {}",
                rig.mounts[GATEWAY].control(&command(GATEWAY))
            ));
        }
        for &id in &nodes {
            let mount = &rig.mounts[id as usize - 1];
            cuts.push(format!(
                "{}: {}",
                mount.name,
                mount.control(&command(id as usize - 1))
            ));
        }
        for &id in &nodes {
            rig.keep_log(&format!("election-{id}"));
            if let Err(err) = rig.cluster.start_node(id) {
                violations.push(format!(
                    "restart: election-{id} did not start again after cut #{number}: {err} (its log: election-{id}.log)"
                ));
            }
        }
        if gateway {
            rig.keep_log("gateway");
            match palisade_local_cluster::Node::start(&support_binary(), rig.gateway_spec.clone())
                .and_then(|mut node| node.wait_listening(Duration::from_secs(30)).map(|url| (node, url)))
            {
                Ok((node, url)) => rig.gateway = Some(Process { node, url }),
                Err(err) => violations.push(format!(
                    "restart: the gateway did not start again after cut #{number}: {err} (its log: gateway.log)"
                )),
            }
        }
    });
    let mut recovery_ms = None;
    if violations.iter().any(|v| v.starts_with("restart:")) {
        // Nothing to wait for: the run stops here.
    } else if nodes.len() == 1 {
        recovery_ms = catch_up(rig, client, nodes[0], Duration::from_secs(60)).await;
        if recovery_ms.is_none() {
            violations.push(format!(
                "rejoin: election-{} did not catch up with the leader within 60 s after cut #{number}{}",
                nodes[0],
                panics(&rig.logs)
            ));
        }
    } else if nodes.len() == 3 {
        let back = Instant::now();
        if leader(rig, client, 600).await.is_some() {
            recovery_ms = Some(back.elapsed().as_millis() as u64);
        } else {
            violations.push(format!(
                "no leader within 30 s after the full cut #{number}"
            ));
        }
    }
    if gateway {
        probe_fences(sh, number, violations).await;
    }
    FaultRec {
        number,
        kind: format!(
            "{kind:?}{}",
            if nodes.len() == 1 {
                format!(" election-{}", nodes[0])
            } else {
                String::new()
            }
        ),
        mode: mode.to_owned(),
        start_ms,
        end_ms: sh.clock.ms(),
        cuts,
        recovery_ms,
    }
}

/// The panics in the nodes' current logs, for the evidence.
fn panics(logs: &Path) -> String {
    let mut found = Vec::new();
    for name in ["election-1", "election-2", "election-3", "gateway"] {
        let Ok(text) = std::fs::read_to_string(logs.join(format!("{name}.log"))) else {
            continue;
        };
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.contains("panicked at") {
                let what = lines.next().unwrap_or_default();
                found.push(format!("{name} panicked: {what}"));
                break;
            }
        }
    }
    if found.is_empty() {
        String::new()
    } else {
        format!(" ({})", found.join("; "))
    }
}

/// After a gateway cut: each fence is at least the highest acknowledged
/// token of its lease, and a write with an older grant's JWT is refused.
async fn probe_fences(sh: &Shared, number: usize, violations: &mut Vec<String>) {
    let highest = highest_acked(&sh.writes.lock().expect("writes"));
    for (lease, top) in highest {
        let reported = format!("the fence of {lease} is");
        let already = violations
            .iter()
            .any(|v| v.contains(&reported) && v.ends_with(&format!(" {top}")));
        if let Some(fence) = fence(sh, &lease).await.filter(|_| !already) {
            if fence < top {
                violations.push(format!(
                    "S1: after gateway cut #{number} the fence of {lease} is {fence}, below the acknowledged token {top}"
                ));
            }
        }
        let stale = sh
            .jwts
            .lock()
            .expect("jwts")
            .range(..top)
            .rev()
            .find(|(_, (l, _))| *l == lease)
            .map(|(&token, (_, jwt))| (token, jwt.clone()));
        if let Some((token, jwt)) = stale {
            let key = format!("{lease}/stale");
            let value = format!("stale:{token}:{number}");
            if let Outcome::Acked(_) = sh.put(&key, &lease, token, &jwt, value).await {
                violations.push(format!(
                    "S1: after gateway cut #{number} a write with token {token} on {lease} was accepted, below the acknowledged {top}"
                ));
            }
        }
    }
}

/// Per lease, the highest token of an acknowledged write.
fn highest_acked(writes: &[WriteRec]) -> BTreeMap<String, u64> {
    let mut highest = BTreeMap::new();
    for w in writes
        .iter()
        .filter(|w| matches!(w.outcome, Outcome::Acked(_)))
    {
        let entry = highest.entry(w.lease.clone()).or_insert(0);
        *entry = w.token.max(*entry);
    }
    highest
}

async fn fence(sh: &Shared, lease: &str) -> Option<u64> {
    let answer = sh
        .client
        .get(format!("{}/v1/fences/{lease}", sh.gateway))
        .send()
        .await
        .ok()?;
    answer.json::<Value>().await.ok()?["fence"].as_u64()
}

/// The first cut after `ms` that touched the gateway (or the election
/// nodes), for the evidence.
fn cut_after(faults: &[FaultRec], ms: u64, gateway: bool) -> String {
    faults
        .iter()
        .find(|f| {
            f.start_ms >= ms
                && if gateway {
                    f.kind.starts_with("Gateway") || f.kind.starts_with("Everything")
                } else {
                    !f.kind.starts_with("Gateway")
                }
        })
        .map_or_else(
            || "no cut after it".to_owned(),
            |f| {
                format!(
                    "next cut #{} {} at {} ms ({}): {}",
                    f.number,
                    f.kind,
                    f.start_ms,
                    f.mode,
                    f.cuts.join("; ")
                )
            },
        )
}

/// S2 over the acknowledged grants.
fn check_tokens(grants: &[GrantRec], violations: &mut Vec<String>) {
    let mut by_token: BTreeMap<u64, &GrantRec> = BTreeMap::new();
    for g in grants {
        match by_token.get(&g.token) {
            Some(first) if first.lease != g.lease || first.holder != g.holder => {
                violations.push(format!(
                    "S2: token {} acknowledged twice: {} to {} (acked at {} ms) and {} to {} (acked at {} ms)",
                    g.token, first.lease, first.holder, first.ack_ms, g.lease, g.holder, g.ack_ms
                ));
            }
            Some(_) => {}
            None => {
                by_token.insert(g.token, g);
            }
        }
    }
    let mut by_lease: BTreeMap<&str, Vec<&GrantRec>> = BTreeMap::new();
    for g in grants {
        by_lease.entry(&g.lease).or_default().push(g);
    }
    for (lease, list) in by_lease {
        for earlier in &list {
            for later in &list {
                if later.invoke_ms > earlier.ack_ms && later.token <= earlier.token {
                    violations.push(format!(
                        "S2: {lease} granted token {} to {} (asked at {} ms) after token {} to {} was acknowledged at {} ms",
                        later.token, later.holder, later.invoke_ms, earlier.token, earlier.holder, earlier.ack_ms
                    ));
                }
            }
        }
    }
}

/// S1 in acknowledgement order: no write acknowledged with a token below
/// one acknowledged before it was sent.
fn check_fence_order(writes: &[WriteRec], violations: &mut Vec<String>) {
    let acked: Vec<&WriteRec> = writes
        .iter()
        .filter(|w| matches!(w.outcome, Outcome::Acked(_)))
        .collect();
    let mut by_lease: BTreeMap<&str, Vec<&WriteRec>> = BTreeMap::new();
    for w in acked {
        by_lease.entry(&w.lease).or_default().push(w);
    }
    for (lease, list) in by_lease {
        let mut by_ack: Vec<(u64, u64)> = list
            .iter()
            .map(|w| (w.complete_ms.unwrap_or(u64::MAX), w.token))
            .collect();
        by_ack.sort_unstable();
        for w in &list {
            let before = by_ack
                .iter()
                .take_while(|(ack, _)| *ack < w.invoke_ms)
                .map(|(_, token)| *token)
                .max();
            if let Some(top) = before.filter(|top| w.token < *top) {
                violations.push(format!(
                    "S1: {lease}: write {} with token {} acknowledged (sent at {} ms) after token {top} was acknowledged",
                    w.key, w.token, w.invoke_ms
                ));
            }
        }
    }
}

/// S4 for the gateway: what each key holds at the end.
async fn check_objects(sh: &Shared, faults: &[FaultRec], violations: &mut Vec<String>) -> usize {
    let writes = sh.writes.lock().expect("writes").clone();
    let mut by_key: BTreeMap<&str, Vec<&WriteRec>> = BTreeMap::new();
    for w in &writes {
        by_key.entry(&w.key).or_default().push(w);
    }
    let mut checked = 0;
    for (key, list) in by_key {
        let last = list
            .iter()
            .filter(|w| matches!(w.outcome, Outcome::Acked(_)))
            .max_by_key(|w| w.complete_ms);
        let Ok(response) = sh
            .client
            .get(format!("{}/v1/objects/{key}", sh.gateway))
            .send()
            .await
        else {
            violations.push(format!("the gateway did not answer GET {key} at the end"));
            return checked;
        };
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        checked += 1;
        if status == 404 {
            if let Some(last) = last {
                violations.push(format!(
                    "S4: acknowledged write {key} = {:?} (token {}, acked at {} ms) is lost: the key is gone; {}",
                    last.value,
                    last.token,
                    last.complete_ms.unwrap_or(0),
                    cut_after(faults, last.complete_ms.unwrap_or(0), true)
                ));
            }
            continue;
        }
        if status != 200 {
            violations.push(format!(
                "the gateway answered GET {key} with {status} {body}"
            ));
            continue;
        }
        let Some(found) = list.iter().find(|w| w.value == body) else {
            violations.push(format!("S4: {key} holds {body:?}, which no write sent"));
            continue;
        };
        if matches!(found.outcome, Outcome::Refused(_) | Outcome::NotSent) {
            violations.push(format!(
                "S4: {key} holds {body:?} from a write answered {:?}",
                found.outcome
            ));
            continue;
        }
        if let Some(last) = last {
            let finished_before = found.complete_ms.is_some_and(|done| done < last.invoke_ms);
            if !std::ptr::eq(*found, *last) && finished_before {
                violations.push(format!(
                    "S4: acknowledged write {key} = {:?} (token {}, acked at {} ms) is lost: the key holds the older {:?} (acked at {} ms); {}",
                    last.value,
                    last.token,
                    last.complete_ms.unwrap_or(0),
                    found.value,
                    found.complete_ms.unwrap_or(0),
                    cut_after(faults, last.complete_ms.unwrap_or(0), true)
                ));
            }
        }
    }
    checked
}

/// GET of a lease, through any node (leader first), retrying 503s and
/// lost connections (a loaded machine can cost the cluster its leader for
/// a while) until `until`.
async fn get_lease(sh: &Shared, leader_url: &str, lease: &str, until: Instant) -> (u16, Value) {
    let mut urls = vec![leader_url.to_owned()];
    urls.extend(sh.urls.iter().cloned());
    let mut last = (0, Value::Null);
    for url in urls.iter().cycle() {
        if let Ok(response) = sh
            .client
            .get(format!("{url}/v1/leases/{lease}"))
            .send()
            .await
        {
            let status = response.status().as_u16();
            last = (status, response.json().await.unwrap_or(Value::Null));
            if status != 503 {
                return last;
            }
        }
        if Instant::now() > until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

/// S4 for grants: each keeper grant is still held, with its token; and a
/// new grant of each contended lease gets a token above every
/// acknowledged one.
async fn check_grants(
    sh: &Shared,
    leader_url: &str,
    faults: &[FaultRec],
    logs: &Path,
    violations: &mut Vec<String>,
) {
    let grants = sh.grants.lock().expect("grants").clone();
    // One budget for every read: a cluster that stays without a leader is
    // one violation, not one per lease.
    let until = Instant::now() + Duration::from_secs(60);
    for g in grants.iter().filter(|g| g.keeper) {
        let (status, view) = get_lease(sh, leader_url, &g.lease, until).await;
        if status == 503 || status == 0 {
            violations.push(format!(
                "L1: the cluster answered no read for 60 s at the end (last: {status} {view}){}",
                panics(logs)
            ));
            return;
        }
        if status != 200 || view["holder"] != "keeper" || view["token"].as_u64() != Some(g.token) {
            violations.push(format!(
                "S4: acknowledged grant of {} (token {}, acked at {} ms) is lost: GET answers {status} {view}; {}",
                g.lease,
                g.token,
                g.ack_ms,
                cut_after(faults, g.ack_ms, false)
            ));
        }
    }
    let mut rng = StdRng::seed_from_u64(0);
    for lease in LEASES {
        let top = grants
            .iter()
            .filter(|g| g.lease == lease)
            .map(|g| g.token)
            .max()
            .unwrap_or(0);
        let body = json!({"holder": "final", "ttl_ms": 60_000, "wait_ms": 4_000, "secret": test_secret("final")});
        let mut token = None;
        let mut last = String::new();
        for _ in 0..20 {
            if Instant::now() > until + Duration::from_secs(30) {
                break;
            }
            match sh
                .post(&format!("/v1/leases/{lease}/acquire"), &body, &mut rng)
                .await
            {
                Sent::Answer(200, grant) => {
                    token = grant["token"].as_u64();
                    break;
                }
                Sent::Answer(status, answer) => last = format!("{status} {answer}"),
                Sent::NoConnection => last = "no node took the connection".into(),
                Sent::Unknown => last = "no answer".into(),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        match token {
            Some(t) if t > top => {}
            Some(t) => violations.push(format!(
                "S2: a new grant of {lease} got token {t}, not above the acknowledged {top}"
            )),
            None => violations.push(format!(
                "L1: {lease} could not be granted at the end (last answer: {last})"
            )),
        }
    }
}

/// Keeps the histories, the fault log and the node logs.
fn keep_evidence(
    seed: u64,
    dir: &Path,
    sh: &Shared,
    faults: &[FaultRec],
    violations: &[String],
) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("power-histories")
        .join(seed.to_string());
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).expect("evidence dir");
    let lines = |items: Vec<String>| items.join("\n") + "\n";
    let grants = sh.grants.lock().expect("grants").clone();
    let writes = sh.writes.lock().expect("writes").clone();
    let json_lines = |v: Vec<Value>| lines(v.iter().map(Value::to_string).collect());
    let _ = std::fs::write(
        out.join("grants.jsonl"),
        json_lines(grants.iter().map(|g| json!(g)).collect()),
    );
    let _ = std::fs::write(
        out.join("writes.jsonl"),
        json_lines(writes.iter().map(|w| json!(w)).collect()),
    );
    let _ = std::fs::write(
        out.join("faults.jsonl"),
        json_lines(faults.iter().map(|f| json!(f)).collect()),
    );
    let _ = std::fs::write(out.join("violations.txt"), lines(violations.to_vec()));
    if let Ok(entries) = std::fs::read_dir(dir.join("logs")) {
        for entry in entries.flatten() {
            let _ = std::fs::copy(entry.path(), out.join(entry.file_name()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_grants_and_writes_survive_power_cuts() {
    let _alone = support::ALONE.lock().await;
    if !can_mount("the power-cut test") {
        return;
    }
    let seconds = env_u64("PALISADE_POWER_SECS").unwrap_or(30);
    let seed = env_u64("PALISADE_POWER_SEED").unwrap_or_else(rand::random);
    let modes = std::env::var("PALISADE_POWER_MODES").unwrap_or_else(|_| "lose,tear".into());
    eprintln!(
        "power cut: seed {seed}, {seconds} s, cuts {modes} (replay with PALISADE_POWER_SEED={seed})"
    );
    let binary = lazyfs_binary();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rig = tokio::task::block_in_place(|| Rig::start(dir.path(), &binary, seed));
    let client = support::http_client();
    assert!(
        leader(&rig, &client, 600).await.is_some(),
        "no granting leader at the start"
    );
    let sh = Arc::new(Shared {
        clock: Clock(Instant::now()),
        client: client.clone(),
        urls: rig.cluster.urls(),
        gateway: rig.gateway_url(),
        grants: Mutex::new(Vec::new()),
        writes: Mutex::new(Vec::new()),
        jwts: Mutex::new(BTreeMap::new()),
        stop: AtomicBool::new(false),
    });
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tasks = Vec::new();
    for task in 0..GRANTORS {
        let rng = StdRng::seed_from_u64(seed.wrapping_add(task as u64 + 1));
        tasks.push(tokio::spawn(grantor(sh.clone(), task, rng)));
    }
    tasks.push(tokio::spawn(keeper(
        sh.clone(),
        StdRng::seed_from_u64(seed.wrapping_add(100)),
    )));

    // Every kind once (in a seeded order), then at random.
    let mut schedule: Vec<Kind> = KINDS.to_vec();
    for i in (1..schedule.len()).rev() {
        schedule.swap(i, rng.gen_range(0..=i));
    }
    let mut faults = Vec::new();
    let mut violations = Vec::new();
    let deadline = Duration::from_secs(seconds);
    while faults.len() < KINDS.len() || sh.clock.0.elapsed() < deadline {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(1500..4000))).await;
        let kind = schedule
            .get(faults.len())
            .copied()
            .unwrap_or_else(|| KINDS[rng.gen_range(0..KINDS.len())]);
        let tear = match modes.as_str() {
            "lose" | "none" => false,
            "tear" => true,
            _ => rng.gen_bool(0.5),
        };
        let tear_seed: u64 = rng.gen();
        let mode = if modes == "none" {
            "none".to_owned()
        } else if tear {
            format!("tear {tear_seed}")
        } else {
            "lose".to_owned()
        };
        let number = faults.len() + 1;
        let fault = cut(
            &mut rig,
            &sh,
            kind,
            &mode,
            &mut rng,
            number,
            &mut violations,
        )
        .await;
        eprintln!(
            "cut #{number} at {} ms: {} ({}), {} ms down..back{}: {}",
            fault.start_ms,
            fault.kind,
            fault.mode,
            fault.end_ms - fault.start_ms,
            fault
                .recovery_ms
                .map(|ms| format!(", recovered in {ms} ms"))
                .unwrap_or_default(),
            fault.cuts.join("; ")
        );
        faults.push(fault);
        if violations.iter().any(|v| v.starts_with("restart:")) {
            break;
        }
    }
    // Let the load see the cluster whole again, then stop it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    sh.stop.store(true, Ordering::SeqCst);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
    }

    let fail = |violations: &[String]| -> ! {
        let kept = keep_evidence(seed, dir.path(), &sh, &faults, violations);
        let shown: Vec<String> = violations
            .iter()
            .take(30)
            .map(|v| format!("  {v}"))
            .collect();
        panic!(
            "{} violations (seed {seed}; histories and logs in {}):\n{}",
            violations.len(),
            kept.display(),
            shown.join("\n")
        );
    };
    if violations.iter().any(|v| v.starts_with("restart:")) {
        fail(&violations);
    }
    // Everyone caught up, then the checks.
    let Some(leader_id) = leader(&rig, &client, 600).await else {
        violations.push("no leader at the end".into());
        fail(&violations);
    };
    for id in 1..=3 {
        if catch_up(&rig, &client, id, Duration::from_secs(60))
            .await
            .is_none()
        {
            violations.push(format!(
                "rejoin: election-{id} did not catch up at the end{}",
                panics(&rig.logs)
            ));
        }
    }
    let grants = sh.grants.lock().expect("grants").clone();
    let writes = sh.writes.lock().expect("writes").clone();
    check_tokens(&grants, &mut violations);
    check_fence_order(&writes, &mut violations);
    let keys = check_objects(&sh, &faults, &mut violations).await;
    for (lease, top) in highest_acked(&writes) {
        match fence(&sh, &lease).await {
            Some(f) if f >= top => {}
            other => violations.push(format!(
                "S1: the fence of {lease} ends at {other:?}, below the acknowledged token {top}"
            )),
        }
    }
    check_grants(
        &sh,
        &rig.cluster.url(leader_id),
        &faults,
        &rig.logs,
        &mut violations,
    )
    .await;
    let acked_writes = writes
        .iter()
        .filter(|w| matches!(w.outcome, Outcome::Acked(_)))
        .count();
    let unknown = writes
        .iter()
        .filter(|w| w.outcome == Outcome::Unknown)
        .count();
    let refused = writes
        .iter()
        .filter(|w| matches!(w.outcome, Outcome::Refused(_)))
        .count();
    let keepers = grants.iter().filter(|g| g.keeper).count();
    eprintln!(
        "power cut: seed {seed}: {} cuts in {} ms; {} acknowledged grants ({keepers} keepers); {acked_writes} acknowledged writes, {refused} refused, {unknown} unknown; {keys} keys checked; {} violations",
        faults.len(),
        sh.clock.ms(),
        grants.len(),
        violations.len()
    );
    for mount in &rig.mounts {
        eprintln!("  lazyfs {}: {}", mount.name, mount.control("stats"));
    }
    if !violations.is_empty() {
        fail(&violations);
    }
}
