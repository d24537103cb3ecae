//! Typed values of key fields, and their bytes as the kernel holds them in
//! a key. Decoding bytes never panics: kernel replies and the fuzzer go
//! through [`Value::decode`].

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipsetmgr_ipset::{IfaceName, Proto};

use crate::spec::FieldType;

/// The value of one key field.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    Ipv4(Ipv4Addr),
    Ipv6(Ipv6Addr),
    Ether([u8; 6]),
    /// An IP protocol number (`inet_proto`).
    Proto(u8),
    /// A transport port (`inet_service`).
    Service(u16),
    Mark(u32),
    Ifname(IfaceName),
}

/// Bytes that are not a value of the field's type.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a valid {field} value: {reason}")]
pub struct ValueError {
    pub field: FieldType,
    pub reason: &'static str,
}

impl Value {
    pub fn field_type(&self) -> FieldType {
        match self {
            Value::Ipv4(_) => FieldType::Ipv4Addr,
            Value::Ipv6(_) => FieldType::Ipv6Addr,
            Value::Ether(_) => FieldType::EtherAddr,
            Value::Proto(_) => FieldType::InetProto,
            Value::Service(_) => FieldType::InetService,
            Value::Mark(_) => FieldType::Mark,
            Value::Ifname(_) => FieldType::Ifname,
        }
    }

    /// Append the field's register bytes (value, then zero padding).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        match self {
            Value::Ipv4(a) => out.extend_from_slice(&a.octets()),
            Value::Ipv6(a) => out.extend_from_slice(&a.octets()),
            Value::Ether(m) => out.extend_from_slice(m),
            Value::Proto(p) => out.push(*p),
            Value::Service(p) => out.extend_from_slice(&p.to_be_bytes()),
            // nft's mark is a host-order integer (its udata says so too).
            Value::Mark(m) => out.extend_from_slice(&m.to_ne_bytes()),
            // IFNAMSIZ bytes, NUL-padded: a name has at most 15.
            Value::Ifname(n) => out.extend_from_slice(n.as_str().as_bytes()),
        }
        let reg_len = self.field_type().reg_len();
        out.resize(start + reg_len, 0);
    }

    /// The value of a `field` from its register bytes (`bytes` may be the
    /// padded register or just the value).
    pub fn decode(field: FieldType, bytes: &[u8]) -> Result<Value, ValueError> {
        let bad = |reason| ValueError { field, reason };
        let v = bytes.get(..field.len()).ok_or(bad("too short"))?;
        Ok(match field {
            FieldType::Ipv4Addr => Value::Ipv4(Ipv4Addr::from(arr::<4>(v))),
            FieldType::Ipv6Addr => Value::Ipv6(Ipv6Addr::from(arr::<16>(v))),
            FieldType::EtherAddr => Value::Ether(arr::<6>(v)),
            FieldType::InetProto => Value::Proto(v[0]),
            FieldType::InetService => Value::Service(u16::from_be_bytes(arr::<2>(v))),
            FieldType::Mark => Value::Mark(u32::from_ne_bytes(arr::<4>(v))),
            FieldType::Ifname => {
                let end = v.iter().position(|&b| b == 0).ok_or(bad("no NUL"))?;
                let s = std::str::from_utf8(&v[..end]).map_err(|_| bad("not UTF-8"))?;
                Value::Ifname(IfaceName::parse(s).map_err(|_| bad("not an interface name"))?)
            }
        })
    }
}

/// The first `N` bytes (the caller checked there are that many).
fn arr<const N: usize>(v: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    let n = v.len().min(N);
    a[..n].copy_from_slice(&v[..n]);
    a
}

/// A protocol's name as `nft` prints it (`/etc/protocols`), for the ones
/// ipset members can name; others by number.
pub(crate) fn proto_name(p: u8) -> Option<&'static str> {
    Proto::from_number(p).map(|p| p.ipset_name())
}

/// As `nft list` prints the value.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Ipv4(a) => write!(f, "{a}"),
            Value::Ipv6(a) => write!(f, "{a}"),
            Value::Ether(m) => write!(
                f,
                "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                m[0], m[1], m[2], m[3], m[4], m[5]
            ),
            Value::Proto(p) => match proto_name(*p) {
                Some(n) => f.write_str(n),
                None => write!(f, "{p}"),
            },
            Value::Service(p) => write!(f, "{p}"),
            Value::Mark(m) => write!(f, "0x{m:08x}"),
            Value::Ifname(n) => write!(f, "\"{n}\""),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_through_their_registers() {
        let values = [
            Value::Ipv4("10.1.2.3".parse().unwrap()),
            Value::Ipv6("2001:db8::1".parse().unwrap()),
            Value::Ether([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff]),
            Value::Proto(6),
            Value::Service(443),
            Value::Mark(0x10),
            Value::Ifname(IfaceName::parse("eth0").unwrap()),
        ];
        for v in values {
            let mut b = Vec::new();
            v.encode(&mut b);
            assert_eq!(b.len(), v.field_type().reg_len(), "{v}");
            assert_eq!(Value::decode(v.field_type(), &b).as_ref(), Ok(&v));
        }
        let mut b = Vec::new();
        Value::Service(80).encode(&mut b);
        assert_eq!(b, [0, 80, 0, 0], "network order, then padding");
        assert!(Value::decode(FieldType::Ipv6Addr, &[1, 2]).is_err());
        assert!(Value::decode(FieldType::Ifname, &[b'a'; 16]).is_err());
        assert!(Value::decode(FieldType::Ifname, &[0xff, 0, 0]).is_err());
        assert!(Value::decode(FieldType::Ifname, b"a b\0").is_err());
    }
}
