//! The `nft(8)` backend: every apply is one `nft -j -f -` run (one file is
//! one nf_tables transaction), its JSON built through serde from typed
//! values; listings are `nft -j` output parsed with serde into the same
//! typed values. The fallback where netlink cannot be used, and the oracle
//! the tests hold the netlink backend to.
//!
//! `nft` reports a failed transaction as text without saying which command
//! failed. The failing operation is found by checking (`nft -c`, which
//! runs the transaction in the kernel and aborts it) ever shorter prefixes
//! of the batch, and within a small enough element list the element.
//!
//! What nft 1.0.6's JSON hides is read elsewhere, so that a set of an
//! owned name is seen as the netlink backend sees it: a map is listed as a
//! `map`, not a `set` (read from the table's listing; deleted with `delete
//! map`), and `flags dynamic` is missing from the JSON (read from the text
//! listing's `flags` line, text.rs). Either makes the set one to replace.

mod json;
mod text;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::{NftBatchError, NftDataplane, NftError, NftKernelSet, NftOp, Table, precheck};

/// Element lists up to this long are narrowed down to the failing element.
const NARROW_ELEMENTS_UP_TO: usize = 10_000;

/// The `nft` binary as a backend.
#[derive(Clone, Debug)]
pub struct CliNft {
    program: PathBuf,
}

impl Default for CliNft {
    fn default() -> Self {
        CliNft::new()
    }
}

/// How one `nft` run ended.
struct Run {
    ok: bool,
    stdout: Vec<u8>,
    stderr: String,
}

impl CliNft {
    pub fn new() -> CliNft {
        CliNft::with_program("nft")
    }

    pub fn with_program(program: impl Into<PathBuf>) -> CliNft {
        CliNft {
            program: program.into(),
        }
    }

