//! TLS material: PEM files in, rustls configs out (the `ring` provider, TLS
//! 1.2 and 1.3). A server config either requires a client certificate that
//! chains to a CA (mutual TLS, as between election nodes) or asks for none.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// Why TLS material could not be used; names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM item.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// rustls refused the combination (a key that does not match its
    /// certificate, an empty CA, ...).
    #[error("TLS setup: {0}")]
    Config(String),
}

fn file_error(path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// The crypto provider every Palisade TLS config uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file (a chain: leaf first).
///
/// # Errors
/// [`TlsError::File`] if unreadable or without a certificate.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no certificate in the file"));
    }
    Ok(certs)
}

/// The private key in a PEM file.
///
/// # Errors
/// [`TlsError::File`] if unreadable or without a key.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_error(path, e))
}

/// The trust anchors of a CA file.
///
/// # Errors
/// [`TlsError`] if unreadable or not a usable CA certificate.
pub fn roots(ca: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(ca)? {
        roots.add(cert).map_err(|e| file_error(ca, e))?;
    }
    Ok(Arc::new(roots))
}

/// What a server asks of its clients' certificates.
#[derive(Debug, Clone, Copy)]
pub enum ClientCerts<'a> {
    /// None is asked for.
    None,
    /// Every client must present one chaining to this CA (mutual TLS).
    Required(&'a Path),
    /// A client may present one chaining to this CA (then checked, and
    /// the request carries it: a policy may name it), or none.
    Optional(&'a Path),
}

/// A server config presenting `cert`/`key`. With `client_ca`, every client
/// must present a certificate chaining to it (mutual TLS); without, none is
/// asked for.
///
/// # Errors
/// [`TlsError`] naming the file or the mismatch.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let clients = client_ca.map_or(ClientCerts::None, ClientCerts::Required);
    server_config_with(cert, key, clients)
}

/// A server config presenting `cert`/`key`, asking `clients` of its
/// clients.
///
/// # Errors
/// [`TlsError`] naming the file or the mismatch.
pub fn server_config_with(
    cert: &Path,
    key: &Path,
    clients: ClientCerts<'_>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match clients {
        ClientCerts::Required(ca) | ClientCerts::Optional(ca) => {
            let mut verifier = WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider());
            if matches!(clients, ClientCerts::Optional(_)) {
                verifier = verifier.allow_unauthenticated();
            }
            let verifier = verifier
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        ClientCerts::None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(load_certs(cert)?, load_key(key)?)
        .map_err(|e| TlsError::Config(format!("{}: {e}", cert.display())))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A client config trusting only `ca`, presenting `identity` (cert, key)
/// when given.
///
/// # Errors
/// [`TlsError`] naming the file or the mismatch.
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots(ca)?);
    match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .map_err(|e| TlsError::Config(format!("{}: {e}", cert.display()))),
        None => Ok(builder.with_no_client_auth()),
    }
}

/// Whether a certificate (already verified against the CA by the handshake)
/// is valid for the DNS name `name`: how a peer's claimed identity is
/// checked against its client certificate.
pub fn certificate_names(certificate: &CertificateDer<'_>, name: &str) -> bool {
    let Ok(name) = rustls::pki_types::ServerName::try_from(name) else {
        return false;
    };
    webpki::EndEntityCert::try_from(certificate)
        .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
}
