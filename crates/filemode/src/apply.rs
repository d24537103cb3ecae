//! `ipsetmgr apply`: one-shot reconcile of policy files to the kernel,
//! printed as a table of sets and what happened to each.

use ipsetmgr_feeds::egress::EgressGuard;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};
use std::path::PathBuf;

use crate::files::{FilePolicies, load};
use crate::table;
use ipsetmgr_ipset::Naming;
use ipsetmgr_node::Opened;
use ipsetmgr_policy::PolicyError;
use ipsetmgr_sets::{
    ApplyOutcome, DeletionReport, ReconcilerConfig, SetRef, SetsBackend, WriteKind,
};

pub struct ApplyArgs {
    pub paths: Vec<PathBuf>,
    /// Plain member lists added to policies.
    pub members: Vec<crate::files::MembersFile>,
    pub dry_run: bool,
    pub prune: bool,
    /// `Some`: evaluate nodeSelectors against these labels.
    pub labels: Option<BTreeMap<String, String>>,
    /// Where url sources may connect.
    pub egress: EgressGuard,
}

fn verb(kind: WriteKind) -> &'static str {
    match kind {
        WriteKind::Delta => "updated",
        WriteKind::Create => "created",
        WriteKind::Replace => "replaced",
        WriteKind::Recreate => "recreated",
    }
}

/// Read the policy files, their member lists and `membersFrom` sources.
/// Called before the kernel side enters `--netns`: url sources are fetched
/// from the network the command started in, and no lock is held meanwhile.
pub fn load_inputs(naming: &Naming, args: &ApplyArgs) -> FilePolicies {
    load(
        &args.paths,
        &args.members,
        naming,
        args.labels.as_ref(),
        false,
        &args.egress,
    )
}

/// Run the command on what [`load_inputs`] read, printing to `out`; returns
/// whether everything succeeded.
pub fn apply(
    kernel: Opened,
    naming: Naming,
    mut files: FilePolicies,
    args: &ApplyArgs,
    out: &mut dyn Write,
) -> io::Result<bool> {
    for e in &files.load_errors {
        writeln!(out, "error: {e}")?;
    }
    let prune = prune_allowed(args, &files, out)?;
    let mut mgr = kernel.into_backend(ReconcilerConfig {
        naming,
        prune,
        ..ReconcilerConfig::default()
    });
    let backend = mgr.name();
    let backend = backend.as_str();
    mgr.set_desired(
        std::mem::take(&mut files.compiled.sets),
        files.compiled.held.clone(),
    );
    let inputs_ok = files.load_errors.is_empty() && files.compiled.errors.is_empty();
    if args.dry_run {
        return Ok(print_plan(mgr.as_mut(), backend, out)?
            && print_policy_errors(&files.compiled.errors, out).map(|()| inputs_ok)?);
    }

    // Compiled, the member strings are spent: a thread of their own frees
    // them while the kernel takes the sets (a million take ~20 ms to free).
    free_elsewhere(
        files
            .policies
            .iter_mut()
            .map(|p| std::mem::take(&mut p.spec.members))
            .collect::<Vec<_>>(),
    );
    let outcome = mgr.apply_updates();
    let (rows, sets_ok) = result_rows(mgr.as_ref(), &outcome, &files);
    if !rows.is_empty() {
        let mut headers = vec!["POLICY", "SET", "TYPE", "MEMBERS", "PROBLEMS", "RESULT"];
        if mgr.ids().len() > 1 {
            headers.insert(1, "BACKEND");
        }
        write!(out, "{}", table::render(&headers, &rows))?;
    }
    print_policy_errors(&files.compiled.errors, out)?;
    if !files.compiled.warnings.is_empty() {
        writeln!(out, "Left out (the rest of these policies was applied):")?;
        for w in &files.compiled.warnings {
            writeln!(out, "  {w}")?;
        }
    }
    let undeleted = mgr.deletion_report();
    print_side_effects(mgr.as_ref(), &outcome, &files, &undeleted, out)?;
    // Asked to prune and could not: not a success, even if every desired
    // set is in sync.
    let ok = inputs_ok && sets_ok && outcome.applied && undeleted.is_empty();
    print_summary(mgr.as_ref(), &outcome, backend, ok, &undeleted, out)?;
    Ok(ok)
}

