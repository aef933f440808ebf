//! A connection as SQLite's C handle, borrowed from sqlx, so that a whole batch of the
//! store's writer or reader (`dedicated.rs`) runs in one hand-off to another thread
//! instead of one per statement.
//!
//! sqlx runs each SQLite connection on a thread of its own and sends every statement to
//! it and back: for a batch of `BEGIN`, each write and `COMMIT`, a switch between threads
//! and back for each statement. What the raw connection buys: those switches, which on a
//! busy server cost more CPU than SQLite's own work, are paid once per batch. The writer
//! and the reader borrow their connection's handle from sqlx (`lock_handle`: sqlx's
//! thread waits, using nothing, until the handle is given back) and run each batch on
//! Tokio's blocking pool as plain C calls. The SQL is the same; each statement is
//! prepared once per borrowing and reused.
//!
//! Soundness rests on one rule: **nothing uses the handle after sqlx has it back, and
//! only one thread uses it at a time.** [`Lending`] owns the handle behind a mutex; a
//! batch locks it for its whole run, and dropping the `Lending` (which the task does
//! before it gives the handle back to sqlx) takes the mutex — so it waits for a batch
//! still running, even when the task is dropped mid-batch at runtime shutdown —
//! finalizes the prepared statements and leaves nothing behind, so a batch that had not
//! started yet finds no handle and runs nothing.

use std::borrow::Cow;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use libsqlite3_sys as ffi;
use sqlx::error::{DatabaseError, ErrorKind};
use sqlx::sqlite::LockedSqliteHandle;

