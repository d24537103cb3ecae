//! The agent's DaemonSet and the controller's Deployment: containers,
//! environment, listeners, probes, selectors, hardening.

use super::*;

pub(crate) fn pod_of(template: &PodTemplateSpec) -> PodSpec {
    template.spec.clone().expect("pod spec")
}

/// The pod's only container, which has this name; no init containers.
pub(crate) fn only_container(pod: &PodSpec, name: &str, what: &str) -> Container {
    assert_eq!(pod.containers.len(), 1, "{what}: one container");
    assert!(pod.init_containers.is_none(), "{what}: no init containers");
    assert_eq!(pod.containers[0].name, name, "{what}: container name");
    pod.containers[0].clone()
}

pub(crate) fn agent_container(ds: &DaemonSet) -> Container {
    let pod = pod_of(&ds.spec.clone().template);
    only_container(&pod, "agent", "agent")
}

pub(crate) fn controller_container(d: &Deployment) -> Container {
    let pod = pod_of(&d.spec.clone().template);
    only_container(&pod, "controller", "controller")
}

pub(crate) fn env_map(c: &Container) -> BTreeMap<String, Value> {
    c.env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name.clone(), serde_json::to_value(&e).unwrap()))
        .collect()
}

pub(crate) fn env_value(c: &Container, name: &str) -> Option<String> {
    c.env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

pub(crate) fn field_ref(c: &Container, name: &str) -> Option<String> {
    c.env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|e| e.name == name)?
        .value_from
        .as_ref()?
        .field_ref
        .as_ref()
        .map(|f| f.field_path.clone())
}

/// Only these variables, each a setting of the component.
pub(crate) fn check_env_names(c: &Container, known: &[&str], what: &str) {
    for name in env_map(c).keys() {
        assert!(
            known.contains(&name.as_str()),
            "{what}: env {name} is not a setting of this component"
        );
    }
}

/// A duration as the flags parse it (crates/policy/src/duration.rs): a bare number of
/// seconds, or jiff's friendly format (60s, 5m, 1h30m); more than zero and at
/// most a year.
pub(crate) fn positive_duration(s: &str) -> bool {
    const YEAR: u64 = 365 * 24 * 3600;
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse::<u64>().is_ok_and(|n| n > 0 && n <= YEAR);
    }
    s.parse::<jiff::SignedDuration>()
        .is_ok_and(|d| d.is_positive() && d <= jiff::SignedDuration::from_secs(YEAR as i64))
}

/// The settings both components read: listeners, log format, set prefix.
pub(crate) fn check_common_env(c: &Container, listen: &Listeners, what: &str) {
    let addr = |(a, p): &(String, i32)| format!("{a}:{p}");
    assert_eq!(
        env_value(c, "IPSETMGR_LISTEN"),
        Some(addr(&listen.metrics)),
        "{what}: the metrics listener"
    );
    assert_eq!(
        env_value(c, "IPSETMGR_HEALTH_LISTEN"),
        Some(addr(&listen.health)),
        "{what}: the health listener"
    );
    for var in ["IPSETMGR_LISTEN", "IPSETMGR_HEALTH_LISTEN"] {
        let v = env_value(c, var).unwrap_or_default();
        assert!(
            v.parse::<std::net::SocketAddr>().is_ok(),
            "{what}: {var}={v:?} is not an address the binary parses"
        );
    }
    let log = env_value(c, "IPSETMGR_LOG_FORMAT").unwrap_or_default();
    assert!(
        ["text", "json"].contains(&log.as_str()),
        "{what}: log format {log:?}"
    );
    let prefix = env_value(c, "IPSETMGR_SET_PREFIX").unwrap_or_default();
    assert!(
        ipsetmgr_ipset::Naming::new(&prefix).is_ok(),
        "{what}: set prefix {prefix:?} is not valid"
    );
}

