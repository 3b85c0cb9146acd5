//! What the client commands share: the gateway address, the token, and turning
//! an HTTP answer into output and an exit code.

use crate::output::{complain, say};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

/// Where the gateway is, and how to print.
#[derive(Debug, Args)]
pub struct GatewayTarget {
    /// The gateway's base URL.
    #[arg(
        long,
        env = "PALISADE_GATEWAY",
        default_value = "http://127.0.0.1:8080"
    )]
    pub gateway: String,
    /// The CA (PEM) to trust for an https:// gateway.
    #[arg(long, env = "PALISADE_CA")]
    pub ca: Option<PathBuf>,
    #[command(flatten)]
    pub credentials: Credentials,
    /// Print the server's JSON answer instead of a readable line.
    #[arg(long)]
    pub json: bool,
}

/// This client's API key, for servers that run with a policy.
///
/// Where the key comes from, first match wins: `--api-key`,
/// `--api-key-file`, `PALISADE_API_KEY`, `PALISADE_API_KEY_FILE`. A flag
/// beats the environment, and at the same level a key beats a key file
/// (as the Rust, Python and Go SDKs read the environment), so having both
/// variables set is never an error.
#[derive(Debug, Clone, Args)]
pub struct Credentials {
    /// The API key to send (`x-palisade-key`) [env: PALISADE_API_KEY]. Wins
    /// over --api-key-file and over both variables.
    #[arg(long)]
    pub api_key: Option<String>,
    /// A file holding the API key, e.g. admin.key from `palisade dev`
    /// [env: PALISADE_API_KEY_FILE]. Wins over both variables.
    #[arg(long)]
    pub api_key_file: Option<PathBuf>,
    /// A client certificate (PEM) to present over TLS, for servers whose
    /// policy names it as a principal (with --client-key).
    #[arg(long, env = "PALISADE_CLIENT_CERT", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "PALISADE_CLIENT_KEY", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
}

/// Where an API key was found.
#[derive(Debug, PartialEq, Eq)]
enum KeySource {
    Key(String),
    File(PathBuf),
}

impl Credentials {
    /// The key: from `--api-key`, `--api-key-file`, `PALISADE_API_KEY` or
    /// `PALISADE_API_KEY_FILE`, the first given (see the type's docs).
    ///
    /// # Errors
    /// The key file cannot be read.
    pub fn key(&self) -> anyhow::Result<Option<String>> {
        let variable = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let source = key_source(
            self,
            variable("PALISADE_API_KEY"),
            variable("PALISADE_API_KEY_FILE"),
        );
        match source {
            Some(KeySource::Key(key)) => Ok(Some(key.trim().to_owned())),
            Some(KeySource::File(path)) => Ok(Some(
                palisade_serve::policy::read_key(&path).map_err(|e| anyhow::anyhow!("{e}"))?,
            )),
            None => Ok(None),
        }
    }

    /// The client certificate and key, if given.
    ///
    /// # Errors
    /// The files cannot be read or are not a certificate and its key.
    pub fn identity(&self) -> anyhow::Result<Option<reqwest::Identity>> {
        let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) else {
            return Ok(None);
        };
        let read = |path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
        };
        let mut pem = read(cert)?;
        pem.push(b'\n');
        pem.extend(read(key)?);
        let identity = reqwest::Identity::from_pem(&pem).with_context(|| {
            format!(
                "{} and {} are not a certificate and its key",
                cert.display(),
                key.display()
            )
        })?;
        Ok(Some(identity))
    }
}

impl GatewayTarget {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.gateway.trim_end_matches('/'))
    }

    /// An HTTP client for the gateway (trusting `--ca` when given).
    ///
    /// # Errors
    /// The CA file cannot be used.
    pub fn client(&self) -> anyhow::Result<reqwest::Client> {
        let mut builder = reqwest::Client::builder().timeout(std::time::Duration::from_secs(30));
        if let Some(ca) = &self.ca {
            let pem = std::fs::read(ca).with_context(|| format!("cannot read {}", ca.display()))?;
            let ca = reqwest::Certificate::from_pem(&pem)
                .with_context(|| format!("{} is not a PEM certificate", ca.display()))?;
            builder = builder.add_root_certificate(ca);
        }
        if let Some(identity) = self.credentials.identity()? {
            builder = builder.identity(identity);
        }
        if let Some(key) = self.credentials.key()? {
            let mut value = reqwest::header::HeaderValue::from_str(&key)
                .context("the API key must be visible ASCII")?;
            value.set_sensitive(true);
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(palisade_client::API_KEY_HEADER, value);
            builder = builder.default_headers(headers);
        }
        builder.build().context("cannot build the HTTP client")
    }
}

