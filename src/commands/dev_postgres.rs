//! `palisade dev --postgres`: the throwaway PostgreSQL that dev's two
//! gateways share, in the dev data dir (`<data-dir>/postgres`, kept when
//! the data dir is reused), run as the `postgres` user when dev runs as
//! root, on a free loopback port with trust authentication.

use std::path::Path;

use palisade_local_cluster::{postgres_installed, PostgresServer, PG_INSTALL_HINT};

/// Whether `palisade dev --postgres` can run here; if not, the line that
/// says how to fix it.
pub(crate) fn check_installed() -> Result<(), String> {
    if postgres_installed() {
        Ok(())
    } else {
        Err(format!(
            "palisade dev --postgres needs PostgreSQL's binaries: {PG_INSTALL_HINT}"
        ))
    }
}

/// Starts (creating on first use) the dev PostgreSQL under `root`.
///
/// # Errors
/// When initdb or the start fails; the message names the log.
pub(crate) fn start(root: &Path) -> anyhow::Result<PostgresServer> {
    // The postgres user must reach its directory: the dev dir gets o+x
    // (traverse, not list; the files in it keep their own modes).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(root)?.permissions().mode();
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(mode | 0o001))?;
    }
    let dir = root.join("postgres");
    let mut server = PostgresServer::open_or_init(&dir, &[])?;
    server
        .start(0)
        .map_err(|e| anyhow::anyhow!("{e} (log: {})", dir.join("server.log").display()))?;
    Ok(server)
}
