//! `palisade policy init|add`: a policy file and its principals' API keys.

use crate::output::{complain, say};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use palisade_serve::policy::{add, operator, Rules};

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Start DIR/policy.json with one principal, `admin`, that may do
    /// everything (its key in DIR/admin.key, 0600).
    Init {
        /// Where policy.json and the key files live.
        #[arg(long)]
        dir: PathBuf,
        /// Do nothing if DIR/policy.json exists.
        #[arg(long)]
        keep_existing: bool,
    },
    /// Add a principal with a fresh key (DIR/<name>.key, 0600). Running
    /// servers take the change on SIGHUP (no restart).
    Add(AddArgs),
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// Where policy.json and the key files live.
    #[arg(long)]
    dir: PathBuf,
    /// The principal's name ([A-Za-z0-9._-]).
    name: String,
    /// Lease-name prefixes it may acquire, renew, release and write
    /// through the gateway ("" for all), comma-separated.
    #[arg(long, value_delimiter = ',')]
    acquire: Vec<String>,
    /// Lease-name prefixes it may read, list and watch, and whose objects
    /// it may read.
    #[arg(long, value_delimiter = ',')]
    read: Vec<String>,
    /// Lease-name prefixes whose grants it may revoke.
    #[arg(long, value_delimiter = ',')]
    admin: Vec<String>,
    /// It may rotate the signing key and change membership.
    #[arg(long)]
    cluster: bool,
    /// Leases it may own on the election cluster (held, or freed and not yet
    /// reclaimed); default: the node's --max-leases-per-principal.
    #[arg(long)]
    max_leases: Option<u64>,
    /// DNS names of client certificates (from the servers' CA) that are
    /// this principal over client TLS, comma-separated.
    #[arg(long, value_delimiter = ',')]
    certificate: Vec<String>,
}

pub fn run(command: PolicyCommand) -> anyhow::Result<ExitCode> {
    let (dir, name, rules) = match command {
        PolicyCommand::Init { dir, keep_existing } => {
            if keep_existing && dir.join("policy.json").exists() {
                say!(
                    "{}: a policy exists; kept",
                    dir.join("policy.json").display()
                );
                return Ok(ExitCode::SUCCESS);
            }
            (dir, "admin".to_owned(), operator())
        }
        PolicyCommand::Add(args) => (
            args.dir,
            args.name,
            Rules {
                keys: Vec::new(),
                acquire: args.acquire,
                read: args.read,
                admin: args.admin,
                cluster: args.cluster,
                max_leases: args.max_leases,
                certificates: args.certificate,
            },
        ),
    };
    for prefix in rules.loose_prefixes() {
        complain!(
            "warning: prefix {prefix:?} also matches longer names ({prefix}-archive, {prefix}2, ...); \
             end it with '.', '-', '_' or '/' to grant one segment"
        );
    }
    match add(&dir, &name, &rules) {
        Ok(key) => {
            say!("{}", dir.join("policy.json").display());
            say!("{}", key.display());
            complain!(
                "note: running servers take the change on SIGHUP, no restart \
                 (e.g. pkill -HUP -f 'palisade (election|gateway)')"
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            complain!("error: {err}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Loads `--policy` for `server`: `Err(line)` when the file is refused (the
/// server must not start), `None` with a loud warning when there is none.
pub fn load_policy(
    path: Option<&std::path::Path>,
    server: &'static str,
) -> Result<Option<std::sync::Arc<palisade_serve::policy::LivePolicy>>, String> {
    let Some(path) = path else {
        complain!(
            "warning: no --policy: the {server} is open to anyone who can reach it \
             (no API keys, no per-lease rights)"
        );
        tracing::warn!(
            server,
            "running without a policy: every client is allowed everything"
        );
        return Ok(None);
    };
    let live = std::sync::Arc::new(
        palisade_serve::policy::LivePolicy::load(path).map_err(|e| format!("--policy {e}"))?,
    );
    let policy = live.current();
    for (principal, prefix) in policy.loose_prefixes() {
        tracing::warn!(
            server,
            principal,
            prefix,
            "a policy prefix without a trailing separator also matches longer names"
        );
    }
    tracing::info!(
        server,
        principals = policy.principals().count(),
        "policy loaded"
    );
    live.reload_on_sighup(server)
        .map_err(|e| format!("cannot watch for SIGHUP: {e}"))?;
    Ok(Some(live))
}
