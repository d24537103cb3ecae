//! Set types and address families: what a set holds, without its header
//! (`header.rs`), so the member, range and mask modules can use them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

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
