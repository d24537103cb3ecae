//! Numbers of the nf_tables netlink protocol (`linux/netfilter/nf_tables.h`,
//! `nfnetlink.h`, `netlink.h`) and of the set userdata `nft` writes
//! (libnftnl's `udata.h`, nftables' `datatype.h`). Only what this backend
//! uses.

// netlink
pub const NLM_F_CREATE: u16 = 0x400;
/// A dump was interrupted by a change of the ruleset: start it again.
pub const NLM_F_DUMP_INTR: u16 = 0x10;
/// Flags of an NLMSG_ERROR: the echoed request was cut to its header, and
/// extended-ack attributes follow it.
pub const NLM_F_CAPPED: u16 = 0x100;
pub const NLM_F_ACK_TLVS: u16 = 0x200;
pub const NLMSGERR_ATTR_MSG: u16 = 1;
pub const NLMSGERR_ATTR_OFFS: u16 = 2;

// nfnetlink
pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub const NFNL_MSG_BATCH_END: u16 = 0x11;
pub const NFPROTO_UNSPEC: u8 = 0;
/// The batch-begin attribute naming the ruleset generation the batch was
/// made against: the kernel refuses the batch (ERESTART) when the ruleset
/// has moved on since.
pub const NFNL_BATCH_GENID: u16 = 1;

// enum nf_tables_msg_types
pub const NFT_MSG_NEWTABLE: u8 = 0;
pub const NFT_MSG_GETTABLE: u8 = 1;
pub const NFT_MSG_GETCHAIN: u8 = 4;
pub const NFT_MSG_NEWCHAIN: u8 = 3;
pub const NFT_MSG_GETRULE: u8 = 7;
pub const NFT_MSG_NEWRULE: u8 = 6;
pub const NFT_MSG_NEWSET: u8 = 9;
pub const NFT_MSG_GETSET: u8 = 10;
pub const NFT_MSG_DELSET: u8 = 11;
pub const NFT_MSG_NEWSETELEM: u8 = 12;
pub const NFT_MSG_GETSETELEM: u8 = 13;
pub const NFT_MSG_DELSETELEM: u8 = 14;
pub const NFT_MSG_NEWOBJ: u8 = 18;
pub const NFT_MSG_GETOBJ: u8 = 19;
pub const NFT_MSG_NEWFLOWTABLE: u8 = 22;
pub const NFT_MSG_GETFLOWTABLE: u8 = 23;
pub const NFT_MSG_NEWGEN: u8 = 15;
pub const NFT_MSG_GETGEN: u8 = 16;
// NFTA_GEN_*
pub const NFTA_GEN_ID: u16 = 1;

