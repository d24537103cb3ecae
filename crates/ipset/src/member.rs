//! Typed set members: parsing user input, canonical rendering (exactly as
//! `ipset list` prints), and parsing the kernel's own listing.
//!
//! A raw user string never leaves this module: everything downstream (restore
//! scripts, netlink messages) is produced from the typed [`Member`].

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::comment::Comment;
use crate::error::MemberError;
use crate::icmp;
use crate::iface::IfaceName;
use crate::num::{mask, plain_decimal};
use crate::types::{Family, SetType};

/// Transport protocols accepted in hash:ip,port members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
    Udplite,
    Icmp,
    Icmpv6,
}

impl Proto {
    /// IANA protocol number (what netlink carries).
    pub fn number(self) -> u8 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
            Proto::Sctp => 132,
            Proto::Udplite => 136,
            Proto::Icmp => 1,
            Proto::Icmpv6 => 58,
        }
    }

    pub const ALL: [Proto; 6] = [
        Proto::Tcp,
        Proto::Udp,
        Proto::Sctp,
        Proto::Udplite,
        Proto::Icmp,
        Proto::Icmpv6,
    ];

    pub fn from_number(n: u8) -> Option<Proto> {
        Proto::ALL.into_iter().find(|p| p.number() == n)
    }

    /// The name `ipset list` prints.
    pub fn ipset_name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
            Proto::Udplite => "udplite",
            Proto::Icmp => "icmp",
            Proto::Icmpv6 => "ipv6-icmp",
        }
    }

    fn parse(s: &str) -> Option<Proto> {
        Some(match s.to_ascii_lowercase().as_str() {
            "tcp" => Proto::Tcp,
            "udp" => Proto::Udp,
            "sctp" => Proto::Sctp,
            "udplite" => Proto::Udplite,
            "icmp" => Proto::Icmp,
            "icmpv6" | "ipv6-icmp" => Proto::Icmpv6,
            _ => return None,
        })
    }

    pub fn is_icmp(self) -> bool {
        matches!(self, Proto::Icmp | Proto::Icmpv6)
    }
}

/// One typed set member. Members of one kernel set all share its [`SetType`]
/// and family.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Member {
    /// hash:ip
    Ip(IpAddr),
    /// hash:net; host bits are always cleared.
    Net {
        addr: IpAddr,
        prefix: u8,
        nomatch: bool,
    },
    /// hash:ip,port; for ICMP the "port" is `type << 8 | code`, as in the kernel.
    IpPort {
        addr: IpAddr,
        proto: Proto,
        port: u16,
    },
    /// hash:mac
    Mac([u8; 6]),
    /// list:set: the kernel name of a listed set.
    Set(Box<str>),
    /// hash:net,port; host bits are always cleared.
    NetPort {
        addr: IpAddr,
        prefix: u8,
        proto: Proto,
        port: u16,
        nomatch: bool,
    },
    /// hash:ip,port,ip (boxed: two addresses would double every member's size).
    IpPortIp(Box<IpPortIp>),
    /// hash:ip,port,net (boxed, like [`Member::IpPortIp`]).
    IpPortNet(Box<IpPortNet>),
    /// bitmap:port (bitmap:ip members are [`Member::Ip`]).
    Port(u16),
    /// hash:net,iface (boxed, like [`Member::IpPortIp`]).
    NetIface(Box<NetIface>),
    /// hash:ip,mark: an address and a packet mark.
    IpMark { addr: IpAddr, mark: u32 },
    /// Any other member with an entry comment (boxed: rare, and wide).
    Commented(Box<Commented>),
}

/// A member and its comment. The comment is not part of the kernel's key:
/// one entry holds one comment, and `add -exist` replaces it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Commented {
    /// Never itself [`Member::Commented`].
    pub member: Member,
    pub comment: Comment,
}

/// A hash:net,iface entry: host bits cleared; `physdev` (the bridge port
/// the packet came in or goes out on, not the bridge) is part of the key,
/// `nomatch` is not.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetIface {
    pub addr: IpAddr,
    pub prefix: u8,
    pub physdev: bool,
    pub iface: IfaceName,
    pub nomatch: bool,
}

/// A hash:ip,port,ip entry: both addresses of one family.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpPortIp {
    pub addr: IpAddr,
    pub proto: Proto,
    pub port: u16,
    pub addr2: IpAddr,
}

/// A hash:ip,port,net entry: the network's host bits are always cleared.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpPortNet {
    pub addr: IpAddr,
    pub proto: Proto,
    pub port: u16,
    pub net: IpAddr,
    pub prefix: u8,
    pub nomatch: bool,
}

/// The result of parsing one user member: usually one member, two for `/0`
/// (the kernel rejects `/0`, so it is stored as two `/1` halves).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    pub family: Option<Family>,
    pub members: OneOrTwo,
}

/// One member, or the two halves of a `/0`; no heap allocation per member
/// (policies can hold millions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OneOrTwo {
    first: Member,
    second: Option<Member>,
}

