//! Postgres store: implemented by the store work.
/// placeholder
#[derive(Debug)]
pub struct PostgresStore;
