//! The inner map of a set: one `BPF_MAP_TYPE_LPM_TRIE` of one family, and
//! the typed operations on it (insert, remove, longest-prefix lookup,
//! dump). Keys and values as [`crate::entry`] describes them.

use std::ffi::CString;
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd};

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Map, MapData, MapError};
use ipsetmgr_ipset::Family;
use nix::errno::Errno;

use crate::entry::{self, Entry};
use crate::error::{BpfError, errno_of, kernel};
use crate::sys;

/// include/uapi/linux/bpf.h. An LPM trie must be created without
/// preallocation.
const BPF_MAP_TYPE_LPM_TRIE: u32 = 11;
const BPF_F_NO_PREALLOC: u32 = 1;

/// Entries per `BPF_MAP_UPDATE_BATCH` call: few enough that the buffers
/// stay small (160 kB of IPv6 keys), many enough that the calls' own cost
/// is nothing next to the inserts.
const BATCH: usize = 8192;

/// The trie's key size for a family: the u32 prefix length and the address.
pub(crate) fn key_size(family: Family) -> u32 {
    match family {
        Family::V4 => 4 + 4,
        Family::V6 => 4 + 16,
    }
}

/// One set's trie.
pub(crate) struct Trie {
    family: Family,
    map: Map,
}

impl Trie {
    /// A new, empty trie of at most `max_entries` entries (at least one:
    /// the kernel refuses an empty map). `kernel_name` names it in
    /// `bpftool map show`.
    pub(crate) fn create(
        set: &str,
        kernel_name: &CString,
        family: Family,
        max_entries: u32,
    ) -> Result<Trie, BpfError> {
        let obj = aya_obj::Map::new_from_params(
            BPF_MAP_TYPE_LPM_TRIE,
            key_size(family),
            1,
            max_entries.max(1),
            BPF_F_NO_PREALLOC,
        );
        let name = kernel_name.to_str().unwrap_or("ipsetmgr_set");
        let data = MapData::create(obj, name, None).map_err(|e| kernel(set, "create trie", e))?;
        Trie::from_map_data(set, family, data)
    }

    /// The trie an outer map's slot holds, checked to be one of `family`.
    pub(crate) fn from_map_data(
        set: &str,
        family: Family,
        data: MapData,
    ) -> Result<Trie, BpfError> {
        let map = Map::from_map_data(data).map_err(|e| kernel(set, "open trie", e))?;
        let trie = Trie { family, map };
        // A wrong type or key size fails here rather than at the first use.
        match family {
            Family::V4 => trie.view::<4>().map(|_| ()),
            Family::V6 => trie.view::<16>().map(|_| ()),
        }
        .map_err(|e| kernel(set, "open trie", e))?;
        Ok(trie)
    }

    pub(crate) fn map_data(&self) -> &MapData {
        match &self.map {
            Map::LpmTrie(d) => d,
            // from_map_data accepted only a trie.
            _ => unreachable!("a Trie holds an LPM trie"),
        }
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.map_data().fd().as_fd()
    }

    pub(crate) fn family(&self) -> Family {
        self.family
    }

    /// The trie's size limit, as the kernel reports it (a set's `maxElem`).
    pub(crate) fn max_entries(&self, set: &str) -> Result<u32, BpfError> {
        Ok(self
            .map_data()
            .info()
            .map_err(|e| kernel(set, "read trie info", e))?
            .max_entries())
    }

    fn view<const N: usize>(&self) -> Result<LpmTrie<&MapData, [u8; N], u8>, MapError> {
        LpmTrie::try_from(&self.map)
    }

    fn view_mut<const N: usize>(&mut self) -> Result<LpmTrie<&mut MapData, [u8; N], u8>, MapError> {
        LpmTrie::try_from(&mut self.map)
    }

    /// Insert or overwrite `e` (a `nomatch` flag that changed is an update
    /// of the value).
    pub(crate) fn insert(&mut self, set: &str, e: &Entry) -> Result<(), BpfError> {
        self.check_family(set, e)?;
        let r = match e.addr() {
            IpAddr::V4(a) => self
                .view_mut::<4>()
                .and_then(|mut t| t.insert(&entry::key4(a, e.prefix()), e.value(), 0)),
            IpAddr::V6(a) => self
                .view_mut::<16>()
                .and_then(|mut t| t.insert(&entry::key6(a, e.prefix()), e.value(), 0)),
        };
        r.map_err(|err| entry_error(set, "add", e, err))
    }

