//! Member sources (`spec.membersFrom[]`, see `docs/member-sources.md`):
//! members computed from the cluster or fetched from elsewhere.
//!
//! - [`egress`]: where url sources may connect;
//! - [`feed`]: fetching a url source over HTTP(S).
//!
//! The pure parts (parsed specs, cluster members, content checks) are in
//! `ipsetmgr_policy::sources`.
//!
//! The controller materialises them into slices (`controller/materialise.rs`);
//! file mode reads url and file sources itself.

pub(crate) mod egress;
pub(crate) mod feed;
