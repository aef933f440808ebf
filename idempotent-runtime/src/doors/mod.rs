//! Doors other than HTTP: where duplicates come from besides an API's `POST`. Each door
//! runs the user's function through [`Idempotency::once`](crate::Idempotency::once), the
//! same protocol the HTTP handlers go through, and turns its [`Outcome`](crate::Outcome)
//! into the transport's answer by [`Outcome::disposition`](crate::Outcome::disposition),
//! the one rule every queue door follows.
//!
//! - [`nats`] (feature `nats`): a NATS JetStream pull consumer, keyed by `Nats-Msg-Id`.
//! - [`rabbitmq`] (feature `rabbitmq`): a RabbitMQ consumer, keyed by `message_id`.

#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;

/// Logs what one message the engine ran came to: why it is delivered again when it did
/// not complete or its record is not confirmed, then the one line every message gets,
/// with its outcome and `replied` (what the broker was told, and after what delay).
#[cfg(any(feature = "nats", feature = "rabbitmq"))]
fn log_answered<T, E: std::fmt::Display>(
    door: &'static str,
    scope: &str,
    key: &str,
    outcome: &crate::Outcome<T, E>,
    replied: &str,
    delay: Option<std::time::Duration>,
) {
    use crate::Outcome;
    match outcome {
        Outcome::Failed(failure) => {
            tracing::info!(door, scope, key, %failure, "the function did not complete; {replied}")
        }
        Outcome::RanUnrecorded(_) => tracing::warn!(
            door,
            scope,
            key,
            "ran, but its record is not confirmed; {replied}, so a redelivery replays it"
        ),
        _ => {}
    }
    let what = outcome_name(outcome);
    match delay {
        Some(delay) => {
            tracing::info!(door, scope = %scope, key = %key, outcome = %what, ?delay, "{replied}")
        }
        None => tracing::info!(door, scope = %scope, key = %key, outcome = %what, "{replied}"),
    }
}

/// What `outcome` came to, in one word, for the line each door logs per message.
#[cfg(any(feature = "nats", feature = "rabbitmq"))]
fn outcome_name<T, E>(outcome: &crate::Outcome<T, E>) -> &'static str {
    use crate::Outcome;
    match outcome {
        Outcome::Ran(_) => "ran",
        Outcome::RanUnrecorded(_) => "ran_unrecorded",
        Outcome::Replayed(_) => "replayed",
        Outcome::Failed(_) => "failed",
        Outcome::InProgress { .. } => "in_progress",
        Outcome::KeyReused => "key_reused",
        Outcome::StoreUnavailable(_) => "store_unavailable",
        Outcome::Interrupted => "interrupted",
        Outcome::Unreadable(_) => "unreadable",
        Outcome::Refused(_) => "refused",
    }
}

/// A transaction on `idempotency`'s store's database for a keyless message run
/// unprotected, and the permit of the store's bound it holds; `None` when none could be
/// begun (logged, the message to be redelivered).
#[cfg(all(feature = "sql", any(feature = "nats", feature = "rabbitmq")))]
async fn begin_unprotected<DB: crate::transaction::TxDatabase>(
    idempotency: &crate::Idempotency,
    door: &'static str,
) -> Option<(
    Option<tokio::sync::OwnedSemaphorePermit>,
    crate::transaction::Tx<DB>,
)> {
    let tx_store = idempotency
        .store()
        .capabilities()
        .transactions
        .and_then(|support| support.for_database::<DB>());
    let Some(tx_store) = tx_store else {
        tracing::error!(
            door,
            database = DB::DATABASE_NAME,
            "transactional function on an engine whose store is not of its database; redelivered"
        );
        return None;
    };
    match crate::transaction::begin(tx_store.as_ref()).await {
        Ok(begun) => Some((begun.permit, crate::transaction::Tx::new(begun.transaction))),
        Err(err) => {
            tracing::error!(door, error = %err, "beginning the transaction failed; redelivered");
            None
        }
    }
}

/// Ends an unprotected run's transaction as its `result` says: committed on `Ok`, rolled
/// back on `Err`; `None` when an `Ok`'s commit failed (logged, the message to be
/// redelivered).
#[cfg(all(feature = "sql", any(feature = "nats", feature = "rabbitmq")))]
async fn end_unprotected<DB: crate::transaction::TxDatabase, T, E>(
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    tx: crate::transaction::Tx<DB>,
    result: Result<T, E>,
    door: &'static str,
) -> Option<Result<T, E>> {
    let ended = match &result {
        Ok(_) => tx.into_inner().commit().await,
        Err(_) => tx.into_inner().rollback().await,
    };
    drop(permit);
    match (result, ended) {
        (result, Ok(())) => Some(result),
        (Ok(_), Err(err)) => {
            tracing::error!(door, error = %err, "committing the unprotected transaction failed; redelivered");
            None
        }
        // Its writes are gone either way: the function's own error is the news.
        (Err(error), Err(_)) => Some(Err(error)),
    }
}
