//! One set: its pinned outer map (`BPF_MAP_TYPE_ARRAY_OF_MAPS`, one slot)
//! and the trie in that slot.
//!
//! Readers (the XDP program, a user's own program, `bpftool`) look up slot
//! 0 and then the trie it holds. A full replacement fills a fresh trie
//! while the old one still answers, then swaps the slot in one map update:
//! a reader sees the old set or the new one, never a half-filled one.
//! Deltas go into the current trie in place, one entry per update, as
//! ipset's own `add` and `del` do (docs/bpf.md, "Atomic for readers").

use std::ffi::CString;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use aya::maps::{ArrayOfMaps, Map, MapData};
use ipsetmgr_ipset::Family;

use crate::entry::Entry;
use crate::error::{BpfError, kernel};
use crate::sys;
use crate::trie::{self, Trie};

/// A set's maps, opened. Dropping it closes the fds; the pin keeps the maps.
pub struct BpfSet {
    name: String,
    path: PathBuf,
    outer: Map,
    trie: Trie,
}

impl BpfSet {
    /// Create the set's maps filled with `entries` and pin the outer map at
    /// `path` (the pin is the last step, so a pinned set always holds a
    /// filled trie). Fails with [`BpfError::Exists`] when `path` is taken.
    pub(crate) fn create(
        name: &str,
        path: PathBuf,
        family: Family,
        max_entries: u32,
        entries: &[Entry],
    ) -> Result<BpfSet, BpfError> {
        let kname = kernel_name(name);
        let mut trie = Trie::create(name, &kname, family, max_entries)?;
        fill(name, &mut trie, entries)?;
        let fd =
            sys::create_array_of_maps(&kname, trie.fd(), 1).map_err(|errno| BpfError::Kernel {
                set: name.to_string(),
                op: "create outer map",
                errno,
            })?;
        let data = MapData::from_fd(fd).map_err(|e| kernel(name, "open outer map", e))?;
        let outer = Map::from_map_data(data).map_err(|e| kernel(name, "open outer map", e))?;
        let mut set = BpfSet {
            name: name.to_string(),
            path,
            outer,
            trie,
        };
        swap_in(name, &mut set.outer, &set.trie)?;
        set.pin()?;
        Ok(set)
    }

