//! Members of the Kubernetes sources, computed from slim views of Nodes,
//! Pods and Services (only what the sources read is kept of each object).
//! Pure: the controller feeds it what it watches. The policy's family
//! decides which addresses are used; Dual keeps both (the compiler splits
//! them into the two kernel sets).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::core::{Selector, SelectorExt};

use super::spec::{NodesSpec, PodsSpec, ServicesSpec};
use ipsetmgr_api::FamilySpec;
use ipsetmgr_api::member_source::{NodeAddressType, ServiceField};

pub type Labels = BTreeMap<String, String>;

/// A Node as the sources see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeView {
    pub labels: Labels,
    pub addresses: Vec<(NodeAddressType, IpAddr)>,
}

/// A Pod as the sources see it; terminal Pods (Succeeded, Failed) are not
/// kept at all, so their churn does not count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodView {
    pub namespace: String,
    pub labels: Labels,
    pub ips: Vec<IpAddr>,
    pub host_network: bool,
}

/// A Service as the sources see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceView {
    pub namespace: String,
    pub labels: Labels,
    pub cluster_ips: Vec<IpAddr>,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer: Vec<IpAddr>,
}

/// Addresses as the API server writes them; anything else (a host name in
/// a load balancer's ingress, "None" of a headless Service) is skipped.
fn ips<'a>(values: impl IntoIterator<Item = &'a String>) -> Vec<IpAddr> {
    values.into_iter().filter_map(|v| v.parse().ok()).collect()
}

pub fn node_view(n: &Node) -> NodeView {
    let mut addresses = Vec::new();
    let listed = n.status.as_ref().and_then(|s| s.addresses.as_ref());
    for a in listed.into_iter().flatten() {
        let t = match a.type_.as_str() {
            "InternalIP" => NodeAddressType::InternalIP,
            "ExternalIP" => NodeAddressType::ExternalIP,
            _ => continue,
        };
        if let Ok(ip) = a.address.parse() {
            addresses.push((t, ip));
        }
    }
    NodeView {
        labels: n.metadata.labels.clone().unwrap_or_default(),
        addresses,
    }
}

/// `None` for a Pod that is terminal: it holds no address any more.
pub fn pod_view(p: &Pod) -> Option<PodView> {
    let status = p.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("");
    if matches!(phase, "Succeeded" | "Failed") {
        return None;
    }
    let listed = status.and_then(|s| s.pod_ips.as_ref());
    Some(PodView {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        labels: p.metadata.labels.clone().unwrap_or_default(),
        ips: ips(listed.into_iter().flatten().map(|i| &i.ip)),
        host_network: p
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false),
    })
}

pub fn service_view(s: &Service) -> ServiceView {
    let spec = s.spec.as_ref();
    let ingress = s
        .status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    ServiceView {
        namespace: s.metadata.namespace.clone().unwrap_or_default(),
        labels: s.metadata.labels.clone().unwrap_or_default(),
        cluster_ips: ips(spec
            .and_then(|s| s.cluster_ips.as_ref())
            .into_iter()
            .flatten()),
        external_ips: ips(spec
            .and_then(|s| s.external_ips.as_ref())
            .into_iter()
            .flatten()),
        load_balancer: ips(ingress.into_iter().flatten().filter_map(|i| i.ip.as_ref())),
    }
}

fn family_keeps(family: FamilySpec, ip: &IpAddr) -> bool {
    match family {
        FamilySpec::IPv4 => ip.is_ipv4(),
        FamilySpec::IPv6 => ip.is_ipv6(),
        FamilySpec::Dual => true,
    }
}

fn selects(sel: Option<&Selector>, labels: &Labels) -> bool {
    sel.is_none_or(|s| s.matches(labels))
}

/// Whether an object in `namespace` is in a namespace `sel` selects (an
/// unknown namespace is selected only by "every namespace").
fn in_namespace(sel: Option<&Selector>, namespaces: &BTreeMap<String, Labels>, ns: &str) -> bool {
    match sel {
        None => true,
        Some(s) => namespaces.get(ns).is_some_and(|l| s.matches(l)),
    }
}

/// The members, sorted by address, as the compiler reads them.
fn rendered(set: BTreeSet<IpAddr>) -> Vec<String> {
    set.into_iter().map(|ip| ip.to_string()).collect()
}

pub fn node_members<'a>(
    spec: &NodesSpec,
    nodes: impl IntoIterator<Item = &'a NodeView>,
    family: FamilySpec,
) -> Vec<String> {
    let mut out = BTreeSet::new();
    for n in nodes {
        if !selects(spec.selector.as_ref(), &n.labels) {
            continue;
        }
        for (t, ip) in &n.addresses {
            if spec.address_types.contains(t) && family_keeps(family, ip) {
                out.insert(*ip);
            }
        }
    }
    rendered(out)
}

pub fn pod_members<'a>(
    spec: &PodsSpec,
    pods: impl IntoIterator<Item = &'a PodView>,
    namespaces: &BTreeMap<String, Labels>,
    family: FamilySpec,
) -> Vec<String> {
    let mut out = BTreeSet::new();
    for p in pods {
        if p.host_network && !spec.include_host_network {
            continue;
        }
        if !in_namespace(spec.namespaces.as_ref(), namespaces, &p.namespace)
            || !selects(spec.pods.as_ref(), &p.labels)
        {
            continue;
        }
        out.extend(p.ips.iter().filter(|ip| family_keeps(family, ip)));
    }
    rendered(out)
}

