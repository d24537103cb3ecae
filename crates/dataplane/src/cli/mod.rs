//! The `ipset` binary as a dataplane backend.
//!
//! * `apply` runs ONE `ipset restore` per batch, streaming the script to its
//!   stdin; a compact line map turns "Error in line N" back into the failing
//!   operation and member.
//! * `list_owned` runs `ipset list -n` (names only: foreign sets' contents are
//!   never read).
//! * `read_set` streams `ipset list NAME` through [`parse_listing`], a pure
//!   parser over any [`BufRead`].

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::net::IpAddr;
use std::process::{Child, Command, Stdio};

use crate::{BatchError, Dataplane, DataplaneError, KernelSet, Op};
use ipsetmgr_ipset::{
    AddrMask, Family, HeaderOptions, Member, MemberSetBuilder, SetHeader, SetKind, SetRange,
    SetType, is_valid_set_name, mask,
};

/// The `ipset` command-line tool as a [`Dataplane`].
#[derive(Clone, Debug)]
pub struct CliDataplane {
    binary: OsString,
}

impl Default for CliDataplane {
    fn default() -> Self {
        CliDataplane::new()
    }
}

impl CliDataplane {
    /// Uses `ipset` from `PATH`.
    pub fn new() -> CliDataplane {
        CliDataplane::with_binary("ipset")
    }

    /// Uses the given `ipset` binary (a path, or a name looked up in `PATH`).
    pub fn with_binary(binary: impl Into<OsString>) -> CliDataplane {
        CliDataplane {
            binary: binary.into(),
        }
    }

    pub fn binary(&self) -> &OsString {
        &self.binary
    }

    fn spawn(&self, args: &[&str], stdin: bool) -> Result<Child, DataplaneError> {
        Command::new(&self.binary)
            .args(args)
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(if stdin { Stdio::null() } else { Stdio::piped() })
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                DataplaneError::Unavailable(format!(
                    "cannot run {}: {e}",
                    self.binary.to_string_lossy()
                ))
            })
    }
}

fn invalid_name(op_index: usize, name: &str) -> BatchError {
    BatchError {
        op_index,
        member: None,
        error: DataplaneError::Other(format!("invalid set name {name:?}")),
    }
}

/// Script line numbers (1-based) at which each operation starts. Ops that
/// produce no line (an Add/Del of an empty set) have no entry.
#[derive(Debug, Default)]
struct LineMap {
    /// (first line, op index), increasing in both.
    starts: Vec<(u64, usize)>,
}

impl LineMap {
    /// The op and, for Add/Del, the member ordinal a line belongs to.
    fn locate(&self, line: u64) -> Option<(usize, u64)> {
        let i = match self.starts.binary_search_by_key(&line, |&(l, _)| l) {
            Ok(i) => i,
            Err(0) => return None,
            Err(i) => i - 1,
        };
        let (first, op) = self.starts[i];
        Some((op, line - first))
    }
}

/// Render one `create` line.
fn write_create(w: &mut impl Write, set: &str, h: &SetHeader) -> io::Result<()> {
    let t = h.kind.set_type;
    write!(w, "create {set} {}", t.as_str())?;
    let comment = if h.options.comment { " comment" } else { "" };
    if let Some(range) = h.options.range {
        // A bitmap: sized by its range; no family, maxelem or hash size.
        return writeln!(w, " range {range}{comment}");
    }
    if t == SetType::ListSet {
        return writeln!(w, " size {}", h.max_elem);
    }
    if t.has_family() {
        let fam = h.kind.family.unwrap_or(Family::V4);
        write!(w, " family {}", fam.ipset_name())?;
    }
    write!(w, " maxelem {}", h.max_elem)?;
    if let Some(hs) = h.hash_size {
        write!(w, " hashsize {hs}")?;
    }
    if let Some(mask) = h.options.mask {
        write!(w, " {mask}")?;
    }
    writeln!(w, "{comment}")
}

