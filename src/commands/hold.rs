//! [`HoldArgs`]: the lease a process holds while it works, as `palisade
//! run` and `palisade proxy` both take it.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use palisade_client::Lease;

use super::endpoints::Endpoints;

/// The lease a process holds while it works (`run` and `proxy`).
#[derive(Debug, Args)]
pub struct HoldArgs {
    /// The lease to hold.
    #[arg(long)]
    pub lease: String,
    /// Holder name (default: hostname-pid).
    #[arg(long)]
    holder: Option<String>,
    #[arg(long, default_value_t = 10_000)]
    ttl_ms: u64,
    /// How long to wait for the lease before giving up.
    #[arg(long, default_value_t = 60_000)]
    wait_ms: u64,
}

impl HoldArgs {
    /// Acquires the lease through `endpoints`; on failure, says why on
    /// stderr and gives the exit code.
    pub async fn acquire(&self, endpoints: &Endpoints) -> anyhow::Result<Result<Lease, ExitCode>> {
        let holder = self.holder.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/etc/hostname").unwrap_or_else(|_| "host".into());
            format!("{}-{}", host.trim(), std::process::id())
        });
        let acquired = endpoints
            .client()?
            .acquire(
                &self.lease,
                &holder,
                Duration::from_millis(self.ttl_ms),
                Some(Duration::from_millis(self.wait_ms)),
            )
            .await;
        Ok(acquired.map_err(|err| super::lease_view::fail_acquire(&err, &self.lease, &holder)))
    }
}
