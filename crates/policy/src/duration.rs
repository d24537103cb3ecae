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

/// A positive duration.
pub fn parse_positive(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("invalid duration {s:?}: must be more than zero"));
    }
    Ok(d)
}

/// A duration that may be zero.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let d = if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse::<u64>()
            .ok()
            .filter(|n| *n <= MAX.as_secs())
            .map(Duration::from_secs)
            .ok_or_else(|| too_long(s))?
    } else {
        let signed: jiff::SignedDuration = s.parse().map_err(|e| {
            format!("invalid duration {s:?}: {e} (expected for example 60s, 500ms, 5m or 1h30m)")
        })?;
        Duration::try_from(signed)
            .map_err(|_| format!("invalid duration {s:?}: must not be negative"))?
    };
    if d > MAX {
        return Err(too_long(s));
    }
    Ok(d)
}

fn too_long(s: &str) -> String {
    format!("invalid duration {s:?}: at most a year (8760h)")
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
}