/// Stream the restore script for `ops` into `w`, recording the line map.
/// Returns an error for ops that cannot be rendered safely (bad names).
fn write_script(
    w: &mut impl Write,
    ops: &[Op<'_>],
    map: &mut LineMap,
) -> Result<io::Result<()>, BatchError> {
    let mut line: u64 = 1;
    for (i, op) in ops.iter().enumerate() {
        for s in op.sets() {
            if !is_valid_set_name(s) {
                return Err(invalid_name(i, s));
            }
        }
        let r = match op {
            Op::Create { set, header } => {
                map.starts.push((line, i));
                line += 1;
                write_create(w, set, header)
            }
            Op::Add { set, members } | Op::Del { set, members } => {
                if members.is_empty() {
                    continue;
                }
                map.starts.push((line, i));
                line += members.len() as u64;
                let verb = if matches!(op, Op::Add { .. }) {
                    "add"
                } else {
                    "del"
                };
                let mut r = Ok(());
                for m in members.iter() {
                    check_list_member(i, set, &m)?;
                    // `ipset del` takes the key alone: it refuses `nomatch`.
                    let key = match op {
                        Op::Del { .. } => m.key_only(),
                        _ => None,
                    };
                    r = writeln!(w, "{verb} -exist {set} {}", key.as_ref().unwrap_or(&m));
                    if r.is_err() {
                        break;
                    }
                }
                r
            }
            Op::Flush { set } => {
                map.starts.push((line, i));
                line += 1;
                writeln!(w, "flush {set}")
            }
            Op::Swap { a, b } => {
                map.starts.push((line, i));
                line += 1;
                writeln!(w, "swap {a} {b}")
            }
            Op::Rename { from, to } => {
                map.starts.push((line, i));
                line += 1;
                writeln!(w, "rename {from} {to}")
            }
            Op::Destroy { set } => {
                map.starts.push((line, i));
                line += 1;
                writeln!(w, "destroy {set}")
            }
        };
        if let Err(e) = r {
            return Ok(Err(e));
        }
    }
    Ok(Ok(()))
}

/// Strip `ipset vX.Y: ` and split `Error in line N: ` off one stderr message.
/// Returns (line, message).
pub fn split_stderr(stderr: &str) -> (Option<u64>, &str) {
    let first = stderr
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let mut msg = first;
    if let Some(rest) = msg.strip_prefix("ipset v")
        && let Some((_, after)) = rest.split_once(": ")
    {
        msg = after;
    }
    if let Some(rest) = msg.strip_prefix("Error in line ")
        && let Some((n, after)) = rest.split_once(": ")
        && let Ok(n) = n.trim().parse::<u64>()
    {
        return (Some(n), after.trim());
    }
    (None, msg.trim())
}

/// Map one `ipset` error message (after [`split_stderr`]) for the failing op
/// (and member, if known) to a typed error.
pub fn classify(msg: &str, op: Option<&Op<'_>>, member: Option<&Member>) -> DataplaneError {
    let set = op.map(|o| o.set().to_string()).unwrap_or_default();
    let lower = msg.to_ascii_lowercase();
    let has = |s: &str| lower.contains(s);
    if has("set type not supported") || has("settype") && has("not supported") {
        let t = match op {
            Some(Op::Create { header, .. }) => header.kind.set_type.as_str().to_string(),
            _ => set,
        };
        DataplaneError::TypeNotSupported(t)
    } else if has("same name already exists") || has("new name already exists") {
        match op {
            Some(Op::Rename { to, .. }) => DataplaneError::SetExists(to.to_string()),
            _ => DataplaneError::SetExists(set),
        }
    } else if has("in use by a kernel component") || has("in use by another system") {
        DataplaneError::InUse(set)
    } else if has("type does not match") {
        match op {
            Some(Op::Swap { a, b }) => DataplaneError::TypeMismatch(a.to_string(), b.to_string()),
            _ => DataplaneError::TypeMismatch(set, String::new()),
        }
    } else if has("second set does not exist") {
        match op {
            Some(Op::Swap { b, .. }) => DataplaneError::SetMissing(b.to_string()),
            _ => DataplaneError::SetMissing(set),
        }
    } else if has("list:set type cannot be added") {
        DataplaneError::NestedListSet(set)
    } else if has("as element does not exist") {
        // A list:set member naming a set that does not exist.
        DataplaneError::SetMissing(member.map(|m| m.to_string()).unwrap_or(set))
    } else if has("given name does not exist") {
        DataplaneError::SetMissing(set)
    } else if has("is full") || has("maxelem") {
        DataplaneError::SetFull(set)
    } else if has("syntax error")
        || has("invalid")
        || has("null-valued element")
        || has("out of range")
        || has("out of the range")
        || has("cannot be used")
        || has("cannot be stored")
    {
        DataplaneError::InvalidElement {
            set,
            element: member.map(|m| m.to_string()).unwrap_or_default(),
            reason: msg.to_string(),
        }
    } else if has("cannot open session")
        || has("operation not permitted")
        || has("permission denied")
        || has("protocol not supported")
        || has("kernel support protocol")
    {
        DataplaneError::Unavailable(msg.to_string())
    } else {
        DataplaneError::Other(msg.to_string())
    }
}

/// Turn a failed restore's stderr into a [`BatchError`].
fn batch_error(stderr: &str, ops: &[Op<'_>], map: &LineMap) -> BatchError {
    let (line, msg) = split_stderr(stderr);
    let located = line.and_then(|l| map.locate(l));
    let Some((op_index, ordinal)) = located else {
        // Cannot tell where it stopped: anything may have been applied.
        let op_index = ops.len().saturating_sub(1);
        let error = if msg.is_empty() {
            DataplaneError::Protocol("ipset restore failed without a message".into())
        } else {
            match classify(msg, None, None) {
                DataplaneError::Other(m) => {
                    DataplaneError::Protocol(format!("ipset restore failed: {m}"))
                }
                e => e,
            }
        };
        return BatchError {
            op_index,
            member: None,
            error,
        };
    };
    let op = &ops[op_index];
    let member = match op {
        Op::Add { members, .. } | Op::Del { members, .. } => usize::try_from(ordinal)
            .ok()
            .and_then(|n| members.iter().nth(n)),
        _ => None,
    };
    let error = classify(msg, Some(op), member.as_ref());
    BatchError {
        op_index,
        member,
        error,
    }
}

/// Read a child's stderr to a string (lossy), bounded.
/// Wait for a reading `ipset`: its standard error when it failed.
fn failed(child: &mut Child) -> Result<Option<String>, DataplaneError> {
    let stderr = read_stderr(child);
    let status = child
        .wait()
        .map_err(|e| DataplaneError::Unavailable(format!("waiting for ipset: {e}")))?;
    Ok((!status.success()).then_some(stderr))
}

fn read_stderr(child: &mut Child) -> String {
    let mut buf = Vec::new();
    if let Some(e) = child.stderr.as_mut() {
        let _ = e.take(64 * 1024).read_to_end(&mut buf);
    }
    String::from_utf8_lossy(&buf).into_owned()
}

impl Dataplane for CliDataplane {
    fn name(&self) -> &'static str {
        "cli"
    }

    fn apply(&mut self, ops: &[Op<'_>]) -> Result<(), BatchError> {
        if ops.is_empty() {
            return Ok(());
        }
        // Validate names before anything runs, so nothing is half-applied.
        for (i, op) in ops.iter().enumerate() {
            if let Some(bad) = op.sets().find(|s| !is_valid_set_name(s)) {
                return Err(invalid_name(i, bad));
            }
            if let Op::Add { set, members } | Op::Del { set, members } = op
                && members.kind().set_type == SetType::ListSet
            {
                for m in members.iter() {
                    check_list_member(i, set, &m)?;
                }
            }
        }
        let mut child = self.spawn(&["restore"], true).map_err(|error| BatchError {
            op_index: 0,
            member: None,
            error,
        })?;
        let mut map = LineMap::default();
        let Some(stdin) = child.stdin.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(BatchError {
                op_index: 0,
                member: None,
                error: DataplaneError::Unavailable("ipset restore has no stdin".into()),
            });
        };
        let mut w = BufWriter::with_capacity(256 * 1024, stdin);
        let written = match write_script(&mut w, ops, &mut map) {
            Ok(Ok(())) => w.flush(),
            Ok(Err(e)) => Err(e),
            Err(be) => {
                // Refused to render something (checked above, so not
                // expected): kill the tool before it sees EOF and commits.
                let (stdin, _) = w.into_parts();
                let _ = child.kill();
                drop(stdin);
                let _ = child.wait();
                return Err(be);
            }
        };
        // Close stdin: restore sees EOF and commits.
        drop(w);
        let stderr = read_stderr(&mut child);
        let status = child.wait().map_err(|e| BatchError {
            op_index: ops.len() - 1,
            member: None,
            error: DataplaneError::Unavailable(format!("waiting for ipset restore: {e}")),
        })?;
        if status.success() {
            // A write error (broken pipe) with success would be a tool bug.
            if let Err(e) = written {
                return Err(BatchError {
                    op_index: ops.len() - 1,
                    member: None,
                    error: DataplaneError::Protocol(format!(
                        "ipset restore exited successfully but did not read its input: {e}"
                    )),
                });
            }
            return Ok(());
        }
        Err(batch_error(&stderr, ops, &map))
    }

    fn list_owned(&mut self, owned: &dyn Fn(&str) -> bool) -> Result<Vec<String>, DataplaneError> {
        let mut child = self.spawn(&["list", "-n"], false)?;
        let out = child.stdout.take().expect("stdout is piped");
        let mut names = Vec::new();
        let mut reader = BufReader::new(out);
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) => break,
                Ok(_) => {
                    let name = line.trim_end_matches(['\n', '\r']);
                    if !name.is_empty() && owned(name) {
                        names.push(name.to_string());
                    }
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(DataplaneError::Protocol(format!(
                        "reading ipset list -n: {e}"
                    )));
                }
            }
        }
        if let Some(stderr) = failed(&mut child)? {
            let (_, msg) = split_stderr(&stderr);
            return Err(match classify(msg, None, None) {
                DataplaneError::Other(m) => DataplaneError::Other(format!("ipset list -n: {m}")),
                e => e,
            });
        }
        Ok(names)
    }

    fn read_set(&mut self, name: &str) -> Result<Option<KernelSet>, DataplaneError> {
        if !is_valid_set_name(name) {
            return Ok(None);
        }
        let mut child = self.spawn(&["list", name], false)?;
        let out = child.stdout.take().expect("stdout is piped");
        let parsed = parse_listing(BufReader::with_capacity(256 * 1024, out), Some(name));
        if parsed.is_err() {
            // Stop a tool still writing before waiting for it.
            let _ = child.kill();
        }
        if let Some(stderr) = failed(&mut child)? {
            let (_, msg) = split_stderr(&stderr);
            if msg.contains("given name does not exist") {
                return Ok(None);
            }
            return Err(match classify(msg, None, None) {
                DataplaneError::Other(m) => {
                    DataplaneError::Protocol(format!("ipset list {name} failed: {m}"))
                }
                e => e,
            });
        }
        parsed.map(Some)
    }
}

