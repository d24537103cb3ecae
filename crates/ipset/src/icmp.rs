//! ICMP and ICMPv6 type/code names, as the `ipset` tool prints and accepts them.
//!
//! The first name listed for a (type, code) pair is the one `ipset list` prints;
//! later ones are accepted aliases. Verified against ipset 7.x output by the
//! kernel conformance tests.

pub const ICMP_NAMES: &[(&str, u8, u8)] = &[
    ("echo-reply", 0, 0),
    ("pong", 0, 0),
    ("network-unreachable", 3, 0),
    ("host-unreachable", 3, 1),
    ("protocol-unreachable", 3, 2),
    ("port-unreachable", 3, 3),
    ("fragmentation-needed", 3, 4),
    ("source-route-failed", 3, 5),
    ("network-unknown", 3, 6),
    ("host-unknown", 3, 7),
    ("network-prohibited", 3, 9),
    ("host-prohibited", 3, 10),
    ("TOS-network-unreachable", 3, 11),
    ("TOS-host-unreachable", 3, 12),
    ("communication-prohibited", 3, 13),
    ("host-precedence-violation", 3, 14),
    ("precedence-cutoff", 3, 15),
    ("source-quench", 4, 0),
    ("network-redirect", 5, 0),
    ("host-redirect", 5, 1),
    ("TOS-network-redirect", 5, 2),
    ("TOS-host-redirect", 5, 3),
    ("echo-request", 8, 0),
    ("ping", 8, 0),
    ("router-advertisement", 9, 0),
    ("router-solicitation", 10, 0),
    ("ttl-zero-during-transit", 11, 0),
    ("ttl-zero-during-reassembly", 11, 1),
    ("ip-header-bad", 12, 0),
    ("required-option-missing", 12, 1),
    ("timestamp-request", 13, 0),
    ("timestamp-reply", 14, 0),
    ("address-mask-request", 17, 0),
    ("address-mask-reply", 18, 0),
];

pub const ICMPV6_NAMES: &[(&str, u8, u8)] = &[
    ("no-route", 1, 0),
    ("communication-prohibited", 1, 1),
    ("address-unreachable", 1, 3),
    ("port-unreachable", 1, 4),
    ("packet-too-big", 2, 0),
    ("ttl-zero-during-transit", 3, 0),
    ("ttl-zero-during-reassembly", 3, 1),
    ("bad-header", 4, 0),
    ("unknown-header-type", 4, 1),
    ("unknown-option", 4, 2),
    ("echo-request", 128, 0),
    ("ping", 128, 0),
    ("echo-reply", 129, 0),
    ("pong", 129, 0),
    ("router-solicitation", 133, 0),
    ("router-advertisement", 134, 0),
    ("neighbour-solicitation", 135, 0),
    ("neigbour-solicitation", 135, 0),
    ("neighbour-advertisement", 136, 0),
    ("neigbour-advertisement", 136, 0),
    ("redirect", 137, 0),
];

/// The printed name of an ICMP(v6) type/code pair, if `ipset` names it.
pub fn name_of(table: &[(&'static str, u8, u8)], icmp_type: u8, code: u8) -> Option<&'static str> {
    table
        .iter()
        .find(|(_, t, c)| *t == icmp_type && *c == code)
        .map(|(n, _, _)| *n)
}

/// The type/code pair a name stands for (case-insensitive, as ipset accepts).
pub fn lookup(table: &[(&'static str, u8, u8)], name: &str) -> Option<(u8, u8)> {
    table
        .iter()
        .find(|(n, _, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, t, c)| (*t, *c))
}
