//! The kernel's replies into typed values: acks with their extended-ack
//! offset, sets, set elements, and the rules' set references. Pure and
//! never panicking on any bytes ([`fuzz_decode`] drives all of it).

use ipsetmgr_dataplane::netlink::wire::{self, Attr, DecodeError, NLMSG_HDRLEN};
use ipsetmgr_ipset::Comment;

use super::consts::*;
use crate::element::Elements;
use crate::spec::{KeyType, NftSetSpec};

fn be32(a: &Attr<'_>) -> Result<u32, DecodeError> {
    a.be32()
}

fn be64(a: &Attr<'_>) -> Result<u64, DecodeError> {
    match a.data.get(..8) {
        Some(b) => {
            let mut x = [0u8; 8];
            x.copy_from_slice(b);
            Ok(u64::from_be_bytes(x))
        }
        None => Err(DecodeError("short u64 attribute")),
    }
}

/// An NLMSG_ERROR: the errno (0: an ack), the offset of the attribute the
/// kernel blames (from the start of our message) and its message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ack {
    pub errno: i32,
    pub offset: Option<u32>,
    pub message: Option<String>,
}

/// Decode an NLMSG_ERROR payload (`flags`: the NLMSG_ERROR's own flags).
pub fn ack(payload: &[u8], flags: u16) -> Result<Ack, DecodeError> {
    let code = payload
        .get(0..4)
        .map(|s| i32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or(DecodeError("truncated nlmsgerr"))?;
    let mut ack = Ack {
        errno: code.saturating_neg(),
        ..Ack::default()
    };
    if flags & NLM_F_ACK_TLVS == 0 {
        return Ok(ack);
    }
    // The echoed request: its header only when capped, else all of it.
    let echoed = if flags & NLM_F_CAPPED != 0 {
        NLMSG_HDRLEN
    } else {
        let len = payload
            .get(4..8)
            .map(|s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]) as usize)
            .ok_or(DecodeError("truncated nlmsgerr"))?;
        wire::align4(len)
    };
    let tlvs = payload
        .get(4usize.saturating_add(echoed)..)
        .ok_or(DecodeError("truncated extended ack"))?;
    for a in wire::attrs(tlvs) {
        let a = a?;
        match a.ty {
            NLMSGERR_ATTR_OFFS => ack.offset = Some(a.u32_host()?),
            NLMSGERR_ATTR_MSG => ack.message = Some(a.str()?.to_string()),
            _ => {}
        }
    }
    Ok(ack)
}

/// Where in one of our messages an offset points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blamed {
    /// A top-level attribute of that type.
    Attr(u16),
    /// The n-th kernel element of the element list.
    Element(usize),
    Unknown,
}

/// The attribute of our message `msg` (header included) that `offset`
/// points at.
pub fn blamed(msg: &[u8], offset: u32) -> Blamed {
    let offset = offset as usize;
    let Some(body) = msg.get(NLMSG_HDRLEN + 4..) else {
        return Blamed::Unknown;
    };
    let base = NLMSG_HDRLEN + 4;
    let mut at = base;
    for a in wire::attrs(body) {
        let Ok(a) = a else { break };
        let len = wire::NLA_HDRLEN + a.data.len();
        if (at..at + len).contains(&offset) {
            if a.ty == NFTA_SET_ELEM_LIST_ELEMENTS {
                let mut eat = at + wire::NLA_HDRLEN;
                for (i, e) in wire::attrs(a.data).enumerate() {
                    let Ok(e) = e else { break };
                    let elen = wire::NLA_HDRLEN + e.data.len();
                    if (eat..eat + elen).contains(&offset) {
                        return Blamed::Element(i);
                    }
                    eat += wire::align4(elen);
                }
            }
            return Blamed::Attr(a.ty);
        }
        at += wire::align4(len);
    }
    Blamed::Unknown
}

/// A set as NEWSET (a GETSET dump) reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawSet {
    pub table: String,
    pub name: String,
    pub handle: u64,
    pub flags: u32,
    pub key_type: u32,
    pub key_len: u32,
    pub data_type: Option<u32>,
    pub size: Option<u32>,
    pub field_lens: Vec<u32>,
    pub timeout: Option<u64>,
    pub gc_interval: Option<u32>,
    pub policy: Option<u32>,
    pub obj_type: Option<u32>,
    pub expressions: bool,
    pub userdata: Vec<u8>,
}

