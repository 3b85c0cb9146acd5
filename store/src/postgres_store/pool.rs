//! The bounded pool of sessions (deadpool-postgres), the connections it
//! opens (server notices logged), and what the database's failures mean
//! to the gateway.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime, TimeoutType,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::{AsyncMessage, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::config::PostgresStoreConfig;
use crate::error::StoreError;

/// A pool of at most `pool_size` sessions; a caller waits `pool_wait` for
/// one at most.
///
/// # Errors
/// [`StoreError::Engine`] for a URL that does not parse.
pub(crate) fn build(config: &PostgresStoreConfig) -> Result<Pool, StoreError> {
    let tls = config.ca_pem.as_deref().map(tls_connector).transpose()?;
    let manager = Manager::from_connect(
        config.driver_config()?,
        LoggedConnect { tls },
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let hosts = manager_hosts(config);
    Pool::builder(manager)
        .max_size(config.pool_size)
        .wait_timeout(Some(config.pool_wait))
        // Each host tried gets the connect timeout, and one more second.
        .create_timeout(Some(
            config.connect_timeout * hosts + Duration::from_secs(1),
        ))
        .recycle_timeout(Some(Duration::from_secs(1)))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| StoreError::Engine(format!("cannot build the PostgreSQL pool: {e}")))
}

fn manager_hosts(config: &PostgresStoreConfig) -> u32 {
    config
        .driver_config()
        .map_or(1, |c| c.get_hosts().len().max(1) as u32)
}

/// A session taken from the pool for one operation. Unless
/// [`Session::release`] is called — the operation ended with an answer the
/// session survives — it is closed on drop instead of going back to the
/// pool: a session whose statement timed out, was abandoned by its request
/// or failed may still be busy or broken.
pub(crate) struct Session {
    object: Option<Object>,
}

impl Session {
    /// A session from `pool`, or the reason there is none.
    pub(crate) async fn take(pool: &Pool) -> Result<Self, StoreError> {
        let object = pool.get().await.map_err(pool_error)?;
        Ok(Self {
            object: Some(object),
        })
    }

    /// The session's client.
    pub(crate) fn client(&self) -> Option<&deadpool_postgres::ClientWrapper> {
        self.object.as_deref()
    }

    /// The session's client, to open a transaction on.
    pub(crate) fn client_mut(&mut self) -> Option<&mut deadpool_postgres::ClientWrapper> {
        self.object.as_deref_mut()
    }

    /// Puts the session back into the pool.
    pub(crate) fn release(mut self) {
        self.object.take();
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(object) = self.object.take() {
            // Detached from the pool; dropping the client ends its
            // connection task, which closes the socket.
            drop(Object::take(object));
        }
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").finish_non_exhaustive()
    }
}

/// Connects with the driver (over TLS when the store was given a CA) and
/// drives the connection on its own task, logging the server's warnings (a
/// cancelled wait for the synchronous standby is one: see
/// `PostgresStoreConfig::statement_timeout`).
struct LoggedConnect {
    tls: Option<MakeRustlsConnect>,
}

type Connected = (tokio_postgres::Client, tokio::task::JoinHandle<()>);

impl deadpool_postgres::Connect for LoggedConnect {
    fn connect(
        &self,
        pg_config: &tokio_postgres::Config,
    ) -> Pin<Box<dyn Future<Output = Result<Connected, tokio_postgres::Error>> + Send + '_>> {
        let pg_config = pg_config.clone();
        Box::pin(async move {
            Ok(match &self.tls {
                Some(tls) => {
                    let (client, connection) = pg_config.connect(tls.clone()).await?;
                    (client, drive(connection))
                }
                None => {
                    let (client, connection) = pg_config.connect(NoTls).await?;
                    (client, drive(connection))
                }
            })
        })
    }
}

/// Drives `connection` on its own task until it ends, logging notices.
fn drive<S, T>(mut connection: tokio_postgres::Connection<S, T>) -> tokio::task::JoinHandle<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            match poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notice(notice))) => tracing::warn!(
                    code = notice.code().code(),
                    "PostgreSQL: {}",
                    notice.message()
                ),
                Some(Ok(_)) => {}
                Some(Err(err)) => {
                    tracing::debug!(%err, "a PostgreSQL connection ended");
                    break;
                }
                None => break,
            }
        }
    })
}

