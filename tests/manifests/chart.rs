//! The chart: its metadata, default rendering, values reaching the agent
//! and controller, network policy, listeners, monitoring objects.

use super::*;

/// kubeVersion, the icon and Artifact Hub's annotations.
pub(crate) fn check_chart_yaml_extras(chart: &Value) {
    use base64::Engine;
    // The minimum docs/install.md states, with "-0" so that vendor builds
    // (v1.27.3-gke.100, pre-releases to semver) match.
    let kube = chart["kubeVersion"].as_str().expect("kubeVersion");
    let min = kube
        .strip_prefix(">=")
        .and_then(|v| v.strip_suffix(".0-0"))
        .unwrap_or_else(|| panic!("kubeVersion {kube:?}: expected >=X.Y.0-0"));
    assert_eq!(kube, ">=1.25.0-0");
    let docs = read("docs/install.md");
    assert!(
        docs.contains(&format!("Kubernetes {min} or newer")),
        "docs/install.md must state the minimum of Chart.yaml's kubeVersion, {min}"
    );

    // The icon is icon.svg, inline.
    let icon = chart["icon"].as_str().expect("icon");
    let b64 = icon
        .strip_prefix("data:image/svg+xml;base64,")
        .expect("icon: a data:image/svg+xml;base64 URL");
    let svg = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("icon: base64");
    assert_eq!(
        svg,
        read("charts/ipsetmgr/icon.svg").into_bytes(),
        "Chart.yaml's icon is not charts/ipsetmgr/icon.svg: base64 -w0 it again"
    );
    // Helm repeats it for every version in a repository's index.yaml.
    assert!(svg.len() < 2048, "icon.svg: keep it small");
    let text = String::from_utf8(svg).unwrap();
    assert!(text.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(text.trim_end().ends_with("</svg>"));
    assert!(
        read("charts/ipsetmgr/.helmignore")
            .lines()
            .any(|l| l == "icon.svg"),
        "the packaged chart needs no second copy of the icon"
    );

    // Artifact Hub reads its annotations as YAML inside strings.
    let ann = chart["annotations"].as_object().expect("annotations");
    let parse = |key: &str| -> Value {
        let text = ann[key]
            .as_str()
            .unwrap_or_else(|| panic!("{key}: a string"));
        serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{key}: {e}"))
    };
    let values: Value = serde_saphyr::from_str(&read("charts/ipsetmgr/values.yaml")).unwrap();
    let image = format!(
        "{}:{}",
        values["image"]["repository"].as_str().unwrap(),
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(
        parse("artifacthub.io/images"),
        json!([{"name": "ipsetmgr", "image": image}]),
        "artifacthub.io/images: the image the chart deploys by default"
    );
    let changes = parse("artifacthub.io/changes");
    for c in changes.as_array().expect("artifacthub.io/changes: a list") {
        let kind = c["kind"].as_str().unwrap_or_default();
        assert!(
            [
                "added",
                "changed",
                "deprecated",
                "removed",
                "fixed",
                "security"
            ]
            .contains(&kind),
            "artifacthub.io/changes: kind {kind:?}"
        );
        assert!(c["description"].is_string(), "artifacthub.io/changes: {c}");
    }
    for key in ann.keys() {
        assert!(key.starts_with("artifacthub.io/"), "annotation {key}");
    }
}

#[test]
pub(crate) fn chart_metadata_matches_the_crate() {
    let chart: Value = serde_saphyr::from_str(&read("charts/ipsetmgr/Chart.yaml")).unwrap();
    assert_eq!(chart["apiVersion"], "v2");
    assert_eq!(chart["name"], "ipsetmgr");
    assert_eq!(
        chart["appVersion"].as_str(),
        Some(env!("CARGO_PKG_VERSION")),
        "Chart.yaml appVersion must follow Cargo.toml's version (the image tag)"
    );
    check_chart_yaml_extras(&chart);
    let values: Value = serde_saphyr::from_str(&read("charts/ipsetmgr/values.yaml")).unwrap();
    assert_eq!(values["tolerations"], json!([{"operator": "Exists"}]));
    assert_eq!(values["priorityClassName"], "system-node-critical");
    // The binary's defaults (--listen, --health-listen), so that the chart
    // and a bare `ipsetmgr agent`/`controller` listen alike.
    assert_eq!(
        values["metrics"],
        json!({"address": "0.0.0.0", "port": AGENT_PORT})
    );
    assert_eq!(
        values["health"],
        json!({"address": AGENT_HEALTH.0, "port": AGENT_HEALTH.1})
    );
    assert_eq!(values["serviceMonitor"]["enabled"], false);
    assert_eq!(values["backend"], "netlink");
    assert_eq!(values["heartbeatInterval"], "60s");
    let c = &values["controller"];
    assert_eq!(c["enabled"], true);
    assert_eq!(c["replicas"], 1);
    assert_eq!(
        c["metrics"],
        json!({"address": "0.0.0.0", "port": CONTROLLER_PORT})
    );
    assert_eq!(
        c["health"],
        json!({"address": CONTROLLER_HEALTH.0, "port": CONTROLLER_HEALTH.1})
    );
    assert_eq!(
        c["resources"],
        json!({"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}})
    );
}

#[test]
pub(crate) fn chart_renders_with_default_values() {
    needs_helm!("chart_renders_with_default_values");
    let r = render_chart(&[]);
    check_all_typed(&r.docs, "chart");
    let kinds: BTreeSet<&str> = r.docs.iter().map(kind_of).collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "DaemonSet",
            "Deployment",
        ]),
        "objects rendered with default values (no ServiceMonitor; no admission \
         policy: an offline render lists no ValidatingAdmissionPolicy kind unless \
         given --api-versions, so it applies to a 1.25 cluster as it is)"
    );
    check_rbac(&r.docs, &Names::release(), true, "chart");
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", "chart");
    check_daemonset(&ds, &Listeners::agent(), "chart");
    check_agent_selector_is_0_1s(&ds, true, "chart");
    let c = agent_container(&ds);
    assert_eq!(
        c.image.as_deref(),
        Some("ipsetmgr:0.1.0"),
        "image tag defaults to appVersion"
    );
    assert_eq!(
        env_value(&c, "IPSETMGR_BACKEND").as_deref(),
        Some("netlink")
    );
    assert_eq!(
        env_value(&c, "IPSETMGR_HEARTBEAT_INTERVAL").as_deref(),
        Some("60s")
    );
    let pod = pod_of(&ds.spec.template);
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let d: Deployment = one_of(&r.docs, "Deployment", "chart");
    check_controller(&d, &Listeners::controller(), "chart");
    assert_eq!(d.spec.clone().replicas, Some(1));
    let cc = controller_container(&d);
    assert_eq!(cc.image, c.image, "one image for both components");
    assert_eq!(
        pod_of(&d.spec.template).priority_class_name,
        None,
        "the controller is not node-critical"
    );
    assert!(r.notes.contains("kubectl get ipsp"), "NOTES.txt renders");
    assert!(r.notes.contains("ipm4-blocklist"));
    assert!(r.notes.contains("deployment/ipsetmgr-controller"));
    assert!(r.notes.contains("kubectl get ipsns"));
}

#[test]
pub(crate) fn chart_bpf_backend_gets_its_capabilities_and_the_hosts_bpffs() {
    needs_helm!("chart_bpf_backend_gets_its_capabilities_and_the_hosts_bpffs");
    // Without bpf in the list: neither the capabilities nor the mount.
    let r = render_chart(&[("backend", json!("netlink,nft"))]);
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", "netlink,nft");
    let c = agent_container(&ds);
    let caps = c.security_context.clone().unwrap().capabilities.unwrap();
    assert_eq!(caps.add, Some(vec!["NET_ADMIN".to_string()]));
    assert!(c.volume_mounts.is_none());
    assert!(pod_of(&ds.spec.template).volumes.is_none());

    let r = render_chart(&[
        ("backend", json!("netlink,bpf")),
        ("bpf.path", json!("/run/bpffs")),
    ]);
    let what = "netlink,bpf";
    check_all_typed(&r.docs, what);
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", what);
    let c = agent_container(&ds);
    assert_eq!(
        env_value(&c, "IPSETMGR_BACKEND").as_deref(),
        Some("netlink,bpf")
    );
    assert_eq!(
        env_value(&c, "IPSETMGR_BPF_PATH").as_deref(),
        Some("/run/bpffs")
    );
    let sc = c.security_context.clone().unwrap();
    let caps = sc.capabilities.clone().unwrap();
    assert_eq!(
        caps.add,
        Some(vec![
            "NET_ADMIN".to_string(),
            "BPF".to_string(),
            "SYS_ADMIN".to_string()
        ])
    );
    assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
    assert_eq!(sc.privileged, Some(false), "still not privileged");
    let mounts = c.volume_mounts.clone().unwrap();
    assert_eq!(mounts.len(), 1);
    assert_eq!(mounts[0].mount_path, "/run/bpffs");
    let volumes = pod_of(&ds.spec.template).volumes.unwrap();
    assert_eq!(volumes.len(), 1);
    assert_eq!(volumes[0].name, mounts[0].name);
    let host = volumes[0].host_path.clone().expect("a hostPath volume");
    assert_eq!(host.path, "/run/bpffs");
    assert_eq!(host.type_.as_deref(), Some("Directory"));
}

#[test]
pub(crate) fn chart_xdp_option_reaches_the_agent_only_when_enabled() {
    needs_helm!("chart_xdp_option_reaches_the_agent_only_when_enabled");
    const XDP_ENV: [&str; 2] = ["IPSETMGR_XDP_INTERFACE", "IPSETMGR_XDP_DROP_FROM"];
    let no_xdp_flag = |c: &k8s_openapi::api::core::v1::Container, what: &str| {
        for name in XDP_ENV {
            assert_eq!(env_value(c, name), None, "{what}: {name}");
        }
        let args = c.args.clone().unwrap_or_default();
        assert!(
            !args.iter().any(|a| a.starts_with("--xdp")),
            "{what}: {args:?}"
        );
    };
    // The defaults, and the bpf backend alone: no XDP flag.
    for (what, overrides) in [
        ("defaults", vec![]),
        ("bpf without xdp", vec![("backend", json!("netlink,bpf"))]),
    ] {
        let r = render_chart(&overrides);
        let ds: DaemonSet = one_of(&r.docs, "DaemonSet", what);
        no_xdp_flag(&agent_container(&ds), what);
    }

    let what = "xdp enabled";
    let r = render_chart(&[
        ("backend", json!("netlink,bpf")),
        ("xdp.enabled", json!(true)),
        ("xdp.interface", json!("eth1")),
        ("xdp.dropFrom", json!(["blocklist", "scanners"])),
    ]);
    check_all_typed(&r.docs, what);
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", what);
    let c = agent_container(&ds);
    assert_eq!(
        env_value(&c, "IPSETMGR_XDP_INTERFACE").as_deref(),
        Some("eth1")
    );
    assert_eq!(
        env_value(&c, "IPSETMGR_XDP_DROP_FROM").as_deref(),
        Some("blocklist,scanners")
    );
    // No capability beyond the bpf backend's.
    let caps = c.security_context.clone().unwrap().capabilities.unwrap();
    assert_eq!(
        caps.add,
        Some(vec![
            "NET_ADMIN".to_string(),
            "BPF".to_string(),
            "SYS_ADMIN".to_string()
        ])
    );
}

#[test]
pub(crate) fn chart_values_reach_the_agent() {
    needs_helm!("chart_values_reach_the_agent");
    let r = render_chart(&[
        ("image.repository", json!("registry.example/ipsetmgr")),
        ("image.tag", json!("dev")),
        ("setPrefix", json!("fw")),
        ("backend", json!("cli")),
        ("resyncInterval", json!(15)),
        ("heartbeatInterval", json!("2m")),
        ("logFormat", json!("json")),
        ("metrics.port", json!(9555)),
        ("priorityClassName", json!("")),
        ("fullnameOverride", json!("ipsm")),
        ("podLabels", json!({"team": "net"})),
        ("podAnnotations", json!({"example.com/note": "x"})),
        ("imagePullSecrets", json!([{"name": "regcred"}])),
        (
            "affinity",
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}}),
        ),
    ]);
    let what = "chart with overrides";
    check_all_typed(&r.docs, what);
    check_rbac(&r.docs, &Names("ipsm".into()), true, what);
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", what);
    assert_eq!(ds.metadata.name.as_deref(), Some("ipsm"));
    check_daemonset(&ds, &Listeners::agent().with_metrics_port(9555), what);
    let c = agent_container(&ds);
    assert_eq!(c.image.as_deref(), Some("registry.example/ipsetmgr:dev"));
    assert_eq!(env_value(&c, "IPSETMGR_SET_PREFIX").as_deref(), Some("fw"));
    assert_eq!(env_value(&c, "IPSETMGR_BACKEND").as_deref(), Some("cli"));
    assert_eq!(
        env_value(&c, "IPSETMGR_RESYNC_INTERVAL").as_deref(),
        Some("15")
    );
    assert_eq!(
        env_value(&c, "IPSETMGR_HEARTBEAT_INTERVAL").as_deref(),
        Some("2m")
    );
    assert_eq!(
        env_value(&c, "IPSETMGR_LOG_FORMAT").as_deref(),
        Some("json")
    );
    let template = ds.spec.template;
    let labels = template.metadata.clone().unwrap().labels.unwrap();
    assert_eq!(labels.get("team").map(String::as_str), Some("net"));
    assert_eq!(
        labels.get("app.kubernetes.io/name").map(String::as_str),
        Some("ipsetmgr")
    );
    let annotations = template.metadata.unwrap().annotations.unwrap();
    assert_eq!(
        annotations.get("example.com/note").map(String::as_str),
        Some("x")
    );
    let pod = template.spec.unwrap();
    assert_eq!(
        pod.priority_class_name, None,
        "empty priorityClassName is left out"
    );
    assert_eq!(pod.image_pull_secrets.unwrap()[0].name, "regcred");
    assert!(pod.affinity.unwrap().node_affinity.is_some());

    // The settings both components share reach the controller too; the
    // agent's own do not.
    let d: Deployment = one_of(&r.docs, "Deployment", what);
    check_controller(&d, &Listeners::controller(), what);
    let cc = controller_container(&d);
    assert_eq!(cc.image.as_deref(), Some("registry.example/ipsetmgr:dev"));
    assert_eq!(env_value(&cc, "IPSETMGR_SET_PREFIX").as_deref(), Some("fw"));
    assert_eq!(
        env_value(&cc, "IPSETMGR_LOG_FORMAT").as_deref(),
        Some("json")
    );
    let cpod = pod_of(&d.spec.template);
    assert_eq!(cpod.image_pull_secrets.unwrap()[0].name, "regcred");
    assert!(cpod.affinity.is_none(), "affinity is the agent's");
}

