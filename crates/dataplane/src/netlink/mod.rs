//! Native netlink backend: speaks NFNL_SUBSYS_IPSET directly, no `ipset`
//! binary needed.
//!
//! - [`wire`]: netlink/NLA framing, pure encode and never-panicking decode.
//! - [`codec`]: the ipset message layer (requests from typed values, replies
//!   into typed values), pure and fuzzable ([`codec::fuzz_decode`]).
//! - [`errors`]: kernel error codes to [`DataplaneError`].
//! - [`NetlinkDataplane`]: the socket and the [`Dataplane`] implementation.
//!
//! Batches: every operation is sent and acknowledged before the next one
//! starts (so a failing operation stops the batch, as the trait requires),
//! but one Add/Del of many members is split into messages of up to 64 KiB of
//! elements, several of them in flight before their acks are read. Each
//! element carries IPSET_ATTR_LINENO, so a kernel error names the element.

// The ipset protocol's internals are this module's own business; the
// generic netlink framing (`wire`) is shared with the nf_tables backend
// (crates/nft), which speaks the same nlmsghdr/nfgenmsg/NLA format.
mod codec;
mod consts;
mod element;
mod errors;
pub mod wire;

pub use codec::fuzz_decode;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io;
use std::time::Duration;

use netlink_sys::Socket;

use self::codec::{AdtEncoder, ListAccumulator};
use self::consts::*;
use self::errors::{Cmd, ErrCtx, map_errno};
use crate::{BatchError, Dataplane, DataplaneError, KernelSet, Op};
use ipsetmgr_ipset::{Family, Member, MemberSet, SetType};

/// How many ADD/DEL messages may await their ack.
const WINDOW: usize = 16;
/// Receive buffer asked of the kernel (SO_RCVBUFFORCE as root).
const RCVBUF: usize = 8 << 20;
/// One datagram: dump parts are at most 32 KiB, error echoes ~66 KiB.
const RECV_CHUNK: usize = 256 << 10;
/// A kernel that does not answer within this is treated as unavailable.
const RECV_TIMEOUT: Duration = Duration::from_secs(30);

/// The protocol versions the kernel reported and the one in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProtocolInfo {
    pub kernel_min: u8,
    pub kernel_max: u8,
    pub used: u8,
}

/// Revisions of one set type the kernel supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeInfo {
    pub min_revision: u8,
    pub max_revision: u8,
}

/// A kernel error with the element number of a batch, if the kernel named one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KernelErr {
    errno: i32,
    lineno: Option<u32>,
}

enum Failure {
    Kernel(KernelErr),
    Local(DataplaneError),
}

impl From<DataplaneError> for Failure {
    fn from(e: DataplaneError) -> Self {
        Failure::Local(e)
    }
}

fn proto_err(e: wire::DecodeError) -> DataplaneError {
    DataplaneError::Protocol(format!("cannot decode the kernel's netlink reply: {e}"))
}

fn io_err(what: &str, e: io::Error) -> DataplaneError {
    DataplaneError::Unavailable(format!("netlink {what}: {e}"))
}

/// The native ipset backend. One netlink socket, used synchronously.
pub struct NetlinkDataplane {
    sock: Socket,
    /// Set after a transport failure that may have left replies queued: the
    /// socket is replaced before the next request.
    broken: bool,
    seq: u32,
    protocol: ProtocolInfo,
    types: HashMap<(SetType, u8), Option<TypeInfo>>,
    rbuf: Vec<u8>,
    sbuf: Vec<u8>,
}

fn open_socket() -> Result<Socket, DataplaneError> {
    wire::open_netfilter(wire::SocketOptions {
        rcvbuf: RCVBUF,
        recv_timeout: RECV_TIMEOUT,
        // ipset's own batch error replies carry the request with the lineno.
        ext_ack: false,
    })
    .map_err(|(step, e)| io_err(step, e))
}