impl OneOrTwo {
    pub fn one(m: Member) -> OneOrTwo {
        OneOrTwo {
            first: m,
            second: None,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Member> {
        std::iter::once(&self.first).chain(self.second.as_ref())
    }

    /// The member and the second one, if any: for loops over a million
    /// members, where the chained iterator is not inlined away.
    pub fn into_parts(self) -> (Member, Option<Member>) {
        (self.first, self.second)
    }
}

impl IntoIterator for OneOrTwo {
    type Item = Member;
    type IntoIter = std::iter::Chain<std::iter::Once<Member>, std::option::IntoIter<Member>>;
    fn into_iter(self) -> Self::IntoIter {
        std::iter::once(self.first).chain(self.second)
    }
}

impl Member {
    /// The family of this member's address, `None` for MAC and set members.
    pub fn family(&self) -> Option<Family> {
        match self {
            Member::Ip(a) | Member::Net { addr: a, .. } | Member::IpPort { addr: a, .. } => {
                Some(Family::of(a))
            }
            Member::NetPort { addr, .. } => Some(Family::of(addr)),
            Member::IpPortIp(e) => Some(Family::of(&e.addr)),
            Member::IpPortNet(e) => Some(Family::of(&e.addr)),
            Member::NetIface(e) => Some(Family::of(&e.addr)),
            Member::IpMark { addr, .. } => Some(Family::of(addr)),
            Member::Commented(c) => c.member.family(),
            Member::Mac(_) | Member::Set(_) | Member::Port(_) => None,
        }
    }

    /// The same kernel entry with the other `nomatch` flag, for members of
    /// the types that have one. The flag is not part of the kernel's key:
    /// the two are one entry there.
    pub fn nomatch_twin(&self) -> Option<Member> {
        let mut twin = self.clone();
        match &mut twin {
            Member::Net { nomatch, .. } | Member::NetPort { nomatch, .. } => *nomatch = !*nomatch,
            Member::IpPortNet(e) => e.nomatch = !e.nomatch,
            Member::NetIface(e) => e.nomatch = !e.nomatch,
            Member::Commented(c) => c.member = c.member.nomatch_twin()?,
            _ => return None,
        }
        Some(twin)
    }

    /// The member as the kernel keys it, when that differs from the member
    /// itself: without its `nomatch` flag and its comment. `ipset del`
    /// refuses both.
    pub fn key_only(&self) -> Option<Member> {
        // Most members are their own key: no clone for them.
        if !self.is_nomatch() && self.comment().is_none() {
            return None;
        }
        let bare = self.without_comment();
        match bare.nomatch_twin() {
            Some(plain) if bare.is_nomatch() => Some(plain),
            _ if self.comment().is_some() => Some(bare.clone()),
            _ => None,
        }
    }

    /// The kernel's key of this member (see [`Member::key_only`]).
    pub fn key(&self) -> Member {
        self.key_only().unwrap_or_else(|| self.clone())
    }

    /// Whether this member carries `nomatch`.
    pub fn is_nomatch(&self) -> bool {
        match self {
            Member::Net { nomatch, .. } | Member::NetPort { nomatch, .. } => *nomatch,
            Member::IpPortNet(e) => e.nomatch,
            Member::NetIface(e) => e.nomatch,
            Member::Commented(c) => c.member.is_nomatch(),
            _ => false,
        }
    }

    /// The member as a policy, slice or member list writes it: what
    /// [`Member::parse_user`] reads back as this member. The canonical form
    /// ([`fmt::Display`], as `ipset list` prints it) but for a comment,
    /// which is ` comment:TEXT` there and ` comment "TEXT"` in the kernel's
    /// listing.
    pub fn spec_string(&self) -> String {
        match self {
            Member::Commented(c) => format!("{} comment:{}", c.member, c.comment),
            other => other.to_string(),
        }
    }

    /// The entry comment, if any.
    pub fn comment(&self) -> Option<&Comment> {
        match self {
            Member::Commented(c) => Some(&c.comment),
            _ => None,
        }
    }

    /// The member without its comment.
    pub fn without_comment(&self) -> &Member {
        match self {
            Member::Commented(c) => &c.member,
            m => m,
        }
    }

    /// This member with `comment` (replacing any it had).
    pub fn with_comment(self, comment: Comment) -> Member {
        let member = match self {
            Member::Commented(c) => c.member,
            m => m,
        };
        Member::Commented(Box::new(Commented { member, comment }))
    }

    /// Parse a user-supplied member of a hash type. The family is inferred from
    /// the value; the caller checks it against the policy. list:set members are
    /// policy names and are resolved by the policy compiler, not here.
    pub fn parse_user(set_type: SetType, input: &str) -> Result<Parsed, MemberError> {
        // The commonest member of a big list, a plain IPv4 address in a
        // hash:ip set, read in one pass: a dotted quad holds no space (so no
        // comment or nomatch), no forbidden character and no prefix, so
        // the general path would give the same (a property test checks).
        if set_type == SetType::HashIp
            && let Some(a) = dotted_quad(input.as_bytes())
        {
            return non_null(IpAddr::V4(a)).map(|a| Parsed {
                family: Some(Family::V4),
                members: OneOrTwo::one(Member::Ip(a)),
            });
        }
        Member::parse_user_general(set_type, input)
    }

    /// [`Member::parse_user`] without its shortcut.
    fn parse_user_general(set_type: SetType, input: &str) -> Result<Parsed, MemberError> {
        if input.is_empty() {
            return Err(MemberError::Empty);
        }
        // ` comment:TEXT` comes last; a member itself has no spaces, so the
        // first such word starts the comment, which runs to the end. (Most
        // members have no space at all: a byte search rules that out before
        // a substring searcher is built for every member of a big list.)
        if let Some((member, text)) = input
            .contains(' ')
            .then(|| input.split_once(" comment:"))
            .flatten()
        {
            let comment = Comment::parse(text)?;
            // `member` holds no " comment:" (split at the first), so it
            // parses to members without one.
            let parsed = Member::parse_user(set_type, member)?;
            let OneOrTwo { first, second } = parsed.members;
            return Ok(Parsed {
                family: parsed.family,
                members: OneOrTwo {
                    first: first.with_comment(comment.clone()),
                    second: second.map(|m| m.with_comment(comment)),
                },
            });
        }
        // Whitespace is only legal as the single space before `nomatch`.
        let (body, nomatch) = match input.strip_suffix(" nomatch") {
            Some(b) => (b, true),
            None => (input, false),
        };
        if body.is_empty() {
            return Err(MemberError::Empty);
        }
        if forbidden_characters(body) {
            return Err(MemberError::ForbiddenCharacters);
        }
        if nomatch && !set_type.has_nomatch() {
            return Err(MemberError::NomatchNotAllowed);
        }
        let one = |m: Member| Parsed {
            family: m.family(),
            members: OneOrTwo::one(m),
        };
        match set_type {
            SetType::HashIp => parse_host(body)
                .and_then(non_null)
                .map(|a| one(Member::Ip(a))),
            SetType::HashNet => parse_net(body, nomatch),
            SetType::HashIpPort => parse_ip_port(body).map(one),
            SetType::HashMac => parse_mac(body).map(|m| one(Member::Mac(m))),
            SetType::ListSet => Err(MemberError::BadSetName),
            SetType::HashNetPort => parse_net_port(body, nomatch),
            SetType::HashIpPortIp => parse_ip_port_ip(body).map(one),
            SetType::HashIpPortNet => parse_ip_port_net(body, nomatch),
            SetType::HashNetIface => parse_net_iface(body, nomatch).map(one),
            SetType::HashIpMark => parse_ip_mark(body).map(one),
            // The kernel holds 0.0.0.0 in a bitmap whose range starts there.
            SetType::BitmapIp => parse_host(body).map(|a| one(Member::Ip(a))),
            SetType::BitmapPort => parse_bitmap_port(body).map(|p| one(Member::Port(p))),
        }
    }

    /// Parse one member line of `ipset list`/`save` output for a set of the
    /// given type. Stricter than [`Member::parse_user`] in nothing but
    /// tolerant of the kernel's own spellings (`ipv6-icmp`, names).
    pub fn parse_kernel(set_type: SetType, line: &str) -> Result<Member, MemberError> {
        if set_type == SetType::ListSet {
            if !crate::is_valid_set_name(line) {
                return Err(MemberError::BadSetName);
            }
            return Ok(Member::Set(line.into()));
        }
        // `ipset list` prints a comment as ` comment "TEXT"`.
        if let Some((member, quoted)) = line.split_once(" comment \"") {
            let text = quoted
                .strip_suffix('"')
                .ok_or(MemberError::BadComment("an unterminated comment"))?;
            let comment = Comment::parse(text)?;
            let bare = Member::parse_kernel(set_type, member)?;
            if bare.comment().is_some() {
                return Err(MemberError::BadComment("a member has one comment"));
            }
            return Ok(bare.with_comment(comment));
        }
        let parsed = Member::parse_user(set_type, line)?;
        // The types that split /0 in two never hold a /0: a listed one is
        // not ours to read (and must not silently become one half).
        if parsed.members.second.is_some() {
            return Err(MemberError::BadCidr(
                "a /0 entry, which this type cannot hold",
            ));
        }
        Ok(parsed.members.first)
    }
}

/// A literal address, optionally with a host-length prefix (`/32`, `/128`).
fn parse_host(s: &str) -> Result<IpAddr, MemberError> {
    match s.split_once('/') {
        None => parse_addr(s),
        Some((a, p)) => {
            let addr = parse_addr(a)?;
            let prefix = parse_prefix(p, Family::of(&addr))?;
            if prefix != Family::of(&addr).max_prefix() {
                return Err(MemberError::WideCidrInHashIp);
            }
            Ok(addr)
        }
    }
}

/// hash:ip and hash:ip,port cannot hold 0.0.0.0 or `::` ("Null-valued element").
fn non_null(addr: IpAddr) -> Result<IpAddr, MemberError> {
    if addr.is_unspecified() {
        Err(MemberError::NullAddress)
    } else {
        Ok(addr)
    }
}

/// Whitespace or control characters, which no member holds.
fn forbidden_characters(body: &str) -> bool {
    if body.is_ascii() {
        // The same test for ASCII (whose whitespace is space or a control
        // character), without decoding a million members char by char.
        return body.bytes().any(|b| b == b' ' || b.is_ascii_control());
    }
    body.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// The common case of a big list, read without std's general parser: four
/// decimal octets of one to three digits, no leading zero, each at most
/// 255. Only a subset of what `Ipv4Addr::from_str` takes (it refuses leading
/// zeros too), to the same address; anything else goes to it.
fn dotted_quad(s: &[u8]) -> Option<Ipv4Addr> {
    // One pass over the bytes, each octet's digits read as they come.
    let mut octets = [0u8; 4];
    let mut i = 0;
    for (k, octet) in octets.iter_mut().enumerate() {
        if k > 0 {
            if s.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
        let start = i;
        let mut n: u16 = 0;
        while i < s.len() && i - start < 3 && s[i].is_ascii_digit() {
            n = n * 10 + u16::from(s[i] - b'0');
            i += 1;
        }
        let digits = i - start;
        if digits == 0 || (digits > 1 && s[start] == b'0') {
            return None;
        }
        *octet = u8::try_from(n).ok()?;
    }
    (i == s.len()).then_some(Ipv4Addr::from(octets))
}

fn parse_addr(s: &str) -> Result<IpAddr, MemberError> {
    if let Some(a) = dotted_quad(s.as_bytes()) {
        return Ok(IpAddr::V4(a));
    }
    if let Ok(a) = s.parse::<IpAddr>() {
        return Ok(a);
    }
    // Tell host names apart from typos so the message is useful.
    let hostname_like = s.chars().any(|c| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && !s.chars().all(|c| c.is_ascii_hexdigit() || c == '.');
    if hostname_like {
        Err(MemberError::HostName)
    } else {
        Err(MemberError::BadAddress)
    }
}

/// A decimal field of a member: a [`plain_decimal`] that fits `T`, or
/// `bad`; a leading zero gets its own error, which says why.
fn decimal_field<T: TryFrom<u32>>(
    s: &str,
    max_len: usize,
    bad: MemberError,
) -> Result<T, MemberError> {
    if s.len() > 1 && s.starts_with('0') && s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(MemberError::LeadingZero);
    }
    plain_decimal(s, max_len)
        .and_then(|n| T::try_from(n).ok())
        .ok_or(bad)
}

fn parse_prefix(p: &str, family: Family) -> Result<u8, MemberError> {
    let n: u8 = decimal_field(p, 3, MemberError::BadCidr("prefix length must be a number"))?;
    if n > family.max_prefix() {
        return Err(MemberError::BadCidr(
            "prefix length too long for the family",
        ));
    }
    Ok(n)
}

/// `ADDRESS[/PREFIX]` with host bits cleared; a bare address is a host.
fn parse_net_part(s: &str) -> Result<(IpAddr, u8), MemberError> {
    let (addr, prefix) = match s.split_once('/') {
        None => {
            let a = parse_addr(s)?;
            (a, Family::of(&a).max_prefix())
        }
        Some((a, p)) => {
            let a = parse_addr(a)?;
            (a, parse_prefix(p, Family::of(&a))?)
        }
    };
    Ok((mask(addr, prefix), prefix))
}

/// The network as members: one, or for `/0` (which the kernel's hash
/// types with a network part reject) the two `/1` halves covering it.
fn halves(addr: IpAddr, prefix: u8, member: impl Fn(IpAddr, u8) -> Member) -> Parsed {
    let members = if prefix == 0 {
        let upper = match addr {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::new(128, 0, 0, 0)),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(1u128 << 127)),
        };
        OneOrTwo {
            first: member(addr, 1),
            second: Some(member(upper, 1)),
        }
    } else {
        OneOrTwo::one(member(addr, prefix))
    };
    Parsed {
        family: Some(Family::of(&addr)),
        members,
    }
}

fn parse_net(s: &str, nomatch: bool) -> Result<Parsed, MemberError> {
    let (addr, prefix) = parse_net_part(s)?;
    Ok(halves(addr, prefix, |addr, prefix| Member::Net {
        addr,
        prefix,
        nomatch,
    }))
}

fn parse_ip_port(s: &str) -> Result<Member, MemberError> {
    let (addr_s, rest) = s.split_once(',').ok_or(MemberError::BadIpPortSyntax)?;
    let addr = non_null(parse_host(addr_s)?)?;
    let (proto, port) = parse_proto_port(rest, Family::of(&addr))?;
    Ok(Member::IpPort { addr, proto, port })
}

const NET_PORT_SYNTAX: &str = "NETWORK,PROTO:PORT (for example 10.0.0.0/8,tcp:80)";
const IP_PORT_IP_SYNTAX: &str = "ADDRESS,PROTO:PORT,ADDRESS (for example 10.0.0.1,udp:53,10.0.0.2)";
const IP_PORT_NET_SYNTAX: &str =
    "ADDRESS,PROTO:PORT,NETWORK (for example 10.0.0.1,tcp:80,10.1.0.0/16)";

fn parse_net_port(s: &str, nomatch: bool) -> Result<Parsed, MemberError> {
    let (net_s, rest) = s
        .split_once(',')
        .ok_or(MemberError::BadSyntax(NET_PORT_SYNTAX))?;
    let (addr, prefix) = parse_net_part(net_s)?;
    let (proto, port) = parse_proto_port(rest, Family::of(&addr))?;
    Ok(halves(addr, prefix, |addr, prefix| Member::NetPort {
        addr,
        prefix,
        proto,
        port,
        nomatch,
    }))
}

const NET_IFACE_SYNTAX: &str =
    "NETWORK,IFACE or NETWORK,physdev:IFACE (for example 10.0.0.0/8,eth0)";

/// `CIDR,[physdev:]IFACE`. The kernel holds `/0` in this type (unlike the
/// other types with a network part), so it is kept as it is.
fn parse_net_iface(s: &str, nomatch: bool) -> Result<Member, MemberError> {
    let (net_s, rest) = s
        .split_once(',')
        .ok_or(MemberError::BadSyntax(NET_IFACE_SYNTAX))?;
    let (addr, prefix) = parse_net_part(net_s)?;
    let (physdev, name) = match rest.strip_prefix("physdev:") {
        Some(n) => (true, n),
        None => (false, rest),
    };
    Ok(Member::NetIface(Box::new(NetIface {
        addr,
        prefix,
        physdev,
        iface: IfaceName::parse(name)?,
        nomatch,
    })))
}

const IP_MARK_SYNTAX: &str =
    "ADDRESS,MARK with the mark in hex (0x1f) or decimal (31), for example 10.0.0.1,0x1f";

/// `ADDRESS,MARK`: a 32-bit mark as `0x` and 1 to 8 hex digits, or as a
/// plain decimal (no leading zero: ipset would read it as octal).
fn parse_ip_mark(s: &str) -> Result<Member, MemberError> {
    let (a, m) = s
        .split_once(',')
        .ok_or(MemberError::BadSyntax(IP_MARK_SYNTAX))?;
    // As in hash:ip: the all-zero address is refused.
    let addr = non_null(parse_host(a)?)?;
    let bad = MemberError::BadSyntax(IP_MARK_SYNTAX);
    let mark = match m.strip_prefix("0x").or_else(|| m.strip_prefix("0X")) {
        Some(hex) if (1..=8).contains(&hex.len()) && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            u32::from_str_radix(hex, 16).map_err(|_| bad)?
        }
        Some(_) => return Err(bad),
        None => decimal_field(m, 10, bad)?,
    };
    Ok(Member::IpMark { addr, mark })
}

/// A bitmap:port member: a port number alone. The set holds ports of every
/// protocol, so a `tcp:` would suggest a distinction the kernel does not make.
fn parse_bitmap_port(s: &str) -> Result<u16, MemberError> {
    if s.contains(':') {
        return Err(MemberError::BadSyntax(
            "a port number alone (bitmap:port holds ports of every protocol)",
        ));
    }
    parse_port(s)
}

/// `A,PROTO:PORT,B`: the three parts, or the syntax error `expected`.
fn three_parts<'s>(
    s: &'s str,
    expected: &'static str,
) -> Result<(&'s str, &'s str, &'s str), MemberError> {
    let mut parts = s.split(',');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(a), Some(p), Some(b), None) => Ok((a, p, b)),
        _ => Err(MemberError::BadSyntax(expected)),
    }
}

