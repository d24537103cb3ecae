//! The optional ValidatingAdmissionPolicy that holds each agent to its own
//! node's IPSetNodeState.

use super::*;

/// The rule of the optional admission policy: the node-name claim of the
/// agent's token names the node state written. Spelt out here because it is
/// the whole point of the policy: change it deliberately, in both places.
pub(crate) const OWN_NODE_RULE: &str = "'authentication.kubernetes.io/node-name' in request.userInfo.extra \
     && request.userInfo.extra['authentication.kubernetes.io/node-name'] == [object.metadata.name]";

/// The optional ValidatingAdmissionPolicy and its binding: it holds the
/// agent ServiceAccount, and only it, to its own node's IPSetNodeState, for
/// every resource that ServiceAccount may write, in every served version.
pub(crate) fn check_node_state_policy(docs: &[Value], names: &Names, what: &str) {
    let vap: ValidatingAdmissionPolicy = one_of(docs, "ValidatingAdmissionPolicy", what);
    let binding: ValidatingAdmissionPolicyBinding =
        one_of(docs, "ValidatingAdmissionPolicyBinding", what);
    let name = vap.metadata.name.clone().unwrap();
    assert_eq!(name, format!("{}-own-node-state", names.agent()));
    let spec = vap.spec.unwrap();
    assert_eq!(
        spec.failure_policy.as_deref(),
        Some("Fail"),
        "{what}: fails closed"
    );
    assert!(spec.param_kind.is_none(), "{what}: no parameters");

    // Every resource the agent may write (per its grants), every operation
    // that writes it, every served version of the CRD.
    let writable: BTreeSet<String> = agent_grants()
        .into_iter()
        .filter(|(g, _, v)| {
            g == "ipsetmgr.io" && ["create", "update", "patch"].contains(&v.as_str())
        })
        .map(|(_, r, _)| r)
        .collect();
    assert!(writable.contains("ipsetnodestates") && writable.contains("ipsetnodestates/status"));
    let crds = crds_by_kind(&yaml_docs(&read("crds/ipsetmgr.yaml"), "crds"), "crds");
    let versions: Vec<String> = crds["IPSetNodeState"]
        .spec
        .versions
        .iter()
        .filter(|v| v.served)
        .map(|v| v.name.clone())
        .collect();
    let mc = spec.match_constraints.clone().expect("matchConstraints");
    assert_eq!(mc.match_policy.as_deref(), Some("Equivalent"));
    let rules = mc.resource_rules.unwrap_or_default();
    for res in &writable {
        for op in ["CREATE", "UPDATE"] {
            for version in &versions {
                let covered = rules.iter().any(|r| {
                    let has = |l: &Option<Vec<String>>, x: &str| {
                        l.as_deref().unwrap_or_default().iter().any(|y| y == x)
                    };
                    has(&r.api_groups, "ipsetmgr.io")
                        && has(&r.api_versions, version)
                        && has(&r.operations, op)
                        && has(&r.resources, res)
                });
                assert!(covered, "{what}: {op} of {res} ({version}) is not matched");
            }
        }
    }

    // Only the agents' requests, and the rule itself.
    let conditions = spec.match_conditions.unwrap_or_default();
    assert_eq!(conditions.len(), 1, "{what}: matchConditions");
    assert_eq!(
        conditions[0].expression,
        format!(
            "request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{}'",
            names.agent()
        ),
        "{what}: matches the agent ServiceAccount's requests only"
    );
    let validations = spec.validations.unwrap_or_default();
    assert_eq!(validations.len(), 1, "{what}: validations");
    assert_eq!(validations[0].expression, OWN_NODE_RULE, "{what}: the rule");
    assert!(validations[0].message.is_some(), "{what}: a message");

    let b = binding.spec;
    assert_eq!(b.policy_name, name, "{what}: binding");
    assert_eq!(
        b.validation_actions,
        vec!["Deny".to_string()],
        "{what}: the binding denies"
    );
    assert!(
        b.param_ref.is_none() && b.match_resources.is_none(),
        "{what}: the binding applies the policy as it is"
    );
}

/// What a cluster serving the admission policy lists (`--api-versions`).
const VAP_KIND: &str = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";

#[test]
pub(crate) fn node_state_admission_policy_is_optional_and_holds_agents_to_their_node() {
    needs_helm!("node_state_admission_policy_is_optional_and_holds_agents_to_their_node");
    let what = "chart with nodeStateAdmissionPolicy";
    let values: Value = serde_saphyr::from_str(&read("charts/ipsetmgr/values.yaml")).unwrap();
    assert_eq!(
        values["nodeStateAdmissionPolicy"]["enabled"], "auto",
        "on by default where the cluster is 1.30 or newer"
    );
    // auto asks for the kind to be served and the version to be 1.30 or
    // newer; an offline render lists no kinds unless told (--api-versions),
    // so it leaves the policy out by default. true and false say it
    // outright.
    let vaps = |kube: &str, served: bool, enabled: Value| {
        let r = support::helm::template(&support::helm::Render {
            release: RELEASE,
            namespace: NAMESPACE,
            api_versions: if served { &[VAP_KIND] } else { &[] },
            kube_version: Some(kube),
            overrides: &[("nodeStateAdmissionPolicy.enabled", enabled)],
            include_crds: false,
        })
        .unwrap();
        r.docs
            .iter()
            .filter(|d| kind_of(d) == "ValidatingAdmissionPolicy")
            .count()
    };
    for (kube, served, enabled, want) in [
        ("v1.30.0", true, json!("auto"), 1),
        ("v1.34.9", true, json!("auto"), 1),
        ("v1.34.9", false, json!("auto"), 0),
        ("v1.29.9", true, json!("auto"), 0),
        ("v1.25.2", true, json!("auto"), 0),
        ("v1.25.2", false, json!("auto"), 0),
        ("v1.25.2", false, json!(true), 1),
        ("v1.34.9", true, json!(false), 0),
    ] {
        assert_eq!(
            vaps(kube, served, enabled.clone()),
            want,
            "{kube} kind listed={served} enabled={enabled}"
        );
    }
    let r = render_chart(&[("nodeStateAdmissionPolicy.enabled", json!(true))]);
    check_all_typed(&r.docs, what);
    check_node_state_policy(&r.docs, &Names::release(), what);
    check_rbac(&r.docs, &Names::release(), true, what);

    // With another name, the policy follows the agent's ServiceAccount.
    let r = render_chart(&[
        ("nodeStateAdmissionPolicy.enabled", json!(true)),
        ("fullnameOverride", json!("ipsm")),
    ]);
    check_node_state_policy(&r.docs, &Names("ipsm".into()), "chart, fullnameOverride");

    // kustomize users get the same objects from config/admission.
    let kust = load_kustomization(&repo("config/admission"));
    let what = "config/admission";
    check_all_typed(&kust, what);
    check_node_state_policy(&kust, &Names::release(), what);
    let chart =
        by_identity(&render_chart(&[("nodeStateAdmissionPolicy.enabled", json!(true))]).docs);
    let kust = by_identity(&kust);
    for (id, obj) in &kust {
        let other = chart
            .get(id)
            .unwrap_or_else(|| panic!("{what}: {id} is not in the chart"));
        if let Some(diff) = first_difference(&obj["spec"], &other["spec"], "") {
            panic!("{id}: {what} vs chart: spec{diff}");
        }
    }
    assert_eq!(kust.len(), 2, "{what}: the policy and its binding");
}
