//! `palisade lease ...`, on the SDK.

use crate::output::say;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use palisade_client::{AcquireOptions, Client, ClientConfig, Error, GrantId, GrantSecret};

/// Where the election cluster (and gateway) are.
#[derive(Debug, Clone, Args)]
pub struct Endpoints {
    /// Election node URLs, comma-separated; any node will do.
    #[arg(
        long,
        env = "PALISADE_ELECTION",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7001,http://127.0.0.1:7002,http://127.0.0.1:7003"
    )]
    pub election: Vec<String>,
    /// The gateway URL (for fence-on-acquire and fenced writes).
    #[arg(long, env = "PALISADE_GATEWAY")]
    pub gateway: Option<String>,
    /// The CA (PEM) to trust for https:// endpoints (e.g. certs/ca.pem).
    #[arg(long, env = "PALISADE_CA")]
    pub ca: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub credentials: super::http::Credentials,
    /// Print JSON instead of readable lines.
    #[arg(long)]
    pub json: bool,
}

impl Endpoints {
    /// An SDK client for these endpoints.
    ///
    /// # Errors
    /// The CA or key file cannot be used.
    pub fn client(&self) -> Result<Client, Error> {
        Ok(Client::new(self.config()?))
    }

    /// The SDK configuration for these endpoints (for callers that adjust
    /// it, as `cluster status` its timeouts).
    ///
    /// # Errors
    /// The CA or key file cannot be used.
    pub fn config(&self) -> Result<ClientConfig, Error> {
        let mut config = ClientConfig::new(self.election.clone());
        config.gateway = self.gateway.clone();
        if let Some(ca) = &self.ca {
            config = config.with_ca_file(ca)?;
        }
        let key = self
            .credentials
            .key()
            .map_err(|e| Error::BadRequest(e.to_string()))?;
        if let Some(key) = key {
            config = config.with_api_key(&key)?;
        }
        let credentials = &self.credentials;
        if let (Some(cert), Some(key)) = (&credentials.client_cert, &credentials.client_key) {
            config = config.with_client_cert_files(cert, key)?;
        }
        Ok(config)
    }
}

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
        /// lease under the prefix first).
        #[arg(long, default_value_t = 0, requires = "prefix")]
        index: u64,
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

pub(crate) fn fail(err: &Error) -> ExitCode {
    eprintln!("error: {err}");
    ExitCode::FAILURE
}

/// As [`fail`], for an acquire of `lease` as `holder`: a lease held says
/// what to do about it.
pub(crate) fn fail_acquire(err: &Error, lease: &str, holder: &str) -> ExitCode {
    eprintln!("error: {err}");
    if let Some(hint) = held_hint(err, lease, holder) {
        eprintln!("hint: {hint}");
    }
    ExitCode::FAILURE
}

/// What to do about an acquire of `lease` as `holder` refused with `err`
/// because the lease is held.
fn held_hint(err: &Error, lease: &str, holder: &str) -> Option<String> {
    let Error::Held {
        holder: current,
        token,
    } = err
    else {
        return None;
    };
    Some(if current == holder {
        format!(
            "{holder:?} is the holder you asked for, but the grant was made to another \
             acquire (another process, or an earlier acquire: each has its own secret), so \
             this one is refused. If it is yours, release it with the secret that acquire \
             printed: palisade lease release {lease} --holder {holder} --token {token} \
             --secret SECRET --grant-index INDEX; or wait for it with --wait-ms MS"
        )
    } else {
        format!(
            "wait for it with --wait-ms MS: a waiting acquire gets it as soon as \
             {current:?} releases it or stops renewing (after its ttl)"
        )
    })
}

/// As [`fail`], for a release of `grant` refused as not current: when the
/// lease is held by that holder and token after all, the grant index is
/// what did not match, and that is said.
async fn fail_release(err: &Error, client: &Client, grant: &GrantArgs) -> ExitCode {
    eprintln!("error: {err}");
    let (Error::LeaseLost(_), Some(index)) = (err, grant.grant_index) else {
        return ExitCode::FAILURE;
    };
    let Ok(info) = client.get(&grant.lease).await else {
        return ExitCode::FAILURE;
    };
    if info.holder.as_deref() == Some(grant.holder.as_str()) && info.token == grant.token {
        eprintln!(
            "hint: {} does hold {} with token {}, but not from the acquire with grant index \
             {index}: --grant-index is the `grant_index` its acquire printed, not the token \
             (they differ after a handover or a repeated acquire), and a release naming \
             another acquire frees nothing. Give the acquire's grant_index, or leave \
             --grant-index out",
            grant.holder, grant.lease, grant.token
        );
    }
    ExitCode::FAILURE
}

