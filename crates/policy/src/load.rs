//! Reading policies from multi-document YAML files, JSON files and
//! directories. JSON (`*.json`: one policy object or an array of them) is
//! for machine-generated lists: it parses about 20 times faster than YAML,
//! which matters for policies with millions of members.

use std::collections::{BTreeMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::yaml_lift;
use crate::compile::{MemberList, OwnedMembers};
use ipsetmgr_api::de::integer;
use ipsetmgr_api::member_source::MemberSource;
use ipsetmgr_api::policy::{FamilySpec, IPSetPolicy, IPSetPolicySpec};
use ipsetmgr_api::{IPSetMemberSlice, IPSetMemberSliceSpec, POLICY_LABEL};
use ipsetmgr_ipset::SetType;
use kube::Resource;

/// The most bytes read from one policy file. A million IPv4 members are
/// about 15 MB of YAML; the bound is there so that a path to `/dev/zero` or
/// a runaway generator fails with a clear error instead of exhausting memory.
pub const MAX_FILE_BYTES: u64 = 256 << 20;
/// Kubernetes object names are DNS subdomains of at most this many bytes.
const MAX_NAME_LEN: usize = 253;
/// Parser messages can quote input; they are cut to this many bytes.
const MAX_MESSAGE_LEN: usize = 1000;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a regular file ({kind}); skipped")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path}: larger than {limit} bytes; not read (policy files are bounded)")]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("{path}: not valid UTF-8 (byte {offset})")]
    NotUtf8 { path: PathBuf, offset: usize },
    #[error(
        "{path}: contains no policies (an empty or truncated file is an error, never zero policies; delete the file to remove its policies)"
    )]
    NoPolicies { path: PathBuf },
    #[error("{path}: {message}")]
    Yaml { path: PathBuf, message: String },
    #[error("{path}: document {index}: {message}")]
    Document {
        path: PathBuf,
        index: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{0}: no policy files (*.yaml, *.yml, *.json) found")]
    Empty(PathBuf),
    #[error(
        "{path}: IPSetMemberSlice {slice:?} belongs to policy {policy:?}, which no policy file defines"
    )]
    OrphanSlice {
        path: PathBuf,
        slice: String,
        policy: String,
    },
    #[error("IPSetMemberSlice {slice:?} is defined twice: in {first} and in {second}")]
    DuplicateSlice {
        slice: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("members of policy {policy:?}: {message}")]
    MemberList { policy: String, message: String },
}

/// One document of a policy file. Unknown fields are errors: a typo such as
/// `member:` must not quietly yield an empty set.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Document {
    api_version: Option<String>,
    kind: Option<String>,
    metadata: Option<Metadata>,
    spec: Option<AnySpec>,
}

/// A document's spec before its kind is known: the fields of an
/// IPSetPolicy's spec, of which an IPSetMemberSlice's is a part (its
/// members). Read in one pass, so a big list is never buffered to be read
/// again; each kind then refuses what is not its own.
///
/// Why not `IPSetPolicySpec` itself: `kind` may come after `spec`, and a
/// slice's spec has no `type` (required in a policy's) and must refuse a
/// `family` that was written (a policy's defaults it, so it cannot tell).
/// Telling the kinds apart first would mean buffering the spec (serde's
/// `flatten` or `untagged` do) and a million members with it. The tests
/// below fail when `IPSetPolicySpec` gains a field this does not read and
/// pass on.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AnySpec {
    #[serde(rename = "type")]
    set_type: Option<SetType>,
    family: Option<FamilySpec>,
    #[serde(default)]
    members: Vec<String>,
    node_selector: Option<LabelSelector>,
    #[serde(default, deserialize_with = "integer")]
    max_elem: Option<u32>,
    #[serde(default, deserialize_with = "integer")]
    hash_size: Option<u32>,
    /// Kept as written: which sources work in files is decided by
    /// `sources::spec::parse_sources`, which names the file's policy.
    #[serde(default)]
    members_from: Vec<MemberSource>,
    range: Option<String>,
    netmask: Option<u8>,
    bitmask: Option<String>,
    #[serde(default)]
    except: Vec<String>,
}

/// A spec that is not its kind's (shown after the document's path and index).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum SpecError {
    #[error("spec.type is required")]
    NoType,
    /// A policy's field in a slice.
    #[error(
        "spec.{0} is not a field of an IPSetMemberSlice (only members; the policy says the rest)"
    )]
    NotASliceField(&'static str),
}

impl AnySpec {
    fn into_policy(self) -> Result<IPSetPolicySpec, SpecError> {
        let set_type = self.set_type.ok_or(SpecError::NoType)?;
        Ok(IPSetPolicySpec {
            node_selector: self.node_selector,
            max_elem: self.max_elem,
            hash_size: self.hash_size,
            members_from: self.members_from,
            range: self.range,
            netmask: self.netmask,
            bitmask: self.bitmask,
            except: self.except,
            ..IPSetPolicySpec::new(set_type, self.family.unwrap_or_default(), self.members)
        })
    }

