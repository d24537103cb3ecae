//! The sample policies (config/samples, config/samples-sources) and the e2e
//! kind cluster's shape.

use super::*;

#[test]
pub(crate) fn samples_are_valid_policies_one_per_type() {
    use ipsetmgr_ipset::{Naming, SetType};
    use ipsetmgr_policy::{compile, load_policies};

    let dir = repo("config/samples");
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            text.starts_with('#'),
            "{}: samples start with an explaining comment",
            p.display()
        );
    }
    let loaded = load_policies(&dir).unwrap_or_else(|e| panic!("{e}"));
    let policies: Vec<_> = loaded.iter().map(|l| l.policy.clone()).collect();
    let types: BTreeSet<String> = policies
        .iter()
        .map(|p| format!("{:?}", p.spec.set_type))
        .collect();
    for t in SetType::ALL {
        assert!(types.contains(&format!("{t:?}")), "no sample of type {t:?}");
    }
    assert!(
        policies.iter().any(|p| p.spec.set_type == SetType::HashNet
            && p.spec.family == ipsetmgr_policy::FamilySpec::Dual
            && p.spec.members.iter().any(|m| m.ends_with(" nomatch"))
            && p.spec.members.iter().any(|m| m.contains(':'))),
        "a Dual hash:net sample with IPv6 and nomatch"
    );

    let naming = Naming::default();
    let edge = BTreeMap::from([("ipsetmgr.io/role".to_string(), "edge".to_string())]);
    let plain = BTreeMap::new();
    for labels in [None, Some(&edge), Some(&plain)] {
        let compiled = compile(&policies, &naming, labels);
        let errors: Vec<String> = compiled.errors.iter().map(|e| e.to_string()).collect();
        assert!(
            errors.is_empty(),
            "samples rejected (labels {labels:?}): {errors:#?}"
        );
        assert!(!compiled.sets.is_empty());
    }
    let all = compile(&policies, &naming, None);
    assert!(all.sets.iter().any(|s| s.name == "ipm4-blocklist"));
    assert!(all.sets.iter().any(|s| s.name == "ipm6-trusted-networks"));
}

#[test]
pub(crate) fn e2e_kind_cluster_has_an_edge_worker() {
    let cfg: Value = serde_saphyr::from_str(&read("e2e/kind-config.yaml")).unwrap();
    assert_eq!(cfg["kind"], "Cluster");
    let nodes = cfg["nodes"].as_array().unwrap();
    let roles: Vec<&str> = nodes.iter().map(|n| n["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["control-plane", "worker", "worker"]);
    let edge = nodes
        .iter()
        .filter(|n| n["labels"]["ipsetmgr.io/role"] == "edge")
        .count();
    assert_eq!(edge, 1, "exactly one worker labelled ipsetmgr.io/role=edge");
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(repo("e2e/run.sh"))
        .status()
        .unwrap();
    assert!(syntax.success(), "e2e/run.sh has a bash syntax error");
    // It waits for both components, under the names the chart gives them.
    let run = read("e2e/run.sh");
    let names = Names::release();
    assert!(run.contains(&format!("RELEASE=\"{RELEASE}\"")));
    assert_eq!(names.controller(), format!("{RELEASE}-controller"));
    for wait in [
        "rollout status \"daemonset/$RELEASE\"",
        "rollout status \"deployment/$CONTROLLER\"",
        "wait --for=condition=Available \"deployment/$CONTROLLER\"",
    ] {
        assert!(run.contains(wait), "e2e/run.sh does not {wait}");
    }
    assert!(run.contains("CONTROLLER=\"$RELEASE-controller\""));
}

/// The samples of `membersFrom` (cluster sources and a url): apart from
/// `config/samples`, which `ipsetmgr apply` takes whole in file mode. Each
/// shows the iptables rule that matches its set, under the real kernel name.
#[test]
pub(crate) fn source_samples_show_the_rule_for_their_real_kernel_set() {
    use ipsetmgr_ipset::{Naming, SetType};
    use ipsetmgr_policy::compile;
    use ipsetmgr_policy::load::load_file;

    let dir = repo("config/samples-sources");
    let mut kinds = BTreeSet::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 3, "{files:?}");
    for p in files {
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            text.starts_with('#'),
            "{}: starts with a comment",
            p.display()
        );
        let loaded = load_file(&p).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(loaded.policies.len(), 1, "{}", p.display());
        let policy = &loaded.policies[0].policy;
        assert_eq!(policy.spec.members_from.len(), 1, "{}", p.display());
        kinds.insert(policy.spec.members_from[0].kind());
        let compiled = compile([policy], &Naming::default(), None);
        assert!(compiled.errors.is_empty(), "{:?}", compiled.errors);
        let names: Vec<&str> = compiled.sets.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names.len(), 1, "{}: one IPv4 set", p.display());
        let rule = text
            .lines()
            .find(|l| l.starts_with("#   iptables -I INPUT "))
            .unwrap_or_else(|| panic!("{}: no iptables rule", p.display()));
        assert!(
            rule.contains(&format!(" -m set --match-set {} src -j ", names[0])),
            "{}: {rule} does not match set {}",
            p.display(),
            names[0]
        );
        if policy.spec.members_from[0].kind() == "url" {
            let url = policy.spec.members_from[0].url.as_ref().unwrap();
            assert_eq!(
                url.url,
                "https://iplists.firehol.org/files/firehol_level1.netset"
            );
            assert_eq!(policy.spec.set_type, SetType::HashNet);
        }
    }
    assert_eq!(kinds, BTreeSet::from(["nodes", "pods", "url"]));
}
