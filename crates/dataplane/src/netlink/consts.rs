//! Numbers of the netlink, nfnetlink and ipset protocols, as defined by the
//! kernel's UAPI headers (`linux/netlink.h`, `linux/netfilter/nfnetlink.h`,
//! `linux/netfilter/ipset/ip_set*.h`). Only what this backend uses.

// netlink
pub const NLMSG_HDRLEN: usize = 16;
pub const NLA_HDRLEN: usize = 4;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const NLMSG_OVERRUN: u16 = 4;

pub const NLM_F_REQUEST: u16 = 0x1;
/// Parts of a dump; only our tests build such replies.
#[cfg(test)]
pub const NLM_F_MULTI: u16 = 0x2;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_DUMP: u16 = 0x100 | 0x200; // ROOT | MATCH
/// For ipset: absent means "exist" semantics (`flag_exist()` in ip_set_core.c).
pub const NLM_F_EXCL: u16 = 0x200;

pub const NLA_F_NESTED: u16 = 1 << 15;
pub const NLA_F_NET_BYTEORDER: u16 = 1 << 14;
pub const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);

// nfnetlink
pub const NFGENMSG_LEN: usize = 4;
pub const NFNETLINK_V0: u8 = 0;
pub const NFNL_SUBSYS_IPSET: u16 = 6;
pub const NFPROTO_UNSPEC: u8 = 0;
pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

// ipset protocol versions this backend speaks.
pub const IPSET_PROTOCOL_MIN: u8 = 6;
pub const IPSET_PROTOCOL_MAX: u8 = 7;

// commands
pub const IPSET_CMD_PROTOCOL: u8 = 1;
pub const IPSET_CMD_CREATE: u8 = 2;
pub const IPSET_CMD_DESTROY: u8 = 3;
pub const IPSET_CMD_FLUSH: u8 = 4;
pub const IPSET_CMD_RENAME: u8 = 5;
pub const IPSET_CMD_SWAP: u8 = 6;
pub const IPSET_CMD_LIST: u8 = 7;
pub const IPSET_CMD_ADD: u8 = 9;
pub const IPSET_CMD_DEL: u8 = 10;
pub const IPSET_CMD_TYPE: u8 = 13;

// attributes at command level
pub const IPSET_ATTR_PROTOCOL: u16 = 1;
pub const IPSET_ATTR_SETNAME: u16 = 2;
pub const IPSET_ATTR_TYPENAME: u16 = 3;
pub const IPSET_ATTR_SETNAME2: u16 = 3;
pub const IPSET_ATTR_REVISION: u16 = 4;
pub const IPSET_ATTR_FAMILY: u16 = 5;
pub const IPSET_ATTR_FLAGS: u16 = 6;
pub const IPSET_ATTR_DATA: u16 = 7;
pub const IPSET_ATTR_ADT: u16 = 8;
pub const IPSET_ATTR_LINENO: u16 = 9;
pub const IPSET_ATTR_PROTOCOL_MIN: u16 = 10;
pub const IPSET_ATTR_REVISION_MIN: u16 = 10;

// CADT attributes (inside IPSET_ATTR_DATA)
pub const IPSET_ATTR_IP: u16 = 1;
pub const IPSET_ATTR_IP_TO: u16 = 2;
pub const IPSET_ATTR_CIDR: u16 = 3;
pub const IPSET_ATTR_PORT: u16 = 4;
pub const IPSET_ATTR_PORT_TO: u16 = 5;
pub const IPSET_ATTR_TIMEOUT: u16 = 6;
pub const IPSET_ATTR_PROTO: u16 = 7;
pub const IPSET_ATTR_CADT_FLAGS: u16 = 8;
pub const IPSET_ATTR_CADT_LINENO: u16 = 9;
pub const IPSET_ATTR_MARK: u16 = 10;
pub const IPSET_ATTR_MARKMASK: u16 = 11;
pub const IPSET_ATTR_BITMASK: u16 = 12;
// create-only / header attributes
pub const IPSET_ATTR_INITVAL: u16 = 17;
pub const IPSET_ATTR_HASHSIZE: u16 = 18;
pub const IPSET_ATTR_MAXELEM: u16 = 19;
pub const IPSET_ATTR_NETMASK: u16 = 20;
pub const IPSET_ATTR_BUCKETSIZE: u16 = 21;
pub const IPSET_ATTR_SIZE: u16 = 23;
pub const IPSET_ATTR_ELEMENTS: u16 = 24;
pub const IPSET_ATTR_REFERENCES: u16 = 25;
pub const IPSET_ATTR_MEMSIZE: u16 = 26;
// ADT attributes
pub const IPSET_ATTR_ETHER: u16 = 17;
pub const IPSET_ATTR_NAME: u16 = 18;
pub const IPSET_ATTR_IP2: u16 = 20;
pub const IPSET_ATTR_CIDR2: u16 = 21;
pub const IPSET_ATTR_IFACE: u16 = 23;
pub const IPSET_ATTR_COMMENT: u16 = 26;
// inside IPSET_ATTR_IP
pub const IPSET_ATTR_IPADDR_IPV4: u16 = 1;
pub const IPSET_ATTR_IPADDR_IPV6: u16 = 2;

