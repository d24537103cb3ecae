//! The `range` of a bitmap set: which addresses or ports it can hold. The
//! kernel allocates one bit per element of the range up front, so it caps
//! the range at [`MAX_BITMAP_ELEMENTS`].

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use crate::member::Member;
use crate::num::mask;
use crate::types::SetType;

/// The most elements a bitmap set can have (the kernel's
/// IPSET_BITMAP_MAX_RANGE + 1: 65536).
pub const MAX_BITMAP_ELEMENTS: u64 = 1 << 16;

/// An inclusive range of a bitmap set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetRange {
    /// bitmap:ip
    Ipv4 { from: Ipv4Addr, to: Ipv4Addr },
    /// bitmap:port
    Port { from: u16, to: u16 },
}

/// Why a range was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("expected {0}")]
    Syntax(&'static str),
    #[error("the range starts after it ends ({0} > {1})")]
    Reversed(String, String),
    #[error(
        "the range holds {0} elements; a bitmap holds at most {MAX_BITMAP_ELEMENTS} (use a smaller range or a hash type)"
    )]
    TooBig(u64),
    #[error("{0} sets have no range")]
    NotABitmap(SetType),
}

const IP_SYNTAX: &str =
    "FROM-TO or CIDR of IPv4 addresses (for example 10.0.0.0-10.0.0.255 or 10.0.0.0/24)";
const PORT_SYNTAX: &str = "FROM-TO ports (for example 0-1023)";

impl SetRange {
    /// Parse the range of a `set_type` set, as a user writes it or `ipset
    /// list` prints it.
    pub fn parse(set_type: SetType, s: &str) -> Result<SetRange, RangeError> {
        let range = match set_type {
            SetType::BitmapIp => parse_ip_range(s)?,
            SetType::BitmapPort => {
                let (a, b) = s.split_once('-').ok_or(RangeError::Syntax(PORT_SYNTAX))?;
                let port = |p: &str| {
                    crate::num::plain_decimal(p, 5)
                        .and_then(|n| u16::try_from(n).ok())
                        .ok_or(RangeError::Syntax(PORT_SYNTAX))
                };
                let (from, to) = (port(a)?, port(b)?);
                if from > to {
                    return Err(RangeError::Reversed(a.into(), b.into()));
                }
                SetRange::Port { from, to }
            }
            t => return Err(RangeError::NotABitmap(t)),
        };
        if range.len() > MAX_BITMAP_ELEMENTS {
            return Err(RangeError::TooBig(range.len()));
        }
        Ok(range)
    }

    /// How many elements the range holds (at least 1).
    pub fn len(&self) -> u64 {
        match *self {
            SetRange::Ipv4 { from, to } => {
                u64::from(u32::from(to)) - u64::from(u32::from(from)) + 1
            }
            SetRange::Port { from, to } => u64::from(to) - u64::from(from) + 1,
        }
    }

    /// Never true: a range holds at least its first element.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether the member (whatever its comment) lies within the range.
    pub fn contains(&self, m: &Member) -> bool {
        match (*self, m.without_comment()) {
            (SetRange::Ipv4 { from, to }, Member::Ip(IpAddr::V4(a))) => (from..=to).contains(a),
            (SetRange::Port { from, to }, Member::Port(p)) => (from..=to).contains(p),
            _ => false,
        }
    }
}

/// `FROM-TO` or a CIDR (its host bits cleared, as ipset does).
fn parse_ip_range(s: &str) -> Result<SetRange, RangeError> {
    let v4 = |a: &str| {
        a.parse::<Ipv4Addr>()
            .map_err(|_| RangeError::Syntax(IP_SYNTAX))
    };
    if let Some((a, b)) = s.split_once('-') {
        let (from, to) = (v4(a)?, v4(b)?);
        if from > to {
            return Err(RangeError::Reversed(a.into(), b.into()));
        }
        return Ok(SetRange::Ipv4 { from, to });
    }
    let (a, p) = s.split_once('/').ok_or(RangeError::Syntax(IP_SYNTAX))?;
    let prefix = crate::num::plain_decimal(p, 2)
        .filter(|&n| n <= 32)
        .ok_or(RangeError::Syntax(IP_SYNTAX))? as u8;
    let IpAddr::V4(from) = mask(IpAddr::V4(v4(a)?), prefix) else {
        return Err(RangeError::Syntax(IP_SYNTAX));
    };
    // A /32 has no host bits (a plain shift by 32 would overflow).
    let host_bits = u32::MAX.checked_shr(prefix.into()).unwrap_or(0);
    let to = Ipv4Addr::from(u32::from(from) | host_bits);
    Ok(SetRange::Ipv4 { from, to })
}

/// As `ipset list` prints it: `10.0.0.0-10.0.0.255`, `0-1023`.
impl fmt::Display for SetRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetRange::Ipv4 { from, to } => write!(f, "{from}-{to}"),
            SetRange::Port { from, to } => write!(f, "{from}-{to}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_ranges() {
        let r = SetRange::parse(SetType::BitmapIp, "10.0.0.5/24").unwrap();
        assert_eq!(r.to_string(), "10.0.0.0-10.0.0.255");
        assert_eq!(r.len(), 256);
        let host = SetRange::parse(SetType::BitmapIp, "10.0.0.5/32").unwrap();
        assert_eq!(
            (host.to_string(), host.len()),
            ("10.0.0.5-10.0.0.5".into(), 1)
        );
        let r = SetRange::parse(SetType::BitmapIp, "10.0.0.3-10.0.0.9").unwrap();
        assert_eq!((r.to_string(), r.len()), ("10.0.0.3-10.0.0.9".into(), 7));
        assert!(r.contains(&Member::Ip("10.0.0.9".parse().unwrap())));
        assert!(!r.contains(&Member::Ip("10.0.0.10".parse().unwrap())));
        assert_eq!(
            SetRange::parse(SetType::BitmapIp, "10.0.0.0/16")
                .unwrap()
                .len(),
            65536
        );
        assert_eq!(
            SetRange::parse(SetType::BitmapIp, "10.0.0.0/15"),
            Err(RangeError::TooBig(131072))
        );
        assert!(matches!(
            SetRange::parse(SetType::BitmapIp, "10.0.0.9-10.0.0.3"),
            Err(RangeError::Reversed(..))
        ));
        for bad in ["::1-::2", "10.0.0.0", "10.0.0.0/33", "10.0.0.0/08", "a-b"] {
            assert!(
                matches!(
                    SetRange::parse(SetType::BitmapIp, bad),
                    Err(RangeError::Syntax(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn port_ranges() {
        let r = SetRange::parse(SetType::BitmapPort, "0-65535").unwrap();
        assert_eq!((r.to_string(), r.len()), ("0-65535".into(), 65536));
        assert!(r.contains(&Member::Port(0)));
        let commented = Member::Port(7).with_comment(crate::Comment::parse("x").unwrap());
        assert!(r.contains(&commented));
        assert!(!r.contains(&Member::Ip("10.0.0.1".parse().unwrap())));
        assert!(matches!(
            SetRange::parse(SetType::BitmapPort, "5-3"),
            Err(RangeError::Reversed(..))
        ));
        for bad in ["80", "1-70000", "01-2", "tcp:1-2"] {
            assert!(
                matches!(
                    SetRange::parse(SetType::BitmapPort, bad),
                    Err(RangeError::Syntax(_))
                ),
                "{bad}"
            );
        }
        assert_eq!(
            SetRange::parse(SetType::HashIp, "1-2"),
            Err(RangeError::NotABitmap(SetType::HashIp))
        );
    }
}
