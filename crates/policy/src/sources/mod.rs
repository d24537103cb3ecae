//! Member sources (`spec.membersFrom[]`, see `docs/member-sources.md`),
//! their pure parts: parsed into typed values, the members of the cluster
//! sources computed from given objects, fetched or read content checked
//! for its policy. Fetching (`ipsetmgr`'s `sources::feed`) and reading
//! files are elsewhere.
//!
//! - [`spec`]: the sources parsed into typed values, or why not
//!   ([`reason`]);
//! - [`cluster`]: members of the nodes, pods and services sources;
//! - [`content`]: a fetched or read member list checked for the policy.

pub mod cluster;
pub mod content;
pub mod reason;
pub mod spec;
