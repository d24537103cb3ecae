//! `ipsetmgr xdp attach` / `detach`: the BPF kernel's XDP program on an
//! interface of the target network namespace (`--netns`), dropping packets
//! whose source address the named policies' BPF sets match (docs/bpf.md,
//! "The XDP program"). The sets are those `--backend bpf` keeps under
//! `--bpf-path`; the program reads them on every packet, so policy changes
//! applied later take effect without attaching again.

use std::io::Write;
use std::path::Path;

use ipsetmgr_bpf::{BpfError, Bpffs, xdp};
use ipsetmgr_ipset::Naming;

/// Why `xdp` did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum XdpCommandError {
    #[error(transparent)]
    Bpf(#[from] BpfError),
}

/// Attach the program to `interface` for the sets of `policies` (run inside
/// the target namespace: the interface is looked up there).
pub fn attach(
    bpffs: &Path,
    naming: &Naming,
    interface: &str,
    policies: &[String],
    out: &mut impl Write,
) -> Result<(), XdpCommandError> {
    let fs = Bpffs::open(bpffs)?;
    let sets = xdp::sets_of_policies(&fs, naming, policies)?;
    let names: Vec<&str> = sets.iter().map(String::as_str).collect();
    let link = xdp::attach(&fs, interface, &names)?;
    // The report goes to stdout; a closed stdout changes nothing attached.
    let _ = writeln!(
        out,
        "attached to {interface}: drops packets from {} (link pinned at {})",
        sets.join(", "),
        link.display()
    );
    Ok(())
}

/// Detach the program from `interface`; the sets stay.
pub fn detach(bpffs: &Path, interface: &str, out: &mut impl Write) -> Result<(), XdpCommandError> {
    let fs = Bpffs::open(bpffs)?;
    xdp::detach(&fs, interface)?;
    let _ = writeln!(out, "detached from {interface}");
    Ok(())
}
