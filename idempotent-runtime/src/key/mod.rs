//! Idempotency keys: the `Idempotency-Key` request header ([`parse_header`]) and the
//! claimed key a handler receives ([`IdempotencyKey`]).
//!
//! # Header syntax
//!
//! The field value is an RFC 9651 structured-field String: `"8e03978e-40d5"`, where the
//! only escapes are `\"` and `\\`. A bare (unquoted) value such as `8e03978e-40d5` is
//! accepted too and names the same key: the key is always the *unquoted* value, so
//! `"abc"` and `abc` are one key. Whitespace (SP, HTAB) around the field value is ignored,
//! as HTTP ignores it; whitespace inside the quotes is part of the key.
//!
//! # Header rules
//!
//! [`parse_header`] checks, in this order:
//!
//! 1. exactly one field: none is [`KeyError::Missing`], two or more is
//!    [`KeyError::Multiple`] (a present but empty field is [`KeyError::Blank`], not
//!    missing);
//! 2. every byte of the (trimmed) value is printable ASCII `0x20..=0x7E`, else
//!    [`KeyError::InvalidCharacter`] — this covers control characters, tabs inside the
//!    value and obs-text (bytes `>= 0x80`, e.g. UTF-8);
//! 3. the value parses: a value starting with `"` must be one complete sf-string with
//!    nothing after the closing quote; any other value is a bare key. Failures are
//!    [`KeyError::MalformedQuoting`];
//! 4. the unquoted key is not empty or all spaces, else [`KeyError::Blank`];
//! 5. the unquoted key has at most [`MAX_KEY_LEN`] characters, else
//!    [`KeyError::TooLong`].
//!
//! # Bare keys: where this parser is lenient, and where not
//!
//! A strict RFC 9651 sf-token must start with a letter or `*`, which would refuse about
//! two thirds of bare UUIDs. Accepting any other first character is harmless, so a bare
//! key may be any run of visible ASCII (`0x21..=0x7E`) **except** these, which are
//! refused with [`KeyError::MalformedQuoting`] because they carry structure that a key
//! must not silently absorb:
//!
//! - spaces or tabs inside the value (`abc def` is not one token; send `"abc def"`);
//! - `,`, the list separator: a proxy that merges two `Idempotency-Key` fields produces
//!   `a, b`, which must not become a third key;
//! - `;`, which starts structured-field parameters (not supported here);
//! - `"` anywhere but at the start (a broken quoted string).
//!
//! Structured-field parameters after a quoted key (`"abc";p=1`) are refused as trailing
//! characters.

use sha2::{Digest, Sha256};

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::fingerprint::Fingerprint;
use crate::steps::{StepError, StepLog, Verified};
#[cfg(feature = "sql")]
use crate::transaction::{Tx, TxDatabase};

mod header;

pub use header::{KeyError, MAX_KEY_LEN, parse_header, quote};

/// The claimed key, handed to the handler body when it asks for it (an argument of type
/// `IdempotencyKey`). Use [`derive`](Self::derive) for keys sent to downstream providers.
#[derive(Clone)]
pub struct IdempotencyKey {
    name: ScopedKey,
    fingerprint: Option<Fingerprint>,
    /// The claimed execution's steps (recovery points) and its lease, raised by the
    /// engine when lost; `None` for a key the engine did not hand out.
    steps: Option<Arc<StepLog>>,
}

/// Keys are equal when they name the same key of the same request; the lease is state,
/// not identity.
impl PartialEq for IdempotencyKey {
    fn eq(&self, other: &Self) -> bool {
        (&self.name, &self.fingerprint) == (&other.name, &other.fingerprint)
    }
}

impl Eq for IdempotencyKey {}

/// Prints the scope and the key as fields of their own, as they were before they shared
/// one allocation.
impl std::fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyKey")
            .field("scope", &self.scope())
            .field("key", &self.as_str())
            .field("fingerprint", &self.fingerprint)
            .field("steps", &self.steps)
            .finish()
    }
}