impl RawSet {
    /// A set this crate may consider: not a map, not anonymous.
    pub fn is_plain_set(&self) -> bool {
        self.flags & (NFT_SET_ANONYMOUS | NFT_SET_MAP | NFT_SET_OBJECT) == 0
            && self.data_type.is_none()
    }

    /// The spec when the key is one this crate knows.
    pub fn spec(&self) -> Option<NftSetSpec> {
        let key = KeyType::from_type_id(self.key_type, self.key_len)?;
        if self.flags & NFT_SET_CONCAT != 0 {
            let want: Vec<u32> = key.fields().iter().map(|f| f.len() as u32).collect();
            if self.field_lens != want {
                return None;
            }
        }
        Some(NftSetSpec {
            key,
            interval: self.flags & NFT_SET_INTERVAL != 0,
            size: self.size.filter(|&s| s != 0),
        })
    }

    /// What this crate never sets, in nft's words.
    pub fn unmanaged(&self) -> Vec<String> {
        let mut out = Vec::new();
        let flag_names = [
            (NFT_SET_ANONYMOUS, "anonymous"),
            (NFT_SET_CONSTANT, "flags constant"),
            (NFT_SET_MAP, "map"),
            (NFT_SET_TIMEOUT, "flags timeout"),
            (NFT_SET_EVAL, "flags dynamic"),
            (NFT_SET_OBJECT, "objref map"),
            (NFT_SET_EXPR, "set expressions"),
        ];
        for (bit, name) in flag_names {
            if self.flags & bit != 0 {
                out.push(name.to_string());
            }
        }
        if let Some(spec) = self.spec() {
            let concat_flag = self.flags & NFT_SET_CONCAT != 0;
            if concat_flag != (spec.interval && spec.key.is_concat()) {
                out.push("flags concat".to_string());
            }
            if !self.userdata.is_empty() && self.key_byteorder() != Some(expected_order(&spec.key))
            {
                out.push("key byte order".to_string());
            }
        }
        if self.data_type.is_some() && self.flags & NFT_SET_MAP == 0 {
            out.push("data type".to_string());
        }
        if let Some(t) = self.timeout {
            out.push(format!("timeout {t}ms"));
        }
        if let Some(g) = self.gc_interval {
            out.push(format!("gc-interval {g}ms"));
        }
        if self.policy == Some(1) {
            out.push("policy memory".to_string());
        }
        if self.expressions {
            out.push("element expressions".to_string());
        }
        out
    }

    /// NFTNL_UDATA_SET_KEYBYTEORDER, when present.
    pub fn key_byteorder(&self) -> Option<u32> {
        udata(&self.userdata)
            .find(|(t, _)| *t == NFTNL_UDATA_SET_KEYBYTEORDER)
            .and_then(|(_, v)| {
                v.get(..4)
                    .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            })
    }
}

fn expected_order(key: &KeyType) -> u32 {
    if key.is_concat() {
        BYTEORDER_INVALID
    } else if key.fields()[0].host_order() {
        BYTEORDER_HOST_ENDIAN
    } else {
        BYTEORDER_BIG_ENDIAN
    }
}

/// libnftnl's userdata TLVs; stops at the first that does not fit.
fn udata(b: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    let mut rest = b;
    std::iter::from_fn(move || {
        let (&ty, r) = rest.split_first()?;
        let (&len, r) = r.split_first()?;
        let v = r.get(..len as usize)?;
        rest = &r[len as usize..];
        Some((ty, v))
    })
}

/// The netlink port of the process that owns a table (`Some` only when
/// the table has the `owner` flag; `Some(None)` when the kernel names none).
pub fn table_owner(payload: &[u8]) -> Result<Option<Option<u32>>, DecodeError> {
    let (mut flags, mut port) = (0, None);
    for a in wire::nf_attrs(payload)? {
        let a = a?;
        match a.ty {
            NFTA_TABLE_FLAGS => flags = be32(&a)?,
            NFTA_TABLE_OWNER => port = Some(be32(&a)?),
            _ => {}
        }
    }
    Ok((flags & NFT_TABLE_F_OWNER != 0).then_some(port))
}