/// Port `metrics`; liveness (/livez) and readiness (/readyz) probes on the
/// health listener, where the kubelet can reach it; requests and a memory
/// limit. `host_network`: the pod is in the node's network namespace, where
/// the kubelet probes from, so a specific health address (loopback) is
/// probed as the probe's `host`; otherwise the kubelet probes the pod's IP
/// from outside, and only a wildcard health address answers there.
pub(crate) fn check_served(c: &Container, listen: &Listeners, host_network: bool, what: &str) {
    let ports = c.ports.clone().unwrap_or_default();
    let metrics = ports
        .iter()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .unwrap_or_else(|| panic!("{what}: no port named metrics"));
    assert_eq!(
        metrics.container_port, listen.metrics.1,
        "{what}: metrics port"
    );
    let (health_addr, health_port) = &listen.health;
    let probe_target = |probe: Option<k8s_openapi::api::core::v1::Probe>, kind: &str| {
        let get = probe
            .unwrap_or_else(|| panic!("{what}: no {kind}"))
            .http_get
            .unwrap_or_else(|| panic!("{what}: {kind} is not httpGet"));
        let port = match &get.port {
            IntOrString::Int(p) => *p,
            IntOrString::String(name) => {
                ports
                    .iter()
                    .find(|p| p.name.as_deref() == Some(name))
                    .unwrap_or_else(|| panic!("{what}: {kind}: no port named {name}"))
                    .container_port
            }
        };
        assert_eq!(
            port, *health_port,
            "{what}: {kind} must probe the health port"
        );
        let wildcard = health_addr == "0.0.0.0";
        if host_network && !wildcard {
            assert_eq!(
                get.host.as_deref(),
                Some(health_addr.as_str()),
                "{what}: {kind} must probe the health address {health_addr}"
            );
        } else {
            assert_eq!(get.host, None, "{what}: {kind}: no host (the pod's IP)");
            assert!(
                wildcard,
                "{what}: the kubelet cannot reach a health listener on {health_addr} \
                 from outside the pod's network namespace"
            );
        }
        assert_eq!(
            get.scheme.as_deref().unwrap_or("HTTP"),
            "HTTP",
            "{what}: {kind} scheme"
        );
        get.path.unwrap_or_default()
    };
    assert_eq!(
        probe_target(c.liveness_probe.clone(), "livenessProbe"),
        "/livez"
    );
    assert_eq!(
        probe_target(c.readiness_probe.clone(), "readinessProbe"),
        "/readyz"
    );
    let res = c
        .resources
        .clone()
        .unwrap_or_else(|| panic!("{what}: no resources"));
    assert!(
        res.requests
            .is_some_and(|r| r.contains_key("cpu") && r.contains_key("memory")),
        "{what}: cpu and memory requests"
    );
    assert!(
        res.limits.is_some_and(|l| l.contains_key("memory")),
        "{what}: memory limit"
    );
}

/// The selector matches the pod template, and names the component, so the
/// agent's and the controller's selectors never match each other's pods.
pub(crate) fn check_selector(
    selector: &LabelSelector,
    template: &PodTemplateSpec,
    component: &str,
    what: &str,
) {
    let labels = template
        .metadata
        .clone()
        .and_then(|m| m.labels)
        .unwrap_or_default();
    let match_labels = selector.match_labels.clone().unwrap_or_default();
    for (k, v) in &match_labels {
        assert_eq!(labels.get(k), Some(v), "{what}: selector label {k}");
    }
    assert_eq!(
        match_labels
            .get("app.kubernetes.io/component")
            .map(String::as_str),
        Some(component),
        "{what}: the selector names the component"
    );
    assert_eq!(
        labels.get("app.kubernetes.io/name").map(String::as_str),
        Some("ipsetmgr")
    );
}