pub(crate) fn print(json: bool, value: &serde_json::Value, readable: String) {
    if json {
        say!("{value}");
    } else {
        say!("{readable}");
    }
}

/// One line per transition:
/// `index 41  acquire   w1 (token 41)  2026-11-28T00:40:12.345Z (3.2 s ago)`.
fn describe_history(lease: &str, history: &[palisade_client::Transition]) -> String {
    if history.is_empty() {
        return format!("{lease}: no transitions recorded");
    }
    let lines: Vec<String> = history
        .iter()
        .map(|t| {
            let holder = t.holder.as_deref().unwrap_or("-");
            let when = t
                .at_ms
                .map_or(String::new(), |at| format!("  {}", super::when(at)));
            format!(
                "index {}  {:<8}  {holder} (token {}){when}",
                t.index, t.cause, t.token
            )
        })
        .collect();
    format!("{lease}:\n{}", lines.join("\n"))
}

pub(crate) fn describe(info: &palisade_client::LeaseInfo) -> String {
    match &info.holder {
        Some(holder) => format!(
            "{} held by {holder} (token {}, ttl {} ms, {}{}{} transitions, index {}){}",
            info.lease,
            info.token,
            info.ttl_ms,
            info.expires_in_ms
                .map_or(String::new(), |ms| format!("expires in {ms} ms, ")),
            if info.revoked {
                "revoked: ends at its deadline, "
            } else {
                ""
            },
            info.transitions,
            info.modify_index,
            grant_times(info)
        ),
        None => format!(
            "{} free (last token {}, {} transitions, index {})",
            info.lease, info.token, info.transitions, info.modify_index
        ),
    }
}

/// `; acquired <when>; renewed <when>`, for the times the answer carries.
fn grant_times(info: &palisade_client::LeaseInfo) -> String {
    let at = |label: &str, time: &Option<String>| {
        time.as_deref().map_or(
            String::new(),
            |text| match palisade_names::time::parse_rfc3339_ms(text) {
                Some(ms) => format!("; {label} {}", super::when(ms)),
                None => format!("; {label} {text}"),
            },
        )
    };
    format!(
        "{}{}",
        at("acquired", &info.acquire_time),
        at("renewed", &info.renew_time)
    )
}

pub(crate) fn info_json(info: &palisade_client::LeaseInfo) -> serde_json::Value {
    serde_json::to_value(info).unwrap_or_default()
}

