//! The generic netlink framing: `nlmsghdr` + `nfgenmsg` and netlink
//! attributes (NLA). Encoding appends to a `Vec<u8>`; decoding is a pure
//! function over `&[u8]` that never panics and never trusts a length.

use super::consts::*;

/// The netlink numbers every user of this framing needs (the ipset ones
/// stay private to the ipset backend).
pub use super::consts::{
    NFGENMSG_LEN, NLA_F_NESTED, NLA_F_NET_BYTEORDER, NLA_HDRLEN, NLA_TYPE_MASK, NLM_F_ACK,
    NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NLMSG_HDRLEN,
};

/// How a NETLINK_NETFILTER socket is opened ([`open_netfilter`]).
#[derive(Clone, Copy, Debug)]
pub struct SocketOptions {
    /// Receive buffer asked of the kernel (SO_RCVBUFFORCE as root).
    pub rcvbuf: usize,
    /// A kernel that does not answer within this is treated as unavailable.
    pub recv_timeout: std::time::Duration,
    /// Errors name the failing attribute by its offset (extended ack).
    pub ext_ack: bool,
}

/// A connected NETLINK_NETFILTER socket, shared by the ipset and the
/// nf_tables backends; an error names the step that failed.
pub fn open_netfilter(
    o: SocketOptions,
) -> Result<netlink_sys::Socket, (&'static str, std::io::Error)> {
    use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};
    use nix::sys::socket::{setsockopt, sockopt};
    let mut sock = Socket::new(NETLINK_NETFILTER).map_err(|e| ("socket(NETLINK_NETFILTER)", e))?;
    sock.bind_auto().map_err(|e| ("bind", e))?;
    sock.connect(&SocketAddr::new(0, 0))
        .map_err(|e| ("connect", e))?;
    if setsockopt(&sock, sockopt::RcvBufForce, &o.rcvbuf).is_err() {
        // Without CAP_NET_ADMIN over the socket: as much as rmem_max allows.
        let _ = sock.set_rx_buf_sz(o.rcvbuf);
    }
    let tv = nix::sys::time::TimeVal::new(o.recv_timeout.as_secs() as _, 0);
    // Best effort: without it a lost reply blocks until the kernel answers.
    let _ = setsockopt(&sock, sockopt::ReceiveTimeout, &tv);
    if o.ext_ack {
        let _ = sock.set_ext_ack(true);
    }
    // Plain acks need not echo the (up to 64 KiB) request; error replies
    // still carry what their backend needs.
    let _ = sock.set_cap_ack(true);
    Ok(sock)
}

/// A malformed byte sequence from the kernel (or a fuzzer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

pub const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

// ---------------------------------------------------------------- encoding

/// Start a netfilter message: `nlmsghdr` (length patched by [`end_msg`]) and
/// `nfgenmsg`. Returns the message's start offset in `buf`.
pub fn begin_msg(buf: &mut Vec<u8>, msg_type: u16, flags: u16, seq: u32, family: u8) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_len, patched later
    buf.extend_from_slice(&msg_type.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid: the kernel fills it
    buf.push(family);
    buf.push(NFNETLINK_V0);
    buf.extend_from_slice(&0u16.to_be_bytes()); // res_id
    start
}

/// Patch the length of the message started at `start`.
pub fn end_msg(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

fn pad(buf: &mut Vec<u8>) {
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

/// Append one attribute with raw payload.
pub fn put_attr(buf: &mut Vec<u8>, ty: u16, data: &[u8]) {
    let len = (NLA_HDRLEN + data.len()) as u16;
    buf.extend_from_slice(&len.to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(data);
    pad(buf);
}

pub fn put_u8(buf: &mut Vec<u8>, ty: u16, v: u8) {
    put_attr(buf, ty, &[v]);
}

/// A host-order u32 (ipset's LINENO).
pub fn put_u32_host(buf: &mut Vec<u8>, ty: u16, v: u32) {
    put_attr(buf, ty, &v.to_ne_bytes());
}

/// A network-order u16, flagged NLA_F_NET_BYTEORDER as ipset requires.
pub fn put_be16(buf: &mut Vec<u8>, ty: u16, v: u16) {
    put_attr(buf, ty | NLA_F_NET_BYTEORDER, &v.to_be_bytes());
}

/// A network-order u32, flagged NLA_F_NET_BYTEORDER as ipset requires.
pub fn put_be32(buf: &mut Vec<u8>, ty: u16, v: u32) {
    put_attr(buf, ty | NLA_F_NET_BYTEORDER, &v.to_be_bytes());
}

/// A NUL-terminated string.
pub fn put_str(buf: &mut Vec<u8>, ty: u16, s: &str) {
    let len = (NLA_HDRLEN + s.len() + 1) as u16;
    buf.extend_from_slice(&len.to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(s.as_bytes());
    buf.push(0);
    pad(buf);
}

/// Open a nested attribute (NLA_F_NESTED is set); close with [`end_nest`].
pub fn begin_nest(buf: &mut Vec<u8>, ty: u16) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&0u16.to_ne_bytes());
    buf.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
    start
}

/// Close a nested attribute. Fails when its length does not fit `nla_len`.
pub fn end_nest(buf: &mut [u8], start: usize) -> Result<(), DecodeError> {
    let len = buf.len() - start;
    let len = u16::try_from(len).map_err(|_| DecodeError("nested attribute exceeds 64 KiB"))?;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    Ok(())
}

// ---------------------------------------------------------------- decoding

/// One netlink message.
#[derive(Clone, Copy, Debug)]
pub struct NlMsg<'a> {
    pub ty: u16,
    /// Decoded for the tests that check what we encode.
    #[cfg_attr(not(test), allow(dead_code))]
    pub flags: u16,
    pub seq: u32,
    /// Everything after the `nlmsghdr`.
    pub payload: &'a [u8],
}

fn rd_u16(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2).map(|s| u16::from_ne_bytes([s[0], s[1]]))
}