/// A DaemonSet's selector is immutable: the agent's must stay exactly what
/// 0.1 shipped, or `helm upgrade` and `kubectl apply -k` of an upgrade fail.
pub(crate) fn check_agent_selector_is_0_1s(ds: &DaemonSet, with_instance: bool, what: &str) {
    let mut want = BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "ipsetmgr".to_string()),
        (
            "app.kubernetes.io/component".to_string(),
            "agent".to_string(),
        ),
    ]);
    if with_instance {
        want.insert("app.kubernetes.io/instance".into(), RELEASE.into());
    }
    assert_eq!(
        ds.spec.selector.match_labels,
        Some(want),
        "{what}: the DaemonSet selector of 0.1"
    );
    assert!(ds.spec.selector.match_expressions.is_none());
}

/// The security and wiring contract of the agent DaemonSet.
pub(crate) fn check_daemonset(ds: &DaemonSet, listen: &Listeners, what: &str) {
    let spec = ds.spec.clone();
    let pod = pod_of(&spec.template);
    assert_eq!(
        ds.metadata.namespace.as_deref(),
        Some(NAMESPACE),
        "{what}: namespace"
    );
    assert_eq!(pod.host_network, Some(true), "{what}: hostNetwork");
    assert_eq!(
        pod.dns_policy.as_deref(),
        Some("ClusterFirstWithHostNet"),
        "{what}: dnsPolicy"
    );
    for (field, v) in [("hostPID", pod.host_pid), ("hostIPC", pod.host_ipc)] {
        assert_ne!(v, Some(true), "{what}: {field}");
    }
    assert_ne!(
        pod.automount_service_account_token,
        Some(false),
        "{what}: the agent needs its token"
    );
    assert!(
        pod.volumes.as_deref().unwrap_or_default().is_empty(),
        "{what}: the agent needs no volumes (hostPath in particular)"
    );
    // Runs on every node, control plane included.
    let tolerations = pod.tolerations.clone().unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists")
                && t.key.is_none()
                && t.effect.is_none()),
        "{what}: tolerates every taint"
    );
    let strategy = spec.update_strategy.clone().unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(
        strategy.rolling_update.unwrap().max_unavailable,
        Some(IntOrString::Int(1)),
        "{what}: maxUnavailable"
    );
    check_selector(&spec.selector, &spec.template, "agent", what);

    let c = only_container(&pod, "agent", what);
    assert!(
        c.command.is_none(),
        "{what}: keep the image ENTRYPOINT (ipsetmgr agent)"
    );
    assert!(
        c.args.as_deref().unwrap_or_default().is_empty(),
        "{what}: flags come from env"
    );
    let sc = c
        .security_context
        .clone()
        .expect("container securityContext");
    let caps = sc.capabilities.clone().expect("capabilities");
    assert_eq!(
        caps.add,
        Some(vec!["NET_ADMIN".to_string()]),
        "{what}: adds only NET_ADMIN"
    );
    assert_eq!(
        caps.drop,
        Some(vec!["ALL".to_string()]),
        "{what}: drops ALL"
    );
    assert_eq!(sc.privileged, Some(false), "{what}: not privileged");
    assert_eq!(
        sc.allow_privilege_escalation,
        Some(false),
        "{what}: allowPrivilegeEscalation"
    );
    assert_eq!(
        sc.read_only_root_filesystem,
        Some(true),
        "{what}: readOnlyRootFilesystem"
    );
    if let Some(psc) = &pod.security_context {
        assert!(psc.sysctls.is_none(), "{what}: no sysctls");
    }

    assert_eq!(
        field_ref(&c, "NODE_NAME").as_deref(),
        Some("spec.nodeName"),
        "{what}: NODE_NAME"
    );
    for gone in ["POD_NAMESPACE", "POD_NAME"] {
        assert!(
            !env_map(&c).contains_key(gone),
            "{what}: {gone}: the agent takes no Lease and publishes no Events"
        );
    }
    check_env_names(
        &c,
        &[
            "NODE_NAME",
            "IPSETMGR_SET_PREFIX",
            "IPSETMGR_MAX_SET_ELEMENTS",
            "IPSETMGR_MAX_HASH_SIZE",
            "IPSETMGR_NODE_STATE_INTERVAL",
            "IPSETMGR_BACKEND",
            "IPSETMGR_NFT_FAMILY",
            "IPSETMGR_NFT_TABLE",
            "IPSETMGR_BPF_PATH",
            "IPSETMGR_RESYNC_INTERVAL",
            "IPSETMGR_HEARTBEAT_INTERVAL",
            "IPSETMGR_LISTEN",
            "IPSETMGR_HEALTH_LISTEN",
            "IPSETMGR_LOG_FORMAT",
        ],
        what,
    );
    check_common_env(&c, listen, what);
    let backend = env_value(&c, "IPSETMGR_BACKEND").unwrap_or_default();
    assert!(
        backend == "both"
            || backend
                .split(',')
                .all(|b| ["netlink", "cli", "nft", "nft-cli"].contains(&b)),
        "{what}: backend {backend}"
    );
    let resync = env_value(&c, "IPSETMGR_RESYNC_INTERVAL").unwrap_or_default();
    assert!(
        positive_duration(&resync),
        "{what}: resync interval {resync:?}"
    );
    let heartbeat = env_value(&c, "IPSETMGR_HEARTBEAT_INTERVAL").unwrap_or_default();
    assert!(
        positive_duration(&heartbeat),
        "{what}: heartbeat interval {heartbeat:?}"
    );
    check_served(&c, listen, true, what);
}

