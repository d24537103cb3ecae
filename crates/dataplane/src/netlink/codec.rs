//! The ipset message layer: building requests from typed values and decoding
//! the kernel's replies into typed values. Everything here is pure (no
//! socket), so it is unit-, property- and fuzz-tested.

use std::net::IpAddr;

use super::consts::*;
use super::element::{decode_element, decode_ip};
use super::wire::{self, DecodeError};
use ipsetmgr_ipset::{
    AddrMask, Family, HeaderOptions, Member, MemberSet, MemberSetBuilder, SetHeader, SetKind,
    SetRange, SetType,
};

/// The largest `nla_len` of the IPSET_ATTR_ADT nest (a u16).
pub const MAX_ADT_LEN: usize = u16::MAX as usize;

pub fn nfproto(family: Option<Family>) -> u8 {
    match family {
        Some(Family::V4) => NFPROTO_IPV4,
        Some(Family::V6) => NFPROTO_IPV6,
        None => NFPROTO_UNSPEC,
    }
}

/// The family byte a set of this kind is created (and probed) with: hash
/// types carry their address family, list:set and hash:mac none.
pub fn kernel_family(kind: SetKind) -> u8 {
    if kind.set_type.has_family() {
        nfproto(kind.family)
    } else {
        NFPROTO_UNSPEC
    }
}

// ---------------------------------------------------------------- requests

/// A request with the mandatory PROTOCOL attribute; `attrs` adds the rest.
pub fn request(
    buf: &mut Vec<u8>,
    cmd: u8,
    flags: u16,
    seq: u32,
    proto: u8,
    attrs: impl FnOnce(&mut Vec<u8>),
) {
    let start = wire::begin_msg(buf, msg_type(cmd), NLM_F_REQUEST | flags, seq, NFPROTO_IPV4);
    wire::put_u8(buf, IPSET_ATTR_PROTOCOL, proto);
    attrs(buf);
    wire::end_msg(buf, start);
}

fn put_ip(buf: &mut Vec<u8>, ty: u16, addr: &IpAddr) {
    let n = wire::begin_nest(buf, ty);
    match addr {
        IpAddr::V4(a) => wire::put_attr(
            buf,
            IPSET_ATTR_IPADDR_IPV4 | NLA_F_NET_BYTEORDER,
            &a.octets(),
        ),
        IpAddr::V6(a) => wire::put_attr(
            buf,
            IPSET_ATTR_IPADDR_IPV6 | NLA_F_NET_BYTEORDER,
            &a.octets(),
        ),
    }
    // An address nest is 12 or 24 bytes: it always fits.
    let _ = wire::end_nest(buf, n);
}

fn put_nomatch(buf: &mut Vec<u8>, nomatch: bool) {
    if nomatch {
        wire::put_be32(buf, IPSET_ATTR_CADT_FLAGS, IPSET_FLAG_NOMATCH);
    }
}

/// Append one element as an IPSET_ATTR_DATA nest; `lineno` (when not 0) is
/// what the kernel reports back when this element fails.
pub fn encode_element(buf: &mut Vec<u8>, m: &Member, lineno: u32) {
    let n = wire::begin_nest(buf, IPSET_ATTR_DATA);
    put_member(buf, m);
    if lineno != 0 {
        wire::put_u32_host(buf, IPSET_ATTR_CADT_LINENO, lineno);
    }
    // One element is well under 512 bytes (a comment is at most 255).
    let _ = wire::end_nest(buf, n);
}

