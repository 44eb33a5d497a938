//! The data directory and the ledger files in it hold every tenant's data (sealed secrets,
//! hashes, effects): only the service's own user may read them. Whatever reckon creates is
//! made private from the start (a directory 0700, a file 0600); SQLite gives the `-wal`
//! and `-shm` files beside a database the permissions of the database file, so making the
//! file before SQLite does makes all three private. What already exists is left as the
//! operator made it.

use std::path::Path;

/// Create `dir` and any missing parent, each new one 0700 (on Unix).
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
    }
    #[cfg(not(unix))]
    {
        std::fs::create_dir_all(dir)
    }
}

/// Create the empty file `path` 0600 (on Unix) unless it exists.
pub fn create_private_file(path: &Path) -> std::io::Result<()> {
    let mut open = std::fs::OpenOptions::new();
    open.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        open.mode(0o600);
    }
    match open.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}
