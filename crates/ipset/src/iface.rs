//! Interface names of hash:net,iface members.

use std::fmt;

use crate::error::MemberError;

/// The longest interface name the kernel has (IFNAMSIZ - 1).
pub const MAX_IFACE_LEN: usize = 15;

/// A network interface name as the kernel accepts it: 1 to 15 bytes, not
/// `.` or `..`. Only letters, digits and `. _ - + = @` are accepted: the
/// kernel would take more, but these cover real names and none of them
/// can change how `ipset restore` reads a line.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IfaceName(Box<str>);

impl IfaceName {
    pub fn parse(s: &str) -> Result<IfaceName, MemberError> {
        let ok_char = |c: char| c.is_ascii_alphanumeric() || "._-+=@".contains(c);
        if s.is_empty() || s.len() > MAX_IFACE_LEN {
            return Err(MemberError::BadIface(
                "an interface name has 1 to 15 characters",
            ));
        }
        if s == "." || s == ".." || !s.chars().all(ok_char) {
            return Err(MemberError::BadIface(
                "an interface name has letters, digits and . _ - + = @ only",
            ));
        }
        Ok(IfaceName(s.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IfaceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["eth0", "lo", "veth1234567890a", "br-0.100", "wg_1", "a"] {
            assert_eq!(IfaceName::parse(ok).unwrap().as_str(), ok);
        }
        for bad in [
            "",
            "abcdefghijklmnop",
            ".",
            "..",
            "eth/0",
            "eth:0",
            "a b",
            "eth0,1",
            "é",
        ] {
            assert!(IfaceName::parse(bad).is_err(), "{bad}");
        }
    }
}