fn protocol(msg: impl Into<String>) -> DataplaneError {
    DataplaneError::Protocol(msg.into())
}

/// What the `Header:` line says that matters here.
#[derive(Debug)]
struct HeaderWords {
    family: Option<Family>,
    hash_size: Option<u32>,
    /// maxelem, or size for list:set.
    max_elem: Option<u32>,
    has_timeout: bool,
    /// A bitmap's `range FROM-TO`, as printed.
    range: Option<String>,
    /// The `comment` extension (an option this project sets).
    comment: bool,
    /// `netmask N` or `bitmask ADDR` (not the host-length default): an
    /// option this project sets for hash:ip, unmanaged for other types.
    mask: Option<(String, String)>,
    /// See [`KernelSet::unmanaged_options`].
    unmanaged: Vec<String>,
}

/// Header options that carry a value (`netmask 24`), as `ipset list`
/// prints them; the value is part of the option's description.
const VALUED_OPTIONS: [&str; 4] = ["netmask", "bitmask", "timeout", "markmask"];

/// Parse the header line's words: `family inet hashsize 1024 maxelem 65536
/// bucketsize 12 initval 0x..` (hash types) or `size 8` (list:set). Any
/// other word is an option this project never sets, recorded as unmanaged:
/// a future option may change matching, so it is never assumed harmless.
fn parse_header_words(words: &str) -> Result<HeaderWords, DataplaneError> {
    let mut family = None;
    let mut hashsize = None;
    let mut maxelem = None;
    let mut has_timeout = false;
    let mut range = None;
    let mut comment = false;
    let mut mask = None;
    let mut unmanaged = Vec::new();
    let mut it = words.split_ascii_whitespace();
    let num = |v: Option<&str>, key: &str| -> Result<u32, DataplaneError> {
        v.and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(|| protocol(format!("bad value for {key} in header {words:?}")))
    };
    while let Some(w) = it.next() {
        match w {
            "family" => {
                let v = it.next().unwrap_or("");
                family = Some(
                    Family::from_ipset_name(v)
                        .ok_or_else(|| protocol(format!("unknown family {v:?} in header")))?,
                );
            }
            "hashsize" => hashsize = Some(num(it.next(), "hashsize")?),
            "maxelem" | "size" => maxelem = Some(num(it.next(), w)?),
            "range" => range = it.next().map(str::to_string),
            "comment" => comment = true,
            // The kernel's own bucket size and hash seed: set for every set.
            "bucketsize" | "initval" => {
                it.next();
            }
            _ if VALUED_OPTIONS.contains(&w) => {
                let value = it.next().unwrap_or("");
                // A host-length netmask and hash:ip,mark's all-bits markmask
                // are the defaults: nothing changes.
                let host_mask = w == "netmask"
                    && (value == "32" && family != Some(Family::V6) || value == "128");
                let full_markmask = w == "markmask" && value == "0xffffffff";
                if (w == "netmask" || w == "bitmask") && !host_mask {
                    // Managed for hash:ip; see `typed_header`.
                    mask = Some((w.to_string(), value.to_string()));
                } else if !host_mask && !full_markmask {
                    unmanaged.push(format!("{w} {value}"));
                }
                has_timeout |= w == "timeout";
            }
            _ => unmanaged.push(w.to_string()),
        }
    }
    Ok(HeaderWords {
        family,
        hash_size: hashsize,
        max_elem: maxelem,
        has_timeout,
        range,
        comment,
        mask,
        unmanaged,
    })
}