// NFTA_LIST_*
pub const NFTA_LIST_ELEM: u16 = 1;
// NFTA_TABLE_*
pub const NFTA_TABLE_NAME: u16 = 1;
pub const NFTA_TABLE_FLAGS: u16 = 2;
pub const NFTA_TABLE_OWNER: u16 = 7;
/// NFT_TABLE_F_OWNER: the table belongs to the netlink socket that made it.
pub const NFT_TABLE_F_OWNER: u32 = 0x2;
// NFTA_CHAIN_* / NFTA_RULE_* / NFTA_OBJ_* / NFTA_FLOWTABLE_*: the table
pub const NFTA_CHAIN_TABLE: u16 = 1;
pub const NFTA_RULE_TABLE: u16 = 1;
pub const NFTA_RULE_EXPRESSIONS: u16 = 4;
pub const NFTA_OBJ_TABLE: u16 = 1;
pub const NFTA_FLOWTABLE_TABLE: u16 = 1;
// NFTA_EXPR_*
pub const NFTA_EXPR_NAME: u16 = 1;
pub const NFTA_EXPR_DATA: u16 = 2;
pub const NFTA_LOOKUP_SET: u16 = 1;
pub const NFTA_DYNSET_SET_NAME: u16 = 1;
pub const NFTA_OBJREF_SET_NAME: u16 = 4;
// NFTA_SET_*
pub const NFTA_SET_TABLE: u16 = 1;
pub const NFTA_SET_NAME: u16 = 2;
pub const NFTA_SET_FLAGS: u16 = 3;
pub const NFTA_SET_KEY_TYPE: u16 = 4;
pub const NFTA_SET_KEY_LEN: u16 = 5;
pub const NFTA_SET_DATA_TYPE: u16 = 6;
pub const NFTA_SET_POLICY: u16 = 8;
pub const NFTA_SET_DESC: u16 = 9;
pub const NFTA_SET_ID: u16 = 10;
pub const NFTA_SET_TIMEOUT: u16 = 11;
pub const NFTA_SET_GC_INTERVAL: u16 = 12;
pub const NFTA_SET_USERDATA: u16 = 13;
pub const NFTA_SET_OBJ_TYPE: u16 = 15;
pub const NFTA_SET_HANDLE: u16 = 16;
pub const NFTA_SET_EXPR: u16 = 17;
pub const NFTA_SET_EXPRESSIONS: u16 = 18;
pub const NFTA_SET_DESC_SIZE: u16 = 1;
pub const NFTA_SET_DESC_CONCAT: u16 = 2;
pub const NFTA_SET_FIELD_LEN: u16 = 1;
// enum nft_set_flags
pub const NFT_SET_ANONYMOUS: u32 = 0x1;
pub const NFT_SET_CONSTANT: u32 = 0x2;
pub const NFT_SET_INTERVAL: u32 = 0x4;
pub const NFT_SET_MAP: u32 = 0x8;
pub const NFT_SET_TIMEOUT: u32 = 0x10;
pub const NFT_SET_EVAL: u32 = 0x20;
pub const NFT_SET_OBJECT: u32 = 0x40;
pub const NFT_SET_CONCAT: u32 = 0x80;
pub const NFT_SET_EXPR: u32 = 0x100;
// NFTA_SET_ELEM_LIST_*
pub const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
// NFTA_SET_ELEM_*
pub const NFTA_SET_ELEM_KEY: u16 = 1;
pub const NFTA_SET_ELEM_FLAGS: u16 = 3;
pub const NFTA_SET_ELEM_TIMEOUT: u16 = 4;
pub const NFTA_SET_ELEM_USERDATA: u16 = 6;
pub const NFTA_SET_ELEM_EXPR: u16 = 7;
pub const NFTA_SET_ELEM_KEY_END: u16 = 10;
pub const NFTA_SET_ELEM_EXPRESSIONS: u16 = 11;
pub const NFT_SET_ELEM_INTERVAL_END: u32 = 0x1;
pub const NFT_SET_ELEM_CATCHALL: u32 = 0x2;
pub const NFTA_DATA_VALUE: u16 = 1;

// libnftnl's udata TLVs (one byte type, one byte length, the value).
pub const NFTNL_UDATA_SET_KEYBYTEORDER: u8 = 0;
pub const NFTNL_UDATA_SET_KEY_TYPEOF: u8 = 3;
pub const NFTNL_UDATA_SET_ELEM_COMMENT: u8 = 0;
pub const NFTNL_UDATA_SET_ELEM_FLAGS: u8 = 1;
/// An interval that runs to the end of the address space (no end element).
pub const NFTNL_SET_ELEM_F_INTERVAL_OPEN: u32 = 0x1;
// nftables' enum byteorder
pub const BYTEORDER_INVALID: u32 = 0;
pub const BYTEORDER_HOST_ENDIAN: u32 = 1;
pub const BYTEORDER_BIG_ENDIAN: u32 = 2;
/// nftables' EXPR_CONCAT, which `nft` writes as the (empty) typeof of a
/// concatenated key declared with `type a . b`.
pub const EXPR_CONCAT: u32 = 13;

/// `nlmsg_type` of an nf_tables message.
pub const fn msg_type(msg: u8) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | msg as u16
}
