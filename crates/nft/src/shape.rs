//! What an ipset-shaped set becomes in nft: its set spec (key fields,
//! interval flag, size) and how its typed members become elements and back.
//!
//! Whatever nft cannot hold exactly is a typed error naming the reason, never
//! an approximation: ICMP type/code members (an `inet_service` field holds
//! ports), `physdev:` interfaces (nft matches bridge ports in the rule, not
//! in the set), a hash:ip bitmask that is no prefix, list:set (the caller
//! flattens it into the sets it lists).
//!
//! The types with a network part (hash:net, hash:net,port, hash:ip,port,net,
//! hash:net,iface; and hash:ip with a netmask) become interval sets whose
//! elements are the exact address ranges ipset would match: nomatch entries
//! are cut out and overlaps merged ([`crate::interval`]), per value of the
//! other, exact, fields.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::net::IpAddr;

use ipsetmgr_ipset::text::{MAX_QUOTED_MEMBER, bounded};
use ipsetmgr_ipset::{
    AddrMask, Comment, Family, HeaderOptions, IfaceName, IpPortIp, IpPortNet, Member, MemberSet,
    NetIface, Proto, SetHeader, SetKind, SetType,
};

use crate::element::{Element, Elements, MAX_ELEMENT_COMMENT_LEN};
use crate::interval::{self, Raw, cidrs_u128, from_u128, host_mask, to_u128};
use crate::spec::{FieldType, KeyType, NftSetSpec};
use crate::value::Value;

/// An ipset-shaped set as nft holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SetShape {
    /// The ipset type and family it came from.
    pub kind: SetKind,
    pub spec: NftSetSpec,
    /// Whether elements carry their members' comments (the element's
    /// userdata, which `nft list` prints as `comment "…"`). Not a property
    /// of the kernel set: nft has no comment extension.
    pub comments: bool,
    /// hash:ip with `netmask N` (or a bitmask that is a prefix): each member
    /// stands for its /N network, so the set holds ranges.
    pub netmask: Option<u8>,
}

/// Whether hash:net,iface's networks of one interface decide for the
/// others ([`add_other_interfaces_networks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Interfaces {
    /// Members of one set: they do, as in the kernel.
    Together,
    /// Matching ranges of several listed sets: each set's were resolved
    /// alone.
    Apart,
}

/// An ipset set that nft cannot express exactly.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error(
        "list:set has no nft equivalent: flatten it into the sets it lists (one set, or one lookup per listed set)"
    )]
    ListSet,
    #[error("{0} needs an address family")]
    NoFamily(SetType),
    #[error("bitmap:ip holds IPv4 addresses only")]
    BitmapFamily,
    #[error(
        "bitmask {0} is not a prefix: an nft set holds address ranges, and masking a packet's address is the rule's job (ip saddr & MASK @set)"
    )]
    Bitmask(IpAddr),
}

/// A member that cannot become an element of its set.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("member {member}: {reason}")]
pub struct UnrepresentableMember {
    pub member: String,
    pub reason: Unrepresentable,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unrepresentable {
    #[error(
        "ICMP type/code has no nft inet_service value (an nft rule matches ICMP with icmp type/code, not with a port)"
    )]
    Icmp,
    #[error(
        "physdev: interfaces are matched by nft rules (meta ibrport/obrport), not by set elements"
    )]
    Physdev,
    #[error("not a member of a {0} set")]
    WrongKind(SetKind),
    #[error("a comment in a set created without comments")]
    Comment,
    #[error("a comment of more than {MAX_ELEMENT_COMMENT_LEN} characters, the most nft holds")]
    CommentTooLong,
    #[error("an element that is no member of a {0} set")]
    NotAMember(SetKind),
}