pub fn service_members<'a>(
    spec: &ServicesSpec,
    services: impl IntoIterator<Item = &'a ServiceView>,
    namespaces: &BTreeMap<String, Labels>,
    family: FamilySpec,
) -> Vec<String> {
    let mut out = BTreeSet::new();
    for s in services {
        if !in_namespace(spec.namespaces.as_ref(), namespaces, &s.namespace)
            || !selects(spec.services.as_ref(), &s.labels)
        {
            continue;
        }
        for f in &spec.fields {
            let list = match f {
                ServiceField::ClusterIps => &s.cluster_ips,
                ServiceField::ExternalIps => &s.external_ips,
                ServiceField::LoadBalancer => &s.load_balancer,
            };
            out.extend(list.iter().filter(|ip| family_keeps(family, ip)));
        }
    }
    rendered(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sel(v: serde_json::Value) -> Option<Selector> {
        crate::selector::parse(Some(&serde_json::from_value(v).unwrap())).unwrap()
    }

    fn labels(kv: &[(&str, &str)]) -> Labels {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn nodes_by_selector_address_type_and_family() {
        let n: Node = serde_json::from_value(json!({
            "metadata": {"name": "a", "labels": {"role": "worker"}},
            "status": {"addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "InternalIP", "address": "fd00::1"},
                {"type": "ExternalIP", "address": "203.0.113.1"},
                {"type": "Hostname", "address": "a"}
            ]}
        }))
        .unwrap();
        let a = node_view(&n);
        let mut b = a.clone();
        b.labels = labels(&[("role", "cp")]);
        b.addresses = vec![(NodeAddressType::InternalIP, "10.0.0.2".parse().unwrap())];
        let spec = NodesSpec {
            selector: sel(json!({"matchLabels": {"role": "worker"}})),
            address_types: vec![NodeAddressType::InternalIP],
        };
        assert_eq!(
            node_members(&spec, [&a, &b], FamilySpec::IPv4),
            ["10.0.0.1"]
        );
        assert_eq!(node_members(&spec, [&a, &b], FamilySpec::IPv6), ["fd00::1"]);
        assert_eq!(
            node_members(&spec, [&a, &b], FamilySpec::Dual),
            ["10.0.0.1", "fd00::1"]
        );
        let all = NodesSpec {
            selector: None,
            address_types: vec![NodeAddressType::InternalIP, NodeAddressType::ExternalIP],
        };
        assert_eq!(
            node_members(&all, [&a, &b], FamilySpec::IPv4),
            ["10.0.0.1", "10.0.0.2", "203.0.113.1"]
        );
    }

    #[test]
    fn pods_skip_terminal_and_host_network_unless_asked() {
        let pod = |name: &str, ns: &str, phase: &str, ip: &str, host: bool| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": ns, "labels": {"app": "db"}},
                "spec": {"containers": [], "hostNetwork": host},
                "status": {"phase": phase, "podIPs": [{"ip": ip}]}
            }))
            .unwrap()
        };
        assert!(pod_view(&pod("done", "payments", "Succeeded", "10.1.0.9", false)).is_none());
        let views: Vec<PodView> = [
            pod("a", "payments", "Running", "10.1.0.1", false),
            pod("b", "payments", "Pending", "10.1.0.2", false),
            pod("h", "payments", "Running", "10.0.0.5", true),
            pod("x", "other", "Running", "10.1.0.3", false),
        ]
        .iter()
        .filter_map(pod_view)
        .collect();
        let namespaces = BTreeMap::from([
            ("payments".to_string(), labels(&[("team", "pay")])),
            ("other".to_string(), labels(&[])),
        ]);
        let mut spec = PodsSpec {
            namespaces: sel(json!({"matchLabels": {"team": "pay"}})),
            pods: sel(json!({"matchLabels": {"app": "db"}})),
            include_host_network: false,
        };
        assert_eq!(
            pod_members(&spec, &views, &namespaces, FamilySpec::IPv4),
            ["10.1.0.1", "10.1.0.2"]
        );
        spec.include_host_network = true;
        assert_eq!(
            pod_members(&spec, &views, &namespaces, FamilySpec::IPv4),
            ["10.0.0.5", "10.1.0.1", "10.1.0.2"]
        );
        spec.namespaces = None;
        assert_eq!(
            pod_members(&spec, &views, &namespaces, FamilySpec::IPv4).len(),
            4
        );
        assert!(pod_members(&spec, &views, &namespaces, FamilySpec::IPv6).is_empty());
    }

    #[test]
    fn services_by_field() {
        let s: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIPs": ["10.96.0.10", "fd00:96::10"], "externalIPs": ["198.51.100.7"]},
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.9"}, {"hostname": "lb.example.com"}]}}
        }))
        .unwrap();
        let headless: Service = serde_json::from_value(json!({
            "metadata": {"name": "h", "namespace": "shop"},
            "spec": {"clusterIPs": ["None"]}
        }))
        .unwrap();
        let views = [service_view(&s), service_view(&headless)];
        let spec = |fields| ServicesSpec {
            namespaces: None,
            services: None,
            fields,
        };
        let none = BTreeMap::new();
        assert_eq!(
            service_members(
                &spec(vec![ServiceField::ClusterIps]),
                &views,
                &none,
                FamilySpec::Dual
            ),
            ["10.96.0.10", "fd00:96::10"]
        );
        assert_eq!(
            service_members(
                &spec(vec![ServiceField::ExternalIps, ServiceField::LoadBalancer]),
                &views,
                &none,
                FamilySpec::IPv4
            ),
            ["198.51.100.7", "203.0.113.9"]
        );
    }
}
