//! The XDP consumer: `xdp/drop_from.bpf.c`, built by `build.rs`, attached
//! to an interface to drop packets whose source address one of the named
//! sets matches (docs/bpf.md, "The XDP program").
//!
//! The program references each set's pinned outer map directly (aya's
//! `map_pin_path` points its map `v4_setN`/`v6_setN` at the pin), so a
//! set's replacement or delta is seen by the next packet, with no reload.
//! Up to [`SETS_PER_FAMILY`] sets of each family per interface.
//!
//! The attachment is a bpf_link pinned at `<bpffs>/ipsetmgr-xdp/<interface>`,
//! so it outlives the process that attached it; [`detach`] removes that pin,
//! which releases the link and with it the program.

use std::path::PathBuf;

use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::{Xdp, XdpMode};
use ipsetmgr_ipset::{Family, Naming};

use crate::error::{BpfError, XdpError};
use crate::store::{Bpffs, io_errno};

/// How many sets of one family one attached program consults.
pub const SETS_PER_FAMILY: usize = 4;
/// The directory of the pinned links, under the bpffs.
pub const XDP_DIR: &str = "ipsetmgr-xdp";

/// The object's map names, slot by slot (the C source declares them).
const V4_MAPS: [&str; SETS_PER_FAMILY] = ["v4_set0", "v4_set1", "v4_set2", "v4_set3"];
const V6_MAPS: [&str; SETS_PER_FAMILY] = ["v6_set0", "v6_set1", "v6_set2", "v6_set3"];
const PROGRAM: &str = "drop_from";

#[cfg(xdp_object)]
static OBJECT: Option<&[u8]> = Some(aya::include_bytes_aligned!(concat!(
    env!("OUT_DIR"),
    "/drop_from.o"
)));
/// Built without clang (outside CI): sets work, the program does not.
#[cfg(not(xdp_object))]
static OBJECT: Option<&[u8]> = None;

/// Where the link of `interface` is pinned.
pub fn link_path(fs: &Bpffs, interface: &str) -> Result<PathBuf, BpfError> {
    check_interface_name(interface)?;
    Ok(fs.mount_point().join(XDP_DIR).join(interface))
}

/// Refuse what cannot be an interface name (it becomes a pin's file name).
pub fn check_interface_name(interface: &str) -> Result<(), XdpError> {
    let ok = (1..=15).contains(&interface.len())
        && !interface.starts_with('.')
        && !interface.contains(['/', ' ', '\0']);
    if ok {
        Ok(())
    } else {
        Err(XdpError::BadInterface(interface.to_string()))
    }
}

/// The program loaded into the kernel (verified, its maps pointed at the
/// sets' pins) but attached nowhere: what [`attach`] attaches, and what a
/// test can run with `BPF_PROG_TEST_RUN` ([`aya::programs::TestRun`]).
pub struct Loaded {
    ebpf: aya::Ebpf,
}

impl Loaded {
    /// The loaded `drop_from` program.
    pub fn program(&self) -> &Xdp {
        self.ebpf
            .program(PROGRAM)
            .expect("the object defines drop_from")
            .try_into()
            .expect("drop_from is an XDP program")
    }

    fn program_mut(&mut self) -> &mut Xdp {
        self.ebpf
            .program_mut(PROGRAM)
            .expect("the object defines drop_from")
            .try_into()
            .expect("drop_from is an XDP program")
    }
}

/// Load the program for `sets` (each by name, pinned in `fs`; up to
/// [`SETS_PER_FAMILY`] of each family), without attaching it.
pub fn load(fs: &Bpffs, sets: &[&str]) -> Result<Loaded, BpfError> {
    let object = OBJECT.ok_or(XdpError::ObjectMissing)?;
    let mut loader = aya::EbpfLoader::new();
    let (mut v4, mut v6) = (V4_MAPS.iter(), V6_MAPS.iter());
    for name in sets {
        // Opening checks that the set exists and is one of ours: aya would
        // otherwise create and pin an empty map in its place.
        let set = fs.open_set(name)?;
        let slots = match set.family() {
            Family::V4 => &mut v4,
            Family::V6 => &mut v6,
        };
        let map = slots.next().ok_or_else(|| XdpError::TooManySets {
            family: set.family(),
            max: SETS_PER_FAMILY,
            given: sets
                .iter()
                .filter(|n| fs.open_set(n).map(|s| s.family()).ok() == Some(set.family()))
                .count(),
        })?;
        loader.map_pin_path(map, set.path().to_path_buf());
    }
    let ebpf = loader
        .load(object)
        .map_err(|e| XdpError::Load(Box::new(e)))?;
    let mut loaded = Loaded { ebpf };
    loaded
        .program_mut()
        .load()
        .map_err(|e| XdpError::Load(Box::new(e.into())))?;
    Ok(loaded)
}

