//! [`TxSupport`]: a store's offer to run transactional handlers, named without naming
//! any database in the [`Store`](super::Store) trait.

use std::any::Any;
use std::sync::Arc;

#[cfg(feature = "sql")]
use async_trait::async_trait;

#[cfg(feature = "sql")]
use super::{FencingToken, RecordedStep, StoreError, StoredResponse};

/// What a [`Store`](super::Store) offers transactional handlers (`Tx<DB>`): a
/// [`TxStore<DB>`](TxStore) for the one database it keeps its
/// records in, behind a type-erased handle. The engine asks for the database a handler
/// names with [`for_database`](Self::for_database), once per request, and uses the
/// handle it gets both to begin the handler's transaction and to record the response in
/// it.
///
/// Cheap to clone (an `Arc` inside).
#[derive(Clone)]
pub struct TxSupport {
    database: &'static str,
    /// An `Arc<dyn TxStore<DB>>`, boxed once more so it can be recovered by type.
    #[cfg_attr(not(feature = "sql"), allow(dead_code))]
    handle: Arc<dyn Any + Send + Sync>,
}

impl TxSupport {
    /// The name of the database the store's transactions run on (e.g. `PostgreSQL`).
    pub fn database_name(&self) -> &'static str {
        self.database
    }
}

#[cfg(feature = "sql")]
impl TxSupport {
    /// Transactional support on database `DB` through `store`.
    pub fn new<DB: TxDatabase>(store: Arc<dyn TxStore<DB>>) -> Self {
        Self {
            database: DB::DATABASE_NAME,
            handle: Arc::new(store),
        }
    }

    /// The handle for database `DB`; `None` when the store's records live in another
    /// database.
    pub fn for_database<DB: TxDatabase>(&self) -> Option<Arc<dyn TxStore<DB>>> {
        self.handle.downcast_ref::<Arc<dyn TxStore<DB>>>().cloned()
    }
}

impl std::fmt::Debug for TxSupport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxSupport")
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

/// A database transactional handlers can write to: any `sqlx` database. The engine only
/// needs its name, for the error a misconfigured handler gets.
#[cfg(feature = "sql")]
pub trait TxDatabase: sqlx::Database {
    /// The database's display name (`SQLite`, `PostgreSQL`, …).
    const DATABASE_NAME: &'static str;
}

#[cfg(feature = "sql")]
impl<DB: sqlx::Database> TxDatabase for DB {
    const DATABASE_NAME: &'static str = DB::NAME;
}

/// A store's transactional side on database `DB`: what runs a transactional handler's
/// unit of work. A store offers it through [`Capabilities::transactions`](crate::store::Capabilities::transactions)
/// (wrapped in a [`TxSupport`]); the engine resolves it once per
/// request and calls [`begin`](Self::begin), runs the handler, then
/// [`complete_in`](Self::complete_in) on the same connection.
///
/// The handle carries everything the completion needs (pool, table, statements): the
/// engine never goes back to the store to find it.
#[cfg(feature = "sql")]
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

    /// Appends `step` to the claim's steps inside the transaction `conn` (an atomic step:
    /// the step's writes and its record commit together), fenced by `token`.
    /// `Ok(false)`: the token no longer owns the record; the engine rolls back.
    async fn record_step_in(
        &self,
        conn: &mut DB::Connection,
        scope: &str,
        key: &str,
        token: FencingToken,
        step: &RecordedStep,
    ) -> Result<bool, StoreError>;

    /// How many transactions of this store may be open at once, if it must be bounded:
    /// the engine waits for a permit — holding no connection — before
    /// [`begin`](Self::begin), and keeps it until the transaction ends. `None` (the
    /// default): unbounded.
    fn concurrency(&self) -> Option<Arc<tokio::sync::Semaphore>> {
        None
    }

    /// How long a handler may hold its transaction at most, from
    /// [`begin`](Self::begin) to the end of its work, if the store must bound it (SQLite:
    /// the transaction holds the one write lock, under which no other request's renewal
    /// commits). Past it the engine drops the handler, which rolls the transaction back,
    /// as at the handler's maximum duration. `None` (the default): only the maximum
    /// duration bounds it.
    fn max_hold(&self) -> Option<std::time::Duration> {
        None
    }
}
