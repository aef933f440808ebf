//! Human durations as the attribute and the demo's flags write them: `"90s"`, `"15m"`,
//! `"24h"`, `"7d"`, and combinations such as `"1h30m"`.

use std::time::Duration;

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The string was empty.
    #[error("empty duration; write e.g. \"90s\", \"15m\", \"24h\", \"7d\" or \"1h30m\"")]
    Empty,
    /// A number without a unit, a unit without a number, or an unknown unit.
    #[error(
        "invalid duration {0:?}; write numbers with units s, m, h or d, e.g. \"90s\" or \"1h30m\""
    )]
    Invalid(String),
    /// The duration adds up to zero.
    #[error("duration {0:?} is zero; it must be positive")]
    Zero(String),
    /// Too large to represent.
    #[error("duration {0:?} is too large")]
    Overflow(String),
}

/// Parses `"90s"`, `"15m"`, `"24h"`, `"7d"` or a combination like `"1h30m"`.
///
/// ```
/// use std::time::Duration;
/// use idempotent_runtime::duration::parse;
/// assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
/// assert!(parse("0s").is_err());
/// ```
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(DurationError::Empty);
    }
    let invalid = || DurationError::Invalid(text.to_owned());
    let overflow = || DurationError::Overflow(text.to_owned());
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in trimmed.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit_secs = match c {
            's' => 1,
            'm' => 60,
            'h' => 3_600,
            'd' => 86_400,
            _ => return Err(invalid()),
        };
        if digits.is_empty() {
            return Err(invalid());
        }
        let n: u64 = digits.parse().map_err(|_| overflow())?;
        let part = n.checked_mul(unit_secs).ok_or_else(overflow)?;
        total = total.checked_add(part).ok_or_else(overflow)?;
        digits.clear();
    }
    if !digits.is_empty() {
        return Err(invalid());
    }
    if total == 0 {
        return Err(DurationError::Zero(text.to_owned()));
    }
    Ok(Duration::from_secs(total))
}

/// `Duration::from_secs`, as a `const fn` path the macro expansion can name.
#[doc(hidden)]
pub const fn from_secs(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_combinations() {
        assert_eq!(parse("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse("7d"), Ok(Duration::from_secs(604_800)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5_400)));
    }

    #[test]
    fn refuses_bad_input() {
        assert_eq!(parse(""), Err(DurationError::Empty));
        assert!(matches!(parse("10"), Err(DurationError::Invalid(_))));
        assert!(matches!(parse("h"), Err(DurationError::Invalid(_))));
        assert!(matches!(parse("5w"), Err(DurationError::Invalid(_))));
        assert!(matches!(parse("0m0s"), Err(DurationError::Zero(_))));
        assert!(matches!(
            parse("99999999999999999999d"),
            Err(DurationError::Overflow(_))
        ));
    }
}
