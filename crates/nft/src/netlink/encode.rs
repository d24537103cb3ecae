//! Requests from typed values: one transaction (batch) of typed operations,
//! and the dump requests. Pure: the bytes are tested without a socket.
//!
//! Sets and elements are written the way `nft` (1.0.6) writes them, so that
//! `nft list ruleset` prints what this backend created exactly as if `nft`
//! had: the key's datatype number, the key byte order in the set's
//! userdata, `flags interval` sets as start elements and interval-end
//! elements (with nft's "open interval" flag for a range that runs to the
//! last address), concatenated ranges as key and key end, an element's
//! comment as its userdata.

use ipsetmgr_dataplane::netlink::wire::{self, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};

use super::consts::*;
use crate::element::{ElementRef, Elements};
use crate::spec::{KeyType, NftSetSpec};
use crate::{NftOp, Table};

/// The largest element list of one message: NFTA_SET_ELEM_LIST_ELEMENTS is
/// a nested attribute with a 16-bit length. A message closes before the
/// next element could overflow it.
const MAX_ELEMS_NEST: usize = u16::MAX as usize;
/// More than any one element takes: two keys of 64 bytes, flags, and a
/// userdata of at most 256 bytes (NFT_USERDATA_MAXLEN).
const MAX_ELEM_LEN: usize = 1024;
/// More than the header of one element message takes (netlink and nfgen
/// headers, table and set names of at most 256 bytes each, the list's nest).
const MSG_HEAD_ROOM: usize = 640;

/// One message of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsgInfo {
    pub seq: u32,
    pub op: usize,
    /// Where the message starts in the batch buffer.
    pub at: usize,
    /// The index (in the op's [`Elements`]) of its first element.
    pub first_elem: usize,
}

/// What was encoded: the sequence numbers to match the kernel's replies to.
#[derive(Clone, Debug, Default)]
pub struct BatchPlan {
    pub begin_seq: u32,
    pub msgs: Vec<MsgInfo>,
}

impl BatchPlan {
    /// Record the next message, of op `op`, starting at `at` in the buffer:
    /// its sequence number, one past the last.
    fn open(&mut self, seq: &mut u32, op: usize, at: usize) -> u32 {
        *seq = seq.wrapping_add(1);
        self.msgs.push(MsgInfo {
            seq: *seq,
            op,
            at,
            first_elem: 0,
        });
        *seq
    }

    /// The message with sequence number `seq`.
    pub fn msg(&self, seq: u32) -> Option<&MsgInfo> {
        let i = self.msgs.partition_point(|m| {
            m.seq.wrapping_sub(self.begin_seq) < seq.wrapping_sub(self.begin_seq)
        });
        self.msgs.get(i).filter(|m| m.seq == seq)
    }
}

/// Start an nf_tables message; returns its start offset.
fn begin(buf: &mut Vec<u8>, msg: u8, flags: u16, seq: u32, family: u8) -> usize {
    wire::begin_msg(buf, msg_type(msg), NLM_F_REQUEST | flags, seq, family)
}

/// A batch marker: nfgenmsg's res_id names the subsystem the batch is for
/// (network order), which `wire::begin_msg` leaves 0.
/// `genid`: the ruleset generation the batch expects (on the begin marker
/// only).
fn batch_marker(buf: &mut Vec<u8>, ty: u16, seq: u32, genid: Option<u32>) {
    let start = wire::begin_msg(buf, ty, NLM_F_REQUEST, seq, NFPROTO_UNSPEC);
    let res_id = start + 16 + 2;
    buf[res_id..res_id + 2].copy_from_slice(&NFNL_SUBSYS_NFTABLES.to_be_bytes());
    if let Some(g) = genid {
        put_be32(buf, NFNL_BATCH_GENID, g);
    }
    wire::end_msg(buf, start);
}

/// nf_tables integers are in network order (without NLA_F_NET_BYTEORDER,
/// as `nft` sends them).
fn put_be32(buf: &mut Vec<u8>, ty: u16, v: u32) {
    wire::put_attr(buf, ty, &v.to_be_bytes());
}

