//! The kernel conformance suite against the in-memory model: every manager
//! and agent test relies on the model, so it must answer like the kernel
//! does (the same bodies `tests/kernel_cli.rs` and
//! `tests/kernel_netlink_conformance.rs` run for the real backends). Needs
//! no root.

#[macro_use]
mod conformance;

use ipsetmgr_dataplane::model::ModelDataplane;

conformance_tests!(model: || Box::new(ModelDataplane::new()));

/// The model kernel with hash:ip,mark, so the branch of that body for
/// kernels that have the type runs somewhere too.
#[test]
fn hash_ip_mark_on_a_kernel_that_has_it() {
    conformance::run(
        "hash_ip_mark_on_a_kernel_that_has_it",
        conformance::Mode::Model,
        || {
            let m = ModelDataplane::new();
            m.set_supported(ipsetmgr_ipset::SetType::HashIpMark, true);
            Box::new(m)
        },
        conformance::hash_ip_mark_not_supported,
    );
}
