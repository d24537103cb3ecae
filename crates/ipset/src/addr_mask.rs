//! hash:ip's `netmask` and `bitmask`: the kernel stores each address with
//! the bits outside the mask cleared, so 10.0.0.5 in a `netmask 24` set is
//! the entry 10.0.0.0.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::num::mask;
use crate::types::Family;

/// A hash:ip set's address mask. Never the host-length or all-ones mask
/// (the kernel's default, which it does not report).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AddrMask {
    /// `netmask N`: a prefix length, shorter than the family's host length.
    Prefix(u8),
    /// `bitmask ADDR`: any bits, not all ones.
    Bits(IpAddr),
}

/// Why a mask was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MaskError {
    #[error("netmask must be between 1 and {0} for {1}")]
    Prefix(u8, Family),
    #[error("bitmask must be an {0} address (for example 255.255.0.0 or ffff:ffff::)")]
    Bits(Family),
    #[error("bitmask must not be all zeros (every address would be the null entry)")]
    Zero,
}

impl AddrMask {
    /// `netmask N` for `family`; `None` for the host length (the default).
    pub fn prefix(n: u8, family: Family) -> Result<Option<AddrMask>, MaskError> {
        if n == 0 || n > family.max_prefix() {
            return Err(MaskError::Prefix(family.max_prefix(), family));
        }
        Ok((n != family.max_prefix()).then_some(AddrMask::Prefix(n)))
    }

    /// `bitmask ADDR` for `family`; `None` for all ones (the default).
    pub fn bits(s: &str, family: Family) -> Result<Option<AddrMask>, MaskError> {
        let a: IpAddr = s.parse().map_err(|_| MaskError::Bits(family))?;
        AddrMask::bits_of(a, family)
    }

    /// [`AddrMask::bits`] of an address already parsed (a kernel listing's).
    pub fn bits_of(a: IpAddr, family: Family) -> Result<Option<AddrMask>, MaskError> {
        if Family::of(&a) != family {
            return Err(MaskError::Bits(family));
        }
        let all_ones = match a {
            IpAddr::V4(v) => v == Ipv4Addr::from(u32::MAX),
            IpAddr::V6(v) => v == Ipv6Addr::from(u128::MAX),
        };
        if a.is_unspecified() {
            return Err(MaskError::Zero);
        }
        Ok((!all_ones).then_some(AddrMask::Bits(a)))
    }

    /// The entry the kernel stores for `addr`.
    pub fn apply(&self, addr: IpAddr) -> IpAddr {
        match (*self, addr) {
            (AddrMask::Prefix(n), a) => mask(a, n),
            (AddrMask::Bits(IpAddr::V4(m)), IpAddr::V4(a)) => {
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & u32::from(m)))
            }
            (AddrMask::Bits(IpAddr::V6(m)), IpAddr::V6(a)) => {
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & u128::from(m)))
            }
            // A mask of another family never applies (the compiler refuses it).
            (AddrMask::Bits(_), a) => a,
        }
    }
}

/// As a header option: `netmask 24`, `bitmask 255.255.0.0`.
impl fmt::Display for AddrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddrMask::Prefix(n) => write!(f, "netmask {n}"),
            AddrMask::Bits(a) => write!(f, "bitmask {a}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks() {
        let nm = AddrMask::prefix(24, Family::V4).unwrap().unwrap();
        assert_eq!(
            nm.apply("10.0.0.5".parse().unwrap()).to_string(),
            "10.0.0.0"
        );
        assert_eq!(nm.to_string(), "netmask 24");
        assert_eq!(AddrMask::prefix(32, Family::V4), Ok(None));
        assert!(AddrMask::prefix(33, Family::V4).is_err());
        assert!(AddrMask::prefix(0, Family::V6).is_err());
        let bm = AddrMask::bits("ffff::ff", Family::V6).unwrap().unwrap();
        assert_eq!(
            bm.apply("1234:5678::abcd".parse().unwrap()).to_string(),
            "1234::cd"
        );
        assert_eq!(AddrMask::bits("255.255.255.255", Family::V4), Ok(None));
        assert_eq!(AddrMask::bits("0.0.0.0", Family::V4), Err(MaskError::Zero));
        assert!(AddrMask::bits("ffff::", Family::V4).is_err());
    }
}
