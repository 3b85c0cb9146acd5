//! `palisade run --lease NAME -- CMD ARGS`: run a command only while holding a
//! lease (what `consul lock` offers, with fencing). The child gets
//! `PALISADE_LEASE`, `PALISADE_TOKEN`, `PALISADE_JWT` (the JWT at start) and
//! `PALISADE_JWT_FILE`: a file (0600, in a private directory) that always
//! holds the current JWT — rewritten, by rename, whenever a renewal brings a
//! new one — so a child writing for longer than a ttl reads it from there.
//! With a gateway, the child also gets `PALISADE_PROXY`: the URL of a
//! loopback sidecar (`proxy.rs`) that writes objects under the lease with
//! the current JWT and refuses them (409) once the lease is lost.
//! When the lease is lost the file is emptied and the child gets SIGTERM,
//! then SIGKILL after a grace period. When the child exits, the lease is
//! released and its exit code becomes ours.

use crate::output::complain;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use clap::Args;

use super::endpoints::Endpoints;
use super::hold::HoldArgs;

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    hold: HoldArgs,
    /// After SIGTERM, how long the child has before SIGKILL.
    #[arg(long, default_value_t = 2_000)]
    grace_ms: u64,
    /// Where the sidecar listens (with a gateway; loopback only). The child
    /// gets its URL in PALISADE_PROXY.
    #[arg(long, default_value = "127.0.0.1:0")]
    proxy_listen: std::net::SocketAddr,
    #[command(flatten)]
    endpoints: Endpoints,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let lease = match args.hold.acquire(&args.endpoints).await? {
        Ok(lease) => lease,
        Err(code) => return Ok(code),
    };
    // Listening from here on: a signal before the child started still
    // stops it and releases the lease (the default action would not).
    let shutdown = crate::shutdown::shutdown_signal();
    let mut shutdown = std::pin::pin!(shutdown);
    tracing::info!(lease = %args.hold.lease, token = lease.token(), "lease held; starting the command");
    let jwt_dir = private_dir()?;
    let jwt_file = jwt_dir.path().join("lease.jwt");
    let mut current = lease.jwt().unwrap_or_default();
    write_atomically(&jwt_file, &current)?;
    let lease = std::sync::Arc::new(lease);
    let mut command = tokio::process::Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("PALISADE_LEASE", &args.hold.lease)
        .env("PALISADE_TOKEN", lease.token().to_string())
        .env("PALISADE_JWT", &current)
        .env("PALISADE_JWT_FILE", &jwt_file)
        .kill_on_drop(true);
    let proxy = if args.endpoints.gateway.is_some() {
        let (addr, server) = super::proxy::start(lease.clone(), args.proxy_listen).await?;
        command.env("PALISADE_PROXY", format!("http://{addr}"));
        Some(server)
    } else {
        None
    };
    // Stops the sidecar and releases the lease (the sidecar's open
    // connections may still hold the handle).
    let release = |lease: std::sync::Arc<palisade_client::Lease>| async move {
        if let Some(proxy) = proxy {
            proxy.abort();
            let _ = proxy.await;
        }
        let _ = lease.release_shared().await;
    };
    let mut child = command.spawn()?;
    // Renewals never wait on the child: the file is refreshed on a short
    // tick (a renewal brings a new JWT about every ttl).
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let stop_reason = loop {
        tokio::select! {
            status = child.wait() => {
                let code = status?.code().unwrap_or(1);
                release(lease).await;
                return Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)));
            }
            () = lease.lost() => break "lease lost",
            () = &mut shutdown => break "signal",
            _ = tick.tick() => {
                if let Some(jwt) = lease.jwt().filter(|jwt| *jwt != current) {
                    if let Err(err) = write_atomically(&jwt_file, &jwt) {
                        tracing::warn!(%err, "cannot refresh the JWT file");
                    }
                    current = jwt;
                }
            }
        }
    };
    // The child must not pick up a JWT for a lease it no longer holds.
    let _ = write_atomically(&jwt_file, "");
    complain!("palisade run: {stop_reason}; stopping the command");
    stop_child(&mut child, Duration::from_millis(args.grace_ms)).await;
    release(lease).await;
    Ok(ExitCode::from(if stop_reason == "lease lost" {
        crate::exit::LOST
    } else {
        0
    }))
}

/// Sends the child SIGTERM, then SIGKILL if it has not exited within `grace`.
async fn stop_child(child: &mut tokio::process::Child, grace: Duration) {
    if let Some(pid) = child.id() {
        let _ = tokio::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

/// A directory only this user can read (removed when dropped).
fn private_dir() -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new()
        .prefix("palisade-run-")
        .tempdir()
        .context("cannot create a directory for the JWT file")?;
    set_mode(dir.path(), 0o700)?;
    Ok(dir)
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))
}

/// Replaces `path`'s contents with `jwt` in one step (write a sibling, 0600,
/// then rename), so a reader sees the old JWT or the new one, never half.
fn write_atomically(path: &Path, jwt: &str) -> anyhow::Result<()> {
    let staging: PathBuf = path.with_extension("new");
    std::fs::write(&staging, jwt).with_context(|| format!("cannot write {}", staging.display()))?;
    set_mode(&staging, 0o600)?;
    std::fs::rename(&staging, path).with_context(|| format!("cannot replace {}", path.display()))
}