/// A nest nobody else fills: its length always fits.
fn end_nest(buf: &mut [u8], start: usize) {
    let _ = wire::end_nest(buf, start);
}

/// The set's userdata as `nft` writes it for a key declared with `type`:
/// the key's byte order, and for a concatenation an (empty) typeof.
pub(crate) fn set_userdata(key: &KeyType) -> Vec<u8> {
    let mut u = Vec::with_capacity(16);
    let order = if key.is_concat() {
        BYTEORDER_INVALID
    } else if key.fields()[0].host_order() {
        BYTEORDER_HOST_ENDIAN
    } else {
        BYTEORDER_BIG_ENDIAN
    };
    u.extend_from_slice(&[NFTNL_UDATA_SET_KEYBYTEORDER, 4]);
    u.extend_from_slice(&order.to_ne_bytes());
    if key.is_concat() {
        u.extend_from_slice(&[NFTNL_UDATA_SET_KEY_TYPEOF, 8, 0, 4]);
        u.extend_from_slice(&EXPR_CONCAT.to_ne_bytes());
        u.extend_from_slice(&[1, 0]);
    }
    u
}

/// The set flags `nft` gives a spec.
pub(crate) fn set_flags(spec: &NftSetSpec) -> u32 {
    match (spec.interval, spec.key.is_concat()) {
        (false, _) => 0,
        (true, false) => NFT_SET_INTERVAL,
        (true, true) => NFT_SET_INTERVAL | NFT_SET_CONCAT,
    }
}

fn new_set(buf: &mut Vec<u8>, table: &Table, name: &str, spec: &NftSetSpec, seq: u32, id: u32) {
    let m = begin(
        buf,
        NFT_MSG_NEWSET,
        NLM_F_CREATE,
        seq,
        table.family.nfproto(),
    );
    wire::put_str(buf, NFTA_SET_TABLE, &table.name);
    wire::put_str(buf, NFTA_SET_NAME, name);
    put_be32(buf, NFTA_SET_FLAGS, set_flags(spec));
    put_be32(buf, NFTA_SET_KEY_TYPE, spec.key.type_id());
    put_be32(buf, NFTA_SET_KEY_LEN, spec.key.len() as u32);
    put_be32(buf, NFTA_SET_ID, id);
    let concat = spec.interval && spec.key.is_concat();
    if spec.size.is_some() || concat {
        let d = wire::begin_nest(buf, NFTA_SET_DESC);
        if let Some(size) = spec.size {
            put_be32(buf, NFTA_SET_DESC_SIZE, size);
        }
        if concat {
            let c = wire::begin_nest(buf, NFTA_SET_DESC_CONCAT);
            for f in spec.key.fields() {
                let e = wire::begin_nest(buf, NFTA_LIST_ELEM);
                put_be32(buf, NFTA_SET_FIELD_LEN, f.len() as u32);
                end_nest(buf, e);
            }
            end_nest(buf, c);
        }
        end_nest(buf, d);
    }
    wire::put_attr(buf, NFTA_SET_USERDATA, &set_userdata(&spec.key));
    wire::end_msg(buf, m);
}

/// How an interval set keeps its ranges in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// One key per element (no intervals).
    Exact,
    /// The rbtree of single-field interval sets: a start element, and an
    /// interval-end element one past the range (none when the range runs
    /// to the last address).
    StartEnd,
    /// Concatenated ranges (pipapo): key and key end in one element.
    KeyEnd,
}

pub(crate) fn layout(e: &Elements) -> Layout {
    match (e.has_ranges(), e.key_type().is_concat()) {
        (false, _) => Layout::Exact,
        (true, false) => Layout::StartEnd,
        (true, true) => Layout::KeyEnd,
    }
}

/// One past `end` (a big-endian number), or `None` at the last value.
pub(crate) fn one_past(end: &[u8]) -> Option<Vec<u8>> {
    let mut v = end.to_vec();
    for b in v.iter_mut().rev() {
        let (n, carry) = b.overflowing_add(1);
        *b = n;
        if !carry {
            return Some(v);
        }
    }
    None
}