/// Attach the program to `interface`, dropping packets from the addresses
/// `sets` match (each set by name, pinned in `fs`). Returns the link's pin.
pub fn attach(fs: &Bpffs, interface: &str, sets: &[&str]) -> Result<PathBuf, BpfError> {
    let link = link_path(fs, interface)?;
    if link.exists() {
        return Err(XdpError::AlreadyAttached {
            interface: interface.to_string(),
            path: link,
        }
        .into());
    }
    let mut loaded = load(fs, sets)?;
    let attach_err = |e: aya::programs::ProgramError| XdpError::Attach {
        interface: interface.to_string(),
        source: Box::new(e),
    };
    let program = loaded.program_mut();
    let id = program
        .attach(interface, XdpMode::default())
        .map_err(attach_err)?;
    let fd_link: FdLink = program
        .take_link(id)
        .map_err(attach_err)?
        .try_into()
        .map_err(|_| XdpError::NoLink {
            interface: interface.to_string(),
        })?;
    let dir = fs.mount_point().join(XDP_DIR);
    std::fs::create_dir_all(&dir).map_err(|e| XdpError::Pin {
        op: "create",
        path: dir.clone(),
        errno: io_errno(&e),
    })?;
    // Pinned, the link outlives this process; unpinned (an error here), it
    // is released when fd_link drops, so nothing stays attached.
    fd_link.pin(&link).map_err(|e| XdpError::Pin {
        op: "pin",
        path: link.clone(),
        errno: match e {
            aya::pin::PinError::SyscallError(s) => io_errno(&s.io_error),
            _ => nix::errno::Errno::EINVAL,
        },
    })?;
    Ok(link)
}

/// The pinned sets of `policies`: each policy's IPv4 and IPv6 set, those
/// that exist; a policy with neither is an error naming it.
pub fn sets_of_policies(
    fs: &Bpffs,
    naming: &Naming,
    policies: &[String],
) -> Result<Vec<String>, BpfError> {
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
            return Err(XdpError::NoSet {
                policy: policy.clone(),
                dir: fs.mount_point().join(crate::SETS_DIR),
                v4,
                v6,
            }
            .into());
        }
    }
    Ok(sets)
}

/// Whether ipsetmgr's program is attached to `interface`: its link's pin
/// exists (the pin holds the link, and the link the attachment).
pub fn is_attached(fs: &Bpffs, interface: &str) -> Result<bool, BpfError> {
    Ok(link_path(fs, interface)?.exists())
}

/// Detach the program from `interface`: its link's pin is removed, and with
/// the last reference the kernel detaches and frees the program. The sets
/// stay.
pub fn detach(fs: &Bpffs, interface: &str) -> Result<(), BpfError> {
    let path = link_path(fs, interface)?;
    if !path.exists() {
        return Err(XdpError::NotAttached {
            interface: interface.to_string(),
            path,
        }
        .into());
    }
    let pinned = PinnedLink::from_pin(&path).map_err(|e| XdpError::Pin {
        op: "open",
        path: path.clone(),
        errno: match e {
            aya::programs::links::LinkError::SyscallError(s) => io_errno(&s.io_error),
            _ => nix::errno::Errno::EINVAL,
        },
    })?;
    let link = pinned.unpin().map_err(|e| XdpError::Pin {
        op: "unpin",
        path: path.clone(),
        errno: io_errno(&e),
    })?;
    drop(link);
    Ok(())
}
