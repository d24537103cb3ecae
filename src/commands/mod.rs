//! The commands that are not file mode's (`apply`, `run` and `sets` are the
//! `ipsetmgr-filemode` crate's): `slice`, which turns a member list into
//! IPSetMemberSlice objects for a cluster; the wiring of the cluster roles
//! (`agent`, `controller`, `hollow`), whose parts are the `ipsetmgr-agent`
//! and `ipsetmgr-controller` crates; and `xdp`, which attaches the BPF
//! kernel's XDP program to an interface.

pub(crate) mod agent;
pub(crate) mod controller;
pub(crate) mod hollow;
pub(crate) mod slice;
pub mod xdp;
pub(crate) mod xdp_keeper;