/// The ruleset generation of a NEWGEN reply (NFTA_GEN_ID).
pub fn generation(payload: &[u8]) -> Result<u32, DecodeError> {
    for a in wire::nf_attrs(payload)? {
        let a = a?;
        if a.ty == NFTA_GEN_ID {
            return be32(&a);
        }
    }
    Err(DecodeError("generation reply without NFTA_GEN_ID"))
}

pub fn set(payload: &[u8]) -> Result<RawSet, DecodeError> {
    let mut s = RawSet::default();
    for a in wire::nf_attrs(payload)? {
        let a = a?;
        match a.ty {
            NFTA_SET_TABLE => s.table = a.str()?.to_string(),
            NFTA_SET_NAME => s.name = a.str()?.to_string(),
            NFTA_SET_FLAGS => s.flags = be32(&a)?,
            NFTA_SET_KEY_TYPE => s.key_type = be32(&a)?,
            NFTA_SET_KEY_LEN => s.key_len = be32(&a)?,
            NFTA_SET_DATA_TYPE => s.data_type = Some(be32(&a)?),
            NFTA_SET_HANDLE => s.handle = be64(&a)?,
            NFTA_SET_TIMEOUT => s.timeout = Some(be64(&a)?),
            NFTA_SET_GC_INTERVAL => s.gc_interval = Some(be32(&a)?),
            NFTA_SET_POLICY => s.policy = Some(be32(&a)?),
            NFTA_SET_OBJ_TYPE => s.obj_type = Some(be32(&a)?),
            NFTA_SET_EXPR | NFTA_SET_EXPRESSIONS => s.expressions = true,
            NFTA_SET_USERDATA => s.userdata = a.data.to_vec(),
            NFTA_SET_DESC => {
                for d in a.attrs() {
                    let d = d?;
                    match d.ty {
                        NFTA_SET_DESC_SIZE => s.size = Some(be32(&d)?),
                        NFTA_SET_DESC_CONCAT => {
                            for f in d.attrs() {
                                for l in f?.attrs() {
                                    let l = l?;
                                    if l.ty == NFTA_SET_FIELD_LEN {
                                        s.field_lens.push(be32(&l)?);
                                    }
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(s)
}

/// One start or end of an rbtree interval, as the dump lists them.
#[derive(Clone, Debug)]
struct Bound {
    key: Vec<u8>,
    end: bool,
    comment: Option<Comment>,
}

/// Elements from the messages of a GETSETELEM dump, into [`Elements`].
pub struct ElementReader {
    elements: Elements,
    layout: super::encode::Layout,
    /// Interval starts and ends, paired when the dump is complete.
    bounds: Vec<Bound>,
    pub unreadable: usize,
}

impl ElementReader {
    pub fn new(spec: &NftSetSpec) -> ElementReader {
        let elements = Elements::new(spec.key, spec.interval);
        ElementReader {
            layout: super::encode::layout(&elements),
            elements,
            bounds: Vec::new(),
            unreadable: 0,
        }
    }

    /// One NEWSETELEM message of the dump.
    pub fn feed(&mut self, payload: &[u8]) -> Result<(), DecodeError> {
        for a in wire::nf_attrs(payload)? {
            let a = a?;
            if a.ty != NFTA_SET_ELEM_LIST_ELEMENTS {
                continue;
            }
            for e in a.attrs() {
                let e = e?;
                if self.element(&e).is_err() {
                    self.unreadable += 1;
                }
            }
        }
        Ok(())
    }

    fn element(&mut self, e: &Attr<'_>) -> Result<(), DecodeError> {
        let mut key = None;
        let mut key_end = None;
        let mut flags = 0;
        let mut comment = None;
        let mut extra = false;
        for a in e.attrs() {
            let a = a?;
            match a.ty {
                NFTA_SET_ELEM_KEY | NFTA_SET_ELEM_KEY_END => {
                    let mut v = None;
                    for d in a.attrs() {
                        let d = d?;
                        if d.ty == NFTA_DATA_VALUE {
                            v = Some(d.data);
                        }
                    }
                    let v = v.ok_or(DecodeError("a key without a value"))?;
                    if a.ty == NFTA_SET_ELEM_KEY {
                        key = Some(v);
                    } else {
                        key_end = Some(v);
                    }
                }
                NFTA_SET_ELEM_FLAGS => flags = be32(&a)?,
                NFTA_SET_ELEM_USERDATA => {
                    for (t, v) in udata(a.data) {
                        // nft's open-interval flag (NFTNL_UDATA_SET_ELEM_FLAGS)
                        // needs no reading: a start without an end runs to
                        // the last address anyway.
                        if t == NFTNL_UDATA_SET_ELEM_COMMENT {
                            let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
                            let text = std::str::from_utf8(&v[..end])
                                .map_err(|_| DecodeError("a comment that is not UTF-8"))?;
                            comment =
                                Some(Comment::parse(text).map_err(|_| {
                                    DecodeError("a comment this project never writes")
                                })?);
                        }
                    }
                }
                // Timeouts, counters: not an element this crate wrote.
                NFTA_SET_ELEM_TIMEOUT | NFTA_SET_ELEM_EXPR | NFTA_SET_ELEM_EXPRESSIONS => {
                    extra = true
                }
                _ => {}
            }
        }
        if extra || flags & NFT_SET_ELEM_CATCHALL != 0 {
            return Err(DecodeError("an element with options this crate never sets"));
        }
        let key = key.ok_or(DecodeError("an element without a key"))?;
        let bad = |_| DecodeError("an element that does not fit the key");
        match self.layout {
            super::encode::Layout::Exact => self.elements.push_raw(key, None, comment).map_err(bad),
            super::encode::Layout::KeyEnd => {
                let end = key_end.ok_or(DecodeError("a range without its end"))?;
                self.elements.push_raw(key, Some(end), comment).map_err(bad)
            }
            super::encode::Layout::StartEnd => {
                if key.len() != self.elements.key_type().len() {
                    return Err(DecodeError("an element that does not fit the key"));
                }
                self.bounds.push(Bound {
                    key: key.to_vec(),
                    end: flags & NFT_SET_ELEM_INTERVAL_END != 0,
                    comment,
                });
                Ok(())
            }
        }
    }

    /// The elements, canonical. Interval bounds pair up: in key order an
    /// end closes the open start before it (an end one past its range); a
    /// start still open at the end of the list runs to the last address.
    /// An end without a start (the null interval-end `nft` puts at the
    /// bottom of a set) is no element.
    pub fn finish(mut self) -> (Elements, usize) {
        let key = self.elements.key_type();
        let host = key.fields()[0].host_order();
        let mut bounds = std::mem::take(&mut self.bounds);
        // Compare as numbers: a host-order key in network order first.
        for b in &mut bounds {
            b.key = swap_host(&b.key, host);
        }
        // At one key an end comes before a start: [a, b] and [b+1, c].
        bounds.sort_by(|a, b| a.key.cmp(&b.key).then(b.end.cmp(&a.end)));
        let mut open: Option<Bound> = None;
        for b in bounds {
            match (b.end, open.take()) {
                (true, Some(start)) => match one_before(&b.key) {
                    Some(last) => {
                        let (first, last) = (swap_host(&start.key, host), swap_host(&last, host));
                        if self
                            .elements
                            .push_raw(&first, Some(&last), start.comment)
                            .is_err()
                        {
                            self.unreadable += 1;
                        }
                    }
                    None => self.unreadable += 1,
                },
                (true, None) => {}
                (false, Some(_)) => {
                    // Two starts in a row: the first has lost its end.
                    self.unreadable += 1;
                    open = Some(b);
                }
                (false, None) => open = Some(b),
            }
        }
        if let Some(start) = open {
            let last = vec![0xff; key.len()];
            let first = swap_host(&start.key, host);
            if self
                .elements
                .push_raw(&first, Some(&last), start.comment)
                .is_err()
            {
                self.unreadable += 1;
            }
        }
        self.elements.canonicalize();
        (self.elements, self.unreadable)
    }
}

/// One before `key`, a number in network order.
fn one_before(key: &[u8]) -> Option<Vec<u8>> {
    let mut v = key.to_vec();
    for b in v.iter_mut().rev() {
        let (n, borrow) = b.overflowing_sub(1);
        *b = n;
        if !borrow {
            return Some(v);
        }
    }
    None
}

/// A host-order 32-bit key (a mark) in network order, or back; any other
/// key as it is.
fn swap_host(key: &[u8], host: bool) -> Vec<u8> {
    match key {
        [a, b, c, d] if host => u32::from_ne_bytes([*a, *b, *c, *d]).to_be_bytes().to_vec(),
        _ => key.to_vec(),
    }
}

/// The table a chain, rule, object or flowtable belongs to (attribute 1 of
/// each), and for a rule the sets its expressions look up.
pub fn object_table(payload: &[u8]) -> Result<String, DecodeError> {
    for a in wire::nf_attrs(payload)? {
        let a = a?;
        // NFTA_{CHAIN,RULE,OBJ,FLOWTABLE}_TABLE are all 1.
        if a.ty == NFTA_CHAIN_TABLE {
            return Ok(a.str()?.to_string());
        }
    }
    Err(DecodeError("an object without its table"))
}

/// The names of the sets a rule's expressions reference (lookup, dynset,
/// objref): `@set` in nft's words.
pub fn rule_set_refs(payload: &[u8]) -> Result<Vec<String>, DecodeError> {
    let mut out = Vec::new();
    for a in wire::nf_attrs(payload)? {
        let a = a?;
        if a.ty != NFTA_RULE_EXPRESSIONS {
            continue;
        }
        for e in a.attrs() {
            let e = e?;
            let mut name = "";
            let mut data = None;
            for x in e.attrs() {
                let x = x?;
                match x.ty {
                    NFTA_EXPR_NAME => name = x.str()?,
                    NFTA_EXPR_DATA => data = Some(x),
                    _ => {}
                }
            }
            let set_attr = match name {
                "lookup" => NFTA_LOOKUP_SET,
                "dynset" => NFTA_DYNSET_SET_NAME,
                "objref" => NFTA_OBJREF_SET_NAME,
                _ => continue,
            };
            if let Some(d) = data {
                for x in d.attrs() {
                    let x = x?;
                    if x.ty == set_attr {
                        out.push(x.str()?.to_string());
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Run every decoder over `bytes` as a datagram of replies: for the fuzzer
/// and the property tests; must never panic.
pub fn fuzz_decode(bytes: &[u8]) {
    use crate::spec::FieldType;
    let specs = [
        NftSetSpec {
            key: KeyType::single(FieldType::Ipv4Addr),
            interval: true,
            size: None,
        },
        NftSetSpec {
            key: KeyType::single(FieldType::Mark),
            interval: true,
            size: None,
        },
        NftSetSpec {
            key: KeyType::concat(&[FieldType::Ipv6Addr, FieldType::Ifname])
                .unwrap_or(KeyType::single(FieldType::Ifname)),
            interval: true,
            size: None,
        },
        NftSetSpec {
            key: KeyType::single(FieldType::EtherAddr),
            interval: false,
            size: None,
        },
    ];
    let mut readers: Vec<ElementReader> = specs.iter().map(ElementReader::new).collect();
    for m in wire::messages(bytes) {
        let Ok(m) = m else { break };
        let _ = ack(m.payload, m.flags);
        let _ = blamed(bytes, m.seq);
        if let Ok(s) = set(m.payload) {
            let _ = (s.spec(), s.unmanaged(), s.is_plain_set());
        }
        let _ = object_table(m.payload);
        let _ = rule_set_refs(m.payload);
        let _ = generation(m.payload);
        for r in &mut readers {
            let _ = r.feed(m.payload);
        }
    }
    for r in readers {
        let (e, _) = r.finish();
        let _ = e.typed();
        for x in e.iter() {
            let _ = x.to_string();
        }
    }
}