    /// Every field but `members` (a policy's own), and whether the
    /// document set it.
    fn policy_fields(&self) -> [(&'static str, bool); 10] {
        [
            ("type", self.set_type.is_some()),
            ("family", self.family.is_some()),
            ("nodeSelector", self.node_selector.is_some()),
            ("maxElem", self.max_elem.is_some()),
            ("hashSize", self.hash_size.is_some()),
            ("membersFrom", !self.members_from.is_empty()),
            ("range", self.range.is_some()),
            ("netmask", self.netmask.is_some()),
            ("bitmask", self.bitmask.is_some()),
            ("except", !self.except.is_empty()),
        ]
    }

    fn into_slice(self) -> Result<IPSetMemberSliceSpec, SpecError> {
        if let Some((field, _)) = self.policy_fields().iter().find(|(_, set)| *set) {
            return Err(SpecError::NotASliceField(field));
        }
        Ok(IPSetMemberSliceSpec {
            members: self.members,
        })
    }
}

/// What a policy file's metadata may say. Labels (a slice's names its
/// policy) and annotations are accepted, so a manifest written for the
/// cluster also loads.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    name: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    #[allow(dead_code)]
    annotations: BTreeMap<String, String>,
}

/// A policy with the file it came from, for error messages.
#[derive(Clone, Debug)]
pub struct LoadedPolicy {
    /// Its `spec.members` are empty when they are in `lifted`.
    pub policy: IPSetPolicy,
    /// The policy's members, one per line, when the file held them as a
    /// big block of plain members (see `yaml_lift`).
    pub lifted: Option<String>,
    pub source: PathBuf,
}

impl LoadedPolicy {
    /// The policy's own members, wherever they are kept.
    pub fn members(&self) -> MemberList<'_> {
        match &self.lifted {
            Some(lines) => MemberList::Lines(lines),
            None => MemberList::Strings(&self.policy.spec.members),
        }
    }
}

/// A member slice from a file, with the policy its label names.
#[derive(Clone, Debug)]
pub struct LoadedSlice {
    pub name: String,
    pub policy: String,
    pub members: OwnedMembers,
    pub source: PathBuf,
    /// A plain member list (`--members`), named after its file, rather
    /// than an IPSetMemberSlice object: one list may feed several policies.
    pub from_list: bool,
}

/// What one file (or text) holds.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    pub policies: Vec<LoadedPolicy>,
    pub slices: Vec<LoadedSlice>,
}

/// The policy files under one path, and what could not be used.
#[derive(Debug, Default)]
pub struct Found {
    pub files: Vec<PathBuf>,
    pub errors: Vec<LoadError>,
}

fn has_policy_extension(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
}

fn is_hidden(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with('.'))
}

/// What a non-regular, non-directory file is, for messages.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_dir() {
        // Reached by a reader given a directory (a member list's path).
        "a directory"
    } else {
        "not a file"
    }
}

/// A file's identity, so that one reached through several names (symlinks,
/// a looping directory) is read once.
fn identity(meta: &std::fs::Metadata) -> (u64, u64) {
    (meta.dev(), meta.ino())
}

/// Policy files at `path`: the file itself, or every `*.yaml`/`*.yml`/
/// `*.json` below a directory (hidden names skipped), sorted so runs are
/// reproducible. Symlinks are followed, but each real directory is walked
/// once and each real file listed once, so symlink loops neither repeat
/// files nor hang the walk. FIFOs, sockets and devices are never opened:
/// opening a FIFO blocks until a writer appears.
pub fn policy_files(path: &Path) -> Found {
    let mut found = Found::default();
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(source) => {
            found.errors.push(LoadError::Io {
                path: path.to_path_buf(),
                source,
            });
            return found;
        }
    };
    if meta.is_file() {
        found.files.push(path.to_path_buf());
        return found;
    }
    if !meta.is_dir() {
        found.errors.push(LoadError::NotRegular {
            path: path.to_path_buf(),
            kind: file_kind(&meta),
        });
        return found;
    }
    let mut walked: HashSet<(u64, u64)> = HashSet::new();
    let mut listed: HashSet<(u64, u64)> = HashSet::new();
    let mut stack = vec![(path.to_path_buf(), identity(&meta))];
    while let Some((dir, id)) = stack.pop() {
        if !walked.insert(id) {
            continue;
        }
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(source) => {
                found.errors.push(LoadError::Io { path: dir, source });
                continue;
            }
        };
        for entry in entries {
            let p = match entry {
                Ok(e) => e.path(),
                Err(source) => {
                    found.errors.push(LoadError::Io {
                        path: dir.clone(),
                        source,
                    });
                    continue;
                }
            };
            if is_hidden(&p) {
                continue;
            }
            match std::fs::metadata(&p) {
                Ok(m) if m.is_dir() => stack.push((p, identity(&m))),
                _ if !has_policy_extension(&p) => {}
                Ok(m) if m.is_file() => {
                    if listed.insert(identity(&m)) {
                        found.files.push(p);
                    }
                }
                Ok(m) => found.errors.push(LoadError::NotRegular {
                    path: p,
                    kind: file_kind(&m),
                }),
                // A dangling symlink with a policy name: say so.
                Err(source) => found.errors.push(LoadError::Io { path: p, source }),
            }
        }
    }
    found.files.sort();
    found
}

/// The most YAML nodes a file may hold (members are one node each).
const MAX_YAML_NODES: usize = 20_000_000;