/// The key fields of an ipset type of `family`, and where (field index)
/// its network part is, for the types that have one.
fn layout(set_type: SetType, family: Family) -> Option<(Vec<FieldType>, Option<usize>)> {
    use FieldType::*;
    let addr = match family {
        Family::V4 => Ipv4Addr,
        Family::V6 => Ipv6Addr,
    };
    Some(match set_type {
        SetType::HashIp | SetType::BitmapIp => (vec![addr], None),
        SetType::HashNet => (vec![addr], Some(0)),
        SetType::HashIpPort => (vec![addr, InetProto, InetService], None),
        SetType::HashNetPort => (vec![addr, InetProto, InetService], Some(0)),
        SetType::HashIpPortIp => (vec![addr, InetProto, InetService, addr], None),
        SetType::HashIpPortNet => (vec![addr, InetProto, InetService, addr], Some(3)),
        SetType::HashNetIface => (vec![addr, Ifname], Some(0)),
        SetType::HashIpMark => (vec![addr, Mark], None),
        SetType::HashMac => (vec![EtherAddr], None),
        SetType::BitmapPort => (vec![InetService], None),
        SetType::ListSet => return None,
    })
}

impl SetShape {
    /// The nft set for an ipset-shaped description. `size` is `max_elem`
    /// (for an interval set: ranges, which are never more than the members
    /// that make them, since a nomatch entry splits at most one range;
    /// except hash:net,iface's, where each interface also loses the
    /// networks only other interfaces have: the backend raises the size to
    /// the ranges then).
    pub fn new(
        set_type: SetType,
        family: Option<Family>,
        options: &HeaderOptions,
        max_elem: u32,
    ) -> Result<SetShape, ShapeError> {
        if set_type == SetType::ListSet {
            return Err(ShapeError::ListSet);
        }
        let kind = SetKind::new(set_type, family);
        let fam = match (set_type.has_family(), family) {
            (false, _) => Family::V4, // family-less types: no address field
            (true, Some(f)) => f,
            (true, None) => return Err(ShapeError::NoFamily(set_type)),
        };
        if set_type == SetType::BitmapIp && fam != Family::V4 {
            return Err(ShapeError::BitmapFamily);
        }
        let netmask = match options.mask {
            None => None,
            Some(AddrMask::Prefix(n)) => Some(n),
            Some(AddrMask::Bits(m)) => Some(mask_prefix(m).ok_or(ShapeError::Bitmask(m))?),
        }
        .filter(|_| set_type == SetType::HashIp);
        let (fields, net) = layout(set_type, fam).ok_or(ShapeError::ListSet)?;
        let key = KeyType::concat(&fields).ok_or(ShapeError::ListSet)?;
        Ok(SetShape {
            kind,
            spec: NftSetSpec {
                key,
                interval: net.is_some() || netmask.is_some(),
                size: Some(max_elem),
            },
            comments: options.comment,
            netmask,
        })
    }

    pub fn from_header(h: &SetHeader) -> Result<SetShape, ShapeError> {
        SetShape::new(h.kind.set_type, h.kind.family, &h.options, h.max_elem)
    }

    fn family(&self) -> Family {
        self.kind.family.unwrap_or(Family::V4)
    }

    /// Where the field that holds ranges is (interval sets).
    fn net_field(&self) -> Option<usize> {
        if self.netmask.is_some() {
            return Some(0);
        }
        layout(self.kind.set_type, self.family()).and_then(|(_, net)| net)
    }

    /// The elements for `members` (all of this set's kind), canonical
    /// (sorted, no duplicates).
    pub fn elements<I>(&self, members: I) -> Result<Elements, UnrepresentableMember>
    where
        I: IntoIterator,
        I::Item: Borrow<Member>,
    {
        self.elements_with(members, Interfaces::Together)
    }

