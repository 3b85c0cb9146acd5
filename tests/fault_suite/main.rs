//! The fault-injection suite: real processes (3 election nodes, a gateway,
//! 4 `palisade worker` processes contending for 2 leases, writing and reading
//! through the SDK) under a seeded schedule of faults, run twice: with the
//! gateway on sled, and with two gateways on one PostgreSQL (`storage.rs`;
//! the workers spread over both, plus a gateway paused mid-write and
//! PostgreSQL restarted in immediate mode; half as long):
//! - SIGKILL and restart of the Raft leader, of a follower, and of two nodes
//!   at once (quorum lost until they are back);
//! - SIGSTOP of the Raft leader, of a follower, and of a lease holder for
//!   longer than its ttl (the paused old leader);
//! - kill -9 and restart of the gateway mid-write;
//! - a follower whose data dir is wiped, restarted with its old flags (shut
//!   out: its acks and votes do not count), then replaced: removed and added
//!   back through the membership API;
//! - a hostile client that, every second of the run (and in bursts as a
//!   fault), renews, releases and re-acquires with a 1 s ttl the held
//!   leases with everything `GET` shows (holder, token, index) and no
//!   secret, as a principal with every right: every attempt must fail;
//! - a follower SIGSTOPped while the leader grants batches of 2 000 leases and
//!   purges its log past it (snapshots every 500 entries): resumed, it must
//!   catch up by snapshot within 30 s and show the newest lease from its
//!   own state; the batches are released then (a soak's table stays
//!   bounded);
//! - 200 blocking acquirers queued on one lease, which passes down the
//!   queue (each waiter releases once granted): none may be refused 409;
//! - preemption: the workers acquire preemptible at priority 0; a "boss"
//!   worker of priority 10 campaigns for a held lease, must hold it within
//!   `RECOVERY_MS` of its campaign's start (the holder learns on its next
//!   renew and lets go; the boss's own start is bounded apart), writes
//!   for a while and stops; its history joins the others, so the checker
//!   sees no overlap (S3) and no stale write accepted (S1) across it;
//! - key rotation while node 1, the first endpoint of the gateway's
//!   `--election` list, is cut from its peers (`rotation.rs`): a grant of
//!   the new key written through the gateway at once must be accepted;
//! - a noisy neighbour (`flood.rs`): the `intruder` principal floods every
//!   node with long watches over its share, one node with renewals whose
//!   bodies never come, and all with silent connections, for 1.5-3 s; it
//!   must be refused (429), and the workers' leases live through it;
//! - a power cut (`../support/lazyfs.rs`): node 2 and the sled gateway keep
//!   their data on lazyfs mounts; one of them is killed -9, its mount loses
//!   everything not fsynced (or tears the last write of one file), and it
//!   starts again on what is left (root and /dev/fuse);
//! - network partitions that drop real packets (`netns.rs`): the Raft leader
//!   isolated, a follower isolated (majority/minority), and a bridge (the
//!   leader cut from one follower, both still reaching the third);
//! - clock drift for the whole run, through libfaketime: election node 3's
//!   clocks (monotonic included) run 4% fast, so it expires leases early,
//!   and worker w2's run 4% slow, so it believes in its lease longer; the
//!   SDK's margin (deadline = ttl - 10%) must cover both at once.
//!
//! Clients speak TLS to the election nodes and the gateway, and both
//! enforce a policy: the workers are the `orders` principal (their leases
//! are `orders.*`), the harness and the hostile client `admin`.
//!
//! Every worker logs held intervals, writes and reads on CLOCK_MONOTONIC
//! (read through a direct vDSO call that libfaketime does not touch, so
//! even the drifting worker's history is on the one real clock); the
//! harness logs each fault's window. The checker (`checker.rs`) verifies S1-S4
//! (reads included, per-key linearizability in `linearizable.rs`) and L1.
//!
//! A third run has four Raft partitions (`--partitions 4`) and the
//! faults that matter most to them (`GROUP_KINDS`, `GROUP_CUTS`; half as
//! long): the leader the suite aims at is partition 0's, which may lead
//! the workers' partitions or not.
//!
//! CI mode: `PALISADE_FAULT_SECONDS` (default 60) of faults, every kind at
//! least once, with a printed seed; `PALISADE_FAULT_SEED=N` replays a
//! schedule, and with it the election nodes' timeouts (the seed is their
//! `--timing-seed`); a long `PALISADE_FAULT_SECONDS` is the soak. Partitions need
//! root (a network namespace) and drift needs libfaketime; without them the
//! suite says what it skips, and `PALISADE_FAULT_STRICT=1` (set by `.ci/run`)
//! makes that a failure. A violation fails the test and keeps the histories
//! under `target/fault-histories/<seed>/`.

mod checker;
mod flood;
#[path = "../support/lazyfs.rs"]
mod lazyfs;
mod linearizable;
mod netns;
mod resources;
mod rotation;
mod storage;
#[path = "../support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use checker::{
    check, check_holders_ride_through, gaps, recoveries, Bounds, Fault, Held, History, Read,
    Recovery, RideThrough, Write,
};
use palisade_local_cluster::Logs;
use storage::{Engine, Gateways};
use support::{node_setup, Access, Cluster};

const TTL_MS: u64 = 1500;
/// L1, stated: after any fault heals, every lease has a holder again within
/// the old grant's ttl (it may have just been renewed) plus one second for
/// an election (at most 120 ms of timeout plus a round) and the waiting
/// worker's retry.
const RECOVERY_MS: u64 = TTL_MS + 1000;
/// L2 (issue 42): the workers' holders keep their leases through a freeze
/// or a cut of the Raft leader shorter than the ttl less an election and a
/// round trip (300 ms), once the cluster had settled for 1 s: the L2 kinds
/// (which wait for settled holders first), and the older freeze and cut of
/// the leader when they happen to qualify.
const RIDE_THROUGH: RideThrough = RideThrough {
    kinds: &[RIDE_FREEZE, RIDE_CUT, STOP_LEADER, ISOLATE_LEADER],
    budget_ns: (TTL_MS - 300) * 1_000_000,
    settled_ns: 1_000_000_000,
    after_ns: TTL_MS * 1_000_000,
};
/// How long a boss (a debug binary, on a machine the suite keeps busy) may
/// take from its spawn to its first campaign.
const BOSS_START_MS: u64 = 10_000;
/// Node 3's clocks run this much fast, worker w2's this much slow (combined
/// 1.04 / 0.96 = 8% of a ttl, inside the SDK's 10% margin).
/// `PALISADE_FAULT_DRIFT` overrides it, to show what drift beyond the margin
/// does.
const DRIFT: f64 = 0.04;

/// A tiny deterministic generator, so a seed replays the same schedule.
struct Schedule(u64);

impl Schedule {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// CLOCK_MONOTONIC now, in nanoseconds (the clock the workers log on).
fn monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (now.tv_sec as u64) * 1_000_000_000 + now.tv_nsec as u64
}

/// libfaketime's preload library, where Debian's `faketime` package puts it.
fn libfaketime() -> Option<PathBuf> {
    let candidates = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|dir| dir.path().join("faketime/libfaketime.so.1"))
        .chain([PathBuf::from("/usr/lib/faketime/libfaketime.so.1")]);
    candidates.into_iter().find(|p| p.exists())
}

/// The environment that makes a process's clocks run at `rate`.
fn drift_env(lib: Option<&Path>, rate: f64) -> Vec<(String, String)> {
    lib.map(|lib| {
        vec![
            ("LD_PRELOAD".to_owned(), lib.display().to_string()),
            ("FAKETIME".to_owned(), format!("+0 x{rate}")),
        ]
    })
    .unwrap_or_default()
}

fn worker(
    cluster: &Cluster,
    access: &Access,
    gateway: &str,
    (lease, holder): (&str, &str),
    history: &Path,
    env: &[(String, String)],
    extra: &[&str],
) -> Child {
    Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "worker",
            "--lease",
            lease,
            "--holder",
            holder,
            "--key",
            &format!("{lease}/register"),
            "--ttl-ms",
            &TTL_MS.to_string(),
            "--interval-ms",
            "50",
            "--read-interval-ms",
            "40",
            "--election",
            &cluster.urls().join(","),
            "--gateway",
            gateway,
            "--history",
        ])
        .arg(history)
        .args(extra)
        .args(access.cli_args("orders"))
        .envs(env.iter().map(|(k, v)| (k, v)))
        // What it printed (each campaign, write and loss), for a fault
        // that needs explaining.
        .stdout(
            std::fs::File::create(history.with_extension("out"))
                .map_or_else(|_| Stdio::null(), Stdio::from),
        )
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn worker")
}

fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status();
}

