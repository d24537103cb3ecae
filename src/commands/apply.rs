//! `ipsetmgr apply`: one-shot reconcile of policy files to the kernel.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::PathBuf;

use super::{load, table};
use crate::dataplane::Dataplane;
use crate::ipset::Naming;
use crate::manager::{Manager, ManagerConfig, Plan};

pub struct ApplyArgs {
    pub paths: Vec<PathBuf>,
    pub dry_run: bool,
    pub prune: bool,
    /// `Some`: evaluate nodeSelectors against these labels.
    pub labels: Option<BTreeMap<String, String>>,
}

fn verb(plan: Plan) -> &'static str {
    match plan {
        Plan::Delta => "updated",
        Plan::Create => "created",
        Plan::TempSwap => "replaced",
        Plan::Recreate => "recreated",
    }
}

/// Run the command, printing to `out`; returns whether everything succeeded.
pub fn apply(
    dp: Box<dyn Dataplane>,
    naming: Naming,
    args: &ApplyArgs,
    out: &mut dyn Write,
) -> std::io::Result<bool> {
    let mut files = load(&args.paths, &naming, args.labels.as_ref(), false);
    let mut ok = files.load_errors.is_empty() && files.compiled.errors.is_empty();
    for e in &files.load_errors {
        writeln!(out, "error: {e}")?;
    }
    // A file that did not load may hold policies we cannot see: never prune then.
    let prune = args.prune && files.load_errors.is_empty();
    if args.prune && !prune {
        writeln!(
            out,
            "warning: not pruning because some policy files could not be loaded"
        )?;
    }
    let types: HashMap<String, String> = files
        .policies
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.spec.set_type.to_string(),
            )
        })
        .collect();
    let config = ManagerConfig {
        naming,
        prune,
        ..ManagerConfig::default()
    };
    let backend = dp.name();
    let mut mgr = Manager::new(dp, config);
    mgr.set_desired(
        std::mem::take(&mut files.compiled.sets),
        files.compiled.held.clone(),
    );

    if args.dry_run {
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
        print_policy_errors(&files.compiled.errors, out)?;
        return Ok(ok);
    }

    let outcome = mgr.apply_updates();
    let written: HashMap<&str, Plan> = outcome
        .written
        .iter()
        .map(|(n, p)| (n.as_str(), *p))
        .collect();
    let mut rows = Vec::new();
    for r in mgr.report() {
        let result = match (&r.error, written.get(r.name.as_str())) {
            (Some(e), _) => {
                ok = false;
                format!("FAILED: {e}")
            }
            (None, Some(plan)) if r.synced => verb(*plan).to_string(),
            (None, _) if r.synced => "unchanged".to_string(),
            (None, _) => {
                ok = false;
                format!(
                    "NOT SYNCED: {}",
                    outcome.error.as_deref().unwrap_or("unknown error")
                )
            }
        };
        rows.push(vec![
            r.policy.clone(),
            r.name.clone(),
            types.get(&r.policy).cloned().unwrap_or_default(),
            r.members.to_string(),
            r.problems.to_string(),
            result,
        ]);
    }
    for (policy, errs) in files.compiled.errors_by_policy() {
        let first = errs.first().map(|e| e.to_string()).unwrap_or_default();
        let more = if errs.len() > 1 {
            format!(" (+{} more)", errs.len() - 1)
        } else {
            String::new()
        };
        rows.push(vec![
            policy.to_string(),
            "-".into(),
            types.get(policy).cloned().unwrap_or_default(),
            "-".into(),
            "-".into(),
            format!("INVALID: {first}{more}"),
        ]);
    }
    rows.sort();
    if !rows.is_empty() {
        write!(
            out,
            "{}",
            table::render(
                &["POLICY", "SET", "TYPE", "MEMBERS", "PROBLEMS", "RESULT"],
                &rows
            )
        )?;
    }
    print_policy_errors(&files.compiled.errors, out)?;
    for name in &files.compiled.not_selected {
        writeln!(
            out,
            "skipped policy {name:?}: its nodeSelector does not select this host"
        )?;
    }
    for name in &outcome.temp_deleted {
        writeln!(out, "removed leftover temp set {name}")?;
    }
    for name in &outcome.deleted {
        writeln!(out, "deleted {name}: no policy wants it")?;
    }
    for name in mgr.unwanted() {
        writeln!(out, "kept {name}: no policy wants it (--prune deletes it)")?;
    }
    let undeleted = mgr.deletion_report();
    for d in &undeleted {
        writeln!(
            out,
            "could not delete {}: {} (retried on the next run)",
            d.name, d.error
        )?;
    }
    // Asked to prune and could not: not a success, even if every desired
    // set is in sync.
    if !undeleted.is_empty() {
        ok = false;
    }
    if !outcome.applied {
        ok = false;
        writeln!(
            out,
            "error: the kernel update failed after {} attempts: {}",
            outcome.attempts,
            outcome.error.as_deref().unwrap_or("unknown error")
        )?;
    }
    let changed = !outcome.written.is_empty()
        || !outcome.deleted.is_empty()
        || !outcome.temp_deleted.is_empty();
    let total = mgr.report().len();
    let synced = mgr.report().iter().filter(|r| r.synced).count();
    if !changed && ok {
        writeln!(
            out,
            "Nothing to change: the kernel already holds all {total} sets."
        )?;
    } else {
        writeln!(
            out,
            "{synced} of {total} sets in sync ({backend} backend, {:.1} ms).",
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
    Ok(ok)
}

fn print_policy_errors(
    errors: &[crate::policy::PolicyError],
    out: &mut dyn Write,
) -> std::io::Result<()> {
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
