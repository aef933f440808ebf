//! Recovery points: the steps a handler completed under a record, kept with the record so
//! that a later execution of the same request resumes after them instead of running them
//! again.
//!
//! A record's steps belong to one *record lifetime* (from the claim of a new or expired
//! key until its TTL ends or it is forgotten) and to the request that claimed it:
//!
//! - [`Store::record_step`](super::Store::record_step) appends one step, fenced by the
//!   claim's token (one atomic operation on the record, like `complete`);
//! - a claim that takes a record over because its lease ran out
//!   ([`Takeover::LeaseLost`](super::Takeover::LeaseLost), same fingerprint only) gets
//!   the steps back in its answer, read in the same atomic operation; a takeover of an
//!   expired record starts a new lifetime without them
//!   ([`steps_survive`](crate::fenced::rules::steps_survive));
//! - `release` of a record that holds steps keeps it, in progress with its lease ended
//!   now and its token [`FencingToken::RELEASED`](super::FencingToken::RELEASED) (so the
//!   released owner can act on it no more) ([`release`](crate::fenced::rules::release)):
//!   the next claim with the same request takes it over and resumes, one with another
//!   request is a mismatch (`422`) until the TTL ends, because the completed steps belong
//!   to the first request;
//! - `complete` drops them (the response replays from then on) and `forget` deletes them
//!   with the record.
//!
//! Every store keeps them as one byte string per record, appended to by
//! [`encode_step`] and read by [`decode_steps`]; a store needs no table of its own.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::StoreError;

/// One step a handler completed under a record: its name and its output, as the engine
/// serialised it (JSON) — or, for an at-most-once step about to be called, its *intent*:
/// the same name with an empty output (no JSON text is empty), recorded before the call
/// and followed by the output once the call returned. A name is recorded once, or twice
/// for an at-most-once step (intent, then output).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedStep {
    /// The step's name, as the handler called it.
    pub name: String,
    /// The step's output, serialised; empty for an intent.
    pub output: Bytes,
    /// When the engine recorded it (the engine's wall clock, to the millisecond).
    pub recorded_at: SystemTime,
}

impl RecordedStep {
    /// The intent of at-most-once step `name`, recorded at `at`: the call may happen from
    /// now on, and its outcome is unknown until the output is recorded.
    pub fn intent(name: &str, at: SystemTime) -> Self {
        Self {
            name: name.to_owned(),
            output: Bytes::new(),
            recorded_at: at,
        }
    }

    /// Whether this is an at-most-once step's intent rather than an output.
    pub fn is_intent(&self) -> bool {
        self.output.is_empty()
    }
}

/// The at-most-once steps among `steps` whose intent is recorded and whose output is not:
/// calls made whose outcome nobody recorded.
pub fn unsettled_intents(steps: &[RecordedStep]) -> Vec<&str> {
    steps
        .iter()
        .filter(|step| step.is_intent())
        .map(|step| step.name.as_str())
        .filter(|name| {
            !steps
                .iter()
                .any(|step| step.name == *name && !step.is_intent())
        })
        .collect()
}

/// The longest step name, in bytes.
pub const MAX_STEP_NAME: usize = 255;

/// The bytes [`Store::record_step`](super::Store::record_step) appends to a record's
/// steps: a `u8`-length-prefixed name, the recording time in milliseconds since the Unix
/// epoch (`i64`), and a `u32`-length-prefixed output, all big-endian. A record's steps are
/// the concatenation of these, in the order they were recorded.
///
/// # Panics
///
/// If the name is longer than [`MAX_STEP_NAME`] bytes or the output longer than
/// `u32::MAX` bytes; the engine refuses both before it calls a store.
pub fn encode_step(step: &RecordedStep) -> Vec<u8> {
    let name = u8::try_from(step.name.len()).expect("step name within MAX_STEP_NAME");
    let output = u32::try_from(step.output.len()).expect("step output within u32");
    let millis = match step.recorded_at.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX),
    };
    let mut out = Vec::with_capacity(1 + step.name.len() + 8 + 4 + step.output.len());
    out.push(name);
    out.extend_from_slice(step.name.as_bytes());
    out.extend_from_slice(&millis.to_be_bytes());
    out.extend_from_slice(&output.to_be_bytes());
    out.extend_from_slice(&step.output);
    out
}

/// A record's steps from the bytes [`encode_step`] appended, in the order they were
/// recorded; empty bytes are no steps.
pub fn decode_steps(bytes: &[u8]) -> Result<Vec<RecordedStep>, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("recorded steps: {what}"));
    let mut steps = Vec::new();
    let mut rest = bytes;
    while let Some((&name_len, after)) = rest.split_first() {
        let name_len = usize::from(name_len);
        let (name, after) = split(after, name_len).ok_or_else(|| corrupt("name cut short"))?;
        let name = std::str::from_utf8(name).map_err(|_| corrupt("name not UTF-8"))?;
        let (millis, after) = split(after, 8).ok_or_else(|| corrupt("time cut short"))?;
        let millis = i64::from_be_bytes(millis.try_into().expect("8 bytes"));
        let (len, after) = split(after, 4).ok_or_else(|| corrupt("length cut short"))?;
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        let (output, after) = split(after, len).ok_or_else(|| corrupt("output cut short"))?;
        let offset = Duration::from_millis(millis.unsigned_abs());
        steps.push(RecordedStep {
            name: name.to_owned(),
            output: Bytes::copy_from_slice(output),
            recorded_at: if millis >= 0 {
                UNIX_EPOCH + offset
            } else {
                UNIX_EPOCH - offset
            },
        });
        rest = after;
    }
    Ok(steps)
}

/// `bytes` cut after `at`, if it is that long.
fn split(bytes: &[u8], at: usize) -> Option<(&[u8], &[u8])> {
    (bytes.len() >= at).then(|| bytes.split_at(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(name: &str, output: &[u8], millis: u64) -> RecordedStep {
        RecordedStep {
            name: name.to_owned(),
            output: Bytes::copy_from_slice(output),
            recorded_at: UNIX_EPOCH + Duration::from_millis(millis),
        }
    }

    #[test]
    fn steps_round_trip_in_order() {
        let steps = [
            step("authorise", br#"{"id":"auth_1"}"#, 1_700_000_000_123),
            step("", b"", 0),
            step(&"n".repeat(MAX_STEP_NAME), &[0, 255, 0, 1], 5),
        ];
        let bytes: Vec<u8> = steps.iter().flat_map(encode_step).collect();
        assert_eq!(decode_steps(&bytes).unwrap(), steps);
        assert_eq!(decode_steps(&[]).unwrap(), Vec::new());
    }

    #[test]
    fn cut_short_is_corrupt() {
        let bytes = encode_step(&step("ledger", b"12345", 9));
        for len in 1..bytes.len() {
            assert!(
                matches!(decode_steps(&bytes[..len]), Err(StoreError::Corrupt(_))),
                "{len}"
            );
        }
    }
}