fn parse_ip_port_ip(s: &str) -> Result<Member, MemberError> {
    let (a, p, b) = three_parts(s, IP_PORT_IP_SYNTAX)?;
    let addr = parse_host(a)?;
    let (proto, port) = parse_proto_port(p, Family::of(&addr))?;
    let addr2 = parse_host(b)?;
    if Family::of(&addr2) != Family::of(&addr) {
        return Err(MemberError::MixedFamilies);
    }
    Ok(Member::IpPortIp(Box::new(IpPortIp {
        addr,
        proto,
        port,
        addr2,
    })))
}

fn parse_ip_port_net(s: &str, nomatch: bool) -> Result<Parsed, MemberError> {
    let (a, p, n) = three_parts(s, IP_PORT_NET_SYNTAX)?;
    let addr = parse_host(a)?;
    let (proto, port) = parse_proto_port(p, Family::of(&addr))?;
    let (net, prefix) = parse_net_part(n)?;
    if Family::of(&net) != Family::of(&addr) {
        return Err(MemberError::MixedFamilies);
    }
    Ok(halves(net, prefix, |net, prefix| {
        Member::IpPortNet(Box::new(IpPortNet {
            addr,
            proto,
            port,
            net,
            prefix,
            nomatch,
        }))
    }))
}

