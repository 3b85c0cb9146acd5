//! `palisade health URL`: exit 0 if URL answers 2xx within a second. Used by
//! container healthchecks, where the image has nothing but this binary.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The URL to probe, e.g. http://127.0.0.1:7001/healthz.
    url: String,
}

pub async fn run(args: HealthArgs) -> anyhow::Result<ExitCode> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()?;
    Ok(match client.get(&args.url).send().await {
        Ok(response) if response.status().is_success() => ExitCode::SUCCESS,
        Ok(response) => {
            eprintln!("error: {} answered {}", args.url, response.status());
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("error: {}: {err}", args.url);
            ExitCode::FAILURE
        }
    })
}
