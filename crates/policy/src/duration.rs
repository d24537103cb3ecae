//! Durations on the command line (`--resync-interval 60s`, `--lock-wait 0`).
//!
//! Parsing is jiff's (already in the dependency tree through k8s-openapi):
//! its "friendly" format takes `500ms`, `60s`, `5m`, `1h30m`, `2 hours`, and
//! ISO 8601 (`PT1M`) too. A bare number means seconds, as the flags always
//! accepted. Durations are bounded so that adding one to the clock can never
//! overflow.

use std::time::Duration;

/// The longest duration accepted: a year.
pub const MAX: Duration = Duration::from_secs(365 * 24 * 3600);

/// A duration that cannot be taken. The flags use these parsers as clap
/// value parsers directly (clap takes any error type), and url and file
/// sources for their `interval`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Neither a number of seconds nor a duration jiff reads; jiff's own
    /// sentence kept as text (its error is not comparable).
    #[error("invalid duration {input:?}: {jiff} (expected for example 60s, 500ms, 5m or 1h30m)")]
    Unparsable { input: String, jiff: String },
    #[error("invalid duration {input:?}: must not be negative")]
    Negative { input: String },
    #[error("invalid duration {input:?}: at most a year (8760h)")]
    TooLong { input: String },
    #[error("invalid duration {input:?}: must be more than zero")]
    Zero { input: String },
}

/// A positive duration.
pub fn parse_positive(s: &str) -> Result<Duration, DurationError> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(DurationError::Zero {
            input: s.to_string(),
        });
    }
    Ok(d)
}

/// A duration that may be zero.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    let d = if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse::<u64>()
            .ok()
            .filter(|n| *n <= MAX.as_secs())
            .map(Duration::from_secs)
            .ok_or_else(|| too_long(s))?
    } else {
        let signed: jiff::SignedDuration =
            s.parse()
                .map_err(|e: jiff::Error| DurationError::Unparsable {
                    input: s.to_string(),
                    jiff: e.to_string(),
                })?;
        Duration::try_from(signed).map_err(|_| DurationError::Negative {
            input: s.to_string(),
        })?
    };
    if d > MAX {
        return Err(too_long(s));
    }
    Ok(d)
}

fn too_long(s: &str) -> DurationError {
    DurationError::TooLong {
        input: s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_users_write() {
        for (input, secs, millis) in [
            ("60", 60, 0),
            ("60s", 60, 0),
            ("500ms", 0, 500),
            ("5m", 300, 0),
            ("1h30m", 5400, 0),
            ("1h 30m", 5400, 0),
            ("2 hours", 7200, 0),
            ("PT1M", 60, 0),
            (" 90s ", 90, 0),
            ("0", 0, 0),
            ("0s", 0, 0),
        ] {
            let want = Duration::from_secs(secs) + Duration::from_millis(millis);
            assert_eq!(parse_duration(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn nonsense_overflow_and_negatives_are_errors_not_panics() {
        for input in [
            "",
            "abc",
            "10x",
            "-5s",
            "307445734561825861m",
            "99999999999999999999999",
            "31536001",
            "8761h",
        ] {
            assert!(parse_duration(input).is_err(), "{input}");
        }
        assert!(parse_positive("0s").is_err());
        assert_eq!(parse_positive("8760h"), Ok(MAX));
    }

    /// What a user reads (clap prints it after the flag; a url or file
    /// source's status after `interval: `), word for word.
    #[test]
    fn each_error_says_what_is_wrong_and_what_is_expected() {
        let text = |input: &str| parse_duration(input).unwrap_err().to_string();
        assert_eq!(
            parse_positive("0s").unwrap_err().to_string(),
            "invalid duration \"0s\": must be more than zero"
        );
        assert_eq!(
            text("-5s"),
            "invalid duration \"-5s\": must not be negative"
        );
        assert_eq!(
            text("8761h"),
            "invalid duration \"8761h\": at most a year (8760h)"
        );
        assert_eq!(
            text("31536001"),
            "invalid duration \"31536001\": at most a year (8760h)"
        );
        let e = text(" 10x ");
        assert!(
            e.starts_with("invalid duration \"10x\": ")
                && e.ends_with(" (expected for example 60s, 500ms, 5m or 1h30m)")
                && e.len() > 80,
            "{e}"
        );
    }
}