impl IdempotencyKey {
    /// The key for `key` in `scope`.
    pub fn new(scope: String, key: String) -> Self {
        Self {
            name: ScopedKey::new(&scope, &key),
            fingerprint: None,
            steps: None,
        }
    }

    /// The key as claimed for a request with `fingerprint` (what the engine hands a
    /// handler): [`derive`](Self::derive) then also depends on the request.
    pub fn for_request(scope: String, key: String, fingerprint: Fingerprint) -> Self {
        Self {
            name: ScopedKey::new(&scope, &key),
            fingerprint: Some(fingerprint),
            steps: None,
        }
    }

    /// The key the engine hands a running handler: it also carries the execution's steps
    /// and, with them, its lease.
    pub(crate) fn claimed(name: ScopedKey, fingerprint: Fingerprint, steps: Arc<StepLog>) -> Self {
        Self {
            name,
            fingerprint: Some(fingerprint),
            steps: Some(steps),
        }
    }

    /// Runs step `name` of this request once: the first execution runs `step` and
    /// records its output with the key's record (fenced by the claim, like the response);
    /// any later execution of the same request — a retry after a crash, a lost lease or a
    /// released `5xx` — gets the recorded output back and does not run `step`. A handler
    /// made of steps therefore resumes where its last execution stopped.
    ///
    /// - `step`'s `Err` is not recorded: the error comes back as
    ///   [`StepError::Failed`], and the step may run again, by the same name, in this
    ///   execution (an inline retry) or a later one.
    /// - An external step is *at least once*: a crash after `step` did its work and before
    ///   its output was recorded runs it again on the retry. Pass
    ///   [`derive`](Self::derive)`(name)` to the provider as its idempotency key, so the
    ///   provider deduplicates that one rerun. A step that writes to the store's own
    ///   database is exactly once with [`atomic_step`](Self::atomic_step).
    /// - Names are unique within a request: calling one again in an execution after it
    ///   gave its output (or while it runs) is [`StepError::NameUsedTwice`]. A recorded output that no longer deserialises as
    ///   `T` is [`StepError::Undecodable`], never a silent rerun.
    /// - No step starts without the lease: one that finds it lost answers
    ///   [`StepError::LeaseLost`] without running.
    ///
    /// Outputs are stored as JSON, within the engine's stored-body cap. Steps recorded
    /// under a request live as long as its record; a completed request's response replaces
    /// them. See the guide's [Multi-step handlers](crate::guide::steps).
    ///
    /// ```
    /// use axum::Json;
    /// use idempotent_runtime::{IdempotencyKey, StepError};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct Authorisation {
    ///     id: String,
    /// }
    ///
    /// # struct Gateway;
    /// # impl Gateway {
    /// #     async fn authorise(&self, _key: &str, _amount: i64) -> Result<Authorisation, String> {
    /// #         Ok(Authorisation { id: "auth_1".into() })
    /// #     }
    /// # }
    /// # struct Mailer;
    /// # impl Mailer {
    /// #     async fn send_receipt(&self, _key: &str, _id: &str) -> Result<(), String> { Ok(()) }
    /// # }
    /// async fn charge(
    ///     key: &IdempotencyKey,
    ///     gateway: &Gateway,
    ///     mailer: &Mailer,
    ///     amount: i64,
    /// ) -> Result<Json<String>, StepError<String>> {
    ///     let authorisation = key
    ///         .step("authorise", || async {
    ///             gateway.authorise(&key.derive("authorise"), amount).await
    ///         })
    ///         .await?;
    ///     key.step("receipt", || async {
    ///         mailer.send_receipt(&key.derive("receipt"), &authorisation.id).await
    ///     })
    ///     .await?;
    ///     Ok(Json(authorisation.id))
    /// }
    /// ```
    pub async fn step<T, E, F, Fut>(&self, name: &str, step: F) -> Result<T, StepError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        match &self.steps {
            Some(log) => log.run(self.scope(), self.as_str(), name, step).await,
            None => Err(StepError::NotClaimed {
                step: name.to_owned(),
            }),
        }
    }

    /// Runs step `name` of this request at most once: for an external call that must
    /// never be repeated blindly, such as a charge at a provider that takes no
    /// idempotency key.
    ///
    /// Before `step` is called, its *intent* is recorded with the key's record (fenced by
    /// the claim, like an output); after it returns, its output. A later execution of the
    /// same request that finds the output resumes with it, as after
    /// [`step`](Self::step). One that finds the intent without an output — the process
    /// died, or the store failed, between the call and its record — does not call again:
    /// it calls `verify`, which looks the call up (at the provider, by
    /// [`derive`](Self::derive)`(name)` say) and answers a [`Verified`]:
    ///
    /// - [`Verified::Happened`]`(output)`: the output is recorded and the request resumes;
    /// - [`Verified::NotHappened`]: `step` is called now;
    /// - [`Verified::Unknown`]: the step fails closed with
    ///   [`StepError::OutcomeUnknown`] (`500` `step_outcome_unknown`); the claim is given
    ///   up with its steps kept, so each retry asks `verify` again, until an operator
    ///   resolves the step ([`Idempotency::resolve_step`](crate::Idempotency::resolve_step))
    ///   or forgets the key;
    /// - `Err(e)`: [`StepError::Failed`]`(e)`, and a retry asks again.
    ///
    /// Without a way to look calls up, pass [`cannot_verify`](crate::steps::cannot_verify):
    /// an unrecorded call is then never repeated and waits for an operator. Nothing is
    /// called if the intent cannot be recorded (the store is down, the lease lost). The
    /// rest is as for [`step`](Self::step): `step`'s `Err` is not recorded and the step
    /// may be called again.
    ///
    /// ```
    /// use idempotent_runtime::steps::Verified;
    /// use idempotent_runtime::{IdempotencyKey, StepError};
    ///
    /// # struct Gateway;
    /// # impl Gateway {
    /// #     async fn charge(&self, _reference: &str, _amount: i64) -> Result<String, String> {
    /// #         Ok("ch_1".into())
    /// #     }
    /// #     async fn find_charge(&self, _reference: &str) -> Result<Option<String>, String> {
    /// #         Ok(None)
    /// #     }
    /// # }
    /// /// A gateway without idempotency keys: a charge is looked up by our reference.
    /// async fn charge(
    ///     key: &IdempotencyKey,
    ///     gateway: &Gateway,
    ///     amount: i64,
    /// ) -> Result<String, StepError<String>> {
    ///     let reference = key.derive("charge");
    ///     key.step_at_most_once(
    ///         "charge",
    ///         || gateway.charge(&reference, amount),
    ///         || async {
    ///             Ok(match gateway.find_charge(&reference).await? {
    ///                 Some(charge) => Verified::Happened(charge),
    ///                 None => Verified::NotHappened,
    ///             })
    ///         },
    ///     )
    ///     .await
    /// }
    /// ```
    pub async fn step_at_most_once<T, E, F, Fut, V, VFut>(
        &self,
        name: &str,
        step: F,
        verify: V,
    ) -> Result<T, StepError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        V: FnOnce() -> VFut,
        VFut: Future<Output = Result<Verified<T>, E>>,
    {
        match &self.steps {
            Some(log) => {
                log.run_at_most_once(self.scope(), self.as_str(), name, step, verify)
                    .await
            }
            None => Err(StepError::NotClaimed {
                step: name.to_owned(),
            }),
        }
    }

    /// Runs step `name` of this request once, exactly once: `step` writes through the
    /// transaction it is given (`Tx<DB>`, on the database the idempotency store keeps
    /// its records in), and its output is recorded in the same transaction. Both commit
    /// together — an atomic phase — or neither does: a crash, an `Err` or a lost claim
    /// rolls the step's writes back, and a retry runs it again from the start.
    ///
    /// `step` is an async closure that borrows the transaction (`&mut Tx<DB>`) and returns
    /// the step's result; the engine commits or rolls back after it. Everything else is as
    /// for [`step`](Self::step); a store of another database answers
    /// [`StepError::TransactionUnsupported`].
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # mod example {
    /// use idempotent_runtime::{IdempotencyKey, Sqlite, StepError, Tx};
    ///
    /// /// Writes one ledger row for the payment; its id is the step's output.
    /// async fn ledger(key: &IdempotencyKey, payment: &str, amount: i64) -> Result<i64, StepError<sqlx::Error>> {
    ///     key.atomic_step("ledger", async |tx: &mut Tx<Sqlite>| {
    ///         let (id,): (i64,) = sqlx::query_as(
    ///             "INSERT INTO ledger (payment, amount) VALUES ($1, $2) RETURNING id",
    ///         )
    ///         .bind(payment)
    ///         .bind(amount)
    ///         .fetch_one(tx.conn())
    ///         .await?;
    ///         Ok(id)
    ///     })
    ///     .await
    /// }
    /// # }
    /// ```
    #[cfg(feature = "sql")]
    pub async fn atomic_step<DB, T, E, F>(&self, name: &str, step: F) -> Result<T, StepError<E>>
    where
        DB: TxDatabase,
        T: Serialize + DeserializeOwned,
        F: AsyncFnOnce(&mut Tx<DB>) -> Result<T, E>,
    {
        match &self.steps {
            Some(log) => {
                log.run_atomic(self.scope(), self.as_str(), name, step)
                    .await
            }
            None => Err(StepError::NotClaimed {
                step: name.to_owned(),
            }),
        }
    }

    /// Whether this request lost its licence to run: the store said the claim was taken
    /// over, or no renewal has succeeded for nearly a whole lease (a tenth of it is kept
    /// as a margin for the store's clock), so a retry may be running the same operation
    /// now or soon. Judged by the engine's monotonic clock at the moment of the call, not
    /// only by what the heartbeat has noticed. A handler with a side effect that cannot be
    /// deduplicated downstream checks this right before it, and answers `503` instead when
    /// it is `true`. Always `false` for a key the engine did not hand out.
    pub fn lease_lost(&self) -> bool {
        self.steps
            .as_ref()
            .is_some_and(|steps| steps.lease().is_lost())
    }

    /// Completes when [`lease_lost`](Self::lease_lost) becomes `true` (never, for a key
    /// the engine did not hand out): race it against slow work with `tokio::select!`.
    pub async fn until_lease_lost(&self) {
        match &self.steps {
            Some(steps) => steps.lease().lost().await,
            None => std::future::pending().await,
        }
    }

    /// The key as the client sent it.
    pub fn as_str(&self) -> &str {
        self.name.key()
    }

    /// The caller's scope.
    pub fn scope(&self) -> &str {
        self.name.scope()
    }

    /// A deterministic key for a downstream call, unique per (scope, key, purpose) and,
    /// for the key the engine hands a handler, per request fingerprint: `idem_` followed
    /// by 64 hex digits (69 characters, within every provider's limit).
    ///
    /// A retry after a crash is the same request under the same key, so it sends the same
    /// derived key and the provider deduplicates too. A key reused after its TTL for a
    /// *different* request derives a different downstream key, so the provider sees a new
    /// operation instead of answering with the old one.
    ///
    /// ```
    /// use idempotent_runtime::IdempotencyKey;
    /// let key = IdempotencyKey::new("acct_alice".into(), "order-1042".into());
    /// assert_eq!(key.derive("charge"), key.derive("charge"));
    /// assert_ne!(key.derive("charge"), key.derive("refund"));
    /// assert_eq!(key.derive("charge").len(), 69);
    ///
    /// use idempotent_runtime::Fingerprint;
    /// let request = |n| Fingerprint { version: 1, digest: [n; 32] };
    /// let claimed = |n| IdempotencyKey::for_request("acct_alice".into(), "order-1042".into(), request(n));
    /// assert_eq!(claimed(1).derive("charge"), claimed(1).derive("charge"));
    /// assert_ne!(claimed(1).derive("charge"), claimed(2).derive("charge"));
    /// ```
    pub fn derive(&self, purpose: &str) -> String {
        let mut hasher = Sha256::new();
        for part in [
            self.scope().as_bytes(),
            self.as_str().as_bytes(),
            purpose.as_bytes(),
        ] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        if let Some(fingerprint) = &self.fingerprint {
            hasher.update(fingerprint.version.to_be_bytes());
            hasher.update(fingerprint.digest);
        }
        let digest = hasher.finalize();
        let mut out = String::with_capacity(69);
        out.push_str("idem_");
        for byte in digest.iter() {
            out.push_str(&format!("{byte:02x}"));
        }
        out
    }
}