/// How many kernel elements one of ours becomes.
pub(crate) fn kernel_elems(layout: Layout, e: &ElementRef<'_>) -> usize {
    match (layout, e.key_end) {
        (Layout::StartEnd, Some(end)) if one_past(end).is_some() => 2,
        _ => 1,
    }
}

fn put_key(buf: &mut Vec<u8>, ty: u16, key: &[u8]) {
    let k = wire::begin_nest(buf, ty);
    wire::put_attr(buf, NFTA_DATA_VALUE, key);
    end_nest(buf, k);
}

/// An element's userdata: its comment (NUL-terminated, as nft writes it)
/// and nft's open-interval flag.
fn elem_userdata(comment: Option<&str>, open: bool) -> Vec<u8> {
    let mut u = Vec::new();
    if let Some(c) = comment {
        // Elements hold comments of at most MAX_ELEMENT_COMMENT_LEN (128)
        // bytes, so the length with its NUL always fits the TLV's byte.
        let bytes = &c.as_bytes()[..c.len().min(crate::element::MAX_ELEMENT_COMMENT_LEN)];
        u.push(NFTNL_UDATA_SET_ELEM_COMMENT);
        u.push(bytes.len() as u8 + 1);
        u.extend_from_slice(bytes);
        u.push(0);
    }
    if open {
        u.extend_from_slice(&[NFTNL_UDATA_SET_ELEM_FLAGS, 4]);
        u.extend_from_slice(&NFTNL_SET_ELEM_F_INTERVAL_OPEN.to_ne_bytes());
    }
    u
}

/// Append the kernel elements of `e` to an open element list.
pub(super) fn put_element(buf: &mut Vec<u8>, layout: Layout, e: &ElementRef<'_>, with_udata: bool) {
    let comment = e.comment.filter(|_| with_udata).map(|c| c.as_str());
    match (layout, e.key_end) {
        (Layout::KeyEnd, Some(end)) => {
            let n = wire::begin_nest(buf, NFTA_LIST_ELEM);
            put_key(buf, NFTA_SET_ELEM_KEY, e.key);
            put_key(buf, NFTA_SET_ELEM_KEY_END, end);
            if let Some(c) = comment {
                wire::put_attr(buf, NFTA_SET_ELEM_USERDATA, &elem_userdata(Some(c), false));
            }
            end_nest(buf, n);
        }
        (Layout::StartEnd, Some(end)) => {
            let past = one_past(end);
            let n = wire::begin_nest(buf, NFTA_LIST_ELEM);
            put_key(buf, NFTA_SET_ELEM_KEY, e.key);
            let open = past.is_none() && with_udata;
            if comment.is_some() || open {
                wire::put_attr(buf, NFTA_SET_ELEM_USERDATA, &elem_userdata(comment, open));
            }
            end_nest(buf, n);
            if let Some(past) = past {
                let n = wire::begin_nest(buf, NFTA_LIST_ELEM);
                put_be32(buf, NFTA_SET_ELEM_FLAGS, NFT_SET_ELEM_INTERVAL_END);
                put_key(buf, NFTA_SET_ELEM_KEY, &past);
                end_nest(buf, n);
            }
        }
        _ => {
            let n = wire::begin_nest(buf, NFTA_LIST_ELEM);
            put_key(buf, NFTA_SET_ELEM_KEY, e.key);
            if let Some(c) = comment {
                wire::put_attr(buf, NFTA_SET_ELEM_USERDATA, &elem_userdata(Some(c), false));
            }
            end_nest(buf, n);
        }
    }
}

