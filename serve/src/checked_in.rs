//! Generated files kept in the repository (the OpenAPI documents): a test
//! compares the checked-in copy with what the code generates now.

use std::path::Path;

/// Whether `path` holds exactly `generated`; with `PALISADE_WRITE_OPENAPI=1`
/// it is rewritten first. `Err` says how to refresh it (`crate_name` is the
/// package whose test regenerates it).
///
/// # Errors
/// The checked-in copy is missing or differs.
pub fn matches(generated: &str, path: &Path, crate_name: &str) -> Result<(), String> {
    if std::env::var("PALISADE_WRITE_OPENAPI").as_deref() == Ok("1") {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        std::fs::write(path, generated).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let stored = std::fs::read_to_string(path).unwrap_or_default();
    if stored == generated {
        Ok(())
    } else {
        Err(format!(
            "{} is stale: run PALISADE_WRITE_OPENAPI=1 cargo test -p {crate_name} openapi",
            path.display()
        ))
    }
}
