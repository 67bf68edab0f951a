//! SQLite statements run on the connection's handle, from the caller's own thread.
//!
//! sqlx runs each SQLite statement on a thread of the connection's own: every statement
//! is a hand-off to that thread and back, and the hand-offs, not SQLite, were most of
//! the one writer's time (see "The writer pinned with its connection" in
//! `docs/benchmarks.md`). A [`Direct`] takes the connection's handle from that thread
//! once (one hand-off) and runs any number of statements on it, prepared once, until a
//! statement that is only written for sqlx needs the connection back. A set-based batch
//! of claims, steps or receipts thus costs one hand-off instead of one per statement.
//!
//! The statements written here are the hot ones of the delivery path; the others stay
//! sqlx's. Each is written once: the sqlx connection runs a hot statement through a
//! [`Direct`] of its own, and a [`Direct`] runs the others on the sqlx connection.
//!
//! Each take of the handle queues a command on sqlx's thread that may stay queued until
//! the next statement through sqlx; the store's connections have room for far more of
//! them than a batch makes (`COMMAND_QUEUE` in `sqlite.rs`).

use super::StoreError;
use sqlx::SqliteConnection;
use sqlx::sqlite::LockedSqliteHandle;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// Statements the handle's connection keeps prepared while it is held: more than the
/// hot statements, so none is prepared twice in one hold.
const PREPARED: usize = 32;

/// A SQLite connection whose statements run either on its handle, held from the
/// calling thread ([`Direct::db`]), or through sqlx ([`Direct::sqlx`]).
pub(crate) struct Direct<'c> {
    /// The `&'c mut` this was made from. Used only while `held` is empty: holding the
    /// handle and running a statement through sqlx at once would wait on each other.
    conn: NonNull<SqliteConnection>,
    held: Option<Held>,
    borrow: PhantomData<&'c mut SqliteConnection>,
}

/// The handle taken from sqlx's thread, and a connection over it whose statements are
/// finalized (when it drops) before the handle goes back.
struct Held {
    db: rusqlite::Connection,
    _lock: LockedSqliteHandle<'static>,
}

// SAFETY: a `Direct` is a `&mut SqliteConnection` (which is `Send`), plus the handle's
// lock and a connection over it, both of which may move between threads: the lock is an
// async mutex's guard, and the handle is only used by whoever holds it.
unsafe impl Send for Direct<'_> {}

impl<'c> Direct<'c> {
    pub(crate) fn new(conn: &'c mut SqliteConnection) -> Self {
        Self {
            conn: NonNull::from(conn),
            held: None,
            borrow: PhantomData,
        }
    }

    /// The connection over the held handle, taking the handle from sqlx's thread first
    /// if this does not hold it yet.
    pub(crate) async fn db(&mut self) -> Result<&rusqlite::Connection, StoreError> {
        if self.held.is_none() {
            // SAFETY: `conn` came from a `&'c mut` that this borrows for 'c, and `held`
            // is empty, so no other reference to it is in use; the lock taken from it
            // is dropped with `held`, before 'c ends (by `sqlx` or this being dropped).
            let conn: &'static mut SqliteConnection = unsafe { &mut *self.conn.as_ptr() };
            let mut lock = conn.lock_handle().await.map_err(super::sqlite::map_err)?;
            // SAFETY: the handle is open while the lock is held, and the connection over
            // it (which does not close it) is dropped first, finalizing its statements.
            let db = unsafe { rusqlite::Connection::from_handle(lock.as_raw_handle().as_ptr()) }
                .map_err(map_err)?;
            db.set_prepared_statement_cache_capacity(PREPARED);
            self.held = Some(Held { db, _lock: lock });
        }
        match &self.held {
            Some(held) => Ok(&held.db),
            None => unreachable!("the handle was taken just above"),
        }
    }

    /// `sql` prepared on the held handle (once per hold), taking the handle first if
    /// this does not hold it yet.
    pub(crate) async fn statement(
        &mut self,
        sql: &str,
    ) -> Result<rusqlite::CachedStatement<'_>, StoreError> {
        self.db().await?.prepare_cached(sql).map_err(map_err)
    }

    /// The sqlx connection, giving the handle back to sqlx's thread first if this
    /// holds it.
    pub(crate) fn sqlx(&mut self) -> &mut SqliteConnection {
        self.held = None;
        // SAFETY: as in `db`; `held` is now empty and this is borrowed mutably.
        unsafe { self.conn.as_mut() }
    }
}

/// A SQLite error as the store names it, as [`super::sqlite::map_err`] names sqlx's.
pub(crate) fn map_err(e: rusqlite::Error) -> StoreError {
    match &e {
        rusqlite::Error::SqliteFailure(code, message) => {
            let message = message.clone().unwrap_or_else(|| e.to_string());
            match code.code {
                rusqlite::ErrorCode::ConstraintViolation
                    if matches!(
                        code.extended_code,
                        rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                            | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
                    ) =>
                {
                    StoreError::Conflict(message)
                }
                rusqlite::ErrorCode::DatabaseBusy
                | rusqlite::ErrorCode::DatabaseLocked
                | rusqlite::ErrorCode::SystemIoFailure
                | rusqlite::ErrorCode::CannotOpen => StoreError::Unavailable(message),
                _ => StoreError::Other(message),
            }
        }
        _ => StoreError::Other(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::{Connection, Executor};

    async fn memory() -> SqliteConnection {
        let mut conn = SqliteConnection::connect("sqlite::memory:").await.unwrap();
        conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
            .await
            .unwrap();
        conn
    }

    /// Statements on the held handle and through sqlx see each other's writes, in one
    /// transaction, and the handle goes back to sqlx whenever this is done with it.
    #[tokio::test]
    async fn the_handle_and_sqlx_take_turns() {
        let mut conn = memory().await;
        let mut tx = conn.begin().await.unwrap();
        {
            let mut direct = Direct::new(&mut tx);
            let db = direct.db().await.unwrap();
            db.prepare_cached("INSERT INTO t (k, v) VALUES (?1, ?2)")
                .unwrap()
                .execute(rusqlite::params![1, "direct"])
                .unwrap();
            direct
                .sqlx()
                .execute("INSERT INTO t (k, v) VALUES (2, 'sqlx')")
                .await
                .unwrap();
            let db = direct.db().await.unwrap();
            let n: i64 = db
                .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
                .unwrap();
            assert_eq!(n, 2);
            // Dropped while holding the handle: it goes back.
        }
        tx.commit().await.unwrap();
        let rows: Vec<(i64, String)> = sqlx::query_as("SELECT k, v FROM t ORDER BY k")
            .fetch_all(&mut conn)
            .await
            .unwrap();
        assert_eq!(rows, vec![(1, "direct".into()), (2, "sqlx".into())]);
        // The connection closes cleanly: no statement of the handle's was left behind.
        conn.close().await.unwrap();
    }

    /// A duplicate key is a conflict, as through sqlx.
    #[tokio::test]
    async fn errors_are_named_as_sqlx_names_them() {
        let mut conn = memory().await;
        let mut direct = Direct::new(&mut conn);
        let db = direct.db().await.unwrap();
        db.execute("INSERT INTO t (k) VALUES (1)", []).unwrap();
        let e = db.execute("INSERT INTO t (k) VALUES (1)", []).unwrap_err();
        assert!(matches!(map_err(e), StoreError::Conflict(_)));
        let e = db
            .execute("INSERT INTO nowhere (k) VALUES (1)", [])
            .unwrap_err();
        assert!(matches!(map_err(e), StoreError::Other(_)));
    }
}
