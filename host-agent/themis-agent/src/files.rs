//! Files the agent and the operator's tool replace (saved state, credentials, the
//! trust log): a crash leaves the old file or the new one, never half of either.

use std::io::{self, Write};
use std::path::Path;

/// Replaces the file at `path` with `bytes`: a temporary file beside it
/// (`<name>.tmp`), fsynced, renamed over it, and the directory fsynced.
pub fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    let tmp = path.with_file_name(name);
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::File::open(dir)?.sync_all(),
        _ => Ok(()),
    }
}
