//! The nf_tables conformance suite against the in-memory model: the
//! manager's tests will run on it, so it must answer as the kernel does
//! (the same bodies the netlink and cli backends run). Needs no root.

#[macro_use]
mod conformance;

conformance_tests!(model);