    /// Insert or overwrite every entry of `entries`, in order: batches of
    /// [`BATCH`] entries, one `BPF_MAP_UPDATE_BATCH` each (sys.rs says why),
    /// or one update per entry on a kernel without batch updates for tries.
    /// An entry that fails stops the fill; the ones before it stay written.
    pub(crate) fn insert_all(&mut self, set: &str, entries: &[Entry]) -> Result<(), BpfError> {
        let key_size = key_size(self.family) as usize;
        let mut keys = Vec::with_capacity(key_size * entries.len().min(BATCH));
        let mut values = Vec::with_capacity(entries.len().min(BATCH));
        for (n, chunk) in entries.chunks(BATCH).enumerate() {
            keys.clear();
            values.clear();
            for e in chunk {
                self.check_family(set, e)?;
                keys.extend_from_slice(&u32::from(e.prefix()).to_ne_bytes());
                match e.addr() {
                    IpAddr::V4(a) => keys.extend_from_slice(&a.octets()),
                    IpAddr::V6(a) => keys.extend_from_slice(&a.octets()),
                }
                values.push(e.value());
            }
            match sys::update_batch(self.fd(), &keys, key_size, &values) {
                Ok(()) => {}
                Err(stop) if stop.written == 0 && batch_refused(stop.errno) => {
                    // No batch updates here (or the first entry is refused,
                    // which one update says precisely): one at a time.
                    return entries[n * BATCH..]
                        .iter()
                        .try_for_each(|e| self.insert(set, e));
                }
                Err(stop) => {
                    return Err(BpfError::Entry {
                        set: set.to_string(),
                        op: "add",
                        entry: chunk[stop.written].to_string(),
                        errno: stop.errno,
                    });
                }
            }
        }
        Ok(())
    }

    /// Remove `e`'s network (whatever its value). A network that is not
    /// there is an error (`ENOENT`), as ipset's `del` is.
    pub(crate) fn remove(&mut self, set: &str, e: &Entry) -> Result<(), BpfError> {
        self.check_family(set, e)?;
        let r = match e.addr() {
            IpAddr::V4(a) => self
                .view_mut::<4>()
                .and_then(|mut t| t.remove(&entry::key4(a, e.prefix()))),
            IpAddr::V6(a) => self
                .view_mut::<16>()
                .and_then(|mut t| t.remove(&entry::key6(a, e.prefix()))),
        };
        r.map_err(|err| entry_error(set, "del", e, err))
    }

    /// The value of the most specific entry that covers `addr` (the kernel's
    /// own longest-prefix lookup, with a full-length key); `None` when no
    /// entry does.
    pub(crate) fn lookup(&self, set: &str, addr: IpAddr) -> Result<Option<u8>, BpfError> {
        let r = match addr {
            IpAddr::V4(a) => self.view::<4>().and_then(|t| t.get(&entry::key4(a, 32), 0)),
            IpAddr::V6(a) => self
                .view::<16>()
                .and_then(|t| t.get(&entry::key6(a, 128), 0)),
        };
        match r {
            Ok(v) => Ok(Some(v)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(kernel(set, "lookup", e)),
        }
    }

    /// Every entry, as the kernel holds it, sorted.
    pub(crate) fn dump(&self, set: &str) -> Result<Vec<Entry>, BpfError> {
        let mut out = match self.family {
            Family::V4 => dump_as::<4>(self.view::<4>(), IpAddr::from),
            Family::V6 => dump_as::<16>(self.view::<16>(), IpAddr::from),
        }
        .map_err(|e| kernel(set, "dump", e))?;
        out.sort();
        Ok(out)
    }

    fn check_family(&self, set: &str, e: &Entry) -> Result<(), BpfError> {
        if e.family() == self.family {
            return Ok(());
        }
        Err(BpfError::WrongFamily {
            set: set.to_string(),
            set_family: match self.family {
                Family::V4 => "IPv4",
                Family::V6 => "IPv6",
            },
            entry: e.to_string(),
        })
    }
}

/// Whether a batch update that wrote nothing may have been refused as a
/// whole: `ENOTSUPP` (no batch operations for the map type) or `EINVAL`
/// (no `BPF_MAP_UPDATE_BATCH` at all, before 5.6; or the first entry bad).
fn batch_refused(errno: Errno) -> bool {
    errno == Errno::EINVAL || errno as i32 == sys::ENOTSUPP
}

fn dump_as<const N: usize>(
    trie: Result<LpmTrie<&MapData, [u8; N], u8>, MapError>,
    addr: impl Fn([u8; N]) -> IpAddr,
) -> Result<Vec<Entry>, MapError> {
    trie?
        .iter()
        .map(|kv| {
            kv.map(|(k, v): (Key<[u8; N]>, u8)| entry::from_key(addr(k.data()), k.prefix_len(), v))
        })
        .collect()
}

fn entry_error(set: &str, op: &'static str, e: &Entry, err: MapError) -> BpfError {
    match errno_of(&err) {
        Some(errno) => BpfError::Entry {
            set: set.to_string(),
            op,
            entry: e.to_string(),
            errno,
        },
        None => BpfError::Map {
            set: set.to_string(),
            op,
            source: err,
        },
    }
}
