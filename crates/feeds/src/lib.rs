//! url member sources (`spec.membersFrom[].url`, `docs/member-sources.md`):
//! fetching a list over HTTP(S) through the egress guard. Its own crate
//! because two users share it, the controller and file mode (`apply`,
//! `run`), neither of which may depend on the other.
//!
//! It must never write to the cluster or the kernel, and never let a
//! fetch reach what the guard refuses (the API server, private ranges
//! unless allowed).
//!
//! - [`egress`]: where url sources may connect;
//! - [`feed`]: fetching a url source over HTTP(S), and running it
//!   ([`feed::UrlFeed`]: its state and backoff, for both users);
//! - [`request_error`]: why a request failed, as fixed reasons (nothing
//!   the peer sent reaches a status).
//!
//! The pure parts (parsed specs, cluster members, content checks) are in
//! `ipsetmgr_policy::sources`.
//!
//! The controller materialises them into slices (`controller/materialise.rs`);
//! file mode reads url and file sources itself.

#![forbid(unsafe_code)]

pub mod egress;
pub mod feed;
pub mod request_error;
