//! [`ClientConfig`]: how a client behaves (endpoints, timeouts, retries,
//! the safe-deadline margin, TLS, its API key). The transport is built from
//! it, so it lives here, below everything that uses it.

use std::time::Duration;

use crate::error::Error;

/// The request header that carries a client's API key (the servers'
/// `palisade_serve::policy::KEY_HEADER`).
pub const API_KEY_HEADER: &str = "x-palisade-key";

/// How a [`Client`](crate::Client) behaves. Build with [`ClientConfig::new`] and adjust.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Election node base URLs (`http://host:port`); any node will do.
    pub endpoints: Vec<String>,
    /// The storage gateway's base URL, for fenced writes.
    pub gateway: Option<String>,
    /// Timeout of one HTTP request. Default 2 s.
    pub request_timeout: Duration,
    /// How long one call keeps retrying transient failures. Default 5 s.
    pub retry_budget: Duration,
    /// The safe deadline is `send time + ttl - margin`, with
    /// `margin = ttl * drift_margin_ratio` (at least 1 ms). It absorbs clock
    /// rate differences between this host and the Raft leader. Default 0.1.
    pub drift_margin_ratio: f64,
    /// Renew every `ttl * renew_ratio`. Default 1/3.
    pub renew_ratio: f64,
    /// Raise the gateway fence right after acquiring (needs `gateway`), so the
    /// previous holder's in-flight writes are refused before this holder
    /// writes anything. Default true.
    pub fence_on_acquire: bool,
    /// The only CA trusted for `https://` endpoints and gateway (instead of
    /// none: the SDK carries no public roots). Set with
    /// [`ClientConfig::with_ca_file`].
    pub ca: Option<reqwest::Certificate>,
    /// This client's API key, sent as `x-palisade-key` on every request to
    /// servers that run with an access policy. Set with
    /// [`ClientConfig::with_api_key`]; `Debug` never shows it.
    pub api_key: Option<ApiKey>,
    /// This client's TLS certificate and key, presented to `https://`
    /// servers whose policy names the certificate as a principal (no API
    /// key needed then). Set with [`ClientConfig::with_client_cert_files`];
    /// `Debug` never shows it.
    pub identity: Option<ClientIdentity>,
    /// Speak HTTP/2 to the nodes and the gateway (h2c on `http://`, h2 by
    /// ALPN on `https://`): every request of this client, all its leases'
    /// renewals included, shares one connection per server. Default true;
    /// false for HTTP/1.1 only (e.g. a proxy in between that speaks
    /// nothing else).
    pub http2: bool,
    /// Renewals of this client's leases that fall due together go in one
    /// batch request (`POST /v1/renew`), each answered on its own. Default
    /// true.
    pub batch_renewals: bool,
    /// With `http2` and `batch_renewals`: the batches go over one
    /// long-lived renewal stream to the leader (`POST /v1/renew/stream`),
    /// not a request each; while no stream is open (a follower or an older
    /// server refused it, or it broke) they go as requests. Default true.
    pub renew_stream: bool,
}

/// An API key (`Debug` shows only that there is one).
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// The key itself, to send.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// A client certificate and its private key (`Debug` shows only that
/// there is one).
#[derive(Clone)]
pub struct ClientIdentity(pub(crate) reqwest::Identity);

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientIdentity(<redacted>)")
    }
}