const KILL_LEADER: &str = "kill -9 Raft leader, restart";
const KILL_FOLLOWER: &str = "kill -9 follower, restart";
const KILL_QUORUM: &str = "kill -9 two nodes (quorum lost), restart";
const STOP_LEADER: &str = "SIGSTOP Raft leader";
const STOP_FOLLOWER: &str = "SIGSTOP follower";
const STOP_HOLDER: &str = "SIGSTOP lease holder past its ttl";
const KILL_GATEWAY: &str = "kill -9 gateway mid-write, restart";
const ISOLATE_LEADER: &str = "partition: Raft leader isolated";
const ISOLATE_FOLLOWER: &str = "partition: follower isolated (majority/minority)";
const BRIDGE: &str = "partition: bridge (leader cut from one follower)";
const WIPE_FOLLOWER: &str = "follower wiped, restarted with its flags, then replaced";
const HOSTILE_CLIENT: &str = "hostile client renews/releases with what GET shows";
const LAGGING_FOLLOWER: &str = "follower lagging past the purge point, big table";
const MANY_WAITERS: &str = "many blocking acquirers queued on one lease";
const PREEMPT: &str = "a higher-priority worker preempts the holder";
/// L2 (issue 42): with both leases held for a while, the leader is frozen
/// (or cut off) for less than the ttl less an election; every holder must
/// keep its lease (`checker.rs::check_holders_ride_through`).
const RIDE_FREEZE: &str = "SIGSTOP Raft leader under settled holders (L2)";
const RIDE_CUT: &str = "partition: Raft leader cut off under settled holders (L2)";
const ROTATE_LAGGING: &str = "key rotation while the gateway's first endpoint is cut off";
const NOISY_NEIGHBOUR: &str = "a neighbour floods watches, stalled bodies, silent connections";
const STOP_GATEWAY: &str = "SIGSTOP one of two gateways mid-write";
const RESTART_POSTGRES: &str = "PostgreSQL stopped (immediate) and started again";
const POWER_CUT: &str = "power cut: node 2 or the gateway loses what it did not fsync";

/// The priority of the preempting worker (the others acquire at 0,
/// preemptible).
const BOSS_PRIORITY: &str = "10";

/// Leases granted per batch while a follower is paused: with snapshots
/// every [`SNAPSHOT_EVERY`] entries and openraft keeping 1 000 entries
/// after one, a batch or two purge past the paused follower, so it can only
/// catch up by snapshot of a big table. Released once it has: a soak's
/// table stays bounded (a ttl would not do it: every new leader starts
/// every deadline afresh, and leaders change every few faults).
const BULK_PER_FAULT: usize = 2_000;
const BULK_TTL_MS: u64 = 3_600_000;
const SNAPSHOT_EVERY: &str = "500";
/// Blocking acquirers queued in one "many waiters" fault: more than the
/// 48 waiting seats a follower gives the harness's principal. (200 until
/// the twenty-first session, when runs on a busy 2-core machine took
/// 35-40 s to serve them, up to 200 ms a handoff.)
const WAITERS: usize = 120;
/// How long each of them may take, from its first call to its grant (25 s
/// until the twenty-first session). A handoff down the queue is two
/// commits and the waiter's round trips: 50-200 ms on the debug build of a
/// busy 2-core machine. The waiter's wait stays under `--max-wait-ms`.
const QUEUE_BUDGET: Duration = Duration::from_secs(45);

/// One suite at a time: each loads the machine's two cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The suite with the gateway on sled (the embedded default).
#[test]
fn safety_and_liveness_hold_under_faults() {
    suite(Engine::Sled, 1);
}

/// The suite on a cluster of four Raft partitions (`--partitions 4`,
/// issue 46), with the faults that matter most to them: the leader (of
/// partition 0, which holds `orders.beta`; `orders.alpha` is in partition
/// 2, led elsewhere once the leaders spread) killed, stopped, isolated and
/// bridged, a follower killed, the quorum killed, and a follower wiped and
/// replaced (a membership change in every partition); half as long.
///
/// It found that a freeze of partition 0's leader cost other partitions'
/// holders their leases (seed 9368499500230807939), while a batch renewal
/// on a follower went through partition 0's leader and waited for it; the
/// calls that span partitions are now served where they land, and each
/// partition's part waits at most a quarter of its ttl.
#[test]
fn safety_and_liveness_hold_with_raft_partitions() {
    suite(Engine::Sled, 4);
}

/// The suite with two gateways on one PostgreSQL, the workers spread over
/// both, and PostgreSQL's own faults (`storage.rs`); half as long, with
/// the election faults that matter most to writers (S1 across gateways is
/// what this run adds).
#[test]
fn safety_and_liveness_hold_with_gateways_on_postgres() {
    suite(Engine::Postgres, 1);
}

/// One run on `engine` with `groups` Raft partitions.
fn suite(engine: Engine, groups: u32) {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let strict = std::env::var("PALISADE_FAULT_STRICT").is_ok_and(|v| v == "1");
    // Before the runtime exists: its threads and every child process
    // inherit the namespace.
    let partitions = match netns::enter_private() {
        Ok(()) => true,
        Err(why) => {
            assert!(
                !strict,
                "PALISADE_FAULT_STRICT: partitions impossible: {why}"
            );
            eprintln!("fault suite: SKIPPING partitions: {why}");
            false
        }
    };
    let faketime = libfaketime();
    if faketime.is_none() {
        assert!(
            !strict,
            "PALISADE_FAULT_STRICT: libfaketime not found (apt-get install faketime)"
        );
        eprintln!(
            "fault suite: SKIPPING clock drift: libfaketime not found (apt-get install faketime)"
        );
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run(engine, groups, partitions, faketime));
}

/// The kinds of fault a run with Raft partitions injects (`groups` > 1).
const GROUP_KINDS: [&str; 6] = [
    KILL_LEADER,
    KILL_FOLLOWER,
    KILL_QUORUM,
    STOP_LEADER,
    WIPE_FOLLOWER,
    RIDE_FREEZE,
];

/// The network partitions a run with Raft partitions adds.
const GROUP_CUTS: [&str; 2] = [ISOLATE_LEADER, BRIDGE];

/// The kinds of fault a run on `engine` injects, each at least once.
fn kinds(engine: Engine, groups: u32, partitions: bool, power: bool) -> Vec<&'static str> {
    if groups > 1 {
        let cuts = if partitions { &GROUP_CUTS[..] } else { &[] };
        return GROUP_KINDS.iter().chain(cuts).copied().collect();
    }
    let mut kinds = match engine {
        Engine::Sled => vec![
            KILL_LEADER,
            KILL_FOLLOWER,
            KILL_QUORUM,
            STOP_LEADER,
            STOP_FOLLOWER,
            STOP_HOLDER,
            KILL_GATEWAY,
            WIPE_FOLLOWER,
            HOSTILE_CLIENT,
            LAGGING_FOLLOWER,
            MANY_WAITERS,
            PREEMPT,
            NOISY_NEIGHBOUR,
            RIDE_FREEZE,
        ],
        Engine::Postgres => vec![
            KILL_LEADER,
            STOP_LEADER,
            RIDE_FREEZE,
            STOP_HOLDER,
            KILL_GATEWAY,
            STOP_GATEWAY,
            RESTART_POSTGRES,
            PREEMPT,
            HOSTILE_CLIENT,
        ],
    };
    if power {
        kinds.push(POWER_CUT);
    }
    if partitions {
        kinds.extend(match engine {
            Engine::Sled => &[
                ISOLATE_LEADER,
                ISOLATE_FOLLOWER,
                BRIDGE,
                ROTATE_LAGGING,
                RIDE_CUT,
            ][..],
            Engine::Postgres => &[ISOLATE_LEADER, RIDE_CUT][..],
        });
    }
    kinds
}