/// Fast, allocation-free parsing of the common member forms the kernel
/// prints; falls back to [`Member::parse_kernel`] for everything else.
fn parse_member(t: SetType, line: &str) -> Option<Member> {
    let fast = match t {
        SetType::HashIp => line.parse::<IpAddr>().ok().map(Member::Ip),
        SetType::HashNet => {
            let (body, nomatch) = match line.strip_suffix(" nomatch") {
                Some(b) => (b, true),
                None => (line, false),
            };
            let (a, p) = match body.split_once('/') {
                Some((a, p)) => (a, Some(p)),
                None => (body, None),
            };
            a.parse::<IpAddr>().ok().and_then(|addr| {
                let max = if addr.is_ipv4() { 32 } else { 128 };
                let prefix = match p {
                    None => max,
                    Some(p)
                        if !p.is_empty()
                            && p.len() <= 3
                            && p.bytes().all(|b| b.is_ascii_digit()) =>
                    {
                        p.parse::<u8>().ok().filter(|&n| n <= max && n > 0)?
                    }
                    Some(_) => return None,
                };
                Some(Member::Net {
                    addr: mask(addr, prefix),
                    prefix,
                    nomatch,
                })
            })
        }
        _ => None,
    };
    fast.or_else(|| Member::parse_kernel(t, line).ok())
}

