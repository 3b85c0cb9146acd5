//! `palisade worker`: a small leader that writes through the SDK — acquire
//! (waiting), then write an increasing sequence number to one key every
//! interval with the lease's token; on loss, say so and campaign again. It
//! exists to be paused, partitioned and killed in tests and demos.
//!
//! With `--history FILE` it appends one JSON line per event, timed on
//! CLOCK_MONOTONIC (nanoseconds, one clock for every process on the machine),
//! for the fault suite's checker: `held` intervals as the SDK reported them
//! (from the acquire's answer to the moment `is_held` turned false) and every
//! write with its invoke and complete times (and, if accepted, the version
//! the gateway gave it: versions follow the gateway's commit order). With
//! `--read-interval-ms` it also reads the key that often, whether or not it
//! holds the lease, and logs each read (invoke, complete, the value seen) for
//! the linearizability check.

use crate::output::say;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use palisade_plumbing::sync::lock;
use serde_json::json;
use tokio::time::Instant;

use super::endpoints::Endpoints;
use super::lease::TermsArgs;

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[arg(long)]
    lease: String,
    #[arg(long)]
    holder: String,
    /// The key to write (default: `{lease}/{holder}`).
    #[arg(long)]
    key: Option<String>,
    #[arg(long, default_value_t = 2_000)]
    ttl_ms: u64,
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    /// Also read the key this often, held or not (0: never).
    #[arg(long, default_value_t = 0)]
    read_interval_ms: u64,
    /// Append a JSON line per event to this file.
    #[arg(long)]
    history: Option<std::path::PathBuf>,
    #[command(flatten)]
    terms: TermsArgs,
    #[command(flatten)]
    endpoints: Endpoints,
}

/// CLOCK_MONOTONIC now, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (now.tv_sec as u64) * 1_000_000_000 + now.tv_nsec as u64
}

/// `instant` (tokio's clock) in CLOCK_MONOTONIC nanoseconds. The two are the
/// same clock unless something skews this process's view of time (the fault
/// suite runs one worker under libfaketime, whose tokio clock runs slow while
/// `monotonic_ns` reads the real clock): so the conversion goes through an
/// anchor taken at startup and the rate measured since, which is exactly 1
/// without skew and the skew's rate with it.
fn instant_ns(instant: Instant) -> u64 {
    static ANCHOR: std::sync::OnceLock<(Instant, u64)> = std::sync::OnceLock::new();
    let (instant0, real0) = *ANCHOR.get_or_init(|| (Instant::now(), monotonic_ns()));
    let (instant_now, real_now) = (Instant::now(), monotonic_ns());
    let elapsed = (instant_now - instant0).as_nanos() as f64;
    let rate = if elapsed >= 1e8 {
        real_now.saturating_sub(real0) as f64 / elapsed
    } else {
        1.0
    };
    let offset = if instant >= instant0 {
        (instant - instant0).as_nanos() as f64
    } else {
        -((instant0 - instant).as_nanos() as f64)
    };
    (real0 as f64 + offset * rate).max(0.0) as u64
}

/// The history file, shared by the writer loop and the reader task; one
/// `write` call per line, so lines never interleave.
struct History(Option<std::sync::Mutex<std::fs::File>>);

impl History {
    /// Appends to the file at `path`, if any (created if missing).
    fn open(path: Option<&std::path::Path>) -> std::io::Result<Self> {
        let file = match path {
            Some(path) => Some(std::sync::Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            )),
            None => None,
        };
        Ok(Self(file))
    }

    fn record(&self, event: serde_json::Value) {
        if let Some(file) = &self.0 {
            let line = format!("{event}\n");
            let mut file = lock(file);
            let _ = file.write_all(line.as_bytes());
        }
    }
}

/// Reads `key` every `interval` until the process ends, logging each read.
async fn read_loop(
    client: palisade_client::Client,
    key: String,
    interval: Duration,
    history: std::sync::Arc<History>,
) {
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        let invoke = monotonic_ns();
        let result = client.get_object(&key).await;
        let complete = monotonic_ns();
        let (ok, value) = match result {
            Ok(Some(object)) => (
                true,
                Some(String::from_utf8_lossy(&object.value).into_owned()),
            ),
            Ok(None) => (true, None),
            Err(_) => (false, None),
        };
        history.record(json!({
            "op": "read", "key": key, "value": value, "invoke": invoke, "complete": complete, "ok": ok,
        }));
    }
}

/// Stops the task when the worker returns.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub async fn run(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let client = args.endpoints.client()?;
    let key = args
        .key
        .clone()
        .unwrap_or_else(|| format!("{}/{}", args.lease, args.holder));
    let history = std::sync::Arc::new(History::open(args.history.as_deref())?);
    let _reader = (args.read_interval_ms > 0).then(|| {
        AbortOnDrop(tokio::spawn(read_loop(
            client.clone(),
            key.clone(),
            Duration::from_millis(args.read_interval_ms),
            history.clone(),
        )))
    });
    instant_ns(Instant::now()); // the anchor of the clock conversion
    let shutdown = crate::shutdown::shutdown_signal();
    tokio::pin!(shutdown);
    let mut sequence = 0u64;
    loop {
        // When the campaign started, on the histories' clock (a late
        // start explains a late grant).
        say!("campaigning at {}", monotonic_ns());
        let acquired = tokio::select! {
            () = &mut shutdown => return Ok(ExitCode::SUCCESS),
            acquired = client.acquire_with(&args.lease, &args.holder, Duration::from_millis(args.ttl_ms), Some(Duration::from_secs(30)), args.terms.options()) => acquired,
        };
        let lease = match acquired {
            Ok(lease) => lease,
            Err(err) => {
                say!("campaign failed: {err}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let held_from = monotonic_ns();
        let token = lease.token();
        say!("leading token={token}");
        let mut tick = tokio::time::interval(Duration::from_millis(args.interval_ms));
        let reason = loop {
            tokio::select! {
                () = &mut shutdown => {
                    let held_to = monotonic_ns().min(instant_ns(lease.deadline()));
                    history.record(json!({"op": "held", "lease": args.lease, "holder": args.holder, "token": token, "from": held_from, "to": held_to}));
                    let _ = lease.release().await;
                    return Ok(ExitCode::SUCCESS);
                }
                () = lease.lost() => break "lost".to_owned(),
                _ = tick.tick() => {}
            }
            sequence += 1;
            let value = format!("{} seq={sequence} token={token}", args.holder);
            let invoke = monotonic_ns();
            let result = lease.put(&key, value.clone()).await;
            let complete = monotonic_ns();
            let (ok, error, version) = match &result {
                Ok(written) => (true, None, Some(written.version)),
                Err(err) => (false, Some(err.to_string()), None),
            };
            history.record(json!({
                "op": "write", "lease": args.lease, "holder": args.holder, "key": key, "value": value,
                "seq": sequence, "token": token, "invoke": invoke, "complete": complete, "ok": ok, "error": error,
                "version": version,
            }));
            match result {
                Ok(_) => say!("wrote seq={sequence} token={token}"),
                Err(err) if err.is_lease_lost() => break err.to_string(),
                Err(err) => say!("write failed: {err}"),
            }
        };
        // `is_held` turned false at the earlier of the deadline and the
        // moment the loss was noticed.
        let held_to = monotonic_ns().min(instant_ns(lease.deadline()));
        history.record(json!({"op": "held", "lease": args.lease, "holder": args.holder, "token": token, "from": held_from, "to": held_to}));
        say!("lost token={token}: {reason}");
    }
}