async fn run(engine: Engine, groups: u32, partitions: bool, faketime: Option<PathBuf>) {
    let mut seconds: u64 = std::env::var("PALISADE_FAULT_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    if engine == Engine::Postgres || groups > 1 {
        seconds /= 2;
    }
    let seed: u64 = std::env::var("PALISADE_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let drift: f64 = std::env::var("PALISADE_FAULT_DRIFT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DRIFT);
    eprintln!(
        "fault suite ({engine:?}, {groups} Raft partition(s)): seed {seed}, {seconds} s (replay with PALISADE_FAULT_SEED={seed})"
    );
    // Node 2 and the sled gateway keep their data on lazyfs mounts, so a
    // power cut can lose what they did not fsync (root and /dev/fuse).
    let power =
        engine == Engine::Sled && groups == 1 && lazyfs::can_mount("the fault suite's power cuts");
    let kinds = kinds(engine, groups, partitions, power);
    let dir = tempfile::tempdir().expect("tempdir");
    let setting = Setting {
        engine,
        seed,
        groups,
        partitions,
        power,
        faketime: faketime.as_deref(),
        drift,
    };
    let Some(mut harness) = Harness::start(dir.path(), &setting).await else {
        return; // PostgreSQL is missing (and not required): said why.
    };
    let resources = resources::Sampler::start(dir.path());
    let mut schedule = Schedule(seed);
    let mut faults: Vec<Fault> = Vec::new();
    let first_kind = schedule.next(kinds.len() as u64) as usize;
    let started = Instant::now();
    // At least one fault of every kind, however slow the machine.
    while started.elapsed() < Duration::from_secs(seconds) || faults.len() < kinds.len() {
        tokio::time::sleep(Duration::from_millis(1000 + schedule.next(1500))).await;
        // Every kind in turn (from a seeded start), so even a short run has
        // each; the seed also picks the durations and the victims.
        let kind = kinds[(first_kind + faults.len()) % kinds.len()];
        let from = monotonic_ns();
        harness.inject(kind, &mut schedule).await;
        let from = harness.began.take().unwrap_or(from);
        faults.push(Fault {
            kind,
            from,
            healed: monotonic_ns(),
        });
        if faults.len() % kinds.len() == 0 {
            // Once a round: what the nodes keep, for a soak's trend.
            let census = harness.census().await;
            let at = started.elapsed().as_secs();
            eprintln!(
                "fault suite: after {} faults, {at} s:{census}",
                faults.len()
            );
        }
    }

    // Let the last fault recover within its bound, then collect.
    tokio::time::sleep(Duration::from_millis(RECOVERY_MS + 1000)).await;
    let history = harness.finish(faults).await;
    resources.report();
    let longest_fault = history
        .faults
        .iter()
        .map(|f| f.healed - f.from)
        .max()
        .unwrap_or(0);
    let bounds = Bounds {
        max_gap_ns: longest_fault + RECOVERY_MS * 1_000_000,
        recovery_ns: RECOVERY_MS * 1_000_000,
    };
    let mut violations = check(&history, bounds);
    violations.extend(preemption_gaps(&history));
    let (l2, rode) = check_holders_ride_through(&history, RIDE_THROUGH);
    eprintln!("fault suite: L2: {rode} holder(s) held to riding through a short freeze or cut of the leader");
    violations.extend(l2);
    report(seed, &history, &kinds, bounds);
    if !violations.is_empty() {
        let kept = keep(seed, &harness.histories, &history.faults);
        panic!(
            "violations (histories kept in {}):\n{}",
            kept.display(),
            violations.join("\n")
        );
    }
    // The run must have exercised what it claims to.
    let injected: std::collections::BTreeSet<&str> =
        history.faults.iter().map(|f| f.kind).collect();
    if seconds >= 60 {
        assert_eq!(injected.len(), kinds.len(), "not every fault kind ran");
    }
    assert!(
        harness.thefts.is_empty(),
        "a hostile client used public lease data: {:?}",
        harness.thefts
    );
    // With Raft partitions the faults aimed at partition 0's leader often
    // leave the other partition's holder riding through every one (L2 at
    // work): there, both leases held is what a run must show.
    let least = if groups > 1 { 2 } else { 3 };
    assert!(
        history.held.len() >= least,
        "no lease changed hands: {} grants",
        history.held.len()
    );
    let acked = history.writes.iter().filter(|w| w.ok).count();
    let reads = history.reads.iter().filter(|r| r.ok).count();
    assert!(acked >= 20, "too few writes to mean anything: {acked}");
    assert!(reads >= 50, "too few reads to mean anything: {reads}");
}

/// The handoff of each preemption: from the moment the preempted holder
/// stopped believing in its lease to the boss's grant. The holder lets go
/// as soon as its renew says `preempted`: one commit for the release, one
/// for the boss's grant (seen: 30-50 ms). Half a ttl is far above that and
/// below what a lease left to run out would cost (the rest of the grant,
/// about two thirds of a ttl after a renewal: the fault this kind found, at
/// 1 042 ms). Prints each gap; returns violations.
fn preemption_gaps(history: &History) -> Vec<String> {
    let mut violations = Vec::new();
    for boss in history.held.iter().filter(|h| h.holder.starts_with("boss")) {
        let before = history
            .held
            .iter()
            .filter(|h| h.lease == boss.lease && h.holder != boss.holder && h.to <= boss.from)
            .map(|h| h.to)
            .max();
        let Some(before) = before else { continue };
        // Only a handoff if the holder let go after the boss was started:
        // a lease already free then (its holder lost it to an earlier
        // fault) is L1's to bound, not this.
        let asked = history
            .faults
            .iter()
            .filter(|f| f.kind == PREEMPT && f.from <= boss.from)
            .map(|f| f.from)
            .max();
        if asked.is_some_and(|asked| before < asked) {
            eprintln!(
                "fault suite: {} found {} already free (no handoff)",
                boss.holder, boss.lease
            );
            continue;
        }
        let gap_ms = (boss.from - before) / 1_000_000;
        eprintln!(
            "fault suite: {} took {} {gap_ms} ms after the holder let go",
            boss.holder, boss.lease
        );
        if gap_ms > TTL_MS / 2 {
            violations.push(format!(
                "preemption: {} waited {gap_ms} ms for {} after its holder let go (bound {} ms)",
                boss.holder,
                boss.lease,
                TTL_MS / 2
            ));
        }
    }
    violations
}

/// Who holds which lease: two workers per lease.
const ROLES: [(&str, &str); 4] = [
    ("orders.alpha", "w1"),
    ("orders.alpha", "w2"),
    ("orders.beta", "w3"),
    ("orders.beta", "w4"),
];

/// The processes under test and how to hurt them.
struct Harness {
    /// Where histories go.
    dir: PathBuf,
    /// The `admin` principal's client.
    http: reqwest::Client,
    access: Access,
    cluster: Cluster,
    gateways: Gateways,
    workers: Vec<Child>,
    histories: Vec<PathBuf>,
    /// What the hostile client got away with (must stay empty).
    thefts: Vec<String>,
    /// The hostile client that tries every second; yields its thefts and
    /// how many rounds it ran.
    thief: Option<tokio::task::JoinHandle<(Vec<String>, u32)>>,
    thief_stop: palisade_client::CancellationToken,
    /// Node 2's and the gateway's lazyfs mounts (power cuts), if any:
    /// dropped last, after the processes on them.
    mounts: Vec<lazyfs::LazyMount>,
    /// When the last fault really began, if later than its injection (the
    /// L2 kinds first wait for the leases to settle).
    began: Option<u64>,
}

/// How a run is set up.
struct Setting<'a> {
    engine: Engine,
    seed: u64,
    /// Raft partitions (`--partitions`).
    groups: u32,
    /// Network partitions (a private namespace, iptables).
    partitions: bool,
    /// Node 2 and the gateway on lazyfs (power cuts).
    power: bool,
    faketime: Option<&'a Path>,
    drift: f64,
}

/// A run that panics (a violation, a fault that could not be injected)
/// must not leave its workers running: they would load the machine for
/// whatever runs next.
impl Drop for Harness {
    fn drop(&mut self) {
        for worker in &mut self.workers {
            let _ = worker.kill();
            let _ = worker.wait();
        }
    }
}

