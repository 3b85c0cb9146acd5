//! `palisade run --lease NAME -- CMD ARGS`: run a command only while holding a
//! lease (what `consul lock` offers, with fencing). The child gets
//! `PALISADE_LEASE`, `PALISADE_TOKEN` and `PALISADE_JWT`; when the lease is
//! lost it gets SIGTERM, then SIGKILL after a grace period. When the child
//! exits, the lease is released and its exit code becomes ours.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::lease::Endpoints;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The lease to hold while the command runs.
    #[arg(long)]
    lease: String,
    /// Holder name (default: hostname-pid).
    #[arg(long)]
    holder: Option<String>,
    #[arg(long, default_value_t = 10_000)]
    ttl_ms: u64,
    /// How long to wait for the lease before giving up.
    #[arg(long, default_value_t = 60_000)]
    wait_ms: u64,
    /// After SIGTERM, how long the child has before SIGKILL.
    #[arg(long, default_value_t = 2_000)]
    grace_ms: u64,
    #[command(flatten)]
    endpoints: Endpoints,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let holder = args.holder.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_else(|_| "host".into());
        format!("{}-{}", host.trim(), std::process::id())
    });
    let client = args.endpoints.client()?;
    let lease = match client
        .acquire(
            &args.lease,
            &holder,
            Duration::from_millis(args.ttl_ms),
            Some(Duration::from_millis(args.wait_ms)),
        )
        .await
    {
        Ok(lease) => lease,
        Err(err) => {
            eprintln!("error: {err}");
            return Ok(ExitCode::FAILURE);
        }
    };
    tracing::info!(lease = %args.lease, token = lease.token(), "lease held; starting the command");
    let mut child = tokio::process::Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("PALISADE_LEASE", &args.lease)
        .env("PALISADE_TOKEN", lease.token().to_string())
        .env("PALISADE_JWT", lease.jwt().unwrap_or_default())
        .kill_on_drop(true)
        .spawn()?;
    let shutdown = super::shutdown_signal();
    let stop_reason = tokio::select! {
        status = child.wait() => {
            let code = status?.code().unwrap_or(1);
            let _ = lease.release().await;
            return Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)));
        }
        () = lease.lost() => "lease lost",
        () = shutdown => "signal",
    };
    eprintln!("palisade run: {stop_reason}; stopping the command");
    if let Some(pid) = child.id() {
        let _ = tokio::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
    }
    if tokio::time::timeout(Duration::from_millis(args.grace_ms), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
    let _ = lease.release().await;
    Ok(ExitCode::from(if stop_reason == "lease lost" {
        3
    } else {
        0
    }))
}
