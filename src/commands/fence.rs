//! `palisade fence get|bump`.

use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;

use super::http::{encode_key, report, GatewayTarget, TokenArgs};

#[derive(Debug, Subcommand)]
pub enum FenceCommand {
    /// Print a lease's fence (0 when never fenced).
    Get {
        /// The lease name.
        lease: String,
        #[command(flatten)]
        target: GatewayTarget,
    },
    /// Raise a lease's fence to the token in the JWT, writing nothing else.
    Bump {
        /// The lease name.
        lease: String,
        #[command(flatten)]
        token: TokenArgs,
        #[command(flatten)]
        target: GatewayTarget,
    },
}

pub async fn run(command: FenceCommand) -> anyhow::Result<ExitCode> {
    let (request, target) = match command {
        FenceCommand::Get { lease, target } => (
            target
                .client()?
                .get(target.url(&format!("/v1/fences/{}", encode_key(&lease)))),
            target,
        ),
        FenceCommand::Bump {
            lease,
            token,
            target,
        } => (
            target
                .client()?
                .post(target.url(&format!("/v1/fences/{}", encode_key(&lease))))
                .header("authorization", token.bearer()?),
            target,
        ),
    };
    let response = request
        .send()
        .await
        .with_context(|| format!("cannot reach the gateway at {}", target.gateway))?;
    report(response, target.json, |b| {
        format!("{} fence {}", b["lease"], b["fence"])
    })
    .await
}
