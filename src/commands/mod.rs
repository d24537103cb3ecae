//! The commands. File mode (`apply`, `run`, `sets`): policy files to kernel
//! sets through the manager, without a cluster; `slice`, which turns a
//! member list into IPSetMemberSlice objects for a cluster; and the wiring
//! of the cluster roles (`agent`, `controller`, `hollow`), whose parts are
//! the `ipsetmgr-agent` and `ipsetmgr-controller` crates; `xdp`, which
//! attaches the BPF kernel's XDP program to an interface. Reading policy
//! files and file mode's member sources are `crate::files`.

pub(crate) mod agent;
pub mod apply;
pub(crate) mod controller;
pub(crate) mod hollow;
pub mod run;
pub mod sets;
pub(crate) mod slice;
pub mod table;
pub mod xdp;
