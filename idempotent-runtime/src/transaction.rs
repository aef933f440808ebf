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

use crate::key::IdempotencyKey;

pub use crate::store::{TxDatabase, TxStore};

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

    /// A savepoint inside the transaction, for a handler that must recover from a failed
    /// statement: run the statement that may fail on the savepoint, then
    /// [`rollback`](sqlx::Transaction::rollback) it (only its writes are undone, and the
    /// transaction stays usable) or [`commit`](sqlx::Transaction::commit) it (release the
    /// savepoint). Without one, a failed statement leaves a Postgres transaction aborted:
    /// the request is then answered `500 transaction_aborted` and nothing is written,
    /// whatever the handler returns. (SQLite keeps a transaction usable after a failed
    /// statement; the savepoint works there too.)
    ///
    /// ```
    /// # #[cfg(feature = "postgres")]
    /// # mod example {
    /// use idempotent_runtime::{Postgres, Tx};
    ///
    /// /// Inserts the payer unless it exists; the transaction stays usable either way.
    /// async fn ensure_payer(tx: &mut Tx<Postgres>, id: &str) -> Result<bool, sqlx::Error> {
    ///     let mut savepoint = tx.savepoint().await?;
    ///     let inserted = sqlx::query("INSERT INTO payers (id) VALUES ($1)")
    ///         .bind(id)
    ///         .execute(&mut *savepoint)
    ///         .await;
    ///     match inserted {
    ///         Ok(_) => {
    ///             savepoint.commit().await?;
    ///             Ok(true)
    ///         }
    ///         Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
    ///             savepoint.rollback().await?;
    ///             Ok(false)
    ///         }
    ///         Err(e) => Err(e),
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn savepoint(&mut self) -> Result<sqlx::Transaction<'_, DB>, sqlx::Error> {
        sqlx::Connection::begin(&mut *self.inner).await
    }

    pub(crate) fn into_inner(self) -> sqlx::Transaction<'static, DB> {
        self.inner
    }
}

/// A transactional function, `async |key, tx: &mut Tx<DB>| …`, whose future is `Send`:
/// implemented by every such closure, and never named by an application.
///
/// The engine finishes a function whose caller stopped waiting in a task of its own, so
/// its future must be `Send`; stable Rust cannot yet say that of an `AsyncFnOnce`'s
/// future, and this trait says it through the closure's `FnOnce` side instead.
pub trait TxFunction<'tx, DB: TxDatabase, T, E>:
    FnOnce(IdempotencyKey, &'tx mut Tx<DB>) -> Self::Running
{
    /// The future of one call, borrowing the transaction.
    type Running: Future<Output = Result<T, E>> + Send + 'tx;
}

impl<'tx, DB, T, E, F, Running> TxFunction<'tx, DB, T, E> for F
where
    DB: TxDatabase,
    F: FnOnce(IdempotencyKey, &'tx mut Tx<DB>) -> Running,
    Running: Future<Output = Result<T, E>> + Send + 'tx,
{
    type Running = Running;
}

/// How long a transactional handler may wait for its connection before the request is
/// answered `503` (the claim is released).
pub(crate) const BEGIN_TIMEOUT: Duration = Duration::from_secs(10);

/// A transaction begun on a [`TxStore`], with the permit of the store's bound on open
/// transactions (if it has one), to be kept until the transaction ends.
pub(crate) struct Begun<DB: TxDatabase> {
    pub(crate) transaction: sqlx::Transaction<'static, DB>,
    pub(crate) permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Begins a transaction on `tx_store`: waits for a permit of its bound (holding nothing),
/// then for a connection, all within [`BEGIN_TIMEOUT`].
pub(crate) async fn begin<DB: TxDatabase>(
    tx_store: &dyn TxStore<DB>,
) -> Result<Begun<DB>, crate::store::StoreError> {
    let begin = async {
        let permit = match tx_store.concurrency() {
            Some(bound) => Some(bound.acquire_owned().await.map_err(|_| {
                crate::store::StoreError::backend(std::io::Error::other("the store is closed"))
            })?),
            None => None,
        };
        let transaction = tx_store.begin().await?;
        Ok(Begun {
            transaction,
            permit,
        })
    };
    tokio::time::timeout(BEGIN_TIMEOUT, begin)
        .await
        .unwrap_or(Err(crate::store::StoreError::Timeout(BEGIN_TIMEOUT)))
}
