//! Compile-time parsing of the attribute's durations: `"90s"`, `"15m"`, `"24h"`, `"7d"`
//! and combinations such as `"1h30m"`.

/// Parses a duration into whole seconds, or says how to write it.
pub(crate) fn parse_secs(text: &str) -> Result<u64, String> {
    let invalid = || {
        let hint = if text.contains("ms") {
            " (sub-second durations are not supported)"
        } else {
            ""
        };
        format!(
            "invalid duration {text:?}{hint}: write whole numbers with the units s, m, h or d, \
             e.g. \"90s\", \"15m\", \"24h\", \"7d\" or \"1h30m\""
        )
    };
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(
            "empty duration: write e.g. \"90s\", \"15m\", \"24h\", \"7d\" or \"1h30m\"".to_owned(),
        );
    }
    let overflow = || format!("duration {text:?} is too large");
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in trimmed.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit_secs: u64 = match c {
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
        return Err(format!(
            "duration {text:?} is zero: it must be positive, e.g. \"24h\""
        ));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_combinations() {
        assert_eq!(parse_secs("90s"), Ok(90));
        assert_eq!(parse_secs("15m"), Ok(900));
        assert_eq!(parse_secs("24h"), Ok(86_400));
        assert_eq!(parse_secs("7d"), Ok(604_800));
        assert_eq!(parse_secs("1h30m"), Ok(5_400));
        assert_eq!(parse_secs(" 2d12h "), Ok(216_000));
    }

    #[test]
    fn refuses_bad_input() {
        assert!(parse_secs("").unwrap_err().contains("empty"));
        assert!(parse_secs("10").unwrap_err().contains("invalid"));
        assert!(parse_secs("h").unwrap_err().contains("invalid"));
        assert!(parse_secs("5w").unwrap_err().contains("invalid"));
        assert!(parse_secs("1 h").unwrap_err().contains("invalid"));
        assert!(parse_secs("500ms").unwrap_err().contains("sub-second"));
        assert!(parse_secs("0s").unwrap_err().contains("zero"));
        assert!(parse_secs("0h0m").unwrap_err().contains("zero"));
        assert!(
            parse_secs("99999999999999999999d")
                .unwrap_err()
                .contains("too large")
        );
        assert!(
            parse_secs("999999999999999999d")
                .unwrap_err()
                .contains("too large")
        );
    }
}