#[test]
pub(crate) fn chart_values_reach_the_controller() {
    needs_helm!("chart_values_reach_the_controller");
    let r = render_chart(&[
        ("controller.replicas", json!(2)),
        ("controller.metrics.port", json!(9600)),
        (
            "controller.resources",
            json!({"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}),
        ),
        (
            "controller.nodeSelector",
            json!({"node-role.example/infra": "true"}),
        ),
        (
            "controller.tolerations",
            json!([{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}]),
        ),
        (
            "controller.priorityClassName",
            json!("system-cluster-critical"),
        ),
        (
            "controller.feedAllowCIDRs",
            json!(["10.20.0.0/16", "192.0.2.7"]),
        ),
        ("controller.feedDenyCIDRs", json!(["10.20.30.0/24"])),
        ("policyLimits.maxSetElements", json!(1_000_000)),
    ]);
    let what = "chart with controller overrides";
    check_all_typed(&r.docs, what);
    check_rbac(&r.docs, &Names::release(), true, what);
    let d: Deployment = one_of(&r.docs, "Deployment", what);
    check_controller(&d, &Listeners::controller().with_metrics_port(9600), what);
    let cc = controller_container(&d);
    assert_eq!(
        env_value(&cc, "IPSETMGR_FEED_ALLOW_CIDRS").as_deref(),
        Some("10.20.0.0/16,192.0.2.7")
    );
    assert_eq!(
        env_value(&cc, "IPSETMGR_FEED_DENY_CIDRS").as_deref(),
        Some("10.20.30.0/24")
    );
    // One cap for the agents and the controller, as an integer (Helm holds
    // numbers as floats; 1e+06 would not parse).
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", what);
    for c in [&cc, &agent_container(&ds)] {
        assert_eq!(
            env_value(c, "IPSETMGR_MAX_SET_ELEMENTS").as_deref(),
            Some("1000000")
        );
        assert_eq!(
            env_value(c, "IPSETMGR_MAX_HASH_SIZE").as_deref(),
            Some("1048576")
        );
    }
    let spec = d.spec.clone();
    assert_eq!(spec.replicas, Some(2));
    let pod = pod_of(&spec.template);
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-cluster-critical")
    );
    // Helm merges a map given in values into the default map (to drop a
    // default key, set it to null).
    assert_eq!(
        pod.node_selector,
        Some(BTreeMap::from([
            ("kubernetes.io/os".to_string(), "linux".to_string()),
            ("node-role.example/infra".to_string(), "true".to_string())
        ]))
    );
    assert_eq!(pod.tolerations.unwrap()[0].key.as_deref(), Some("infra"));
    let c = controller_container(&d);
    let res = c.resources.unwrap();
    assert_eq!(
        res.limits.unwrap()["memory"],
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into())
    );
    // The agent keeps its own port.
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", what);
    check_daemonset(&ds, &Listeners::agent(), what);
}

