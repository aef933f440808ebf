//! Metric keys built once instead of per request.
//!
//! The `metrics` macros build a key on every call: a `Vec` of labels allocated, the key
//! hashed. A request records several metrics, and every label value the engine uses is a
//! `&'static str` (a handler's name, an outcome, an operation), so each key can be built
//! once: at compile time for the store operations, on first use for the handler-labelled
//! ones. The recorder is still looked up on every call, so a recorder installed later, or
//! a thread-local one in a test, sees everything.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{LazyLock, Mutex};

use metrics::{Counter, Histogram, Key, Label, Level, Metadata};

use super::{StoreOperation, UNNAMED};

/// Where the engine's metrics come from, as the `metrics` macros would say it.
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The counter `key` in the current recorder.
pub(super) fn counter(key: &Key) -> Counter {
    metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA))
}

/// The histogram `key` in the current recorder.
pub(super) fn histogram(key: &Key) -> Histogram {
    metrics::with_recorder(|recorder| recorder.register_histogram(key, &METADATA))
}

/// The [`STORE_OPERATION_DURATION`](super::STORE_OPERATION_DURATION) key of `operation`
/// and its result, built at compile time.
pub(super) fn of_store_operation(operation: StoreOperation, ok: bool) -> &'static Key {
    /// The `(ok, error)` keys of one operation.
    macro_rules! keys_of {
        ($operation:expr) => {{
            static LABELS: [[Label; 2]; 2] = [
                [
                    Label::from_static_parts("operation", $operation.as_str()),
                    Label::from_static_parts("result", "ok"),
                ],
                [
                    Label::from_static_parts("operation", $operation.as_str()),
                    Label::from_static_parts("result", "error"),
                ],
            ];
            static KEYS: [Key; 2] = [
                Key::from_static_parts(super::STORE_OPERATION_DURATION, &LABELS[0]),
                Key::from_static_parts(super::STORE_OPERATION_DURATION, &LABELS[1]),
            ];
            &KEYS
        }};
    }
    let keys = match operation {
        StoreOperation::Claim => keys_of!(StoreOperation::Claim),
        StoreOperation::Renew => keys_of!(StoreOperation::Renew),
        StoreOperation::Complete => keys_of!(StoreOperation::Complete),
        StoreOperation::Release => keys_of!(StoreOperation::Release),
        StoreOperation::RecordStep => keys_of!(StoreOperation::RecordStep),
        StoreOperation::Purge => keys_of!(StoreOperation::Purge),
    };
    &keys[usize::from(!ok)]
}

/// Which key: the metric, the handler and the optional second label, each a
/// `&'static str` told apart by address and length (two equal strings at different
/// addresses get two equal keys, which a recorder merges).
type Identity = [(usize, usize); 4];

/// Hashes an [`Identity`]: addresses and lengths of `&'static str`s the engine chose, not
/// input a client controls, so a multiply-rotate hash does (SipHash, the default, was
/// most of the cost of recording a metric when no recorder is installed).
#[derive(Default)]
struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_usize(usize::from(b));
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (self.0.rotate_left(5) ^ n as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

type KeysByIdentity = HashMap<Identity, &'static Key, BuildHasherDefault<IdentityHasher>>;

/// Handler-labelled keys built so far. A program has finitely many handler names
/// (`&'static str`s) and label values, so this stays small; each key and its labels are
/// leaked once, as `&'static` is what a key without allocation needs.
static HANDLER_KEYS: LazyLock<Mutex<KeysByIdentity>> = LazyLock::new(Mutex::default);

thread_local! {
    /// This thread's copy of the keys it used: a lookup takes no lock and writes nothing
    /// shared, so worker threads never contend over a metric.
    static LOCAL_KEYS: RefCell<KeysByIdentity> = RefCell::default();
}

/// The `metric` key labelled `handler` (unnamed: [`UNNAMED`]) and, when given, one more
/// `(label, value)`.
pub(super) fn of_handler(
    metric: &'static str,
    handler: Option<&'static str>,
    second: Option<(&'static str, &'static str)>,
) -> &'static Key {
    let handler = handler.unwrap_or(UNNAMED);
    let (label, value) = second.unwrap_or(("", ""));
    let identity = [metric, handler, label, value].map(|s| (s.as_ptr() as usize, s.len()));
    LOCAL_KEYS.with(|local| {
        if let Some(key) = local.borrow().get(&identity) {
            return *key;
        }
        let key = *HANDLER_KEYS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(identity)
            .or_insert_with(|| {
                let mut labels = vec![Label::from_static_parts("handler", handler)];
                if let Some((label, value)) = second {
                    labels.push(Label::from_static_parts(label, value));
                }
                let labels: &'static [Label] = Vec::leak(labels);
                Box::leak(Box::new(Key::from_static_parts(metric, labels)))
            });
        local.borrow_mut().insert(identity, key);
        key
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{HANDLER_DURATION, Outcome, REQUESTS_TOTAL, STORE_OPERATION_DURATION};

    fn labels(key: &Key) -> Vec<(&str, &str)> {
        key.labels()
            .map(|label| (label.key(), label.value()))
            .collect()
    }

    #[test]
    fn store_operation_keys_carry_their_labels() {
        for &operation in StoreOperation::ALL {
            for (ok, result) in [(true, "ok"), (false, "error")] {
                let key = of_store_operation(operation, ok);
                assert_eq!(key.name(), STORE_OPERATION_DURATION);
                assert_eq!(
                    labels(key),
                    [("operation", operation.as_str()), ("result", result)]
                );
            }
        }
    }

    #[test]
    fn handler_keys_carry_their_labels_and_are_built_once() {
        for &outcome in Outcome::ALL {
            let second = Some(("outcome", outcome.as_str()));
            let key = of_handler(REQUESTS_TOTAL, Some("orders"), second);
            assert_eq!(key.name(), REQUESTS_TOTAL);
            assert_eq!(
                labels(key),
                [("handler", "orders"), ("outcome", outcome.as_str())]
            );
            assert!(std::ptr::eq(
                key,
                of_handler(REQUESTS_TOTAL, Some("orders"), second)
            ));
        }
        let key = of_handler(HANDLER_DURATION, None, None);
        assert_eq!(key.name(), HANDLER_DURATION);
        assert_eq!(labels(key), [("handler", UNNAMED)]);
        let other = of_handler(HANDLER_DURATION, Some("refunds"), None);
        assert_eq!(labels(other), [("handler", "refunds")]);
    }
}
