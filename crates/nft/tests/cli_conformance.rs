//! The nf_tables conformance suite against the `nft -j` backend (the same
//! bodies the netlink backend runs). Needs root and `nft`; each test runs
//! in a fresh network namespace.

#[macro_use]
mod conformance;

use ipsetmgr_nft::cli::CliNft;

conformance_tests!(kernel: || Box::new(CliNft::new()));
