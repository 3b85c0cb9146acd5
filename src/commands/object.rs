//! `palisade object put|get|head|delete|list`: one function per
//! subcommand, each one gateway request (a listing with `--all` one per
//! page).

use crate::output::{complain, say};
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::{json, Value};

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
        condition: Condition,
        /// Write only if there is no object at the key (`If-None-Match: *`).
        #[arg(long, conflicts_with = "if_match")]
        if_absent: bool,
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
    /// Print what an object is without its value: version, token, size.
    Head {
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
        condition: Condition,
        #[command(flatten)]
        token: TokenArgs,
        #[command(flatten)]
        target: GatewayTarget,
    },
    /// List objects by key prefix, in key order: one line per object
    /// (key, version, token, size), then the `--after` of the next page if
    /// there is one.
    List {
        /// Keys that start with this (e.g. `orders/` or `ord`).
        #[arg(long, default_value = "")]
        prefix: String,
        /// Start after this key (the last page's next).
        #[arg(long)]
        after: Option<String>,
        /// Objects per page, 1..=1000.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Follow every page to the end of the prefix.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        target: GatewayTarget,
    },
}

/// A write's condition on the object it replaces.
#[derive(Debug, Args)]
pub struct Condition {
    /// Write only if the object is at this version (as `object head` or
    /// `get --json` shows it), or `*`: only if it exists (`If-Match`).
    #[arg(long, value_name = "VERSION|*")]
    if_match: Option<String>,
}

pub async fn run(command: ObjectCommand) -> anyhow::Result<ExitCode> {
    match command {
        ObjectCommand::Put {
            key,
            value,
            file,
            condition,
            if_absent,
            token,
            target,
        } => {
            let body = value_of(value, file)?;
            put(&key, body, &condition, if_absent, &token, &target).await
        }
        ObjectCommand::Get { key, raw, target } => get(&key, raw, &target).await,
        ObjectCommand::Head { key, target } => head(&key, &target).await,
        ObjectCommand::Delete {
            key,
            condition,
            token,
            target,
        } => delete(&key, &condition, &token, &target).await,
        ObjectCommand::List {
            prefix,
            after,
            limit,
            all,
            target,
        } => list(&prefix, after, limit, all, &target).await,
    }
}

/// The value to write: `--value`, else `--file`, else stdin.
fn value_of(value: Option<String>, file: Option<PathBuf>) -> anyhow::Result<Vec<u8>> {
    Ok(match (value, file) {
        (Some(value), _) => value.into_bytes(),
        (None, Some(path)) if path.as_os_str() != "-" => {
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?
        }
        _ => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("cannot read stdin")?;
            buf
        }
    })
}

/// The conditional headers of a write (the gateway judges them).
fn conditional(
    request: reqwest::RequestBuilder,
    condition: &Condition,
    if_absent: bool,
) -> reqwest::RequestBuilder {
    match (&condition.if_match, if_absent) {
        (Some(tag), _) => request.header("if-match", tag.as_str()),
        (None, true) => request.header("if-none-match", "*"),
        (None, false) => request,
    }
}

