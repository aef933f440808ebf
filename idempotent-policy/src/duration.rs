//! The one duration grammar of the project: the attribute's `ttl = "24h"` (checked at
//! compile time by `idempotent-macros`), and every duration an application reads at run
//! time through `idempotent-runtime` (e.g. the demos' `--lease 1h30m` flags).
//!
//! A duration is one or more parts, each a whole number and a unit, largest unit first,
//! each unit at most once; spaces between the parts, and between a number and its unit,
//! are optional:
//!
//! | unit | meaning |
//! |---|---|
//! | `ms` | milliseconds |
//! | `s` | seconds |
//! | `m` | minutes |
//! | `h` | hours |
//! | `d` | days (24 hours) |
//!
//! `"500ms"`, `"90s"`, `"15m"`, `"24h"`, `"7d"`, `"1h30m"` and `"1h 30m"` are durations;
//! zero is not (a zero TTL or lease is always a mistake).
//!
//! ```
//! use core::time::Duration;
//! use idempotent_policy::duration;
//!
//! assert_eq!(duration::parse("1h 30m"), Ok(Duration::from_secs(5_400)));
//! assert_eq!(duration::parse("1s500ms"), Ok(Duration::from_millis(1_500)));
//! assert_eq!(duration::format(Duration::from_secs(5_400)).to_string(), "1h30m");
//! let error = duration::parse("1.5h").unwrap_err();
//! assert!(error.to_string().contains("whole numbers"), "{error}");
//! ```

use alloc::string::String;
use core::fmt;
use core::time::Duration;

/// The units, largest first: the name, and how many milliseconds it is.
const UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// How a duration is written, for messages.
const EXAMPLES: &str = "e.g. \"500ms\", \"90s\", \"15m\", \"24h\", \"7d\" or \"1h 30m\"";

/// Parses a duration written in the grammar of this module.
///
/// # Errors
///
/// [`DurationError`], whose message quotes the text and says how to write it.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let duration = parse_or_zero(text)?;
    if duration.is_zero() {
        return Err(DurationError {
            text: text.into(),
            kind: DurationErrorKind::Zero,
        });
    }
    Ok(duration)
}

/// Parses a duration like [`parse`], where zero (`"0s"`) is a duration too: for a bound
/// whose zero means "at once" (e.g. how long to wait for a database at startup).
///
/// # Errors
///
/// [`DurationError`], as [`parse`] (never [`DurationErrorKind::Zero`]).
pub fn parse_or_zero(text: &str) -> Result<Duration, DurationError> {
    let error = |kind| DurationError {
        text: text.into(),
        kind,
    };
    let mut rest = text.trim_start();
    if rest.is_empty() {
        return Err(error(DurationErrorKind::Empty));
    }
    let mut total_ms: u64 = 0;
    // Index into `UNITS` of the last unit used: each later one must be smaller.
    let mut last_unit: Option<usize> = None;
    while !rest.is_empty() {
        let digits_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (digits, after_digits) = rest.split_at(digits_len);
        let after_digits = after_digits.trim_start();
        let unit_len = after_digits
            .bytes()
            .take_while(u8::is_ascii_alphabetic)
            .count();
        let (unit, after_unit) = after_digits.split_at(unit_len);
        if digits.is_empty() {
            return Err(error(match after_digits.chars().next() {
                Some(c) if unit.is_empty() => DurationErrorKind::Unexpected(c),
                _ if UNITS.iter().any(|(name, _)| *name == unit) => {
                    DurationErrorKind::MissingNumber(unit.into())
                }
                _ => DurationErrorKind::Word(unit.into()),
            }));
        }
        if unit.is_empty() {
            return Err(error(match after_digits.chars().next() {
                Some('.' | ',') => {
                    DurationErrorKind::Fraction(in_whole_numbers(digits, after_digits))
                }
                Some(c) => DurationErrorKind::Unexpected(c),
                None => DurationErrorKind::MissingUnit(digits.into()),
            }));
        }
        let Some(index) = UNITS.iter().position(|(name, _)| *name == unit) else {
            return Err(error(DurationErrorKind::UnknownUnit(unit.into())));
        };
        if last_unit.is_some_and(|last| index <= last) {
            return Err(error(DurationErrorKind::Order));
        }
        last_unit = Some(index);
        let part = digits
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(UNITS[index].1));
        total_ms = part
            .and_then(|part| total_ms.checked_add(part))
            .ok_or_else(|| error(DurationErrorKind::TooLarge))?;
        rest = after_unit.trim_start();
    }
    Ok(Duration::from_millis(total_ms))
}