    fn run(&self, args: &[&str], stdin: Option<&[u8]>) -> Result<Run, NftError> {
        let mut cmd = Command::new(&self.program);
        cmd.args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| {
            NftError::Unavailable(format!(
                "running {}: {e} (is nftables installed?)",
                self.program.display()
            ))
        })?;
        let out = std::thread::scope(|s| {
            if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
                // nft reads all of its input before it answers; a writer
                // thread keeps a full pipe from blocking the reader.
                s.spawn(move || {
                    let _ = pipe.write_all(input);
                });
            }
            child.wait_with_output()
        })
        .map_err(|e| NftError::Unavailable(format!("waiting for nft: {e}")))?;
        Ok(Run {
            ok: out.status.success(),
            stdout: out.stdout,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    fn script_bytes(
        table: &Table,
        ops: &[NftOp<'_>],
        narrow: Option<(usize, std::ops::Range<usize>)>,
        maps: &BTreeSet<String>,
    ) -> Result<Vec<u8>, NftError> {
        let script = json::script(table, ops, narrow, maps);
        serde_json::to_vec(&script)
            .map_err(|e| NftError::Other(format!("an element with no JSON form: {e}")))
    }

    /// Whether `ops` (narrowed) would fail, checked in the kernel.
    fn check_fails(
        &self,
        table: &Table,
        ops: &[NftOp<'_>],
        narrow: Option<(usize, std::ops::Range<usize>)>,
        maps: &BTreeSet<String>,
    ) -> Result<Option<String>, NftError> {
        let bytes = Self::script_bytes(table, ops, narrow, maps)?;
        let run = self.run(&["-c", "-j", "-f", "-"], Some(&bytes))?;
        Ok((!run.ok).then_some(run.stderr))
    }

    /// The first op whose prefix of the batch fails (`None`: none does now).
    fn failing_op(
        &self,
        table: &Table,
        ops: &[NftOp<'_>],
        maps: &BTreeSet<String>,
    ) -> Result<Option<(usize, String)>, NftError> {
        let (mut lo, mut hi) = (0usize, ops.len());
        let mut found = None;
        // Invariant: ops[..lo] passes; the failure is at an index < hi.
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.check_fails(table, &ops[..=mid], None, maps)? {
                Some(stderr) => {
                    found = Some((mid, stderr));
                    hi = mid;
                }
                None => lo = mid + 1,
            }
        }
        Ok(found)
    }

    /// The first element of op `at` that fails, for short element lists.
    fn failing_element(
        &self,
        table: &Table,
        ops: &[NftOp<'_>],
        at: usize,
        maps: &BTreeSet<String>,
    ) -> Result<Option<usize>, NftError> {
        let n = match &ops[at] {
            NftOp::AddElements { elements, .. } | NftOp::DelElements { elements, .. } => {
                elements.len()
            }
            _ => return Ok(None),
        };
        if n > NARROW_ELEMENTS_UP_TO {
            return Ok(None);
        }
        let (mut lo, mut hi) = (0usize, n);
        let mut found = None;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self
                .check_fails(table, &ops[..=at], Some((at, 0..mid + 1)), maps)?
                .is_some()
            {
                found = Some(mid);
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Ok(found)
    }

    fn list_table(&self, table: &Table) -> Result<Option<json::Listing>, NftError> {
        let run = self.run(
            &[
                "-j",
                "-t",
                "list",
                "table",
                table.family.nft_name(),
                &table.name,
            ],
            None,
        )?;
        match self.listing(run) {
            Ok(Some(listing)) => Ok(Some(listing)),
            Ok(None) => self.owned(table).map_or(Ok(None), Err),
            Err(e) => Err(self.owned(table).unwrap_or(e)),
        }
    }

    /// The error for a table another process owns (nf_tables flag
    /// `owner`), when `list table` could not show it: nft 1.0.6 prints
    /// such a table's listing cut short (unreadable JSON), or says it does
    /// not exist once the owner is gone, while `list tables` still names it
    /// with its flags. Without this the error would be about nft's output,
    /// not about the table nobody else may change.
    fn owned(&self, table: &Table) -> Option<NftError> {
        let run = self.run(&["-j", "list", "tables"], None).ok()?;
        let listing = self.listing(run).ok()??;
        let flagged = listing
            .nftables
            .into_iter()
            .filter_map(|i| i.table)
            .any(|t| {
                in_table(table, &t.family, &t.name)
                    && t.flags.is_some_and(|f| !only_harmless_flags(&f))
            });
        flagged.then(|| NftError::TableOwned {
            table: table.to_string(),
            owner: String::new(),
        })
    }

    /// Which of the sets `ops` delete are maps in the table (a map of an
    /// owned name, being replaced): nft deletes those with `delete map`.
    /// No listing when nothing is deleted.
    fn maps_deleted(&self, table: &Table, ops: &[NftOp<'_>]) -> Result<BTreeSet<String>, NftError> {
        let deleted: BTreeSet<&str> = ops
            .iter()
            .filter_map(|o| match o {
                NftOp::DeleteSet { set } => Some(*set),
                _ => None,
            })
            .collect();
        if deleted.is_empty() {
            return Ok(BTreeSet::new());
        }
        let Some(listing) = self.list_table(table)? else {
            return Ok(BTreeSet::new());
        };
        Ok(listing
            .nftables
            .into_iter()
            .filter_map(|i| i.map)
            .filter(|m| in_table(table, &m.family, &m.table) && deleted.contains(m.name.as_str()))
            .map(|m| m.name)
            .collect())
    }

    /// `nft <format> list set FAMILY TABLE NAME` (`-j` JSON, `-t` the text
    /// without elements).
    fn list_set(&self, format: &str, table: &Table, name: &str) -> Result<Run, NftError> {
        let args = [
            format,
            "list",
            "set",
            table.family.nft_name(),
            &table.name,
            name,
        ];
        self.run(&args, None)
    }

    /// The flags of set `name` as nft's text listing prints them (see
    /// text.rs); `Ok(None)` when the set is gone.
    fn text_flags(
        &self,
        table: &Table,
        name: &str,
        comment: Option<&str>,
    ) -> Result<Option<Vec<String>>, NftError> {
        let run = self.list_set("-t", table, name)?;
        if !run.ok {
            if run.stderr.contains("No such file or directory") {
                return Ok(None);
            }
            return Err(errno_error(&run.stderr, None, None));
        }
        let text = String::from_utf8_lossy(&run.stdout);
        text::set_flags(&text, table, name, comment)
            .map(Some)
            .map_err(|why| {
                NftError::Protocol(format!(
                    "nft list set {name} printed text this crate cannot read: {why}"
                ))
            })
    }

    fn listing(&self, run: Run) -> Result<Option<json::Listing>, NftError> {
        if !run.ok {
            if run.stderr.contains("No such file or directory") {
                return Ok(None);
            }
            return Err(errno_error(&run.stderr, None, None));
        }
        serde_json::from_slice(&run.stdout).map(Some).map_err(|e| {
            NftError::Protocol(format!("nft -j printed what this crate cannot read: {e}"))
        })
    }
}

/// Whether a table's flags (as `nft -j` prints them) are only ones that
/// leave it readable: `dormant` and `persist`. Anything else (`owner`, or
/// the garbled string nft 1.0.6 prints for any flag) is not.
fn only_harmless_flags(flags: &serde_json::Value) -> bool {
    let harmless = |v: &serde_json::Value| matches!(v.as_str(), Some("dormant" | "persist"));
    match flags {
        serde_json::Value::Array(a) => a.iter().all(harmless),
        v => harmless(v),
    }
}

/// Whether a listed object's family and table are `table`'s.
fn in_table(table: &Table, family: &str, name: &str) -> bool {
    name == table.name && family == table.family.nft_name()
}

/// The errno `nft` names in "Error: Could not process rule: <strerror>".
fn errno_of(stderr: &str) -> Option<i32> {
    const CANDIDATES: [i32; 16] = [
        libc::ENOENT,
        libc::EEXIST,
        libc::EBUSY,
        libc::ENFILE,
        libc::EOPNOTSUPP,
        libc::EINVAL,
        libc::EPERM,
        libc::EACCES,
        libc::ENOMEM,
        libc::ENOBUFS,
        libc::ENOTEMPTY,
        libc::E2BIG,
        libc::ERANGE,
        libc::EAFNOSUPPORT,
        libc::EPROTONOSUPPORT,
        libc::EMSGSIZE,
    ];
    CANDIDATES.into_iter().find(|&e| {
        let text = std::io::Error::from_raw_os_error(e).to_string();
        let text = text.split(" (os error").next().unwrap_or(&text);
        stderr.contains(&format!(": {text}"))
    })
}

/// The first line of nft's error output (for messages).
fn first_error_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.contains("Error:"))
        .or_else(|| stderr.lines().next())
        .unwrap_or("")
        .trim()
}

/// nft's error text as a typed error, for `op` when known.
fn errno_error(stderr: &str, op: Option<&NftOp<'_>>, element: Option<String>) -> NftError {
    let set = op.and_then(|o| o.set()).unwrap_or("").to_string();
    let line = first_error_line(stderr).to_string();
    // nft's own checks, before the kernel sees anything.
    if stderr.contains("interval overlaps") || stderr.contains("conflicting intervals") {
        return NftError::ElementExists {
            set,
            element: element.unwrap_or_else(|| "(not named by nft)".into()),
        };
    }
    match errno_of(stderr) {
        Some(libc::ENOENT) => match (op, element) {
            (Some(NftOp::DelElements { .. }), Some(element)) => {
                NftError::ElementMissing { set, element }
            }
            (Some(NftOp::DelElements { .. }), None) => NftError::ElementMissing {
                set,
                element: "(not named by nft)".into(),
            },
            _ => NftError::SetMissing(set),
        },
        Some(libc::EEXIST | libc::ENOTEMPTY) => match op {
            Some(NftOp::CreateSet { .. }) => NftError::SetExists(set),
            _ => NftError::ElementExists {
                set,
                element: element.unwrap_or_else(|| "(not named by nft)".into()),
            },
        },
        Some(libc::EBUSY) => NftError::InUse(set),
        Some(libc::ENFILE) => NftError::SetFull(set),
        Some(libc::EOPNOTSUPP | libc::EAFNOSUPPORT | libc::EPROTONOSUPPORT) => {
            NftError::NotSupported(line)
        }
        Some(libc::EPERM | libc::EACCES) => NftError::Unavailable(
            "permission denied: nft needs CAP_NET_ADMIN in this network namespace".into(),
        ),
        Some(libc::ENOMEM | libc::ENOBUFS) => NftError::Unavailable(line),
        // nft's own refusals (a value of another type) have no errno.
        _ => match element {
            Some(element) => NftError::InvalidElement {
                set,
                element,
                reason: line,
            },
            None => NftError::Other(line),
        },
    }
}

impl NftDataplane for CliNft {
    fn name(&self) -> &'static str {
        "cli"
    }

    fn apply(
        &mut self,
        table: &Table,
        ops: &[NftOp<'_>],
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<(), NftBatchError> {
        precheck(table, ops, owned)?;
        let maps = self
            .maps_deleted(table, ops)
            .map_err(NftBatchError::whole)?;
        let script = json::script(table, ops, None, &maps);
        if script.nftables.is_empty() {
            return Ok(()); // nothing to change: no transaction at all
        }
        let bytes = serde_json::to_vec(&script).map_err(|e| {
            NftBatchError::whole(NftError::Other(format!(
                "an element with no JSON form: {e}"
            )))
        })?;
        let run = self
            .run(&["-j", "-f", "-"], Some(&bytes))
            .map_err(NftBatchError::whole)?;
        if run.ok {
            return Ok(());
        }
        // Nothing was applied; find out which op (and element) failed.
        let Some((at, stderr)) = self
            .failing_op(table, ops, &maps)
            .map_err(NftBatchError::whole)?
        else {
            return Err(NftBatchError::whole(errno_error(&run.stderr, None, None)));
        };
        let element_index = self
            .failing_element(table, ops, at, &maps)
            .map_err(NftBatchError::whole)?;
        let element = element_index.and_then(|i| match &ops[at] {
            NftOp::AddElements { elements, .. } | NftOp::DelElements { elements, .. } => {
                elements.get(i).map(|e| e.to_string())
            }
            _ => None,
        });
        let mut error = errno_error(&stderr, Some(&ops[at]), element);
        // ENOENT: a missing table reads as a missing set; tell them apart
        // (no earlier op of this batch created the table: it failed whole).
        if matches!(error, NftError::SetMissing(_))
            && !ops[..at].iter().any(|o| matches!(o, NftOp::EnsureTable))
            && self
                .list_table(table)
                .map_err(NftBatchError::whole)?
                .is_none()
        {
            error = NftError::TableMissing(table.to_string());
        }
        Err(NftBatchError {
            op_index: Some(at),
            element_index,
            error,
        })
    }

    fn list_sets(
        &mut self,
        table: &Table,
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<Option<Vec<String>>, NftError> {
        let Some(listing) = self.list_table(table)? else {
            return Ok(None);
        };
        let mut names: Vec<String> = listing
            .nftables
            .into_iter()
            // Maps are never listed (as by the netlink backend): a map of an
            // owned name is only read, and replaced, when a policy wants it.
            .filter_map(|i| i.set)
            .filter(|s| in_table(table, &s.family, &s.table))
            .filter(|s| owned(&s.name))
            .map(|s| s.name)
            .collect();
        names.sort();
        names.dedup();
        Ok(Some(names))
    }

    /// A set as `nft -j list set` lists it, with the flags its JSON leaves
    /// out (`flags dynamic` on nft 1.0.6) taken from the text listing; a
    /// map of that name as the table's listing shows it, `map` first in its
    /// unmanaged (the netlink backend's word): a foreign shape, replaced.
    fn read_set(&mut self, table: &Table, name: &str) -> Result<Option<NftKernelSet>, NftError> {
        if !crate::is_valid_name(name) || !crate::is_valid_name(&table.name) {
            return Ok(None);
        }
        let run = self.list_set("-j", table, name)?;
        // nft 1.0.6 refuses `list set` of a map (ENOENT): `None` here, and
        // the map is then found in the table's listing.
        let set = self
            .listing(run)?
            .and_then(|l| l.nftables.into_iter().find_map(|i| i.set))
            .filter(|s| s.name == name && in_table(table, &s.family, &s.table));
        let found = match set {
            Some(mut set) => {
                let Some(flags) = self.text_flags(table, name, set.comment.as_deref())? else {
                    return Ok(None); // deleted between the two reads
                };
                for f in flags {
                    if !set.flags.contains(&f) {
                        set.flags.push(f);
                    }
                }
                let spec = set.spec();
                let (elements, unreadable) = match &spec {
                    Some(spec) => {
                        let (e, bad) = set.elements(spec);
                        (Some(e), bad)
                    }
                    None => (None, 0),
                };
                Some(NftKernelSet {
                    name: set.name.clone(),
                    handle: set.handle,
                    spec,
                    unmanaged: set.unmanaged(),
                    elements,
                    unreadable_elements: unreadable,
                    references: 0,
                })
            }
            None => None,
        };
        let Some(listing) = self.list_table(table)? else {
            return Ok(None); // the table is gone
        };
        let found = found.or_else(|| {
            listing
                .nftables
                .iter()
                .filter_map(|i| i.map.as_ref())
                .find(|m| m.name == name && in_table(table, &m.family, &m.table))
                .map(|m| NftKernelSet {
                    name: m.name.clone(),
                    handle: m.handle,
                    spec: m.spec(),
                    unmanaged: m.unmanaged(),
                    // Its elements are key : data pairs, never ours.
                    elements: None,
                    unreadable_elements: 0,
                    references: 0,
                })
        });
        let Some(mut found) = found else {
            return Ok(None);
        };
        found.references = listing
            .nftables
            .iter()
            .filter_map(|i| i.rule.as_ref())
            .filter(|r| r.table == table.name && json::references(&r.expr, name))
            .count() as u32;
        Ok(Some(found))
    }

    fn table_has_foreign_objects(
        &mut self,
        table: &Table,
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<bool, NftError> {
        let Some(listing) = self.list_table(table)? else {
            return Ok(false);
        };
        Ok(listing.nftables.iter().any(|i| {
            i.map.is_some()
                || i.rule.is_some()
                || !i.other.is_empty()
                || i.set.as_ref().is_some_and(|s| !owned(&s.name))
        }))
    }
}

#[cfg(test)]
mod tests;