/// An op that writes elements: its message, set and elements (`None`: a
/// delete of no element in particular, which empties the set: a flush).
fn element_write<'a>(op: &'a NftOp<'a>) -> Option<(u8, &'a str, Option<&'a Elements>)> {
    match *op {
        NftOp::AddElements { set, elements } => Some((NFT_MSG_NEWSETELEM, set, Some(elements))),
        NftOp::DelElements { set, elements } => Some((NFT_MSG_DELSETELEM, set, Some(elements))),
        NftOp::FlushSet { set } => Some((NFT_MSG_DELSETELEM, set, None)),
        _ => None,
    }
}

/// The element messages of one Add or Del (or, without elements, a flush).
#[allow(clippy::too_many_arguments)]
fn elements_msgs(
    buf: &mut Vec<u8>,
    plan: &mut BatchPlan,
    seq: &mut u32,
    op: usize,
    msg: u8,
    table: &Table,
    set: &str,
    elements: Option<&Elements>,
) {
    let family = table.family.nfproto();
    let open = |buf: &mut Vec<u8>, plan: &mut BatchPlan, seq: &mut u32, first_elem: usize| {
        *seq = seq.wrapping_add(1);
        let flags = if msg == NFT_MSG_NEWSETELEM {
            NLM_F_CREATE
        } else {
            0
        };
        let at = begin(buf, msg, flags, *seq, family);
        plan.msgs.push(MsgInfo {
            seq: *seq,
            op,
            at,
            first_elem,
        });
        wire::put_str(buf, NFTA_SET_ELEM_LIST_TABLE, &table.name);
        wire::put_str(buf, NFTA_SET_ELEM_LIST_SET, set);
        at
    };
    let Some(elements) = elements.filter(|e| !e.is_empty()) else {
        // No elements: a flush when asked for (DELSETELEM without a list),
        // nothing at all for an empty Add/Del.
        if elements.is_none() {
            let at = open(buf, plan, seq, 0);
            wire::end_msg(buf, at);
        }
        return;
    };
    let layout = layout(elements);
    let with_udata = msg == NFT_MSG_NEWSETELEM;
    let plain = PlainElement::of(elements, layout);
    if let Some(p) = &plain {
        // Room for all of them at once: grown by doubling, a 16 MB batch
        // would be copied on the way and its pages touched twice.
        let bytes = elements.len() * p.template.len();
        let msgs = bytes / (MAX_ELEMS_NEST - MAX_ELEM_LEN) + 1;
        buf.reserve(bytes + msgs * MSG_HEAD_ROOM);
    }
    let mut at = open(buf, plan, seq, 0);
    let mut list = wire::begin_nest(buf, NFTA_SET_ELEM_LIST_ELEMENTS);
    for (i, e) in elements.iter().enumerate() {
        if buf.len() - list + MAX_ELEM_LEN > MAX_ELEMS_NEST {
            end_nest(buf, list);
            wire::end_msg(buf, at);
            at = open(buf, plan, seq, i);
            list = wire::begin_nest(buf, NFTA_SET_ELEM_LIST_ELEMENTS);
        }
        match &plain {
            Some(p) => p.put(buf, e.key),
            None => put_element(buf, layout, &e, with_udata),
        }
    }
    end_nest(buf, list);
    wire::end_msg(buf, at);
}

/// The encoding of an element that is its key alone (no range, no
/// comment), as [`put_element`] writes it: the same bytes for every such
/// element of a set but the key's, which come last. A million elements are
/// then a million copies of one template rather than three nests each.
pub(super) struct PlainElement {
    template: Vec<u8>,
    /// Where the key starts in the template.
    key_at: usize,
}

impl PlainElement {
    /// The template for `elements`, when every one of them is plain.
    pub(super) fn of(elements: &Elements, layout: Layout) -> Option<PlainElement> {
        if layout != Layout::Exact || elements.has_comments() {
            return None;
        }
        let first = elements.get(0)?;
        let mut template = Vec::new();
        put_element(&mut template, layout, &first, false);
        let key_at = template.len() - first.key.len().next_multiple_of(4);
        Some(PlainElement { template, key_at })
    }

