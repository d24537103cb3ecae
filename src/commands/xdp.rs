//! `ipsetmgr xdp attach` / `detach`: the BPF kernel's XDP program on an
//! interface of the target network namespace (`--netns`), dropping packets
//! whose source address the named policies' BPF sets match (docs/bpf.md,
//! "The XDP program"). The sets are those `--backend bpf` keeps under
//! `--bpf-path`; the program reads them on every packet, so policy changes
//! applied later take effect without attaching again.

use std::io::Write;
use std::path::{Path, PathBuf};

use ipsetmgr_bpf::{BpfError, Bpffs, xdp};
use ipsetmgr_ipset::{Family, Naming};

/// Why `xdp` did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum XdpCommandError {
    #[error(
        "policy {policy} has no BPF set in {dir} (neither {v4} nor {v6}): apply it with --backend bpf first (hash:ip and hash:net policies only)"
    )]
    NoSet {
        policy: String,
        dir: PathBuf,
        v4: String,
        v6: String,
    },
    #[error(transparent)]
    Bpf(#[from] BpfError),
}

/// The pinned sets of `policies`: each policy's IPv4 and IPv6 set, those
/// that exist; a policy with neither is an error.
fn sets_of(
    fs: &Bpffs,
    naming: &Naming,
    policies: &[String],
) -> Result<Vec<String>, XdpCommandError> {
    let mut sets = Vec::new();
    for policy in policies {
        let v4 = naming.main_set_name(policy, Some(Family::V4));
        let v6 = naming.main_set_name(policy, Some(Family::V6));
        let mut found = false;
        for name in [&v4, &v6] {
            if fs.pin_path(name)?.exists() {
                sets.push(name.clone());
                found = true;
            }
        }
        if !found {
            return Err(XdpCommandError::NoSet {
                policy: policy.clone(),
                dir: fs.mount_point().join(ipsetmgr_bpf::SETS_DIR),
                v4,
                v6,
            });
        }
    }
    Ok(sets)
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
    let sets = sets_of(&fs, naming, policies)?;
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
