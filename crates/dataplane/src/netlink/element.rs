//! Decoding one listed element (the payload of an IPSET_ATTR_DATA nest)
//! into a typed [`Member`] of a known set kind. Anything this project does
//! not manage (timeouts, counters, skbinfo, unknown flags) is an error: the
//! caller counts such entries unparsable, which forces a rewrite.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::consts::*;
use super::wire::{self, Attr, DecodeError};
use ipsetmgr_ipset::{
    Comment, Family, IfaceName, IpPortIp, IpPortNet, Member, NetIface, Proto, SetKind, SetType,
    is_valid_set_name, mask,
};

/// The attributes of one element, as listed.
#[derive(Default)]
struct Attrs<'a> {
    ip: Option<IpAddr>,
    cidr: Option<u8>,
    ip2: Option<IpAddr>,
    cidr2: Option<u8>,
    port: Option<u16>,
    proto: Option<u8>,
    ether: Option<[u8; 6]>,
    name: Option<&'a str>,
    iface: Option<&'a str>,
    mark: Option<u32>,
    comment: Option<&'a str>,
    cadt_flags: u32,
}

impl<'a> Attrs<'a> {
    fn read(data: &'a [u8]) -> Result<Attrs<'a>, DecodeError> {
        let mut e = Attrs::default();
        for a in wire::attrs(data) {
            let a = a?;
            match a.ty {
                IPSET_ATTR_IP => e.ip = Some(decode_ip(&a)?),
                IPSET_ATTR_CIDR => e.cidr = Some(a.u8()?),
                IPSET_ATTR_IP2 => e.ip2 = Some(decode_ip(&a)?),
                IPSET_ATTR_CIDR2 => e.cidr2 = Some(a.u8()?),
                IPSET_ATTR_PORT => e.port = Some(a.be16()?),
                IPSET_ATTR_PROTO => e.proto = Some(a.u8()?),
                IPSET_ATTR_CADT_FLAGS => e.cadt_flags = a.be32()?,
                IPSET_ATTR_CADT_LINENO => {}
                IPSET_ATTR_ETHER => {
                    let b: [u8; 6] = a
                        .data
                        .get(..6)
                        .and_then(|s| s.try_into().ok())
                        .ok_or(DecodeError("short MAC address"))?;
                    e.ether = Some(b);
                }
                IPSET_ATTR_NAME => e.name = Some(a.str()?),
                IPSET_ATTR_IFACE => e.iface = Some(a.str()?),
                IPSET_ATTR_MARK => e.mark = Some(a.be32()?),
                IPSET_ATTR_COMMENT => e.comment = Some(a.str()?),
                _ => return Err(DecodeError("element has an unmanaged extension")),
            }
        }
        Ok(e)
    }

    /// The first address, of the set's family.
    fn ip(&self, kind: SetKind) -> Result<IpAddr, DecodeError> {
        of_family(kind, self.ip.ok_or(DecodeError("element without IP"))?)
    }

    /// The second address, of the set's family.
    fn ip2(&self, kind: SetKind) -> Result<IpAddr, DecodeError> {
        of_family(
            kind,
            self.ip2.ok_or(DecodeError("element without second IP"))?,
        )
    }

    fn proto_port(&self) -> Result<(Proto, u16), DecodeError> {
        let proto = Proto::from_number(self.proto.ok_or(DecodeError("element without protocol"))?)
            .ok_or(DecodeError("element with an unmanaged protocol"))?;
        Ok((proto, self.port.ok_or(DecodeError("element without port"))?))
    }

    fn nomatch(&self) -> bool {
        self.cadt_flags & IPSET_FLAG_NOMATCH != 0
    }
}

fn of_family(kind: SetKind, a: IpAddr) -> Result<IpAddr, DecodeError> {
    match kind.family {
        Some(f) if f != Family::of(&a) => Err(DecodeError("element of the wrong family")),
        _ => Ok(a),
    }
}

/// A network's prefix (the host length when absent), checked against its
/// address: the kernel lists networks with their host bits cleared.
fn prefix_of(a: IpAddr, cidr: Option<u8>) -> Result<u8, DecodeError> {
    let max = Family::of(&a).max_prefix();
    let prefix = cidr.unwrap_or(max);
    if prefix > max || mask(a, prefix) != a {
        return Err(DecodeError("element with a bad prefix"));
    }
    Ok(prefix)
}

/// An address that must be a single host (a host-length CIDR is fine).
fn host(a: IpAddr, cidr: Option<u8>) -> Result<IpAddr, DecodeError> {
    if cidr.is_some_and(|c| c != Family::of(&a).max_prefix()) {
        return Err(DecodeError("element with a network where a host belongs"));
    }
    Ok(a)
}

/// Decode one element of a set of `kind`.
pub fn decode_element(kind: SetKind, data: &[u8]) -> Result<Member, DecodeError> {
    let e = Attrs::read(data)?;
    let member = decode_key(kind, &e)?;
    match e.comment {
        None => Ok(member),
        Some(text) => {
            let comment = Comment::parse(text)
                .map_err(|_| DecodeError("element with a comment this project would not write"))?;
            Ok(member.with_comment(comment))
        }
    }
}

/// The element without its comment.
fn decode_key(kind: SetKind, e: &Attrs<'_>) -> Result<Member, DecodeError> {
    let physdev = e.cadt_flags & IPSET_FLAG_PHYSDEV != 0;
    if e.cadt_flags & !(IPSET_FLAG_NOMATCH | IPSET_FLAG_PHYSDEV) != 0
        || (e.nomatch() && !kind.set_type.has_nomatch())
        || (physdev && kind.set_type != SetType::HashNetIface)
    {
        return Err(DecodeError("element has unmanaged flags"));
    }
    match kind.set_type {
        SetType::HashIp | SetType::BitmapIp => Ok(Member::Ip(host(e.ip(kind)?, e.cidr)?)),
        SetType::BitmapPort => Ok(Member::Port(
            e.port
                .ok_or(DecodeError("bitmap:port element without port"))?,
        )),
        SetType::HashNet => {
            let addr = e.ip(kind)?;
            Ok(Member::Net {
                addr,
                prefix: prefix_of(addr, e.cidr)?,
                nomatch: e.nomatch(),
            })
        }
        SetType::HashIpPort => {
            let (proto, port) = e.proto_port()?;
            Ok(Member::IpPort {
                addr: e.ip(kind)?,
                proto,
                port,
            })
        }
        SetType::HashNetPort => {
            let addr = e.ip(kind)?;
            let (proto, port) = e.proto_port()?;
            Ok(Member::NetPort {
                addr,
                prefix: prefix_of(addr, e.cidr)?,
                proto,
                port,
                nomatch: e.nomatch(),
            })
        }
        SetType::HashIpPortIp => {
            let (proto, port) = e.proto_port()?;
            Ok(Member::IpPortIp(Box::new(IpPortIp {
                addr: host(e.ip(kind)?, e.cidr)?,
                proto,
                port,
                addr2: host(e.ip2(kind)?, e.cidr2)?,
            })))
        }
        SetType::HashIpPortNet => {
            let (proto, port) = e.proto_port()?;
            let net = e.ip2(kind)?;
            Ok(Member::IpPortNet(Box::new(IpPortNet {
                addr: host(e.ip(kind)?, e.cidr)?,
                proto,
                port,
                net,
                prefix: prefix_of(net, e.cidr2)?,
                nomatch: e.nomatch(),
            })))
        }
        SetType::HashNetIface => {
            let addr = e.ip(kind)?;
            let name = e
                .iface
                .ok_or(DecodeError("hash:net,iface element without iface"))?;
            Ok(Member::NetIface(Box::new(NetIface {
                addr,
                prefix: prefix_of(addr, e.cidr)?,
                physdev,
                iface: IfaceName::parse(name)
                    .map_err(|_| DecodeError("element with an unmanaged interface name"))?,
                nomatch: e.nomatch(),
            })))
        }
        SetType::HashIpMark => Ok(Member::IpMark {
            addr: host(e.ip(kind)?, e.cidr)?,
            mark: e
                .mark
                .ok_or(DecodeError("hash:ip,mark element without mark"))?,
        }),
        SetType::HashMac => Ok(Member::Mac(
            e.ether.ok_or(DecodeError("hash:mac element without MAC"))?,
        )),
        SetType::ListSet => {
            let n = e.name.ok_or(DecodeError("list:set element without name"))?;
            if is_valid_set_name(n) {
                Ok(Member::Set(n.into()))
            } else {
                Err(DecodeError("list:set element with a bad name"))
            }
        }
    }
}

/// An IP attribute (a nest of one IPv4 or IPv6 address). Here rather than
/// in `codec.rs`, which decodes headers with it too, so that the codec
/// imports the element decoder and not the other way round.
pub(super) fn decode_ip(a: &Attr<'_>) -> Result<IpAddr, DecodeError> {
    for inner in a.attrs() {
        let inner = inner?;
        match (inner.ty, inner.data.len()) {
            (IPSET_ATTR_IPADDR_IPV4, 4) => {
                let d = inner.data;
                return Ok(IpAddr::V4(Ipv4Addr::new(d[0], d[1], d[2], d[3])));
            }
            (IPSET_ATTR_IPADDR_IPV6, 16) => {
                let mut o = [0u8; 16];
                o.copy_from_slice(inner.data);
                return Ok(IpAddr::V6(Ipv6Addr::from(o)));
            }
            _ => {}
        }
    }
    Err(DecodeError("IP attribute without an address"))
}