/// The controller may read Pods, Services and Namespaces only when the
/// values say the cluster uses those member sources; the chart's objects
/// for that are config/member-sources's.
#[test]
pub(crate) fn member_source_rights_follow_the_values() {
    needs_helm!("member_source_rights_follow_the_values");
    for (pods, services) in [(false, false), (true, false), (false, true), (true, true)] {
        let r = render_chart(&[
            ("memberSources.pods", json!(pods)),
            ("memberSources.services", json!(services)),
        ]);
        let what = format!("memberSources pods={pods} services={services}");
        check_all_typed(&r.docs, &what);
        check_rbac_with(
            &r.docs,
            &Names::release(),
            true,
            Sources { pods, services },
            &what,
        );
    }
    let chart = render_chart(&[
        ("memberSources.pods", json!(true)),
        ("memberSources.services", json!(true)),
    ]);
    let chart = by_identity(&chart.docs);
    let kust = load_kustomization(&repo("config/member-sources"));
    check_all_typed(&kust, "config/member-sources");
    for (id, obj) in by_identity(&kust) {
        let other = chart
            .get(&id)
            .unwrap_or_else(|| panic!("{id} is not in the chart"));
        for field in ["rules", "roleRef", "subjects"] {
            if let Some(diff) = first_difference(&obj[field], &other[field], "") {
                panic!("{id}: config/member-sources vs chart: {field}{diff}");
            }
        }
    }
}