/// The attributes of one element.
fn put_member(buf: &mut Vec<u8>, m: &Member) {
    match m {
        Member::Commented(c) => {
            put_member(buf, &c.member);
            wire::put_str(buf, IPSET_ATTR_COMMENT, c.comment.as_str());
        }
        Member::Ip(a) => put_ip(buf, IPSET_ATTR_IP, a),
        Member::Net {
            addr,
            prefix,
            nomatch,
        } => {
            put_ip(buf, IPSET_ATTR_IP, addr);
            wire::put_u8(buf, IPSET_ATTR_CIDR, *prefix);
            put_nomatch(buf, *nomatch);
        }
        Member::IpPort { addr, proto, port } => {
            put_ip(buf, IPSET_ATTR_IP, addr);
            wire::put_be16(buf, IPSET_ATTR_PORT, *port);
            wire::put_u8(buf, IPSET_ATTR_PROTO, proto.number());
        }
        Member::Mac(mac) => wire::put_attr(buf, IPSET_ATTR_ETHER, mac),
        Member::Set(name) => wire::put_str(buf, IPSET_ATTR_NAME, name),
        Member::Port(port) => wire::put_be16(buf, IPSET_ATTR_PORT, *port),
        Member::IpMark { addr, mark } => {
            put_ip(buf, IPSET_ATTR_IP, addr);
            wire::put_be32(buf, IPSET_ATTR_MARK, *mark);
        }
        Member::NetIface(e) => {
            put_ip(buf, IPSET_ATTR_IP, &e.addr);
            wire::put_u8(buf, IPSET_ATTR_CIDR, e.prefix);
            wire::put_str(buf, IPSET_ATTR_IFACE, e.iface.as_str());
            let flags = if e.physdev { IPSET_FLAG_PHYSDEV } else { 0 }
                | if e.nomatch { IPSET_FLAG_NOMATCH } else { 0 };
            if flags != 0 {
                wire::put_be32(buf, IPSET_ATTR_CADT_FLAGS, flags);
            }
        }
        Member::NetPort {
            addr,
            prefix,
            proto,
            port,
            nomatch,
        } => {
            put_ip(buf, IPSET_ATTR_IP, addr);
            wire::put_u8(buf, IPSET_ATTR_CIDR, *prefix);
            wire::put_be16(buf, IPSET_ATTR_PORT, *port);
            wire::put_u8(buf, IPSET_ATTR_PROTO, proto.number());
            put_nomatch(buf, *nomatch);
        }
        Member::IpPortIp(e) => {
            put_ip(buf, IPSET_ATTR_IP, &e.addr);
            wire::put_be16(buf, IPSET_ATTR_PORT, e.port);
            wire::put_u8(buf, IPSET_ATTR_PROTO, e.proto.number());
            put_ip(buf, IPSET_ATTR_IP2, &e.addr2);
        }
        Member::IpPortNet(e) => {
            put_ip(buf, IPSET_ATTR_IP, &e.addr);
            wire::put_be16(buf, IPSET_ATTR_PORT, e.port);
            wire::put_u8(buf, IPSET_ATTR_PROTO, e.proto.number());
            put_ip(buf, IPSET_ATTR_IP2, &e.net);
            wire::put_u8(buf, IPSET_ATTR_CIDR2, e.prefix);
            put_nomatch(buf, e.nomatch);
        }
    }
}

/// The IPSET_ATTR_DATA of a CREATE request.
pub fn encode_create_data(buf: &mut Vec<u8>, header: &SetHeader) {
    let n = wire::begin_nest(buf, IPSET_ATTR_DATA);
    if header.options.comment {
        wire::put_be32(buf, IPSET_ATTR_CADT_FLAGS, IPSET_FLAG_WITH_COMMENT);
    }
    match header.options.mask {
        Some(AddrMask::Prefix(n)) => wire::put_u8(buf, IPSET_ATTR_NETMASK, n),
        Some(AddrMask::Bits(a)) => put_ip(buf, IPSET_ATTR_BITMASK, &a),
        None => {}
    }
    if let Some(range) = header.options.range {
        // A bitmap: the range is its size; it has no maxelem or hash size.
        match range {
            SetRange::Ipv4 { from, to } => {
                put_ip(buf, IPSET_ATTR_IP, &IpAddr::V4(from));
                put_ip(buf, IPSET_ATTR_IP_TO, &IpAddr::V4(to));
            }
            SetRange::Port { from, to } => {
                wire::put_be16(buf, IPSET_ATTR_PORT, from);
                wire::put_be16(buf, IPSET_ATTR_PORT_TO, to);
            }
        }
    } else if header.kind.set_type == SetType::ListSet {
        wire::put_be32(buf, IPSET_ATTR_SIZE, header.max_elem);
    } else {
        if let Some(h) = header.hash_size {
            wire::put_be32(buf, IPSET_ATTR_HASHSIZE, h);
        }
        wire::put_be32(buf, IPSET_ATTR_MAXELEM, header.max_elem);
    }
    let _ = wire::end_nest(buf, n);
}

/// A complete CREATE request.
pub fn create_request(
    buf: &mut Vec<u8>,
    seq: u32,
    proto: u8,
    name: &str,
    header: &SetHeader,
    revision: u8,
) {
    request(
        buf,
        IPSET_CMD_CREATE,
        NLM_F_ACK | NLM_F_EXCL,
        seq,
        proto,
        |b| {
            wire::put_str(b, IPSET_ATTR_SETNAME, name);
            wire::put_str(b, IPSET_ATTR_TYPENAME, header.kind.set_type.as_str());
            wire::put_u8(b, IPSET_ATTR_REVISION, revision);
            wire::put_u8(b, IPSET_ATTR_FAMILY, kernel_family(header.kind));
            encode_create_data(b, header);
        },
    );
}