/// The security and wiring contract of the controller Deployment: no host
/// access of any kind, an unprivileged uid, its own token.
pub(crate) fn check_controller(d: &Deployment, listen: &Listeners, what: &str) {
    assert_eq!(
        d.metadata.namespace.as_deref(),
        Some(NAMESPACE),
        "{what}: namespace"
    );
    let spec = d.spec.clone();
    assert!(spec.replicas.is_some_and(|r| r >= 1), "{what}: replicas");
    // Not maxUnavailable 0: a new controller may have to wait for the old
    // one's Lease before it is ready, and the rollout would never finish.
    let strategy = spec.strategy.clone().unwrap_or_default();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.unwrap_or_default();
    assert_eq!(
        rolling.max_unavailable,
        Some(IntOrString::Int(1)),
        "{what}: maxUnavailable"
    );
    assert_eq!(
        rolling.max_surge,
        Some(IntOrString::Int(1)),
        "{what}: maxSurge"
    );
    check_selector(&spec.selector, &spec.template, "controller", what);

    let pod = pod_of(&spec.template);
    assert_ne!(pod.host_network, Some(true), "{what}: no hostNetwork");
    for (field, v) in [("hostPID", pod.host_pid), ("hostIPC", pod.host_ipc)] {
        assert_ne!(v, Some(true), "{what}: {field}");
    }
    assert!(
        pod.volumes.as_deref().unwrap_or_default().is_empty(),
        "{what}: the controller needs no volumes"
    );
    assert_eq!(
        pod.automount_service_account_token,
        Some(true),
        "{what}: the controller needs its token"
    );
    let c = only_container(&pod, "controller", what);
    // The image's ENTRYPOINT is `ipsetmgr agent`.
    assert_eq!(
        c.command,
        Some(vec!["/usr/local/bin/ipsetmgr".to_string()]),
        "{what}: command"
    );
    assert_eq!(c.args, Some(vec!["controller".to_string()]), "{what}: args");

    let psc = pod.security_context.clone().unwrap_or_default();
    let sc = c
        .security_context
        .clone()
        .expect("container securityContext");
    assert_eq!(
        sc.run_as_non_root.or(psc.run_as_non_root),
        Some(true),
        "{what}: runAsNonRoot"
    );
    // The image's USER is root: without a uid, runAsNonRoot would stop the
    // kubelet from starting it.
    let uid = sc.run_as_user.or(psc.run_as_user);
    assert!(
        uid.is_some_and(|u| u != 0),
        "{what}: a non-zero runAsUser, got {uid:?}"
    );
    let seccomp = sc.seccomp_profile.clone().or(psc.seccomp_profile.clone());
    assert_eq!(
        seccomp.map(|s| s.type_).as_deref(),
        Some("RuntimeDefault"),
        "{what}: seccompProfile"
    );
    let caps = sc.capabilities.clone().expect("capabilities");
    assert!(
        caps.add.unwrap_or_default().is_empty(),
        "{what}: adds no capability"
    );
    assert_eq!(
        caps.drop,
        Some(vec!["ALL".to_string()]),
        "{what}: drops ALL"
    );
    assert_ne!(sc.privileged, Some(true), "{what}: not privileged");
    assert_eq!(
        sc.allow_privilege_escalation,
        Some(false),
        "{what}: allowPrivilegeEscalation"
    );
    assert_eq!(
        sc.read_only_root_filesystem,
        Some(true),
        "{what}: readOnlyRootFilesystem"
    );
    assert!(psc.sysctls.is_none(), "{what}: no sysctls");

    assert_eq!(
        field_ref(&c, "POD_NAMESPACE").as_deref(),
        Some("metadata.namespace"),
        "{what}: POD_NAMESPACE (where its Lease lives)"
    );
    assert_eq!(
        field_ref(&c, "POD_NAME").as_deref(),
        Some("metadata.name"),
        "{what}: POD_NAME (the Lease holder)"
    );
    check_env_names(
        &c,
        &[
            "POD_NAMESPACE",
            "POD_NAME",
            "IPSETMGR_SET_PREFIX",
            "IPSETMGR_MAX_SET_ELEMENTS",
            "IPSETMGR_MAX_HASH_SIZE",
            "IPSETMGR_NODE_STATE_INTERVAL",
            "IPSETMGR_LISTEN",
            "IPSETMGR_HEALTH_LISTEN",
            "IPSETMGR_LOG_FORMAT",
            "IPSETMGR_FEED_ALLOW_CIDRS",
            "IPSETMGR_FEED_DENY_CIDRS",
        ],
        what,
    );
    check_common_env(&c, listen, what);
    check_served(&c, listen, false, what);
    for p in c.ports.clone().unwrap_or_default() {
        assert!(p.host_port.is_none(), "{what}: no hostPort");
    }
}

