//! Transactional unit of work: the handler's writes and the stored response commit
//! together, or not at all.
//!
//! When a handler's side effect is a write to the same database as the idempotency
//! store, it takes a `tx: &mut Tx<Sqlite>` / `tx: &mut Tx<Postgres>` argument:
//!
//! 1. the claim commits first (in progress, token `T`): duplicates see it at once (`409`);
//! 2. the handler's writes and the completion `… WHERE token = T` run in one transaction;
//! 3. `Ok` with a 2xx/3xx/4xx status: commit — the business rows and the stored response
//!    appear together. If the token no longer owns the record (the lease was taken over),
//!    everything rolls back and the answer is `409`;
//! 4. anything else (`Err` whatever its status, a 5xx, a panic): roll back and release
//!    the claim, so a retry runs again.
//!
//! A crash between 1 and 3 leaves an in-progress claim and no business rows; the lease
//! runs out and a retry does the work exactly once.
//!
//! The handler gets the connection ([`Tx::conn`]) and nothing else: it cannot commit or
//! roll back — the engine decides from its result.

use std::time::Duration;

use async_trait::async_trait;

use crate::store::{FencingToken, StoreError, StoredResponse};

/// The transaction an `#[idempotent]` handler writes through. Run statements on
/// [`conn`](Self::conn):
///
/// ```
/// use idempotent_runtime::{Sqlite, Tx};
///
/// async fn credit(tx: &mut Tx<Sqlite>, account: &str, amount: i64) -> Result<(), sqlx::Error> {
///     sqlx::query("INSERT INTO ledger (account, amount) VALUES ($1, $2)")
///         .bind(account.to_owned())
///         .bind(amount)
///         .execute(tx.conn())
///         .await?;
///     Ok(())
/// }
/// ```
pub struct Tx<DB: TxDatabase> {
    inner: sqlx::Transaction<'static, DB>,
}

impl<DB: TxDatabase> std::fmt::Debug for Tx<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tx").finish_non_exhaustive()
    }
}

impl<DB: TxDatabase> Tx<DB> {
    pub(crate) fn new(inner: sqlx::Transaction<'static, DB>) -> Self {
        Self { inner }
    }

    /// The connection inside the transaction; an `Executor` for `sqlx` queries.
    pub fn conn(&mut self) -> &mut DB::Connection {
        &mut self.inner
    }

    pub(crate) fn into_inner(self) -> sqlx::Transaction<'static, DB> {
        self.inner
    }
}

/// A database transactional handlers can write to: any `sqlx` database. The engine only
/// needs its name, for the error a misconfigured handler gets.
pub trait TxDatabase: sqlx::Database {
    /// The database's display name (`SQLite`, `PostgreSQL`, …).
    const DATABASE_NAME: &'static str;
}

impl<DB: sqlx::Database> TxDatabase for DB {
    const DATABASE_NAME: &'static str = DB::NAME;
}

/// A store's transactional side on database `DB`: what runs a transactional handler's
/// unit of work. A store offers it through [`Store::transactions`](crate::Store::transactions)
/// (wrapped in a [`TxSupport`](crate::store::TxSupport)); the engine resolves it once per
/// request and calls [`begin`](Self::begin), runs the handler, then
/// [`complete_in`](Self::complete_in) on the same connection.
///
/// The handle carries everything the completion needs (pool, table, statements): the
/// engine never goes back to the store to find it.
#[async_trait]
pub trait TxStore<DB: TxDatabase>: Send + Sync + std::fmt::Debug {
    /// Begins the handler's transaction on the store's database (SQLite: `BEGIN
    /// IMMEDIATE`, so a handler that reads before it writes never fails to upgrade its
    /// snapshot).
    async fn begin(&self) -> Result<sqlx::Transaction<'static, DB>, StoreError>;

    /// Marks the claim completed with `response` inside the handler's transaction
    /// (`conn`), fenced by `token`. `Ok(false)`: the token no longer owns the record;
    /// the engine rolls back.
    async fn complete_in(
        &self,
        conn: &mut DB::Connection,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError>;
}

/// How long a transactional handler may wait for its connection before the request is
/// answered `503` (the claim is released).
pub(crate) const BEGIN_TIMEOUT: Duration = Duration::from_secs(10);
