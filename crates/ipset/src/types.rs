//! Set types, address families and the header a kernel set is created with.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::addr_mask::AddrMask;
use crate::range::SetRange;

/// Default `maxelem` of a kernel set (the kernel's own default).
pub const DEFAULT_MAX_ELEM: u32 = 65536;

/// The ipset types this project manages.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
pub enum SetType {
    #[serde(rename = "hash:ip")]
    HashIp,
    #[serde(rename = "hash:net")]
    HashNet,
    #[serde(rename = "hash:ip,port")]
    HashIpPort,
    #[serde(rename = "hash:mac")]
    HashMac,
    #[serde(rename = "list:set")]
    ListSet,
    #[serde(rename = "hash:net,port")]
    HashNetPort,
    #[serde(rename = "hash:ip,port,ip")]
    HashIpPortIp,
    #[serde(rename = "hash:ip,port,net")]
    HashIpPortNet,
    #[serde(rename = "hash:net,iface")]
    HashNetIface,
    #[serde(rename = "hash:ip,mark")]
    HashIpMark,
    #[serde(rename = "bitmap:ip")]
    BitmapIp,
    #[serde(rename = "bitmap:port")]
    BitmapPort,
}

impl SetType {
    pub const ALL: [SetType; 12] = [
        SetType::HashIp,
        SetType::HashNet,
        SetType::HashIpPort,
        SetType::HashMac,
        SetType::ListSet,
        SetType::HashNetPort,
        SetType::HashIpPortIp,
        SetType::HashIpPortNet,
        SetType::HashNetIface,
        SetType::HashIpMark,
        SetType::BitmapIp,
        SetType::BitmapPort,
    ];

    /// Every type's name, comma-separated: for messages.
    pub fn names() -> String {
        let names: Vec<&str> = SetType::ALL.iter().map(|t| t.as_str()).collect();
        names.join(", ")
    }

    /// The name the kernel and the `ipset` tool use for this type.
    pub fn as_str(self) -> &'static str {
        match self {
            SetType::HashIp => "hash:ip",
            SetType::HashNet => "hash:net",
            SetType::HashIpPort => "hash:ip,port",
            SetType::HashMac => "hash:mac",
            SetType::ListSet => "list:set",
            SetType::HashNetPort => "hash:net,port",
            SetType::HashIpPortIp => "hash:ip,port,ip",
            SetType::HashIpPortNet => "hash:ip,port,net",
            SetType::HashNetIface => "hash:net,iface",
            SetType::HashIpMark => "hash:ip,mark",
            SetType::BitmapIp => "bitmap:ip",
            SetType::BitmapPort => "bitmap:port",
        }
    }

    /// Whether kernel sets of this type carry an address family in their header.
    /// hash:mac, bitmap:port and list:set are family-less in the kernel;
    /// bitmap:ip is always IPv4.
    pub fn has_family(self) -> bool {
        !matches!(
            self,
            SetType::HashMac | SetType::BitmapPort | SetType::ListSet
        )
    }

    /// The only family a type has, for types with just one (bitmap:ip).
    pub fn only_family(self) -> Option<Family> {
        (self == SetType::BitmapIp).then_some(Family::V4)
    }

    /// bitmap:ip and bitmap:port: sized by a `range`, not `maxelem`.
    pub fn is_bitmap(self) -> bool {
        matches!(self, SetType::BitmapIp | SetType::BitmapPort)
    }

    /// Whether members carry a `nomatch` flag (which the kernel keeps
    /// outside the entry's key): the types with a network part.
    pub fn has_nomatch(self) -> bool {
        matches!(
            self,
            SetType::HashNet
                | SetType::HashNetPort
                | SetType::HashIpPortNet
                | SetType::HashNetIface
        )
    }

    pub fn is_hash(self) -> bool {
        !matches!(
            self,
            SetType::ListSet | SetType::BitmapIp | SetType::BitmapPort
        )
    }
}

impl fmt::Display for SetType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown set type {0:?} (expected one of {names})", names = SetType::names())]
pub struct UnknownSetType(pub String);

impl FromStr for SetType {
    type Err = UnknownSetType;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SetType::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| UnknownSetType(s.to_string()))
    }
}

/// The address family of one kernel set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// The family of an address.
    pub fn of(addr: &std::net::IpAddr) -> Family {
        match addr {
            std::net::IpAddr::V4(_) => Family::V4,
            std::net::IpAddr::V6(_) => Family::V6,
        }
    }

    /// The word `ipset` uses in headers (`family inet`).
    pub fn ipset_name(self) -> &'static str {
        match self {
            Family::V4 => "inet",
            Family::V6 => "inet6",
        }
    }

    pub fn from_ipset_name(s: &str) -> Option<Family> {
        match s {
            "inet" => Some(Family::V4),
            "inet6" => Some(Family::V6),
            _ => None,
        }
    }

    /// Host prefix length: 32 or 128.
    pub fn max_prefix(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// What a set's members are: the set type plus, for typed-address sets, the family.
/// It decides how members parse, render and are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SetKind {
    pub set_type: SetType,
    /// `None` for the family-less kernel types, hash:mac and list:set (a
    /// list:set's family only shows in its name, which the caller chooses).
    pub family: Option<Family>,
}