impl Harness {
    /// Three election nodes (node 3 drifting fast) whose election timeouts
    /// the seed fixes (`--timing-seed`), the gateways of `engine`, and the
    /// workers of `ROLES` (w2 drifting slow, spread round-robin over the
    /// gateways), which acquire preemptible. `None`: PostgreSQL is missing
    /// (and not required).
    async fn start(dir: &Path, setting: &Setting<'_>) -> Option<Self> {
        let Setting {
            engine,
            seed,
            groups,
            partitions,
            power,
            faketime,
            drift,
        } = *setting;
        let mounts: Vec<lazyfs::LazyMount> = match power {
            true => ["election-2", "gateway"]
                .iter()
                .map(|name| lazyfs::LazyMount::start(&lazyfs::lazyfs_binary(), dir, name))
                .collect(),
            false => Vec::new(),
        };
        let setups = (1..=3)
            .map(|id| {
                let host = if partitions {
                    netns::node_host(id)
                } else {
                    "127.0.0.1".into()
                };
                let mut setup = node_setup(dir, id, &host);
                setup.args = vec![
                    "--snapshot-every".into(),
                    SNAPSHOT_EVERY.into(),
                    "--timing-seed".into(),
                    seed.to_string(),
                    "--partitions".into(),
                    groups.to_string(),
                ];
                if id == 3 {
                    setup.env = drift_env(faketime, 1.0 + drift);
                }
                // Kept so that a failed start after a power cut, or a
                // stall, says why (copied beside the histories on failure).
                setup.logs = Logs::File(dir.join(format!("election-{id}.log")));
                if let (2, Some(mount)) = (id, mounts.first()) {
                    setup.data_dir = mount.mount.join("data");
                }
                setup
            })
            .collect();
        let (cluster, access) = Cluster::start_secure(dir, setups);
        let http = access.http("admin");
        cluster.leader(&http).await;
        let gateway_data = mounts.get(1).map(|m| m.mount.join("data"));
        let gateways = Gateways::start(engine, &access, &cluster, dir, gateway_data)?;
        let histories: Vec<PathBuf> = ROLES
            .iter()
            .map(|(_, h)| dir.join(format!("{h}.jsonl")))
            .collect();
        let workers = ROLES
            .iter()
            .zip(&histories)
            .enumerate()
            .map(|(i, ((lease, holder), path))| {
                let env = if *holder == "w2" {
                    drift_env(faketime, 1.0 - drift)
                } else {
                    Vec::new()
                };
                worker(
                    &cluster,
                    &access,
                    gateways.url(i),
                    (lease, holder),
                    path,
                    &env,
                    &["--preemptible"],
                )
            })
            .collect();
        let thief_stop = palisade_client::CancellationToken::new();
        let thief = tokio::spawn(steal_every_second(
            http.clone(),
            cluster.urls(),
            thief_stop.clone(),
        ));
        Some(Self {
            dir: dir.to_owned(),
            http,
            access,
            cluster,
            gateways,
            workers,
            histories,
            thefts: Vec::new(),
            thief: Some(thief),
            thief_stop,
            mounts,
            began: None,
        })
    }

