//! [`MemoryStore`]: records in a mutex-guarded map.
//!
//! **Single process only.** Two instances of an app each have their own map, so a retry
//! landing on the other instance runs the handler again, and a restart forgets every
//! key. Use it for tests and single-process demos; use `SqliteStore` on one host and
//! `PostgresStore` across hosts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::takeover::{Found, takeover};
use super::{
    ClaimOutcome, ClaimRequest, FencingToken, Store, StoreError, StoredResponse,
    retry_after_from_millis,
};
use crate::clock::{Clock, SystemClock, millis};
use crate::fingerprint::Fingerprint;

/// An in-memory [`Store`] for tests and single-process demos (see the module docs).
#[derive(Debug, Clone)]
pub struct MemoryStore {
    records: Arc<Mutex<HashMap<(String, String), Record>>>,
    clock: Arc<dyn Clock>,
}

#[derive(Debug, Clone)]
struct Record {
    fingerprint: Fingerprint,
    token: FencingToken,
    expires_at: i64,
    state: State,
}

impl Record {
    /// Not expired: within its TTL, or a claim whose lease is still live.
    fn is_live(&self, now: i64) -> bool {
        self.expires_at > now
            || matches!(self.state, State::InProgress { lease_expires_at } if lease_expires_at > now)
    }
}

#[derive(Debug, Clone)]
enum State {
    InProgress { lease_expires_at: i64 },
    Completed(StoredResponse),
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An empty store on `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            records: Arc::default(),
            clock,
        }
    }

    /// How many records the store holds (expired ones included until purged).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the store holds no records.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Record>> {
        // A panic while holding the lock cannot leave a record half-written: every
        // mutation below is a single insert, remove or field assignment.
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with_owned_record<R>(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        f: impl FnOnce(&mut HashMap<(String, String), Record>, (String, String), i64) -> R,
        otherwise: R,
    ) -> R {
        let now = self.clock.now_millis();
        let mut records = self.lock();
        let id = (scope.to_owned(), key.to_owned());
        match records.get(&id) {
            Some(r) if r.token == token && matches!(r.state, State::InProgress { .. }) => {
                f(&mut records, id, now)
            }
            _ => otherwise,
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn try_claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let now = self.clock.now_millis();
        let mut records = self.lock();
        let id = (claim.scope.to_owned(), claim.key.to_owned());
        let takeover = match records.get(&id) {
            None => None,
            Some(existing) => {
                let same_fingerprint = existing.fingerprint == *claim.fingerprint;
                let found = Found {
                    completed: matches!(existing.state, State::Completed(_)),
                    ttl_ran_out: existing.expires_at <= now,
                    lease_ran_out: matches!(
                        existing.state,
                        State::InProgress { lease_expires_at } if lease_expires_at <= now
                    ),
                    same_fingerprint,
                };
                match takeover(found) {
                    Some(reason) => Some(reason),
                    None if !same_fingerprint => return Ok(ClaimOutcome::Mismatch),
                    None => {
                        return Ok(match &existing.state {
                            State::Completed(response) => ClaimOutcome::Replay(response.clone()),
                            State::InProgress { lease_expires_at } => ClaimOutcome::InProgress {
                                retry_after: retry_after_from_millis(lease_expires_at - now),
                            },
                        });
                    }
                }
            }
        };
        records.insert(
            id,
            Record {
                fingerprint: *claim.fingerprint,
                token: claim.token,
                expires_at: now.saturating_add(millis(claim.ttl)),
                state: State::InProgress {
                    lease_expires_at: now.saturating_add(millis(claim.lease)),
                },
            },
        );
        Ok(ClaimOutcome::Claimed {
            token: claim.token,
            takeover,
        })
    }

    async fn renew(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        Ok(self.with_owned_record(
            scope,
            key,
            token,
            |records, id, now| {
                if let Some(record) = records.get_mut(&id) {
                    let lease_expires_at = now.saturating_add(millis(lease));
                    record.state = State::InProgress { lease_expires_at };
                    record.expires_at = record.expires_at.max(lease_expires_at);
                }
                true
            },
            false,
        ))
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        Ok(self.with_owned_record(
            scope,
            key,
            token,
            |records, id, _| {
                if let Some(record) = records.get_mut(&id) {
                    record.state = State::Completed(response.clone());
                }
                true
            },
            false,
        ))
    }

    async fn release(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        Ok(self.with_owned_record(
            scope,
            key,
            token,
            |records, id, _| records.remove(&id).is_some(),
            false,
        ))
    }

    async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError> {
        let now = self.clock.now_millis();
        let mut records = self.lock();
        let expired: Vec<_> = records
            .iter()
            .filter(|(_, r)| !r.is_live(now))
            .map(|(id, _)| id.clone())
            .take(limit as usize)
            .collect();
        for id in &expired {
            records.remove(id);
        }
        Ok(expired.len() as u64)
    }
}