/// `integer` and the fraction and unit that follow it (`".5h"`) in whole numbers (`"1h30m"`),
/// when that is a whole number of milliseconds.
fn in_whole_numbers(integer: &str, fraction_and_unit: &str) -> Option<String> {
    let fraction_and_unit = &fraction_and_unit[1..];
    let fraction_len = fraction_and_unit
        .bytes()
        .take_while(u8::is_ascii_digit)
        .count();
    let (fraction, rest) = fraction_and_unit.split_at(fraction_len);
    let rest = rest.trim_start();
    let unit = &rest[..rest.bytes().take_while(u8::is_ascii_alphabetic).count()];
    let unit_ms = UNITS.iter().find(|(name, _)| *name == unit)?.1;
    let scale = 10_u64.checked_pow(u32::try_from(fraction_len).ok()?)?;
    let fraction_ms = fraction.parse::<u64>().ok()?.checked_mul(unit_ms)?;
    if fraction_ms % scale != 0 {
        return None;
    }
    let total_ms = integer
        .parse::<u64>()
        .ok()?
        .checked_mul(unit_ms)?
        .checked_add(fraction_ms / scale)?;
    (total_ms > 0).then(|| alloc::format!("{}", format(Duration::from_millis(total_ms))))
}

/// Writes `duration` in the grammar [`parse`] reads, e.g. `1h30m` or `500ms` (what is
/// below a millisecond is left out; zero is `0s`).
pub fn format(duration: Duration) -> Formatted {
    Formatted(duration)
}

/// A duration written in the grammar [`parse`] reads, from [`format`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Formatted(Duration);

impl fmt::Display for Formatted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest_ms = u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX);
        if rest_ms == 0 {
            return f.write_str("0s");
        }
        for (name, unit_ms) in UNITS {
            let count = rest_ms / unit_ms;
            if count > 0 {
                write!(f, "{count}{name}")?;
                rest_ms %= unit_ms;
            }
        }
        Ok(())
    }
}

/// A text that is not a duration: the text and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationError {
    text: String,
    kind: DurationErrorKind,
}

impl DurationError {
    /// What is wrong, for callers that explain some mistakes in their own words (the
    /// attribute's `wait = "0s"`).
    pub fn kind(&self) -> &DurationErrorKind {
        &self.kind
    }
}

/// What is wrong with a text that is not a duration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DurationErrorKind {
    /// Nothing but spaces.
    Empty,
    /// A number without a unit after it (`"10"`).
    MissingUnit(String),
    /// A unit without a number before it (`"h"`).
    MissingNumber(String),
    /// A unit that is none of `ms`, `s`, `m`, `h`, `d` (`"5w"`, `"1hour"`).
    UnknownUnit(String),
    /// A word where a number should be (`"soon"`, `"1h and 5m"`).
    Word(String),
    /// A fraction (`"1.5h"`), and the part in whole numbers when it has whole milliseconds
    /// (`"1h30m"`).
    Fraction(Option<String>),
    /// A character that is neither a digit, a unit nor a space (`"-5s"`).
    Unexpected(char),
    /// Units not largest first, or one twice (`"30m1h"`, `"1m1m"`).
    Order,
    /// A duration of zero (`"0s"`).
    Zero,
    /// More milliseconds than fit in 64 bits.
    TooLarge,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = &self.text;
        match &self.kind {
            DurationErrorKind::Empty => write!(f, "empty duration: write one, {EXAMPLES}"),
            DurationErrorKind::Zero => {
                write!(
                    f,
                    "duration {text:?} is zero: it must be positive, e.g. \"30s\""
                )
            }
            DurationErrorKind::TooLarge => write!(f, "duration {text:?} is too large"),
            kind => {
                write!(f, "invalid duration {text:?}: ")?;
                match kind {
                    DurationErrorKind::MissingUnit(number) => {
                        write!(f, "{number} needs a unit, e.g. \"{number}s\"")?;
                    }
                    DurationErrorKind::MissingNumber(unit) => {
                        write!(
                            f,
                            "\"{unit}\" needs a whole number before it, e.g. \"1{unit}\""
                        )?;
                    }
                    DurationErrorKind::UnknownUnit(unit) => {
                        write!(f, "unknown unit \"{unit}\"")?;
                    }
                    DurationErrorKind::Word(word) => {
                        write!(f, "\"{word}\" is not a whole number followed by a unit")?;
                    }
                    DurationErrorKind::Fraction(Some(whole)) => {
                        write!(f, "write whole numbers, e.g. \"{whole}\"")?;
                    }
                    DurationErrorKind::Fraction(None) => {
                        f.write_str("write whole numbers, e.g. \"1h30m\" rather than \"1.5h\"")?;
                    }
                    DurationErrorKind::Unexpected(c) => write!(f, "unexpected {c:?}")?,
                    DurationErrorKind::Order => {
                        f.write_str("write the units largest first, each once, e.g. \"1h30m\"")?;
                    }
                    _ => {}
                }
                write!(f, "; the units are ms, s, m, h and d, {EXAMPLES}")
            }
        }
    }
}

impl core::error::Error for DurationError {}

#[cfg(test)]
mod tests {
    use alloc::string::ToString;

    use super::*;

    fn ms(ms: u64) -> Result<Duration, DurationError> {
        Ok(Duration::from_millis(ms))
    }

    #[test]
    fn every_unit() {
        assert_eq!(parse("500ms"), ms(500));
        assert_eq!(parse("90s"), ms(90_000));
        assert_eq!(parse("15m"), ms(900_000));
        assert_eq!(parse("24h"), ms(86_400_000));
        assert_eq!(parse("7d"), ms(604_800_000));
    }

