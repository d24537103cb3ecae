//! The kernel conformance suite, unchanged, against the native netlink
//! backend (the same bodies `tests/kernel_cli.rs` runs for the CLI backend).
//! Needs root; each test runs in a fresh network namespace.

#[macro_use]
mod conformance;

use ipsetmgr_dataplane::netlink::NetlinkDataplane;

conformance_tests!(|| Box::new(
    NetlinkDataplane::new().expect("the kernel speaks the ipset netlink protocol")
));