// command flags (IPSET_ATTR_FLAGS)
pub const IPSET_FLAG_LIST_SETNAME: u32 = 1 << 1;
// CADT flags
pub const IPSET_FLAG_PHYSDEV: u32 = 1 << 1;
pub const IPSET_FLAG_NOMATCH: u32 = 1 << 2;
// CADT flags of a set header: the extensions a set was created with.
pub const IPSET_FLAG_WITH_COUNTERS: u32 = 1 << 3;
pub const IPSET_FLAG_WITH_COMMENT: u32 = 1 << 4;
pub const IPSET_FLAG_WITH_FORCEADD: u32 = 1 << 5;
pub const IPSET_FLAG_WITH_SKBINFO: u32 = 1 << 6;

// ipset private errnos (positive; the kernel sends them negated)
pub const IPSET_ERR_PROTOCOL: i32 = 4097;
pub const IPSET_ERR_FIND_TYPE: i32 = 4098;
pub const IPSET_ERR_MAX_SETS: i32 = 4099;
pub const IPSET_ERR_BUSY: i32 = 4100;
pub const IPSET_ERR_EXIST_SETNAME2: i32 = 4101;
pub const IPSET_ERR_TYPE_MISMATCH: i32 = 4102;
pub const IPSET_ERR_EXIST: i32 = 4103;
pub const IPSET_ERR_INVALID_CIDR: i32 = 4104;
pub const IPSET_ERR_INVALID_NETMASK: i32 = 4105;
pub const IPSET_ERR_INVALID_FAMILY: i32 = 4106;
pub const IPSET_ERR_TIMEOUT: i32 = 4107;
pub const IPSET_ERR_REFERENCED: i32 = 4108;
pub const IPSET_ERR_IPADDR_IPV4: i32 = 4109;
pub const IPSET_ERR_IPADDR_IPV6: i32 = 4110;
pub const IPSET_ERR_COUNTER: i32 = 4111;
pub const IPSET_ERR_COMMENT: i32 = 4112;
pub const IPSET_ERR_INVALID_MARKMASK: i32 = 4113;
pub const IPSET_ERR_SKBINFO: i32 = 4114;
pub const IPSET_ERR_TYPE_SPECIFIC: i32 = 4352;
// hash types
pub const IPSET_ERR_HASH_FULL: i32 = 4352;
pub const IPSET_ERR_HASH_ELEM: i32 = 4353;
pub const IPSET_ERR_INVALID_PROTO: i32 = 4354;
pub const IPSET_ERR_MISSING_PROTO: i32 = 4355;
pub const IPSET_ERR_HASH_RANGE_UNSUPPORTED: i32 = 4356;
pub const IPSET_ERR_HASH_RANGE: i32 = 4357;
// bitmap types
pub const IPSET_ERR_BITMAP_RANGE: i32 = 4352;
pub const IPSET_ERR_BITMAP_RANGE_SIZE: i32 = 4353;
// list:set
pub const IPSET_ERR_NAME: i32 = 4352;
pub const IPSET_ERR_LOOP: i32 = 4353;
pub const IPSET_ERR_BEFORE: i32 = 4354;
pub const IPSET_ERR_NAMEREF: i32 = 4355;
pub const IPSET_ERR_LIST_FULL: i32 = 4356;
pub const IPSET_ERR_REF_EXIST: i32 = 4357;

/// `nlmsg_type` of an ipset command.
pub const fn msg_type(cmd: u8) -> u16 {
    (NFNL_SUBSYS_IPSET << 8) | cmd as u16
}