    #[test]
    fn combinations_with_or_without_spaces() {
        assert_eq!(parse("1h30m"), ms(5_400_000));
        assert_eq!(parse("1h 30m"), ms(5_400_000));
        assert_eq!(parse(" 2d 12h "), ms(216_000_000));
        assert_eq!(parse("1 h 30 m"), ms(5_400_000));
        assert_eq!(parse("1d2h3m4s5ms"), ms(93_784_005));
        assert_eq!(parse("0h30m"), ms(1_800_000), "a zero part is fine");
        assert_eq!(parse("0010s"), ms(10_000));
    }

    fn refused(text: &str) -> (DurationErrorKind, alloc::string::String) {
        let error = parse(text).expect_err(text);
        (error.kind().clone(), error.to_string())
    }

    #[test]
    fn zero_is_refused() {
        for text in ["0s", "0ms", "0h0m", "0d 0ms"] {
            let (kind, message) = refused(text);
            assert_eq!(kind, DurationErrorKind::Zero, "{text}");
            assert!(
                message.contains("is zero: it must be positive"),
                "{message}"
            );
        }
    }

    #[test]
    fn zero_is_a_duration_where_it_means_at_once() {
        assert_eq!(parse_or_zero("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_or_zero("0h 0ms"), Ok(Duration::ZERO));
        assert_eq!(parse_or_zero("1h 30m"), ms(5_400_000));
        let error = parse_or_zero("0").unwrap_err();
        assert_eq!(*error.kind(), DurationErrorKind::MissingUnit("0".into()));
    }

    #[test]
    fn mistakes_are_named_with_the_fix() {
        for (text, kind, says) in [
            (
                "",
                DurationErrorKind::Empty,
                "empty duration: write one, e.g.",
            ),
            ("  ", DurationErrorKind::Empty, "empty duration"),
            (
                "10",
                DurationErrorKind::MissingUnit("10".into()),
                "10 needs a unit, e.g. \"10s\"",
            ),
            (
                "1h 30",
                DurationErrorKind::MissingUnit("30".into()),
                "30 needs a unit",
            ),
            (
                "h",
                DurationErrorKind::MissingNumber("h".into()),
                "\"h\" needs a whole number before it, e.g. \"1h\"",
            ),
            (
                "1h m",
                DurationErrorKind::MissingNumber("m".into()),
                "\"m\" needs a whole number",
            ),
            (
                "5w",
                DurationErrorKind::UnknownUnit("w".into()),
                "unknown unit \"w\"; the units are ms, s, m, h and d",
            ),
            (
                "1hour",
                DurationErrorKind::UnknownUnit("hour".into()),
                "unknown unit \"hour\"",
            ),
            (
                "soon",
                DurationErrorKind::Word("soon".into()),
                "\"soon\" is not a whole number followed by a unit",
            ),
            (
                "1h and 5m",
                DurationErrorKind::Word("and".into()),
                "\"and\" is not a whole number",
            ),
            (
                "1.5h",
                DurationErrorKind::Fraction(Some("1h30m".into())),
                "write whole numbers, e.g. \"1h30m\"",
            ),
            (
                "1,5 s",
                DurationErrorKind::Fraction(Some("1s500ms".into())),
                "write whole numbers, e.g. \"1s500ms\"",
            ),
            (
                "2.0001s",
                DurationErrorKind::Fraction(None),
                "write whole numbers, e.g. \"1h30m\" rather than \"1.5h\"",
            ),
            (
                "1.5x",
                DurationErrorKind::Fraction(None),
                "write whole numbers",
            ),
            ("-5s", DurationErrorKind::Unexpected('-'), "unexpected '-'"),
            ("5s!", DurationErrorKind::Unexpected('!'), "unexpected '!'"),
            (
                "30m1h",
                DurationErrorKind::Order,
                "largest first, each once",
            ),
            ("1m1m", DurationErrorKind::Order, "largest first, each once"),
            ("1ms1s", DurationErrorKind::Order, "largest first"),
            (
                "99999999999999999999d",
                DurationErrorKind::TooLarge,
                "is too large",
            ),
            ("999999999999d", DurationErrorKind::TooLarge, "is too large"),
        ] {
            let (actual, message) = refused(text);
            assert_eq!(actual, kind, "{text:?}");
            assert!(
                message.contains(says),
                "{text:?}: {message:?} should say {says:?}"
            );
            assert!(
                message.contains(&alloc::format!("{text:?}")) || text.trim().is_empty(),
                "{message}"
            );
        }
    }

    #[test]
    fn format_writes_what_parse_reads() {
        for (duration, text) in [
            (Duration::from_millis(500), "500ms"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(86_400), "1d"),
            (Duration::from_millis(93_784_005), "1d2h3m4s5ms"),
            (Duration::from_micros(1_500), "1ms"),
        ] {
            assert_eq!(format(duration).to_string(), text);
            assert_eq!(
                parse(text),
                Ok(Duration::from_millis(
                    u64::try_from(duration.as_millis()).unwrap()
                ))
            );
        }
        assert_eq!(format(Duration::ZERO).to_string(), "0s");
    }
}
