//! Why a member was rejected: a leaf module, so the member's parts
//! (comments, interfaces) and the member parser can all name it without
//! importing each other.

use crate::types::Family;

/// Why a member was rejected. The messages are shown to users next to the
/// policy and member, so they say what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemberError {
    #[error("empty member")]
    Empty,
    #[error("contains whitespace or control characters")]
    ForbiddenCharacters,
    #[error(
        "looks like a host name; only literal addresses are accepted (host names would need DNS)"
    )]
    HostName,
    #[error("not a valid IP address")]
    BadAddress,
    #[error("the all-zero address cannot be stored in this set type (the kernel rejects it)")]
    NullAddress,
    #[error("not a valid CIDR: {0}")]
    BadCidr(&'static str),
    #[error(
        "a CIDR wider than one address is not allowed in hash:ip (the kernel would expand it); use hash:net"
    )]
    WideCidrInHashIp,
    #[error("port ranges are not supported; list each port")]
    PortRange,
    #[error("not a valid port (expected 0-65535)")]
    BadPort,
    #[error(
        "numbers must not have leading zeros (ipset(8) would read them as octal: 010 is 8 there)"
    )]
    LeadingZero,
    #[error("protocol {0:?} is not supported (use tcp, udp, sctp, udplite, icmp or icmpv6)")]
    UnsupportedProtocol(String),
    #[error("expected ADDRESS,PROTO:PORT (for example 10.0.0.1,tcp:80)")]
    BadIpPortSyntax,
    #[error("not a valid ICMP type/code (use TYPE/CODE or a name such as echo-request)")]
    BadIcmp,
    #[error("{0} is only valid with {1} addresses")]
    ProtoFamilyMismatch(&'static str, Family),
    #[error("not a valid MAC address (expected six hex bytes such as aa:bb:cc:dd:ee:ff)")]
    BadMac,
    #[error("'nomatch' is only valid for hash:net, hash:net,port and hash:ip,port,net members")]
    NomatchNotAllowed,
    #[error("expected {0}")]
    BadSyntax(&'static str),
    #[error("both addresses must be of one family")]
    MixedFamilies,
    #[error("not a valid interface: {0}")]
    BadIface(&'static str),
    #[error("not a valid comment: {0}")]
    BadComment(&'static str),
    #[error("list:set members must be names of other IPSetPolicies")]
    BadSetName,
}
