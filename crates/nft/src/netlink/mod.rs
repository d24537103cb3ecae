//! Native nf_tables backend: NETLINK_NETFILTER, NFNL_SUBSYS_NFTABLES, no
//! `nft` binary needed.
//!
//! - [`encode`]: a transaction from typed operations (pure).
//! - [`decode`]: replies into typed values (pure, never panics;
//!   [`fuzz_decode`]).
//! - [`errors`]: errnos and the blamed attribute to [`NftError`].
//! - [`NetlinkNft`]: the socket and the [`NftDataplane`] implementation.
//!
//! A transaction is sent as one batch (BATCH_BEGIN … BATCH_END) in one
//! `sendmsg`: the kernel applies a batch only from a single message, so the
//! socket's send buffer is sized to the batch (SO_SNDBUFFORCE, as `nft`
//! does), and a million elements are split into NEWSETELEM messages of at
//! most 64 KiB of elements each. The kernel answers only failing messages
//! and the last one (which asks for an ack); each answer carries the
//! sequence number of its message (so its operation) and, with extended
//! acks, the offset of the element it blames.

mod consts;
mod decode;
mod encode;
mod errors;

pub use decode::fuzz_decode;

#[cfg(test)]
mod tests;

use std::time::Duration;

use ipsetmgr_dataplane::netlink::wire::{self, DecodeError, NLMSG_DONE, NLMSG_ERROR};
use netlink_sys::Socket;

use self::consts::*;
use self::decode::{ElementReader, RawSet};
use crate::{NftBatchError, NftDataplane, NftError, NftKernelSet, NftOp, Table, precheck};

/// Receive buffer asked of the kernel (SO_RCVBUFFORCE as root): dumps are
/// read as they come, and a failed transaction answers each failing message.
const RCVBUF: usize = 8 << 20;
/// One datagram: dump parts are at most 32 KiB, error echoes are capped.
const RECV_CHUNK: usize = 256 << 10;
/// A kernel that does not answer within this is treated as unavailable.
const RECV_TIMEOUT: Duration = Duration::from_secs(60);
/// Send buffer above the batch's length: the kernel wants some headroom
/// (netlink_sendmsg refuses a message longer than sk_sndbuf - 32).
const SNDBUF_SLACK: usize = 64 << 10;
/// A dump the ruleset changed under is started again, this many times.
const DUMP_TRIES: usize = 5;

fn io_err(what: &str, e: std::io::Error) -> NftError {
    NftError::Unavailable(format!("netlink {what}: {e}"))
}

fn proto_err(e: DecodeError) -> NftError {
    NftError::Protocol(format!("cannot decode the kernel's netlink reply: {e}"))
}

/// How a dump ended.
enum DumpEnd {
    Done,
    /// The ruleset changed while it ran (NLM_F_DUMP_INTR): start again.
    Interrupted,
    Errno(i32),
}

/// The native nf_tables backend: one netlink socket, used synchronously.
pub struct NetlinkNft {
    sock: Socket,
    /// Set after a transport failure that may have left replies queued: the
    /// socket is replaced before the next request.
    broken: bool,
    seq: u32,
    sndbuf: usize,
    sbuf: Vec<u8>,
    rbuf: Vec<u8>,
    /// The ruleset generation the caller's view holds at: the next batch
    /// carries it (NFNL_BATCH_GENID), so a ruleset changed by anyone since
    /// refuses it. Cleared by every batch that is sent; set again to the
    /// generation after it when it commits (see [`next_generation`]).
    expected_gen: Option<u32>,
}

/// The generation after `g`: the kernel's commit counter skips 0 when it
/// wraps (0 in NFNL_BATCH_GENID means "unchecked").
fn next_generation(g: u32) -> u32 {
    g.wrapping_add(1).max(1)
}

fn open_socket() -> Result<Socket, NftError> {
    wire::open_netfilter(wire::SocketOptions {
        rcvbuf: RCVBUF,
        recv_timeout: RECV_TIMEOUT,
        // Errors name the failing attribute by its offset; the message
        // itself need not come back.
        ext_ack: true,
    })
    .map_err(|(step, e)| io_err(step, e))
}