    /// The elements holding what any of `members` matches, where each
    /// member is a plain network some listed set of a list:set already
    /// matches whole (its matching ranges): hash:net,iface's rule across
    /// interfaces held within each listed set, and the kernel tests the
    /// listed sets one by one, so it must not reach across them here.
    pub(crate) fn union_elements<I>(&self, members: I) -> Result<Elements, UnrepresentableMember>
    where
        I: IntoIterator,
        I::Item: Borrow<Member>,
    {
        self.elements_with(members, Interfaces::Apart)
    }

    fn elements_with<I>(
        &self,
        members: I,
        interfaces: Interfaces,
    ) -> Result<Elements, UnrepresentableMember>
    where
        I: IntoIterator,
        I::Item: Borrow<Member>,
    {
        let mut members = members.into_iter();
        let mut out =
            Elements::with_capacity(self.spec.key, self.spec.interval, members.size_hint().0);
        match self.net_field() {
            None => {
                let mut key = Vec::with_capacity(self.spec.key.len());
                // `try_for_each`, not `for`: a member set's iterator is a
                // chain over its stores, which only internal iteration turns
                // into one tight loop (a million members).
                members.try_for_each(|m| {
                    let m = m.borrow();
                    key.clear();
                    let comment = self.comment_of(m)?;
                    self.exact_key(m.without_comment(), &mut key)
                        .map_err(|reason| err(m, reason))?;
                    self.spec.key.fit(&mut key);
                    // The key has the set's length by construction.
                    let _ = out.push_raw(&key, None, comment.cloned());
                    Ok(())
                })?;
                out.canonicalize();
            }
            Some(net_at) => self.interval_elements(members, net_at, interfaces, &mut out)?,
        }
        Ok(out)
    }

    /// [`SetShape::elements`] of a member set, with a shortcut for the
    /// commonest big set: hash:ip IPv4, whose elements are its addresses'
    /// bytes in the order the set already keeps them.
    pub fn elements_of_set(&self, set: &MemberSet) -> Result<Elements, UnrepresentableMember> {
        let plain_v4 = self.kind.set_type == SetType::HashIp
            && self.family() == Family::V4
            && set.kind() == self.kind
            && self.net_field().is_none();
        if let Some(hosts) = set.sorted_ipv4_hosts().filter(|_| plain_v4) {
            let mut data = Vec::with_capacity(hosts.len() * 4);
            hosts.for_each(|a| data.extend_from_slice(&a.octets()));
            return Ok(Elements::from_sorted_keys(self.spec.key, data));
        }
        self.elements(set.iter())
    }