pub(crate) fn yaml_options() -> serde_saphyr::Options {
    // Policies may carry millions of members: raise the node and scalar
    // budgets (the defaults protect configs of a few hundred thousand nodes)
    // while keeping every other protection of the parser.
    let mut budget = serde_saphyr::Budget::default();
    budget.max_events = 40_000_000;
    budget.max_nodes = MAX_YAML_NODES;
    budget.max_total_scalar_bytes = 1 << 30;
    budget.max_reader_input_bytes = Some(1 << 30);
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    // Aliases have no business in member lists: a tenth of the parser's
    // default replay allowance rejects an alias bomb ten times sooner.
    options.alias_limits.max_total_replayed_events = 100_000;
    options.alias_limits.max_replay_stack_depth = 16;
    options
}

/// A parser message, bounded: parsers quote input, and a policy file may
/// hold a megabyte on one line.
pub(crate) fn bounded(message: String) -> String {
    crate::text::bounded(&message, MAX_MESSAGE_LEN).into_owned()
}

pub(crate) fn strip_bom(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

/// Parse every `IPSetPolicy` and `IPSetMemberSlice` document of one YAML
/// text.
pub fn parse_policies(text: &str, path: &Path) -> Result<Loaded, LoadError> {
    let text = strip_bom(text);
    if let Some(docs) = parse_lifted(text) {
        return policies_of(docs, path);
    }
    let docs = parse_yaml_documents(text).map_err(|e| LoadError::Yaml {
        path: path.to_path_buf(),
        message: bounded(e.to_string()),
    })?;
    policies_of(as_parsed(docs), path)
}

/// The documents of a YAML text. Empty documents (`---` alone, `~`) are not
/// policies; a file of nothing but those is refused later like an empty
/// file.
fn parse_yaml_documents(text: &str) -> Result<Vec<Document>, serde_saphyr::Error> {
    let docs: Vec<Option<Document>> =
        serde_saphyr::from_multiple_with_options(text, yaml_options())?;
    Ok(docs.into_iter().flatten().collect())
}

/// The documents, parsed with their big member blocks lifted out (see
/// `yaml_lift`); `None` when there is nothing to lift or anything is not
/// as expected, and the text as written must be parsed instead.
fn parse_lifted(text: &str) -> Option<Vec<(Document, Option<String>)>> {
    parse_lifted_from(text, yaml_lift::MIN_LIFTED)
}

/// [`parse_lifted`] for blocks of at least `min` members. Each document
/// comes with the members lifted out of it, if any, one per line.
fn parse_lifted_from(text: &str, min: usize) -> Option<Vec<(Document, Option<String>)>> {
    let lifted = yaml_lift::lift(text, min, MAX_YAML_NODES)?;
    let mut docs = parse_yaml_documents(&lifted.text).ok()?;
    let members = docs
        .iter_mut()
        .filter_map(|d| d.spec.as_mut())
        .map(|s| &mut s.members);
    let mut taken = lifted.take_back(members)?.into_iter();
    Some(
        docs.into_iter()
            .map(|d| {
                let lines = if d.spec.is_some() {
                    taken.next().flatten()
                } else {
                    None
                };
                (d, lines)
            })
            .collect(),
    )
}

/// Documents as the parser gave them: nothing lifted.
fn as_parsed(docs: Vec<Document>) -> Vec<(Document, Option<String>)> {
    docs.into_iter().map(|d| (d, None)).collect()
}

/// Parse a JSON text: one policy (or slice) object, or an array of them.
pub fn parse_json_policies(text: &str, path: &Path) -> Result<Loaded, LoadError> {
    let text = strip_bom(text);
    let docs = if text.trim_start().starts_with('[') {
        serde_json::from_str::<Vec<Document>>(text)
    } else {
        serde_json::from_str::<Document>(text).map(|d| vec![d])
    }
    .map_err(|e| LoadError::Json {
        path: path.to_path_buf(),
        message: bounded(e.to_string()),
    })?;
    policies_of(as_parsed(docs), path)
}

/// The policies and slices of a file's documents, each with the members
/// lifted out of it (one per line), if any.
fn policies_of(docs: Vec<(Document, Option<String>)>, path: &Path) -> Result<Loaded, LoadError> {
    if docs.is_empty() {
        return Err(LoadError::NoPolicies {
            path: path.to_path_buf(),
        });
    }
    let api_version = IPSetPolicy::api_version(&());
    let policy_kind = IPSetPolicy::kind(&());
    let slice_kind = IPSetMemberSlice::kind(&());
    let mut out = Loaded::default();
    for (i, (doc, lifted)) in docs.into_iter().enumerate() {
        let index = i + 1;
        let bad = |message: String| LoadError::Document {
            path: path.to_path_buf(),
            index,
            message,
        };
        let kind = doc.kind.as_deref().unwrap_or_default();
        if doc.api_version.as_deref() != Some(&*api_version)
            || (kind != policy_kind && kind != slice_kind)
        {
            return Err(bad(format!(
                "expected apiVersion {api_version} and kind {policy_kind} or {slice_kind}, found {} {}",
                doc.api_version.as_deref().map_or("(none)", shorten),
                doc.kind.as_deref().map_or("(none)", shorten)
            )));
        }
        let metadata = doc
            .metadata
            .ok_or_else(|| bad("metadata.name is required".into()))?;
        let name = metadata
            .name
            .ok_or_else(|| bad("metadata.name is required".into()))?;
        if name.len() > MAX_NAME_LEN {
            return Err(bad(format!(
                "metadata.name {:?}... is {} bytes long; at most {MAX_NAME_LEN}",
                shorten(&name),
                name.len()
            )));
        }
        let spec = doc
            .spec
            .ok_or_else(|| bad(format!("{kind} {name:?} has no spec")))?;
        if kind == policy_kind {
            let spec = spec.into_policy().map_err(|e| bad(e.to_string()))?;
            out.policies.push(LoadedPolicy {
                policy: IPSetPolicy::new(&name, spec),
                lifted,
                source: path.to_path_buf(),
            });
        } else {
            let policy = metadata.labels.get(POLICY_LABEL).cloned().ok_or_else(|| {
                bad(format!(
                    "slice {name:?} has no label {POLICY_LABEL} naming its policy"
                ))
            })?;
            let spec = spec.into_slice().map_err(|e| bad(e.to_string()))?;
            out.slices.push(LoadedSlice {
                name,
                policy,
                members: match lifted {
                    Some(lines) => OwnedMembers::Lines(lines),
                    None => OwnedMembers::Strings(spec.members),
                },
                source: path.to_path_buf(),
                from_list: false,
            });
        }
    }
    Ok(out)
}

/// The first characters of a value shown in a message.
fn shorten(s: &str) -> &str {
    let mut cut = s.len().min(40);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// Load every policy from a file or directory; any file that does not load
/// is an error.
pub fn load_policies(path: &Path) -> Result<Vec<LoadedPolicy>, LoadError> {
    let found = policy_files(path);
    if let Some(e) = found.errors.into_iter().next() {
        return Err(e);
    }
    if found.files.is_empty() {
        return Err(LoadError::Empty(path.to_path_buf()));
    }
    let mut all = Vec::new();
    for f in found.files {
        all.extend(load_file(&f)?.policies);
    }
    Ok(all)
}

/// Read at most [`MAX_FILE_BYTES`] of a regular file. The file is opened
/// non-blocking, so a FIFO put in its place after the directory walk cannot
/// hang the caller either; anything but a regular file is refused.
pub(crate) fn read_bounded(f: &Path) -> Result<Vec<u8>, LoadError> {
    let io = |source| LoadError::Io {
        path: f.to_path_buf(),
        source,
    };
    let file: File = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(f)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(LoadError::NotRegular {
            path: f.to_path_buf(),
            kind: file_kind(&meta),
        });
    }
    // The size first: a 300 MiB (or sparse) file is refused without
    // reading 256 MiB of it. The bounded read below still holds for a file
    // that grows while it is read.
    if meta.len() > MAX_FILE_BYTES {
        return Err(LoadError::TooLarge {
            path: f.to_path_buf(),
            limit: MAX_FILE_BYTES,
        });
    }
    if meta.len() >= PARALLEL_READ_MIN {
        // A file that shrinks meanwhile is read again, the plain way.
        if let Ok(bytes) = read_halves(&file, meta.len() as usize) {
            return read_rest(&file, bytes, f);
        }
    }
    read_limited(file, f, meta.len())
}

/// Files of at least this many bytes are read in two halves at once.
const PARALLEL_READ_MIN: u64 = 8 << 20;

/// The first `len` bytes of `file`, the second half read on a thread of
/// its own: the buffer's pages are then touched (each a page fault) and
/// filled from the page cache on two cores. The zeroed buffer is only
/// mapped, not written, until the reads write it.
fn read_halves(file: &File, len: usize) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut bytes = vec![0u8; len];
    let (first, second) = bytes.split_at_mut(len / 2);
    std::thread::scope(|scope| {
        let second = scope.spawn(|| file.read_exact_at(second, (len / 2) as u64));
        let first = file.read_exact_at(first, 0);
        let second = second
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        first.and(second)
    })?;
    Ok(bytes)
}

