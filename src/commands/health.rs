//! `palisade health URL`: exit 0 if URL answers 2xx within a second. Used by
//! container healthchecks, where the image has nothing but this binary.

use crate::output::complain;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The URL to probe, e.g. http://127.0.0.1:7001/healthz.
    url: String,
    /// The CA (PEM) to trust for an https:// URL.
    #[arg(long, env = "PALISADE_CA")]
    ca: Option<std::path::PathBuf>,
}

pub async fn run(args: HealthArgs) -> anyhow::Result<ExitCode> {
    let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(1));
    if let Some(ca) = &args.ca {
        let pem = std::fs::read(ca)?;
        builder = builder.add_root_certificate(reqwest::Certificate::from_pem(&pem)?);
    }
    let client = builder.build()?;
    Ok(match client.get(&args.url).send().await {
        Ok(response) if response.status().is_success() => ExitCode::SUCCESS,
        Ok(response) => {
            complain!("error: {} answered {}", args.url, response.status());
            ExitCode::from(crate::exit::UNAVAILABLE)
        }
        Err(err) => {
            complain!("error: {}: {err}", args.url);
            ExitCode::from(crate::exit::UNAVAILABLE)
        }
    })
}
