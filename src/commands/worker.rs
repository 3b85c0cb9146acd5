//! `palisade worker`: a small leader that writes through the SDK — acquire
//! (waiting), then write an increasing sequence number to one key every
//! interval with the lease's token; on loss, say so and campaign again. It
//! exists to be paused, partitioned and killed in tests and demos.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::lease::Endpoints;

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[arg(long)]
    lease: String,
    #[arg(long)]
    holder: String,
    /// The key to write (default: `{lease}/worker`).
    #[arg(long)]
    key: Option<String>,
    #[arg(long, default_value_t = 2_000)]
    ttl_ms: u64,
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    #[command(flatten)]
    endpoints: Endpoints,
}

pub async fn run(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let client = args.endpoints.client();
    let key = args
        .key
        .clone()
        .unwrap_or_else(|| format!("{}/worker", args.lease));
    let shutdown = super::shutdown_signal();
    tokio::pin!(shutdown);
    let mut sequence = 0u64;
    loop {
        let acquired = tokio::select! {
            () = &mut shutdown => return Ok(ExitCode::SUCCESS),
            acquired = client.acquire(&args.lease, &args.holder, Duration::from_millis(args.ttl_ms), Some(Duration::from_secs(30))) => acquired,
        };
        let lease = match acquired {
            Ok(lease) => lease,
            Err(err) => {
                println!("campaign failed: {err}");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        println!("leading token={}", lease.token());
        let mut tick = tokio::time::interval(Duration::from_millis(args.interval_ms));
        loop {
            tokio::select! {
                () = &mut shutdown => {
                    let _ = lease.release().await;
                    return Ok(ExitCode::SUCCESS);
                }
                _ = tick.tick() => {}
            }
            sequence += 1;
            let value = format!("{} seq={sequence} token={}", args.holder, lease.token());
            match lease.put(&key, value).await {
                Ok(_) => println!("wrote seq={sequence} token={}", lease.token()),
                Err(err) if err.is_lease_lost() => {
                    println!("lost token={}: {err}", lease.token());
                    break;
                }
                Err(err) => println!("write failed: {err}"),
            }
        }
    }
}
