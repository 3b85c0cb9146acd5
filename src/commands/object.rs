//! `palisade object put|get|delete`.

use crate::output::say;
use std::io::Read;
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
    /// Print an object's value to stdout: text with a newline added when
    /// it does not end in one; binary (not UTF-8) or `--raw` values as
    /// they are, byte for byte.
    Get {
        /// The key.
        key: String,
        /// Print the bytes exactly as stored (no newline added).
        #[arg(long)]
        raw: bool,
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
        ObjectCommand::Get { key, raw, target } => {
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
            // Numbers, as a write answers them.
            let number = |name: &str| {
                let text = response.headers().get(name).and_then(|v| v.to_str().ok());
                let text = text.unwrap_or("").trim_matches('"');
                text.parse::<u64>()
                    .map_or_else(|_| serde_json::json!(text), |n| serde_json::json!(n))
            };
            let (token, version) = (number("fencing-token"), number("etag"));
            let bytes = response.bytes().await.context("cannot read the object")?;
            if target.json {
                say!(
                    "{}",
                    serde_json::json!({
                        "key": key,
                        "version": version,
                        "token": token,
                        "value": String::from_utf8_lossy(&bytes),
                    })
                );
            } else {
                crate::output::bytes(&printable(&bytes, raw));
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

/// What `object get` prints: the value, with a newline added when it is
/// text (UTF-8) that does not end in one, unless `raw` (so a shell prompt
/// does not land on the value's last line; `--raw` or a binary value
/// prints the stored bytes exactly).
fn printable(value: &[u8], raw: bool) -> std::borrow::Cow<'_, [u8]> {
    let text = std::str::from_utf8(value).is_ok();
    if raw || !text || value.is_empty() || value.ends_with(b"\n") {
        return value.into();
    }
    let mut line = value.to_vec();
    line.push(b'\n');
    line.into()
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn text_gets_a_newline_and_raw_or_binary_values_do_not() {
        assert_eq!(&*printable(b"from B", false), b"from B\n");
        assert_eq!(&*printable(b"from B\n", false), b"from B\n");
        assert_eq!(&*printable(b"from B", true), b"from B");
        assert_eq!(&*printable(&[0xff, 0x00], false), &[0xff, 0x00]);
        assert_eq!(&*printable(b"", false), b"");
    }
}