/// Drop `value` on a thread of its own (or here, if none can be started).
fn free_elsewhere<T: Send + 'static>(value: T) {
    let _ = std::thread::Builder::new()
        .name("free".into())
        .spawn(move || drop(value));
}

/// A file that did not load may hold policies we cannot see: never prune then.
fn prune_allowed(args: &ApplyArgs, files: &FilePolicies, out: &mut dyn Write) -> io::Result<bool> {
    let prune = args.prune && files.load_errors.is_empty();
    if args.prune && !prune {
        writeln!(
            out,
            "warning: not pruning because some policy files could not be loaded"
        )?;
    }
    Ok(prune)
}

/// `--dry-run`: the planned operations after a read-only resync. Returns
/// whether the kernel could be read.
fn print_plan(mgr: &mut dyn SetsBackend, backend: &str, out: &mut dyn Write) -> io::Result<bool> {
    let plan = match mgr.plan() {
        Ok(p) => p,
        Err(e) => {
            writeln!(
                out,
                "error: could not read the kernel's sets ({backend} backend): {e}"
            )?;
            return Ok(false);
        }
    };
    writeln!(
        out,
        "Planned operations (dry run, nothing sent to the kernel):"
    )?;
    if plan.is_empty() {
        writeln!(
            out,
            "  none: the kernel already matches the loaded policies"
        )?;
    }
    for line in plan {
        writeln!(out, "  {line}")?;
    }
    Ok(true)
}

/// One row per desired set and one per rejected policy, sorted; and whether
/// every desired set is in sync.
fn result_rows(
    mgr: &dyn SetsBackend,
    outcome: &ApplyOutcome,
    files: &FilePolicies,
) -> (Vec<Vec<String>>, bool) {
    let types: HashMap<&str, String> = files
        .policies
        .iter()
        .map(|p| {
            (
                p.metadata.name.as_deref().unwrap_or_default(),
                p.spec.set_type.to_string(),
            )
        })
        .collect();
    let type_of = |policy: &str| types.get(policy).cloned().unwrap_or_default();
    let written: HashMap<&SetRef, WriteKind> =
        outcome.written.iter().map(|(n, k)| (n, *k)).collect();
    // With several backends, each row says which holds the set.
    let several = mgr.ids().len() > 1;
    let mut all_synced = true;
    let mut rows = Vec::new();
    for r in mgr.report() {
        let result = match (&r.error, written.get(&r.set)) {
            (Some(e), _) => format!("FAILED: {e}"),
            (None, Some(plan)) if r.synced => verb(*plan).to_string(),
            (None, _) if r.synced => "unchanged".to_string(),
            (None, _) => match &outcome.error {
                Some(e) => format!("NOT SYNCED: {e}"),
                None => "NOT SYNCED".to_string(),
            },
        };
        all_synced &= r.synced;
        let mut row = vec![
            r.policy.clone(),
            mgr.shown_name(&r.set),
            type_of(&r.policy),
            r.members.to_string(),
            r.problems.to_string(),
            result,
        ];
        if several {
            row.insert(1, r.set.backend.name.to_string());
        }
        rows.push(row);
    }
    for (policy, errs) in files.compiled.errors_by_policy() {
        let first = errs.first().map(|e| e.to_string()).unwrap_or_default();
        let more = match errs.len() {
            0 | 1 => String::new(),
            n => format!(" (+{} more)", n - 1),
        };
        let mut row = vec![
            policy.to_string(),
            "-".into(),
            type_of(policy),
            "-".into(),
            "-".into(),
            format!("INVALID: {first}{more}"),
        ];
        if several {
            row.insert(1, "-".into());
        }
        rows.push(row);
    }
    rows.sort();
    (rows, all_synced)
}

