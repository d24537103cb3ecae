//! The nf_tables conformance suite against the native netlink backend.
//! Needs root; each test runs in a fresh network namespace, with `nft` as
//! the oracle.

#[macro_use]
mod conformance;

use ipsetmgr_nft::netlink::NetlinkNft;

conformance_tests!(kernel: || Box::new(NetlinkNft::new().expect("a NETLINK_NETFILTER socket")));