async fn put(
    key: &str,
    body: Vec<u8>,
    condition: &Condition,
    if_absent: bool,
    token: &TokenArgs,
    target: &GatewayTarget,
) -> anyhow::Result<ExitCode> {
    let request = target
        .client()?
        .put(target.url(&format!("/v1/objects/{}", encode_key(key))))
        .header("authorization", token.bearer()?)
        .body(body);
    let response = conditional(request, condition, if_absent)
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

async fn get(key: &str, raw: bool, target: &GatewayTarget) -> anyhow::Result<ExitCode> {
    let response = target
        .client()?
        .get(target.url(&format!("/v1/objects/{}", encode_key(key))))
        .send()
        .await
        .with_context(|| format!("cannot reach the gateway at {}", target.gateway))?;
    let status = response.status();
    if !status.is_success() {
        let body: Value = response.json().await.unwrap_or_default();
        complain!("{}", error_line(status, &body));
        let code = body["error"].as_str().unwrap_or("");
        return Ok(crate::exit::of_status(status.as_u16(), code));
    }
    let (version, token) = (
        number(&response, "etag"),
        number(&response, "fencing-token"),
    );
    let bytes = response.bytes().await.context("cannot read the object")?;
    if target.json {
        say!(
            "{}",
            json!({
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

/// A header's number, as a write answers it (the text when not a number).
fn number(response: &reqwest::Response, name: &str) -> Value {
    let text = response.headers().get(name).and_then(|v| v.to_str().ok());
    let text = text.unwrap_or("").trim_matches('"');
    text.parse::<u64>()
        .map_or_else(|_| json!(text), |n| json!(n))
}

async fn head(key: &str, target: &GatewayTarget) -> anyhow::Result<ExitCode> {
    let response = target
        .client()?
        .head(target.url(&format!("/v1/objects/{}", encode_key(key))))
        .send()
        .await
        .with_context(|| format!("cannot reach the gateway at {}", target.gateway))?;
    let status = response.status();
    if !status.is_success() {
        // A HEAD answer has no body: the status says it all.
        let reason = if status == reqwest::StatusCode::NOT_FOUND {
            json!({"error": "not_found", "message": format!("no object at {key:?}")})
        } else {
            json!({"error": status.canonical_reason().unwrap_or("error")})
        };
        complain!("{}", error_line(status, &reason));
        return Ok(crate::exit::of_status(status.as_u16(), ""));
    }
    let object = json!({
        "key": key,
        "version": number(&response, "etag"),
        "token": number(&response, "fencing-token"),
        "size": number(&response, "content-length"),
    });
    if target.json {
        say!("{object}");
    } else {
        say!("{}", listed(&object));
    }
    Ok(ExitCode::SUCCESS)
}

async fn delete(
    key: &str,
    condition: &Condition,
    token: &TokenArgs,
    target: &GatewayTarget,
) -> anyhow::Result<ExitCode> {
    let request = target
        .client()?
        .delete(target.url(&format!("/v1/objects/{}", encode_key(key))))
        .header("authorization", token.bearer()?);
    let response = conditional(request, condition, false)
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

/// One object of a listing as a line: key, version, token, size.
fn listed(object: &Value) -> String {
    format!(
        "{}\tversion {}\ttoken {}\t{} bytes",
        object["key"].as_str().unwrap_or(""),
        object["version"],
        object["token"],
        object["size"]
    )
}

/// `object list`: a page (or, with `all`, every page) of the prefix; a
/// page's `next` goes to stderr, so stdout holds objects only.
async fn list(
    prefix: &str,
    mut after: Option<String>,
    limit: usize,
    all: bool,
    target: &GatewayTarget,
) -> anyhow::Result<ExitCode> {
    let client = target.client()?;
    loop {
        let mut query = vec![("prefix", prefix.to_owned()), ("limit", limit.to_string())];
        query.extend(after.take().map(|a| ("after", a)));
        let query = query;
        let response = client
            .get(target.url("/v1/objects"))
            .query(&query)
            .send()
            .await
            .with_context(|| format!("cannot reach the gateway at {}", target.gateway))?;
        let status = response.status();
        let page: Value = response
            .json()
            .await
            .with_context(|| format!("the gateway answered {status} without JSON"))?;
        if !status.is_success() {
            complain!("{}", error_line(status, &page));
            let code = page["error"].as_str().unwrap_or("");
            return Ok(crate::exit::of_status(status.as_u16(), code));
        }
        if target.json {
            say!("{page}");
        } else {
            for object in page["objects"].as_array().into_iter().flatten() {
                say!("{}", listed(object));
            }
        }
        let next = page["next"].as_str().map(str::to_owned);
        match next {
            // Each page must move on, or `--all` would ask forever.
            Some(next) if all && query.iter().all(|(n, a)| *n != "after" || *a < next) => {
                after = Some(next);
            }
            Some(next) if all => {
                anyhow::bail!("the gateway's next page ({next:?}) does not move on")
            }
            Some(next) if !target.json => {
                complain!("more follow: --after {next}");
                return Ok(ExitCode::SUCCESS);
            }
            _ => return Ok(ExitCode::SUCCESS),
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
