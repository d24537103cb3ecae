//! Kernel set names and ownership (see `docs/architecture.md`).
//!
//! Main sets are `<prefix>4-<policy>`, `<prefix>6-<policy>` or
//! `<prefix>x-<policy>`; temp sets are `<prefix>t-<suffix>`. Names longer than
//! the kernel's 31 bytes keep a readable head and end in `-` plus 10 hex
//! characters (40 bits) of a hash of the full policy name: two policies
//! meet on one name only by deliberate search, and the compiler still
//! detects it when they do. Anything else is foreign.

use sha2::{Digest, Sha256};

use crate::types::Family;

/// The kernel's limit on set names (IPSET_MAXNAMELEN - 1).
pub const MAX_SET_NAME_LEN: usize = 31;
/// Bytes of the policy name's SHA-256 kept in a shortened set name.
const HASH_BYTES: usize = 5;

/// Whether this project will name, write or accept `name` as a set name:
/// what the kernel accepts (1 to 31 bytes), narrowed to printable ASCII
/// without quotes and not starting with `-`, so a name can never be read as
/// anything else in an `ipset restore` script or on a command line. Every
/// owned name is of this form.
pub fn is_valid_set_name(name: &str) -> bool {
    (1..=MAX_SET_NAME_LEN).contains(&name.len())
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\'')
}

/// Whether `name` is safe as one path component of at most `max_len`
/// bytes (a set's pin, a network namespace's file): letters, digits, `-`,
/// `_` and `.`, not starting with a dot, so never `..`, a hidden file or a
/// path of more than one component.
pub fn is_path_component(name: &str, max_len: usize) -> bool {
    (1..=max_len).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid set prefix {0:?}: it must be 1 to 8 ASCII letters or digits")]
pub struct BadPrefix(pub String);

/// The naming scheme of one manager; decides which kernel sets it owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Naming {
    prefix: String,
}

impl Default for Naming {
    fn default() -> Self {
        Naming {
            prefix: Naming::DEFAULT_PREFIX.into(),
        }
    }
}

impl Naming {
    /// The prefix unless configured otherwise.
    pub const DEFAULT_PREFIX: &'static str = "ipm";

    pub fn new(prefix: &str) -> Result<Naming, BadPrefix> {
        let ok =
            (1..=8).contains(&prefix.len()) && prefix.bytes().all(|b| b.is_ascii_alphanumeric());
        if ok {
            Ok(Naming {
                prefix: prefix.to_string(),
            })
        } else {
            Err(BadPrefix(prefix.to_string()))
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Every name a policy's main sets may have: IPv4, IPv6 and
    /// family-less (what a held policy's sets are found by).
    pub fn main_set_names(&self, policy: &str) -> [String; 3] {
        [Some(Family::V4), Some(Family::V6), None].map(|f| self.main_set_name(policy, f))
    }

    /// The kernel name of a policy's set for `family` (`None`: family-less, hash:mac).
    pub fn main_set_name(&self, policy: &str, family: Option<Family>) -> String {
        let letter = match family {
            Some(Family::V4) => '4',
            Some(Family::V6) => '6',
            None => 'x',
        };
        let full = format!("{}{}-{}", self.prefix, letter, policy);
        if full.len() <= MAX_SET_NAME_LEN {
            return full;
        }
        let digest = Sha256::digest(policy.as_bytes());
        let suffix = hex::encode(&digest[..HASH_BYTES]);
        // Policy names are ASCII (Kubernetes names), so byte slicing is safe;
        // still cut on a char boundary to never panic on odd input.
        let mut head_len = MAX_SET_NAME_LEN - 1 - suffix.len();
        while !full.is_char_boundary(head_len) {
            head_len -= 1;
        }
        // A head ending in a separator would give "--"; trim it for readability.
        let head = full[..head_len].trim_end_matches(['-', '.']);
        format!("{head}-{suffix}")
    }

    /// A temp set name for atomic rewrites; `n` makes it unique.
    pub fn temp_set_name(&self, n: u64) -> String {
        format!("{}t-{:x}", self.prefix, n)
    }

    /// Whether this manager owns a kernel set of this name.
    pub fn owns(&self, name: &str) -> bool {
        is_valid_set_name(name)
            && name
                .strip_prefix(self.prefix.as_str())
                .and_then(|rest| rest.get(..2))
                .is_some_and(|tag| matches!(tag, "4-" | "6-" | "x-" | "t-"))
            && name.len() > self.prefix.len() + 2
    }

    pub fn is_temp(&self, name: &str) -> bool {
        self.owns(name) && name[self.prefix.len()..].starts_with("t-")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_readable() {
        let n = Naming::default();
        assert_eq!(
            n.main_set_name("blocklist", Some(Family::V4)),
            "ipm4-blocklist"
        );
        assert_eq!(
            n.main_set_name("blocklist", Some(Family::V6)),
            "ipm6-blocklist"
        );
        assert_eq!(n.main_set_name("macs", None), "ipmx-macs");
    }

    #[test]
    fn long_names_are_truncated_with_a_stable_hash() {
        let n = Naming::default();
        let a = n.main_set_name(
            "a-very-long-policy-name-for-the-edge-nodes",
            Some(Family::V4),
        );
        let b = n.main_set_name(
            "a-very-long-policy-name-for-the-edge-nodes-2",
            Some(Family::V4),
        );
        assert!(a.len() <= MAX_SET_NAME_LEN);
        assert!(a.starts_with("ipm4-a-very-long-pol"), "{a}");
        assert!(!a.contains("--"), "{a}");
        assert_eq!(a.rsplit('-').next().unwrap().len(), 2 * HASH_BYTES);
        assert_ne!(a, b);
        assert_eq!(
            a,
            n.main_set_name(
                "a-very-long-policy-name-for-the-edge-nodes",
                Some(Family::V4)
            )
        );
        assert!(n.owns(&a));
    }

    #[test]
    fn ownership_is_exact() {
        let n = Naming::default();
        for owned in ["ipm4-x", "ipm6-x", "ipmx-x", "ipmt-1f"] {
            assert!(n.owns(owned), "{owned}");
        }
        for foreign in [
            "KUBE-SRC-ABC",
            "cali40all-hosts",
            "ipm",
            "ipm4-",
            "ipmz-x",
            "ipm4x",
            "myipm4-x",
            "IPM4-x",
        ] {
            assert!(!n.owns(foreign), "{foreign}");
        }
        assert!(n.is_temp("ipmt-1f"));
        assert!(!n.is_temp("ipm4-t"));
    }

    #[test]
    fn set_name_rules() {
        for ok in ["ipm4-a", "KUBE-SRC-X", "a", &"n".repeat(31)] {
            assert!(is_valid_set_name(ok), "{ok}");
        }
        for bad in [
            "",
            &"n".repeat(32),
            "-x",
            "a b",
            "a\"b",
            "a'b",
            "a\nb",
            "\u{e9}",
        ] {
            assert!(!is_valid_set_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn prefix_rules() {
        assert!(Naming::new("ipm2").is_ok());
        assert!(Naming::new("").is_err());
        assert!(Naming::new("toolongpfx").is_err());
        assert!(Naming::new("a-b").is_err());
    }
}
