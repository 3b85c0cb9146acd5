//! One module per command group; the command line that picks one is
//! `cli.rs`. Commands stay thin: parse, build a config, call a library.

pub(crate) mod certs;
pub(crate) mod cluster;
pub(crate) mod dev;
pub(crate) mod dev_postgres;
pub(crate) mod dev_supervise;
pub(crate) mod election;
pub(crate) mod endpoints;
pub(crate) mod fence;
pub(crate) mod gateway;
pub(crate) mod health;
pub(crate) mod hold;
pub(crate) mod http;
pub(crate) mod lease;
pub(crate) mod lease_view;
pub(crate) mod lease_watch;
pub(crate) mod object;
pub(crate) mod policy;
pub(crate) mod prefix_watch;
pub(crate) mod proxy;
pub(crate) mod run;
pub(crate) mod sql;
pub(crate) mod worker;

/// `at_ms` as an absolute time and how long ago it was:
/// `2026-11-28T00:40:12.345Z (3.2 s ago)`.
pub(crate) fn when(at_ms: u64) -> String {
    format!(
        "{} ({})",
        palisade_names::time::rfc3339_ms(at_ms),
        seconds_ago(at_ms)
    )
}

/// How long ago `at_ms` (ms since the Unix epoch) was on this machine's
/// clock: `3.2 s ago`.
pub(crate) fn seconds_ago(at_ms: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    format!("{:.1} s ago", now.saturating_sub(at_ms) as f64 / 1000.0)
}

/// The first line of `file` (trimmed), for a secret given by file
/// (`what` names the flag in the error).
pub(crate) fn first_line_of(file: &std::path::Path, what: &str) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| anyhow::anyhow!("{what} {}: {e}", file.display()))?;
    let line = text.lines().next().unwrap_or("").trim();
    if line.is_empty() {
        anyhow::bail!("{what} {}: the file is empty", file.display());
    }
    Ok(line.to_owned())
}