    pub(super) fn put(&self, buf: &mut Vec<u8>, key: &[u8]) {
        // A 4-byte key (an IPv4 address, the big sets) makes a 16-byte
        // element: copied as one array, not by a memcpy call per element.
        if let (Ok(t), Ok(k), 12) = (
            <&[u8; 16]>::try_from(self.template.as_slice()),
            <&[u8; 4]>::try_from(key),
            self.key_at,
        ) {
            let mut e = *t;
            e[12..].copy_from_slice(k);
            buf.extend_from_slice(&e);
            return;
        }
        let at = buf.len() + self.key_at;
        buf.extend_from_slice(&self.template);
        buf[at..at + key.len()].copy_from_slice(key);
    }
}

/// The whole transaction for `ops`, sequence numbers from `seq` on. The
/// last message asks for an ack, so its reply marks the end of the
/// kernel's answers (errors come for any failing message regardless).
#[cfg(test)]
pub fn batch(buf: &mut Vec<u8>, table: &Table, ops: &[NftOp<'_>], seq: u32) -> BatchPlan {
    batch_at(buf, table, ops, seq, None)
}

/// [`batch`] made against ruleset generation `genid` (when known): the
/// kernel refuses it if another transaction committed since.
pub fn batch_at(
    buf: &mut Vec<u8>,
    table: &Table,
    ops: &[NftOp<'_>],
    mut seq: u32,
    genid: Option<u32>,
) -> BatchPlan {
    let mut plan = BatchPlan {
        begin_seq: seq,
        msgs: Vec::new(),
    };
    batch_marker(buf, NFNL_MSG_BATCH_BEGIN, seq, genid);
    let family = table.family.nfproto();
    let mut set_id = 0u32;
    for (op, o) in ops.iter().enumerate() {
        if let Some((msg, set, elements)) = element_write(o) {
            elements_msgs(buf, &mut plan, &mut seq, op, msg, table, set, elements);
            continue;
        }
        match o {
            NftOp::EnsureTable => {
                let at = buf.len();
                let seq = plan.open(&mut seq, op, at);
                begin(buf, NFT_MSG_NEWTABLE, NLM_F_CREATE, seq, family);
                wire::put_str(buf, NFTA_TABLE_NAME, &table.name);
                wire::end_msg(buf, at);
            }
            NftOp::CreateSet { name, spec } => {
                set_id += 1;
                let seq = plan.open(&mut seq, op, buf.len());
                new_set(buf, table, name, spec, seq, set_id);
            }
            // Written above.
            NftOp::AddElements { .. } | NftOp::DelElements { .. } | NftOp::FlushSet { .. } => {}
            NftOp::DeleteSet { set } => {
                let at = buf.len();
                let seq = plan.open(&mut seq, op, at);
                begin(buf, NFT_MSG_DELSET, 0, seq, family);
                wire::put_str(buf, NFTA_SET_TABLE, &table.name);
                wire::put_str(buf, NFTA_SET_NAME, set);
                wire::end_msg(buf, at);
            }
        }
    }
    if let Some(last) = plan.msgs.last() {
        // nlmsg_flags sit at offset 6 of the header.
        let f = last.at + 6;
        let flags = u16::from_ne_bytes([buf[f], buf[f + 1]]) | NLM_F_ACK;
        buf[f..f + 2].copy_from_slice(&flags.to_ne_bytes());
    }
    batch_marker(buf, NFNL_MSG_BATCH_END, seq.wrapping_add(1), None);
    plan
}

/// A request outside a transaction: a dump (`dump`) or a single get, with
/// attributes from `attrs`.
pub fn get(
    buf: &mut Vec<u8>,
    msg: u8,
    family: u8,
    seq: u32,
    dump: bool,
    attrs: impl FnOnce(&mut Vec<u8>),
) {
    let flags = if dump { NLM_F_DUMP } else { NLM_F_ACK };
    let at = begin(buf, msg, flags, seq, family);
    attrs(buf);
    wire::end_msg(buf, at);
}

pub fn put_str(buf: &mut Vec<u8>, ty: u16, s: &str) {
    wire::put_str(buf, ty, s);
}