/// Streams the ADD/DEL messages of one operation: each message holds as
/// many elements as fit in one IPSET_ATTR_ADT nest of at most `max_adt`
/// bytes. Elements are numbered (IPSET_ATTR_LINENO) from 1 in iteration
/// order, across messages.
pub struct AdtEncoder<'a, I: Iterator<Item = Member>> {
    cmd: u8,
    set: &'a str,
    proto: u8,
    members: I,
    max_adt: usize,
    next_lineno: u32,
    /// An element encoded but not yet placed (it did not fit the last message).
    pending: Vec<u8>,
    scratch: Vec<u8>,
}

/// What one ADT message holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdtChunk {
    pub first_lineno: u32,
    pub count: u32,
}

impl<'a, I: Iterator<Item = Member>> AdtEncoder<'a, I> {
    pub fn new(cmd: u8, set: &'a str, proto: u8, members: I, max_adt: usize) -> Self {
        AdtEncoder {
            cmd,
            set,
            proto,
            members,
            max_adt: max_adt.clamp(256, MAX_ADT_LEN),
            next_lineno: 1,
            pending: Vec::new(),
            scratch: Vec::with_capacity(128),
        }
    }

    /// Encode `m` into `pending`: for DEL only its key (the kernel deletes
    /// by key; a comment there would be refused).
    fn encode(&mut self, m: &Member) {
        let key = (self.cmd == IPSET_CMD_DEL).then(|| m.key_only()).flatten();
        encode_element(
            &mut self.pending,
            key.as_ref().unwrap_or(m),
            self.next_lineno,
        );
    }

    /// Append the next message to `buf`; `None` when every member was sent.
    pub fn next_message(&mut self, buf: &mut Vec<u8>, seq: u32) -> Option<AdtChunk> {
        if self.pending.is_empty() {
            let m = self.members.next()?;
            self.encode(&m);
        }
        let first_lineno = self.next_lineno;
        let mut count = 0u32;
        // Add/Del never use NLM_F_EXCL: the kernel then applies "exist"
        // semantics (adding a present or deleting an absent element is fine).
        let start = wire::begin_msg(
            buf,
            msg_type(self.cmd),
            NLM_F_REQUEST | NLM_F_ACK,
            seq,
            NFPROTO_IPV4,
        );
        wire::put_u8(buf, IPSET_ATTR_PROTOCOL, self.proto);
        wire::put_str(buf, IPSET_ATTR_SETNAME, self.set);
        // Batch mode needs a command-level LINENO; the kernel overwrites it
        // with the failing element's number in its error reply.
        wire::put_u32_host(buf, IPSET_ATTR_LINENO, 0);
        let adt = wire::begin_nest(buf, IPSET_ATTR_ADT);
        loop {
            if self.pending.is_empty() {
                match self.members.next() {
                    Some(m) => {
                        self.scratch.clear();
                        std::mem::swap(&mut self.scratch, &mut self.pending);
                        self.encode(&m);
                    }
                    None => break,
                }
            }
            if buf.len() - adt + self.pending.len() > self.max_adt && count > 0 {
                break;
            }
            buf.extend_from_slice(&self.pending);
            self.pending.clear();
            self.next_lineno = self.next_lineno.wrapping_add(1);
            count += 1;
        }
        // The loop keeps the nest within max_adt <= u16::MAX.
        let _ = wire::end_nest(buf, adt);
        wire::end_msg(buf, start);
        Some(AdtChunk {
            first_lineno,
            count,
        })
    }
}

// ---------------------------------------------------------------- replies

/// The protocol versions the kernel reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProtocolReply {
    pub max: u8,
    pub min: u8,
}

pub fn decode_protocol_reply(payload: &[u8]) -> Result<ProtocolReply, DecodeError> {
    let mut max = None;
    let mut min = None;
    for a in wire::nf_attrs(payload)? {
        let a = a?;
        match a.ty {
            IPSET_ATTR_PROTOCOL => max = Some(a.u8()?),
            IPSET_ATTR_PROTOCOL_MIN => min = Some(a.u8()?),
            _ => {}
        }
    }
    let max = max.ok_or(DecodeError("protocol reply without IPSET_ATTR_PROTOCOL"))?;
    Ok(ProtocolReply {
        max,
        min: min.unwrap_or(max),
    })
}

