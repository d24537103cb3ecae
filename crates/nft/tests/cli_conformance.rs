//! The nf_tables conformance suite against the `nft -j` backend (the same
//! bodies the netlink backend runs). Needs root and `nft`; each test runs
//! in a fresh network namespace.

#[macro_use]
mod conformance;

conformance_tests!(kernel: conformance::nft_cli);
