//! Number helpers the member parser, ranges and masks share: a leaf
//! module (it imports nothing of this crate).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A decimal number as ipset(8) reads it unambiguously: digits only, at
/// most `max_len` of them, and no leading zero. ipset parses numbers with
/// `strtoul(.., 0)`, so `010` means 8 there; accepting it here as 10 would
/// silently give the two tools different meanings for the same text.
pub(crate) fn plain_decimal(s: &str, max_len: usize) -> Option<u32> {
    let digits_only = !s.is_empty() && s.len() <= max_len && s.bytes().all(|b| b.is_ascii_digit());
    if !digits_only || (s.len() > 1 && s.starts_with('0')) {
        return None;
    }
    s.parse().ok()
}

/// An address as a number of its family (IPv4 in the low 32 bits).
pub fn to_u128(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The bits below a `prefix` of a `bits`-wide address.
pub fn host_mask(bits: u32, prefix: u8) -> u128 {
    let host = bits.saturating_sub(u32::from(prefix));
    if host >= 128 {
        u128::MAX
    } else {
        (1u128 << host) - 1
    }
}

/// Clear host bits below `prefix`.
pub fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let m = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - prefix as u32)
            };
            IpAddr::V4(Ipv4Addr::from(bits & m))
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - prefix as u32)
            };
            IpAddr::V6(Ipv6Addr::from(bits & m))
        }
    }
}