/// The revisions of a set type the kernel reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeReply {
    pub max_revision: u8,
    pub min_revision: u8,
}

pub fn decode_type_reply(payload: &[u8]) -> Result<TypeReply, DecodeError> {
    let mut max = None;
    let mut min = None;
    for a in wire::nf_attrs(payload)? {
        let a = a?;
        match a.ty {
            IPSET_ATTR_REVISION => max = Some(a.u8()?),
            IPSET_ATTR_REVISION_MIN => min = Some(a.u8()?),
            _ => {}
        }
    }
    let max = max.ok_or(DecodeError("type reply without IPSET_ATTR_REVISION"))?;
    Ok(TypeReply {
        max_revision: max,
        min_revision: min.unwrap_or(max),
    })
}

/// The failing element number an ipset batch error reply carries: the
/// kernel echoes the request with its command-level LINENO overwritten.
pub fn decode_error_lineno(echoed: &wire::NlMsg<'_>) -> Option<u32> {
    let attrs = wire::nf_attrs(echoed.payload).ok()?;
    for a in attrs {
        let a = a.ok()?;
        if a.ty == IPSET_ATTR_LINENO {
            return a.u32_host().ok().filter(|&l| l != 0);
        }
    }
    None
}

/// A set header as the kernel lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawHeader {
    pub type_name: String,
    pub family: u8,
    pub revision: u8,
    pub hash_size: Option<u32>,
    pub max_elem: Option<u32>,
    pub size: Option<u32>,
    pub netmask: Option<u8>,
    pub bitmask: Option<IpAddr>,
    /// A bitmap's range, as listed (IPSET_ATTR_IP/IP_TO or PORT/PORT_TO).
    pub range_ip: (Option<IpAddr>, Option<IpAddr>),
    pub range_port: (Option<u16>, Option<u16>),
    /// Created with the comment extension (an option this project sets).
    pub comment: bool,
    pub references: u32,
    pub elements: Option<u32>,
    /// Other options this project never sets (see [`RawHeader::unmanaged_options`]).
    pub unmanaged: Vec<String>,
}

impl RawHeader {
    /// Header options this project never sets, as
    /// [`KernelSet::unmanaged_options`] describes them. A host-length
    /// netmask is the default and changes nothing.
    ///
    /// [`KernelSet::unmanaged_options`]: crate::KernelSet::unmanaged_options
    pub fn unmanaged_options(&self) -> Vec<String> {
        let host = if self.family == NFPROTO_IPV6 { 128 } else { 32 };
        // hash:ip's masks are managed (see `RawHeader::mask`).
        let managed = self.type_name == SetType::HashIp.as_str();
        let netmask = self
            .netmask
            .filter(|nm| *nm != host && !managed)
            .map(|nm| format!("netmask {nm}"));
        let bitmask = self
            .bitmask
            .filter(|_| !managed)
            .map(|b| format!("bitmask {b}"));
        netmask
            .into_iter()
            .chain(bitmask)
            .chain(self.unmanaged.iter().cloned())
            .collect()
    }

    /// A hash:ip set's netmask or bitmask (`None`: the default, or a mask
    /// this project cannot hold, which then shows as unmanaged).
    fn mask(&self, family: Option<Family>) -> Option<AddrMask> {
        let family = family?;
        let netmask = self
            .netmask
            .and_then(|n| AddrMask::prefix(n, family).ok().flatten());
        let bitmask = self
            .bitmask
            .and_then(|b| AddrMask::bits_of(b, family).ok().flatten());
        netmask.or(bitmask)
    }

    /// The typed header, or `None` for a set of a type or family this
    /// project does not manage. Unmanaged options do not hide the type (a set
    /// with them is replaced through a swap); see [`RawHeader::unmanaged`].
    pub fn typed(&self) -> Option<SetHeader> {
        let set_type: SetType = self.type_name.parse().ok()?;
        let family = if set_type.has_family() {
            Some(match self.family {
                NFPROTO_IPV4 => Family::V4,
                NFPROTO_IPV6 => Family::V6,
                _ => return None,
            })
        } else {
            None
        };
        let range = self.range(set_type)?;
        let max_elem = match range {
            // At most 65536: the kernel refuses bigger bitmaps.
            Some(r) => u32::try_from(r.len()).ok()?,
            None if set_type == SetType::ListSet => self.size?,
            None => self.max_elem?,
        };
        Some(SetHeader {
            kind: SetKind::new(set_type, family),
            max_elem,
            hash_size: if set_type.is_hash() {
                self.hash_size
            } else {
                None
            },
            options: HeaderOptions {
                range,
                comment: self.comment,
                mask: if set_type == SetType::HashIp {
                    self.mask(family)
                } else {
                    None
                },
            },
        })
    }

