//! [`Endpoints`]: where the election cluster (and gateway) are, as every
//! client command takes them (flags, then the environment), and the SDK
//! client they make.

use clap::Args;
use palisade_client::{Client, ClientConfig, Error};

/// Where the election cluster (and gateway) are.
#[derive(Debug, Clone, Args)]
pub struct Endpoints {
    /// Election node URLs, comma-separated; any node will do.
    #[arg(
        long,
        env = "PALISADE_ELECTION",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7001,http://127.0.0.1:7002,http://127.0.0.1:7003"
    )]
    pub election: Vec<String>,
    /// The gateway URL (for fence-on-acquire and fenced writes).
    #[arg(long, env = "PALISADE_GATEWAY")]
    pub gateway: Option<String>,
    /// The CA (PEM) to trust for https:// endpoints (e.g. certs/ca.pem).
    #[arg(long, env = "PALISADE_CA")]
    pub ca: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub credentials: super::http::Credentials,
    /// Print JSON instead of readable lines.
    #[arg(long)]
    pub json: bool,
}

impl Endpoints {
    /// An SDK client for these endpoints.
    ///
    /// # Errors
    /// The CA or key file cannot be used.
    pub fn client(&self) -> Result<Client, Error> {
        Ok(Client::new(self.config()?))
    }

    /// The SDK configuration for these endpoints (for callers that adjust
    /// it, as `cluster status` its timeouts).
    ///
    /// # Errors
    /// The CA or key file cannot be used.
    pub fn config(&self) -> Result<ClientConfig, Error> {
        let mut config = ClientConfig::new(self.election.clone());
        config.gateway = self.gateway.clone();
        if let Some(ca) = &self.ca {
            config = config.with_ca_file(ca)?;
        }
        let key = self
            .credentials
            .key()
            .map_err(|e| Error::BadRequest(e.to_string()))?;
        if let Some(key) = key {
            config = config.with_api_key(&key)?;
        }
        let credentials = &self.credentials;
        if let (Some(cert), Some(key)) = (&credentials.client_cert, &credentials.client_key) {
            config = config.with_client_cert_files(cert, key)?;
        }
        Ok(config)
    }
}
