//! The kustomize base: loaded directly (only `resources` and `namespace`
//! are understood) and by the real kustomize, complete and hardened.

use super::*;

pub(crate) const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// Load a kustomization directly: `resources` (files or directories) and
/// `namespace` only. Any other field fails the test rather than being ignored:
/// extend this loader, or rely on `kustomize_renders_with_the_real_tool`.
pub(crate) fn load_kustomization(dir: &Path) -> Vec<Value> {
    let k: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(dir.join("kustomization.yaml"))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display())),
    )
    .unwrap();
    for key in k.as_object().unwrap().keys() {
        assert!(
            ["apiVersion", "kind", "resources", "namespace"].contains(&key.as_str()),
            "{}/kustomization.yaml: field {key:?} is not understood by the test loader",
            dir.display()
        );
    }
    let mut docs = Vec::new();
    for r in k["resources"].as_array().cloned().unwrap_or_default() {
        let p = dir.join(r.as_str().unwrap());
        let p = p
            .canonicalize()
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        if p.is_dir() {
            docs.extend(load_kustomization(&p));
        } else {
            assert!(
                p.starts_with(dir.canonicalize().unwrap()),
                "{} is outside its kustomization root (kustomize would refuse it)",
                p.display()
            );
            docs.extend(yaml_docs(
                &std::fs::read_to_string(&p).unwrap(),
                &p.display().to_string(),
            ));
        }
    }
    if let Some(ns) = k["namespace"].as_str() {
        for d in &mut docs {
            if !CLUSTER_SCOPED.contains(&kind_of(d)) {
                d["metadata"]["namespace"] = json!(ns);
            }
            if let Some(subjects) = d.get_mut("subjects").and_then(Value::as_array_mut) {
                for s in subjects {
                    let unset = matches!(
                        s.get("namespace").and_then(Value::as_str),
                        None | Some("default")
                    );
                    if s["kind"] == "ServiceAccount" && unset {
                        s["namespace"] = json!(ns);
                    }
                }
            }
        }
    }
    docs
}

pub(crate) fn kustomize_default() -> Vec<Value> {
    load_kustomization(&repo("config/default"))
}

/// `Kind namespace/name` (namespace empty for cluster-scoped objects).
pub(crate) fn identity(d: &Value) -> String {
    format!(
        "{} {}/{}",
        kind_of(d),
        d["metadata"]["namespace"].as_str().unwrap_or(""),
        name_of(d)
    )
}

/// Key for comparing object lists regardless of order.
pub(crate) fn by_identity(docs: &[Value]) -> BTreeMap<String, Value> {
    docs.iter().map(|d| (identity(d), d.clone())).collect()
}

#[test]
pub(crate) fn kustomize_base_is_complete_and_hardened() {
    let docs = kustomize_default();
    let what = "config/default";
    check_all_typed(&docs, what);
    let ns: Namespace = one_of(&docs, "Namespace", what);
    assert_eq!(ns.metadata.name.as_deref(), Some(NAMESPACE));
    crds_by_kind(&docs, what);
    let ds: DaemonSet = one_of(&docs, "DaemonSet", what);
    check_daemonset(&ds, &Listeners::agent(), what);
    check_agent_selector_is_0_1s(&ds, false, what);
    let d: Deployment = one_of(&docs, "Deployment", what);
    check_controller(&d, &Listeners::controller(), what);
    check_rbac(&docs, &Names::release(), true, what);
}

/// `dir` rendered by the real kustomize (scripts/render-kustomize.sh), or
/// None when none is installed (allowed outside CI only).
pub(crate) fn render_with_kustomize(dir: &str) -> Option<Vec<Value>> {
    let out = Command::new("bash")
        .arg(repo("scripts/render-kustomize.sh"))
        .arg(dir)
        .output()
        .expect("run bash");
    if out.status.code() == Some(127) {
        let msg = String::from_utf8_lossy(&out.stderr);
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install kubectl or kustomize: {msg}"
        );
        eprintln!("SKIPPED rendering {dir} with kustomize: {msg}");
        return None;
    }
    assert!(
        out.status.success(),
        "render-kustomize.sh {dir} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = yaml_docs(
        &String::from_utf8(out.stdout).unwrap(),
        &format!("kustomize {dir}"),
    );
    // The test loader sees exactly what kustomize produces.
    let (real, ours) = (
        by_identity(&rendered),
        by_identity(&load_kustomization(&repo(dir))),
    );
    assert_eq!(
        real.keys().collect::<Vec<_>>(),
        ours.keys().collect::<Vec<_>>(),
        "{dir}: objects"
    );
    for (key, obj) in &real {
        if let Some(diff) = first_difference(obj, &ours[key], "") {
            panic!("{dir}: {key}: kustomize vs the test's loader: {diff}");
        }
    }
    Some(rendered)
}

#[test]
pub(crate) fn kustomize_renders_with_the_real_tool() {
    let Some(rendered) = render_with_kustomize("config/default") else {
        return;
    };
    let what = "kustomize output";
    check_all_typed(&rendered, what);
    let ds: DaemonSet = one_of(&rendered, "DaemonSet", what);
    check_daemonset(&ds, &Listeners::agent(), what);
    let d: Deployment = one_of(&rendered, "Deployment", what);
    check_controller(&d, &Listeners::controller(), what);
    check_rbac(&rendered, &Names::release(), true, what);
    let Some(admission) = render_with_kustomize("config/admission") else {
        return;
    };
    check_all_typed(&admission, "kustomize config/admission");
    check_node_state_policy(&admission, &Names::release(), "kustomize config/admission");
}
