//! What a run's processes hold over time, so that a soak shows whether
//! memory or disk grows: every [`EVERY`], the resident memory of each
//! process started for the run (found by its command line naming the run's
//! directory) and the disk its data directory takes (allocated blocks).
//! Processes are named by role, not pid, so a node restarted by a fault
//! stays one row: `node node1`, `gateway gateway`, `worker w1`,
//! `postgres data` (PostgreSQL's processes summed), `lazyfs election-2`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use palisade_client::CancellationToken;

const EVERY: Duration = Duration::from_secs(10);

/// One process (or group) at one moment.
#[derive(Clone, Copy, Default)]
struct Usage {
    rss_kib: u64,
    /// Its data directory's allocated size, if it names one.
    disk_kib: Option<u64>,
}

type Samples = Vec<(Duration, BTreeMap<String, Usage>)>;

/// Samples in the background until [`Sampler::report`], or until dropped
/// (a run that panics still prints what it sampled).
pub struct Sampler {
    samples: Arc<Mutex<Samples>>,
    stop: CancellationToken,
}

impl Drop for Sampler {
    fn drop(&mut self) {
        if !self.stop.is_cancelled() {
            self.print();
        }
    }
}

impl Sampler {
    pub fn start(run_dir: &Path) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let (dir, into, until) = (run_dir.to_owned(), samples.clone(), stop.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            loop {
                let dir = dir.clone();
                // Off the runtime: a data dir on a lazyfs mount being cut
                // may answer slowly.
                let Ok(sample) = tokio::task::spawn_blocking(move || sample(&dir)).await else {
                    return;
                };
                into.lock()
                    .expect("samples")
                    .push((started.elapsed(), sample));
                tokio::select! {
                    _ = until.cancelled() => return,
                    _ = tokio::time::sleep(EVERY) => {}
                }
            }
        });
        Self { samples, stop }
    }

    /// Stops sampling and prints, per process, its memory and disk at
    /// each tenth of the run and at their peak, so a trend shows (a
    /// process seen in fewer than three samples, like a short-lived boss,
    /// is left out).
    pub fn report(self) {
        self.print();
    }

    fn print(&self) {
        self.stop.cancel();
        let samples = match self.samples.lock() {
            Ok(samples) => samples.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        let Some((end, _)) = samples.last() else {
            return;
        };
        let labels: std::collections::BTreeSet<&String> =
            samples.iter().flat_map(|(_, s)| s.keys()).collect();
        eprintln!(
            "fault suite: resources over {} s, {} samples (MiB at 0, 10, .., 100% of the run; peak)",
            end.as_secs(),
            samples.len()
        );
        for label in labels {
            let seen: Vec<(Duration, Usage)> = samples
                .iter()
                .filter_map(|(at, s)| s.get(label).map(|u| (*at, *u)))
                .collect();
            if seen.len() < 3 {
                continue;
            }
            let rss = series(&seen, *end, |u| Some(u.rss_kib));
            eprintln!("  {label:<28} rss  {rss}");
            let disk = series(&seen, *end, |u| u.disk_kib);
            if !disk.is_empty() {
                eprintln!("  {:<28} disk {disk}", "");
            }
        }
    }
}

/// A figure at each tenth of the run (its first sample at or after each
/// mark) and its peak, in MiB; empty if never measured.
fn series(seen: &[(Duration, Usage)], end: Duration, figure: fn(&Usage) -> Option<u64>) -> String {
    let values: Vec<(Duration, u64)> = seen
        .iter()
        .filter_map(|(at, u)| figure(u).map(|v| (*at, v)))
        .collect();
    let Some(peak) = values.iter().map(|(_, v)| *v).max() else {
        return String::new();
    };
    let mib = |kib: u64| format!("{:.0}", kib as f64 / 1024.0);
    let marks: Vec<String> = (0..=10)
        .filter_map(|tenth| {
            let mark = end * tenth / 10;
            let value = values.iter().find(|(at, _)| *at >= mark).or(values.last());
            value.map(|(_, v)| mib(*v))
        })
        .collect();
    format!("{} | peak {}", marks.join(" "), mib(peak))
}

/// Every process whose command line names `run_dir`, by role.
fn sample(run_dir: &Path) -> BTreeMap<String, Usage> {
    let needle = run_dir.to_string_lossy().into_owned();
    let mut usage: BTreeMap<String, Usage> = BTreeMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return usage;
    };
    for entry in procs.flatten() {
        let path = entry.path();
        let Ok(cmdline) = std::fs::read(path.join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if !args.iter().any(|a| a.contains(&needle)) {
            continue;
        }
        let Some(rss_kib) = rss_kib(&path) else {
            continue; // gone, or a zombie
        };
        let (label, data_dir) = role(&args, run_dir);
        let entry = usage.entry(label).or_default();
        entry.rss_kib += rss_kib;
        if entry.disk_kib.is_none() {
            entry.disk_kib = data_dir.map(|d| allocated_kib(&d));
        }
    }
    usage
}

/// `VmRSS` of a process, in KiB.
fn rss_kib(proc_dir: &Path) -> Option<u64> {
    let status = std::fs::read_to_string(proc_dir.join("status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A process's row name and data directory: `palisade <command>` named by
/// its data dir (relative to the run's), holder or listen address; any
/// other program by its binary and the directory it is given (`-D`).
fn role(args: &[String], run_dir: &Path) -> (String, Option<PathBuf>) {
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    let binary = Path::new(&args[0])
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let data_dir = value("--data-dir").or(value("-D")).map(PathBuf::from);
    let name = match &data_dir {
        Some(dir) => dir
            .strip_prefix(run_dir)
            .unwrap_or(dir)
            .display()
            .to_string(),
        None => value("--holder")
            .or(value("--listen"))
            .cloned()
            .unwrap_or_default(),
    };
    let what = match binary.as_str() {
        "palisade" => args.get(1).cloned().unwrap_or_default(),
        other => other.to_owned(),
    };
    (format!("{what} {name}").trim().to_owned(), data_dir)
}

/// The blocks allocated under `dir`, in KiB (files that vanish while it is
/// walked are skipped).
fn allocated_kib(dir: &Path) -> u64 {
    let mut total = 0;
    each_file(dir, |_, kib| total += kib);
    total
}

/// Calls `f` with the path and allocated KiB of every file under `dir`
/// (files that vanish while it is walked are skipped).
fn each_file(dir: &Path, mut f: impl FnMut(&Path, u64)) {
    use std::os::unix::fs::MetadataExt;
    let mut stack = vec![dir.to_owned()];
    while let Some(at) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&at) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                f(&entry.path(), meta.blocks() / 2);
            }
        }
    }
}

/// The `n` largest files under `dir` (allocated KiB, path relative to
/// `dir`), largest first: what a growing data dir is made of.
pub fn largest_files(dir: &Path, n: usize) -> Vec<(u64, String)> {
    let mut files = Vec::new();
    each_file(dir, |path, kib| {
        let name = path.strip_prefix(dir).unwrap_or(path);
        files.push((kib, name.display().to_string()));
    });
    files.sort_unstable_by(|a, b| b.cmp(a));
    files.truncate(n);
    files
}