    /// A bitmap's range (`Some(None)` for other types; `None` when a
    /// bitmap's range is missing or not one this project can hold).
    fn range(&self, set_type: SetType) -> Option<Option<SetRange>> {
        let range = match (set_type, self.range_ip, self.range_port) {
            (SetType::BitmapIp, (Some(IpAddr::V4(from)), Some(IpAddr::V4(to))), _) => {
                SetRange::Ipv4 { from, to }
            }
            (SetType::BitmapPort, _, (Some(from), Some(to))) => SetRange::Port { from, to },
            (t, ..) if t.is_bitmap() => return None,
            _ => return Some(None),
        };
        Some(Some(range))
    }
}

/// Header attributes that say nothing about what the set matches: the
/// kernel reports them for every set (its own hash seed, bucket size and
/// bookkeeping).
const HARMLESS_HEADER_ATTRS: [u16; 4] = [
    IPSET_ATTR_INITVAL,
    IPSET_ATTR_BUCKETSIZE,
    IPSET_ATTR_MEMSIZE,
    IPSET_ATTR_LINENO,
];

/// The extension flags of a header's IPSET_ATTR_CADT_FLAGS, by name.
/// `comment` is managed: see [`RawHeader::comment`].
const EXTENSION_FLAGS: [(u32, &str); 3] = [
    (IPSET_FLAG_WITH_COUNTERS, "counters"),
    (IPSET_FLAG_WITH_FORCEADD, "forceadd"),
    (IPSET_FLAG_WITH_SKBINFO, "skbinfo"),
];

fn decode_header_data(h: &mut RawHeader, data: &[u8]) -> Result<(), DecodeError> {
    for a in wire::attrs(data) {
        let a = a?;
        match a.ty {
            IPSET_ATTR_HASHSIZE => h.hash_size = Some(a.be32()?),
            IPSET_ATTR_MAXELEM => h.max_elem = Some(a.be32()?),
            IPSET_ATTR_SIZE => h.size = Some(a.be32()?),
            IPSET_ATTR_REFERENCES => h.references = a.be32()?,
            IPSET_ATTR_ELEMENTS => h.elements = Some(a.be32()?),
            IPSET_ATTR_NETMASK => h.netmask = Some(a.u8()?),
            IPSET_ATTR_IP => h.range_ip.0 = Some(decode_ip(&a)?),
            IPSET_ATTR_IP_TO => h.range_ip.1 = Some(decode_ip(&a)?),
            IPSET_ATTR_PORT => h.range_port.0 = Some(a.be16()?),
            IPSET_ATTR_PORT_TO => h.range_port.1 = Some(a.be16()?),
            IPSET_ATTR_CADT_FLAGS => {
                let flags = a.be32()?;
                let mut rest = flags;
                h.comment = flags & IPSET_FLAG_WITH_COMMENT != 0;
                rest &= !IPSET_FLAG_WITH_COMMENT;
                for (bit, name) in EXTENSION_FLAGS {
                    if rest & bit != 0 {
                        h.unmanaged.push(name.to_string());
                        rest &= !bit;
                    }
                }
                if rest != 0 {
                    h.unmanaged.push(format!("flags {rest:#x}"));
                }
            }
            IPSET_ATTR_TIMEOUT => h.unmanaged.push(format!("timeout {}", a.be32()?)),
            IPSET_ATTR_BITMASK => h.bitmask = Some(decode_ip(&a)?),
            IPSET_ATTR_MARKMASK => {
                // All bits, hash:ip,mark's default, change nothing.
                let mask = a.be32()?;
                if mask != u32::MAX {
                    h.unmanaged.push(format!("markmask {mask:#010x}"));
                }
            }
            t if HARMLESS_HEADER_ATTRS.contains(&t) => {}
            // Whatever a newer kernel adds may change matching: never
            // assume it does not.
            t => h.unmanaged.push(format!("header attribute {t}")),
        }
    }
    Ok(())
}

