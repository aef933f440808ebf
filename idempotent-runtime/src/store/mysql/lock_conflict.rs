//! InnoDB's lock conflicts, and the one rule every write of the register on MySQL follows
//! when it meets one: send it again.
//!
//! An insert batch's duplicate-key check of a key whose record was deleted (released or
//! forgotten, not yet purged) locks the index entries it scans, up to the next key's
//! first entry, then inserts before that entry; an `UPDATE` or `DELETE` of that next key
//! waiting for the same entry closes a cycle, and InnoDB rolls one statement back (error
//! 1213), often the update, which has done the least. A statement that waited
//! `innodb_lock_wait_timeout` for a row lock is rolled back too (1205). Every write —
//! a batch of inserts or completions, a compare-and-set alone, a delete — follows
//! [`Resends`], so a write that lost such a race is sent again, not answered `503` (and
//! its step run again).
//!
//! Not the writes inside a handler's transaction (`records.rs`' `TxRecords`): a deadlock
//! rolls back the whole transaction, the handler's own writes with it, so only the unit
//! of work as a whole can run again.

use sqlx::mysql::MySqlDatabaseError;

use crate::store::StoreError;

/// `ER_LOCK_DEADLOCK`: InnoDB rolled the transaction back to break a deadlock.
const LOCK_DEADLOCK: u16 = 1213;
/// `ER_LOCK_WAIT_TIMEOUT`: the statement waited `innodb_lock_wait_timeout` for a row lock
/// and was rolled back.
const LOCK_WAIT_TIMEOUT: u16 = 1205;

/// How many times a fenced write is sent when InnoDB rolls it back for a lock conflict;
/// then the error is the answer, as any store error is (`503`; the lease runs out).
const FENCED_WRITE_ATTEMPTS: usize = 12;

/// A deadlock or lock wait timeout: InnoDB rolled the statement back, and the same
/// statement may well succeed now.
pub(super) fn is_lock_conflict(error: &sqlx::Error) -> bool {
    let number = error
        .as_database_error()
        .and_then(|db| db.try_downcast_ref::<MySqlDatabaseError>())
        .map(MySqlDatabaseError::number);
    matches!(number, Some(LOCK_DEADLOCK | LOCK_WAIT_TIMEOUT))
}

/// An error that may be a lock conflict: sqlx's, or the store's wrapping it (what the
/// SQL stores' shared `forget` returns).
pub(super) trait LockConflict: std::fmt::Display {
    /// Whether InnoDB rolled the statement back for a lock conflict.
    fn is_lock_conflict(&self) -> bool;
}

impl LockConflict for sqlx::Error {
    fn is_lock_conflict(&self) -> bool {
        is_lock_conflict(self)
    }
}

impl LockConflict for StoreError {
    fn is_lock_conflict(&self) -> bool {
        matches!(self, StoreError::Database(error) if is_lock_conflict(error))
    }
}

/// The rule, for one fenced write (named `write` in the log): send it again after a lock
/// conflict, [`FENCED_WRITE_ATTEMPTS`] times in all at most.
///
/// A write rolled back for a lock conflict committed nothing (an autocommitted statement
/// is undone; a batch's transaction is undone with its connection, which is never used
/// again), and every write is fenced by its token, so sending it again applies it at
/// most once, and never to a record the token lost in between.
pub(super) struct Resends {
    write: &'static str,
    attempt: usize,
}

impl Resends {
    /// The rule for one write, before its first attempt.
    pub(super) fn new(write: &'static str) -> Self {
        Self { write, attempt: 1 }
    }

    /// Whether to send the write again, given what the last attempt answered.
    pub(super) fn again<T, E: LockConflict>(&mut self, answer: &Result<T, E>) -> bool {
        match answer {
            Err(error) if error.is_lock_conflict() && self.attempt < FENCED_WRITE_ATTEMPTS => {
                tracing::debug!(
                    write = self.write,
                    attempt = self.attempt,
                    %error,
                    "a fenced write hit a lock conflict; sending it again"
                );
                self.attempt += 1;
                true
            }
            _ => false,
        }
    }

    /// The pause before the next send: up to a millisecond per attempt so far, drawn at
    /// random. Sent again at once, the statements of a deadlock tend to meet in the same
    /// cycle again; a short, random pause lets one of them finish first.
    pub(super) fn pause(&self) -> std::time::Duration {
        let most = u64::try_from(self.attempt)
            .unwrap_or(u64::MAX)
            .saturating_mul(1000);
        std::time::Duration::from_micros(rand::random_range(0..=most))
    }
}

/// Sends the fenced write `send` by the [`Resends`] rule: again while InnoDB rolls it back
/// for a lock conflict, a few times at most.
pub(super) async fn resend_on_lock_conflict<T, E, Sent>(
    write: &'static str,
    mut send: impl FnMut() -> Sent,
) -> Result<T, E>
where
    E: LockConflict,
    Sent: Future<Output = Result<T, E>>,
{
    let mut resends = Resends::new(write);
    loop {
        let answer = send().await;
        if !resends.again(&answer) {
            return answer;
        }
        tokio::time::sleep(resends.pause()).await;
    }
}