/// `PROTO:PORT` (a bare port is tcp), ICMP as `TYPE/CODE` or a name, for
/// an address of `family`.
fn parse_proto_port(rest: &str, family: Family) -> Result<(Proto, u16), MemberError> {
    let (proto, port_s) = match rest.split_once(':') {
        Some((p, port)) => (
            Proto::parse(p).ok_or_else(|| MemberError::UnsupportedProtocol(p.to_string()))?,
            port,
        ),
        None => (Proto::Tcp, rest),
    };
    let port = if proto.is_icmp() {
        let (expected, table) = match proto {
            Proto::Icmp => (Family::V4, icmp::ICMP_NAMES),
            _ => (Family::V6, icmp::ICMPV6_NAMES),
        };
        if family != expected {
            return Err(MemberError::ProtoFamilyMismatch(
                proto.ipset_name(),
                expected,
            ));
        }
        let (t, c) = match port_s.split_once('/') {
            Some((t, c)) => (icmp_number(t)?, icmp_number(c)?),
            None => icmp::lookup(table, port_s).ok_or(MemberError::BadIcmp)?,
        };
        (t as u16) << 8 | c as u16
    } else {
        parse_port(port_s)?
    };
    Ok((proto, port))
}

/// One ICMP type or code: 0-255, no leading zero.
fn icmp_number(s: &str) -> Result<u8, MemberError> {
    decimal_field(s, 3, MemberError::BadIcmp)
}

/// A single port: 0-65535, no leading zero. `a-b` with two numbers is a
/// range (refused with its own message); anything else with a dash, such
/// as `-1`, is just not a port.
fn parse_port(s: &str) -> Result<u16, MemberError> {
    let is_range = s
        .split_once('-')
        .is_some_and(|(a, b)| plain_decimal(a, 5).is_some() && plain_decimal(b, 5).is_some());
    if is_range {
        return Err(MemberError::PortRange);
    }
    decimal_field(s, 5, MemberError::BadPort)
}