/// `bytes`, the start of `file`, with what follows it (a file that grew
/// while it was read), at most [`MAX_FILE_BYTES`] in all.
fn read_rest(mut file: &File, bytes: Vec<u8>, path: &Path) -> Result<Vec<u8>, LoadError> {
    use std::io::{Seek, SeekFrom};
    file.seek(SeekFrom::Start(bytes.len() as u64))
        .map_err(|source| LoadError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    read_on(file, path, bytes)
}

/// Read at most [`MAX_FILE_BYTES`] from `reader` (an opened file, or
/// standard input, which has no size to check first); `path` names it in
/// errors and `size_hint` sizes the buffer.
pub fn read_limited(reader: impl Read, path: &Path, size_hint: u64) -> Result<Vec<u8>, LoadError> {
    let bytes = Vec::with_capacity(size_hint.min(MAX_FILE_BYTES) as usize + 1);
    read_on(reader, path, bytes)
}

/// `bytes` with the rest of `reader` after them, at most
/// [`MAX_FILE_BYTES`] in all.
fn read_on(reader: impl Read, path: &Path, mut bytes: Vec<u8>) -> Result<Vec<u8>, LoadError> {
    let room = (MAX_FILE_BYTES + 1).saturating_sub(bytes.len() as u64);
    reader
        .take(room)
        .read_to_end(&mut bytes)
        .map_err(|source| LoadError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(LoadError::TooLarge {
            path: path.to_path_buf(),
            limit: MAX_FILE_BYTES,
        });
    }
    Ok(bytes)
}

/// Load the policies and slices of one file: JSON for `*.json`, YAML
/// otherwise.
pub fn load_file(f: &Path) -> Result<Loaded, LoadError> {
    let bytes = read_bounded(f)?;
    // simdutf8: std's check is a few ms of a 16 MB file; its `compat`
    // errors say where the bad bytes start, as std's do.
    let text = simdutf8::compat::from_utf8(&bytes).map_err(|e| LoadError::NotUtf8 {
        path: f.to_path_buf(),
        offset: e.valid_up_to(),
    })?;
    if f.extension().is_some_and(|e| e == "json") {
        parse_json_policies(text, f)
    } else {
        parse_policies(text, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipsetmgr_ipset::SetType;
    use std::collections::BTreeSet;

    /// The field names `T`'s derived `Deserialize` reads: what it passes
    /// to `deserialize_struct` (caught here, nothing is deserialized).
    fn serde_fields<T: serde::de::DeserializeOwned>() -> BTreeSet<&'static str> {
        use serde::de::{Error, Visitor, value};
        struct Names<'a>(&'a mut &'static [&'static str]);
        impl<'de> serde::Deserializer<'de> for Names<'_> {
            type Error = value::Error;
            fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, value::Error> {
                Err(value::Error::custom("not a struct"))
            }
            fn deserialize_struct<V: Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, value::Error> {
                *self.0 = fields;
                Err(value::Error::custom("names read"))
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
                bytes byte_buf option unit unit_struct newtype_struct seq tuple
                tuple_struct map enum identifier ignored_any
            }
        }
        let mut fields: &'static [&'static str] = &[];
        let _ = T::deserialize(Names(&mut fields));
        assert!(
            !fields.is_empty(),
            "{} is not a struct",
            std::any::type_name::<T>()
        );
        fields.iter().copied().collect()
    }

    /// A policy file reads every field of a policy's spec, and a slice's
    /// refuses each one but `members`: a field added to `IPSetPolicySpec`
    /// and not to `AnySpec` (and its `policy_fields`) fails here.
    #[test]
    fn any_spec_reads_exactly_the_fields_of_a_policy_spec() {
        let policy = serde_fields::<IPSetPolicySpec>();
        assert_eq!(serde_fields::<AnySpec>(), policy);
        let any: AnySpec = serde_json::from_value(serde_json::json!({})).unwrap();
        let mut refused_in_slices: BTreeSet<&str> =
            any.policy_fields().iter().map(|(f, _)| *f).collect();
        refused_in_slices.insert("members");
        assert_eq!(refused_in_slices, policy);
    }

    /// A spec with every field set (a struct literal: a new field does not
    /// compile until it is set here) comes out of a policy file as it went
    /// in, and out of no slice.
    #[test]
    fn a_policy_spec_with_every_field_set_survives_a_policy_file() {
        let spec = IPSetPolicySpec {
            set_type: SetType::HashIp,
            family: FamilySpec::Dual,
            members: vec!["10.0.0.1".into()],
            node_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("role".into(), "edge".into())])),
                ..LabelSelector::default()
            }),
            max_elem: Some(1000),
            hash_size: Some(1024),
            members_from: vec![
                serde_json::from_value(serde_json::json!({"url": {"url": "https://x.example/l"}}))
                    .unwrap(),
            ],
            range: Some("10.0.0.0/24".into()),
            netmask: Some(24),
            bitmask: Some("255.255.0.255".into()),
            except: vec!["10.0.0.0/30".into()],
        };
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            json.as_object().unwrap().len(),
            serde_fields::<IPSetPolicySpec>().len(),
            "every field is set: {json}"
        );
        let any: AnySpec = serde_json::from_value(json.clone()).unwrap();
        assert!(any.policy_fields().iter().all(|(_, set)| *set));
        assert_eq!(any.into_policy().unwrap(), spec);
        let any: AnySpec = serde_json::from_value(json).unwrap();
        assert!(any.into_slice().is_err());
    }

    #[test]
    fn multi_document_files_parse() {
        let text = "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata: {name: a}\nspec: {type: hash:ip, members: [10.0.0.1]}\n---\napiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata: {name: b}\nspec:\n  type: hash:net\n  family: Dual\n  members: [\"::/0\"]\n";
        let got = parse_policies(text, Path::new("x.yaml")).unwrap().policies;
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].policy.spec.set_type, SetType::HashNet);
        assert_eq!(got[1].policy.metadata.name.as_deref(), Some("b"));
    }

    #[test]
    fn json_object_and_array_parse() {
        let one = r#"{"apiVersion":"ipsetmgr.io/v1alpha1","kind":"IPSetPolicy","metadata":{"name":"j"},"spec":{"type":"hash:ip","members":["10.0.0.1"]}}"#;
        assert_eq!(
            parse_json_policies(one, Path::new("j.json"))
                .unwrap()
                .policies
                .len(),
            1
        );
        let many = format!("[{one},{}]", one.replace("\"j\"", "\"k\""));
        let got = parse_json_policies(&many, Path::new("j.json"))
            .unwrap()
            .policies;
        assert_eq!(got[1].policy.metadata.name.as_deref(), Some("k"));
        let e = parse_json_policies("{\"kind\":", Path::new("bad.json")).unwrap_err();
        assert!(e.to_string().starts_with("bad.json: "), "{e}");
    }

    const HEAD: &str = "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata: {name: a}\n";

    fn yaml(body: &str) -> Result<Vec<LoadedPolicy>, LoadError> {
        parse_policies(&format!("{HEAD}{body}"), Path::new("p.yaml")).map(|l| l.policies)
    }

    #[test]
    fn empty_files_are_errors_never_zero_policies() {
        for text in [
            "",
            "---\n",
            "~\n",
            "---\n~\n---\n",
            "# only a comment\n",
            "\u{feff}",
        ] {
            let e = parse_policies(text, Path::new("e.yaml")).unwrap_err();
            assert!(matches!(e, LoadError::NoPolicies { .. }), "{text:?}: {e}");
            assert!(
                e.to_string().starts_with("e.yaml: contains no policies"),
                "{e}"
            );
        }
        for text in ["[]", " [ ] "] {
            let e = parse_json_policies(text, Path::new("e.json")).unwrap_err();
            assert!(matches!(e, LoadError::NoPolicies { .. }), "{text:?}: {e}");
        }
        assert!(parse_json_policies("", Path::new("e.json")).is_err());
        // An empty document next to a policy is just a separator.
        let two = format!("---\n{HEAD}spec: {{type: hash:ip}}\n---\n");
        assert_eq!(
            parse_policies(&two, Path::new("x.yaml"))
                .unwrap()
                .policies
                .len(),
            1
        );
    }

    #[test]
    fn unknown_fields_are_errors_naming_the_field() {
        let e = yaml("spec:\n  type: hash:ip\n  member: [10.0.0.1]\n").unwrap_err();
        assert!(e.to_string().contains("member"), "{e}");
        // Flow style splits at the comma: `port` becomes an unknown key.
        let e = yaml("spec: {type: hash:ip,port}\n").unwrap_err();
        assert!(e.to_string().contains("port"), "{e}");
        let e = parse_policies(
            "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata: {name: a, namespace: x}\nspec: {type: hash:ip}\n",
            Path::new("m.yaml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("namespace"), "{e}");
        let e = parse_policies(
            &format!("{HEAD}spec: {{type: hash:ip}}\nstatuss: {{}}\n"),
            Path::new("t.yaml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("statuss"), "{e}");
        let e = parse_json_policies(
            r#"{"apiVersion":"ipsetmgr.io/v1alpha1","kind":"IPSetPolicy","metadata":{"name":"j"},"spec":{"type":"hash:ip","memebrs":[]}}"#,
            Path::new("j.json"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("memebrs"), "{e}");
        // Labels and annotations of a cluster manifest are fine.
        let ok = parse_policies(
            "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata: {name: a, labels: {team: x}, annotations: {a: b}}\nspec: {type: hash:ip}\n",
            Path::new("l.yaml"),
        );
        assert!(ok.is_ok(), "{:?}", ok.err());
    }

    #[test]
    fn a_file_that_is_not_utf8_names_where_its_bad_bytes_start() {
        let d = tmp();
        let f = d.path().join("p.yaml");
        let mut body = format!("{HEAD}spec: {{type: hash:ip}}\n# caf").into_bytes();
        let at = body.len();
        body.extend_from_slice(b"\xe9\n");
        std::fs::write(&f, &body).unwrap();
        match load_file(&f) {
            Err(LoadError::NotUtf8 { path, offset }) => assert_eq!((path, offset), (f, at)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn big_files_read_in_halves_are_read_whole() {
        let d = tmp();
        let f = d.path().join("big.yaml");
        // Odd length, every byte value, longer than PARALLEL_READ_MIN.
        let body: Vec<u8> = (0..PARALLEL_READ_MIN as usize + 12_345)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        std::fs::write(&f, &body).unwrap();
        assert!(read_bounded(&f).unwrap() == body, "read whole");
        let small = d.path().join("small");
        std::fs::write(&small, b"abcdefg").unwrap();
        let file = File::open(&small).unwrap();
        assert_eq!(read_halves(&file, 7).unwrap(), b"abcdefg");
        assert!(
            read_halves(&file, 8).is_err(),
            "a file shorter than its size"
        );
        // A file that grew after its size was taken: the rest is read too.
        let start = read_halves(&file, 3).unwrap();
        assert_eq!(read_rest(&file, start, &small).unwrap(), b"abcdefg");
    }

    #[test]
    fn numbers_must_be_integers_in_range() {
        for (body, needle) in [
            ("spec: {type: hash:ip, maxElem: \"100\"}\n", "maxElem"),
            ("spec: {type: hash:ip, maxElem: 8589934592}\n", "8589934592"),
            ("spec: {type: hash:ip, hashSize: -1}\n", "-1"),
        ] {
            let e = yaml(body).unwrap_err();
            assert!(e.to_string().contains(needle), "{body}: {e}");
        }
        let p = yaml("spec: {type: hash:ip, maxElem: 100, hashSize: 1024}\n").unwrap();
        assert_eq!(p[0].policy.spec.max_elem, Some(100));
        assert_eq!(p[0].policy.spec.hash_size, Some(1024));
    }

    #[test]
    fn a_byte_order_mark_is_accepted_in_yaml_and_json() {
        let y = format!("\u{feff}{HEAD}spec: {{type: hash:ip}}\n");
        assert_eq!(
            parse_policies(&y, Path::new("b.yaml"))
                .unwrap()
                .policies
                .len(),
            1
        );
        let j = "\u{feff}{\"apiVersion\":\"ipsetmgr.io/v1alpha1\",\"kind\":\"IPSetPolicy\",\"metadata\":{\"name\":\"j\"},\"spec\":{\"type\":\"hash:ip\"}}";
        assert_eq!(
            parse_json_policies(j, Path::new("b.json"))
                .unwrap()
                .policies
                .len(),
            1
        );
    }

    #[test]
    fn overlong_names_are_refused_without_echoing_them() {
        let name = "a".repeat(70_000);
        let text = format!(
            "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata: {{name: {name}}}\nspec: {{type: hash:ip}}\n"
        );
        let e = parse_policies(&text, Path::new("n.yaml")).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("70000 bytes long; at most 253"),
            "{}",
            &msg[..200.min(msg.len())]
        );
        assert!(msg.len() < 300, "message is bounded: {} bytes", msg.len());
    }

    fn tmp() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn policy_text(name: &str) -> String {
        format!(
            "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata: {{name: {name}}}\nspec: {{type: hash:ip}}\n"
        )
    }

    #[test]
    fn fifos_and_devices_are_skipped_with_an_error_never_opened() {
        let d = tmp();
        std::fs::write(d.path().join("good.yaml"), policy_text("good")).unwrap();
        nix::unistd::mkfifo(&d.path().join("pipe.yaml"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::os::unix::fs::symlink("/dev/zero", d.path().join("zero.yaml")).unwrap();
        let found = policy_files(d.path());
        assert_eq!(found.files, [d.path().join("good.yaml")]);
        let msgs: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(msgs.len(), 2, "{msgs:?}");
        assert!(
            msgs.iter()
                .any(|m| m.contains("pipe.yaml: not a regular file (a FIFO)")),
            "{msgs:?}"
        );
        assert!(
            msgs.iter()
                .any(|m| m.contains("zero.yaml: not a regular file (a character device)")),
            "{msgs:?}"
        );
        // Given directly, too; and load_file refuses them without blocking.
        let e = load_file(&d.path().join("pipe.yaml")).unwrap_err();
        assert!(matches!(e, LoadError::NotRegular { .. }), "{e}");
        let direct = policy_files(Path::new("/dev/zero"));
        assert!(matches!(direct.errors[..], [LoadError::NotRegular { .. }]));
    }

    #[test]
    fn reads_are_bounded() {
        let d = tmp();
        let f = d.path().join("big.yaml");
        std::fs::write(&f, vec![b'#'; 4096]).unwrap();
        // The bound itself, through a sparse file just over it.
        let file = std::fs::File::create(&f).unwrap();
        file.set_len(MAX_FILE_BYTES + 1).unwrap();
        let e = load_file(&f).unwrap_err();
        assert!(matches!(e, LoadError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains("larger than 268435456 bytes"), "{e}");
    }

    #[test]
    fn symlink_loops_visit_each_directory_once() {
        let d = tmp();
        let sub = d.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("a.yaml"), policy_text("a")).unwrap();
        std::os::unix::fs::symlink("..", sub.join("up")).unwrap();
        std::os::unix::fs::symlink(".", sub.join("self")).unwrap();
        std::os::unix::fs::symlink("../sub", d.path().join("again")).unwrap();
        // The same file under a second name is one file.
        std::os::unix::fs::symlink("sub/a.yaml", d.path().join("alias.yaml")).unwrap();
        let started = std::time::Instant::now();
        let loaded = load_policies(d.path()).unwrap();
        assert_eq!(loaded.len(), 1, "{loaded:?}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn members_from_is_read_for_policies_and_refused_for_slices() {
        let p = yaml("spec:\n  type: hash:net\n  membersFrom:\n    - file: {path: drop.netset}\n    - url: {url: 'https://example.com/l1', interval: 2h}\n").unwrap();
        let from = &p[0].policy.spec.members_from;
        assert_eq!(from.len(), 2);
        assert_eq!(from[0].file.as_ref().unwrap().path, "drop.netset");
        assert_eq!(from[1].kind(), "url");
        // A typo inside a source is an unknown field, named.
        let e = yaml("spec:\n  type: hash:net\n  membersFrom: [{file: {pth: x}}]\n").unwrap_err();
        assert!(e.to_string().contains("pth"), "{e}");
        let e = parse_policies(
            "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetMemberSlice\nmetadata: {name: s, labels: {ipsetmgr.io/policy: a}}\nspec: {membersFrom: [{file: {path: x}}]}\n",
            Path::new("s.yaml"),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("spec.membersFrom is not a field of an IPSetMemberSlice"),
            "{e}"
        );
    }

    /// A spec's own refusals, word for word.
    #[test]
    fn a_policy_needs_a_type_and_a_slice_only_members() {
        let e = parse_policies(
            "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata: {name: a}\nspec: {members: [10.0.0.1]}\n",
            Path::new("p.yaml"),
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "p.yaml: document 1: spec.type is required");
        let e = parse_policies(
            "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetMemberSlice\nmetadata: {name: s, labels: {ipsetmgr.io/policy: a}}\nspec: {maxElem: 5}\n",
            Path::new("s.yaml"),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "s.yaml: document 1: spec.maxElem is not a field of an IPSetMemberSlice (only members; the policy says the rest)"
        );
    }

    #[test]
    fn wrong_kind_and_bad_type_are_errors() {
        let e = parse_policies(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n",
            Path::new("x.yaml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("expected apiVersion"), "{e}");
        let e = parse_policies(
            "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata: {name: a}\nspec: {type: hash:foo}\n",
            Path::new("x.yaml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("x.yaml"), "{e}");
    }
}

/// The lifted fast path against the parser, on texts built to sit on every
/// edge of what may be lifted: whenever the fast path gives documents, the
/// parser gives the same from the text as written.
#[cfg(test)]
mod lift_agrees_with_the_parser {
    use super::*;
    use proptest::prelude::*;

    fn item() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => Just("10.0.0.1".to_string()),
            2 => Just("2001:db8::1".to_string()),
            2 => Just("10.0.0.0/8 nomatch".to_string()),
            2 => Just("1.2.3.4,tcp:80".to_string()),
            1 => Just("00:11:22:33:44:55".to_string()),
            // What the parser reads otherwise, or refuses.
            1 => prop::sample::select(vec![
                "null", "Null", "~", "", "1.5", "true", "a: b", "a:", "#x", "x #c", "'q'",
                "\"d\"", "&a x", "*a", "- y", "!!str 1", "x\ty", "[a]", "{a: 1}", "? a",
                "| x", "> x", "%x", "@x", "`x", "a  b", " x", "x ", "-1", ":x", "a,b",
            ])
            .prop_map(str::to_string),
            2 => "[a-z0-9.:/_, #'\"-]{1,12}",
        ]
    }

    /// One line of a member block: an item at some indentation, a blank or
    /// comment line, or a line that continues or breaks the block.
    fn line() -> impl Strategy<Value = String> {
        prop_oneof![
            12 => (prop::sample::select(vec![0usize, 2, 4]), item())
                .prop_map(|(i, v)| format!("{}- {v}", " ".repeat(i))),
            1 => Just(String::new()),
            1 => Just("  # a comment".to_string()),
            1 => Just("      continued".to_string()),
            1 => Just("  - 10.0.0.9\r".to_string()),
            1 => Just("\t- 10.0.0.9".to_string()),
            1 => Just("  hashSize: 1024".to_string()),
        ]
    }

    fn document() -> impl Strategy<Value = String> {
        (
            prop::sample::select(vec!["members:", "members:  ", "members: # c", "members: []"]),
            prop::collection::vec(line(), 0..12),
            prop::bool::ANY,
        )
            .prop_map(|(key, lines, slice)| {
                let head = if slice {
                    "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetMemberSlice\nmetadata:\n  name: s\n  labels:\n    ipsetmgr.io/policy: p\nspec:\n"
                } else {
                    "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata:\n  name: p\nspec:\n  type: hash:ip\n"
                };
                format!("{head}  {key}\n{}\n", lines.join("\n"))
            })
    }

    /// What was loaded with lifted members put where the parser puts
    /// them, to compare both paths.
    fn as_strings(mut l: Loaded) -> Loaded {
        let split = |lines: &str| lines.split('\n').map(String::from).collect();
        for p in &mut l.policies {
            if let Some(lines) = p.lifted.take() {
                p.policy.spec.members = split(&lines);
            }
        }
        for s in &mut l.slices {
            if let OwnedMembers::Lines(lines) = &s.members {
                s.members = OwnedMembers::Strings(split(lines));
            }
        }
        l
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn lifted_documents_are_the_parsers(docs in prop::collection::vec(document(), 1..3)) {
            let text = docs.join("---\n");
            let path = Path::new("p.yaml");
            if let Some(fast) = parse_lifted_from(&text, 1) {
                let slow = parse_yaml_documents(&text);
                prop_assert!(slow.is_ok(), "lifted, but the parser refuses: {text:?}: {slow:?}", slow = slow.err());
                let slow = policies_of(as_parsed(slow.unwrap()), path);
                let fast = policies_of(fast, path).map(as_strings);
                prop_assert_eq!(format!("{fast:?}"), format!("{slow:?}"), "{:?}", text);
            }
        }
    }

    #[test]
    fn a_generated_list_takes_the_fast_path_and_a_quoted_one_does_not() {
        let list: String = (0..300)
            .map(|i| format!("  - 10.0.{}.{}\n", i / 256, i % 256))
            .collect();
        let text = format!(
            "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata:\n  name: p\nspec:\n  type: hash:ip\n  members:\n{list}"
        );
        let fast = parse_lifted(&text).expect("lifted");
        let (doc, lifted) = &fast[0];
        assert!(doc.spec.as_ref().unwrap().members.is_empty());
        assert_eq!(lifted.as_deref().map(|l| l.lines().count()), Some(300));
        let loaded = parse_policies(&text, Path::new("p.yaml")).unwrap();
        assert_eq!(loaded.policies[0].members().strs()[299], "10.0.1.43");
        assert!(parse_lifted(&text.replace("- 10.0.1.7", "- \"10.0.1.7\"")).is_none());
    }

    #[test]
    fn errors_after_a_lifted_block_name_the_line_as_written() {
        let list: String = (0..300)
            .map(|i| format!("  - 10.0.{}.{}\n", i / 256, i % 256))
            .collect();
        let text = format!(
            "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata:\n  name: p\nspec:\n  type: hash:ip\n  members:\n{list}  maxElem: many\n"
        );
        let e = parse_policies(&text, Path::new("p.yaml"))
            .unwrap_err()
            .to_string();
        // The bad value is on line 308 of the file (7 lines of head, 300 members).
        assert!(e.contains("line 308"), "{e}");
    }
}
