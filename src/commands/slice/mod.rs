//! `ipsetmgr slice`: turn a member list (a blocklist of a million entries)
//! into IPSetMemberSlice objects for one policy. One IPSetPolicy holds at
//! most about 100k members (etcd refuses requests over about 1.5 MB,
//! client-side `kubectl apply` objects over about 256 KB), so big lists go
//! into slices labelled for the policy, EndpointSlice style. The slices are
//! cut by a hash of each member, so a small change to the list changes few
//! of them. It reads a file and writes objects; it touches no kernel.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use ipsetmgr_api::IPSetMemberSlice;
use ipsetmgr_policy::member_list::{ListFormat, STDIN, read_member_list};
use ipsetmgr_policy::slicing::objects::SLICE_COUNT_LABEL;
use ipsetmgr_policy::slicing::partition::{Raised, TooMany};
pub(crate) use ipsetmgr_policy::slicing::validate::Check;
use ipsetmgr_policy::slicing::validate::{Validated, validate};
use ipsetmgr_policy::slicing::{MAX_SLICE_BYTES, Sliced, slice_members};

/// Policy names are label values on their slices: at most 63 characters.
const MAX_POLICY_NAME: usize = 63;

/// What `ipsetmgr slice` was asked to do.
#[derive(Debug)]
pub(crate) struct SliceArgs {
    pub policy: String,
    /// The member list; `-` is standard input.
    pub input: PathBuf,
    /// Overrides the format the file name implies (text for stdin).
    pub input_format: Option<ListFormat>,
    pub check: Check,
    pub max_members: usize,
    /// `None` or `-`: standard output.
    pub output: Option<PathBuf>,
    pub output_format: OutputFormat,
}

/// How the slices are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OutputFormat {
    /// A YAML stream, one document per slice.
    Yaml,
    /// One `v1` `List` of the slices.
    Json,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum SliceError {
    #[error(transparent)]
    TooMany(#[from] TooMany),
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
}

/// `--policy`: a valid policy name that fits in a label value.
pub(crate) fn parse_policy_name(name: &str) -> Result<String, String> {
    ipsetmgr_policy::compile::check_name(name).map_err(|e| format!("a policy name {e}"))?;
    if name.len() > MAX_POLICY_NAME {
        return Err(format!(
            "the policy name is {} characters long; a policy with slices has a name of at most {MAX_POLICY_NAME}, because its slices carry it as a label value",
            name.len()
        ));
    }
    Ok(name.to_string())
}

/// Run the command: slices to `out` (or `--output`), errors and the
/// summary to `err`. `Ok(false)`: the list could not be read or had bad
/// members, and nothing was written.
pub(crate) fn slice(
    args: &SliceArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<bool, SliceError> {
    let stderr = |source| SliceError::Write {
        path: PathBuf::from("(stderr)"),
        source,
    };
    let list = match read_member_list(&args.input, args.input_format) {
        Ok(list) => list,
        Err(e) => return writeln!(err, "error: {e}").map(|()| false).map_err(stderr),
    };
    let validated = match validate(&list, args.check) {
        Ok(v) => v,
        Err(bad) => {
            return writeln!(err, "{bad}\nerror: bad members; nothing written")
                .map(|()| false)
                .map_err(stderr);
        }
    };
    drop(list);
    let sliced = slice_members(&args.policy, &validated.members, args.max_members)?;
    write_output(args, &sliced.slices, out)?;
    summary(args, &validated, &sliced, err).map_err(stderr)?;
    Ok(true)
}

/// The slices to standard output or to `--output` (`output.rs` says how).
fn write_output(
    args: &SliceArgs,
    slices: &[IPSetMemberSlice],
    out: &mut dyn Write,
) -> Result<(), SliceError> {
    let print = |w: &mut dyn Write| match args.output_format {
        OutputFormat::Yaml => write_yaml(slices, w),
        OutputFormat::Json => write_json(slices, w),
    };
    match args.output.as_deref() {
        Some(path) if path != Path::new(STDIN) => {
            output::write_output(path, print).map_err(|source| SliceError::Write {
                path: path.to_path_buf(),
                source,
            })
        }
        _ => {
            let mut w = BufWriter::new(out);
            print(&mut w)
                .and_then(|()| w.flush())
                .map_err(|source| SliceError::Write {
                    path: PathBuf::from("(stdout)"),
                    source,
                })
        }
    }
}

/// A YAML stream: documents separated by `---`.
fn write_yaml(slices: &[IPSetMemberSlice], mut w: &mut dyn Write) -> io::Result<()> {
    for (i, slice) in slices.iter().enumerate() {
        if i > 0 {
            w.write_all(b"---\n")?;
        }
        serde_saphyr::to_io_writer(&mut w, slice).map_err(io::Error::other)?;
    }
    Ok(())
}

/// The `v1` `List` kind that `kubectl get -o json` prints and
/// `kubectl apply` accepts.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct List<'a> {
    api_version: &'static str,
    kind: &'static str,
    items: &'a [IPSetMemberSlice],
}

fn write_json(slices: &[IPSetMemberSlice], mut w: &mut dyn Write) -> io::Result<()> {
    let list = List {
        api_version: "v1",
        kind: "List",
        items: slices,
    };
    serde_json::to_writer_pretty(&mut w, &list)?;
    w.write_all(b"\n")
}

/// What was made, and how to remove slices of an older count.
fn summary(
    args: &SliceArgs,
    validated: &Validated,
    sliced: &Sliced,
    err: &mut dyn Write,
) -> io::Result<()> {
    let count = sliced.slices.len();
    let policy = &args.policy;
    let most_members = sliced
        .slices
        .iter()
        .map(|s| s.spec.members.len())
        .max()
        .unwrap_or(0);
    let most_bytes = sliced.bytes.iter().copied().max().unwrap_or(0);
    let duplicates = match validated.duplicates {
        0 => String::new(),
        n => format!(" ({n} duplicates dropped)"),
    };
    writeln!(
        err,
        "{} members of policy {policy} in {count} slices{duplicates}; largest slice {most_members} members, {most_bytes} bytes (limits {} members, {MAX_SLICE_BYTES} bytes)",
        validated.members.len(),
        args.max_members,
    )?;
    if let Some(raised) = sliced.raised {
        let why = match raised {
            Raised::Members => format!(
                "a slice would have held more than {} members",
                args.max_members
            ),
            Raised::Bytes => format!("a slice would have been larger than {MAX_SLICE_BYTES} bytes"),
        };
        writeln!(err, "{count} slices rather than {}: {why}", sliced.minimum)?;
    }
    writeln!(
        err,
        "Slices made with another slice count are stale once these are applied; delete them with:\n  kubectl delete ipsetmemberslices -l '{}={policy},{SLICE_COUNT_LABEL}!={count}'",
        ipsetmgr_api::POLICY_LABEL
    )
}

mod output;
#[cfg(test)]
mod tests;
