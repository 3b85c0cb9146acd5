//! Real network partitions without touching the machine's network: the suite
//! moves its thread into a fresh network namespace (its own loopback, its own
//! empty iptables), gives each election node its own loopback address
//! (127.0.0.11-13, also the source of its peer connections), and cuts node
//! pairs with iptables DROP rules. Dropped packets are lost silently, as on a
//! real network: established connections hang until their deadlines, new ones
//! time out. Clients (workers, gateway, the harness) connect from 127.0.0.1,
//! which no rule touches, so they still reach every node — the minority side
//! of a partition is reachable and must refuse to grant.
//!
//! Everything the thread starts afterwards (the tokio runtime's threads, the
//! child processes) inherits the namespace; it disappears with them.

use std::process::Command;

/// Runs `test` on a two-thread tokio runtime inside a private network
/// namespace, the runtime built after entering it so its threads and
/// children share it; without one (not root) the test is skipped, unless
/// `PALISADE_FAULT_STRICT=1` makes that a failure. (The fault suite enters
/// its namespace itself: it runs without partitions instead of skipping.)
#[allow(dead_code)]
pub fn block_on_private(test: impl std::future::Future<Output = ()>) {
    if let Err(why) = enter_private() {
        assert!(
            std::env::var("PALISADE_FAULT_STRICT").as_deref() != Ok("1"),
            "PALISADE_FAULT_STRICT: no private network namespace: {why}"
        );
        eprintln!("SKIPPED: {why}");
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(test);
}

/// The loopback address of election node `id`.
pub fn node_host(id: u64) -> String {
    format!("127.0.0.{}", 10 + id)
}

/// Moves the calling thread into a new network namespace with loopback up,
/// and checks that iptables works there.
///
/// # Errors
/// Why partitions are not possible here (not root, no iptables, ...).
///
/// # Panics
/// If the namespace was entered but its loopback cannot be brought up.
pub fn enter_private() -> Result<(), String> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("unshare(CLONE_NEWNET): {e} (needs root)"))?;
    // Past this point the thread is in the new namespace for good: without
    // loopback nothing could run, so that is fatal, not a skip.
    if let Err(why) = run(&["ip", "link", "set", "lo", "up"]) {
        panic!("in a new network namespace but loopback is down: {why}");
    }
    run(&["iptables", "-w", "-F", "INPUT"])
}

fn run(argv: &[&str]) -> Result<(), String> {
    let output = Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .map_err(|e| format!("{}: {e}", argv[0]))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{argv:?} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Drops every packet between nodes `a` and `b`, both ways.
pub fn cut(a: u64, b: u64) {
    for (from, to) in [(a, b), (b, a)] {
        run(&[
            "iptables",
            "-w",
            "-A",
            "INPUT",
            "-s",
            &node_host(from),
            "-d",
            &node_host(to),
            "-j",
            "DROP",
        ])
        .expect("iptables cut");
    }
}

/// Removes every cut.
pub fn heal() {
    run(&["iptables", "-w", "-F", "INPUT"]).expect("iptables heal");
}