/// A lease JWT, given inline or in a file.
#[derive(Debug, Args)]
pub struct TokenArgs {
    /// The lease JWT (as granted by `palisade lease acquire`).
    #[arg(long, env = "PALISADE_JWT")]
    pub jwt: Option<String>,
    /// A file holding the lease JWT (read at each call; `palisade run`
    /// keeps one fresh). Wins over --jwt / PALISADE_JWT.
    #[arg(long, env = "PALISADE_JWT_FILE")]
    pub jwt_file: Option<PathBuf>,
}

impl TokenArgs {
    pub fn bearer(&self) -> anyhow::Result<String> {
        let jwt = match (&self.jwt, &self.jwt_file) {
            (_, Some(path)) => std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?,
            (Some(jwt), None) => jwt.clone(),
            (None, None) => anyhow::bail!(
                "a write needs --jwt or --jwt-file (or PALISADE_JWT / PALISADE_JWT_FILE)"
            ),
        };
        if jwt.trim().is_empty() {
            anyhow::bail!("the JWT is empty (the lease was lost)");
        }
        Ok(format!("Bearer {}", jwt.trim()))
    }
}

/// The precedence of [`Credentials::key`]: flags over the environment,
/// a key over a key file.
fn key_source(
    flags: &Credentials,
    env_key: Option<String>,
    env_file: Option<String>,
) -> Option<KeySource> {
    if let Some(key) = &flags.api_key {
        return Some(KeySource::Key(key.clone()));
    }
    if let Some(path) = &flags.api_key_file {
        return Some(KeySource::File(path.clone()));
    }
    env_key
        .map(KeySource::Key)
        .or_else(|| env_file.map(|path| KeySource::File(path.into())))
}

pub use palisade_client::encode_key;

/// Prints a JSON answer: raw with `--json`, else through `readable`; an error
/// answer is one line on stderr and exit code 1.
pub async fn report(
    response: reqwest::Response,
    json: bool,
    readable: impl FnOnce(&serde_json::Value) -> String,
) -> anyhow::Result<ExitCode> {
    let status = response.status();
    let body: serde_json::Value = response
        .json()
        .await
        .with_context(|| format!("the server answered {status} without JSON"))?;
    if status.is_success() {
        if json {
            say!("{body}");
        } else {
            say!("{}", readable(&body));
        }
        return Ok(ExitCode::SUCCESS);
    }
    if json {
        say!("{body}");
    }
    complain!("{}", error_line(status, &body));
    Ok(crate::exit::of_status(
        status.as_u16(),
        body["error"].as_str().unwrap_or(""),
    ))
}

pub fn error_line(status: reqwest::StatusCode, body: &serde_json::Value) -> String {
    let code = body["error"].as_str().unwrap_or("error");
    let message = body["message"].as_str().unwrap_or("");
    format!("error: {} {code}: {message}", status.as_u16())
}

#[cfg(test)]
mod tests {
    use super::{key_source, Credentials, KeySource};

    fn flags(key: Option<&str>, file: Option<&str>) -> Credentials {
        Credentials {
            api_key: key.map(str::to_owned),
            api_key_file: file.map(Into::into),
            client_cert: None,
            client_key: None,
        }
    }

    /// Flags beat the environment; at the same level a key beats a key
    /// file; both variables set is not an error.
    #[test]
    fn flags_beat_the_environment_and_a_key_beats_a_key_file() {
        let env = |k: &str| Some(k.to_owned());
        let cases = [
            (flags(None, None), None, None, None),
            (
                flags(None, None),
                env("ek"),
                env("ef"),
                Some(KeySource::Key("ek".into())),
            ),
            (
                flags(None, None),
                None,
                env("ef"),
                Some(KeySource::File("ef".into())),
            ),
            (
                flags(None, Some("ff")),
                env("ek"),
                env("ef"),
                Some(KeySource::File("ff".into())),
            ),
            (
                flags(Some("fk"), Some("ff")),
                env("ek"),
                None,
                Some(KeySource::Key("fk".into())),
            ),
        ];
        for (flags, env_key, env_file, expected) in cases {
            assert_eq!(key_source(&flags, env_key, env_file), expected, "{flags:?}");
        }
    }
}