impl NetlinkDataplane {
    /// Open the socket and check that the kernel speaks an ipset protocol
    /// this backend knows (6 or 7). The error says why not, so a caller can
    /// fall back to the `ipset` binary and print the reason.
    pub fn new() -> Result<Self, DataplaneError> {
        let mut dp = NetlinkDataplane {
            sock: open_socket()?,
            broken: false,
            seq: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs() as u32),
            protocol: ProtocolInfo {
                kernel_min: IPSET_PROTOCOL_MAX,
                kernel_max: IPSET_PROTOCOL_MAX,
                used: IPSET_PROTOCOL_MAX,
            },
            types: HashMap::new(),
            rbuf: Vec::with_capacity(RECV_CHUNK),
            sbuf: Vec::with_capacity(128 << 10),
        };
        dp.protocol = dp.query_protocol()?;
        Ok(dp)
    }

    /// The protocol versions negotiated at construction.
    pub fn protocol(&self) -> ProtocolInfo {
        self.protocol
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    fn ensure_socket(&mut self) -> Result<(), DataplaneError> {
        if self.broken {
            self.sock = open_socket()?;
            self.broken = false;
        }
        Ok(())
    }

    fn send_sbuf(&mut self) -> Result<(), DataplaneError> {
        self.ensure_socket()?;
        match self.sock.send(&self.sbuf, 0) {
            Ok(n) if n == self.sbuf.len() => Ok(()),
            Ok(_) => {
                self.broken = true;
                Err(DataplaneError::Unavailable(
                    "netlink send: short write".into(),
                ))
            }
            Err(e) => {
                self.broken = true;
                Err(io_err("send", e))
            }
        }
    }

    /// Receive one datagram into `rbuf`.
    fn recv(&mut self) -> Result<(), DataplaneError> {
        self.rbuf.clear();
        match self.sock.recv(&mut self.rbuf, libc::MSG_TRUNC) {
            Ok(n) if n > self.rbuf.len() => {
                self.broken = true;
                Err(DataplaneError::Protocol(format!(
                    "netlink datagram of {n} bytes truncated"
                )))
            }
            Ok(_) => Ok(()),
            Err(e) => {
                // ENOBUFS: replies were dropped; EAGAIN: timeout. Either way
                // the replies still owed can no longer be matched.
                self.broken = true;
                Err(io_err("recv", e))
            }
        }
    }

    /// Send the request in `sbuf` (sequence `seq`) and wait for its ack or
    /// its reply message (`Ok(Some(payload))`).
    fn transact(&mut self, seq: u32, want_reply: bool) -> Result<Option<Vec<u8>>, Failure> {
        self.send_sbuf()?;
        let mut reply = None;
        loop {
            self.recv()?;
            for msg in wire::messages(&self.rbuf) {
                let msg = msg.map_err(proto_err)?;
                if msg.seq != seq {
                    continue; // a stale reply of an earlier request
                }
                match msg.ty {
                    NLMSG_ERROR => {
                        let (code, echo) = wire::parse_error(msg.payload).map_err(proto_err)?;
                        if code == 0 {
                            return Ok(reply);
                        }
                        return Err(Failure::Kernel(KernelErr {
                            errno: -code,
                            lineno: echo.as_ref().and_then(codec::decode_error_lineno),
                        }));
                    }
                    NLMSG_DONE | NLMSG_OVERRUN => {}
                    _ if want_reply => {
                        reply = Some(msg.payload.to_vec());
                    }
                    _ => {}
                }
            }
        }
    }

    fn query_protocol(&mut self) -> Result<ProtocolInfo, DataplaneError> {
        let seq = self.next_seq();
        self.sbuf.clear();
        codec::request(
            &mut self.sbuf,
            IPSET_CMD_PROTOCOL,
            NLM_F_ACK,
            seq,
            IPSET_PROTOCOL_MAX,
            |_| {},
        );
        let ctx = ErrCtx::new(Cmd::Protocol, "");
        let payload = match self.transact(seq, true) {
            Ok(Some(p)) => p,
            Ok(None) => {
                return Err(DataplaneError::Protocol(
                    "the kernel acknowledged IPSET_CMD_PROTOCOL without a reply".into(),
                ));
            }
            Err(Failure::Local(e)) => return Err(e),
            Err(Failure::Kernel(k)) => return Err(map_errno(k.errno, &ctx)),
        };
        let r = codec::decode_protocol_reply(&payload).map_err(proto_err)?;
        let used = r.max.min(IPSET_PROTOCOL_MAX);
        if used < IPSET_PROTOCOL_MIN || used < r.min {
            return Err(DataplaneError::Unavailable(format!(
                "the kernel speaks ipset protocol {}..={}, this backend {}..={}",
                r.min, r.max, IPSET_PROTOCOL_MIN, IPSET_PROTOCOL_MAX
            )));
        }
        Ok(ProtocolInfo {
            kernel_min: r.min,
            kernel_max: r.max,
            used,
        })
    }

    /// Ask the kernel whether it has `set_type` for `family` (`None` for the
    /// family-less types). `Ok(None)`: not supported. Cached.
    pub fn probe_type(
        &mut self,
        set_type: SetType,
        family: Option<Family>,
    ) -> Result<Option<TypeInfo>, DataplaneError> {
        let fam = if set_type.has_family() {
            codec::nfproto(Some(family.unwrap_or(Family::V4)))
        } else {
            NFPROTO_UNSPEC
        };
        if let Some(cached) = self.types.get(&(set_type, fam)) {
            return Ok(*cached);
        }
        let seq = self.next_seq();
        self.sbuf.clear();
        let proto = self.protocol.used;
        codec::request(&mut self.sbuf, IPSET_CMD_TYPE, NLM_F_ACK, seq, proto, |b| {
            wire::put_str(b, IPSET_ATTR_TYPENAME, set_type.as_str());
            wire::put_u8(b, IPSET_ATTR_FAMILY, fam);
        });
        let result = match self.transact(seq, true) {
            Ok(Some(p)) => {
                let r = codec::decode_type_reply(&p).map_err(proto_err)?;
                Some(TypeInfo {
                    min_revision: r.min_revision,
                    max_revision: r.max_revision,
                })
            }
            Ok(None) => {
                return Err(DataplaneError::Protocol(
                    "the kernel acknowledged IPSET_CMD_TYPE without a reply".into(),
                ));
            }
            Err(Failure::Kernel(k)) if k.errno == IPSET_ERR_FIND_TYPE => None,
            Err(Failure::Kernel(k)) => {
                return Err(map_errno(
                    k.errno,
                    &ErrCtx::new(Cmd::Type, "").with_set_type(Some(set_type)),
                ));
            }
            Err(Failure::Local(e)) => return Err(e),
        };
        self.types.insert((set_type, fam), result);
        Ok(result)
    }

    /// A simple command on one or two sets, acked.
    fn simple(&mut self, cmd: u8, set: &str, set2: Option<&str>) -> Result<(), Failure> {
        let seq = self.next_seq();
        self.sbuf.clear();
        let proto = self.protocol.used;
        // NLM_F_EXCL: no "exist" semantics (recent kernels let DESTROY of a
        // missing set succeed without it), as the ipset tool without -exist.
        codec::request(
            &mut self.sbuf,
            cmd,
            NLM_F_ACK | NLM_F_EXCL,
            seq,
            proto,
            |b| {
                // Always name the set: DESTROY/FLUSH without a name act on all sets.
                wire::put_str(b, IPSET_ATTR_SETNAME, set);
                if let Some(s2) = set2 {
                    wire::put_str(b, IPSET_ATTR_SETNAME2, s2);
                }
            },
        );
        self.transact(seq, false).map(|_| ())
    }

    fn check_name(name: &str) -> Result<(), DataplaneError> {
        if ipsetmgr_ipset::is_valid_set_name(name) {
            Ok(())
        } else {
            Err(DataplaneError::Other(format!(
                "invalid set name {name:?} (1 to 31 printable ASCII bytes, no quotes, not starting with -)"
            )))
        }
    }

    /// Rename a set (not part of the trait). Fails with `SetExists` when the
    /// new name is taken and `InUse` while the set is referenced.
    pub fn rename(&mut self, from: &str, to: &str) -> Result<(), DataplaneError> {
        Self::check_name(from)?;
        Self::check_name(to)?;
        self.simple(IPSET_CMD_RENAME, from, Some(to))
            .map_err(|f| match f {
                Failure::Local(e) => e,
                Failure::Kernel(k) => {
                    map_errno(k.errno, &ErrCtx::new(Cmd::Rename, from).with_set2(Some(to)))
                }
            })
    }

    fn apply_one(&mut self, op: &Op<'_>) -> Result<(), (DataplaneError, Option<Member>)> {
        let plain = |e: DataplaneError| (e, None);
        for s in op.sets() {
            Self::check_name(s).map_err(plain)?;
        }
        let (cmd, set_type, result) = match op {
            Op::Create { set, header } => {
                let t = header.kind.set_type;
                if t.has_family() && header.kind.family.is_none() {
                    return Err(plain(DataplaneError::Other(format!(
                        "set {set}: {t} needs an address family"
                    ))));
                }
                let info = self
                    .probe_type(t, header.kind.family)
                    .map_err(plain)?
                    .ok_or_else(|| plain(DataplaneError::TypeNotSupported(t.to_string())))?;
                let seq = self.next_seq();
                self.sbuf.clear();
                let proto = self.protocol.used;
                codec::create_request(&mut self.sbuf, seq, proto, set, header, info.max_revision);
                (Cmd::Create, Some(t), self.transact(seq, false).map(|_| ()))
            }
            Op::Add { set, members } | Op::Del { set, members } => {
                let (cmd, c) = match op {
                    Op::Add { .. } => (IPSET_CMD_ADD, Cmd::Add),
                    _ => (IPSET_CMD_DEL, Cmd::Del),
                };
                let set_type = Some(members.kind().set_type);
                match self.adt(cmd, set, members) {
                    Err(Failure::Kernel(k)) => {
                        // Element numbers are 1-based positions in the
                        // (unchanged, so stable) iteration order.
                        let member = k
                            .lineno
                            .and_then(|l| members.iter().nth(l.saturating_sub(1) as usize));
                        let ctx = ErrCtx::new(c, set)
                            .with_set_type(set_type)
                            .with_member(member.as_ref());
                        return Err((map_errno(k.errno, &ctx), member));
                    }
                    r => (c, set_type, r),
                }
            }
            Op::Flush { set } => (Cmd::Flush, None, self.simple(IPSET_CMD_FLUSH, set, None)),
            Op::Destroy { set } => (
                Cmd::Destroy,
                None,
                self.simple(IPSET_CMD_DESTROY, set, None),
            ),
            Op::Swap { a, b } => (Cmd::Swap, None, self.simple(IPSET_CMD_SWAP, a, Some(b))),
            Op::Rename { from, to } => (
                Cmd::Rename,
                None,
                self.simple(IPSET_CMD_RENAME, from, Some(to)),
            ),
        };
        match result {
            Ok(()) => Ok(()),
            Err(Failure::Local(e)) => Err(plain(e)),
            Err(Failure::Kernel(k)) => {
                let set2 = match op {
                    Op::Swap { b, .. } | Op::Rename { to: b, .. } => Some(*b),
                    _ => None,
                };
                Err(plain(map_errno(
                    k.errno,
                    &ErrCtx::new(cmd, op.set())
                        .with_set2(set2)
                        .with_set_type(set_type),
                )))
            }
        }
    }

    /// One ADD/DEL operation: stream the members in messages of up to 64 KiB
    /// of elements, up to [`WINDOW`] of them unacknowledged. Stops sending at
    /// the first error; returns the error of the earliest failed message.
    fn adt(&mut self, cmd: u8, set: &str, members: &MemberSet) -> Result<(), Failure> {
        self.ensure_socket()?;
        let proto = self.protocol.used;
        let mut enc = AdtEncoder::new(cmd, set, proto, members.iter(), codec::MAX_ADT_LEN);
        let mut outstanding: Vec<u32> = Vec::with_capacity(WINDOW);
        let mut first_err: Option<(u32, KernelErr)> = None;
        let mut local_err: Option<DataplaneError> = None;
        loop {
            if first_err.is_none() && local_err.is_none() {
                let seq = self.next_seq();
                self.sbuf.clear();
                if enc.next_message(&mut self.sbuf, seq).is_some() {
                    match self.send_sbuf() {
                        Ok(()) => outstanding.push(seq),
                        Err(e) => local_err = Some(e),
                    }
                    if outstanding.len() < WINDOW && local_err.is_none() {
                        continue;
                    }
                }
            }
            if outstanding.is_empty() || local_err.is_some() {
                break;
            }
            // Read at least one reply.
            if let Err(e) = self.recv() {
                local_err = Some(e);
                break;
            }
            for msg in wire::messages(&self.rbuf) {
                let msg = match msg {
                    Ok(m) => m,
                    Err(e) => {
                        local_err = Some(proto_err(e));
                        break;
                    }
                };
                if msg.ty != NLMSG_ERROR {
                    continue;
                }
                let Some(pos) = outstanding.iter().position(|&s| s == msg.seq) else {
                    continue;
                };
                outstanding.swap_remove(pos);
                match wire::parse_error(msg.payload) {
                    Ok((0, _)) => {}
                    Ok((code, echo)) => {
                        let k = KernelErr {
                            errno: -code,
                            lineno: echo.as_ref().and_then(codec::decode_error_lineno),
                        };
                        let earlier = first_err
                            .as_ref()
                            .is_none_or(|(s, _)| msg.seq.wrapping_sub(*s) > u32::MAX / 2);
                        if earlier {
                            first_err = Some((msg.seq, k));
                        }
                    }
                    Err(e) => local_err = Some(proto_err(e)),
                }
            }
            if first_err.is_some() && outstanding.is_empty() {
                break;
            }
        }
        if let Some(e) = local_err {
            self.broken = true;
            return Err(Failure::Local(e));
        }
        match first_err {
            Some((_, k)) => Err(Failure::Kernel(k)),
            None => Ok(()),
        }
    }

    /// Run a LIST dump; `on_msg` gets the payload of every LIST message.
    fn dump(
        &mut self,
        set: Option<&str>,
        flags: u32,
        mut on_msg: impl FnMut(&[u8]) -> Result<(), wire::DecodeError>,
    ) -> Result<(), Failure> {
        let seq = self.next_seq();
        self.sbuf.clear();
        let proto = self.protocol.used;
        codec::request(
            &mut self.sbuf,
            IPSET_CMD_LIST,
            NLM_F_DUMP,
            seq,
            proto,
            |b| {
                if let Some(s) = set {
                    wire::put_str(b, IPSET_ATTR_SETNAME, s);
                }
                if flags != 0 {
                    wire::put_be32(b, IPSET_ATTR_FLAGS, flags);
                }
            },
        );
        self.send_sbuf()?;
        let mut decode_err = None;
        loop {
            self.recv()?;
            for msg in wire::messages(&self.rbuf) {
                let msg = msg.map_err(proto_err)?;
                if msg.seq != seq {
                    continue;
                }
                match msg.ty {
                    NLMSG_DONE => {
                        // A failed dump ends with the errno in DONE's payload.
                        let code = msg
                            .payload
                            .get(0..4)
                            .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                        if code < 0 {
                            return Err(Failure::Kernel(KernelErr {
                                errno: -code,
                                lineno: None,
                            }));
                        }
                        return match decode_err {
                            Some(e) => Err(Failure::Local(proto_err(e))),
                            None => Ok(()),
                        };
                    }
                    NLMSG_ERROR => {
                        let (code, _) = wire::parse_error(msg.payload).map_err(proto_err)?;
                        if code != 0 {
                            // A dump refused at its start ends here; anything
                            // else still queued for this seq is skipped later.
                            return Err(Failure::Kernel(KernelErr {
                                errno: -code,
                                lineno: None,
                            }));
                        }
                    }
                    t if t == msg_type(IPSET_CMD_LIST) => {
                        if decode_err.is_none()
                            && let Err(e) = on_msg(msg.payload)
                        {
                            // Keep reading to DONE so the socket stays in sync.
                            decode_err = Some(e);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

impl Dataplane for NetlinkDataplane {
    fn name(&self) -> &'static str {
        "netlink"
    }

    fn apply(&mut self, ops: &[Op<'_>]) -> Result<(), BatchError> {
        for (op_index, op) in ops.iter().enumerate() {
            self.apply_one(op).map_err(|(error, member)| BatchError {
                op_index,
                member,
                error,
            })?;
        }
        Ok(())
    }

    fn list_owned(&mut self, owned: &dyn Fn(&str) -> bool) -> Result<Vec<String>, DataplaneError> {
        let mut names: Vec<String> = Vec::new();
        let r = self.dump(None, IPSET_FLAG_LIST_SETNAME, |payload| {
            if let Some(n) = codec::decode_setname(payload)?
                && owned(n)
                && !names.iter().any(|x| x == n)
            {
                names.push(n.to_string());
            }
            Ok(())
        });
        match r {
            Ok(()) => Ok(names),
            Err(Failure::Local(e)) => Err(e),
            Err(Failure::Kernel(k)) => Err(map_errno(k.errno, &ErrCtx::new(Cmd::List, ""))),
        }
    }

    fn read_set(&mut self, name: &str) -> Result<Option<KernelSet>, DataplaneError> {
        if !ipsetmgr_ipset::is_valid_set_name(name) {
            return Ok(None);
        }
        let mut acc = ListAccumulator::default();
        match self.dump(Some(name), 0, |payload| acc.feed(payload)) {
            Ok(()) => {}
            Err(Failure::Kernel(k)) if k.errno == libc::ENOENT => return Ok(None),
            Err(Failure::Local(e)) => return Err(e),
            Err(Failure::Kernel(k)) => {
                return Err(map_errno(k.errno, &ErrCtx::new(Cmd::List, name)));
            }
        }
        let Some(raw) = acc.header.take() else {
            return Err(DataplaneError::Protocol(format!(
                "the kernel listed set {name} without a header"
            )));
        };
        let (members, unparsable_members) = acc.into_members();
        Ok(Some(KernelSet {
            header: raw.typed(),
            members,
            unparsable_members,
            unmanaged_options: raw.unmanaged_options(),
            references: raw.references,
        }))
    }

    fn supports(&mut self, set_type: SetType) -> Option<bool> {
        self.probe_type(set_type, None)
            .ok()
            .map(|info| info.is_some())
    }
}
