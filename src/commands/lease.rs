//! `palisade lease ...`, on the SDK: one function per subcommand. How
//! they print is `lease_view.rs`; `lease watch` is `lease_watch.rs` (one
//! lease) and `prefix_watch.rs` (a prefix); the endpoints every client
//! command takes are `endpoints.rs`.

use crate::output::{complain, say};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use palisade_client::{AcquireOptions, Client, Error, GrantId, GrantSecret};
use serde_json::json;

use super::endpoints::Endpoints;
use super::lease_view::{
    describe, describe_history, fail, fail_acquire, info_json, print, print_grant,
    print_grant_fenced,
};

#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// Acquire a lease; prints the grant (token and JWT).
    Acquire {
        lease: String,
        #[arg(long)]
        holder: String,
        #[arg(long, default_value_t = 10_000)]
        ttl_ms: u64,
        /// Wait up to this long for the lease to be free.
        #[arg(long)]
        wait_ms: Option<u64>,
        /// Keep holding: renew in the background and print a status line
        /// every --status-ms until the lease is lost or Ctrl-C (then release).
        #[arg(long)]
        hold: bool,
        #[arg(long, default_value_t = 100)]
        status_ms: u64,
        #[command(flatten)]
        terms: TermsArgs,
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Hand a grant to a named successor (with the secret `lease acquire`
    /// printed): it ends now, and the successor's acquire takes the lease
    /// with a higher token within 10 s; nobody else can in between.
    Handover {
        #[command(flatten)]
        grant: GrantArgs,
        /// The successor's holder name.
        #[arg(long)]
        to: String,
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Renew a grant once (with the secret `lease acquire` printed).
    Renew {
        #[command(flatten)]
        grant: GrantArgs,
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Release a grant (with the secret `lease acquire` printed).
    Release {
        #[command(flatten)]
        grant: GrantArgs,
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Revoke a grant without its secret (an operator's call): renewals stop
    /// at once and the lease is free once its current deadline passes.
    Revoke {
        lease: String,
        #[arg(long)]
        token: u64,
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Show one lease.
    Get {
        lease: String,
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Show a lease's last transitions, oldest first: who got or lost it,
    /// why (acquire, claim, handover, release, expire, preempt, revoke), when.
    History {
        lease: String,
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// List every lease, or those whose name starts with --prefix.
    List {
        /// Only leases whose name starts with this (under a policy, a
        /// principal may list only a prefix inside its rights).
        #[arg(long, default_value = "")]
        prefix: String,
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Print the lease every time it changes, until Ctrl-C. A lease never
    /// granted is waited for (as etcd and Consul watches wait for a key):
    /// stderr says so at once, and its first grant is printed. With
    /// --prefix instead of a lease: every lease under the prefix as it is
    /// now, then every change to one, over one stream (`GET /v1/watch`).
    Watch {
        #[arg(required_unless_present = "prefix", conflicts_with = "prefix")]
        lease: Option<String>,
        /// Watch every lease whose name starts with this ("" for all).
        #[arg(long)]
        prefix: Option<String>,
        /// With --prefix: only changes after this log index (0: every
        /// lease under the prefix first); with several partitions, one
        /// index per partition, `I0,I1,...` (as a warning on resume
        /// prints them).
        #[arg(long, default_value = "0", requires = "prefix")]
        index: String,
        #[command(flatten)]
        endpoints: Endpoints,
    },
}

/// What an acquire may ask for beyond holder and ttl.
#[derive(Debug, Args)]
pub struct TermsArgs {
    /// 0..=1000: a waiting acquire of a higher priority preempts a
    /// preemptible holder.
    #[arg(long, default_value_t = 0)]
    priority: u32,
    /// A higher priority may preempt this grant.
    #[arg(long)]
    preemptible: bool,
    /// After this grant expires (not after a release) the lease stays
    /// unavailable this long.
    #[arg(long, default_value_t = 0)]
    lock_delay_ms: u64,
    /// Renew this grant for at most this long.
    #[arg(long)]
    max_hold_ms: Option<u64>,
}

impl TermsArgs {
    pub fn options(&self) -> AcquireOptions {
        AcquireOptions {
            priority: self.priority,
            preemptible: self.preemptible,
            lock_delay: Duration::from_millis(self.lock_delay_ms),
            max_hold: self.max_hold_ms.map(Duration::from_millis),
        }
    }
}

/// Names one grant: what `lease acquire` printed.
#[derive(Debug, Args)]
pub struct GrantArgs {
    lease: String,
    #[arg(long)]
    holder: String,
    #[arg(long)]
    token: u64,
    /// The grant's secret (`lease acquire` prints it; env PALISADE_SECRET).
    #[arg(long, env = "PALISADE_SECRET", hide_env_values = true, value_parser = parse_secret)]
    secret: GrantSecret,
    /// The acquire's grant index (release only; as printed by acquire).
    #[arg(long)]
    grant_index: Option<u64>,
}

fn parse_secret(text: &str) -> Result<GrantSecret, String> {
    GrantSecret::new(text).map_err(|e| e.to_string())
}

impl GrantArgs {
    fn id(&self) -> GrantId {
        GrantId {
            lease: self.lease.clone(),
            holder: self.holder.clone(),
            token: self.token,
            grant_index: self.grant_index,
            secret: Some(self.secret.clone()),
        }
    }
}

/// As [`fail`], for a release of `grant` refused as not current: when the
/// lease is held by that holder and token after all, the grant index is
/// what did not match, and that is said.
async fn fail_release(err: &Error, client: &Client, grant: &GrantArgs) -> ExitCode {
    complain!("error: {err}");
    let (Error::LeaseLost(_), Some(index)) = (err, grant.grant_index) else {
        return crate::exit::of(err);
    };
    let Ok(info) = client.get(&grant.lease).await else {
        return crate::exit::of(err);
    };
    if info.holder.as_deref() == Some(grant.holder.as_str()) && info.token == grant.token {
        complain!(
            "hint: {} does hold {} with token {}, but not from the acquire with grant index \
             {index}: --grant-index is the `grant_index` its acquire printed, not the token \
             (they differ after a handover or a repeated acquire), and a release naming \
             another acquire frees nothing. Give the acquire's grant_index, or leave \
             --grant-index out",
            grant.holder,
            grant.lease,
            grant.token
        );
    }
    crate::exit::of(err)
}

pub async fn run(command: LeaseCommand) -> anyhow::Result<ExitCode> {
    match command {
        LeaseCommand::Acquire {
            lease,
            holder,
            ttl_ms,
            wait_ms,
            hold,
            status_ms,
            terms,
            endpoints,
        } => {
            let asked = Asked {
                lease: &lease,
                holder: &holder,
                ttl: Duration::from_millis(ttl_ms),
                wait: wait_ms.map(Duration::from_millis),
                options: terms.options(),
            };
            if hold {
                acquire_and_hold(&asked, status_ms, &endpoints).await
            } else {
                acquire(&asked, &endpoints).await
            }
        }
        LeaseCommand::Renew { grant, endpoints } => renew(&grant, &endpoints).await,
        LeaseCommand::Handover {
            grant,
            to,
            endpoints,
        } => handover(&grant, &to, &endpoints).await,
        LeaseCommand::Release { grant, endpoints } => release(&grant, &endpoints).await,
        LeaseCommand::Revoke {
            lease,
            token,
            endpoints,
        } => revoke(&lease, token, &endpoints).await,
        LeaseCommand::Get { lease, endpoints } => get(&lease, &endpoints).await,
        LeaseCommand::History { lease, endpoints } => history(&lease, &endpoints).await,
        LeaseCommand::List { prefix, endpoints } => list(&prefix, &endpoints).await,
        LeaseCommand::Watch {
            lease,
            prefix,
            index,
            endpoints,
        } => match (lease, prefix) {
            (_, Some(prefix)) => super::prefix_watch::run(&prefix, &index, &endpoints).await,
            (Some(lease), None) => super::lease_watch::watch(&lease, &endpoints).await,
            (None, None) => anyhow::bail!("name a lease, or --prefix"),
        },
    }
}

/// What `lease acquire` asks for.
struct Asked<'a> {
    lease: &'a str,
    holder: &'a str,
    ttl: Duration,
    wait: Option<Duration>,
    options: AcquireOptions,
}

/// `lease acquire`: prints the grant, which this process then forgets.
async fn acquire(asked: &Asked<'_>, endpoints: &Endpoints) -> anyhow::Result<ExitCode> {
    let client = endpoints.client()?;
    let granted = client
        .acquire_grant_with(
            asked.lease,
            asked.holder,
            asked.ttl,
            asked.wait,
            asked.options,
        )
        .await;
    Ok(match granted {
        Ok(grant) => {
            // A gateway named: its fence is raised to the new token at once,
            // so an earlier holder's late write is refused from now on (as
            // `--hold`, `run`, `proxy` and the SDKs do). A grant whose fence
            // could not be raised is still printed, with why.
            let fence = match endpoints.gateway {
                Some(_) => Some(client.fence_grant(&grant).await),
                None => None,
            };
            print_grant_fenced(endpoints.json, &grant, "granted", fence.as_ref());
            if let Some(Err(err)) = &fence {
                complain!(
                    "granted, but the gateway fence was not raised ({err}): an earlier holder's \
                     late write is not refused until `palisade fence bump` or this holder's \
                     first write"
                );
            }
            ExitCode::SUCCESS
        }
        Err(err) => fail_acquire(&err, asked.lease, asked.holder),
    })
}

/// `lease acquire --hold`: holds the lease (renewing it) and prints its
/// status every `status_ms` until it is lost (exit 3) or a signal releases
/// it.
async fn acquire_and_hold(
    asked: &Asked<'_>,
    status_ms: u64,
    endpoints: &Endpoints,
) -> anyhow::Result<ExitCode> {
    let client = endpoints.client()?;
    // Listening before "held" is printed: a SIGTERM right after it releases
    // the lease (the default action would kill the process holding it).
    let shutdown = crate::shutdown::shutdown_signal();
    tokio::pin!(shutdown);
    let acquired = tokio::select! {
        acquired = client.acquire_with(
            asked.lease,
            asked.holder,
            asked.ttl,
            asked.wait,
            asked.options,
        ) => acquired,
        () = &mut shutdown => {
            complain!("stopped while waiting for {}", asked.lease);
            return Ok(ExitCode::from(130));
        }
    };
    let held = match acquired {
        Ok(held) => held,
        Err(err) => return Ok(fail_acquire(&err, asked.lease, asked.holder)),
    };
    say!(
        "held {} token={} jwt={}",
        held.name(),
        held.token(),
        held.jwt().unwrap_or_default()
    );
    let mut status = tokio::time::interval(Duration::from_millis(status_ms.max(10)));
    loop {
        tokio::select! {
            _ = status.tick() => {
                say!("status held={} token={}", held.is_held(), held.token());
            }
            () = held.lost() => {
                say!("lost token={}", held.token());
                return Ok(ExitCode::from(crate::exit::LOST));
            }
            () = &mut shutdown => {
                let token = held.token();
                return Ok(match held.release().await {
                    Ok(()) => { say!("released token={token}"); ExitCode::SUCCESS }
                    Err(err) => fail(&err),
                });
            }
        }
    }
}

async fn renew(grant: &GrantArgs, endpoints: &Endpoints) -> anyhow::Result<ExitCode> {
    Ok(match endpoints.client()?.renew_grant(&grant.id()).await {
        Ok(renewed) => {
            print_grant(endpoints.json, &renewed, "renewed");
            ExitCode::SUCCESS
        }
        Err(err) => fail(&err),
    })
}

async fn handover(grant: &GrantArgs, to: &str, endpoints: &Endpoints) -> anyhow::Result<ExitCode> {
    Ok(
        match endpoints.client()?.handover_grant(&grant.id(), to).await {
            Ok(token) => {
                let lease = &grant.lease;
                print(
                    endpoints.json,
                    &json!({ "lease": lease, "to": to, "token": token }),
                    format!("handed {lease} to {to} (its token {token})"),
                );
                ExitCode::SUCCESS
            }
            Err(err) => fail(&err),
        },
    )
}

async fn release(grant: &GrantArgs, endpoints: &Endpoints) -> anyhow::Result<ExitCode> {
    let client = endpoints.client()?;
    Ok(match client.release_grant(&grant.id()).await {
        Ok(()) => {
            let (lease, token) = (&grant.lease, grant.token);
            print(
                endpoints.json,
                &json!({ "lease": lease, "released": true, "token": token }),
                format!("released {lease} (token {token})"),
            );
            ExitCode::SUCCESS
        }
        Err(err) => fail_release(&err, &client, grant).await,
    })
}

async fn revoke(lease: &str, token: u64, endpoints: &Endpoints) -> anyhow::Result<ExitCode> {
    Ok(match endpoints.client()?.revoke(lease, token).await {
        Ok(()) => {
            print(
                endpoints.json,
                &json!({ "lease": lease, "revoked": true, "token": token }),
                format!("revoked {lease} (token {token}); it ends at its deadline"),
            );
            ExitCode::SUCCESS
        }
        Err(err) => fail(&err),
    })
}

async fn get(lease: &str, endpoints: &Endpoints) -> anyhow::Result<ExitCode> {
    Ok(match endpoints.client()?.get(lease).await {
        Ok(info) => {
            print(endpoints.json, &info_json(&info), describe(&info));
            ExitCode::SUCCESS
        }
        Err(err) => fail(&err),
    })
}

async fn history(lease: &str, endpoints: &Endpoints) -> anyhow::Result<ExitCode> {
    Ok(match endpoints.client()?.history(lease).await {
        Ok(history) => {
            let value = json!({ "lease": lease, "history": history });
            print(endpoints.json, &value, describe_history(lease, &history));
            ExitCode::SUCCESS
        }
        Err(err) => fail(&err),
    })
}

async fn list(prefix: &str, endpoints: &Endpoints) -> anyhow::Result<ExitCode> {
    Ok(match endpoints.client()?.list_prefix(prefix).await {
        Ok(leases) => {
            if endpoints.json {
                let all: Vec<_> = leases.iter().map(info_json).collect();
                say!("{}", json!({ "leases": all }));
            } else {
                for info in &leases {
                    say!("{}", describe(info));
                }
            }
            ExitCode::SUCCESS
        }
        Err(err) => fail(&err),
    })
}
