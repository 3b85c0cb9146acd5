//! `palisade policy init|add`: a policy file and its principals' API keys.

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
    /// Add a principal with a fresh key (DIR/<name>.key, 0600). Servers read
    /// the policy at start: restart them to apply it.
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
}

pub fn run(command: PolicyCommand) -> anyhow::Result<ExitCode> {
    let (dir, name, rules) = match command {
        PolicyCommand::Init { dir, keep_existing } => {
            if keep_existing && dir.join("policy.json").exists() {
                println!(
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
            },
        ),
    };
    match add(&dir, &name, &rules) {
        Ok(key) => {
            println!("{}", dir.join("policy.json").display());
            println!("{}", key.display());
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            eprintln!("error: {err}");
            Ok(ExitCode::FAILURE)
        }
    }
}
