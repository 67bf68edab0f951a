//! The write-ahead log of the store's file, flushed beside the writer: the writer
//! commits without a flush and leaves it to this ([`GroupCommit::flush_beside`]).
//!
//! [`GroupCommit::flush_beside`]: crate::store::group::GroupCommit::flush_beside

use super::map_err;
use crate::store::StoreError;
use sqlx::SqlitePool;
use std::path::PathBuf;

/// The log of the database file `db` (as SQLite names it).
///
/// One handle is kept from one flush to the next: the kernel reports a failed write-back
/// once to each handle open when it failed, so a handle opened for each flush could miss
/// one that another handle (the checkpointer's) was told of. It is opened again only
/// when the log at that path is another file: SQLite removes the log when its last
/// connection closes, after copying it into the database file and flushing that.
pub(crate) struct WalFile {
    db: PathBuf,
    wal: PathBuf,
    open: Option<std::fs::File>,
}

impl WalFile {
    pub(crate) fn new(db: PathBuf) -> Self {
        let mut wal = db.as_os_str().to_owned();
        wal.push("-wal");
        Self {
            db,
            wal: PathBuf::from(wal),
            open: None,
        }
    }

    /// Makes every commit so far durable.
    pub(crate) fn flush(&mut self) -> std::io::Result<()> {
        match std::fs::metadata(&self.wal) {
            Ok(at_path) => {
                let file = match self.open.take() {
                    Some(file) if same_file(&file, &at_path)? => file,
                    _ => std::fs::OpenOptions::new().write(true).open(&self.wal)?,
                };
                let flushed = file.sync_data();
                self.open = Some(file);
                flushed
            }
            // No log: what it held is in the database file.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.open = None;
                std::fs::File::open(&self.db)?.sync_all()
            }
            Err(e) => Err(e),
        }
    }

    /// The handle kept since the last flush, if that flushed the log.
    #[cfg(test)]
    pub(crate) fn kept(&self) -> Option<&std::fs::File> {
        self.open.as_ref()
    }
}

/// Whether `file` is the file `at_path` describes.
#[cfg(unix)]
pub(crate) fn same_file(
    file: &std::fs::File,
    at_path: &std::fs::Metadata,
) -> std::io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let open = file.metadata()?;
    Ok((open.dev(), open.ino()) == (at_path.dev(), at_path.ino()))
}

/// Elsewhere the handle is not compared: a fresh one each time.
#[cfg(not(unix))]
pub(crate) fn same_file(_: &std::fs::File, _: &std::fs::Metadata) -> std::io::Result<bool> {
    Ok(false)
}

/// The database file SQLite has open on `pool`, when its journal is a write-ahead log
/// (the log [`WalFile`] flushes); `None` in any other journal mode.
pub(crate) async fn wal_database(pool: &SqlitePool) -> Result<Option<PathBuf>, StoreError> {
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(pool)
        .await
        .map_err(map_err)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Ok(None);
    }
    let file: String =
        sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'")
            .fetch_one(pool)
            .await
            .map_err(map_err)?;
    Ok(Some(PathBuf::from(file)))
}