/// Prints a grant: readable (`verb` says what happened) or as JSON.
fn print_grant(json: bool, grant: &palisade_client::Grant, verb: &str) {
    let value = serde_json::to_value(grant).unwrap_or_default();
    let mut readable = format!(
        "{verb} {} for {} with token {}\njwt: {}",
        grant.lease, grant.holder, grant.token, grant.jwt
    );
    if let Some(secret) = &grant.secret {
        // What `lease renew` and `lease release` need.
        readable.push_str(&format!(
            "\nsecret: {}\ngrant_index: {}",
            secret.expose(),
            grant.grant_index.unwrap_or_default()
        ));
    }
    print(json, &value, readable);
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
            let client = endpoints.client()?;
            let ttl = Duration::from_millis(ttl_ms);
            let wait = wait_ms.map(Duration::from_millis);
            let options = terms.options();
            if !hold {
                return Ok(
                    match client
                        .acquire_grant_with(&lease, &holder, ttl, wait, options)
                        .await
                    {
                        Ok(grant) => {
                            print_grant(endpoints.json, &grant, "granted");
                            ExitCode::SUCCESS
                        }
                        Err(err) => fail_acquire(&err, &lease, &holder),
                    },
                );
            }
            let held = match client
                .acquire_with(&lease, &holder, ttl, wait, options)
                .await
            {
                Ok(held) => held,
                Err(err) => return Ok(fail_acquire(&err, &lease, &holder)),
            };
            say!(
                "held {} token={} jwt={}",
                held.name(),
                held.token(),
                held.jwt().unwrap_or_default()
            );
            let mut status = tokio::time::interval(Duration::from_millis(status_ms.max(10)));
            let shutdown = crate::shutdown::shutdown_signal();
            tokio::pin!(shutdown);
            loop {
                tokio::select! {
                    _ = status.tick() => {
                        say!("status held={} token={}", held.is_held(), held.token());
                    }
                    () = held.lost() => {
                        say!("lost token={}", held.token());
                        return Ok(ExitCode::from(3));
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
        LeaseCommand::Renew { grant, endpoints } => {
            Ok(match endpoints.client()?.renew_grant(&grant.id()).await {
                Ok(grant) => {
                    print_grant(endpoints.json, &grant, "renewed");
                    ExitCode::SUCCESS
                }
                Err(err) => fail(&err),
            })
        }
        LeaseCommand::Handover {
            grant,
            to,
            endpoints,
        } => Ok(
            match endpoints.client()?.handover_grant(&grant.id(), &to).await {
                Ok(token) => {
                    let lease = &grant.lease;
                    print(
                        endpoints.json,
                        &serde_json::json!({ "lease": lease, "to": to, "token": token }),
                        format!("handed {lease} to {to} (its token {token})"),
                    );
                    ExitCode::SUCCESS
                }
                Err(err) => fail(&err),
            },
        ),
        LeaseCommand::Release { grant, endpoints } => {
            let client = endpoints.client()?;
            Ok(match client.release_grant(&grant.id()).await {
                Ok(()) => {
                    let (lease, token) = (&grant.lease, grant.token);
                    print(
                        endpoints.json,
                        &serde_json::json!({ "lease": lease, "released": true, "token": token }),
                        format!("released {lease} (token {token})"),
                    );
                    ExitCode::SUCCESS
                }
                Err(err) => fail_release(&err, &client, &grant).await,
            })
        }
        LeaseCommand::Revoke {
            lease,
            token,
            endpoints,
        } => Ok(match endpoints.client()?.revoke(&lease, token).await {
            Ok(()) => {
                print(
                    endpoints.json,
                    &serde_json::json!({ "lease": lease, "revoked": true, "token": token }),
                    format!("revoked {lease} (token {token}); it ends at its deadline"),
                );
                ExitCode::SUCCESS
            }
            Err(err) => fail(&err),
        }),
        LeaseCommand::Get { lease, endpoints } => Ok(match endpoints.client()?.get(&lease).await {
            Ok(info) => {
                print(endpoints.json, &info_json(&info), describe(&info));
                ExitCode::SUCCESS
            }
            Err(err) => fail(&err),
        }),
        LeaseCommand::History { lease, endpoints } => {
            Ok(match endpoints.client()?.history(&lease).await {
                Ok(history) => {
                    let value = serde_json::json!({ "lease": lease, "history": history });
                    print(endpoints.json, &value, describe_history(&lease, &history));
                    ExitCode::SUCCESS
                }
                Err(err) => fail(&err),
            })
        }
        LeaseCommand::List { prefix, endpoints } => {
            Ok(match endpoints.client()?.list_prefix(&prefix).await {
                Ok(leases) => {
                    if endpoints.json {
                        let all: Vec<_> = leases.iter().map(info_json).collect();
                        say!("{}", serde_json::json!({ "leases": all }));
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
        LeaseCommand::Watch {
            lease,
            prefix,
            index,
            endpoints,
        } => match (lease, prefix) {
            (_, Some(prefix)) => super::prefix_watch::run(&prefix, index, &endpoints).await,
            (Some(lease), None) => watch(&lease, &endpoints).await,
            (None, None) => anyhow::bail!("name a lease, or --prefix"),
        },
    }
}

/// `palisade lease watch`: prints the lease at every change until a
/// signal (or a closed stdout). A lease never granted is waited for, and
/// stderr says so at once; a name that can never exist is refused.
async fn watch(lease: &str, endpoints: &Endpoints) -> anyhow::Result<ExitCode> {
    let client = endpoints.client()?;
    let mut index = 0;
    // A watch of a lease never granted waits (up to its wait) before it
    // answers 404: a read says at once whether there is one.
    let mut said_missing = false;
    match client.get(lease).await {
        Err(Error::NotFound(_)) => {
            say_missing(lease);
            said_missing = true;
        }
        Err(err @ (Error::BadRequest(_) | Error::Unauthorized(_) | Error::Forbidden(_))) => {
            return Ok(fail(&err));
        }
        _ => {}
    }
    let shutdown = crate::shutdown::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let next = tokio::select! {
            () = &mut shutdown => return Ok(ExitCode::SUCCESS),
            next = client.watch(lease, index, Duration::from_secs(30)) => next,
        };
        match next {
            Ok(info) if info.modify_index > index => {
                index = info.modify_index;
                print(endpoints.json, &info_json(&info), describe(&info));
            }
            Ok(_) => {}
            Err(Error::NotFound(_)) => {
                if !said_missing {
                    say_missing(lease);
                    said_missing = true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err @ (Error::BadRequest(_) | Error::Unauthorized(_) | Error::Forbidden(_))) => {
                return Ok(fail(&err));
            }
            Err(err) => {
                eprintln!("warning: {err}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

fn say_missing(lease: &str) {
    eprintln!(
        "lease {lease} does not exist yet (never granted, or forgotten since its release); \
         waiting for its first grant (Ctrl-C stops)"
    );
}