fn parse_mac(s: &str) -> Result<[u8; 6], MemberError> {
    let sep = if s.contains(':') { ':' } else { '-' };
    let mut out = [0u8; 6];
    let mut parts = s.split(sep);
    for byte in out.iter_mut() {
        let p = parts.next().ok_or(MemberError::BadMac)?;
        if p.len() != 2 {
            return Err(MemberError::BadMac);
        }
        *byte = u8::from_str_radix(p, 16).map_err(|_| MemberError::BadMac)?;
    }
    if parts.next().is_some() {
        return Err(MemberError::BadMac);
    }
    Ok(out)
}

/// An address as `ipset list` prints it (glibc `inet_ntop`). Rust's
/// rendering differs in one case: IPv4-compatible IPv6 addresses
/// (`::a.b.c.d`, the first 96 bits zero and the 7th group non-zero), which
/// glibc prints in dotted form and Rust in hex (`::102:304`).
struct KernelAddr<'a>(&'a IpAddr);

impl fmt::Display for KernelAddr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let IpAddr::V6(a) = self.0 {
            let s = a.segments();
            if s[..6].iter().all(|&w| w == 0) && s[6] != 0 {
                let v4 = Ipv4Addr::from(u128::from(*a) as u32);
                return write!(f, "::{v4}");
            }
        }
        write!(f, "{}", self.0)
    }
}

/// A network as `ipset list` prints it: no prefix for a host.
fn fmt_net(f: &mut fmt::Formatter<'_>, addr: &IpAddr, prefix: u8) -> fmt::Result {
    write!(f, "{}", KernelAddr(addr))?;
    if prefix != Family::of(addr).max_prefix() {
        write!(f, "/{prefix}")?;
    }
    Ok(())
}

fn fmt_nomatch(f: &mut fmt::Formatter<'_>, nomatch: bool) -> fmt::Result {
    if nomatch {
        f.write_str(" nomatch")?;
    }
    Ok(())
}

/// `proto:port`, ICMP by name where ipset names it, else `type/code`.
fn fmt_proto_port(f: &mut fmt::Formatter<'_>, proto: Proto, port: u16) -> fmt::Result {
    write!(f, "{}:", proto.ipset_name())?;
    if proto.is_icmp() {
        let (t, c) = ((port >> 8) as u8, (port & 0xff) as u8);
        let table = if proto == Proto::Icmp {
            icmp::ICMP_NAMES
        } else {
            icmp::ICMPV6_NAMES
        };
        match icmp::name_of(table, t, c) {
            Some(name) => f.write_str(name),
            None => write!(f, "{t}/{c}"),
        }
    } else {
        write!(f, "{port}")
    }
}