/// Two serialisable values are equal, or the first difference is shown.
pub(crate) fn assert_same<T: serde::Serialize>(a: &T, b: &T, what: &str) {
    let (a, b) = (
        serde_json::to_value(a).unwrap(),
        serde_json::to_value(b).unwrap(),
    );
    if let Some(diff) = first_difference(&a, &b, "") {
        panic!("{what}: {diff}");
    }
}

#[test]
pub(crate) fn chart_and_kustomize_deploy_the_same_agent() {
    needs_helm!("chart_and_kustomize_deploy_the_same_agent");
    let chart: DaemonSet = one_of(&render_chart(&[]).docs, "DaemonSet", "chart");
    let kust: DaemonSet = one_of(&kustomize_default(), "DaemonSet", "config/default");
    let (a, b) = (chart.spec, kust.spec);
    // The whole pod (the chart's labels and selector add Helm's own).
    assert_same(
        &a.template.spec,
        &b.template.spec,
        "agent pod, chart vs config/default",
    );
    assert_same(&a.update_strategy, &b.update_strategy, "updateStrategy");
}

#[test]
pub(crate) fn chart_and_kustomize_deploy_the_same_controller() {
    needs_helm!("chart_and_kustomize_deploy_the_same_controller");
    let chart: Deployment = one_of(&render_chart(&[]).docs, "Deployment", "chart");
    let kust: Deployment = one_of(&kustomize_default(), "Deployment", "config/default");
    let (a, b) = (chart.spec, kust.spec);
    assert_same(
        &a.template.spec,
        &b.template.spec,
        "controller pod, chart vs config/default",
    );
    assert_same(&a.strategy, &b.strategy, "strategy");
    assert_eq!(a.replicas, b.replicas, "replicas");
}