impl ClientConfig {
    /// Defaults for these election endpoints.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            gateway: None,
            request_timeout: Duration::from_secs(2),
            retry_budget: Duration::from_secs(5),
            drift_margin_ratio: 0.1,
            renew_ratio: 1.0 / 3.0,
            fence_on_acquire: true,
            ca: None,
            api_key: None,
            identity: None,
            http2: true,
            batch_renewals: true,
            renew_stream: true,
        }
    }

    /// Sends `key` as this client's API key (`x-palisade-key`), e.g. the
    /// contents of `admin.key` from `palisade dev` or `palisade policy init`.
    ///
    /// # Errors
    /// [`Error::BadRequest`] when the key cannot be a header value.
    pub fn with_api_key(mut self, key: &str) -> Result<Self, Error> {
        let key = key.trim();
        if key.is_empty() || reqwest::header::HeaderValue::from_str(key).is_err() {
            return Err(Error::BadRequest(
                "an API key must be non-empty visible ASCII".into(),
            ));
        }
        self.api_key = Some(ApiKey(key.to_owned()));
        Ok(self)
    }

    /// The configuration the environment describes, as the CLI reads it:
    /// `PALISADE_ELECTION` (comma-separated URLs; default the `palisade dev`
    /// nodes on 127.0.0.1:7001-7003), `PALISADE_GATEWAY` (default
    /// `http://127.0.0.1:8080`), `PALISADE_CA` (a CA file), `PALISADE_API_KEY`
    /// or `PALISADE_API_KEY_FILE` (the API key; with both set the key wins,
    /// as in the CLI and the Python and Go SDKs), `PALISADE_CLIENT_CERT` and
    /// `PALISADE_CLIENT_KEY` (a client certificate and its key, PEM files).
    ///
    /// # Errors
    /// [`Error::BadRequest`] when the CA or key file is unusable.
    pub fn from_env() -> Result<Self, Error> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let election = var("PALISADE_ELECTION").unwrap_or_else(|| {
            "http://127.0.0.1:7001,http://127.0.0.1:7002,http://127.0.0.1:7003".into()
        });
        let gateway = var("PALISADE_GATEWAY").unwrap_or_else(|| "http://127.0.0.1:8080".into());
        let mut config =
            Self::new(election.split(',').map(|e| e.trim().to_owned())).with_gateway(gateway);
        if let Some(ca) = var("PALISADE_CA") {
            config = config.with_ca_file(std::path::Path::new(&ca))?;
        }
        match (var("PALISADE_CLIENT_CERT"), var("PALISADE_CLIENT_KEY")) {
            (Some(cert), Some(key)) => {
                config = config.with_client_cert_files(cert.as_ref(), key.as_ref())?;
            }
            (None, None) => {}
            _ => {
                return Err(Error::BadRequest(
                    "PALISADE_CLIENT_CERT and PALISADE_CLIENT_KEY go together".into(),
                ))
            }
        }
        let key = match (var("PALISADE_API_KEY"), var("PALISADE_API_KEY_FILE")) {
            (Some(key), _) => Some(key),
            (None, Some(path)) => Some(
                std::fs::read_to_string(&path)
                    .map_err(|e| Error::BadRequest(format!("{path}: {e}")))?,
            ),
            (None, None) => None,
        };
        if let Some(key) = key {
            config = config.with_api_key(key.lines().next().unwrap_or(""))?;
        }
        Ok(config)
    }

    /// Trusts the CA in the PEM file `path` (e.g. `ca.pem` from `palisade
    /// certs init`) for `https://` endpoints.
    ///
    /// # Errors
    /// [`Error::BadRequest`] naming the file when it is unreadable or not a
    /// PEM certificate.
    pub fn with_ca_file(mut self, path: &std::path::Path) -> Result<Self, Error> {
        let pem = std::fs::read(path)
            .map_err(|e| Error::BadRequest(format!("{}: {e}", path.display())))?;
        let ca = reqwest::Certificate::from_pem(&pem)
            .map_err(|e| Error::BadRequest(format!("{}: {e}", path.display())))?;
        self.ca = Some(ca);
        Ok(self)
    }

    /// Presents the certificate in `cert` with the private key in `key`
    /// (PEM files, e.g. `client.pem` and `client-key.pem` from `palisade
    /// certs init`) to `https://` servers.
    ///
    /// # Errors
    /// [`Error::BadRequest`] naming the files when they are unreadable or
    /// not a certificate and its key.
    pub fn with_client_cert_files(
        mut self,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> Result<Self, Error> {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| Error::BadRequest(format!("{}: {e}", path.display())))
        };
        let mut pem = read(cert)?;
        pem.push(b'\n');
        pem.extend(read(key)?);
        let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
            Error::BadRequest(format!("{} and {}: {e}", cert.display(), key.display()))
        })?;
        self.identity = Some(ClientIdentity(identity));
        Ok(self)
    }

    /// Sets the gateway URL.
    #[must_use]
    pub fn with_gateway(mut self, gateway: impl Into<String>) -> Self {
        self.gateway = Some(gateway.into());
        self
    }
}