/// As `ipset` describes a set: `hash:ip inet`, `hash:mac`.
impl fmt::Display for SetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.family {
            Some(fam) if self.set_type.has_family() => {
                write!(f, "{} {}", self.set_type, fam.ipset_name())
            }
            _ => write!(f, "{}", self.set_type),
        }
    }
}

impl SetKind {
    pub fn new(set_type: SetType, family: Option<Family>) -> SetKind {
        let family = if set_type.has_family() { family } else { None };
        SetKind { set_type, family }
    }
}

/// The header a kernel set is created with; compared on resync.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SetHeader {
    pub kind: SetKind,
    /// maxelem; a list:set's `size`; a bitmap's number of elements (its
    /// range decides it: the kernel reports no maxelem for bitmaps).
    pub max_elem: u32,
    /// Only a creation hint: the kernel rounds it and grows tables, so it is
    /// never compared on resync.
    pub hash_size: Option<u32>,
    /// The options that change what the set holds; compared on resync.
    pub options: HeaderOptions,
}

/// Header options beyond type, family and size. Each changes what a set
/// holds or matches, so a kernel set whose options differ is replaced.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct HeaderOptions {
    /// The range of a bitmap set (always present for bitmaps, never else).
    pub range: Option<SetRange>,
    /// Created with the `comment` extension: only sets of policies whose
    /// members have comments (the extension costs memory per entry).
    pub comment: bool,
    /// hash:ip's `netmask` or `bitmask` (never the default).
    pub mask: Option<AddrMask>,
}

/// Sets up to this many members are created with the kernel's default
/// hashsize (1024 buckets): it never resizes them more than a few times.
const DEFAULT_SIZED_UP_TO: usize = 2048;
/// The largest hashsize chosen from a member count (the policy may still say
/// a bigger one): 2^25 buckets serve 64 million members.
const MAX_SIZED_HASH_SIZE: u32 = 1 << 25;

impl SetHeader {
    /// This header with a hashsize for `members` entries when none is set.
    ///
    /// A hash set grows by doubling its table and rehashing every entry
    /// whenever one bucket fills (12 entries). Filling a new million-member
    /// set from the default 1024 buckets rehashes it nine times; created
    /// with the table it ends at (about two members per bucket, the size
    /// the kernel itself grows to), it never rehashes, and holds the same
    /// memory. Measured with `ipset restore` of 1M hash:ip members: 3.48 s
    /// from 1024 buckets, 2.92 s from 524288 (see docs/performance.md).
    pub fn sized_for(mut self, members: usize) -> SetHeader {
        if self.hash_size.is_none() && self.kind.set_type.is_hash() && members > DEFAULT_SIZED_UP_TO
        {
            let buckets = (members / 2)
                .checked_next_power_of_two()
                .and_then(|b| u32::try_from(b).ok())
                .unwrap_or(MAX_SIZED_HASH_SIZE);
            self.hash_size = Some(buckets.min(MAX_SIZED_HASH_SIZE));
        }
        self
    }

    /// Whether a kernel set with header `kernel` can stay in place for `self`.
    /// Only what changes behaviour counts: type, family, maxelem (list:set's
    /// `size` is likewise compared through `max_elem`) and the options.
    pub fn compatible_with(&self, kernel: &SetHeader) -> bool {
        let family_matches =
            !self.kind.set_type.has_family() || self.kind.family == kernel.kind.family;
        self.kind.set_type == kernel.kind.set_type
            && family_matches
            && self.max_elem == kernel.max_elem
            && self.options == kernel.options
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(set_type: SetType, hash_size: Option<u32>) -> SetHeader {
        SetHeader {
            kind: SetKind::new(set_type, Some(Family::V4)),
            max_elem: DEFAULT_MAX_ELEM,
            hash_size,
            options: HeaderOptions::default(),
        }
    }

    #[test]
    fn big_hash_sets_are_created_at_the_size_the_kernel_grows_them_to() {
        let h = header(SetType::HashIp, None);
        assert_eq!(
            h.clone().sized_for(10).hash_size,
            None,
            "small: the kernel default"
        );
        assert_eq!(h.clone().sized_for(DEFAULT_SIZED_UP_TO).hash_size, None);
        assert_eq!(h.clone().sized_for(1_000_000).hash_size, Some(1 << 19));
        assert_eq!(h.clone().sized_for(100_000).hash_size, Some(1 << 16));
        assert_eq!(
            h.sized_for(usize::MAX / 2).hash_size,
            Some(MAX_SIZED_HASH_SIZE)
        );
        // The policy's own hashSize wins; list:set has no hash table.
        assert_eq!(
            header(SetType::HashIp, Some(64))
                .sized_for(1_000_000)
                .hash_size,
            Some(64)
        );
        assert_eq!(
            header(SetType::ListSet, None)
                .sized_for(1_000_000)
                .hash_size,
            None
        );
    }
}
