//! [`TxSupport`]: a store's offer to run transactional handlers, named without naming
//! any database in the [`Store`](super::Store) trait.

use std::any::Any;
use std::sync::Arc;

/// What a [`Store`](super::Store) offers transactional handlers (`Tx<DB>`): a
/// [`TxStore<DB>`](crate::transaction::TxStore) for the one database it keeps its
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
    pub fn new<DB: crate::transaction::TxDatabase>(
        store: Arc<dyn crate::transaction::TxStore<DB>>,
    ) -> Self {
        Self {
            database: DB::DATABASE_NAME,
            handle: Arc::new(store),
        }
    }

    /// The handle for database `DB`; `None` when the store's records live in another
    /// database.
    pub fn for_database<DB: crate::transaction::TxDatabase>(
        &self,
    ) -> Option<Arc<dyn crate::transaction::TxStore<DB>>> {
        self.handle
            .downcast_ref::<Arc<dyn crate::transaction::TxStore<DB>>>()
            .cloned()
    }
}

impl std::fmt::Debug for TxSupport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxSupport")
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}