fn print_policy_errors(errors: &[PolicyError], out: &mut dyn Write) -> io::Result<()> {
    if !errors.is_empty() {
        writeln!(
            out,
            "Rejected input (these policies were not applied; their existing sets are left as they are):"
        )?;
        for e in errors {
            writeln!(out, "  {e}")?;
        }
    }
    Ok(())
}

/// What the run did besides writing desired sets: skipped policies,
/// removed and kept sets, deletions that failed.
fn print_side_effects(
    mgr: &dyn SetsBackend,
    outcome: &ApplyOutcome,
    files: &FilePolicies,
    undeleted: &[DeletionReport],
    out: &mut dyn Write,
) -> io::Result<()> {
    for name in &files.compiled.not_selected {
        writeln!(
            out,
            "skipped policy {name:?}: its nodeSelector does not select this host"
        )?;
    }
    // A line, not a table column: most policies have no except ranges
    // (docs/member-sources.md, "Except").
    for (name, n) in &files.compiled.excepted {
        writeln!(
            out,
            "policy {name:?}: {n} members dropped or cut by spec.except"
        )?;
    }
    // Sets are named as `ipsetmgr sets` lists them (an nft set after its
    // table).
    let shown = |set: &SetRef| mgr.shown_name(set);
    for name in &outcome.temp_deleted {
        writeln!(out, "removed leftover temp set {}", shown(name))?;
    }
    for name in &outcome.deleted {
        writeln!(out, "deleted {}: no policy wants it", shown(name))?;
    }
    for name in mgr.unwanted() {
        writeln!(
            out,
            "kept {}: no policy wants it (--prune deletes it)",
            shown(&name)
        )?;
    }
    for d in undeleted {
        writeln!(
            out,
            "could not delete {}: {} (retried on the next run)",
            shown(&d.set),
            d.error
        )?;
    }
    Ok(())
}

/// The last lines: whether the kernel update went through and how much is
/// in sync.
fn print_summary(
    mgr: &dyn SetsBackend,
    outcome: &ApplyOutcome,
    backend: &str,
    ok: bool,
    undeleted: &[DeletionReport],
    out: &mut dyn Write,
) -> io::Result<()> {
    if !outcome.applied {
        let why = outcome
            .error
            .as_ref()
            .map_or("unknown error".to_string(), |e| e.to_string());
        writeln!(
            out,
            "error: the kernel update failed after {} attempts: {why}",
            outcome.attempts
        )?;
    }
    let changed = !outcome.written.is_empty()
        || !outcome.deleted.is_empty()
        || !outcome.temp_deleted.is_empty();
    let reports = mgr.report();
    let total = reports.len();
    let synced = reports.iter().filter(|r| r.synced).count();
    // Several backends: how many each holds in sync.
    let ids = mgr.ids();
    let per_backend: Vec<String> = ids
        .iter()
        .map(|id| {
            let of = || reports.iter().filter(|r| r.set.backend == *id);
            let synced = of().filter(|r| r.synced).count();
            format!("{}: {synced} of {}", id.name, of().count())
        })
        .collect();
    let backend = if ids.len() > 1 {
        format!("{} backends: {}", backend, per_backend.join(", "))
    } else {
        format!("{backend} backend")
    };
    if !changed && ok {
        writeln!(
            out,
            "Nothing to change: the kernel already holds all {total} sets."
        )?;
    } else {
        writeln!(
            out,
            "{synced} of {total} sets in sync ({backend}, {:.1} ms).",
            outcome.duration.as_secs_f64() * 1000.0
        )?;
    }
    if !undeleted.is_empty() {
        writeln!(
            out,
            "{} unwanted set(s) left in place because they could not be deleted (see above).",
            undeleted.len()
        )?;
    }
    Ok(())
}