impl std::fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request's scope and key in one shared allocation: the claim attempt, its execution,
/// the handler's [`IdempotencyKey`] and the replay cache all hold the same copy instead
/// of two strings each.
#[derive(Clone)]
pub(crate) struct ScopedKey {
    /// The scope followed by the key.
    text: Arc<str>,
    scope_len: usize,
}

impl ScopedKey {
    pub(crate) fn new(scope: &str, key: &str) -> Self {
        // Joined on the stack when it fits, so that the text is allocated once, in its
        // `Arc` (a `String` joined on the heap would be a second allocation per request).
        const ON_STACK: usize = 512;
        let len = scope.len() + key.len();
        let text: Arc<str> = if len <= ON_STACK {
            let mut joined = [0u8; ON_STACK];
            joined[..scope.len()].copy_from_slice(scope.as_bytes());
            joined[scope.len()..len].copy_from_slice(key.as_bytes());
            Arc::from(std::str::from_utf8(&joined[..len]).expect("two strs end to end are UTF-8"))
        } else {
            [scope, key].concat().into()
        };
        Self {
            text,
            scope_len: scope.len(),
        }
    }

    pub(crate) fn scope(&self) -> &str {
        &self.text[..self.scope_len]
    }

    pub(crate) fn key(&self) -> &str {
        &self.text[self.scope_len..]
    }