/// Canonical rendering, byte for byte what `ipset list` prints.
impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Member::Ip(a) => write!(f, "{}", KernelAddr(a)),
            Member::Net {
                addr,
                prefix,
                nomatch,
            } => {
                fmt_net(f, addr, *prefix)?;
                fmt_nomatch(f, *nomatch)
            }
            Member::IpPort { addr, proto, port } => {
                write!(f, "{},", KernelAddr(addr))?;
                fmt_proto_port(f, *proto, *port)
            }
            Member::NetPort {
                addr,
                prefix,
                proto,
                port,
                nomatch,
            } => {
                fmt_net(f, addr, *prefix)?;
                f.write_str(",")?;
                fmt_proto_port(f, *proto, *port)?;
                fmt_nomatch(f, *nomatch)
            }
            Member::IpPortIp(e) => {
                write!(f, "{},", KernelAddr(&e.addr))?;
                fmt_proto_port(f, e.proto, e.port)?;
                write!(f, ",{}", KernelAddr(&e.addr2))
            }
            Member::IpPortNet(e) => {
                write!(f, "{},", KernelAddr(&e.addr))?;
                fmt_proto_port(f, e.proto, e.port)?;
                f.write_str(",")?;
                fmt_net(f, &e.net, e.prefix)?;
                fmt_nomatch(f, e.nomatch)
            }
            Member::Mac(m) => write!(
                f,
                "{:02X}:{:02X}:{:02X}:{:02X}:{:02X}:{:02X}",
                m[0], m[1], m[2], m[3], m[4], m[5]
            ),
            Member::Set(name) => f.write_str(name),
            Member::Port(p) => write!(f, "{p}"),
            Member::Commented(c) => write!(f, "{} comment \"{}\"", c.member, c.comment),
            // As ipset prints it (its print_mark: 0x%08x).
            Member::IpMark { addr, mark } => write!(f, "{},0x{mark:08x}", KernelAddr(addr)),
            Member::NetIface(e) => {
                fmt_net(f, &e.addr, e.prefix)?;
                f.write_str(if e.physdev { ",physdev:" } else { "," })?;
                write!(f, "{}", e.iface)?;
                fmt_nomatch(f, e.nomatch)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a list or slice writes reads back as the same member.
    #[test]
    fn the_spec_string_reads_back() {
        for (t, s) in [
            (SetType::HashNet, "10.61.0.0/16 comment:x y"),
            (SetType::HashNet, "10.61.0.0/16 nomatch comment:office"),
            (SetType::HashIpPort, "10.0.0.1,udp:53 comment:dns"),
            (SetType::HashIp, "10.0.0.1"),
        ] {
            let m = Member::parse_user(t, s)
                .unwrap()
                .members
                .iter()
                .next()
                .unwrap()
                .clone();
            assert_eq!(m.spec_string(), s);
            let back = Member::parse_user(t, &m.spec_string()).unwrap();
            assert_eq!(back.members.iter().next(), Some(&m), "{s}");
        }
    }

    fn canon(t: SetType, s: &str) -> Result<Vec<String>, MemberError> {
        Member::parse_user(t, s).map(|p| p.members.iter().map(|m| m.to_string()).collect())
    }

    #[test]
    fn hash_ip_accepts_host_prefix_only() {
        assert_eq!(canon(SetType::HashIp, "10.0.0.1/32").unwrap(), ["10.0.0.1"]);
        assert_eq!(
            canon(SetType::HashIp, "2001:DB8:0:0::1/128").unwrap(),
            ["2001:db8::1"]
        );
        assert_eq!(
            canon(SetType::HashIp, "10.0.0.0/24"),
            Err(MemberError::WideCidrInHashIp)
        );
    }

    #[test]
    fn hash_net_clears_host_bits_and_splits_slash_zero() {
        assert_eq!(
            canon(SetType::HashNet, "10.1.2.3/8").unwrap(),
            ["10.0.0.0/8"]
        );
        assert_eq!(canon(SetType::HashNet, "10.1.2.3").unwrap(), ["10.1.2.3"]);
        assert_eq!(
            canon(SetType::HashNet, "10.1.2.3/32").unwrap(),
            ["10.1.2.3"]
        );
        assert_eq!(
            canon(SetType::HashNet, "10.2.0.0/16 nomatch").unwrap(),
            ["10.2.0.0/16 nomatch"]
        );
        assert_eq!(
            canon(SetType::HashNet, "0.0.0.0/0").unwrap(),
            ["0.0.0.0/1", "128.0.0.0/1"]
        );
        assert_eq!(
            canon(SetType::HashNet, "::/0").unwrap(),
            ["::/1", "8000::/1"]
        );
        assert!(matches!(
            canon(SetType::HashNet, "10.0.0.0/33"),
            Err(MemberError::BadCidr(_))
        ));
    }

    #[test]
    fn ip_port_forms() {
        assert_eq!(
            canon(SetType::HashIpPort, "10.0.0.1,80").unwrap(),
            ["10.0.0.1,tcp:80"]
        );
        assert_eq!(
            canon(SetType::HashIpPort, "10.0.0.1,UDP:53").unwrap(),
            ["10.0.0.1,udp:53"]
        );
        assert_eq!(
            canon(SetType::HashIpPort, "10.0.0.1,icmp:8/0").unwrap(),
            ["10.0.0.1,icmp:echo-request"]
        );
        assert_eq!(
            canon(SetType::HashIpPort, "10.0.0.1,icmp:3/8").unwrap(),
            ["10.0.0.1,icmp:3/8"]
        );
        assert_eq!(
            canon(SetType::HashIpPort, "::1,icmpv6:ping").unwrap(),
            ["::1,ipv6-icmp:echo-request"]
        );
        assert_eq!(
            canon(SetType::HashIpPort, "10.0.0.1,tcp:80-90"),
            Err(MemberError::PortRange)
        );
        assert_eq!(
            canon(SetType::HashIpPort, "10.0.0.1,tcp:70000"),
            Err(MemberError::BadPort)
        );
        assert!(matches!(
            canon(SetType::HashIpPort, "10.0.0.1,gre:0"),
            Err(MemberError::UnsupportedProtocol(_))
        ));
        assert!(matches!(
            canon(SetType::HashIpPort, "::1,icmp:8/0"),
            Err(MemberError::ProtoFamilyMismatch(..))
        ));
    }

    #[test]
    fn leading_zeros_are_refused_where_ipset_reads_octal() {
        for (t, input) in [
            (SetType::HashIpPort, "10.0.0.1,tcp:010"),
            (SetType::HashIpPort, "10.0.0.1,010"),
            (SetType::HashIpPort, "10.0.0.1,icmp:010/0"),
            (SetType::HashIpPort, "10.0.0.1,icmp:8/00"),
            (SetType::HashNet, "10.0.0.0/010"),
            (SetType::HashIp, "1.2.3.4/032"),
            (SetType::HashIpPort, "1.2.3.4/032,80"),
        ] {
            assert_eq!(canon(t, input), Err(MemberError::LeadingZero), "{input}");
        }
        // A single zero is a number like any other.
        assert_eq!(
            canon(SetType::HashIpPort, "10.0.0.1,udp:0").unwrap(),
            ["10.0.0.1,udp:0"]
        );
        assert_eq!(
            canon(SetType::HashIpPort, "10.0.0.1,icmp:0/0").unwrap(),
            ["10.0.0.1,icmp:echo-reply"]
        );
        assert_eq!(
            canon(SetType::HashNet, "10.0.0.0/8").unwrap(),
            ["10.0.0.0/8"]
        );
    }

    #[test]
    fn only_two_numbers_make_a_port_range() {
        assert_eq!(
            canon(SetType::HashIpPort, "10.0.0.1,udp:-1"),
            Err(MemberError::BadPort)
        );
        assert_eq!(
            canon(SetType::HashIpPort, "10.0.0.1,udp:1-"),
            Err(MemberError::BadPort)
        );
        assert_eq!(
            canon(SetType::HashIpPort, "10.0.0.1,udp:1-2"),
            Err(MemberError::PortRange)
        );
        assert_eq!(
            canon(SetType::HashIpPort, "10.0.0.1,-"),
            Err(MemberError::BadPort)
        );
    }

    #[test]
    fn ipv6_renders_like_inet_ntop() {
        for (input, want) in [
            ("::1.2.3.4", "::1.2.3.4"),
            ("::102:304", "::1.2.3.4"),
            ("::0.1.0.0", "::0.1.0.0"),
            ("::2", "::2"),
            ("::1", "::1"),
            ("::ffff:1.2.3.4", "::ffff:1.2.3.4"),
            ("::ffff:0:1.2.3.4", "::ffff:0:102:304"),
            ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),
            ("2001:0:0:1::1", "2001:0:0:1::1"),
        ] {
            assert_eq!(canon(SetType::HashIp, input).unwrap(), [want], "{input}");
        }
    }

    #[test]
    fn mac_forms() {
        assert_eq!(
            canon(SetType::HashMac, "aa-bb-cc-dd-ee-0f").unwrap(),
            ["AA:BB:CC:DD:EE:0F"]
        );
        assert_eq!(
            canon(SetType::HashMac, "aa:bb:cc"),
            Err(MemberError::BadMac)
        );
    }

    #[test]
    fn injection_and_hostnames_are_rejected() {
        assert_eq!(
            canon(SetType::HashIp, "1.2.3.4\ndestroy KUBE-X"),
            Err(MemberError::ForbiddenCharacters)
        );
        assert_eq!(
            canon(SetType::HashIp, "example.com"),
            Err(MemberError::HostName)
        );
        assert_eq!(
            canon(SetType::HashIp, "localhost"),
            Err(MemberError::HostName)
        );
        assert_eq!(
            canon(SetType::HashIp, "1.2.3"),
            Err(MemberError::BadAddress)
        );
        assert_eq!(canon(SetType::HashIp, ""), Err(MemberError::Empty));
        assert_eq!(
            canon(SetType::HashIp, "0.0.0.0"),
            Err(MemberError::NullAddress)
        );
        assert_eq!(
            canon(SetType::HashIpPort, "::,80"),
            Err(MemberError::NullAddress)
        );
        assert_eq!(
            canon(SetType::HashIp, "1.2.3.4 nomatch"),
            Err(MemberError::NomatchNotAllowed)
        );
    }

    #[test]
    fn members_stay_small() {
        // Millions of IPv6 members are stored as `Member`s: the wide kinds
        // are boxed so that adding them did not grow every member.
        assert!(std::mem::size_of::<Member>() <= 24);
    }

    #[test]
    fn net_port_forms() {
        let t = SetType::HashNetPort;
        assert_eq!(canon(t, "10.1.2.3/24,80").unwrap(), ["10.1.2.0/24,tcp:80"]);
        assert_eq!(canon(t, "10.1.2.3,udp:53").unwrap(), ["10.1.2.3,udp:53"]);
        assert_eq!(canon(t, "10.9.0.0/32,sctp:5").unwrap(), ["10.9.0.0,sctp:5"]);
        assert_eq!(
            canon(t, "10.0.0.0/8,icmp:8/0").unwrap(),
            ["10.0.0.0/8,icmp:echo-request"]
        );
        assert_eq!(
            canon(t, "10.2.0.0/16,tcp:22 nomatch").unwrap(),
            ["10.2.0.0/16,tcp:22 nomatch"]
        );
        assert_eq!(
            canon(t, "0.0.0.0/0,80").unwrap(),
            ["0.0.0.0/1,tcp:80", "128.0.0.0/1,tcp:80"]
        );
        assert_eq!(
            canon(t, "2001:db8::1/32,ipv6-icmp:ping").unwrap(),
            ["2001:db8::/32,ipv6-icmp:echo-request"]
        );
        assert_eq!(
            canon(t, "10.3.0.0/16,tcp:22-23"),
            Err(MemberError::PortRange)
        );
        assert!(matches!(
            canon(t, "10.0.0.0/8"),
            Err(MemberError::BadSyntax(_))
        ));
        assert!(matches!(
            canon(t, "::/8,icmp:8/0"),
            Err(MemberError::ProtoFamilyMismatch(..))
        ));
        assert_eq!(canon(t, "10.0.0.0/08,80"), Err(MemberError::LeadingZero));
    }

    #[test]
    fn ip_port_ip_forms() {
        let t = SetType::HashIpPortIp;
        assert_eq!(
            canon(t, "10.0.0.1,80,10.0.0.2").unwrap(),
            ["10.0.0.1,tcp:80,10.0.0.2"]
        );
        assert_eq!(
            canon(t, "10.0.0.1/32,udp:53,10.0.0.2/32").unwrap(),
            ["10.0.0.1,udp:53,10.0.0.2"]
        );
        // The kernel holds the all-zero address in these types.
        assert_eq!(
            canon(t, "0.0.0.0,80,0.0.0.0").unwrap(),
            ["0.0.0.0,tcp:80,0.0.0.0"]
        );
        assert_eq!(
            canon(t, "::1,icmpv6:1/0,::2").unwrap(),
            ["::1,ipv6-icmp:no-route,::2"]
        );
        assert_eq!(
            canon(t, "10.0.0.1,80,10.0.0.0/24"),
            Err(MemberError::WideCidrInHashIp)
        );
        assert_eq!(canon(t, "10.0.0.1,80,::2"), Err(MemberError::MixedFamilies));
        assert!(matches!(
            canon(t, "10.0.0.1,80"),
            Err(MemberError::BadSyntax(_))
        ));
        assert!(matches!(
            canon(t, "10.0.0.1,80,10.0.0.2,1"),
            Err(MemberError::BadSyntax(_))
        ));
        assert_eq!(
            canon(t, "10.0.0.1,80,10.0.0.2 nomatch"),
            Err(MemberError::NomatchNotAllowed)
        );
    }

    #[test]
    fn ip_port_net_forms() {
        let t = SetType::HashIpPortNet;
        assert_eq!(
            canon(t, "10.0.0.1,80,10.9.9.9/8").unwrap(),
            ["10.0.0.1,tcp:80,10.0.0.0/8"]
        );
        assert_eq!(
            canon(t, "10.0.0.1,80,10.1.1.1 nomatch").unwrap(),
            ["10.0.0.1,tcp:80,10.1.1.1 nomatch"]
        );
        assert_eq!(
            canon(t, "10.0.0.1,udp:1,0.0.0.0/0").unwrap(),
            ["10.0.0.1,udp:1,0.0.0.0/1", "10.0.0.1,udp:1,128.0.0.0/1"]
        );
        assert_eq!(
            canon(t, "10.0.0.1/24,80,10.0.0.0/8"),
            Err(MemberError::WideCidrInHashIp)
        );
        assert_eq!(
            canon(t, "2001:db8::1,80,10.0.0.0/8"),
            Err(MemberError::MixedFamilies)
        );
    }

    #[test]
    fn nomatch_twins_are_one_kernel_entry() {
        for (t, s) in [
            (SetType::HashNet, "10.0.0.0/8"),
            (SetType::HashNetPort, "10.0.0.0/8,80"),
            (SetType::HashIpPortNet, "1.1.1.1,80,10.0.0.0/8"),
        ] {
            let plain = Member::parse_kernel(t, s).unwrap();
            let flagged = Member::parse_kernel(t, &format!("{s} nomatch")).unwrap();
            assert_eq!(plain.nomatch_twin(), Some(flagged.clone()), "{s}");
            assert!(flagged.is_nomatch() && !plain.is_nomatch());
        }
        assert_eq!(Member::Ip("1.1.1.1".parse().unwrap()).nomatch_twin(), None);
    }

    #[test]
    fn kernel_zero_prefixes_are_not_halved() {
        assert!(Member::parse_kernel(SetType::HashNetPort, "0.0.0.0/0,tcp:80").is_err());
    }

    #[test]
    fn bitmap_members() {
        assert_eq!(
            canon(SetType::BitmapIp, "10.0.0.5/32").unwrap(),
            ["10.0.0.5"]
        );
        assert_eq!(canon(SetType::BitmapIp, "0.0.0.0").unwrap(), ["0.0.0.0"]);
        assert_eq!(
            canon(SetType::BitmapIp, "10.0.0.0/30"),
            Err(MemberError::WideCidrInHashIp)
        );
        assert_eq!(canon(SetType::BitmapPort, "80").unwrap(), ["80"]);
        assert_eq!(canon(SetType::BitmapPort, "0").unwrap(), ["0"]);
        assert!(matches!(
            canon(SetType::BitmapPort, "tcp:80"),
            Err(MemberError::BadSyntax(_))
        ));
        assert_eq!(
            canon(SetType::BitmapPort, "80-81"),
            Err(MemberError::PortRange)
        );
        assert_eq!(
            canon(SetType::BitmapPort, "080"),
            Err(MemberError::LeadingZero)
        );
        assert_eq!(
            canon(SetType::BitmapPort, "65536"),
            Err(MemberError::BadPort)
        );
    }

    #[test]
    fn net_iface_forms() {
        let t = SetType::HashNetIface;
        assert_eq!(canon(t, "10.1.2.3/8,eth0").unwrap(), ["10.0.0.0/8,eth0"]);
        assert_eq!(
            canon(t, "10.0.0.0/16,physdev:eth1 nomatch").unwrap(),
            ["10.0.0.0/16,physdev:eth1 nomatch"]
        );
        // Kept whole: the kernel holds /0 in this type.
        assert_eq!(canon(t, "0.0.0.0/0,lo").unwrap(), ["0.0.0.0/0,lo"]);
        assert_eq!(
            Member::parse_kernel(t, "0.0.0.0/0,lo").unwrap().to_string(),
            "0.0.0.0/0,lo"
        );
        assert_eq!(canon(t, "2001:db8::1,wg0").unwrap(), ["2001:db8::1,wg0"]);
        assert!(matches!(
            canon(t, "10.0.0.0/8"),
            Err(MemberError::BadSyntax(_))
        ));
        assert!(matches!(
            canon(t, "10.0.0.0/8,abcdefghijklmnop"),
            Err(MemberError::BadIface(_))
        ));
        assert!(matches!(
            canon(t, "10.0.0.0/8,physdev:"),
            Err(MemberError::BadIface(_))
        ));
        assert!(matches!(
            canon(t, "10.0.0.0/8,eth/0"),
            Err(MemberError::BadIface(_))
        ));
        let plain = Member::parse_kernel(t, "10.0.0.0/8,eth0").unwrap();
        let phys = Member::parse_kernel(t, "10.0.0.0/8,physdev:eth0").unwrap();
        assert_ne!(plain, phys, "physdev is part of the key");
        assert_eq!(
            plain.nomatch_twin().unwrap().to_string(),
            "10.0.0.0/8,eth0 nomatch"
        );
    }

    #[test]
    fn ip_mark_forms() {
        let t = SetType::HashIpMark;
        assert_eq!(canon(t, "10.0.0.1,0x1F").unwrap(), ["10.0.0.1,0x0000001f"]);
        assert_eq!(canon(t, "10.0.0.1,31").unwrap(), ["10.0.0.1,0x0000001f"]);
        assert_eq!(canon(t, "::1,0").unwrap(), ["::1,0x00000000"]);
        assert_eq!(
            canon(t, "10.0.0.1,4294967295").unwrap(),
            ["10.0.0.1,0xffffffff"]
        );
        assert_eq!(canon(t, "10.0.0.1,037"), Err(MemberError::LeadingZero));
        for bad in [
            "10.0.0.1,4294967296",
            "10.0.0.1,0x123456789",
            "10.0.0.1,0x",
            "10.0.0.1",
        ] {
            assert!(
                matches!(canon(t, bad), Err(MemberError::BadSyntax(_))),
                "{bad}"
            );
        }
        assert_eq!(canon(t, "0.0.0.0,1"), Err(MemberError::NullAddress));
    }

    #[test]
    fn comments_follow_the_member() {
        assert_eq!(
            canon(
                SetType::HashNet,
                "10.1.0.0/8 nomatch comment:source: spamhaus 2026-11-30"
            )
            .unwrap(),
            ["10.0.0.0/8 nomatch comment \"source: spamhaus 2026-11-30\""]
        );
        assert_eq!(
            canon(SetType::HashNet, "0.0.0.0/0 comment:all").unwrap(),
            ["0.0.0.0/1 comment \"all\"", "128.0.0.0/1 comment \"all\""]
        );
        let m = Member::parse_kernel(SetType::HashIp, "10.0.0.1 comment \"a b, c\"").unwrap();
        assert_eq!(m.comment().unwrap().as_str(), "a b, c");
        assert_eq!(m.key().to_string(), "10.0.0.1");
        assert_eq!(
            Member::parse_kernel(SetType::HashIp, &m.to_string()).unwrap(),
            m
        );
        let n = Member::parse_kernel(SetType::HashNet, "10.0.0.0/8 nomatch comment \"x\"").unwrap();
        assert_eq!(n.key().to_string(), "10.0.0.0/8");
        assert!(n.is_nomatch());
        assert_eq!(
            n.nomatch_twin().unwrap().to_string(),
            "10.0.0.0/8 comment \"x\""
        );
        for bad in [
            "10.0.0.1 comment:",
            "10.0.0.1 comment:say \"hi\"",
            "10.0.0.1 comment: x",
        ] {
            assert!(
                matches!(canon(SetType::HashIp, bad), Err(MemberError::BadComment(_))),
                "{bad}"
            );
        }
        assert!(Member::parse_kernel(SetType::HashIp, "10.0.0.1 comment \"x").is_err());
    }
}