/// Read one line (with its `\n`) into `buf`; `false` at the end of input.
/// A last line without `\n` means the listing was cut off.
fn read_line(r: &mut impl BufRead, buf: &mut Vec<u8>) -> Result<bool, DataplaneError> {
    buf.clear();
    let n = r
        .read_until(b'\n', buf)
        .map_err(|e| protocol(format!("reading ipset list: {e}")))?;
    if n == 0 {
        return Ok(false);
    }
    if buf.last() != Some(&b'\n') {
        return Err(protocol(
            "truncated ipset list output: last line is incomplete",
        ));
    }
    buf.pop();
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(true)
}

/// The `Key: value` lines before `Members:`.
#[derive(Default)]
struct ListingHead {
    name: Option<String>,
    /// The `Type:` line: `Some(None)` for a type this project does not
    /// manage (its name is not needed: such a set is listed, never read).
    set_type: Option<Option<SetType>>,
    header: Option<HeaderWords>,
    references: Option<u32>,
    entries: Option<u64>,
}

fn parse_number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, DataplaneError> {
    value
        .parse()
        .map_err(|_| protocol(format!("bad {key} value {value:?}")))
}

/// Read the header section, up to and including the `Members:` line.
fn read_head(r: &mut impl BufRead, buf: &mut Vec<u8>) -> Result<ListingHead, DataplaneError> {
    let mut head = ListingHead::default();
    while read_line(r, buf)? {
        let line =
            std::str::from_utf8(buf).map_err(|_| protocol("ipset list header is not UTF-8"))?;
        if line == "Members:" {
            return Ok(head);
        }
        if line.is_empty() {
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            return Err(protocol(format!(
                "unexpected line in ipset list header: {line:?}"
            )));
        };
        let value = value.trim();
        match key {
            "Name" if head.name.is_some() => {
                return Err(protocol("two Name: lines before Members:"));
            }
            "Name" => head.name = Some(value.to_string()),
            "Type" => head.set_type = Some(value.parse::<SetType>().ok()),
            "Header" => head.header = Some(parse_header_words(value)?),
            "References" => head.references = Some(parse_number(key, value)?),
            "Number of entries" => head.entries = Some(parse_number(key, value)?),
            // Revision, Size in memory, and anything newer tools print.
            _ => {}
        }
    }
    Err(protocol("truncated ipset list output: no Members: line"))
}

