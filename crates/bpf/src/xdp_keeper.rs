//! Keeping the XDP program attached (the agent's `--xdp-interface`): one
//! [`XdpKeeper::check`] attaches the program when its link's pin is missing
//! (never attached yet, or detached by someone since) and otherwise leaves
//! it alone. The agent calls it at start and then periodically
//! (docs/bpf.md, "The XDP program in the agent").
//!
//! The program reads the sets through their pinned outer maps, so set
//! changes and replacements need no check at all; the keeper only repairs
//! a missing attachment.

use ipsetmgr_ipset::Naming;

use crate::error::{BpfError, XdpError};
use crate::store::Bpffs;
use crate::xdp;

/// What one check did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept {
    /// The program was attached already; nothing was done.
    Unchanged,
    /// The program was missing and has been attached.
    Attached,
}

/// The attachment the agent keeps: one interface, the sets of some
/// policies.
#[derive(Clone, Debug)]
pub struct XdpKeeper {
    interface: String,
    policies: Vec<String>,
    naming: Naming,
}

impl XdpKeeper {
    /// Refuses an interface name that cannot be one, and an empty or
    /// blank policy list, before any check.
    pub fn new(
        interface: String,
        policies: Vec<String>,
        naming: Naming,
    ) -> Result<XdpKeeper, XdpError> {
        xdp::check_interface_name(&interface)?;
        if policies.is_empty() || policies.iter().any(|p| p.trim().is_empty()) {
            return Err(XdpError::NoPolicies { interface });
        }
        Ok(XdpKeeper {
            interface,
            policies,
            naming,
        })
    }

    pub fn interface(&self) -> &str {
        &self.interface
    }

    /// Attach the program to the interface unless it is attached (run in
    /// the interface's network namespace). Fails, naming why, when a
    /// policy has no set yet, the interface does not exist, or the kernel
    /// refuses; the next check tries again.
    pub fn check(&self, fs: &Bpffs) -> Result<Kept, BpfError> {
        if xdp::is_attached(fs, &self.interface)? {
            return Ok(Kept::Unchanged);
        }
        let sets = xdp::sets_of_policies(fs, &self.naming, &self.policies)?;
        let names: Vec<&str> = sets.iter().map(String::as_str).collect();
        match xdp::attach(fs, &self.interface, &names) {
            Ok(_) => Ok(Kept::Attached),
            // Someone attached it between our look and our attach.
            Err(BpfError::Xdp(XdpError::AlreadyAttached { .. })) => Ok(Kept::Unchanged),
            Err(e) => Err(e),
        }
    }
}
