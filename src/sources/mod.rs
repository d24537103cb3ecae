//! Member sources (`spec.membersFrom[]`, see `docs/member-sources.md`):
//! members computed from the cluster or fetched from elsewhere.
//!
//! - [`spec`]: the sources parsed into typed values, or why not;
//! - [`cluster`]: members of the nodes, pods and services sources (pure);
//! - [`content`]: a fetched or read member list checked for the policy;
//! - [`feed`]: fetching a url source over HTTP(S).
//!
//! The controller materialises them into slices (`controller/materialise.rs`);
//! file mode reads url and file sources itself.

pub(crate) mod cluster;
pub(crate) mod content;
pub(crate) mod egress;
pub(crate) mod feed;
pub(crate) mod spec;
