//! The CRDs: `crds/ipsetmgr.yaml` must be exactly what `ipsetmgr crd`
//! prints, and every schema must be one a real API server accepts
//! (structural: a type everywhere, no `$ref`, list-map keys required; no
//! integer a Rust type cannot hold) and explains itself (`kubectl explain`).

use serde_json::Value;

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/ipsetmgr.yaml");

fn crds() -> Vec<Value> {
    serde_saphyr::from_multiple(&ipsetmgr_api::crd_yaml()).expect("the CRD stream parses")
}

fn by_kind<'a>(crds: &'a [Value], kind: &str) -> &'a Value {
    crds.iter()
        .find(|c| c["spec"]["names"]["kind"] == kind)
        .unwrap_or_else(|| panic!("no CRD for {kind}"))
}

fn version(crd: &Value) -> &Value {
    let versions = crd["spec"]["versions"].as_array().expect("versions");
    assert_eq!(versions.len(), 1, "one served version");
    &versions[0]
}

fn schema(crd: &Value) -> &Value {
    &version(crd)["schema"]["openAPIV3Schema"]
}

#[test]
fn crd_file_is_current() {
    let on_disk = std::fs::read_to_string(FILE).unwrap_or_default();
    let generated = ipsetmgr_api::crd_yaml();
    if std::env::var_os("IPSETMGR_UPDATE_CRD").is_some() {
        std::fs::write(FILE, &generated).expect("write crds/ipsetmgr.yaml");
        return;
    }
    assert!(
        on_disk == generated,
        "crds/ipsetmgr.yaml is out of date with the Rust types; \
         run `cargo run -- crd > crds/ipsetmgr.yaml` \
         (or IPSETMGR_UPDATE_CRD=1 cargo test --test crd), then scripts/sync-crds.sh"
    );
}

/// Walk a schema: structural rules and descriptions.
fn check_structural(path: &str, s: &Value, top: bool) {
    assert!(
        s.get("$ref").is_none(),
        "{path}: $ref is not allowed in a CRD"
    );
    let preserve = s
        .get("x-kubernetes-preserve-unknown-fields")
        .is_some_and(|v| v == true)
        || s.get("x-kubernetes-int-or-string").is_some();
    assert!(
        s.get("type").is_some() || preserve,
        "{path}: every schema node needs a type"
    );
    if !top {
        assert!(s.get("description").is_some(), "{path}: no description");
    }
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        assert!(
            s.get("additionalProperties").is_none(),
            "{path}: properties and additionalProperties are exclusive"
        );
        for (k, p) in props {
            check_structural(&format!("{path}.{k}"), p, false);
        }
    }
    if s.get("format").is_some_and(|f| f == "uint32") {
        assert!(
            s.get("maximum").is_some(),
            "{path}: a uint32 needs a maximum"
        );
    }
    if s.get("x-kubernetes-list-type").is_some_and(|t| t == "map") {
        let keys = s["x-kubernetes-list-map-keys"]
            .as_array()
            .expect("map keys");
        let required = s["items"]["required"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for k in keys {
            assert!(
                required.contains(k),
                "{path}: list-map key {k} must be required"
            );
        }
    }
    if let Some(items) = s.get("items") {
        // Items of a list carry the list's description.
        check_structural(&format!("{path}[]"), items, true);
    }
}

#[test]
fn every_schema_is_structural_and_explained() {
    let all = crds();
    assert_eq!(all.len(), 3);
    for crd in &all {
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap();
        assert_eq!(crd["spec"]["scope"], "Cluster", "{kind}");
        assert_eq!(crd["spec"]["group"], "ipsetmgr.io");
        assert!(
            crd["spec"]["names"]["categories"]
                .as_array()
                .is_some_and(|c| c.iter().any(|x| x == "ipsetmgr")),
            "{kind}: `kubectl get ipsetmgr` lists every kind"
        );
        let s = schema(crd);
        for part in ["spec", "status"] {
            if let Some(p) = s["properties"].get(part) {
                check_structural(&format!("{kind}.{part}"), p, false);
            }
        }
    }
}

