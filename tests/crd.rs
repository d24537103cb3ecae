//! `crds/ipsetpolicy.yaml` must be exactly what `ipsetmgr crd` prints.

#[test]
fn crd_file_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/ipsetpolicy.yaml");
    let on_disk = std::fs::read_to_string(path).unwrap_or_default();
    let generated = ipsetmgr::crd_yaml();
    if std::env::var_os("IPSETMGR_UPDATE_CRD").is_some() {
        std::fs::write(path, &generated).expect("write crds/ipsetpolicy.yaml");
        return;
    }
    assert!(
        on_disk == generated,
        "crds/ipsetpolicy.yaml is out of date with the Rust types; \
         run `cargo run -- crd > crds/ipsetpolicy.yaml` \
         (or IPSETMGR_UPDATE_CRD=1 cargo test --test crd)"
    );
}

#[test]
fn crd_schema_essentials() {
    let yaml = ipsetmgr::crd_yaml();
    let crd: serde_json::Value = serde_saphyr::from_str(&yaml).expect("CRD YAML parses");
    let v = &crd["spec"]["versions"][0];
    assert_eq!(crd["spec"]["scope"], "Cluster");
    assert_eq!(crd["spec"]["names"]["shortNames"][0], "ipsp");
    assert!(
        v["subresources"]["status"].is_object(),
        "status subresource"
    );
    let schema = &v["schema"]["openAPIV3Schema"]["properties"];
    let nodes = &schema["status"]["properties"]["nodes"];
    assert_eq!(nodes["x-kubernetes-list-type"], "map");
    assert_eq!(nodes["x-kubernetes-list-map-keys"][0], "nodeName");
    assert!(
        nodes["items"]["required"]
            .as_array()
            .is_some_and(|r| r.iter().any(|k| k == "nodeName")),
        "a list-map key must be required"
    );
    let members = &schema["spec"]["properties"]["members"];
    assert!(
        members.get("maxItems").is_none(),
        "maxElem governs the count"
    );
    assert!(members["items"]["pattern"].is_string());
    let cols: Vec<&str> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cols, ["Type", "Family", "Synced", "Problems", "Age"]);
    // Every field has a description for `kubectl explain`.
    fn check(path: &str, s: &serde_json::Value) {
        if let Some(props) = s.get("properties").and_then(|p| p.as_object()) {
            for (k, p) in props {
                let here = format!("{path}.{k}");
                assert!(p.get("description").is_some(), "{here} has no description");
                check(&here, p);
            }
        }
        if let Some(items) = s.get("items") {
            check(&format!("{path}[]"), items);
        }
    }
    check("spec", &schema["spec"]);
    check("status", &schema["status"]);
}