/// One session of its own, outside any pool (the CLI's `palisade sql`):
/// over TLS verified against `ca_pem` when given (`ca_flag` names where it
/// came from, for messages; [`super::config::encryption`]), its connection
/// driven on its own task.
///
/// # Errors
/// [`StoreError::Engine`] for a URL or CA that cannot be used; the
/// driver's error otherwise ([`database_error`]).
pub async fn connect_once(
    url: &str,
    ca_pem: Option<&[u8]>,
    ca_flag: &str,
) -> Result<tokio_postgres::Client, StoreError> {
    let mut config: tokio_postgres::Config = url
        .parse()
        .map_err(|e| StoreError::Engine(format!("the PostgreSQL URL does not parse: {e}")))?;
    super::config::encryption(&mut config, ca_pem.is_some(), ca_flag)?;
    let client = match ca_pem.map(tls_connector).transpose()? {
        Some(tls) => {
            let (client, connection) = config.connect(tls).await.map_err(|e| database_error(&e))?;
            drive(connection);
            client
        }
        None => {
            let (client, connection) = config
                .connect(NoTls)
                .await
                .map_err(|e| database_error(&e))?;
            drive(connection);
            client
        }
    };
    Ok(client)
}

/// A TLS connector trusting the CA certificates in `pem` alone (rustls on
/// ring, as the servers use): the server's certificate must chain to one
/// and name the host connected to.
fn tls_connector(pem: &[u8]) -> Result<MakeRustlsConnect, StoreError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let problem = |what: String| StoreError::Engine(format!("the PostgreSQL CA: {what}"));
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| problem(format!("not PEM certificates: {e}")))?;
        roots.add(cert).map_err(|e| problem(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(problem("holds no certificate".into()));
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| problem(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// Why no session could be had.
fn pool_error(err: PoolError) -> StoreError {
    match err {
        PoolError::Timeout(TimeoutType::Wait) => {
            StoreError::Unavailable("every database connection is busy (pool exhausted)".into())
        }
        PoolError::Timeout(TimeoutType::Create) => {
            StoreError::Unavailable("connecting to the database timed out".into())
        }
        PoolError::Timeout(TimeoutType::Recycle) => {
            StoreError::Unavailable("a database connection did not recycle in time".into())
        }
        PoolError::Backend(err) => database_error(&err),
        other => StoreError::Unavailable(format!("no database connection: {other}")),
    }
}

/// What a failed statement means. Every database failure is worth a retry
/// to the client (503): a lock held too long, a restart, a lost connection,
/// a demoted primary; the text says which.
pub(crate) fn database_error(err: &tokio_postgres::Error) -> StoreError {
    let code = err.code().map(|c| c.code().to_owned());
    let reason = match code.as_deref() {
        Some("55P03") => "a lease is locked by another session (lock timeout)",
        Some("25006") => "the database is read-only (a standby, or a demoted primary)",
        Some(c) if c.starts_with("57P") => "the database is shutting down or starting",
        Some(c) if c.starts_with("08") => "the database connection failed",
        Some(c) if c.starts_with("53") => "the database is out of resources",
        Some(_) => "the database refused the statement",
        None if err.is_closed() => "the database connection is closed",
        None => "the database did not answer",
    };
    StoreError::Unavailable(format!("{reason}: {}", with_causes(err)))
}

/// `err` and its causes on one line: the driver's own text is only "db
/// error" or "error performing TLS handshake"; the server's message (a
/// `pg_hba.conf` refusal) or rustls's (an unknown issuer) is in the causes.
fn with_causes(err: &tokio_postgres::Error) -> String {
    let mut text = err.to_string();
    let mut cause = std::error::Error::source(err);
    while let Some(inner) = cause {
        let more = inner.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = inner.source();
    }
    text.replace('\n', " ")
}