    /// Open the set pinned at `path`, checking that it is one of ours: an
    /// array-of-maps whose slot 0 holds an LPM trie of either family.
    pub(crate) fn open(name: &str, path: PathBuf) -> Result<BpfSet, BpfError> {
        let not_a_set = |why: String| BpfError::NotASet {
            set: name.to_string(),
            path: path.clone(),
            why,
        };
        let data = MapData::from_pin(&path).map_err(|e| match crate::error::errno_of(&e) {
            Some(nix::errno::Errno::ENOENT) => BpfError::NotFound {
                set: name.to_string(),
                path: path.clone(),
            },
            _ => kernel(name, "open pin", e),
        })?;
        let outer = Map::from_map_data(data).map_err(|e| not_a_set(e.to_string()))?;
        let inner: MapData = match ArrayOfMaps::<&MapData, MapData>::try_from(&outer) {
            Ok(a) => a
                .get(&0, 0)
                .map_err(|e| not_a_set(format!("slot 0: {e}")))?,
            Err(e) => return Err(not_a_set(e.to_string())),
        };
        let key_size = inner
            .info()
            .map_err(|e| kernel(name, "read trie info", e))?
            .key_size();
        let family = [Family::V4, Family::V6]
            .into_iter()
            .find(|f| trie::key_size(*f) == key_size)
            .ok_or_else(|| not_a_set(format!("slot 0 holds a map with {key_size}-byte keys")))?;
        let trie =
            Trie::from_map_data(name, family, inner).map_err(|e| not_a_set(e.to_string()))?;
        Ok(BpfSet {
            name: name.to_string(),
            path,
            outer,
            trie,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the outer map is pinned.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn family(&self) -> Family {
        self.trie.family()
    }

    /// The current trie's size limit (the `maxElem` it was made for).
    pub fn max_entries(&self) -> Result<u32, BpfError> {
        self.trie.max_entries(&self.name)
    }

    /// Replace every entry at once: a fresh trie of `max_entries` is filled
    /// with `entries` and then swapped into the slot. When filling fails the
    /// set keeps its old entries.
    pub fn replace(&mut self, entries: &[Entry], max_entries: u32) -> Result<(), BpfError> {
        let mut fresh = Trie::create(
            &self.name,
            &kernel_name(&self.name),
            self.family(),
            max_entries,
        )?;
        fill(&self.name, &mut fresh, entries)?;
        swap_in(&self.name, &mut self.outer, &fresh)?;
        self.trie = fresh;
        Ok(())
    }

    /// Add (or overwrite) entries in place.
    pub fn add(&mut self, entries: &[Entry]) -> Result<(), BpfError> {
        fill(&self.name, &mut self.trie, entries)
    }

    /// Remove entries in place; each must be there.
    pub fn delete(&mut self, entries: &[Entry]) -> Result<(), BpfError> {
        entries
            .iter()
            .try_for_each(|e| self.trie.remove(&self.name, e))
    }

    /// Every entry of the current trie, sorted.
    pub fn read(&self) -> Result<Vec<Entry>, BpfError> {
        self.trie.dump(&self.name)
    }

    /// The set's answer for `addr`, as a reader gets it: `Some(true)` when
    /// the most specific entry covering it matches, `Some(false)` when that
    /// entry is `nomatch`, `None` when none covers it.
    pub fn lookup(&self, addr: IpAddr) -> Result<Option<bool>, BpfError> {
        Ok(self
            .trie
            .lookup(&self.name, addr)?
            .map(|v| v == crate::entry::MATCH))
    }

    fn pin(&self) -> Result<(), BpfError> {
        let Map::ArrayOfMaps(data) = &self.outer else {
            unreachable!("create made an array of maps");
        };
        data.pin(&self.path).map_err(|e| {
            let errno = match &e {
                aya::pin::PinError::SyscallError(s) => s.io_error.raw_os_error(),
                _ => None,
            }
            .map(nix::errno::Errno::from_raw);
            match errno {
                Some(nix::errno::Errno::EEXIST) => BpfError::Exists {
                    set: self.name.clone(),
                    path: self.path.clone(),
                },
                Some(errno) => BpfError::Kernel {
                    set: self.name.clone(),
                    op: "pin",
                    errno,
                },
                None => BpfError::Kernel {
                    set: self.name.clone(),
                    op: "pin",
                    errno: nix::errno::Errno::EINVAL,
                },
            }
        })
    }
}

impl std::fmt::Debug for BpfSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BpfSet")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("family", &self.family())
            .finish()
    }
}

/// Put `trie` into the outer map's slot 0: one map update.
fn swap_in(set: &str, outer: &mut Map, trie: &Trie) -> Result<(), BpfError> {
    let mut outer = ArrayOfMaps::<&mut MapData, MapData>::try_from(outer)
        .map_err(|e| kernel(set, "swap slot", e))?;
    outer
        .set(0, trie.map_data(), 0)
        .map_err(|e| kernel(set, "swap slot", e))
}

fn fill(set: &str, trie: &mut Trie, entries: &[Entry]) -> Result<(), BpfError> {
    trie.insert_all(set, entries)
}

/// The kernel's name for a set's maps (`bpftool map show`): at most 15
/// bytes of letters, digits, `_` and `.`; other characters become `_`.
fn kernel_name(set: &str) -> CString {
    let name: Vec<u8> = set
        .bytes()
        .take(15)
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'.' {
                b
            } else {
                b'_'
            }
        })
        .collect();
    CString::new(name).expect("no NUL: every byte was mapped to a printable one")
}