/// The typed header of a managed type (`None` for an unmanaged one).
fn typed_header(
    set_type: Option<SetType>,
    words: &HeaderWords,
) -> Result<Option<SetHeader>, DataplaneError> {
    let Some(t) = set_type else {
        return Ok(None);
    };
    if t.is_bitmap() {
        let text = words
            .range
            .as_deref()
            .ok_or_else(|| protocol(format!("{t} header without range")))?;
        let range = SetRange::parse(t, text)
            .map_err(|e| protocol(format!("{t} header range {text:?}: {e}")))?;
        return Ok(Some(SetHeader {
            kind: SetKind::new(t, t.only_family()),
            // Within 65536: parse refuses bigger ranges.
            max_elem: range.len() as u32,
            hash_size: None,
            options: HeaderOptions {
                range: Some(range),
                comment: words.comment,
                mask: None,
            },
        }));
    }
    if t.has_family() && words.family.is_none() {
        return Err(protocol(format!("{t} header without a family")));
    }
    let size_word = if t == SetType::ListSet {
        "size"
    } else {
        "maxelem"
    };
    let max_elem = words
        .max_elem
        .ok_or_else(|| protocol(format!("{t} header without {size_word}")))?;
    Ok(Some(SetHeader {
        kind: SetKind::new(t, words.family.filter(|_| t.has_family())),
        max_elem,
        hash_size: words.hash_size.filter(|_| t.is_hash()),
        options: HeaderOptions {
            range: None,
            comment: words.comment,
            mask: if t == SetType::HashIp {
                hash_ip_mask(words)
            } else {
                None
            },
        },
    }))
}