/// The optional NetworkPolicy: the controller's pods only, egress only, to
/// DNS, the API server's given addresses and public feeds; without the API
/// server's addresses it refuses to render.
#[test]
pub(crate) fn chart_network_policy_limits_the_controllers_egress() {
    needs_helm!("chart_network_policy_limits_the_controllers_egress");
    let e = try_render_chart(&[("controller.networkPolicy.enabled", json!(true))])
        .err()
        .expect("rendered without the API server's addresses");
    assert!(e.contains("controller.networkPolicy.apiServerCIDRs"), "{e}");
    let r = render_chart(&[
        ("controller.networkPolicy.enabled", json!(true)),
        (
            "controller.networkPolicy.apiServerCIDRs",
            json!(["10.96.0.1/32", "192.168.10.5/32"]),
        ),
    ]);
    let what = "chart with controller.networkPolicy";
    check_all_typed(&r.docs, what);
    let np: k8s_openapi::api::networking::v1::NetworkPolicy =
        one_of(&r.docs, "NetworkPolicy", what);
    let spec = np.spec.unwrap();
    assert_eq!(spec.policy_types, Some(vec!["Egress".to_string()]));
    let d: Deployment = one_of(&r.docs, "Deployment", what);
    let pod_labels = d.spec.template.metadata.unwrap().labels.unwrap();
    let sel = spec.pod_selector.unwrap().match_labels.unwrap();
    assert!(
        sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
        "selects the controller's pods"
    );
    assert!(
        sel.get("app.kubernetes.io/component")
            .is_some_and(|c| c == "controller")
    );
    let egress = spec.egress.unwrap();
    assert_eq!(egress.len(), 3, "DNS, the API server, feeds");
    let cidrs = |i: usize| -> Vec<String> {
        egress[i]
            .to
            .clone()
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p.ip_block.as_ref().map(|b| b.cidr.clone()))
            .collect()
    };
    assert_eq!(cidrs(1), ["10.96.0.1/32", "192.168.10.5/32"]);
    let feeds = egress[2].to.clone().unwrap();
    let except = feeds[0].ip_block.as_ref().unwrap().except.clone().unwrap();
    for private in ["10.0.0.0/8", "169.254.0.0/16", "127.0.0.0/8"] {
        assert!(
            except.iter().any(|e| e == private),
            "{private} is excepted from feeds"
        );
    }
    assert!(
        render_chart(&[])
            .docs
            .iter()
            .all(|d| kind_of(d) != "NetworkPolicy"),
        "off by default"
    );
}