    /// The scope followed by the key.
    #[cfg(test)]
    pub(crate) fn text(&self) -> &str {
        &self.text
    }
}

impl PartialEq for ScopedKey {
    fn eq(&self, other: &Self) -> bool {
        self.scope_len == other.scope_len && self.text == other.text
    }
}

impl Eq for ScopedKey {}

impl std::fmt::Debug for ScopedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScopedKey")
            .field("scope", &self.scope())
            .field("key", &self.key())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::ScopedKey;

    #[test]
    fn a_scoped_key_splits_back_into_its_scope_and_key_whatever_its_length() {
        let long_scope = "ü".repeat(400); // 800 bytes: joined on the heap
        for (scope, key) in [
            ("acct_1", "k-1"),
            ("é", "ü"), // multi-byte characters on both sides of the seam
            ("", "k"),
            (long_scope.as_str(), "k-2"),
            ("s", &*"x".repeat(511)), // 512 bytes: the largest joined on the stack
            ("s", &*"x".repeat(512)),
        ] {
            let name = ScopedKey::new(scope, key);
            assert_eq!((name.scope(), name.key()), (scope, key));
            assert_eq!(name.text(), format!("{scope}{key}"));
        }
        // The seam is part of the identity: ("ab", "c") is not ("a", "bc").
        assert_ne!(ScopedKey::new("ab", "c"), ScopedKey::new("a", "bc"));
    }
}