    fn comment_of<'m>(&self, m: &'m Member) -> Result<Option<&'m Comment>, UnrepresentableMember> {
        match m.comment() {
            Some(_) if !self.comments => Err(err(m, Unrepresentable::Comment)),
            Some(c) if c.as_str().len() > MAX_ELEMENT_COMMENT_LEN => {
                Err(err(m, Unrepresentable::CommentTooLong))
            }
            c => Ok(c),
        }
    }

    fn check_family(&self, a: &IpAddr) -> Result<(), Unrepresentable> {
        if Family::of(a) == self.family() {
            Ok(())
        } else {
            Err(Unrepresentable::WrongKind(self.kind))
        }
    }

    fn addr(&self, a: &IpAddr, key: &mut Vec<u8>) -> Result<(), Unrepresentable> {
        self.check_family(a)?;
        match a {
            IpAddr::V4(a) => Value::Ipv4(*a).encode(key),
            IpAddr::V6(a) => Value::Ipv6(*a).encode(key),
        }
        Ok(())
    }

    fn proto_port(proto: Proto, port: u16, key: &mut Vec<u8>) -> Result<(), Unrepresentable> {
        if proto.is_icmp() {
            return Err(Unrepresentable::Icmp);
        }
        Value::Proto(proto.number()).encode(key);
        Value::Service(port).encode(key);
        Ok(())
    }

    /// The key of a member of an exact (non-interval) type.
    fn exact_key(&self, m: &Member, key: &mut Vec<u8>) -> Result<(), Unrepresentable> {
        let wrong = Unrepresentable::WrongKind(self.kind);
        match (self.kind.set_type, m) {
            (SetType::HashIp | SetType::BitmapIp, Member::Ip(a)) => self.addr(a, key),
            (SetType::HashIpPort, Member::IpPort { addr, proto, port }) => {
                self.addr(addr, key)?;
                Self::proto_port(*proto, *port, key)
            }
            (SetType::HashIpPortIp, Member::IpPortIp(e)) => {
                self.addr(&e.addr, key)?;
                Self::proto_port(e.proto, e.port, key)?;
                self.addr(&e.addr2, key)
            }
            (SetType::HashIpMark, Member::IpMark { addr, mark }) => {
                self.addr(addr, key)?;
                Value::Mark(*mark).encode(key);
                Ok(())
            }
            (SetType::HashMac, Member::Mac(m)) => {
                Value::Ether(*m).encode(key);
                Ok(())
            }
            (SetType::BitmapPort, Member::Port(p)) => {
                Value::Service(*p).encode(key);
                Ok(())
            }
            _ => Err(wrong),
        }
    }

    /// A member of an interval type: the bytes of its exact fields in key
    /// order (without the network field) and its network.
    fn split_net(
        &self,
        m: &Member,
        exact: &mut Vec<u8>,
    ) -> Result<(IpAddr, u8, bool), Unrepresentable> {
        let wrong = Unrepresentable::WrongKind(self.kind);
        match (self.kind.set_type, m) {
            (SetType::HashIp, Member::Ip(a)) => {
                self.check_family(a)?;
                let n = self.netmask.unwrap_or(self.family().max_prefix());
                Ok((*a, n, false))
            }
            (
                SetType::HashNet,
                Member::Net {
                    addr,
                    prefix,
                    nomatch,
                },
            ) => {
                self.check_family(addr)?;
                Ok((*addr, *prefix, *nomatch))
            }
            (
                SetType::HashNetPort,
                Member::NetPort {
                    addr,
                    prefix,
                    proto,
                    port,
                    nomatch,
                },
            ) => {
                self.check_family(addr)?;
                Self::proto_port(*proto, *port, exact)?;
                Ok((*addr, *prefix, *nomatch))
            }
            (SetType::HashIpPortNet, Member::IpPortNet(e)) => {
                self.addr(&e.addr, exact)?;
                Self::proto_port(e.proto, e.port, exact)?;
                self.check_family(&e.net)?;
                Ok((e.net, e.prefix, e.nomatch))
            }
            (SetType::HashNetIface, Member::NetIface(e)) => {
                if e.physdev {
                    return Err(Unrepresentable::Physdev);
                }
                self.check_family(&e.addr)?;
                Value::Ifname(e.iface.clone()).encode(exact);
                Ok((e.addr, e.prefix, e.nomatch))
            }
            _ => Err(wrong),
        }
    }

    fn interval_elements<I>(
        &self,
        members: I,
        net_field: usize,
        interfaces: Interfaces,
        out: &mut Elements,
    ) -> Result<(), UnrepresentableMember>
    where
        I: Iterator,
        I::Item: Borrow<Member>,
    {
        let family = self.family();
        let bits = u32::from(family.max_prefix());
        let net_at = self.spec.key.offset(net_field);
        let net_len = self.spec.key.fields()[net_field].reg_len();
        // Members grouped by their exact fields; comments interned so that
        // equal comments compare equal (and merge) as plain numbers.
        let mut exacts: Vec<u8> = Vec::new();
        let exact_len = self.spec.key.len() - net_len;
        let mut rules: Vec<(u32, Raw<u32>)> = Vec::new();
        let mut comments: Vec<Comment> = Vec::new();
        let mut comment_ids: HashMap<Comment, u32> = HashMap::new();
        let mut group_ids: HashMap<Vec<u8>, u32> = HashMap::new();
        let mut exact = Vec::with_capacity(exact_len);
        for m in members {
            let m = m.borrow();
            let comment = match self.comment_of(m)? {
                Some(c) => *comment_ids.entry(c.clone()).or_insert_with(|| {
                    comments.push(c.clone());
                    comments.len() as u32
                }),
                None => 0,
            };
            exact.clear();
            let (addr, prefix, nomatch) = self
                .split_net(m.without_comment(), &mut exact)
                .map_err(|reason| err(m, reason))?;
            let group = match group_ids.get(&exact) {
                Some(&g) => g,
                None => {
                    let g = group_ids.len() as u32;
                    group_ids.insert(exact.clone(), g);
                    exacts.extend_from_slice(&exact);
                    g
                }
            };
            let start = to_u128(addr) & !host_mask(bits, prefix);
            rules.push((
                group,
                Raw {
                    start,
                    end: start | host_mask(bits, prefix),
                    prefix,
                    nomatch,
                    comment,
                },
            ));
        }
        let iface = self.kind.set_type == SetType::HashNetIface;
        if iface && interfaces == Interfaces::Together && group_ids.len() > 1 {
            add_other_interfaces_networks(&mut rules, group_ids.len() as u32);
        }
        // Groups in the order of their bytes, so the output is canonical.
        let mut order: Vec<u32> = (0..group_ids.len() as u32).collect();
        let group_bytes = |g: u32| &exacts[g as usize * exact_len..(g as usize + 1) * exact_len];
        order.sort_by(|&a, &b| group_bytes(a).cmp(group_bytes(b)));
        let mut rank = vec![0u32; order.len()];
        for (r, &g) in order.iter().enumerate() {
            rank[g as usize] = r as u32;
        }
        rules.sort_by_key(|(g, _)| rank[*g as usize]);
        let mut key = Vec::with_capacity(self.spec.key.len());
        let mut end = Vec::with_capacity(self.spec.key.len());
        let mut rest = rules.as_slice();
        while let Some(((g, _), _)) = rest.split_first() {
            let n = rest.iter().take_while(|(h, _)| h == g).count();
            let (run, tail) = rest.split_at(n);
            rest = tail;
            let bytes = group_bytes(*g);
            let raws = run.iter().map(|(_, r)| r.clone()).collect();
            for (first, last, c) in interval::ranges(bits, raws) {
                for (buf, v) in [(&mut key, first), (&mut end, last)] {
                    buf.clear();
                    buf.extend_from_slice(&bytes[..net_at]);
                    match from_u128(family, v) {
                        IpAddr::V4(a) => Value::Ipv4(a).encode(buf),
                        IpAddr::V6(a) => Value::Ipv6(a).encode(buf),
                    }
                    buf.extend_from_slice(&bytes[net_at..]);
                    self.spec.key.fit(buf);
                }
                let comment = c.checked_sub(1).map(|i| comments[i as usize].clone());
                // Lengths are the key's by construction, and first <= last.
                let _ = out.push_raw(&key, Some(&end), comment);
            }
        }
        // Ranges of one group are in order; groups are in byte order, and
        // the exact fields before the network part decide first. Only a
        // network field that comes first (hash:net,port/iface) needs a sort.
        if !out.is_canonical() {
            out.canonicalize();
        }
        Ok(())
    }

    /// The members the elements stand for (the inverse of
    /// [`SetShape::elements`] for display): ranges become the fewest
    /// networks (as plain members: nomatch holes are already cut out).
    pub fn members(&self, elements: &Elements) -> Result<Vec<Member>, UnrepresentableMember> {
        let mut out = Vec::with_capacity(elements.len());
        let not_member = |e: String| UnrepresentableMember {
            member: e,
            reason: Unrepresentable::NotAMember(self.kind),
        };
        for e in elements.iter() {
            let typed = e.typed().map_err(|_| not_member(e.to_string()))?;
            let before = out.len();
            self.members_of(&typed, &mut out)
                .ok_or_else(|| not_member(e.to_string()))?;
            if let Some(c) = &typed.comment {
                for m in &mut out[before..] {
                    *m = m.clone().with_comment(c.clone());
                }
            }
        }
        Ok(out)
    }

    fn members_of(&self, e: &Element, out: &mut Vec<Member>) -> Option<()> {
        let (ip, pp) = (value_ip, value_proto_port);
        let k = &e.key;
        let Some(net_field) = self.net_field() else {
            if e.key_end.is_some() {
                return None;
            }
            out.push(match (self.kind.set_type, k.as_slice()) {
                (SetType::HashIp | SetType::BitmapIp, [a]) => Member::Ip(ip(a)?),
                (SetType::HashIpPort, [a, p, s]) => {
                    let (proto, port) = pp(p, s)?;
                    Member::IpPort {
                        addr: ip(a)?,
                        proto,
                        port,
                    }
                }
                (SetType::HashIpPortIp, [a, p, s, b]) => {
                    let (proto, port) = pp(p, s)?;
                    Member::IpPortIp(Box::new(IpPortIp {
                        addr: ip(a)?,
                        proto,
                        port,
                        addr2: ip(b)?,
                    }))
                }
                (SetType::HashIpMark, [a, Value::Mark(mark)]) => Member::IpMark {
                    addr: ip(a)?,
                    mark: *mark,
                },
                (SetType::HashMac, [Value::Ether(m)]) => Member::Mac(*m),
                (SetType::BitmapPort, [Value::Service(p)]) => Member::Port(*p),
                _ => return None,
            });
            return Some(());
        };
        let end = e.key_end.as_ref()?;
        // Every field but the network one is exact.
        if (0..k.len()).any(|i| i != net_field && k.get(i) != end.get(i)) {
            return None;
        }
        let family = self.family();
        let bits = u32::from(family.max_prefix());
        let (first, last) = (ip(k.get(net_field)?)?, ip(end.get(net_field)?)?);
        if Family::of(&first) != family || Family::of(&last) != family || last < first {
            return None;
        }
        for (start, prefix) in cidrs_u128(bits, to_u128(first), to_u128(last)) {
            let addr = from_u128(family, start);
            // The types that split /0 in ipset hold its halves.
            let halves = prefix == 0 && self.kind.set_type != SetType::HashNetIface;
            let nets = if halves {
                vec![(addr, 1), (from_u128(family, 1u128 << (bits - 1)), 1)]
            } else {
                vec![(addr, prefix)]
            };
            for (addr, prefix) in nets {
                self.push_net_member(k, addr, prefix, out)?;
            }
        }
        Some(())
    }

    fn push_net_member(
        &self,
        k: &[Value],
        addr: IpAddr,
        prefix: u8,
        out: &mut Vec<Member>,
    ) -> Option<()> {
        let (ip, pp) = (value_ip, value_proto_port);
        match (self.kind.set_type, k) {
            (SetType::HashIp, [_]) => {
                // A netmask set's members are its /N networks' addresses.
                let n = self.netmask?;
                if prefix > n {
                    return None;
                }
                let bits = u32::from(self.family().max_prefix());
                let step = 1u128 << (bits - u32::from(n));
                let count = 1u128 << (n - prefix);
                let base = to_u128(addr);
                for i in 0..count {
                    out.push(Member::Ip(from_u128(self.family(), base + i * step)));
                }
            }
            (SetType::HashNet, [_]) => out.push(Member::Net {
                addr,
                prefix,
                nomatch: false,
            }),
            (SetType::HashNetPort, [_, p, s]) => {
                let (proto, port) = pp(p, s)?;
                out.push(Member::NetPort {
                    addr,
                    prefix,
                    proto,
                    port,
                    nomatch: false,
                });
            }
            (SetType::HashIpPortNet, [a, p, s, _]) => {
                let (proto, port) = pp(p, s)?;
                out.push(Member::IpPortNet(Box::new(IpPortNet {
                    addr: ip(a)?,
                    proto,
                    port,
                    net: addr,
                    prefix,
                    nomatch: false,
                })));
            }
            (SetType::HashNetIface, [_, Value::Ifname(iface)]) => {
                out.push(Member::NetIface(Box::new(NetIface {
                    addr,
                    prefix,
                    physdev: false,
                    iface: IfaceName::clone(iface),
                    nomatch: false,
                })));
            }
            _ => return None,
        }
        Some(())
    }
}