    /// Injects one fault of `kind` and heals it before returning.
    async fn inject(&mut self, kind: &str, schedule: &mut Schedule) {
        let (http, cluster) = (&self.http, &mut self.cluster);
        match kind {
            KILL_LEADER | KILL_FOLLOWER | KILL_QUORUM => {
                let leader = cluster.leader(http).await;
                let victims = match kind {
                    KILL_LEADER => vec![leader],
                    KILL_FOLLOWER => vec![follower(leader, schedule)],
                    _ => vec![leader, follower(leader, schedule)],
                };
                for id in &victims {
                    cluster.kill(*id);
                }
                tokio::time::sleep(Duration::from_millis(500 + schedule.next(1000))).await;
                for id in victims {
                    cluster.start_node(id).expect("restart");
                }
            }
            STOP_LEADER | STOP_FOLLOWER => {
                let leader = cluster.leader(http).await;
                let victim = if kind == STOP_LEADER {
                    leader
                } else {
                    follower(leader, schedule)
                };
                cluster.pause(victim).expect("SIGSTOP");
                tokio::time::sleep(Duration::from_millis(300 + schedule.next(1200))).await;
                cluster.resume(victim).expect("SIGCONT");
            }
            STOP_HOLDER => {
                let lease = ROLES[schedule.next(ROLES.len() as u64) as usize].0;
                let holder = current_holder(http, cluster, lease).await;
                let fallback = schedule.next(ROLES.len() as u64) as usize;
                let victim = ROLES
                    .iter()
                    .position(|(_, h)| Some(*h) == holder.as_deref())
                    .unwrap_or(fallback);
                let pid = self.workers[victim].id();
                signal(pid, "STOP");
                tokio::time::sleep(Duration::from_millis(TTL_MS + 500 + schedule.next(1000))).await;
                signal(pid, "CONT");
            }
            KILL_GATEWAY => {
                let victim = schedule.next(self.gateways.len() as u64) as usize;
                self.gateways.kill_and_restart(victim);
            }
            STOP_GATEWAY => {
                let victim = schedule.next(self.gateways.len() as u64) as usize;
                let pause = Duration::from_millis(300 + schedule.next(1200));
                self.gateways.pause(victim, pause).await;
            }
            POWER_CUT => self.power_cut(schedule).await,
            RESTART_POSTGRES => {
                let down = Duration::from_millis(200 + schedule.next(1000));
                self.gateways.restart_postgres(down).await;
            }
            RIDE_FREEZE | RIDE_CUT => {
                settle(http, cluster).await;
                let leader = cluster.leader(http).await;
                let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
                self.began = Some(monotonic_ns());
                if kind == RIDE_FREEZE {
                    cluster.pause(leader).expect("SIGSTOP");
                } else {
                    for other in &others {
                        netns::cut(leader, *other);
                    }
                }
                tokio::time::sleep(Duration::from_millis(400 + schedule.next(500))).await;
                if kind == RIDE_FREEZE {
                    cluster.resume(leader).expect("SIGCONT");
                } else {
                    netns::heal();
                }
            }
            ISOLATE_LEADER | ISOLATE_FOLLOWER | BRIDGE => {
                let leader = cluster.leader(http).await;
                let one = follower(leader, schedule);
                let other = 6 - leader - one;
                match kind {
                    ISOLATE_LEADER => {
                        netns::cut(leader, one);
                        netns::cut(leader, other);
                        // Proof that the cut is real: the majority elects
                        // a leader of its own.
                        let moved = cluster.leader_among(http, &[one, other], 60).await;
                        assert!(
                            moved.is_some(),
                            "the majority elected no leader while node {leader} was cut off"
                        );
                    }
                    ISOLATE_FOLLOWER => {
                        netns::cut(one, leader);
                        netns::cut(one, other);
                    }
                    _ => netns::cut(leader, one),
                }
                tokio::time::sleep(Duration::from_millis(500 + schedule.next(2000))).await;
                netns::heal();
            }
            WIPE_FOLLOWER => {
                let leader = cluster.leader(http).await;
                let victim = follower(leader, schedule);
                cluster.kill(victim);
                std::fs::remove_dir_all(&cluster.setup(victim).data_dir).expect("wipe");
                cluster.start_node(victim).expect("restart wiped");
                // Shut out (its acks and votes do not count) until replaced.
                tokio::time::sleep(Duration::from_millis(300 + schedule.next(700))).await;
                replace(http, &self.access, cluster, victim).await;
            }
            HOSTILE_CLIENT => {
                let until = Instant::now() + Duration::from_millis(1000 + schedule.next(1000));
                while Instant::now() < until {
                    let (lease, _) = ROLES[schedule.next(ROLES.len() as u64) as usize];
                    self.thefts
                        .extend(steal(http, &cluster.urls()[0], lease).await);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            LAGGING_FOLLOWER => {
                let leader = cluster.leader(http).await;
                let victim = follower(leader, schedule);
                let base = cluster.url(leader);
                let view: serde_json::Value =
                    support::get_json(http, &format!("{base}/v1/cluster"), "cluster").await;
                let before = view["last_log_index"].as_u64().unwrap_or(0);
                cluster.pause(victim).expect("SIGSTOP");
                // Batches until the leader has purged past the follower
                // (it purges a little after each snapshot), at most 4x.
                let run = monotonic_ns();
                let (mut batch, mut view) = (0, serde_json::Value::Null);
                let mut grants = Vec::new();
                while batch < 4 {
                    let prefix = format!("bulk.{run}.{batch}");
                    let each = (BULK_PER_FAULT, BULK_TTL_MS);
                    grants.extend(support::grant_many(http, &base, &prefix, each, 16).await);
                    batch += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    view = support::get_json(http, &format!("{base}/v1/cluster"), "cluster").await;
                    if view["purged_index"].as_u64().unwrap_or(0) > before {
                        break;
                    }
                }
                let prefix = format!("bulk.{run}.{}", batch - 1);
                let target = view["last_log_index"].as_u64().unwrap_or(0);
                let purged = view["purged_index"].as_u64().unwrap_or(0);
                cluster.resume(victim).expect("SIGCONT");
                assert!(
                    purged > before,
                    "the leader did not purge past the paused follower ({before}): {view}"
                );
                let url = cluster.url(victim);
                support::caught_up(http, &url, target, Duration::from_secs(30)).await;
                // Its own state shows the leases granted while it slept.
                let last = format!(
                    "{url}/v1/leases/{prefix}-{}/watch?index=0&wait_ms=0",
                    BULK_PER_FAULT - 1
                );
                let lease: serde_json::Value = support::get_json(http, &last, "lease").await;
                assert!(
                    lease["holder"].is_string(),
                    "{url} does not show {last}: {lease}"
                );
                support::release_many(http, &url, grants, 16).await;
            }
            MANY_WAITERS => {
                let base = cluster.url(cluster.leader(http).await);
                let lease = format!("queue.{}", monotonic_ns());
                let started = Instant::now();
                let outcomes = queue_through(http, &base, &lease, WAITERS).await;
                eprintln!(
                    "fault suite: {WAITERS} waiters through {base}: {} served in {:?}",
                    outcomes.iter().filter(|o| o.is_ok()).count(),
                    started.elapsed()
                );
                // Every waiter is served within its wait: a 409 would mean
                // one was passed over or timed out in the queue.
                let refused: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
                // The first refusal that is not "held" is usually the cause.
                let cause = refused.iter().find(|e| !e.starts_with("409"));
                if !refused.is_empty() {
                    // What each node thought when the queue failed.
                    let views = node_answers(http, cluster, &["/v1/cluster".to_owned()]).await;
                    eprintln!("fault suite: waiters unserved through {base}:{views}");
                    eprintln!("{}", log_tails(&self.dir));
                }
                // How many refusals of each kind (status and error code).
                let mut kinds = std::collections::BTreeMap::new();
                for refusal in &refused {
                    let kind: String = refusal.chars().take(48).collect();
                    *kinds.entry(kind).or_insert(0) += 1;
                }
                assert!(
                    refused.is_empty(),
                    "{} of {WAITERS} waiters were not served; cause {cause:?}, by kind {kinds:?}",
                    refused.len(),
                );
            }
            PREEMPT => self.preempt(schedule).await,
            ROTATE_LAGGING => {
                let hold = Duration::from_millis(300 + schedule.next(1000));
                let kid = rotation::rotate_while_first_endpoint_lags(
                    http,
                    cluster,
                    self.gateways.url(0),
                    hold,
                )
                .await;
                eprintln!("fault suite: rotated to {kid} with node 1 cut off; the gateway took it");
            }
            NOISY_NEIGHBOUR => {
                let duration = Duration::from_millis(1500 + schedule.next(1500));
                let flooded = flood::noisy_neighbour(&self.access, &cluster.urls(), duration).await;
                eprintln!("fault suite: noisy neighbour for {duration:?}: {flooded:?}");
                assert!(
                    flooded.refused > 0,
                    "the flood was never refused (over its share): {flooded:?}"
                );
            }
            other => unreachable!("unknown fault {other}"),
        }
    }

    /// Each node's lease table (records, held) from its `/metrics`, and the
    /// largest files of the run's directory: a soak prints it once a round,
    /// so growth shows where it is.
    async fn census(&self) -> String {
        let mut out = String::new();
        for url in self.cluster.urls() {
            let text = match self.http.get(format!("{url}/metrics")).send().await {
                Ok(answer) => answer.text().await.unwrap_or_default(),
                Err(err) => err.to_string(),
            };
            let gauge = |name: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                    .unwrap_or("?")
                    .to_owned()
            };
            out.push_str(&format!(
                "\n  {url}: {} lease records, {} held",
                gauge("palisade_leases_in_table"),
                gauge("palisade_leases_held")
            ));
        }
        for (kib, file) in resources::largest_files(&self.dir, 8) {
            out.push_str(&format!("\n  {kib:>7} KiB {file}"));
        }
        out
    }

    /// Starts a boss of higher priority on a workers' lease and waits for it
    /// to hold it. The holder learns it is preempted on its next renew and
    /// lets go; the boss, first in the queue by priority, is granted then:
    /// within a renew interval and a commit of its campaign's start, well
    /// inside RECOVERY_MS. The bound counts from the campaign (the boss's
    /// first line), not from the spawn: starting a debug binary on a loaded
    /// machine is not the cluster's latency; the start has its own, looser
    /// bound (`BOSS_START_MS`).
    async fn preempt(&mut self, schedule: &mut Schedule) {
        let (http, cluster) = (&self.http, &self.cluster);
        let lease = ROLES[2 * schedule.next(2) as usize].0;
        let boss = format!("boss{}", self.histories.len());
        let path = self.dir.join(format!("{boss}.jsonl"));
        let output = path.with_extension("out");
        let spawned = monotonic_ns();
        let mut child = worker(
            cluster,
            &self.access,
            self.gateways.url(self.histories.len()),
            (lease, &boss),
            &path,
            &[],
            &["--priority", BOSS_PRIORITY],
        );
        self.histories.push(path.clone());
        let mut campaign = None;
        let mut took = None;
        loop {
            let now = monotonic_ns();
            campaign = campaign.or_else(|| campaign_start(&output));
            let deadline = match campaign {
                Some(at) => at + RECOVERY_MS * 1_000_000,
                None => spawned + BOSS_START_MS * 1_000_000,
            };
            if now > deadline {
                break;
            }
            if current_holder(http, cluster, lease).await.as_deref() == Some(&boss) {
                took = campaign.map(|at| monotonic_ns().saturating_sub(at));
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if took.is_some() {
            // It leads and writes for a while, then stops (and releases):
            // the workers take the lease back.
            tokio::time::sleep(Duration::from_millis(500 + schedule.next(1000))).await;
        }
        let why = match took {
            Some(_) => String::new(),
            None => {
                let why = why_not_preempted(http, cluster, lease, &output).await;
                format!(
                    "\n  spawned at {spawned}, campaigning at {campaign:?}, now {}{why}",
                    monotonic_ns()
                )
            }
        };
        signal(child.id(), "TERM");
        let _ = child.wait();
        let took = took.unwrap_or_else(|| {
            panic!("{boss} (priority {BOSS_PRIORITY}) did not preempt the holder of {lease} within {RECOVERY_MS} ms of its campaign (or start within {BOSS_START_MS} ms):{why}")
        });
        let started = campaign.map_or(0, |at| at.saturating_sub(spawned) / 1_000_000);
        eprintln!(
            "fault suite: {boss} started campaigning {started} ms after its spawn and preempted {lease} in {} ms",
            took / 1_000_000
        );
    }

    /// kill -9 node 2 or the gateway, cut the power of its lazyfs mount
    /// (everything not fsynced lost, or the last write of one file torn),
    /// and start it again on what is left.
    async fn power_cut(&mut self, schedule: &mut Schedule) {
        let mode = match schedule.next(2) {
            0 => "cut lose".to_owned(),
            _ => format!("cut tear {}", schedule.next(1 << 30)),
        };
        let gateway = schedule.next(2) == 1;
        let (cluster, gateways, mounts) = (&mut self.cluster, &mut self.gateways, &self.mounts);
        let dir = &self.dir;
        let answer = tokio::task::block_in_place(|| {
            if gateway {
                let mut answer = String::new();
                gateways.kill_and_restart_after(0, || answer = mounts[1].control(&mode));
                answer
            } else {
                cluster.kill(2);
                let answer = mounts[0].control(&mode);
                if let Err(err) = cluster.start_node(2) {
                    let log = std::fs::read_to_string(dir.join("election-2.log"));
                    let log = log.unwrap_or_default();
                    // Its panic (and the lines after it), else its last lines.
                    let from = log
                        .rfind("panicked")
                        .unwrap_or(log.len().saturating_sub(2000));
                    let why: String = log[from..].lines().take(12).collect::<Vec<_>>().join("\n");
                    panic!("node 2 did not start after the power cut ({mode}: {answer}): {err}; its log:\n{why}");
                }
                answer
            }
        });
        let victim = if gateway { "the gateway" } else { "node 2" };
        eprintln!("fault suite: power cut of {victim} ({mode}): {answer}");
    }

    /// Stops the workers cleanly (they log their last held interval) and
    /// reads their histories and the final state of every key written.
    async fn finish(&mut self, faults: Vec<Fault>) -> History {
        self.thief_stop.cancel();
        if let Some(thief) = self.thief.take() {
            let (stolen, rounds) = thief.await.expect("the hostile client");
            eprintln!("fault suite: the hostile client tried {rounds} rounds");
            assert!(
                rounds >= 5,
                "the hostile client hardly ran: {rounds} rounds"
            );
            self.thefts.extend(stolen);
        }
        for worker in &self.workers {
            signal(worker.id(), "TERM");
        }
        for worker in &mut self.workers {
            let _ = worker.wait();
        }
        let mut history = History {
            faults,
            ..History::default()
        };
        for path in &self.histories {
            history.add_lines(&std::fs::read_to_string(path).unwrap_or_default());
        }
        let keys: std::collections::BTreeSet<String> =
            history.writes.iter().map(|w| w.key.clone()).collect();
        for key in keys {
            // Every gateway reads what every other committed: the same final
            // value through each (one database, or the one sled gateway).
            let mut seen = Vec::new();
            for i in 0..self.gateways.len() {
                seen.push(self.final_read(self.gateways.url(i), &key).await);
            }
            assert!(
                seen.windows(2).all(|pair| pair[0] == pair[1]),
                "the gateways disagree on {key}: {seen:?}"
            );
            history.finals.insert(key, seen.swap_remove(0));
        }
        history
    }

    /// The value of `key` through the gateway at `url` (None: absent).
    async fn final_read(&self, url: &str, key: &str) -> Option<String> {
        let response =
            support::send_retrying(|| self.http.get(format!("{url}/v1/objects/{key}"))).await;
        assert!(
            matches!(response.status().as_u16(), 200 | 404),
            "final read of {key} through {url}: {}",
            response.status()
        );
        (response.status() == 200).then_some(response.text().await.expect("body"))
    }
}

/// Copies the histories and the fault log to `target/fault-histories/<seed>/`.
fn keep(seed: u64, histories: &[PathBuf], faults: &[Fault]) -> PathBuf {
    let kept = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("target/fault-histories/{seed}"));
    let _ = std::fs::create_dir_all(&kept);
    for path in histories {
        let _ = std::fs::copy(path, kept.join(path.file_name().expect("name")));
        // What the worker printed (each campaign, write and loss, why).
        let out = path.with_extension("out");
        let _ = std::fs::copy(&out, kept.join(out.file_name().expect("name")));
    }
    // The election nodes' logs, beside the histories.
    if let Some(dir) = histories.first().and_then(|p| p.parent()) {
        for id in 1..=3 {
            let name = format!("election-{id}.log");
            let _ = std::fs::copy(dir.join(&name), kept.join(name));
        }
    }
    let log: String = faults
        .iter()
        .map(|f| {
            let line = serde_json::json!({"kind": f.kind, "from": f.from, "healed": f.healed});
            format!("{line}\n")
        })
        .collect();
    let _ = std::fs::write(kept.join("faults.jsonl"), log);
    kept
}

/// Removes node `victim` and adds it back (it lost its data), retrying
/// while leadership moves; panics if that cannot be done in 30 s.
async fn replace(http: &reqwest::Client, access: &Access, cluster: &Cluster, victim: u64) {
    let slow = access.http_with_timeout("admin", Duration::from_secs(65));
    let started = Instant::now();
    let mut removed = false;
    let mut last = String::new();
    while started.elapsed() < Duration::from_secs(30) {
        let base = match cluster.leader_among(http, &[1, 2, 3], 40).await {
            Some(leader) => cluster.url(leader),
            None => continue,
        };
        if !removed {
            let answer = http
                .delete(format!("{base}/v1/cluster/members/{victim}"))
                .send()
                .await;
            match answer {
                Ok(r) if r.status() == 200 || r.status() == 404 => removed = true,
                Ok(r) => last = format!("remove: {}", r.status()),
                Err(e) => last = format!("remove: {e}"),
            }
            continue;
        }
        let body = serde_json::json!({"id": victim, "addr": cluster.peer_addr(victim)});
        match slow
            .post(format!("{base}/v1/cluster/members"))
            .json(&body)
            .send()
            .await
        {
            Ok(r) if r.status() == 200 => return,
            Ok(r) => last = format!("add: {} {:?}", r.status(), r.text().await),
            Err(e) => last = format!("add: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("could not replace node {victim}: {last}");
}

/// The hostile client of the whole run: every second, a theft attempt on
/// each lease through a node picked in turn, until `stop`.
async fn steal_every_second(
    http: reqwest::Client,
    urls: Vec<String>,
    stop: palisade_client::CancellationToken,
) -> (Vec<String>, u32) {
    let mut stolen = Vec::new();
    let mut rounds = 0u32;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            () = stop.cancelled() => return (stolen, rounds),
            _ = tick.tick() => {}
        }
        let base = &urls[rounds as usize % urls.len()];
        for lease in ["orders.alpha", "orders.beta"] {
            stolen.extend(steal(&http, base, lease).await);
        }
        rounds += 1;
    }
}

/// One theft attempt with everything `GET` shows of `lease`: renew,
/// release, and a repeated acquire with a 1 s ttl (which would shorten the
/// grant) in the holder's name with its token and grant index, no secret.
/// Returns what succeeded (nothing may).
async fn steal(http: &reqwest::Client, base: &str, lease: &str) -> Vec<String> {
    let Ok(response) = http.get(format!("{base}/v1/leases/{lease}")).send().await else {
        return Vec::new();
    };
    let Ok(shown) = response.json::<serde_json::Value>().await else {
        return Vec::new();
    };
    if shown["holder"].is_null() {
        return Vec::new();
    }
    let public = serde_json::json!({
        "holder": shown["holder"],
        "token": shown["token"],
        "grant_index": shown["modify_index"],
    });
    let mut stolen = Vec::new();
    for call in ["renew", "release", "acquire"] {
        let mut body = public.clone();
        if let Some(fields) = body.as_object_mut() {
            match call {
                "renew" => {
                    fields.remove("grant_index");
                }
                "acquire" => {
                    fields.remove("grant_index");
                    fields.remove("token");
                    fields.insert("ttl_ms".into(), 1000.into());
                }
                _ => {}
            }
        }
        let answer = http
            .post(format!("{base}/v1/leases/{lease}/{call}"))
            .json(&body)
            .send()
            .await;
        let Ok(answer) = answer else { continue };
        if !answer.status().is_success() {
            continue;
        }
        let granted: serde_json::Value = answer.json().await.unwrap_or_default();
        if call == "acquire" && granted["token"] != shown["token"] {
            // The grant it saw had lapsed meanwhile and the lease was free:
            // this is a new grant (higher token, its own secret), which
            // anyone with the acquire right may take. Not a theft; give it
            // back so the workers are not held up.
            let release = serde_json::json!({
                "holder": granted["holder"],
                "token": granted["token"],
                "secret": granted["secret"],
                "grant_index": granted["grant_index"],
            });
            let _ = http
                .post(format!("{base}/v1/leases/{lease}/release"))
                .json(&release)
                .send()
                .await;
            continue;
        }
        stolen.push(format!("{call} {lease} as {}: {granted}", shown["holder"]));
    }
    stolen
}

/// Holds `lease`, queues `waiters` blocking acquirers on it (arriving 5 ms
/// apart), then releases it: each waiter, once granted, releases at once,
/// so the lease passes down the queue. A waiter answered 503 (leadership
/// moved: the queue is the old leader's) asks again, as the SDK does, until
/// its [`QUEUE_BUDGET`] is up. Each waiter's outcome: its token, or what it got instead.
async fn queue_through(
    http: &reqwest::Client,
    base: &str,
    lease: &str,
    waiters: usize,
) -> Vec<Result<u64, String>> {
    let acquire = format!("{base}/v1/leases/{lease}/acquire");
    let release = format!("{base}/v1/leases/{lease}/release");
    let gate = serde_json::json!({"holder": "gate", "ttl_ms": 10_000});
    let (status, gate) = support::post_json(http, &acquire, gate).await;
    assert_eq!(status, 200, "{gate}");
    let mut tasks = Vec::new();
    for i in 0..waiters {
        let (http, acquire, release) = (http.clone(), acquire.clone(), release.clone());
        tasks.push(tokio::spawn(async move {
            let holder = format!("waiter-{i}");
            let until = Instant::now() + QUEUE_BUDGET;
            let mut backoff = Duration::from_millis(50);
            let grant = loop {
                let left = until.saturating_duration_since(Instant::now());
                // The waiter's own secret, as the SDK sends one: an acquire
                // whose answer was lost after it committed (leadership
                // moved, a forward cut) and is asked again gets its grant
                // back instead of `held` by itself (seen in a soak: the
                // whole queue then waited on the stranded grant).
                let body = serde_json::json!({
                    "holder": holder, "ttl_ms": 60_000, "secret": support::test_secret(&holder),
                    "wait_ms": left.saturating_sub(Duration::from_secs(2)).as_millis() as u64,
                });
                let answer = http.post(&acquire).timeout(left).json(&body).send().await;
                let answer = answer.map_err(|e| e.to_string())?;
                let status = answer.status().as_u16();
                let grant: serde_json::Value = answer.json().await.unwrap_or_default();
                match status {
                    200 => break grant,
                    // Leadership moved (503), or the waiters went over the
                    // harness's share of seats — a follower forwards them
                    // over one connection, shared out per principal (429):
                    // asked again as the SDK does, backing off (doubling
                    // up to 1 s, with jitter) so 150 refused waiters do not
                    // load the machine the queue runs on.
                    503 | 429 if Instant::now() + Duration::from_secs(3) < until => {
                        let jitter = Duration::from_millis(rand::random::<u64>() % 50);
                        tokio::time::sleep(backoff + jitter).await;
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                    }
                    _ => return Err(format!("{status} {grant}")),
                }
            };
            let freed = serde_json::json!({
                "holder": holder, "token": grant["token"], "secret": grant["secret"],
            });
            let (status, body) = release_retrying(&http, &release, freed).await;
            if status != 200 {
                return Err(format!("{status} on release: {body}"));
            }
            Ok(grant["token"].as_u64().unwrap_or(0))
        }));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let freed =
        serde_json::json!({"holder": "gate", "token": gate["token"], "secret": gate["secret"]});
    let (status, body) = release_retrying(http, &release, freed).await;
    assert!(
        status == 200 || status == 409,
        "gate release: {status} {body}"
    );
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap_or_else(|e| Err(e.to_string())));
    }
    outcomes
}

/// A follower of `leader`, picked by the schedule.
fn follower(leader: u64, schedule: &mut Schedule) -> u64 {
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    followers[schedule.next(2) as usize]
}

/// Who holds `lease` now, as some node's applied state says.
/// Waits (at most 10 s) until both leases have had the same holder for
/// 1.5 s: the L2 kinds start from settled holders.
async fn settle(http: &reqwest::Client, cluster: &Cluster) {
    let mut since = Instant::now();
    let mut last: Vec<Option<String>> = Vec::new();
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        let mut now = Vec::new();
        for (lease, _) in ROLES.iter().step_by(2) {
            now.push(current_holder(http, cluster, lease).await);
        }
        if now != last || now.iter().any(Option::is_none) {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= Duration::from_millis(1500) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn current_holder(http: &reqwest::Client, cluster: &Cluster, lease: &str) -> Option<String> {
    // The first node that answers the lease (a node that has just rejoined
    // may answer 503 for a while: the next one is asked, as the SDK does).
    for url in cluster.urls() {
        let Ok(response) = http.get(format!("{url}/v1/leases/{lease}")).send().await else {
            continue;
        };
        if response.status() != reqwest::StatusCode::OK {
            continue;
        }
        if let Ok(body) = response.json::<serde_json::Value>().await {
            return body["holder"].as_str().map(str::to_owned);
        }
    }
    None
}

/// What every node answers about `lease` and itself, and the tail of the
/// boss's output: printed when a preemption misses its bound.
async fn why_not_preempted(
    http: &reqwest::Client,
    cluster: &Cluster,
    lease: &str,
    boss_output: &Path,
) -> String {
    // The history says how the preempted grant ended: `release` (its holder
    // was told, and let go), or `expire` (it was never told: the fault this
    // kind found in issue 42, read rounds failing under load).
    let paths = [
        format!("/v1/leases/{lease}"),
        format!("/v1/leases/{lease}/history"),
        "/v1/cluster".to_owned(),
    ];
    let mut why = format!("at {} ns (monotonic):", monotonic_ns());
    why.push_str(&node_answers(http, cluster, &paths).await);
    let output = std::fs::read_to_string(boss_output).unwrap_or_default();
    let tail: Vec<&str> = output.lines().rev().take(20).collect();
    why.push_str(&format!(
        "\n  the boss's last lines (newest first): {tail:?}"
    ));
    why
}

/// What every node answers to a GET of each of `paths`, a line each.
async fn node_answers(http: &reqwest::Client, cluster: &Cluster, paths: &[String]) -> String {
    let mut answers = String::new();
    for url in cluster.urls() {
        for path in paths {
            let answer = match http.get(format!("{url}{path}")).send().await {
                Ok(r) => format!("{} {}", r.status(), r.text().await.unwrap_or_default()),
                Err(err) => err.to_string(),
            };
            answers.push_str(&format!("\n  {url}{path}: {answer}"));
        }
    }
    answers
}

/// A release, asked again on 429 (over the harness's share of seats, which
/// the waiters' retries may fill) and 503 for up to 5 s, as the SDKs do.
async fn release_retrying(
    http: &reqwest::Client,
    url: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, answer) = support::post_json(http, url, body.clone()).await;
        if status != 429 || Instant::now() > until {
            return (status, answer);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The last warnings and errors each election node logged (its log in
/// `dir`), for a failure to say what the nodes saw.
fn log_tails(dir: &Path) -> String {
    let mut tails = String::new();
    for id in 1..=3 {
        let log = std::fs::read_to_string(dir.join(format!("election-{id}.log")));
        let log = log.unwrap_or_default();
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .collect();
        tails.push_str(&format!(
            "node {id}: last of {} warnings/errors:\n",
            lines.len()
        ));
        for line in &lines[lines.len().saturating_sub(12)..] {
            tails.push_str(&format!(
                "  {}\n",
                line.chars().take(400).collect::<String>()
            ));
        }
    }
    tails
}

/// When the worker whose stdout is `output` started its first campaign
/// (its "campaigning at <monotonic ns>" line), if it has.
fn campaign_start(output: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(output).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("campaigning at "))
        .and_then(|ns| ns.trim().parse().ok())
}

/// Prints what ran: per fault kind, how often, the slowest recovery after
/// the heal, and the longest stretch without a holder around the fault.
fn report(seed: u64, history: &History, kinds: &[&str], bounds: Bounds) {
    #[derive(Default)]
    struct Row {
        count: u32,
        slowest_ns: u64,
        longest_gap_ns: u64,
        interrupted: u32,
    }
    let mut table: BTreeMap<&str, Row> = kinds.iter().map(|k| (*k, Row::default())).collect();
    let leases = history.leases();
    let all_gaps: Vec<(u64, u64)> = leases.iter().flat_map(|l| gaps(history, l)).collect();
    for fault in &history.faults {
        let row = table.entry(fault.kind).or_default();
        row.count += 1;
        let window_end = fault.healed + bounds.recovery_ns;
        for (from, to) in &all_gaps {
            if *from < window_end && *to > fault.from {
                row.longest_gap_ns = row.longest_gap_ns.max(to - from);
            }
        }
    }
    for (fault, recovery) in recoveries(history, bounds.recovery_ns) {
        let row = table.entry(fault.kind).or_default();
        match recovery {
            Recovery::Within { after_ns, .. } | Recovery::Late { after_ns, .. } => {
                row.slowest_ns = row.slowest_ns.max(after_ns);
            }
            Recovery::Interrupted { .. } => row.interrupted += 1,
        }
    }
    eprintln!("fault suite: seed {seed}");
    eprintln!(
        "  {:<50} {:>5} {:>14} {:>14}",
        "fault", "count", "recovery ms", "longest gap ms"
    );
    for (kind, row) in table {
        let note = if row.interrupted > 0 {
            format!(" ({} cut short by the next fault)", row.interrupted)
        } else {
            String::new()
        };
        eprintln!(
            "  {kind:<50} {:>5} {:>14} {:>14}{note}",
            row.count,
            row.slowest_ns / 1_000_000,
            row.longest_gap_ns / 1_000_000
        );
    }
    eprintln!(
        "  {} grants, {} acknowledged writes, {} refused or failed writes, {} reads ({} failed)",
        history.held.len(),
        history.writes.iter().filter(|w| w.ok).count(),
        history.writes.iter().filter(|w| !w.ok).count(),
        history.reads.iter().filter(|r| r.ok).count(),
        history.reads.iter().filter(|r| !r.ok).count(),
    );
}

// The checker must catch what it is meant to catch.

const BOUNDS: Bounds = Bounds {
    max_gap_ns: 1_000,
    recovery_ns: 1_000,
};

fn held(lease: &str, holder: &str, token: u64, from: u64, to: u64) -> Held {
    Held {
        lease: lease.into(),
        holder: holder.into(),
        token,
        from,
        to,
    }
}

fn write(
    holder: &str,
    key: &str,
    seq: u64,
    token: u64,
    invoke: u64,
    complete: u64,
    ok: bool,
) -> Write {
    Write {
        lease: "l".into(),
        holder: holder.into(),
        key: key.into(),
        value: format!("{holder}-{seq}"),
        seq,
        token,
        invoke,
        complete,
        ok,
        error: (!ok).then(|| "unavailable: timed out".to_owned()),
        version: ok.then_some(invoke),
    }
}

fn good_history() -> History {
    History {
        held: vec![held("l", "a", 3, 0, 100), held("l", "b", 7, 150, 400)],
        writes: vec![
            write("a", "l/a", 1, 3, 10, 20, true),
            write("b", "l/b", 1, 7, 200, 210, true),
        ],
        reads: vec![
            read("l/a", None, 0, 5),
            read("l/a", Some("a-1"), 15, 25),
            read("l/a", Some("a-1"), 30, 40),
            read("l/b", Some("b-1"), 205, 215),
        ],
        faults: vec![Fault {
            kind: "test fault",
            from: 100,
            healed: 120,
        }],
        finals: [
            ("l/a".to_owned(), Some("a-1".to_owned())),
            ("l/b".to_owned(), Some("b-1".to_owned())),
        ]
        .into(),
    }
}

fn read(key: &str, value: Option<&str>, invoke: u64, complete: u64) -> Read {
    Read {
        key: key.into(),
        value: value.map(str::to_owned),
        invoke,
        complete,
        ok: true,
    }
}

#[test]
fn the_checker_passes_a_good_history() {
    assert_eq!(check(&good_history(), BOUNDS), Vec::<String>::new());
}

#[test]
fn the_checker_catches_two_overlapping_holders() {
    let mut history = good_history();
    history.held[1].from = 90;
    let violations = check(&history, BOUNDS);
    assert!(
        violations.iter().any(|v| v.starts_with("S3")),
        "{violations:?}"
    );
}

#[test]
fn the_checker_catches_a_stale_write_accepted() {
    let mut history = good_history();
    history.writes.push(write("a", "l/a", 2, 3, 300, 310, true));
    history.finals.insert("l/a".into(), Some("a-2".into()));
    let violations = check(&history, BOUNDS);
    assert!(
        violations.iter().any(|v| v.starts_with("S1")),
        "{violations:?}"
    );
}

#[test]
fn the_checker_catches_an_acknowledged_write_lost() {
    let mut history = good_history();
    history.finals.insert("l/b".into(), None);
    let violations = check(&history, BOUNDS);
    assert!(
        violations.iter().any(|v| v.starts_with("S4")),
        "{violations:?}"
    );
    // An older value is a loss too.
    let mut history = good_history();
    history.writes.push(write("b", "l/b", 2, 7, 220, 230, true));
    let violations = check(&history, BOUNDS);
    assert!(
        violations.iter().any(|v| v.starts_with("S4")),
        "{violations:?}"
    );
}

#[test]
fn the_checker_catches_a_token_granted_twice_or_going_down() {
    let mut history = good_history();
    history.held[1].token = 3;
    let violations = check(&history, BOUNDS);
    assert!(
        violations.iter().any(|v| v.starts_with("S2")),
        "{violations:?}"
    );
    let mut history = good_history();
    history.held[1].token = 2;
    let violations = check(&history, BOUNDS);
    assert!(
        violations.iter().any(|v| v.starts_with("S2")),
        "{violations:?}"
    );
}

#[test]
fn the_checker_catches_a_lease_left_without_holder() {
    let mut history = good_history();
    history.held[1].from = 5_000;
    history.held[1].to = 6_000;
    let violations = check(&history, BOUNDS);
    assert!(
        violations.iter().any(|v| v.starts_with("L1")),
        "{violations:?}"
    );
}

#[test]
fn the_checker_catches_a_non_linearizable_read() {
    // The write of a-1 completed at 20; a read invoked at 30 still sees the
    // key absent.
    let mut history = good_history();
    history.reads.push(read("l/a", None, 30, 35));
    let violations = check(&history, BOUNDS);
    assert!(
        violations
            .iter()
            .any(|v| v.starts_with("S4") && v.contains("linearizable")),
        "{violations:?}"
    );
}

#[test]
fn the_checker_catches_a_read_of_a_refused_write() {
    let mut history = good_history();
    let mut refused = write("a", "l/a", 2, 3, 300, 310, false);
    refused.error = Some("fenced: token 3 is below the fence 7".into());
    history.writes.push(refused);
    history.reads.push(read("l/a", Some("a-2"), 320, 330));
    let violations = check(&history, BOUNDS);
    assert!(
        violations
            .iter()
            .any(|v| v.starts_with("S4") && v.contains("a-2")),
        "{violations:?}"
    );
}

#[test]
fn the_checker_accepts_a_read_of_a_write_with_unknown_outcome() {
    let mut history = good_history();
    history
        .writes
        .push(write("b", "l/b", 2, 7, 300, 310, false));
    history.reads.push(read("l/b", Some("b-2"), 320, 330));
    history.finals.insert("l/b".into(), Some("b-2".into()));
    assert_eq!(check(&history, BOUNDS), Vec::<String>::new());
}

#[test]
fn the_checker_catches_a_late_recovery_after_a_fault() {
    // The fault healed at 120; lease l is next held from 150 (b), so a
    // bound of 20 ns is missed and one of 40 ns is met.
    let history = good_history();
    let tight = Bounds {
        max_gap_ns: 1_000,
        recovery_ns: 20,
    };
    let violations = check(&history, tight);
    assert!(
        violations
            .iter()
            .any(|v| v.starts_with("L1") && v.contains("healed")),
        "{violations:?}"
    );
    let loose = Bounds {
        max_gap_ns: 1_000,
        recovery_ns: 40,
    };
    assert_eq!(check(&history, loose), Vec::<String>::new());
}

#[test]
fn the_checker_catches_tokens_going_down_in_commit_order() {
    // Concurrent in real time (so only the gateway's order can tell), but
    // committed with versions 50 then 60 and tokens 7 then 3.
    let mut history = good_history();
    history.writes = vec![
        write("b", "l/b", 1, 7, 200, 300, true),
        write("a", "l/a", 1, 3, 210, 290, true),
    ];
    history.writes[0].version = Some(50);
    history.writes[1].version = Some(60);
    history.reads.clear();
    history.finals = [
        ("l/a".to_owned(), Some("a-1".to_owned())),
        ("l/b".to_owned(), Some("b-1".to_owned())),
    ]
    .into();
    let violations = check(&history, BOUNDS);
    assert!(
        violations
            .iter()
            .any(|v| v.starts_with("S1") && v.contains("committed")),
        "{violations:?}"
    );
    // The same with the versions the other way round is fine.
    history.writes[0].version = Some(60);
    history.writes[1].version = Some(50);
    assert_eq!(check(&history, BOUNDS), Vec::<String>::new());
}

#[test]
fn a_gap_across_chained_faults_is_bounded_by_the_last_heal() {
    // No holder from 100 to 150 — longer than a 30 ns gap bound — across
    // two faults (90..110 and 115..125): allowed only if it ends within
    // the recovery bound of the last heal (125).
    let mut history = good_history();
    history.faults = vec![
        Fault {
            kind: KILL_LEADER,
            from: 90,
            healed: 110,
        },
        Fault {
            kind: STOP_LEADER,
            from: 115,
            healed: 125,
        },
    ];
    let bounds = |recovery_ns| Bounds {
        max_gap_ns: 30,
        recovery_ns,
    };
    assert_eq!(check(&history, bounds(30)), Vec::<String>::new());
    let violations = check(&history, bounds(20));
    assert!(
        violations
            .iter()
            .any(|v| v.starts_with("L1") && v.contains("last of its faults")),
        "{violations:?}"
    );
    // With one fault only, the gap bound applies as before.
    history.faults.truncate(1);
    let violations = check(&history, bounds(1_000));
    assert!(
        violations
            .iter()
            .any(|v| v.starts_with("L1: l had no holder for")),
        "{violations:?}"
    );
}

#[test]
fn l2_catches_a_lease_lost_to_a_short_freeze_of_the_leader_and_nothing_else() {
    const RIDE: RideThrough = RideThrough {
        kinds: &["freeze"],
        budget_ns: 100,
        settled_ns: 50,
        after_ns: 30,
    };
    let fault = |kind: &'static str, from: u64, healed: u64| Fault { kind, from, healed };
    let history = |held: Vec<Held>, faults: Vec<Fault>| History {
        held,
        faults,
        ..History::default()
    };
    // Held from 0, a freeze 200..280: kept through it.
    let kept = history(
        vec![held("l", "a", 3, 0, 1_000)],
        vec![fault("freeze", 200, 280)],
    );
    assert_eq!(check_holders_ride_through(&kept, RIDE), (Vec::new(), 1));
    // Lost during it, or just after it healed: L2.
    for lost_at in [250, 300] {
        let lost = history(
            vec![held("l", "a", 3, 0, lost_at), held("l", "b", 9, 700, 1_000)],
            vec![fault("freeze", 200, 280)],
        );
        let (violations, _) = check_holders_ride_through(&lost, RIDE);
        assert!(
            violations.len() == 1 && violations[0].starts_with("L2: a lost l (token 3)"),
            "{violations:?}"
        );
    }
    // Not held to it: another kind, a freeze over the budget, one too soon
    // after the last fault or the grant, a loss long after it healed.
    let loose = [
        (vec![fault("kill", 200, 280)], 0, 250),
        (vec![fault("freeze", 200, 400)], 0, 250),
        (
            vec![fault("other", 100, 180), fault("freeze", 200, 280)],
            0,
            250,
        ),
        (vec![fault("freeze", 200, 280)], 180, 250),
        (vec![fault("freeze", 200, 280)], 0, 400),
    ];
    for (faults, from, to) in loose {
        let h = history(vec![held("l", "a", 3, from, to)], faults);
        assert!(
            check_holders_ride_through(&h, RIDE).0.is_empty(),
            "{:?}",
            h.faults
        );
    }
}