impl NetlinkNft {
    /// Open the socket. Fails (typed) where there is no NETLINK_NETFILTER.
    pub fn new() -> Result<NetlinkNft, NftError> {
        Ok(NetlinkNft {
            sock: open_socket()?,
            broken: false,
            seq: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs() as u32),
            sndbuf: 0,
            sbuf: Vec::with_capacity(64 << 10),
            rbuf: Vec::with_capacity(RECV_CHUNK),
            expected_gen: None,
        })
    }

    fn ensure_socket(&mut self) -> Result<(), NftError> {
        if self.broken {
            self.sock = open_socket()?;
            self.broken = false;
            self.sndbuf = 0;
        }
        Ok(())
    }

    /// Send one GET request (a dump with `dump`); its sequence number.
    fn request(
        &mut self,
        msg: u8,
        family: u8,
        dump: bool,
        attrs: &dyn Fn(&mut Vec<u8>),
    ) -> Result<u32, NftError> {
        let seq = self.next_seq();
        self.sbuf.clear();
        encode::get(&mut self.sbuf, msg, family, seq, dump, attrs);
        self.send_sbuf()?;
        Ok(seq)
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    fn send_sbuf(&mut self) -> Result<(), NftError> {
        self.ensure_socket()?;
        let want = self.sbuf.len() + SNDBUF_SLACK;
        if want > self.sndbuf {
            use nix::sys::socket::{setsockopt, sockopt};
            if setsockopt(&self.sock, sockopt::SndBufForce, &want).is_err() {
                let _ = setsockopt(&self.sock, sockopt::SndBuf, &want);
            }
            self.sndbuf = want;
        }
        match self.sock.send(&self.sbuf, 0) {
            Ok(n) if n == self.sbuf.len() => Ok(()),
            Ok(_) => {
                self.broken = true;
                Err(NftError::Unavailable("netlink send: short write".into()))
            }
            Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => {
                Err(NftError::Unavailable(format!(
                    "a transaction of {} bytes does not fit the socket's send buffer (SO_SNDBUFFORCE needs CAP_NET_ADMIN): {e}",
                    self.sbuf.len()
                )))
            }
            Err(e) => {
                self.broken = true;
                Err(io_err("send", e))
            }
        }
    }

    /// One datagram into `rbuf`; `Ok(false)` when `dontwait` and none is
    /// queued.
    fn recv(&mut self, dontwait: bool) -> Result<bool, NftError> {
        self.rbuf.clear();
        let flags = libc::MSG_TRUNC | if dontwait { libc::MSG_DONTWAIT } else { 0 };
        match self.sock.recv(&mut self.rbuf, flags) {
            Ok(n) if n > self.rbuf.len() => {
                self.broken = true;
                Err(NftError::Protocol(format!(
                    "netlink datagram of {n} bytes truncated"
                )))
            }
            Ok(_) => Ok(true),
            Err(e) if dontwait && e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => {
                // ENOBUFS: replies were dropped; EAGAIN: the timeout. Either
                // way the replies still owed can no longer be matched.
                self.broken = true;
                Err(io_err("recv", e))
            }
        }
    }

    /// Run a dump; `on` gets the payload of every message of type `reply`.
    fn dump(
        &mut self,
        msg: u8,
        family: u8,
        reply: u8,
        attrs: &dyn Fn(&mut Vec<u8>),
        on: &mut dyn FnMut(&[u8]) -> Result<(), DecodeError>,
    ) -> Result<DumpEnd, NftError> {
        let seq = self.request(msg, family, true, attrs)?;
        let mut decode_err = None;
        let mut interrupted = false;
        loop {
            self.recv(false)?;
            for m in replies(&self.rbuf, seq) {
                let m = m?;
                interrupted |= m.flags & NLM_F_DUMP_INTR != 0;
                match m.ty {
                    NLMSG_DONE => {
                        let code = m
                            .payload
                            .get(0..4)
                            .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                        if code < 0 {
                            return Ok(DumpEnd::Errno(-code));
                        }
                        if let Some(e) = decode_err {
                            return Err(proto_err(e));
                        }
                        return Ok(if interrupted {
                            DumpEnd::Interrupted
                        } else {
                            DumpEnd::Done
                        });
                    }
                    NLMSG_ERROR => {
                        let a = decode::ack(m.payload, m.flags).map_err(proto_err)?;
                        if a.errno != 0 {
                            return Ok(DumpEnd::Errno(a.errno));
                        }
                    }
                    t if t == msg_type(reply) => {
                        if decode_err.is_none()
                            && let Err(e) = on(m.payload)
                        {
                            // Read on to DONE so the socket stays in sync.
                            decode_err = Some(e);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// A dump that is started again while the ruleset changes under it;
    /// `reset` clears what `on` gathered before each try.
    #[allow(clippy::too_many_arguments)]
    fn dump_all(
        &mut self,
        what: &str,
        msg: u8,
        family: u8,
        reply: u8,
        attrs: &dyn Fn(&mut Vec<u8>),
        reset: &mut dyn FnMut(),
        on: &mut dyn FnMut(&[u8]) -> Result<(), DecodeError>,
    ) -> Result<Option<()>, NftError> {
        for _ in 0..DUMP_TRIES {
            reset();
            match self.dump(msg, family, reply, attrs, on)? {
                DumpEnd::Done => return Ok(Some(())),
                DumpEnd::Interrupted => continue,
                DumpEnd::Errno(libc::ENOENT) => return Ok(None),
                DumpEnd::Errno(e) => return Err(errors::map_get(e, what)),
            }
        }
        Err(NftError::Unavailable(format!(
            "{what}: the ruleset kept changing during {DUMP_TRIES} dumps"
        )))
    }

    /// A single get; `Ok(None)` for ENOENT, else the reply's payload.
    fn get_one(
        &mut self,
        what: &str,
        msg: u8,
        family: u8,
        reply: u8,
        attrs: &dyn Fn(&mut Vec<u8>),
    ) -> Result<Option<Vec<u8>>, NftError> {
        let seq = self.request(msg, family, false, attrs)?;
        let mut got = None;
        loop {
            self.recv(false)?;
            for m in replies(&self.rbuf, seq) {
                let m = m?;
                if m.ty == NLMSG_ERROR {
                    let a = decode::ack(m.payload, m.flags).map_err(proto_err)?;
                    return match a.errno {
                        0 => Ok(got),
                        libc::ENOENT => Ok(None),
                        e => Err(errors::map_get(e, what)),
                    };
                }
                if m.ty == msg_type(reply) {
                    got = Some(m.payload.to_vec());
                }
            }
        }
    }

    /// The kernel's description of `table`, `None` when it does not exist.
    fn get_table(&mut self, table: &Table) -> Result<Option<Vec<u8>>, NftError> {
        let name = table.name.clone();
        self.get_one(
            &format!("reading table {table}"),
            NFT_MSG_GETTABLE,
            table.family.nfproto(),
            NFT_MSG_NEWTABLE,
            &|b| encode::put_str(b, NFTA_TABLE_NAME, &name),
        )
    }

    fn table_exists(&mut self, table: &Table) -> Result<bool, NftError> {
        Ok(self.get_table(table)?.is_some())
    }

    /// `Some` when the table has the `owner` flag (with the owner's netlink
    /// port when the kernel names it): every change by another socket then
    /// fails with EPERM, which alone would read as a missing capability.
    fn table_owner(&mut self, table: &Table) -> Result<Option<Option<u32>>, NftError> {
        match self.get_table(table)? {
            Some(p) => decode::table_owner(&p).map_err(proto_err),
            None => Ok(None),
        }
    }

    /// Every set of the table, as the kernel reports them (no elements).
    fn sets(&mut self, table: &Table) -> Result<Option<Vec<RawSet>>, NftError> {
        if !self.table_exists(table)? {
            return Ok(None);
        }
        let name = table.name.clone();
        let mut sets = Vec::new();
        let r = {
            let sets = std::cell::RefCell::new(&mut sets);
            self.dump_all(
                &format!("listing the sets of table {table}"),
                NFT_MSG_GETSET,
                table.family.nfproto(),
                NFT_MSG_NEWSET,
                &|b| encode::put_str(b, NFTA_SET_TABLE, &name),
                &mut || sets.borrow_mut().clear(),
                &mut |p| {
                    let s = decode::set(p)?;
                    if s.table == name {
                        sets.borrow_mut().push(s);
                    }
                    Ok(())
                },
            )?
        };
        Ok(r.map(|()| sets))
    }

    /// How many objects of one kind (`msg`, replied as `reply`) the table
    /// has that `also` accepts.
    fn count_in_table(
        &mut self,
        what: &str,
        table: &Table,
        msg: u8,
        reply: u8,
        table_attr: u16,
        also: &dyn Fn(&[u8]) -> Result<bool, DecodeError>,
    ) -> Result<usize, NftError> {
        let name = table.name.clone();
        let count = std::cell::Cell::new(0usize);
        self.dump_all(
            what,
            msg,
            table.family.nfproto(),
            reply,
            &|b| encode::put_str(b, table_attr, &name),
            &mut || count.set(0),
            &mut |p| {
                if decode::object_table(p)? == name && also(p)? {
                    count.set(count.get() + 1);
                }
                Ok(())
            },
        )?;
        Ok(count.get())
    }

    /// How many rules of the table reference set `set`.
    fn references(&mut self, table: &Table, set: &str) -> Result<u32, NftError> {
        let n = self.count_in_table(
            &format!("listing the rules of table {table}"),
            table,
            NFT_MSG_GETRULE,
            NFT_MSG_NEWRULE,
            NFTA_RULE_TABLE,
            &|p| Ok(decode::rule_set_refs(p)?.iter().any(|s| s == set)),
        )?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// Send the batch in `sbuf` (made against generation `genid`, when
    /// given) and read the kernel's answers.
    fn transact(
        &mut self,
        table: &Table,
        ops: &[NftOp<'_>],
        plan: &encode::BatchPlan,
        genid: Option<u32>,
    ) -> Result<(), NftBatchError> {
        self.send_sbuf().map_err(NftBatchError::whole)?;
        let last = plan.msgs.last().map(|m| m.seq);
        let mut failures: Vec<(u32, decode::Ack)> = Vec::new();
        let mut whole: Option<decode::Ack> = None;
        let mut done = false;
        while !done {
            self.recv(false).map_err(NftBatchError::whole)?;
            for m in wire::messages(&self.rbuf) {
                let m = m.map_err(|e| NftBatchError::whole(proto_err(e)))?;
                if m.ty != NLMSG_ERROR {
                    continue;
                }
                let a = decode::ack(m.payload, m.flags)
                    .map_err(|e| NftBatchError::whole(proto_err(e)))?;
                if m.seq == plan.begin_seq {
                    // The batch refused at its start, or its commit failed.
                    if a.errno != 0 {
                        whole = Some(a);
                        done = true;
                    }
                    continue;
                }
                if Some(m.seq) == last {
                    done = true;
                }
                if a.errno != 0 && plan.msg(m.seq).is_some() {
                    failures.push((m.seq, a));
                }
            }
        }
        // The kernel answered the whole batch before sendmsg returned: what
        // is still queued belongs to it.
        while self.recv(true).map_err(NftBatchError::whole)? {
            for m in wire::messages(&self.rbuf).flatten() {
                if m.ty == NLMSG_ERROR
                    && let Ok(a) = decode::ack(m.payload, m.flags)
                    && a.errno != 0
                    && plan.msg(m.seq).is_some()
                {
                    failures.push((m.seq, a));
                }
            }
        }
        let first = failures
            .into_iter()
            .min_by_key(|(seq, _)| seq.wrapping_sub(plan.begin_seq));
        if let Some((seq, a)) = first
            && let Some(info) = plan.msg(seq)
        {
            return Err(self.op_error(table, ops, info, &a));
        }
        match (whole, genid) {
            // nfnetlink refuses a batch whose NFNL_BATCH_GENID is not the
            // current generation with ERESTART on its begin message.
            (Some(a), Some(expected)) if a.errno == libc::ERESTART => {
                Err(NftBatchError::whole(NftError::GenerationMoved { expected }))
            }
            (Some(a), _) => Err(NftBatchError::whole(errors::map_whole(
                a.errno,
                a.message.as_deref(),
            ))),
            (None, _) => Ok(()),
        }
    }

    /// The typed error of a failing message, naming its op and element.
    fn op_error(
        &self,
        table: &Table,
        ops: &[NftOp<'_>],
        info: &encode::MsgInfo,
        a: &decode::Ack,
    ) -> NftBatchError {
        // The plan's ops are `ops`' own indexes.
        let Some(op) = ops.get(info.op) else {
            return NftBatchError::whole(NftError::Protocol(format!(
                "a reply for operation {} of {}",
                info.op,
                ops.len()
            )));
        };
        let msg_bytes = self.sbuf.get(info.at..).and_then(|m| {
            let len = m
                .get(0..4)
                .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize)?;
            m.get(..len)
        });
        let blamed = match (a.offset, msg_bytes) {
            (Some(off), Some(m)) => decode::blamed(m, off),
            _ => decode::Blamed::Unknown,
        };
        let mut element_index = None;
        let mut element = None;
        if let (
            decode::Blamed::Element(k),
            NftOp::AddElements { elements, .. } | NftOp::DelElements { elements, .. },
        ) = (blamed, op)
        {
            let layout = encode::layout(elements);
            let mut k = k;
            for i in info.first_elem..elements.len() {
                let Some(e) = elements.get(i) else { break };
                let n = encode::kernel_elems(layout, &e);
                if k < n {
                    element_index = Some(i);
                    element = Some(e.to_string());
                    break;
                }
                k -= n;
            }
        }
        NftBatchError {
            op_index: Some(info.op),
            element_index,
            error: errors::map(a.errno, table, op, blamed, element, a.message.as_deref()),
        }
    }
}

/// The messages of a datagram that answer request `seq` (a stale reply of
/// an earlier request is passed over).
fn replies(rbuf: &[u8], seq: u32) -> impl Iterator<Item = Result<wire::NlMsg<'_>, NftError>> {
    wire::messages(rbuf).filter_map(move |m| match m {
        Ok(m) if m.seq != seq => None,
        m => Some(m.map_err(proto_err)),
    })
}

/// A request's attributes naming a table and a set in it (the attribute
/// numbers differ between a set's messages and its elements').
fn table_and_set<'a>(
    table_attr: u16,
    table: &'a str,
    set_attr: u16,
    set: &'a str,
) -> impl Fn(&mut Vec<u8>) + 'a {
    move |b| {
        encode::put_str(b, table_attr, table);
        encode::put_str(b, set_attr, set);
    }
}

impl NftDataplane for NetlinkNft {
    fn name(&self) -> &'static str {
        "netlink"
    }

    fn apply(
        &mut self,
        table: &Table,
        ops: &[NftOp<'_>],
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<(), NftBatchError> {
        precheck(table, ops, owned)?;
        self.ensure_socket().map_err(NftBatchError::whole)?;
        // Sequence numbers for the whole batch at once.
        let first = self.next_seq();
        self.sbuf.clear();
        // 0 would mean "unchecked" to the kernel.
        let genid = self.expected_gen.filter(|g| *g != 0);
        let plan = encode::batch_at(&mut self.sbuf, table, ops, first, genid);
        let n = plan.msgs.len() as u32 + 1;
        self.seq = first.wrapping_add(n).max(1);
        if plan.msgs.is_empty() {
            return Ok(()); // nothing to change: no transaction at all
        }
        // Whatever happens now, the old generation is no longer ours.
        self.expected_gen = None;
        let r = self.transact(table, ops, &plan, genid);
        // A batch made against `g` committed only at `g` and moved it by
        // one, so our view holds at `g + 1`; unless the batch changed
        // nothing (a table that existed already): the kernel then commits
        // no generation, and the next one would be anyone's.
        if r.is_ok()
            && let Some(g) = genid
            && ops.iter().any(|op| !matches!(op, NftOp::EnsureTable))
        {
            self.expected_gen = Some(next_generation(g));
        }
        // A big batch's buffer is not kept between applies.
        if self.sbuf.capacity() > 4 << 20 {
            self.sbuf = Vec::with_capacity(64 << 10);
        }
        r.map_err(|mut e| {
            if matches!(&e.error, NftError::Unavailable(s) if s == errors::PERMISSION_DENIED)
                && let Ok(Some(owner)) = self.table_owner(table)
            {
                e.error = NftError::TableOwned {
                    table: table.to_string(),
                    owner: owner
                        .map(|p| format!("netlink port {p}, "))
                        .unwrap_or_default(),
                };
            }
            e
        })
    }

    fn list_sets(
        &mut self,
        table: &Table,
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<Option<Vec<String>>, NftError> {
        Ok(self.sets(table)?.map(|sets| {
            let mut names: Vec<String> = sets
                .into_iter()
                .filter(|s| s.is_plain_set() && owned(&s.name))
                .map(|s| s.name)
                .collect();
            names.sort();
            names.dedup();
            names
        }))
    }

    fn read_set(&mut self, table: &Table, name: &str) -> Result<Option<NftKernelSet>, NftError> {
        if !crate::is_valid_name(name) || !crate::is_valid_name(&table.name) {
            return Ok(None);
        }
        let (tname, sname) = (table.name.clone(), name.to_string());
        let Some(payload) = self.get_one(
            &format!("reading set {name} of table {table}"),
            NFT_MSG_GETSET,
            table.family.nfproto(),
            NFT_MSG_NEWSET,
            &table_and_set(NFTA_SET_TABLE, &tname, NFTA_SET_NAME, &sname),
        )?
        else {
            return Ok(None);
        };
        let raw = decode::set(&payload).map_err(proto_err)?;
        let spec = raw.spec();
        let mut elements = None;
        let mut unreadable = 0;
        if let Some(spec) = &spec {
            let reader = std::cell::RefCell::new(ElementReader::new(spec));
            let found = self.dump_all(
                &format!("reading the elements of set {name}"),
                NFT_MSG_GETSETELEM,
                table.family.nfproto(),
                NFT_MSG_NEWSETELEM,
                &table_and_set(
                    NFTA_SET_ELEM_LIST_TABLE,
                    &tname,
                    NFTA_SET_ELEM_LIST_SET,
                    &sname,
                ),
                &mut || *reader.borrow_mut() = ElementReader::new(spec),
                &mut |p| reader.borrow_mut().feed(p),
            )?;
            if found.is_none() {
                return Ok(None); // deleted between the two reads
            }
            let (e, n) = reader.into_inner().finish();
            elements = Some(e);
            unreadable = n;
        }
        let references = self.references(table, name)?;
        Ok(Some(NftKernelSet {
            name: raw.name.clone(),
            handle: raw.handle,
            spec,
            unmanaged: raw.unmanaged(),
            elements,
            unreadable_elements: unreadable,
            references,
        }))
    }

    /// One NFT_MSG_GETGEN: a few dozen bytes each way.
    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        let Some(payload) = self.get_one(
            "reading the ruleset generation",
            NFT_MSG_GETGEN,
            NFPROTO_UNSPEC,
            NFT_MSG_NEWGEN,
            &|_| {},
        )?
        else {
            return Ok(None);
        };
        decode::generation(&payload).map(Some).map_err(proto_err)
    }

    fn expect_generation(&mut self, generation: Option<u32>) {
        self.expected_gen = generation;
    }

    fn expected_generation(&self) -> Option<u32> {
        self.expected_gen
    }

    fn table_has_foreign_objects(
        &mut self,
        table: &Table,
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<bool, NftError> {
        let Some(sets) = self.sets(table)? else {
            return Ok(false);
        };
        if sets.iter().any(|s| !s.is_plain_set() || !owned(&s.name)) {
            return Ok(true);
        }
        for (msg, reply, attr) in [
            (NFT_MSG_GETCHAIN, NFT_MSG_NEWCHAIN, NFTA_CHAIN_TABLE),
            (NFT_MSG_GETOBJ, NFT_MSG_NEWOBJ, NFTA_OBJ_TABLE),
            (
                NFT_MSG_GETFLOWTABLE,
                NFT_MSG_NEWFLOWTABLE,
                NFTA_FLOWTABLE_TABLE,
            ),
        ] {
            if self.count_in_table(
                &format!("listing table {table}"),
                table,
                msg,
                reply,
                attr,
                &|_| Ok(true),
            )? > 0
            {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