/// hash:net,iface: make each interface's group see the other interfaces'
/// networks, as the kernel's ipset does.
///
/// For this type the kernel tries the prefix lengths most specific first,
/// and the first length at which SOME member holds the address (on any
/// interface, nomatch or not) ends the search: the address matches exactly
/// when that network is a member for the packet's interface too, without
/// nomatch. So with `10.0.0.0/8,eth0` and `10.2.0.0/16,vlan0`, 10.2.0.1 on
/// eth0 is out. (hash:net,port and the others go on to shorter prefixes per
/// port: for them each group stands alone.) Resolving each group alone with
/// [`interval::ranges`] is that rule once every network of another group
/// that this group does not have itself (same start and prefix) is a
/// nomatch rule of this group: the most specific network then decides, and
/// if it is another interface's, the address is out for this one.
///
/// The cost is one rule per (group, network of the others): groups x
/// distinct networks, before the ranges are computed.
fn add_other_interfaces_networks(rules: &mut Vec<(u32, Raw<u32>)>, groups: u32) {
    // Every network with each group that has it (and its end, which the
    // start and prefix decide), sorted and distinct.
    let mut nets: Vec<(u128, u8, u32, u128)> = rules
        .iter()
        .map(|(g, r)| (r.start, r.prefix, *g, r.end))
        .collect();
    nets.sort_unstable();
    nets.dedup();
    let mut added = Vec::new();
    for same in nets.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
        let (start, prefix, _, end) = same[0];
        let mut has = same.iter().map(|n| n.2).peekable();
        for g in 0..groups {
            if has.next_if_eq(&g).is_some() {
                continue;
            }
            added.push((
                g,
                Raw {
                    start,
                    end,
                    prefix,
                    nomatch: true,
                    comment: 0,
                },
            ));
        }
    }
    rules.extend(added);
}