#[test]
fn policy_schema() {
    let all = crds();
    let crd = by_kind(&all, "IPSetPolicy");
    assert_eq!(crd["spec"]["names"]["shortNames"][0], "ipsp");
    let v = version(crd);
    assert!(
        v["subresources"]["status"].is_object(),
        "status subresource"
    );
    let props = &schema(crd)["properties"];
    let members = &props["spec"]["properties"]["members"];
    assert!(
        members.get("maxItems").is_none(),
        "maxElem governs the count"
    );
    assert!(members["items"]["pattern"].is_string());
    let spec = &props["spec"]["properties"];
    // What the compiler accepts, and no more (a hashSize of 2^26 was 512 MiB
    // of kernel memory per set on every node).
    assert_eq!(
        spec["maxElem"]["maximum"],
        f64::from(ipsetmgr_policy::compile::MAX_MAX_ELEM)
    );
    assert_eq!(
        spec["hashSize"]["maximum"],
        f64::from(ipsetmgr_policy::compile::MAX_HASH_SIZE)
    );
    let status = &props["status"]["properties"];
    assert!(
        status.get("nodes").is_none(),
        "no per-node entries in the policy"
    );
    let conditions = &status["conditions"];
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(conditions["x-kubernetes-list-map-keys"][0], "type");
    assert_eq!(
        status["summary"]["properties"]["failingNodes"]["maxItems"],
        5
    );
    let cols: Vec<(&str, i64)> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap(),
                c["priority"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        cols,
        [
            ("Type", 0),
            ("Family", 0),
            ("Synced", 0),
            ("Problems", 0),
            ("Ready", 0),
            ("Age", 0),
            ("Members", 1),
            ("Sets", 1),
            ("Message", 1)
        ]
    );
    // FAMILY comes from the status, where the controller writes "-" for
    // types without a family; the spec's defaulted IPv4 would be wrong.
    let family = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "Family")
        .unwrap();
    assert_eq!(family["jsonPath"], ".status.summary.family");
}

#[test]
fn node_state_schema() {
    let all = crds();
    let crd = by_kind(&all, "IPSetNodeState");
    assert_eq!(crd["spec"]["names"]["plural"], "ipsetnodestates");
    assert!(version(crd)["subresources"]["status"].is_object());
    let status = &schema(crd)["properties"]["status"]["properties"];
    let policies = &status["policies"];
    assert_eq!(policies["x-kubernetes-list-type"], "map");
    assert_eq!(policies["x-kubernetes-list-map-keys"][0], "name");
    for field in ["heartbeatTime", "heartbeatIntervalSeconds", "agentVersion"] {
        assert!(status.get(field).is_some(), "{field}");
    }
    let entry = &policies["items"]["properties"];
    for field in [
        "observedGeneration",
        "synced",
        "setNames",
        "members",
        "problems",
        "error",
        "lastSyncTime",
    ] {
        assert!(entry.get(field).is_some(), "{field}");
    }
}

#[test]
fn member_slice_schema() {
    let all = crds();
    let crd = by_kind(&all, "IPSetMemberSlice");
    let members = &schema(crd)["properties"]["spec"]["properties"]["members"];
    assert!(
        members["items"]["pattern"].is_string(),
        "same checks as policies"
    );
    assert!(
        version(crd).get("subresources").is_none(),
        "a slice is all spec"
    );
}

/// Each `spec.membersFrom[]` entry names exactly one source: the schema says
/// so with min/maxProperties (which every API server version checks), and
/// the status entries are a bounded list-map keyed by the source's index.
#[test]
fn members_from_entries_are_one_source_each() {
    let crds = crds();
    let policy = schema(by_kind(&crds, "IPSetPolicy"));
    let from = &policy["properties"]["spec"]["properties"]["membersFrom"];
    assert_eq!(from["type"], "array");
    assert_eq!(from["maxItems"], 16);
    let item = &from["items"];
    assert_eq!(
        (
            item["minProperties"].as_u64(),
            item["maxProperties"].as_u64()
        ),
        (Some(1), Some(1))
    );
    let kinds: Vec<&str> = item["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(kinds, ["file", "nodes", "pods", "services", "url"]);
    let url = &item["properties"]["url"];
    assert_eq!(url["required"], serde_json::json!(["url"]));
    assert_eq!(
        url["properties"]["format"]["enum"],
        serde_json::json!(["text", "json"])
    );
    let sources = &policy["properties"]["status"]["properties"]["sources"];
    assert_eq!(sources["x-kubernetes-list-type"], "map");
    assert_eq!(
        sources["x-kubernetes-list-map-keys"],
        serde_json::json!(["index"])
    );
    assert_eq!(sources["maxItems"], 16);
}
