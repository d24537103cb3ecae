//! Where sets live: the bpffs (mounted when missing) and the directory
//! `<bpffs>/ipsetmgr/` whose entries are the sets' pins, one per set, named
//! after the set (docs/bpf.md, "Pins").
//!
//! Ownership is by name only, as for the other kernels: [`Bpffs::list`]
//! gives the pins whose names start with the caller's prefix, and nothing
//! else in the directory (or in the rest of the bpffs) is ever opened,
//! changed or removed.

use std::io;
use std::path::{Path, PathBuf};

use ipsetmgr_ipset::Family;
use nix::errno::Errno;
use nix::mount::{MsFlags, mount};

use crate::entry::Entry;
use crate::error::BpfError;
use crate::set::BpfSet;

/// Where the kernel's bpffs is usually mounted.
pub const DEFAULT_MOUNT: &str = "/sys/fs/bpf";
/// The directory of the sets' pins, under the bpffs.
pub const SETS_DIR: &str = "ipsetmgr";
/// `BPF_FS_MAGIC` (include/uapi/linux/magic.h): statfs's type of a bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// An open bpffs: its mount point and the sets' directory in it.
#[derive(Debug, Clone)]
pub struct Bpffs {
    mount: PathBuf,
    sets: PathBuf,
}

impl Bpffs {
    /// Use the bpffs at `mount`, mounting one there when none is (the
    /// directory is created first when missing), and create the sets'
    /// directory in it.
    pub fn open(mount_point: &Path) -> Result<Bpffs, BpfError> {
        let fail = |op: &'static str| {
            let path = mount_point.to_path_buf();
            move |errno: Errno| BpfError::Bpffs { path, op, errno }
        };
        std::fs::create_dir_all(mount_point)
            .map_err(|e| fail("create mount point")(io_errno(&e)))?;
        if !is_bpffs(mount_point).map_err(fail("statfs"))? {
            mount(
                Some("bpf"),
                mount_point,
                Some("bpf"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("mode=0700"),
            )
            .map_err(fail("mount bpffs"))?;
        }
        let sets = mount_point.join(SETS_DIR);
        std::fs::create_dir_all(&sets)
            .map_err(|e| fail("create ipsetmgr directory")(io_errno(&e)))?;
        Ok(Bpffs {
            mount: mount_point.to_path_buf(),
            sets,
        })
    }

    /// The bpffs's mount point.
    pub fn mount_point(&self) -> &Path {
        &self.mount
    }

    /// Where the set `name` is pinned. Names become path components, so
    /// they are checked: no `/`, no leading dot.
    pub fn pin_path(&self, name: &str) -> Result<PathBuf, BpfError> {
        validate_name(name)?;
        Ok(self.sets.join(name))
    }

    /// The names of the pinned sets that start with `prefix`, sorted.
    /// Directories and other names are left alone, and not opened.
    pub fn list(&self, prefix: &str) -> Result<Vec<String>, BpfError> {
        let fail = |e: io::Error| BpfError::Bpffs {
            path: self.sets.clone(),
            op: "list",
            errno: io_errno(&e),
        };
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.sets).map_err(fail)? {
            let entry = entry.map_err(fail)?;
            if entry.file_type().map_err(fail)?.is_dir() {
                continue;
            }
            if let Some(name) = entry.file_name().to_str()
                && name.starts_with(prefix)
            {
                names.push(name.to_string());
            }
        }
        names.sort();
        Ok(names)
    }

    /// Create and pin the set `name` of `family`, sized for `max_entries`
    /// entries, holding `entries`.
    pub fn create(
        &self,
        name: &str,
        family: Family,
        max_entries: u32,
        entries: &[Entry],
    ) -> Result<BpfSet, BpfError> {
        let path = self.pin_path(name)?;
        if path.exists() {
            return Err(BpfError::Exists {
                set: name.to_string(),
                path,
            });
        }
        BpfSet::create(name, path, family, max_entries, entries)
    }

    /// Open the pinned set `name`.
    pub fn open_set(&self, name: &str) -> Result<BpfSet, BpfError> {
        BpfSet::open(name, self.pin_path(name)?)
    }

    /// Remove the set `name`'s pin, after checking that it is one of our
    /// sets. The maps go when the last reader lets go of them (a program
    /// that still references the outer map keeps it, empty of new changes).
    pub fn delete(&self, name: &str) -> Result<(), BpfError> {
        let set = self.open_set(name)?;
        std::fs::remove_file(set.path()).map_err(|e| BpfError::Kernel {
            set: name.to_string(),
            op: "unpin",
            errno: io_errno(&e),
        })
    }
}

fn is_bpffs(path: &Path) -> Result<bool, Errno> {
    let st = nix::sys::statfs::statfs(path)?;
    Ok(st.filesystem_type().0 as i64 == BPF_FS_MAGIC)
}

pub(crate) fn io_errno(e: &io::Error) -> Errno {
    e.raw_os_error().map(Errno::from_raw).unwrap_or(Errno::EIO)
}

/// A set name as a path component: 1-255 bytes of letters, digits, `-`,
/// `_` or `.`, not starting with a dot.
pub(crate) fn validate_name(name: &str) -> Result<(), BpfError> {
    if ipsetmgr_ipset::is_path_component(name, 255) {
        Ok(())
    } else {
        Err(BpfError::BadName(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_escape_the_directory_are_refused() {
        for bad in ["", "../x", "a/b", ".hidden", "a b"] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        for good in ["ipm4-blocklist", "ipm6-a.b_c"] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
    }
}