fn rd_u32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

/// Iterator over the netlink messages of one datagram.
pub struct Messages<'a> {
    rest: &'a [u8],
}

pub fn messages(buf: &[u8]) -> Messages<'_> {
    Messages { rest: buf }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<NlMsg<'a>, DecodeError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let b = self.rest;
        let parsed = (|| {
            let len = rd_u32(b, 0).ok_or(DecodeError("truncated nlmsghdr"))? as usize;
            if len < NLMSG_HDRLEN || len > b.len() {
                return Err(DecodeError("bad nlmsg_len"));
            }
            let msg = NlMsg {
                ty: rd_u16(b, 4).ok_or(DecodeError("truncated nlmsghdr"))?,
                flags: rd_u16(b, 6).ok_or(DecodeError("truncated nlmsghdr"))?,
                seq: rd_u32(b, 8).ok_or(DecodeError("truncated nlmsghdr"))?,
                payload: &b[NLMSG_HDRLEN..len],
            };
            Ok((msg, align4(len).min(b.len())))
        })();
        match parsed {
            Ok((msg, next)) => {
                self.rest = &b[next..];
                Some(Ok(msg))
            }
            Err(e) => {
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

/// One attribute: type with flags stripped, and its payload.
#[derive(Clone, Copy, Debug)]
pub struct Attr<'a> {
    pub ty: u16,
    /// The flags, decoded for the tests that check what we encode.
    #[cfg_attr(not(test), allow(dead_code))]
    pub nested: bool,
    #[cfg_attr(not(test), allow(dead_code))]
    pub net_order: bool,
    pub data: &'a [u8],
}

impl<'a> Attr<'a> {
    pub fn u8(&self) -> Result<u8, DecodeError> {
        self.data
            .first()
            .copied()
            .ok_or(DecodeError("short u8 attribute"))
    }
    pub fn be16(&self) -> Result<u16, DecodeError> {
        match self.data {
            [a, b, ..] => Ok(u16::from_be_bytes([*a, *b])),
            _ => Err(DecodeError("short u16 attribute")),
        }
    }
    pub fn be32(&self) -> Result<u32, DecodeError> {
        match self.data {
            [a, b, c, d, ..] => Ok(u32::from_be_bytes([*a, *b, *c, *d])),
            _ => Err(DecodeError("short u32 attribute")),
        }
    }
    pub fn u32_host(&self) -> Result<u32, DecodeError> {
        match self.data {
            [a, b, c, d, ..] => Ok(u32::from_ne_bytes([*a, *b, *c, *d])),
            _ => Err(DecodeError("short u32 attribute")),
        }
    }
    /// A string, up to the first NUL.
    pub fn str(&self) -> Result<&'a str, DecodeError> {
        let end = self
            .data
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.data.len());
        std::str::from_utf8(&self.data[..end]).map_err(|_| DecodeError("string is not UTF-8"))
    }
    pub fn attrs(&self) -> Attrs<'a> {
        attrs(self.data)
    }
}

/// Iterator over a sequence of attributes.
pub struct Attrs<'a> {
    rest: &'a [u8],
}

pub fn attrs(buf: &[u8]) -> Attrs<'_> {
    Attrs { rest: buf }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<Attr<'a>, DecodeError>;
    fn next(&mut self) -> Option<Self::Item> {
        // Trailing padding shorter than a header is tolerated.
        if self.rest.len() < NLA_HDRLEN {
            return None;
        }
        let b = self.rest;
        let len = rd_u16(b, 0).unwrap_or(0) as usize;
        let raw_ty = rd_u16(b, 2).unwrap_or(0);
        if len < NLA_HDRLEN || len > b.len() {
            self.rest = &[];
            return Some(Err(DecodeError("bad nla_len")));
        }
        self.rest = &b[align4(len).min(b.len())..];
        Some(Ok(Attr {
            ty: raw_ty & NLA_TYPE_MASK,
            nested: raw_ty & NLA_F_NESTED != 0,
            net_order: raw_ty & NLA_F_NET_BYTEORDER != 0,
            data: &b[NLA_HDRLEN..len],
        }))
    }
}

/// The attributes of an nfnetlink message payload (after `nfgenmsg`).
pub fn nf_attrs(payload: &[u8]) -> Result<Attrs<'_>, DecodeError> {
    payload
        .get(NFGENMSG_LEN..)
        .map(attrs)
        .ok_or(DecodeError("truncated nfgenmsg"))
}

/// An NLMSG_ERROR payload: the errno (0 = ack) and the echoed request, if any.
pub fn parse_error(payload: &[u8]) -> Result<(i32, Option<NlMsg<'_>>), DecodeError> {
    let code = payload
        .get(0..4)
        .map(|s| i32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or(DecodeError("truncated nlmsgerr"))?;
    let rest = &payload[4..];
    // The echoed header is always there; its payload only when not capped.
    let echoed = match messages(rest).next() {
        Some(Ok(m)) => Some(m),
        _ => None,
    };
    Ok((code, echoed))
}
