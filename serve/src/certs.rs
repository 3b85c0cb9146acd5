//! A cluster's certificates, made by `palisade certs init`: one CA, one
//! certificate per election node (for peer mTLS, and the client API), one
//! for the gateway, one client certificate. Keys are written 0600.
//!
//! A node's certificate names it as `node-<id>.palisade` (see
//! [`node_name`]): that name, not an address, is what peers verify, so a
//! certificate stolen from one node cannot speak for another.

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

/// The common name of the cluster CA.
const CA_NAME: &str = "palisade cluster CA";

/// The DNS name a node's certificate carries and its peers verify.
pub fn node_name(id: u64) -> String {
    format!("node-{id}.palisade")
}

/// Why certificates could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen refused the parameters.
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file could not be written.
    #[error("{path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// A certificate authority that issues the cluster's certificates.
pub struct Authority {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

/// One issued certificate and its key, PEM. `Debug` shows neither.
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued").finish_non_exhaustive()
    }
}

impl Authority {
    /// A fresh CA (ECDSA P-256), valid for about ten years.
    ///
    /// # Errors
    /// [`CertError::Generate`].
    pub fn new(name: &str) -> Result<Self, CertError> {
        Self::with_key(name, KeyPair::generate()?)
    }

    /// The CA `init` wrote into `dir`, from its key (`ca-key.pem`): the
    /// certificates it issues chain to the `ca.pem` there (same name, same
    /// key).
    ///
    /// # Errors
    /// [`CertError`] if the key cannot be read or parsed.
    pub fn load(dir: &Path) -> Result<Self, CertError> {
        let path = dir.join("ca-key.pem");
        let pem =
            std::fs::read_to_string(&path).map_err(|source| CertError::Write { path, source })?;
        Self::with_key(CA_NAME, KeyPair::from_pem(&pem)?)
    }

    fn with_key(name: &str, key: KeyPair) -> Result<Self, CertError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_after = rcgen::date_time_ymd(2036, 1, 1);
        let cert = params.self_signed(&key)?;
        Ok(Self { cert, key })
    }

    /// Issues node `id`'s certificate (see [`node_name`]) with the extra
    /// names of `layout`, and writes it into `dir`.
    ///
    /// # Errors
    /// [`CertError`].
    pub fn write_node(
        &self,
        dir: &Path,
        id: u64,
        layout: &Layout,
    ) -> Result<Vec<PathBuf>, CertError> {
        let mut dns = vec![node_name(id)];
        dns.extend(layout.dns.iter().cloned());
        let issued = self.issue(&node_name(id), &dns, &layout.ips)?;
        let cert = dir.join(format!("node-{id}.pem"));
        let key = dir.join(format!("node-{id}-key.pem"));
        write_file(&cert, &issued.cert_pem, false)?;
        write_file(&key, &issued.key_pem, true)?;
        Ok(vec![cert, key])
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// Issues a certificate for `common_name` valid for `dns` names and `ips`,
    /// usable both as a server and as a client certificate.
    ///
    /// # Errors
    /// [`CertError::Generate`].
    pub fn issue(
        &self,
        common_name: &str,
        dns: &[String],
        ips: &[IpAddr],
    ) -> Result<Issued, CertError> {
        let mut params = CertificateParams::new(dns.to_vec())?;
        params
            .subject_alt_names
            .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.not_after = rcgen::date_time_ymd(2036, 1, 1);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// Writes `contents` to `path`, readable by the owner only when `secret`.
///
/// # Errors
/// [`CertError::Write`].
pub fn write_file(path: &Path, contents: &str, secret: bool) -> Result<(), CertError> {
    let failed = |source| CertError::Write {
        path: path.to_owned(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    let mut file = options.open(path).map_err(failed)?;
    file.write_all(contents.as_bytes()).map_err(failed)?;
    file.sync_all().map_err(failed)
}

/// What [`init`] writes for a cluster of `nodes` nodes; `hosts` are extra
/// names (and addresses) every node's and the gateway's certificate also
/// carries, for clients that dial them by that name.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Node ids are 1..=nodes.
    pub nodes: u64,
    /// Extra DNS names on every server certificate (e.g. `localhost`).
    pub dns: Vec<String>,
    /// Extra IP addresses on every server certificate (e.g. 127.0.0.1).
    pub ips: Vec<IpAddr>,
}

/// Writes `ca.pem`, `ca-key.pem`, `node-<id>.pem`/`node-<id>-key.pem`,
/// `gateway.pem`/`gateway-key.pem` and `client.pem`/`client-key.pem` into
/// `dir` (created 0700). Returns the files written.
///
/// # Errors
/// [`CertError`].
pub fn init(dir: &Path, layout: &Layout) -> Result<Vec<PathBuf>, CertError> {
    let failed = |source| CertError::Write {
        path: dir.to_owned(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(failed)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(failed)?;
    }
    let authority = Authority::new(CA_NAME)?;
    let mut dns = vec!["gateway.palisade".to_owned()];
    dns.extend(layout.dns.iter().cloned());
    let gateway = authority.issue("gateway.palisade", &dns, &layout.ips)?;
    let client = authority.issue("client.palisade", &["client.palisade".to_owned()], &[])?;
    let files = [
        ("ca.pem", authority.cert_pem(), false),
        ("ca-key.pem", authority.key.serialize_pem(), true),
        ("gateway.pem", gateway.cert_pem.clone(), false),
        ("gateway-key.pem", gateway.key_pem.clone(), true),
        ("client.pem", client.cert_pem.clone(), false),
        ("client-key.pem", client.key_pem.clone(), true),
    ];
    let mut written = Vec::new();
    for (name, contents, secret) in files {
        let path = dir.join(name);
        write_file(&path, &contents, secret)?;
        written.push(path);
    }
    for id in 1..=layout.nodes {
        written.extend(authority.write_node(dir, id, layout)?);
    }
    Ok(written)
}