/// Decode the create data we send, as the kernel would list it back (used
/// by round-trip tests): the header fields of a DATA nest payload.
pub fn decode_create_data(
    type_name: &str,
    family: u8,
    data: &[u8],
) -> Result<Option<SetHeader>, DecodeError> {
    let mut h = RawHeader {
        type_name: type_name.to_string(),
        family,
        ..RawHeader::default()
    };
    decode_header_data(&mut h, data)?;
    Ok(h.typed())
}

/// Accumulates the multi-part reply of a LIST dump of one set.
#[derive(Debug, Default)]
pub struct ListAccumulator {
    pub name: Option<String>,
    pub header: Option<RawHeader>,
    /// `None` until a header of a managed type was seen.
    pub members: Option<MemberSetBuilder>,
    pub unparsable: usize,
}

impl ListAccumulator {
    /// The members read, and the count of entries that could not be
    /// represented (unparsable, duplicate or of the wrong family).
    pub fn into_members(self) -> (Option<MemberSet>, usize) {
        match self.members {
            Some(b) => {
                let (set, refused) = b.finish();
                (Some(set), self.unparsable + refused)
            }
            None => (None, self.unparsable),
        }
    }

    /// Feed the payload of one IPSET_CMD_LIST message.
    pub fn feed(&mut self, payload: &[u8]) -> Result<(), DecodeError> {
        let mut adt: Option<&[u8]> = None;
        let mut saw_header = false;
        let mut raw = RawHeader::default();
        for a in wire::nf_attrs(payload)? {
            let a = a?;
            match a.ty {
                IPSET_ATTR_SETNAME => {
                    let n = a.str()?;
                    match &self.name {
                        Some(prev) if prev != n => {
                            return Err(DecodeError("dump of one set returned another set"));
                        }
                        Some(_) => {}
                        None => self.name = Some(n.to_string()),
                    }
                }
                IPSET_ATTR_TYPENAME => {
                    raw.type_name = a.str()?.to_string();
                    saw_header = true;
                }
                IPSET_ATTR_FAMILY => raw.family = a.u8()?,
                IPSET_ATTR_REVISION => raw.revision = a.u8()?,
                IPSET_ATTR_DATA => decode_header_data(&mut raw, a.data)?,
                IPSET_ATTR_ADT => adt = Some(a.data),
                _ => {}
            }
        }
        if saw_header && self.header.is_none() {
            if let Some(h) = raw.typed() {
                // A capacity hint only: bounded so no input allocates much.
                let cap = raw.elements.unwrap_or(0).min(1 << 20) as usize;
                self.members = Some(MemberSetBuilder::with_capacity(h.kind, cap));
            }
            self.header = Some(raw);
        }
        if let Some(adt) = adt {
            let Some(members) = self.members.as_mut() else {
                // Elements of a set we cannot type: count them all.
                if self.header.is_none() {
                    return Err(DecodeError("elements before the set header"));
                }
                self.unparsable += wire::attrs(adt).count();
                return Ok(());
            };
            let kind = members.kind();
            for e in wire::attrs(adt) {
                let e = e?;
                if e.ty != IPSET_ATTR_DATA {
                    self.unparsable += 1;
                    continue;
                }
                match decode_element(kind, e.data) {
                    Ok(m) => members.push(m),
                    Err(_) => self.unparsable += 1,
                }
            }
        }
        Ok(())
    }
}

/// The set name of one message of a names-only dump.
pub fn decode_setname(payload: &[u8]) -> Result<Option<&str>, DecodeError> {
    for a in wire::nf_attrs(payload)? {
        let a = a?;
        if a.ty == IPSET_ATTR_SETNAME {
            return a.str().map(Some);
        }
    }
    Ok(None)
}

/// Run every decoder over arbitrary bytes: the fuzz entry point. It must
/// never panic, whatever the input.
pub fn fuzz_decode(data: &[u8]) {
    for msg in wire::messages(data) {
        let Ok(msg) = msg else { break };
        let _ = decode_protocol_reply(msg.payload);
        let _ = decode_type_reply(msg.payload);
        let _ = decode_setname(msg.payload);
        if let Ok((_, Some(echo))) = wire::parse_error(msg.payload) {
            let _ = decode_error_lineno(&echo);
        }
        let mut acc = ListAccumulator::default();
        let _ = acc.feed(msg.payload);
        let _ = acc.feed(msg.payload);
    }
    for t in SetType::ALL {
        for f in [None, Some(Family::V4), Some(Family::V6)] {
            let _ = decode_element(SetKind::new(t, f), data);
            let _ = decode_create_data(t.as_str(), nfproto(f), data);
        }
    }
}
