//! The CRD copies (crds/, the chart, kustomize) and what `ipsetmgr crd`
//! prints are one and the same.

use super::*;

/// The three CRDs of `crds/ipsetmgr.yaml`, typed, by kind.
pub(crate) fn crds_by_kind(
    docs: &[Value],
    what: &str,
) -> BTreeMap<String, CustomResourceDefinition> {
    let crds: Vec<CustomResourceDefinition> = all_of(docs, "CustomResourceDefinition", what);
    let by_kind: BTreeMap<String, CustomResourceDefinition> = crds
        .into_iter()
        .map(|c| (c.spec.names.kind.clone(), c))
        .collect();
    assert_eq!(
        by_kind.keys().map(String::as_str).collect::<Vec<_>>(),
        ["IPSetMemberSlice", "IPSetNodeState", "IPSetPolicy"],
        "{what}: the CRDs, one per kind"
    );
    let names: BTreeSet<String> = by_kind
        .values()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(ipsetmgr_api::crd_names()),
        "{what}: CRD names"
    );
    by_kind
}

#[test]
pub(crate) fn crd_copies_are_identical() {
    let root = read("crds/ipsetmgr.yaml");
    for copy in [
        "charts/ipsetmgr/crds/ipsetmgr.yaml",
        "config/crd/ipsetmgr.yaml",
    ] {
        assert!(
            read(copy) == root,
            "{copy} differs from crds/ipsetmgr.yaml: run scripts/sync-crds.sh"
        );
    }
    // The chart's crds/ holds only this file: Helm installs every file there.
    let chart_crds: BTreeSet<String> = std::fs::read_dir(repo("charts/ipsetmgr/crds"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        chart_crds,
        BTreeSet::from(["ipsetmgr.yaml".to_string()]),
        "charts/ipsetmgr/crds/"
    );
    // Only the generic facts of the resources (the content is `ipsetmgr
    // crd`'s, checked by tests/crd.rs).
    let docs = yaml_docs(&root, "crds/ipsetmgr.yaml");
    check_all_typed(&docs, "crds/ipsetmgr.yaml");
    let crds = crds_by_kind(&docs, "crds/ipsetmgr.yaml");
    for (kind, plural, short, status) in [
        ("IPSetPolicy", "ipsetpolicies", "ipsp", true),
        ("IPSetMemberSlice", "ipsetmemberslices", "ipsms", false),
        ("IPSetNodeState", "ipsetnodestates", "ipsns", true),
    ] {
        let crd = &crds[kind];
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some(format!("{plural}.ipsetmgr.io").as_str())
        );
        assert_eq!(crd.spec.group, "ipsetmgr.io");
        assert_eq!(crd.spec.scope, "Cluster", "{kind} is cluster-scoped");
        assert_eq!(crd.spec.names.plural, plural);
        assert!(
            crd.spec
                .names
                .short_names
                .clone()
                .unwrap_or_default()
                .contains(&short.to_string()),
            "{kind}: short name {short}"
        );
        let v = crd
            .spec
            .versions
            .iter()
            .find(|v| v.name == "v1alpha1")
            .unwrap_or_else(|| panic!("{kind}: version v1alpha1"));
        assert!(v.served && v.storage);
        // The RBAC grants `<plural>/status`: it must exist where granted.
        assert_eq!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            status,
            "{kind}: status subresource"
        );
    }
    let v = &crds["IPSetPolicy"].spec.versions[0];
    let schema = v
        .schema
        .as_ref()
        .unwrap()
        .open_api_v3_schema
        .as_ref()
        .unwrap();
    let spec = &schema.properties.as_ref().unwrap()["spec"];
    let props = spec.properties.as_ref().unwrap();
    for field in [
        "type",
        "family",
        "members",
        "nodeSelector",
        "maxElem",
        "hashSize",
    ] {
        assert!(
            props.contains_key(field),
            "spec.{field} missing from the CRD schema"
        );
    }
}
