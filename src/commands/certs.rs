//! `palisade certs init`: a cluster's CA and certificates in one directory.

use crate::output::{complain, say};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use palisade_serve::certs::{init, Layout};

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Create a CA, a certificate per election node (node-<id>.palisade),
    /// one for the gateway and one client certificate. Keys are written
    /// 0600 and the directory 0700; existing files are replaced.
    Init(InitArgs),
    /// Issue the certificate of one more node (e.g. before `palisade cluster
    /// add`) from the CA in DIR (its ca-key.pem).
    AddNode(AddNodeArgs),
}

#[derive(Debug, Args)]
pub struct AddNodeArgs {
    /// The directory `certs init` wrote.
    #[arg(long)]
    dir: PathBuf,
    /// The node's id.
    #[arg(long)]
    id: u64,
    /// Extra host names its certificate carries.
    #[arg(long, value_delimiter = ',', default_value = "localhost")]
    hosts: Vec<String>,
    /// Extra IP addresses its certificate carries.
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1")]
    ips: Vec<IpAddr>,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Where to write the files.
    #[arg(long)]
    dir: PathBuf,
    /// How many election nodes (ids 1..=N).
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// Extra host names every server certificate carries (the names clients
    /// dial, e.g. election1,gateway in docker-compose).
    #[arg(long, value_delimiter = ',', default_value = "localhost")]
    hosts: Vec<String>,
    /// Extra IP addresses every server certificate carries.
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1")]
    ips: Vec<IpAddr>,
    /// Do nothing if DIR already holds a CA (ca.pem): a cluster keeps its
    /// certificates across restarts.
    #[arg(long)]
    keep_existing: bool,
}

pub fn run(command: CertsCommand) -> anyhow::Result<ExitCode> {
    let args = match command {
        CertsCommand::Init(args) => args,
        CertsCommand::AddNode(args) => {
            let layout = Layout {
                nodes: 0,
                dns: args.hosts.into_iter().filter(|h| !h.is_empty()).collect(),
                ips: args.ips,
            };
            let authority = palisade_serve::certs::Authority::load(&args.dir)?;
            for path in authority.write_node(&args.dir, args.id, &layout)? {
                say!("{}", path.display());
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    if args.nodes == 0 {
        complain!("error: --nodes must be at least 1");
        return Ok(ExitCode::from(2));
    }
    if args.keep_existing && args.dir.join("ca.pem").exists() {
        say!("{}: a CA exists; kept", args.dir.display());
        return Ok(ExitCode::SUCCESS);
    }
    let layout = Layout {
        nodes: args.nodes,
        dns: args.hosts.into_iter().filter(|h| !h.is_empty()).collect(),
        ips: args.ips,
    };
    let written = init(&args.dir, &layout)?;
    for path in &written {
        say!("{}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