/// A hash:ip header's mask, when it is one this project can hold.
fn hash_ip_mask(words: &HeaderWords) -> Option<AddrMask> {
    let (w, value) = words.mask.as_ref()?;
    let family = words.family?;
    match w.as_str() {
        "netmask" => AddrMask::prefix(value.parse().ok()?, family).ok()?,
        _ => AddrMask::bits(value, family).ok()?,
    }
}

/// Read member lines up to a blank line or the end. Returns the lines
/// read, with each one parsed into `members` (when the type is managed) or
/// counted in `unparsable`.
fn read_members(
    r: &mut impl BufRead,
    buf: &mut Vec<u8>,
    mut members: Option<&mut MemberSetBuilder>,
    unparsable: &mut usize,
) -> Result<u64, DataplaneError> {
    let mut lines = 0;
    // A blank line ends this set's listing.
    while read_line(r, buf)? && !buf.is_empty() {
        lines += 1;
        let Some(ms) = members.as_deref_mut() else {
            continue;
        };
        let t = ms.kind().set_type;
        match std::str::from_utf8(buf)
            .ok()
            .and_then(|l| parse_member(t, l))
        {
            Some(m) => ms.push(m),
            None => *unparsable += 1,
        }
    }
    Ok(lines)
}

/// Parse the output of `ipset list NAME` (one set). `expected` is the name
/// that was asked for; a listing of another set is a protocol error.
///
/// Never panics: truncated output (no `Members:` line, missing header lines)
/// or garbage gives [`DataplaneError::Protocol`].
pub fn parse_listing(
    mut r: impl BufRead,
    expected: Option<&str>,
) -> Result<KernelSet, DataplaneError> {
    let mut buf: Vec<u8> = Vec::with_capacity(128);
    let head = read_head(&mut r, &mut buf)?;
    let missing = |what: &str| protocol(format!("ipset list output has no {what}: line"));
    let name = head.name.ok_or_else(|| missing("Name"))?;
    if let Some(exp) = expected
        && name != exp
    {
        return Err(protocol(format!(
            "asked for set {exp} but ipset listed {name:?}"
        )));
    }
    let set_type = head.set_type.ok_or_else(|| missing("Type"))?;
    let words = head.header.ok_or_else(|| missing("Header"))?;
    let references = head.references.ok_or_else(|| missing("References"))?;
    let header = typed_header(set_type, &words)?;

    let mut builder = header.as_ref().map(|h| {
        let cap = head.entries.unwrap_or(0).min(1 << 24) as usize;
        MemberSetBuilder::with_capacity(h.kind, cap)
    });
    let mut unparsable = 0usize;
    let lines = read_members(&mut r, &mut buf, builder.as_mut(), &mut unparsable)?;
    // Fewer lines than announced means the listing was cut short. (Sets
    // with timeouts may count expired, unlisted entries.)
    if let Some(e) = head.entries
        && lines < e
        && !words.has_timeout
    {
        return Err(protocol(format!(
            "truncated ipset list output: {lines} of {e} members"
        )));
    }
    // Duplicates or members of the wrong family are not what we expect.
    let members = builder.map(|b| {
        let (set, refused) = b.finish();
        unparsable += refused;
        set
    });
    // A mask the typed header does not hold is unmanaged.
    let held = header.as_ref().is_some_and(|h| h.options.mask.is_some());
    let mut unmanaged_options = words.unmanaged;
    if let Some((w, value)) = words.mask.filter(|_| !held) {
        unmanaged_options.push(format!("{w} {value}"));
    }
    Ok(KernelSet {
        header,
        members,
        unparsable_members: unparsable,
        unmanaged_options,
        references,
    })
}

/// A list:set member must be a set name this project would write: it
/// goes into the `ipset restore` script as it is.
fn check_list_member(op_index: usize, set: &str, m: &Member) -> Result<(), BatchError> {
    match m {
        Member::Set(name) if !is_valid_set_name(name) => Err(BatchError {
            op_index,
            member: Some(m.clone()),
            error: DataplaneError::InvalidElement {
                set: set.to_string(),
                element: name.to_string(),
                reason: "not a valid set name".into(),
            },
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