#[test]
pub(crate) fn chart_controller_can_be_disabled() {
    needs_helm!("chart_controller_can_be_disabled");
    let r = render_chart(&[("controller.enabled", json!(false))]);
    let what = "chart without controller";
    check_all_typed(&r.docs, what);
    check_rbac(&r.docs, &Names::release(), false, what);
    for d in &r.docs {
        assert_ne!(
            d["metadata"]["labels"]["app.kubernetes.io/component"],
            "controller",
            "{what}: {} rendered",
            identity(d)
        );
    }
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", what);
    check_daemonset(&ds, &Listeners::agent(), what);
}

pub(crate) fn probe(p: Option<k8s_openapi::api::core::v1::Probe>) -> Value {
    serde_json::to_value(p.expect("a probe")).unwrap()
}

#[test]
pub(crate) fn chart_listeners_and_probe_timings_are_values() {
    needs_helm!("chart_listeners_and_probe_timings_are_values");
    // Health on the metrics listener (one listener serves every path), and
    // probe timings changed one field at a time (Helm merges the rest).
    let r = render_chart(&[
        ("health.address", json!("0.0.0.0")),
        ("health.port", json!(AGENT_PORT)),
        ("livenessProbe.periodSeconds", json!(20)),
        ("readinessProbe.failureThreshold", json!(5)),
        ("controller.metrics.port", json!(9600)),
        ("controller.health.port", json!(9601)),
        ("controller.livenessProbe.timeoutSeconds", json!(2)),
        ("controller.readinessProbe.initialDelaySeconds", json!(3)),
    ]);
    let what = "chart with listener and probe values";
    check_all_typed(&r.docs, what);
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", what);
    let one = Listeners::new(("0.0.0.0", AGENT_PORT), ("0.0.0.0", AGENT_PORT));
    check_daemonset(&ds, &one, what);
    let c = agent_container(&ds);
    let (live, ready) = (probe(c.liveness_probe), probe(c.readiness_probe));
    assert_eq!(
        live["httpGet"],
        json!({"path": "/livez", "port": AGENT_PORT})
    );
    assert_eq!(
        (&live["periodSeconds"], &live["initialDelaySeconds"]),
        (&json!(20), &json!(10)),
        "{what}: liveness period set, the rest from the defaults"
    );
    assert_eq!(ready["failureThreshold"], 5);
    assert_eq!(ready["periodSeconds"], 5);

    let d: Deployment = one_of(&r.docs, "Deployment", what);
    check_controller(
        &d,
        &Listeners::new(("0.0.0.0", 9600), ("0.0.0.0", 9601)),
        what,
    );
    let cc = controller_container(&d);
    let (live, ready) = (probe(cc.liveness_probe), probe(cc.readiness_probe));
    assert_eq!(live["timeoutSeconds"], 2);
    assert_eq!(live["failureThreshold"], 6);
    assert_eq!(ready["initialDelaySeconds"], 3);

    // A health address other than the wildcard is probed there (the agent
    // shares the node's network namespace with the kubelet).
    let r = render_chart(&[("metrics.address", json!("127.0.0.1"))]);
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", "chart, loopback metrics");
    check_daemonset(
        &ds,
        &Listeners::new(("127.0.0.1", AGENT_PORT), AGENT_HEALTH),
        "chart, loopback metrics",
    );
}

