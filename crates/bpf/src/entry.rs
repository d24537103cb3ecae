//! One entry of a BPF prefix set, and its key in the LPM trie.
//!
//! The trie's key is `struct { u32 prefixlen; u8 addr[4 or 16]; }`: the
//! prefix length in host byte order, then the address in network byte
//! order, as the kernel's `struct bpf_lpm_trie_key_u8` wants it. The value
//! is one byte: [`MATCH`] or [`NOMATCH`] (docs/bpf.md, "Map layout").
//!
//! An entry's host bits are always cleared: the trie ignores them when it
//! matches, but a dump gives back the bytes as written, and two keys that
//! differ only there are one entry.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya::maps::lpm_trie::Key;
use ipsetmgr_ipset::{Family, Member};

use crate::error::BpfError;

/// The value of an entry that matches.
pub const MATCH: u8 = 1;
/// The value of a `nomatch` entry: addresses it covers do not match, unless
/// a more specific entry says they do.
pub const NOMATCH: u8 = 0;

/// A network (an address when the prefix is the full length) and whether
/// it is a `nomatch` entry. Host bits are cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Entry {
    addr: IpAddr,
    prefix: u8,
    nomatch: bool,
}

impl Entry {
    /// The entry for `addr/prefix`, host bits cleared.
    pub fn new(addr: IpAddr, prefix: u8, nomatch: bool) -> Result<Entry, BpfError> {
        if prefix > Family::of(&addr).max_prefix() {
            return Err(BpfError::BadPrefix { addr, prefix });
        }
        Ok(Entry {
            addr: masked(addr, prefix),
            prefix,
            nomatch,
        })
    }

    /// One address, as hash:ip holds it.
    pub fn host(addr: IpAddr) -> Entry {
        let prefix = Family::of(&addr).max_prefix();
        Entry {
            addr,
            prefix,
            nomatch: false,
        }
    }

    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    pub fn nomatch(&self) -> bool {
        self.nomatch
    }

    pub fn family(&self) -> Family {
        Family::of(&self.addr)
    }

    /// The trie's value byte.
    pub(crate) fn value(&self) -> u8 {
        if self.nomatch { NOMATCH } else { MATCH }
    }
}

/// As ipset writes a hash:net member: `10.0.0.0/8`, `10.1.0.0/16 nomatch`.
impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)?;
        if self.nomatch {
            f.write_str(" nomatch")?;
        }
        Ok(())
    }
}

/// hash:ip and hash:net members are prefixes; nothing else is, so those
/// fail rather than lose part of the member. An entry comment changes no
/// lookup's answer and has no place in the map: it is left out.
impl TryFrom<&Member> for Entry {
    type Error = BpfError;

    fn try_from(m: &Member) -> Result<Entry, BpfError> {
        match m {
            Member::Ip(addr) => Ok(Entry::host(*addr)),
            Member::Net {
                addr,
                prefix,
                nomatch,
            } => Entry::new(*addr, *prefix, *nomatch),
            // The comment is a note for people, not part of what matches:
            // the entry is the member's prefix, the comment is not kept
            // (docs/bpf.md, "Map layout").
            Member::Commented(c) => Entry::try_from(&c.member),
            _ => Err(BpfError::CannotHold {
                member: format!("{m:?}"),
                why: "only hash:ip and hash:net members are address prefixes",
            }),
        }
    }
}

fn masked(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
        }
    }
}

/// The trie key of an IPv4 network.
pub(crate) fn key4(addr: Ipv4Addr, prefix: u8) -> Key<[u8; 4]> {
    Key::new(u32::from(prefix), addr.octets())
}

/// The trie key of an IPv6 network.
pub(crate) fn key6(addr: Ipv6Addr, prefix: u8) -> Key<[u8; 16]> {
    Key::new(u32::from(prefix), addr.octets())
}

/// The entry a dumped key and value stand for.
pub(crate) fn from_key(addr: IpAddr, prefix: u32, value: u8) -> Entry {
    Entry {
        addr,
        // The kernel refuses keys longer than the address, so this fits.
        prefix: prefix as u8,
        nomatch: value == NOMATCH,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_bits_are_cleared_and_prefixes_checked() {
        let e = Entry::new("10.1.2.3".parse().unwrap(), 8, true).unwrap();
        assert_eq!(e.to_string(), "10.0.0.0/8 nomatch");
        let e = Entry::new("2001:db8::1".parse().unwrap(), 0, false).unwrap();
        assert_eq!(e.to_string(), "::/0");
        assert!(Entry::new("10.0.0.0".parse().unwrap(), 33, false).is_err());
    }

    #[test]
    fn members_that_are_not_prefixes_cannot_be_held() {
        let m = Member::Port(80);
        let err = Entry::try_from(&m).unwrap_err().to_string();
        assert!(err.contains("cannot hold"), "{err}");
        let m = Member::Net {
            addr: "10.0.0.0".parse().unwrap(),
            prefix: 8,
            nomatch: true,
        };
        assert_eq!(
            Entry::try_from(&m).unwrap().to_string(),
            "10.0.0.0/8 nomatch"
        );
    }

    #[test]
    fn a_commented_member_is_its_prefix() {
        let m = Member::Commented(Box::new(ipsetmgr_ipset::Commented {
            member: Member::Ip("192.0.2.10".parse().unwrap()),
            comment: ipsetmgr_ipset::Comment::parse("scanner").unwrap(),
        }));
        assert_eq!(Entry::try_from(&m).unwrap().to_string(), "192.0.2.10/32");
    }
}
