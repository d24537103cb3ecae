//! The kernel conformance suite against the in-memory model: every manager
//! and agent test relies on the model, so it must answer like the kernel
//! does (the same bodies `tests/kernel_cli.rs` and
//! `tests/kernel_netlink_conformance.rs` run for the real backends). Needs
//! no root.

#[macro_use]
mod conformance;

use ipsetmgr::dataplane::model::ModelDataplane;

conformance_tests!(model: || Box::new(ModelDataplane::new()));