#[cfg(test)]
mod fast_path_tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The fast IPv4 path gives std's address whenever it gives one, and
        /// gives one for every address as printed.
        #[test]
        fn dotted_quad_agrees_with_std(s in "[0-9.]{0,17}", a in any::<u32>()) {
            // On digits and dots, exactly std's answer.
            prop_assert_eq!(dotted_quad(s.as_bytes()), s.parse::<Ipv4Addr>().ok(), "{:?}", s);
            let printed = Ipv4Addr::from(a);
            prop_assert_eq!(dotted_quad(printed.to_string().as_bytes()), Some(printed));
        }

        /// The hash:ip shortcut of parse_user says what the general path
        /// says, on addresses, near-addresses and anything else.
        #[test]
        fn parse_user_shortcut_agrees_with_the_general_path(
            s in prop_oneof![
                "[0-9.]{0,17}",
                "[0-9./ a-z:]{0,20}",
                any::<u32>().prop_map(|a| Ipv4Addr::from(a).to_string()),
            ],
        ) {
            prop_assert_eq!(
                Member::parse_user(SetType::HashIp, &s),
                Member::parse_user_general(SetType::HashIp, &s),
                "{:?}", s
            );
        }

        /// The ASCII shortcut of the character check says what the char-by-
        /// char test says.
        #[test]
        fn forbidden_characters_agree_on_ascii(s in "[\\x00-\\x7f]{0,12}") {
            let slow = s.chars().any(|c| c.is_whitespace() || c.is_control());
            prop_assert_eq!(forbidden_characters(&s), slow, "{:?}", s);
        }
    }

    #[test]
    fn dotted_quad_refuses_what_std_refuses() {
        for s in [
            "010.0.0.1",
            "1.2.3",
            "1.2.3.4.5",
            "256.0.0.1",
            "1..2.3",
            "1.2.3.4 ",
            "1.2.3.+4",
            "",
        ] {
            assert_eq!(dotted_quad(s.as_bytes()), None, "{s:?}");
        }
        assert_eq!(dotted_quad(b"0.0.0.0"), Some(Ipv4Addr::UNSPECIFIED));
        assert_eq!(dotted_quad(b"255.255.255.255"), Some(Ipv4Addr::BROADCAST));
    }
}