/// The error for `m`, quoting it cut to [`MAX_QUOTED_MEMBER`] bytes (a
/// comment can make a member 300 bytes long, and the error goes into the
/// table and the node state).
fn err(m: &Member, reason: Unrepresentable) -> UnrepresentableMember {
    UnrepresentableMember {
        member: bounded(&m.to_string(), MAX_QUOTED_MEMBER).into_owned(),
        reason,
    }
}

/// The prefix length of a contiguous mask (`255.255.0.0` is 16).
fn mask_prefix(m: IpAddr) -> Option<u8> {
    let (bits, v) = match m {
        IpAddr::V4(a) => (32u32, u128::from(u32::from(a)) << 96),
        IpAddr::V6(a) => (128, u128::from(a)),
    };
    let ones = v.leading_ones();
    (v.checked_shl(ones).unwrap_or(0) == 0 && ones <= bits).then_some(ones as u8)
}

/// An element's address value, when it is one.
fn value_ip(v: &Value) -> Option<IpAddr> {
    match v {
        Value::Ipv4(a) => Some(IpAddr::V4(*a)),
        Value::Ipv6(a) => Some(IpAddr::V6(*a)),
        _ => None,
    }
}

/// An element's protocol and port values, when they are a pair of them.
fn value_proto_port(p: &Value, s: &Value) -> Option<(Proto, u16)> {
    match (p, s) {
        (Value::Proto(p), Value::Service(s)) => Some((Proto::from_number(*p)?, *s)),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
