//! The API server's own rules for names, label keys and label values
//! (apimachinery's `IsDNS1123Subdomain`, `IsQualifiedName`,
//! `IsValidLabelValue`), so that what ipsetmgr accepts is exactly what a
//! real server would: a policy name the server would refuse never reaches
//! `ipsetmgr slice` output, and a selector key it would refuse is an error,
//! not a selector that quietly matches nothing.

/// A lowercase RFC 1123 subdomain of at most 253 characters: dot-separated
/// labels of `a-z`, `0-9` and `-`, each starting and ending with a letter
/// or digit (so `a..b`, `a.-b` and `a-.b` are not names).
pub fn dns1123_subdomain(s: &str) -> Result<(), &'static str> {
    if s.is_empty() || s.len() > 253 {
        return Err("must be 1 to 253 characters");
    }
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        !b.is_empty()
            && alnum(b[0])
            && alnum(b[b.len() - 1])
            && b.iter().all(|&c| alnum(c) || c == b'-')
    };
    if s.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(
            "must be a lowercase DNS subdomain: labels of a-z, 0-9 and '-', separated by single dots, each starting and ending with a letter or digit",
        )
    }
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, at most 63 characters: a
/// label key's name part, and a non-empty label value.
fn name_part(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_alphanumeric();
    !b.is_empty()
        && b.len() <= 63
        && alnum(b[0])
        && alnum(b[b.len() - 1])
        && b.iter()
            .all(|&c| alnum(c) || matches!(c, b'-' | b'_' | b'.'))
}

/// Why a label key or value is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("label key {key:?}: its prefix {why}")]
    KeyPrefix { key: String, why: &'static str },
    #[error(
        "label key {0:?}: the name must be 1 to 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit (an optional DNS-subdomain prefix and '/' before it)"
    )]
    KeyName(String),
    #[error(
        "label value {0:?}: must be empty or 1 to 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
    )]
    Value(String),
}

/// A label key: `[prefix/]name`, the prefix a DNS subdomain, the name as
/// [`name_part`] says.
pub(crate) fn label_key(s: &str) -> Result<(), LabelError> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix {
        dns1123_subdomain(p).map_err(|why| LabelError::KeyPrefix {
            key: s.to_string(),
            why,
        })?;
    }
    if !name_part(name) {
        return Err(LabelError::KeyName(s.to_string()));
    }
    Ok(())
}

/// A label value: empty, or as [`name_part`] says.
pub(crate) fn label_value(s: &str) -> Result<(), LabelError> {
    if s.is_empty() || name_part(s) {
        Ok(())
    } else {
        Err(LabelError::Value(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subdomains_as_the_api_server_checks_them() {
        for ok in ["a", "blocklist", "a.b", "a-b.c-d", "0x", &"a".repeat(253)] {
            assert_eq!(dns1123_subdomain(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "A",
            "a..b",
            "a.-b",
            "a-.b",
            "-a",
            "a-",
            ".a",
            "a.",
            "a_b",
            &"a".repeat(254),
        ] {
            assert!(dns1123_subdomain(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_keys_and_values_as_the_api_server_checks_them() {
        for ok in [
            "role",
            "Role_1.x",
            "ipsetmgr.io/policy",
            "kubernetes.io/os",
            &"k".repeat(63),
        ] {
            assert_eq!(label_key(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "rôle",
            "bad key!",
            "a/b/c",
            "Bad.Io/x",
            "/x",
            "x/",
            &"k".repeat(64),
            "-x",
        ] {
            assert!(label_key(bad).is_err(), "{bad}");
        }
        for ok in ["", "edge", "v1.2_3-x", &"v".repeat(63)] {
            assert_eq!(label_value(ok), Ok(()), "{ok}");
        }
        for bad in ["a b", "-a", "a-", "é", &"v".repeat(64)] {
            assert!(label_value(bad).is_err(), "{bad}");
        }
    }
}
