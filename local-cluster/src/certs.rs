use std::path::Path;
use std::process::{Command, Stdio};

use crate::error::Error;

/// Runs `binary certs init` into `dir`: a CA and certificates for election
/// nodes `1..=nodes`, a gateway and a client (see [`crate::PeerAuth::Certs`]).
/// Every server certificate carries the IP addresses `ips` (clients dial
/// them over TLS; default 127.0.0.1).
///
/// # Errors
/// [`Error::Certs`] if it cannot run or fails.
pub fn make_certs(binary: &Path, dir: &Path, nodes: u64, ips: &[&str]) -> Result<(), Error> {
    let ips = if ips.is_empty() {
        "127.0.0.1".to_owned()
    } else {
        ips.join(",")
    };
    let status = Command::new(binary)
        .args([
            "certs",
            "init",
            "--nodes",
            &nodes.to_string(),
            "--ips",
            &ips,
            "--dir",
        ])
        .arg(dir)
        .stdout(Stdio::null())
        .status()
        .map_err(|e| Error::Certs(e.to_string()))?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::Certs(status.to_string()))
    }
}
