//! How to open a [`PostgresStore`](super::PostgresStore): the URL, the pool
//! and every timeout, so that no fault of the database becomes a hang.

use std::time::Duration;

use tokio_postgres::config::{SslMode, TargetSessionAttrs};

use crate::error::StoreError;
use crate::hooks::StoreHooks;

/// How to open a [`PostgresStore`](super::PostgresStore).
#[derive(Debug, Clone)]
pub struct PostgresStoreConfig {
    /// A libpq-style URL or key=value string. Several hosts
    /// (`postgres://a:5432,b:5432/db?target_session_attrs=read-write`) let
    /// the gateway follow a promoted standby; without `target_session_attrs`
    /// the store asks for `read-write` itself.
    pub url: String,
    /// The largest value a put accepts, in bytes. Default 1 MiB.
    pub max_value_bytes: usize,
    /// Connections at most (per process). Default 16.
    pub pool_size: usize,
    /// How long a request waits for a free connection before a 503
    /// (pool exhausted). Default 1 s.
    pub pool_wait: Duration,
    /// Connecting (TCP, authentication, the read-write check), per host
    /// tried. Default 2 s.
    pub connect_timeout: Duration,
    /// Every statement, measured by the gateway: on expiry the answer is a
    /// 503 and the connection is closed (not reused). Default 5 s.
    ///
    /// The server's own `statement_timeout` is set to 0 for these sessions
    /// on purpose: PostgreSQL answers a statement cancelled while its commit
    /// waits for the synchronous standby with *success* and a warning (the
    /// commit is local, not replicated), which would acknowledge a write a
    /// failover can lose.
    pub statement_timeout: Duration,
    /// `lock_timeout`: a write waiting this long for its lease's lock is
    /// refused with a 503. Default 3 s.
    pub lock_timeout: Duration,
    /// `idle_in_transaction_session_timeout`: the server ends a session idle
    /// this long inside a transaction (only migrations open one). Default 5 s.
    pub idle_in_transaction_timeout: Duration,
    /// The CA (PEM) that signed the server's certificate: the store then
    /// connects over TLS only (`sslmode=require`, whatever the URL says),
    /// and verifies the certificate and the host name against it. `None`:
    /// plain TCP; a URL asking for TLS is then refused, there being nothing
    /// to verify the server with.
    pub ca_pem: Option<Vec<u8>>,
    /// Told when a write raises a fence (`on_flush` is not called: the
    /// database's commits are not seen from here).
    pub hooks: StoreHooks,
}

impl PostgresStoreConfig {
    /// Defaults for the database at `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            max_value_bytes: 1024 * 1024,
            pool_size: 16,
            pool_wait: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(5),
            lock_timeout: Duration::from_secs(3),
            idle_in_transaction_timeout: Duration::from_secs(5),
            ca_pem: None,
            hooks: StoreHooks::default(),
        }
    }

    /// The driver's configuration: the URL with the timeouts and the
    /// session settings the store relies on.
    ///
    /// # Errors
    /// [`StoreError::Engine`] naming what is wrong with the URL.
    pub fn driver_config(&self) -> Result<tokio_postgres::Config, StoreError> {
        let mut config: tokio_postgres::Config = self
            .url
            .parse()
            .map_err(|e| StoreError::Engine(format!("the PostgreSQL URL does not parse: {e}")))?;
        if config.get_options().is_some() {
            return Err(StoreError::Engine(
                "the PostgreSQL URL sets `options`: the gateway sets its own session settings"
                    .into(),
            ));
        }
        encryption(&mut config, self.ca_pem.is_some(), "--pg-ca")?;
        if config.get_target_session_attrs() == TargetSessionAttrs::Any {
            config.target_session_attrs(TargetSessionAttrs::ReadWrite);
        }
        if config.get_application_name().is_none() {
            config.application_name("palisade-gateway");
        }
        config
            .connect_timeout(self.connect_timeout)
            .tcp_user_timeout(self.statement_timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(5))
            .keepalives_interval(Duration::from_secs(1))
            .keepalives_retries(3)
            .options(self.session_options());
        Ok(config)
    }

    /// Session settings, sent with the startup packet (no round trip).
    fn session_options(&self) -> String {
        let ms = |d: Duration| d.as_millis().max(1);
        [
            // Acknowledged means flushed (and, with a synchronous standby,
            // replicated), whatever the server's default.
            "-c synchronous_commit=on".to_owned(),
            "-c statement_timeout=0".to_owned(),
            format!("-c lock_timeout={}", ms(self.lock_timeout)),
            format!(
                "-c idle_in_transaction_session_timeout={}",
                ms(self.idle_in_transaction_timeout)
            ),
            // A statement whose gateway went away is stopped within a second.
            "-c client_connection_check_interval=1000".to_owned(),
            // The write functions rely on a fresh snapshot per statement.
            "-c default_transaction_isolation=read\\ committed".to_owned(),
        ]
        .join(" ")
    }

    /// Checks the relations between the settings.
    ///
    /// # Errors
    /// A sentence naming the broken one.
    pub fn validate(&self) -> Result<(), String> {
        if self.pool_size == 0 {
            return Err("the PostgreSQL pool size must be at least 1".into());
        }
        if self.lock_timeout >= self.statement_timeout {
            return Err(
                "the PostgreSQL lock timeout must be below the statement timeout \
                 (a write waiting for its lease's lock must be refused by the database, \
                 not abandoned by the gateway)"
                    .into(),
            );
        }
        Ok(())
    }
}

/// Settles `config`'s `sslmode` by whether a CA was given (named `ca_flag`
/// in messages): with one, TLS is required and verified against it alone;
/// without one, a URL that asks for TLS is refused (nothing here trusts a
/// server it cannot verify), and any other is plaintext.
///
/// # Errors
/// [`StoreError::Engine`]: a CA with `sslmode=disable`, or `sslmode=require`
/// without a CA.
pub(crate) fn encryption(
    config: &mut tokio_postgres::Config,
    ca_given: bool,
    ca_flag: &str,
) -> Result<(), StoreError> {
    match (ca_given, config.get_ssl_mode()) {
        (true, SslMode::Disable) => Err(StoreError::Engine(
            "the PostgreSQL URL says sslmode=disable, but a CA was given for TLS".into(),
        )),
        (true, _) => {
            config.ssl_mode(SslMode::Require);
            Ok(())
        }
        (false, SslMode::Require) => Err(StoreError::Engine(format!(
            "the PostgreSQL URL asks for TLS (sslmode=require): give the CA that signed the \
             server's certificate ({ca_flag})"
        ))),
        (false, _) => {
            config.ssl_mode(SslMode::Disable);
            Ok(())
        }
    }
}