#[test]
pub(crate) fn chart_refuses_one_port_on_two_addresses() {
    needs_helm!("chart_refuses_one_port_on_two_addresses");
    // The same port on two addresses: the second bind would fail at start.
    for (port, addr, other) in [
        ("health.port", "health.address", "9477"),
        (
            "controller.health.port",
            "controller.health.address",
            "9478",
        ),
    ] {
        let other: i64 = other.parse().unwrap();
        let e = try_render_chart(&[(port, json!(other)), (addr, json!("10.1.2.3"))])
            .err()
            .unwrap_or_else(|| panic!("{port}={other}, {addr}=10.1.2.3 rendered"));
        assert!(
            e.contains("metrics.port and health.port are equal but their addresses differ"),
            "{e}"
        );
    }
}

#[test]
pub(crate) fn chart_extra_args_and_env_are_appended_and_change_nothing_else() {
    needs_helm!("chart_extra_args_and_env_are_appended_and_change_nothing_else");
    let agent_env = json!([
        {"name": "RUST_LOG", "value": "info,ipsetmgr=debug"},
        {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
    ]);
    let controller_env = json!([{"name": "RUST_LOG", "value": "debug"}]);
    let r = render_chart(&[
        ("extraArgs", json!(["--lock-wait", "1m"])),
        ("extraEnv", agent_env.clone()),
        ("controller.extraArgs", json!(["--namespace", "elsewhere"])),
        ("controller.extraEnv", controller_env.clone()),
    ]);
    let what = "chart with extraArgs and extraEnv";
    check_all_typed(&r.docs, what);
    let base = render_chart(&[]);
    let pod = |docs: &[Value], kind: &str| -> Value {
        let d = docs.iter().find(|d| kind_of(d) == kind).unwrap();
        d["spec"]["template"]["spec"].clone()
    };
    for (kind, args, env) in [
        ("DaemonSet", json!(["--lock-wait", "1m"]), &agent_env),
        (
            "Deployment",
            json!(["controller", "--namespace", "elsewhere"]),
            &controller_env,
        ),
    ] {
        let (mut got, want) = (pod(&r.docs, kind), pod(&base.docs, kind));
        let c = &mut got["containers"][0];
        assert_eq!(c["args"], args, "{what}: {kind} args");
        // After the chart's own variables, in order.
        let base_env = want["containers"][0]["env"].as_array().unwrap().clone();
        let mut full = base_env.clone();
        full.extend(env.as_array().unwrap().iter().cloned());
        assert_eq!(c["env"], Value::Array(full), "{what}: {kind} env");
        // Nothing else changed.
        c["env"] = Value::Array(base_env);
        match kind {
            "DaemonSet" => drop(c.as_object_mut().unwrap().remove("args")),
            _ => c["args"] = json!(["controller"]),
        }
        if let Some(diff) = first_difference(&got, &want, "") {
            panic!("{what}: {kind} pod changed beyond args and env: {diff}");
        }
    }
}

#[test]
pub(crate) fn chart_update_strategies_are_values() {
    needs_helm!("chart_update_strategies_are_values");
    let r = render_chart(&[
        ("updateStrategy.rollingUpdate.maxUnavailable", json!("10%")),
        ("controller.updateStrategy.type", json!("Recreate")),
        // Kubernetes refuses rollingUpdate with Recreate; Helm merged the
        // default's in, so it must be deleted.
        ("controller.updateStrategy.rollingUpdate", Value::Null),
    ]);
    let what = "chart with update strategies";
    check_all_typed(&r.docs, what);
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", what);
    let s = ds.spec.update_strategy.unwrap();
    assert_eq!(s.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(
        s.rolling_update.unwrap().max_unavailable,
        Some(IntOrString::String("10%".into()))
    );
    let d: Deployment = one_of(&r.docs, "Deployment", what);
    let s = d.spec.strategy.unwrap();
    assert_eq!(s.type_.as_deref(), Some("Recreate"));
    assert!(s.rolling_update.is_none(), "{what}: no rollingUpdate");
}

/// Whether a label selector (plain labels) selects these labels.
pub(crate) fn selects(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

pub(crate) fn labels_of(v: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(v.clone()).unwrap_or_default()
}

#[test]
pub(crate) fn chart_service_monitors_are_optional_and_select_their_component() {
    needs_helm!("chart_service_monitors_are_optional_and_select_their_component");
    assert!(
        !render_chart(&[])
            .docs
            .iter()
            .any(|d| matches!(kind_of(d), "Service" | "ServiceMonitor")),
        "no Service or ServiceMonitor by default"
    );
    let r = render_chart_on(
        &with_monitoring(),
        &[
            ("serviceMonitor.enabled", json!(true)),
            ("serviceMonitor.labels", json!({"release": "prometheus"})),
        ],
    );
    let what = "chart with serviceMonitor";
    check_all_typed(&r.docs, what);
    let ds: DaemonSet = one_of(&r.docs, "DaemonSet", what);
    let d: Deployment = one_of(&r.docs, "Deployment", what);
    let pod_labels = |t: &PodTemplateSpec| t.metadata.clone().unwrap().labels.unwrap();
    let pods = [
        ("agent", pod_labels(&ds.spec.template), AGENT_PORT),
        ("controller", pod_labels(&d.spec.template), CONTROLLER_PORT),
    ];
    let services: Vec<Value> = r
        .docs
        .iter()
        .filter(|d| kind_of(d) == "Service")
        .cloned()
        .collect();
    let monitors: Vec<Value> = r
        .docs
        .iter()
        .filter(|d| kind_of(d) == "ServiceMonitor")
        .cloned()
        .collect();
    assert_eq!(services.len(), 2, "{what}: one Service per component");
    assert_eq!(
        monitors.len(),
        2,
        "{what}: one ServiceMonitor per component"
    );
    for (component, labels, port) in &pods {
        // Exactly one Service selects this component's pods, and no other's.
        let svc: Vec<Service> = services
            .iter()
            .filter(|s| selects(&labels_of(&s["spec"]["selector"]), labels))
            .map(|s| typed(s, what))
            .collect();
        assert_eq!(
            svc.len(),
            1,
            "{what}: Services selecting the {component} pods"
        );
        let svc = &svc[0];
        let spec = svc.spec.clone().unwrap();
        for (other, other_labels, _) in &pods {
            if other != component {
                assert!(
                    !selects(&spec.selector.clone().unwrap(), other_labels),
                    "{what}: the {component} Service also selects the {other} pods"
                );
            }
        }
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"), "headless");
        let p = &spec.ports.unwrap()[0];
        assert_eq!(p.name.as_deref(), Some("metrics"));
        assert_eq!(p.port, *port, "{what}: {component} Service port");
        assert_eq!(
            p.target_port,
            Some(IntOrString::String("metrics".into())),
            "{what}: {component} Service targetPort"
        );
        // Exactly one ServiceMonitor selects this Service.
        let svc_labels = svc.metadata.labels.clone().unwrap();
        let sm: Vec<&Value> = monitors
            .iter()
            .filter(|m| {
                selects(
                    &labels_of(&m["spec"]["selector"]["matchLabels"]),
                    &svc_labels,
                )
            })
            .collect();
        assert_eq!(
            sm.len(),
            1,
            "{what}: ServiceMonitors selecting the {component} Service"
        );
        let sm = sm[0];
        assert_eq!(sm["metadata"]["namespace"], NAMESPACE);
        assert_eq!(sm["metadata"]["labels"]["release"], "prometheus");
        assert_eq!(
            sm["spec"]["namespaceSelector"]["matchNames"],
            json!([NAMESPACE])
        );
        assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
        assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
    }

    // Without the controller, only the agents' pair.
    let r = render_chart_on(
        &with_monitoring(),
        &[
            ("serviceMonitor.enabled", json!(true)),
            ("controller.enabled", json!(false)),
        ],
    );
    let kinds: Vec<String> = r
        .docs
        .iter()
        .filter(|d| matches!(kind_of(d), "Service" | "ServiceMonitor"))
        .map(identity)
        .collect();
    assert_eq!(
        kinds,
        [
            format!("Service {NAMESPACE}/{RELEASE}-metrics"),
            format!("ServiceMonitor {NAMESPACE}/{RELEASE}"),
        ],
        "serviceMonitor without the controller"
    );
}

/// A cluster with the Prometheus Operator's CRDs.
pub(crate) fn with_monitoring() -> Vec<&'static str> {
    BUILTIN_API_VERSIONS
        .iter()
        .chain(MONITORING_API_VERSIONS)
        .copied()
        .collect()
}

#[test]
pub(crate) fn chart_monitoring_objects_need_their_crd_or_force() {
    needs_helm!("chart_monitoring_objects_need_their_crd_or_force");
    // (value prefix, the kinds it renders, the API version it needs)
    let cases = [
        (
            "serviceMonitor",
            &["Service", "ServiceMonitor"][..],
            "monitoring.coreos.com/v1/ServiceMonitor",
        ),
        (
            "prometheusRule",
            &["PrometheusRule"][..],
            "monitoring.coreos.com/v1/PrometheusRule",
        ),
    ];
    for (value, kinds, api) in cases {
        let (enabled, force) = (format!("{value}.enabled"), format!("{value}.force"));
        let only_this_crd: Vec<&str> = BUILTIN_API_VERSIONS
            .iter()
            .copied()
            .chain(["monitoring.coreos.com/v1", api])
            .collect();
        let warning = format!("WARNING: {value}.enabled=true, but this cluster does not serve");
        for (on, crd, forced, rendered) in [
            (false, false, false, false),
            (false, true, false, false),
            (false, true, true, false),
            (true, false, false, false),
            (true, true, false, true),
            (true, false, true, true),
            (true, true, true, true),
        ] {
            let api_versions = if crd {
                only_this_crd.clone()
            } else {
                BUILTIN_API_VERSIONS.to_vec()
            };
            let r = render_chart_on(
                &api_versions,
                &[
                    (enabled.as_str(), json!(on)),
                    (force.as_str(), json!(forced)),
                ],
            );
            let what = format!("{value}: enabled={on} CRD served={crd} force={forced}");
            check_all_typed(&r.docs, &what);
            let got: BTreeSet<&str> = r
                .docs
                .iter()
                .map(kind_of)
                .filter(|k| kinds.contains(k))
                .collect();
            let want: BTreeSet<&str> = if rendered {
                kinds.iter().copied().collect()
            } else {
                BTreeSet::new()
            };
            assert_eq!(got, want, "{what}: rendered kinds");
            // Asked for but left out: NOTES.txt says so, and how to fix it.
            assert_eq!(
                r.notes.contains(&warning),
                on && !rendered,
                "{what}: NOTES.txt warning\n{}",
                r.notes
            );
            if on && !rendered {
                assert!(r.notes.contains(&format!("{value}.force=true")));
            }
        }
    }
    // Each kind is gated on its own CRD, not the other's.
    let r = render_chart_on(
        &[
            BUILTIN_API_VERSIONS,
            &["monitoring.coreos.com/v1/ServiceMonitor"],
        ]
        .concat(),
        &[
            ("serviceMonitor.enabled", json!(true)),
            ("prometheusRule.enabled", json!(true)),
        ],
    );
    let kinds: BTreeSet<&str> = r.docs.iter().map(kind_of).collect();
    assert!(kinds.contains("ServiceMonitor") && !kinds.contains("PrometheusRule"));
}

/// `cargo test --test manifests -- --ignored --nocapture print_rendered_chart`
/// shows what the test renderer makes of the chart (there is no helm here).
#[test]
#[ignore = "prints the rendered chart; run by hand"]
pub(crate) fn print_rendered_chart() {
    needs_helm!("print_rendered_chart");
    let r = render_chart_on(
        &with_monitoring(),
        &[
            ("serviceMonitor.enabled", json!(true)),
            ("prometheusRule.enabled", json!(true)),
        ],
    );
    for d in &r.docs {
        println!("---\n{}", serde_saphyr::to_string(d).unwrap());
    }
    println!("--- NOTES.txt\n{}", r.notes);
}
