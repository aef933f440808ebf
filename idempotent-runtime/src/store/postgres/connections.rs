//! [`StatementConnections`]: the connections the store's single-statement operations
//! (every record operation and the waiting mark) run on — the store's own, beside
//! its pool.
//!
//! Why not the pool: sqlx 0.9's pool pings every connection handed back to it, in a task
//! it spawns, before another caller may have it. That is a round trip on the wire, a task
//! and a wake-up on both ends per operation: two for every fresh key, whose statements
//! are two (insert, complete). Here a connection whose statement finished goes straight back to the idle
//! list. One whose operation failed, or was cancelled mid-statement (its caller's future
//! dropped, which can leave a half-read reply on the socket), is closed instead: a
//! connection is only reused in the state a cleanly finished statement left it in.
//!
//! **Taken from the pool, then kept.** A connection is acquired from the store's pool
//! (so the pool's own setup applies: its current connect options, `after_connect` and
//! `before_acquire` hooks, a `search_path` set there) and detached from it, so the pool
//! may open a replacement: the store holds up to the pool's `max_connections` of these
//! on top of the pool's own (one per batching task, plus the renewals, steps and reads
//! running at once). Waiting for a connection, opening included, is bounded by the pool's
//! acquire timeout (then [`sqlx::Error::PoolTimedOut`], as from the pool). An idle
//! connection past the pool's idle timeout, or any past its maximum lifetime, is closed
//! when next looked at. A connection that died while idle (a server restart) fails the
//! operation that finds it, and is then replaced.
//!
//! **Plans.** The group commit statements join arrays of a batch's elements against the
//! table. Postgres plans a prepared statement for its parameters five times, then may
//! switch to one generic plan for good; a generic plan chosen while the table was small
//! (a new deployment, or an empty store) scans the whole table with a hash join, and
//! keeps doing so as it grows. So each connection, once taken, sets
//! `plan_cache_mode = force_custom_plan` for its session (PostgreSQL 12 or later): each
//! execution is planned for its own arrays and the table's size at the time (index
//! lookups), while statements are still parsed once per connection. A server that
//! refuses the setting (older than 12) gets a warning, and the connection is used as it
//! is.

use std::sync::Mutex;
use std::time::Duration;

use sqlx::postgres::{PgConnection, PgPool};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// The store's own connections for its single statements (see the module docs).
pub(super) struct StatementConnections {
    /// Where connections come from (see the module docs).
    pool: PgPool,
    /// Most recently used last: reused first, so the others age out when load drops.
    idle: Mutex<Vec<Idle>>,
    /// One permit per connection lent out (an idle one holds none).
    slots: Semaphore,
    acquire_timeout: Duration,
    idle_timeout: Option<Duration>,
    max_lifetime: Option<Duration>,
}

/// An idle connection, with when it was opened and when it was last given back.
struct Idle {
    connection: Open,
    since: Instant,
}

/// A connection and when it was opened.
struct Open {
    connection: PgConnection,
    opened: Instant,
}

/// A connection lent to one operation. [`release`](Self::release) it once its statement
/// finished; dropped without that, it is closed.
pub(super) struct StatementConnection<'a> {
    open: Option<Open>,
    set: &'a StatementConnections,
    // Dropped after `open` is given back, so no caller waits for a slot that has an
    // idle connection nobody can see yet.
    _slot: SemaphorePermit<'a>,
}

impl StatementConnections {
    /// Connections configured like `pool`'s (see the module docs); none is opened yet.
    pub(super) fn like(pool: &PgPool) -> Self {
        let options = pool.options();
        Self {
            pool: pool.clone(),
            idle: Mutex::default(),
            slots: Semaphore::new(options.get_max_connections() as usize),
            acquire_timeout: options.get_acquire_timeout(),
            idle_timeout: options.get_idle_timeout(),
            max_lifetime: options.get_max_lifetime(),
        }
    }

    /// An idle connection, or a new one; waits for a free slot at most the acquire
    /// timeout, connecting included.
    pub(super) async fn acquire(&self) -> Result<StatementConnection<'_>, sqlx::Error> {
        let deadline = Instant::now() + self.acquire_timeout;
        let slot = tokio::time::timeout_at(deadline, self.slots.acquire())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
            .expect("the semaphore is never closed");
        let open = match self.take_idle() {
            Some(open) => open,
            None => Open {
                connection: tokio::time::timeout_at(deadline, self.take_from_pool())
                    .await
                    .map_err(|_| sqlx::Error::PoolTimedOut)??,
                opened: Instant::now(),
            },
        };
        Ok(StatementConnection {
            open: Some(open),
            set: self,
            _slot: slot,
        })
    }

    /// A connection of the pool's, detached from it and set up for custom plans.
    async fn take_from_pool(&self) -> Result<PgConnection, sqlx::Error> {
        let mut connection = self.pool.acquire().await?.detach();
        let custom_plans = sqlx::query("SET plan_cache_mode = force_custom_plan")
            .execute(&mut connection)
            .await;
        match custom_plans {
            Ok(_) => {}
            // The server answered, the connection is sound: use it as it is.
            Err(error) if error.as_database_error().is_some() => tracing::warn!(
                %error,
                "plan_cache_mode not set (PostgreSQL 12 or later has it): the group \
                 commit statements may be planned for a table smaller than it has become"
            ),
            Err(error) => return Err(error),
        }
        Ok(connection)
    }

    /// The most recently used idle connection, after closing those too old to keep.
    fn take_idle(&self) -> Option<Open> {
        let now = Instant::now();
        let mut idle = self
            .idle
            .lock()
            .expect("never poisoned: no panics while held");
        idle.retain(|kept| {
            let idle_too_long = self
                .idle_timeout
                .is_some_and(|limit| now.duration_since(kept.since) >= limit);
            !idle_too_long && !self.past_lifetime(&kept.connection, now)
        });
        idle.pop().map(|kept| kept.connection)
    }

    fn past_lifetime(&self, open: &Open, now: Instant) -> bool {
        self.max_lifetime
            .is_some_and(|limit| now.duration_since(open.opened) >= limit)
    }

    /// How many connections are open and idle (for `Debug`).
    pub(super) fn idle_count(&self) -> usize {
        self.idle.lock().expect("never poisoned").len()
    }
}

impl StatementConnection<'_> {
    /// The connection, to run one statement on.
    pub(super) fn connection(&mut self) -> &mut PgConnection {
        &mut self
            .open
            .as_mut()
            .expect("present until released")
            .connection
    }

    /// Gives the connection back for the next operation: call it only once the
    /// statement's reply was read to its end.
    pub(super) fn release(mut self) {
        let open = self.open.take().expect("present until released");
        let now = Instant::now();
        if !self.set.past_lifetime(&open, now) {
            self.set.idle.lock().expect("never poisoned").push(Idle {
                connection: open,
                since: now,
            });
        }
    }
}

impl std::fmt::Debug for StatementConnections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatementConnections")
            .field("idle", &self.idle_count())
            .field("free_slots", &self.slots.available_permits())
            .finish()
    }
}
