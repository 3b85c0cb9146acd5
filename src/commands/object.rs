//! `palisade object put|get|delete`.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;

use super::http::{encode_key, error_line, report, GatewayTarget, TokenArgs};

#[derive(Debug, Subcommand)]
pub enum ObjectCommand {
    /// Write an object (the value from --value, --file, or stdin).
    Put {
        /// The key: `{lease}` or `{lease}/{path}`.
        key: String,
        /// The value, inline.
        #[arg(long, conflicts_with = "file")]
        value: Option<String>,
        /// Read the value from this file (`-` for stdin, the default).
        #[arg(long)]
        file: Option<PathBuf>,
        #[command(flatten)]
        token: TokenArgs,
        #[command(flatten)]
        target: GatewayTarget,
    },
    /// Print an object's bytes to stdout.
    Get {
        /// The key.
        key: String,
        #[command(flatten)]
        target: GatewayTarget,
    },
    /// Delete an object.
    Delete {
        /// The key.
        key: String,
        #[command(flatten)]
        token: TokenArgs,
        #[command(flatten)]
        target: GatewayTarget,
    },
}

pub async fn run(command: ObjectCommand) -> anyhow::Result<ExitCode> {
    match command {
        ObjectCommand::Put {
            key,
            value,
            file,
            token,
            target,
        } => {
            let body = match (value, file) {
                (Some(value), _) => value.into_bytes(),
                (None, Some(path)) if path.as_os_str() != "-" => std::fs::read(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?,
                _ => {
                    let mut buf = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut buf)
                        .context("cannot read stdin")?;
                    buf
                }
            };
            let response = target
                .client()?
                .put(target.url(&format!("/v1/objects/{}", encode_key(&key))))
                .header("authorization", token.bearer()?)
                .body(body)
                .send()
                .await
                .with_context(|| format!("cannot reach the gateway at {}", target.gateway))?;
            report(response, target.json, |b| {
                format!(
                    "wrote {} version {} with token {}",
                    b["key"], b["version"], b["token"]
                )
            })
            .await
        }
        ObjectCommand::Get { key, target } => {
            let response = target
                .client()?
                .get(target.url(&format!("/v1/objects/{}", encode_key(&key))))
                .send()
                .await
                .with_context(|| format!("cannot reach the gateway at {}", target.gateway))?;
            let status = response.status();
            if !status.is_success() {
                let body = response.json().await.unwrap_or_default();
                eprintln!("{}", error_line(status, &body));
                return Ok(ExitCode::FAILURE);
            }
            let token = response
                .headers()
                .get("fencing-token")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("?")
                .to_owned();
            let version = response
                .headers()
                .get("etag")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("?")
                .to_owned();
            let bytes = response.bytes().await.context("cannot read the object")?;
            if target.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "key": key,
                        "version": version,
                        "token": token,
                        "value": String::from_utf8_lossy(&bytes),
                    })
                );
            } else {
                std::io::stdout().write_all(&bytes)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        ObjectCommand::Delete { key, token, target } => {
            let response = target
                .client()?
                .delete(target.url(&format!("/v1/objects/{}", encode_key(&key))))
                .header("authorization", token.bearer()?)
                .send()
                .await
                .with_context(|| format!("cannot reach the gateway at {}", target.gateway))?;
            report(response, target.json, |b| {
                format!(
                    "deleted {} (existed: {}) with token {}",
                    b["key"], b["deleted"], b["token"]
                )
            })
            .await
        }
    }
}