/// A parameter of a statement, bound by its position (`?1` is the first).
#[derive(Debug, Clone, Copy)]
pub(super) enum Param<'a> {
    Text(&'a str),
    Blob(&'a [u8]),
    Int(i64),
    Null,
}

/// The borrowed connection: the handle and the statements prepared on it so far.
#[derive(Debug)]
pub(super) struct RawConnection {
    db: NonNull<ffi::sqlite3>,
    /// Keyed by the address of the statement's SQL: each is a `'static` constant.
    statements: Vec<(&'static str, NonNull<ffi::sqlite3_stmt>)>,
}

// SAFETY: SQLite connections opened by sqlx (`SQLITE_OPEN_NOMUTEX`, multi-thread mode)
// may be used from any thread, one thread at a time; `Lending`'s mutex is that one at a
// time, and it is the only way to reach a `RawConnection`.
unsafe impl Send for RawConnection {}

impl RawConnection {
    /// Runs `sql` (no parameters, no rows: `BEGIN`, `COMMIT`, `ROLLBACK`).
    pub(super) fn exec(&mut self, sql: &CStr) -> Result<(), SqliteFailure> {
        loop {
            // SAFETY: `db` is a live connection this thread alone uses (see `Lending`);
            // `sql` is NUL-terminated; no callback, no error-message out-pointer.
            let code = unsafe {
                ffi::sqlite3_exec(
                    self.db.as_ptr(),
                    sql.as_ptr(),
                    None,
                    ptr::null_mut(),
                    ptr::null_mut(),
                )
            };
            if code != ffi::SQLITE_LOCKED_SHAREDCACHE {
                return self.check(code);
            }
            self.wait_for_unlock()?;
        }
    }

    /// Whether a transaction is open (a failed statement or `COMMIT` may leave one).
    pub(super) fn in_transaction(&self) -> bool {
        // SAFETY: as in `exec`.
        unsafe { ffi::sqlite3_get_autocommit(self.db.as_ptr()) == 0 }
    }

    /// Runs `sql` with `params` to completion, ignoring any rows; the rows it changed.
    pub(super) fn execute(
        &mut self,
        sql: &'static str,
        params: &[Param<'_>],
    ) -> Result<u64, SqliteFailure> {
        self.with_statement(sql, params, |this, stmt| {
            while this.step(stmt)? {}
            // SAFETY: as in `exec`; the count is of the statement that just completed
            // (an `int`: the store's statements change one row, a purge at most its
            // limit).
            let changes = unsafe { ffi::sqlite3_changes(this.db.as_ptr()) };
            Ok(u64::try_from(changes).unwrap_or(0))
        })
    }

    /// Runs `sql` with `params` and reads its first row with `read`; `None`: no row.
    pub(super) fn query_row<T>(
        &mut self,
        sql: &'static str,
        params: &[Param<'_>],
        read: impl FnOnce(&Row<'_>) -> T,
    ) -> Result<Option<T>, SqliteFailure> {
        self.with_statement(sql, params, |this, stmt| {
            Ok(this.step(stmt)?.then(|| {
                read(&Row {
                    stmt,
                    _statement: PhantomData,
                })
            }))
        })
    }

    /// `sql` prepared and bound to `params` for `run`, then reset for its next use.
    fn with_statement<T>(
        &mut self,
        sql: &'static str,
        params: &[Param<'_>],
        run: impl FnOnce(&mut Self, NonNull<ffi::sqlite3_stmt>) -> Result<T, SqliteFailure>,
    ) -> Result<T, SqliteFailure> {
        let stmt = self.prepared(sql)?;
        let result = self.bind(stmt, params).and_then(|()| run(self, stmt));
        // SAFETY: `stmt` belongs to `db`; resetting and clearing the bindings leaves it
        // ready for its next use and drops its references to `params` (bound without a
        // copy, `SQLITE_STATIC`) — after `run` read what it needed of the row. `reset`
        // repeats the step's error, already handled.
        unsafe {
            ffi::sqlite3_reset(stmt.as_ptr());
            ffi::sqlite3_clear_bindings(stmt.as_ptr());
        }
        result
    }

    /// One step of `stmt`: `true` when it produced a row, `false` when it is done.
    fn step(&mut self, stmt: NonNull<ffi::sqlite3_stmt>) -> Result<bool, SqliteFailure> {
        loop {
            // SAFETY: a prepared, fully bound statement of `db`.
            match unsafe { ffi::sqlite3_step(stmt.as_ptr()) } {
                ffi::SQLITE_ROW => return Ok(true),
                ffi::SQLITE_DONE => return Ok(false),
                ffi::SQLITE_LOCKED_SHAREDCACHE => {
                    self.wait_for_unlock()?;
                    // SAFETY: as above. A statement stopped by a lock starts over (its
                    // bindings stay); `reset` repeats the lock's code, already handled.
                    unsafe { ffi::sqlite3_reset(stmt.as_ptr()) };
                }
                code => return Err(self.failure(code)),
            }
        }
    }

    fn bind(
        &mut self,
        stmt: NonNull<ffi::sqlite3_stmt>,
        params: &[Param<'_>],
    ) -> Result<(), SqliteFailure> {
        for (i, param) in params.iter().enumerate() {
            let index = c_int::try_from(i + 1).expect("a handful of parameters");
            let s = stmt.as_ptr();
            // SAFETY: `s` is a prepared statement of `db`; text and blobs are bound with
            // their exact length and `SQLITE_STATIC` (no copy): they outlive the step, and
            // `with_statement` clears the bindings right after it. An empty blob is bound as a
            // zero-length blob, never through a pointer SQLite might read as NULL.
            let code = unsafe {
                match *param {
                    Param::Text(text) => ffi::sqlite3_bind_text(
                        s,
                        index,
                        text.as_ptr().cast::<c_char>(),
                        length(text.len())?,
                        ffi::SQLITE_STATIC(),
                    ),
                    Param::Blob([]) => ffi::sqlite3_bind_zeroblob(s, index, 0),
                    Param::Blob(blob) => ffi::sqlite3_bind_blob(
                        s,
                        index,
                        blob.as_ptr().cast(),
                        length(blob.len())?,
                        ffi::SQLITE_STATIC(),
                    ),
                    Param::Int(n) => ffi::sqlite3_bind_int64(s, index, n),
                    Param::Null => ffi::sqlite3_bind_null(s, index),
                }
            };
            self.check(code)?;
        }
        Ok(())
    }

    /// `sql` prepared on this connection, once per connection.
    fn prepared(&mut self, sql: &'static str) -> Result<NonNull<ffi::sqlite3_stmt>, SqliteFailure> {
        if let Some((_, stmt)) = self.statements.iter().find(|(s, _)| ptr::eq(*s, sql)) {
            return Ok(*stmt);
        }
        let mut stmt = ptr::null_mut();
        loop {
            // SAFETY: `sql` is valid UTF-8 of the given length (no NUL needed); `stmt` is
            // an out-pointer SQLite fills; the statement is finalized in `finalize_all`.
            let code = unsafe {
                ffi::sqlite3_prepare_v3(
                    self.db.as_ptr(),
                    sql.as_ptr().cast::<c_char>(),
                    length(sql.len())?,
                    ffi::SQLITE_PREPARE_PERSISTENT,
                    &mut stmt,
                    ptr::null_mut(),
                )
            };
            if code != ffi::SQLITE_LOCKED_SHAREDCACHE {
                self.check(code)?;
                break;
            }
            self.wait_for_unlock()?;
        }
        let stmt = NonNull::new(stmt).ok_or_else(|| SqliteFailure {
            code: ffi::SQLITE_MISUSE,
            message: "the statement's SQL holds no statement".into(),
        })?;
        self.statements.push((sql, stmt));
        Ok(stmt)
    }

    /// Waits until the connection holding a shared-cache lock this connection ran into
    /// ends its transaction. A shared-cache database (sqlx's `sqlite::memory:`) reports
    /// such a lock at once, without the busy timeout: the call is then tried again, as
    /// sqlx does for its own statements. A wait that would deadlock is an error.
    fn wait_for_unlock(&self) -> Result<(), SqliteFailure> {
        let unlocked = Unlocked::default();
        // SAFETY: `db` as in `exec`. SQLite calls `unlock_notified` once with a pointer to
        // `unlocked` (possibly before this returns); `unlocked` outlives that call, since
        // a registration that succeeded is always notified and we wait for it below.
        let code = unsafe {
            ffi::sqlite3_unlock_notify(
                self.db.as_ptr(),
                Some(unlock_notified),
                ptr::from_ref(&unlocked).cast_mut().cast(),
            )
        };
        self.check(code)?;
        let mut done = unlocked.done.lock().unwrap_or_else(PoisonError::into_inner);
        while !*done {
            done = unlocked
                .wait
                .wait(done)
                .unwrap_or_else(PoisonError::into_inner);
        }
        Ok(())
    }

    fn finalize_all(&mut self) {
        for (_, stmt) in self.statements.drain(..) {
            // SAFETY: each was prepared on `db` and is finalized once (drained).
            unsafe { ffi::sqlite3_finalize(stmt.as_ptr()) };
        }
    }

    fn check(&self, code: c_int) -> Result<(), SqliteFailure> {
        if code == ffi::SQLITE_OK {
            Ok(())
        } else {
            Err(self.failure(code))
        }
    }

    fn failure(&self, code: c_int) -> SqliteFailure {
        // SAFETY: as in `exec`; the message is copied before the next call on `db`.
        let (code, message) = unsafe {
            let extended = ffi::sqlite3_extended_errcode(self.db.as_ptr());
            let message = ffi::sqlite3_errmsg(self.db.as_ptr());
            let message = if message.is_null() {
                "(no message)".to_owned()
            } else {
                CStr::from_ptr(message).to_string_lossy().into_owned()
            };
            // The primary code of the call is authoritative; the extended one refines it
            // when it is of the same family.
            let code = if extended & 0xff == code & 0xff {
                extended
            } else {
                code
            };
            (code, message)
        };
        SqliteFailure {
            code,
            message: message.into(),
        }
    }
}

/// The row a statement stands on, read by column position (from 0).
#[derive(Debug)]
pub(super) struct Row<'s> {
    stmt: NonNull<ffi::sqlite3_stmt>,
    /// Valid only while its statement stands on the row (see `query_row`).
    _statement: PhantomData<&'s ()>,
}

impl Row<'_> {
    fn is_null(&self, column: c_int) -> bool {
        // SAFETY: `stmt` stands on a row (see `_statement`).
        unsafe { ffi::sqlite3_column_type(self.stmt.as_ptr(), column) == ffi::SQLITE_NULL }
    }

    /// An INTEGER column; `None` when NULL.
    pub(super) fn int(&self, column: c_int) -> Option<i64> {
        // SAFETY: as in `is_null`.
        (!self.is_null(column))
            .then(|| unsafe { ffi::sqlite3_column_int64(self.stmt.as_ptr(), column) })
    }

    /// A BLOB (or TEXT) column's bytes, copied; `None` when NULL. An empty blob is
    /// `Some` of no bytes.
    pub(super) fn bytes(&self, column: c_int) -> Option<Vec<u8>> {
        if self.is_null(column) {
            return None;
        }
        // SAFETY: as in `is_null`; the pointer is read before any other call on the
        // column (SQLite's order: the value, then its length), and copied at once.
        unsafe {
            let data = ffi::sqlite3_column_blob(self.stmt.as_ptr(), column);
            let len = ffi::sqlite3_column_bytes(self.stmt.as_ptr(), column);
            let len = usize::try_from(len).unwrap_or(0);
            if data.is_null() || len == 0 {
                Some(Vec::new())
            } else {
                Some(std::slice::from_raw_parts(data.cast::<u8>(), len).to_vec())
            }
        }
    }
}

/// What [`RawConnection::wait_for_unlock`] waits on.
#[derive(Debug, Default)]
struct Unlocked {
    done: Mutex<bool>,
    wait: Condvar,
}

/// SQLite's unlock-notify callback: `args` holds `count` pointers to [`Unlocked`]. Must
/// not unwind into C: nothing here panics (a poisoned lock is taken as it is).
unsafe extern "C" fn unlock_notified(args: *mut *mut c_void, count: c_int) {
    let count = usize::try_from(count).unwrap_or(0);
    for i in 0..count {
        // SAFETY: SQLite passes the `count` argument pointers it was registered with,
        // each an `Unlocked` its waiter keeps alive until notified.
        let unlocked = unsafe { &*(*args.add(i)).cast::<Unlocked>() };
        let mut done = unlocked.done.lock().unwrap_or_else(PoisonError::into_inner);
        *done = true;
        // Notified under the lock: the waiter cannot see `done`, return and free
        // `unlocked` before this last use of it.
        unlocked.wait.notify_one();
        drop(done);
    }
}

/// A length as SQLite's C API takes it; lengths beyond `i32` are refused, not cut.
fn length(len: usize) -> Result<c_int, SqliteFailure> {
    c_int::try_from(len).map_err(|_| SqliteFailure {
        code: ffi::SQLITE_TOOBIG,
        message: "a parameter is too large for SQLite".into(),
    })
}

/// The handle, lent by a task to the batches it runs, until this is dropped. It
/// borrows sqlx's lock on the handle, so the compiler keeps that lock held until after
/// this is dropped.
#[derive(Debug)]
pub(super) struct Lending<'a> {
    shared: Arc<Mutex<Option<RawConnection>>>,
    // The borrow of sqlx's lock (see `new`), without its type: `Lending` stays `Sync`.
    _locked: PhantomData<&'a mut ()>,
}

impl<'a> Lending<'a> {
    /// Lends the handle `locked` holds until the returned value is dropped.
    ///
    /// # Safety
    ///
    /// The returned value must be dropped, not forgotten: its drop is what waits for a
    /// batch still running on the handle before sqlx may use it again. (sqlx opens its
    /// connections in a threading mode that lets a connection move between threads.)
    pub(super) unsafe fn new<'h>(locked: &'a mut LockedSqliteHandle<'h>) -> Self
    where
        'h: 'a,
    {
        Self {
            shared: Arc::new(Mutex::new(Some(RawConnection {
                db: locked.as_raw_handle(),
                statements: Vec::new(),
            }))),
            _locked: PhantomData,
        }
    }

    /// Runs `work` on the connection on Tokio's blocking pool. `None`: it did not run to
    /// its end — the blocking pool refused it (runtime shutdown) or it panicked; whatever
    /// it owned is dropped.
    pub(super) async fn run<R, F>(&self, work: F) -> Option<R>
    where
        F: FnOnce(&mut RawConnection) -> R + Send + 'static,
        R: Send + 'static,
    {
        let shared = Arc::clone(&self.shared);
        let job = tokio::task::spawn_blocking(move || {
            let mut lent = shared.lock().unwrap_or_else(PoisonError::into_inner);
            // Gone: the task already took the handle back, nothing may touch it.
            lent.as_mut().map(work)
        });
        job.await.ok().flatten()
    }
}

impl Drop for Lending<'_> {
    fn drop(&mut self) {
        // Waits for a batch running on the handle; a batch not started yet finds `None`.
        let taken = self
            .shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(mut connection) = taken {
            connection.finalize_all();
        }
    }
}

/// An SQLite error code and message from a borrowed handle, as sqlx reports its
/// own, so the store's errors look the same whichever path wrote.
#[derive(Debug, thiserror::Error)]
#[error("(code: {code}) {message}")]
pub(super) struct SqliteFailure {
    /// The extended result code.
    code: c_int,
    message: Cow<'static, str>,
}

impl SqliteFailure {
    /// As the store's error: `StoreError::Database`, like every other SQLite failure.
    pub(super) fn into_sqlx(self) -> sqlx::Error {
        sqlx::Error::Database(Box::new(self))
    }
}

impl DatabaseError for SqliteFailure {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<Cow<'_, str>> {
        Some(self.code.to_string().into())
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> ErrorKind {
        match self.code {
            ffi::SQLITE_CONSTRAINT_UNIQUE | ffi::SQLITE_CONSTRAINT_PRIMARYKEY => {
                ErrorKind::UniqueViolation
            }
            ffi::SQLITE_CONSTRAINT_FOREIGNKEY => ErrorKind::ForeignKeyViolation,
            ffi::SQLITE_CONSTRAINT_NOTNULL => ErrorKind::NotNullViolation,
            ffi::SQLITE_CONSTRAINT_CHECK => ErrorKind::CheckViolation,
            _ => ErrorKind::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
    use sqlx::{Connection, Row, SqlitePool};

    use super::*;

    const INSERT: &str = "INSERT INTO t (v, n) VALUES (?1, ?2)";

    async fn pool(dir: &tempfile::TempDir) -> SqlitePool {
        let options = SqliteConnectOptions::new()
            .filename(dir.path().join("raw.db"))
            .create_if_missing(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .unwrap();
        sqlx::query("CREATE TABLE t (v BLOB, n INTEGER CHECK (n >= 0))")
            .execute(&pool)
            .await
            .unwrap();
        pool
    }

    #[tokio::test]
    async fn statements_run_on_the_lent_handle_and_are_finalized_before_it_goes_back() {
        let dir = tempfile::tempdir().unwrap();
        let pool = pool(&dir).await;
        let mut conn = pool.acquire().await.unwrap();
        {
            let mut locked = conn.lock_handle().await.unwrap();
            // SAFETY: `lending` is dropped, not forgotten.
            let lending = unsafe { Lending::new(&mut locked) };
            let written = lending
                .run(|db| {
                    db.exec(c"BEGIN IMMEDIATE")?;
                    assert!(db.in_transaction());
                    let mut rows = db.execute(INSERT, &[Param::Blob(&[]), Param::Int(1)])?;
                    // The same statement again: prepared once, reused.
                    rows += db.execute(INSERT, &[Param::Null, Param::Int(2)])?;
                    rows += db.execute(INSERT, &[Param::Blob(b"x"), Param::Int(3)])?;
                    db.exec(c"COMMIT")?;
                    assert!(!db.in_transaction());
                    Ok::<_, SqliteFailure>((rows, db.statements.len()))
                })
                .await
                .expect("ran to its end")
                .unwrap();
            assert_eq!(written, (3, 1));
            drop(lending);
            drop(locked);
        }
        let rows = sqlx::query("SELECT v FROM t ORDER BY n")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        let values: Vec<Option<Vec<u8>>> = rows.iter().map(|r| r.get(0)).collect();
        // An empty blob stays an empty blob: NULL means something else to the store (a
        // body over the cap).
        assert_eq!(values, [Some(Vec::new()), None, Some(b"x".to_vec())]);
        // sqlx closes the handle with `sqlite3_close`, which fails (and sqlx's thread
        // panics) while a statement is left unfinalized.
        conn.detach()
            .close()
            .await
            .expect("every statement prepared on the lent handle was finalized");
    }

    #[tokio::test]
    async fn a_refused_statement_reports_sqlites_extended_code_like_sqlx() {
        let dir = tempfile::tempdir().unwrap();
        let pool = pool(&dir).await;
        let mut conn = pool.acquire().await.unwrap();
        let mut locked = conn.lock_handle().await.unwrap();
        // SAFETY: `lending` is dropped, not forgotten.
        let lending = unsafe { Lending::new(&mut locked) };
        let failure = lending
            .run(|db| db.execute(INSERT, &[Param::Text("v"), Param::Int(-1)]))
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(failure.kind(), ErrorKind::CheckViolation);
        assert_eq!(
            failure.code().as_deref(),
            Some(ffi::SQLITE_CONSTRAINT_CHECK.to_string().as_str())
        );
        assert!(failure.message().contains("CHECK"), "{failure}");
        // Statement atomicity: nothing written, no transaction left open.
        let open = lending.run(|db| db.in_transaction()).await.unwrap();
        assert!(!open);
        drop(lending);
        drop(locked);
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(count, 0);
    }
}
