//! RBAC as effective access: every binding followed to its role, each
//! ServiceAccount's grants equal to its component's API calls.

use super::*;

pub(crate) type Grant = (String, String, String); // (apiGroup, resource, verb)

pub(crate) fn grants(rules: &[PolicyRule], what: &str) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for r in rules {
        assert!(
            r.non_resource_urls
                .as_deref()
                .unwrap_or_default()
                .is_empty(),
            "{what}: nonResourceURLs are not needed"
        );
        // A rule naming objects grants `resource#name` only.
        let names = r.resource_names.clone().unwrap_or_default();
        let groups = r.api_groups.clone().unwrap_or_default();
        let mut resources = r.resources.clone().unwrap_or_default();
        if !names.is_empty() {
            resources = resources
                .iter()
                .flat_map(|res| names.iter().map(move |n| format!("{res}#{n}")))
                .collect();
        }
        for g in &groups {
            for res in &resources {
                for v in &r.verbs {
                    for x in [g, res, v] {
                        assert!(!x.contains('*'), "{what}: wildcard in {r:?}");
                    }
                    assert!(res != "secrets", "{what}: no component needs secrets");
                    out.insert((g.clone(), res.clone(), v.clone()));
                }
            }
        }
    }
    out
}

pub(crate) fn expect(list: &[(&str, &str, &[&str])]) -> BTreeSet<Grant> {
    list.iter()
        .flat_map(|(g, r, verbs)| {
            verbs
                .iter()
                .map(move |v| (g.to_string(), r.to_string(), v.to_string()))
        })
        .collect()
}

/// The names of a rendering's objects, from its fullname (the release name,
/// or fullnameOverride).
pub(crate) struct Names(pub(crate) String);

impl Names {
    pub(crate) fn release() -> Names {
        Names(RELEASE.to_string())
    }
    /// The DaemonSet: the plain fullname, as in 0.1 (its selector cannot
    /// change, and a new name would run old and new agents side by side).
    pub(crate) fn daemonset(&self) -> String {
        self.0.clone()
    }
    /// The agent's ServiceAccount, ClusterRole and ClusterRoleBinding.
    pub(crate) fn agent(&self) -> String {
        format!("{}-agent", self.0)
    }
    /// The controller's Deployment, ServiceAccount, roles and bindings.
    pub(crate) fn controller(&self) -> String {
        format!("{}-controller", self.0)
    }
}

/// The API calls the agent makes (the interface it is written to). All
/// cluster-wide; nothing namespaced: no Lease, no Events.
pub(crate) fn agent_grants() -> BTreeSet<Grant> {
    use kube::CustomResourceExt;
    let crd = |name: &str| format!("customresourcedefinitions#{name}");
    let policies = crd(ipsetmgr_api::IPSetPolicy::crd_name());
    let slices = crd(ipsetmgr_api::IPSetMemberSlice::crd_name());
    expect(&[
        ("ipsetmgr.io", "ipsetpolicies", &["get", "list", "watch"]),
        (
            "ipsetmgr.io",
            "ipsetmemberslices",
            &["get", "list", "watch"],
        ),
        // Its own IPSetNodeState: read it, create it when missing,
        // server-side apply its status. No list, no update, no delete.
        ("ipsetmgr.io", "ipsetnodestates", &["get", "create"]),
        ("ipsetmgr.io", "ipsetnodestates/status", &["get", "patch"]),
        ("", "nodes", &["get", "list", "watch"]),
        // By name only, the CRDs whose deletion (which deletes all their
        // objects first) must not read as "every policy or member removed".
        ("apiextensions.k8s.io", &policies, &["get", "list", "watch"]),
        ("apiextensions.k8s.io", &slices, &["get", "list", "watch"]),
    ])
}

/// The controller's cluster-wide API calls.
pub(crate) fn controller_grants() -> BTreeSet<Grant> {
    expect(&[
        ("ipsetmgr.io", "ipsetpolicies", &["get", "list", "watch"]),
        ("ipsetmgr.io", "ipsetpolicies/status", &["get", "patch"]),
        (
            "ipsetmgr.io",
            "ipsetmemberslices",
            &["get", "list", "watch"],
        ),
        // The slices it materialises from membersFrom: server-side apply
        // (create and patch), deleted when their source is gone.
        (
            "ipsetmgr.io",
            "ipsetmemberslices",
            &["create", "patch", "delete"],
        ),
        // Aggregated into policy status; deleted when their node is gone.
        (
            "ipsetmgr.io",
            "ipsetnodestates",
            &["get", "list", "watch", "delete"],
        ),
        ("", "nodes", &["get", "list", "watch"]),
    ])
}

/// Which member sources a rendering grants the controller's reads for
/// (the chart's memberSources, kustomize's config/member-sources).
#[derive(Clone, Copy, Default)]
pub(crate) struct Sources {
    pub(crate) pods: bool,
    pub(crate) services: bool,
}

/// The pods and services member sources (watched only while a policy has
/// one; Namespaces for their namespaceSelectors), when granted.
pub(crate) fn controller_source_grants(s: Sources) -> BTreeSet<Grant> {
    let mut list: Vec<(&str, &str, &[&str])> = Vec::new();
    if s.pods {
        list.push(("", "pods", &["list", "watch"]));
    }
    if s.services {
        list.push(("", "services", &["list", "watch"]));
    }
    if s.pods || s.services {
        list.push(("", "namespaces", &["list", "watch"]));
    }
    expect(&list)
}

/// In the controller's own namespace: its leader Lease only, with the
/// verbs kube-lease-manager uses (it creates, reads and patches the Lease;
/// it never updates or deletes it).
pub(crate) fn controller_lease_grants() -> BTreeSet<Grant> {
    expect(&[("coordination.k8s.io", "leases", &["get", "create", "patch"])])
}

/// In `default` (EVENTS_NAMESPACE): Events only. The controller creates
/// events.k8s.io/v1 Events (repeats are suppressed before any write).
pub(crate) fn controller_events_grants() -> BTreeSet<Grant> {
    expect(&[("events.k8s.io", "events", &["create"])])
}

/// In `default` too: the API server's EndpointSlices (Service
/// `default/kubernetes`), which the url egress guard follows.
pub(crate) fn controller_endpoints_grants() -> BTreeSet<Grant> {
    expect(&[(
        "discovery.k8s.io",
        "endpointslices",
        &["get", "list", "watch"],
    )])
}

/// Where a grant holds.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Scope {
    Cluster,
    Namespace(String),
}

/// What each ServiceAccount (by name; all live in NAMESPACE) may do, where.
pub(crate) type Access = BTreeMap<(String, Scope), BTreeSet<Grant>>;

pub(crate) fn expected_access(names: &Names, controller: bool, sources: Sources) -> Access {
    let mut want = Access::new();
    want.insert((names.agent(), Scope::Cluster), agent_grants());
    if controller {
        let c = names.controller();
        let mut cluster = controller_grants();
        cluster.extend(controller_source_grants(sources));
        want.insert((c.clone(), Scope::Cluster), cluster);
        want.insert(
            (c.clone(), Scope::Namespace(NAMESPACE.into())),
            controller_lease_grants(),
        );
        let mut in_default = controller_events_grants();
        in_default.extend(controller_endpoints_grants());
        want.insert((c, Scope::Namespace(EVENTS_NAMESPACE.into())), in_default);
    }
    want
}

/// The RBAC objects of a rendering, by identity (the docs name them).
pub(crate) fn expected_rbac_objects(
    names: &Names,
    controller: bool,
    sources: Sources,
) -> BTreeSet<String> {
    let (a, c) = (names.agent(), names.controller());
    let mut ids = vec![
        format!("ServiceAccount {NAMESPACE}/{a}"),
        format!("ClusterRole /{a}"),
        format!("ClusterRoleBinding /{a}"),
    ];
    if controller {
        ids.extend([
            format!("ServiceAccount {NAMESPACE}/{c}"),
            format!("ClusterRole /{c}"),
            format!("ClusterRoleBinding /{c}"),
            format!("Role {NAMESPACE}/{c}"),
            format!("RoleBinding {NAMESPACE}/{c}"),
            format!("Role {EVENTS_NAMESPACE}/{c}-events"),
            format!("RoleBinding {EVENTS_NAMESPACE}/{c}-events"),
            format!("Role {EVENTS_NAMESPACE}/{c}-endpoints"),
            format!("RoleBinding {EVENTS_NAMESPACE}/{c}-endpoints"),
        ]);
        if sources.pods || sources.services {
            ids.extend([
                format!("ClusterRole /{c}-member-sources"),
                format!("ClusterRoleBinding /{c}-member-sources"),
            ]);
        }
    }
    ids.into_iter().collect()
}

/// Every namespaced object is in NAMESPACE, except Roles and RoleBindings,
/// which may also be in `default` (the events Role); which ones are there is
/// checked by name in `check_rbac`.
pub(crate) fn check_namespaces(docs: &[Value], what: &str) {
    for d in docs {
        let kind = kind_of(d);
        if CLUSTER_SCOPED.contains(&kind) {
            assert!(
                d["metadata"].get("namespace").is_none(),
                "{what}: {kind} {} is cluster-scoped: no namespace",
                name_of(d)
            );
            continue;
        }
        let ns = d["metadata"]["namespace"].as_str().unwrap_or("");
        let allowed: &[&str] = if matches!(kind, "Role" | "RoleBinding") {
            &[NAMESPACE, EVENTS_NAMESPACE]
        } else {
            &[NAMESPACE]
        };
        assert!(
            allowed.contains(&ns),
            "{what}: {kind} {} in namespace {ns:?}, expected one of {allowed:?}",
            name_of(d)
        );
    }
}

/// The effective permissions of a rendering, found by following every binding
/// to its role. Checks the wiring on the way: each binding has one subject, a
/// ServiceAccount of NAMESPACE that the rendering creates; each roleRef names
/// a role of the rendering (a RoleBinding only a Role of its own namespace);
/// every role is bound by something.
pub(crate) fn access(docs: &[Value], what: &str) -> Access {
    check_namespaces(docs, what);
    let cluster_roles: BTreeMap<String, ClusterRole> =
        all_of::<ClusterRole>(docs, "ClusterRole", what)
            .into_iter()
            .map(|r| (r.metadata.name.clone().unwrap(), r))
            .collect();
    let roles: BTreeMap<(String, String), Role> = all_of::<Role>(docs, "Role", what)
        .into_iter()
        .map(|r| {
            let key = (
                r.metadata.namespace.clone().unwrap(),
                r.metadata.name.clone().unwrap(),
            );
            (key, r)
        })
        .collect();
    let accounts: BTreeSet<String> = all_of::<ServiceAccount>(docs, "ServiceAccount", what)
        .into_iter()
        .map(|sa| sa.metadata.name.unwrap())
        .collect();
    let subject = |subjects: Option<Vec<Subject>>, binding: &str| -> String {
        let s = subjects.unwrap_or_default();
        assert_eq!(s.len(), 1, "{what}: {binding}: one subject per binding");
        assert_eq!(s[0].kind, "ServiceAccount", "{what}: {binding}: subject");
        assert_eq!(
            s[0].namespace.as_deref(),
            Some(NAMESPACE),
            "{what}: {binding}: subject namespace (the ServiceAccount's, also for \
             a binding in {EVENTS_NAMESPACE})"
        );
        assert!(
            accounts.contains(&s[0].name),
            "{what}: {binding} binds ServiceAccount {}, which is not rendered",
            s[0].name
        );
        s[0].name.clone()
    };
    let mut bound = BTreeSet::new();
    let mut out = Access::new();
    for crb in all_of::<ClusterRoleBinding>(docs, "ClusterRoleBinding", what) {
        let b = format!(
            "ClusterRoleBinding {}",
            crb.metadata.name.unwrap_or_default()
        );
        let r = &crb.role_ref;
        assert_eq!(
            r.api_group.as_deref(),
            Some("rbac.authorization.k8s.io"),
            "{what}: {b}"
        );
        assert_eq!(r.kind, "ClusterRole", "{what}: {b}");
        let role = cluster_roles
            .get(&r.name)
            .unwrap_or_else(|| panic!("{what}: {b}: no ClusterRole {}", r.name));
        bound.insert(format!("ClusterRole {}", r.name));
        let sa = subject(crb.subjects, &b);
        out.entry((sa, Scope::Cluster))
            .or_default()
            .extend(grants(role.rules.as_deref().unwrap_or_default(), what));
    }
    for rb in all_of::<RoleBinding>(docs, "RoleBinding", what) {
        let ns = rb.metadata.namespace.clone().unwrap();
        let b = format!("RoleBinding {ns}/{}", rb.metadata.name.unwrap_or_default());
        let r = &rb.role_ref;
        assert_eq!(
            r.api_group.as_deref(),
            Some("rbac.authorization.k8s.io"),
            "{what}: {b}"
        );
        assert_eq!(r.kind, "Role", "{what}: {b}");
        let role = roles.get(&(ns.clone(), r.name.clone())).unwrap_or_else(|| {
            panic!(
                "{what}: {b}: no Role {} in {ns} (a RoleBinding can only bind a Role \
                 of its own namespace)",
                r.name
            )
        });
        bound.insert(format!("Role {ns}/{}", r.name));
        let sa = subject(rb.subjects, &b);
        out.entry((sa, Scope::Namespace(ns)))
            .or_default()
            .extend(grants(role.rules.as_deref().unwrap_or_default(), what));
    }
    for name in cluster_roles.keys() {
        let id = format!("ClusterRole {name}");
        assert!(bound.contains(&id), "{what}: {id} is not bound");
    }
    for (ns, name) in roles.keys() {
        let id = format!("Role {ns}/{name}");
        assert!(bound.contains(&id), "{what}: {id} is not bound");
    }
    out
}

/// The RBAC of a rendering: every component's ServiceAccount has exactly the
/// grants its API calls need, where it needs them; the objects have the names
/// the docs use; each workload runs as its own ServiceAccount.
pub(crate) fn check_rbac(docs: &[Value], names: &Names, controller: bool, what: &str) {
    check_rbac_with(docs, names, controller, Sources::default(), what)
}

/// [`check_rbac`] of a rendering that grants the reads of `sources`.
pub(crate) fn check_rbac_with(
    docs: &[Value],
    names: &Names,
    controller: bool,
    sources: Sources,
    what: &str,
) {
    let got = access(docs, what);
    // The agent's token is on every node: nothing namespaced, and in
    // particular no Events and no Leases, anywhere.
    for ((sa, scope), granted) in &got {
        if *sa != names.agent() {
            continue;
        }
        assert_eq!(
            *scope,
            Scope::Cluster,
            "{what}: the agent has no namespaced role"
        );
        for (group, res, verb) in granted {
            assert!(
                !res.starts_with("events") && !res.starts_with("leases"),
                "{what}: the agent may {verb} {group}/{res}: it publishes no Events \
                 and takes no Lease"
            );
        }
    }
    let want = expected_access(names, controller, sources);
    for key in got.keys().chain(want.keys()).collect::<BTreeSet<_>>() {
        let (g, w) = (
            got.get(key).cloned().unwrap_or_default(),
            want.get(key).cloned().unwrap_or_default(),
        );
        assert!(
            g == w,
            "{what}: ServiceAccount {} {:?}: granted but not needed: {:?}; needed but \
             not granted: {:?}",
            key.0,
            key.1,
            g.difference(&w).collect::<Vec<_>>(),
            w.difference(&g).collect::<Vec<_>>()
        );
    }
    let rbac_kinds = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    let ids: BTreeSet<String> = docs
        .iter()
        .filter(|d| rbac_kinds.contains(&kind_of(d)))
        .map(identity)
        .collect();
    assert_eq!(
        ids,
        expected_rbac_objects(names, controller, sources),
        "{what}: RBAC objects"
    );

    let ds: DaemonSet = one_of(docs, "DaemonSet", what);
    assert_eq!(
        ds.metadata.name,
        Some(names.daemonset()),
        "{what}: DaemonSet name"
    );
    assert_eq!(
        pod_of(&ds.spec.template).service_account_name,
        Some(names.agent()),
        "{what}: the agent's ServiceAccount"
    );
    let deployments: Vec<Deployment> = all_of(docs, "Deployment", what);
    if controller {
        assert_eq!(deployments.len(), 1, "{what}: one controller Deployment");
        let d = &deployments[0];
        assert_eq!(
            d.metadata.name,
            Some(names.controller()),
            "{what}: Deployment name"
        );
        assert_eq!(
            pod_of(&d.spec.clone().template).service_account_name,
            Some(names.controller()),
            "{what}: the controller's ServiceAccount"
        );
    } else {
        assert!(deployments.is_empty(), "{what}: no controller");
    }
}

#[test]
pub(crate) fn rbac_has_one_source_and_the_chart_renders_it() {
    needs_helm!("rbac_has_one_source_and_the_chart_renders_it");
    // config/rbac/role.yaml is the source of truth.
    let what = "config/rbac/role.yaml";
    let source = yaml_docs(&read(what), what);
    check_all_typed(&source, what);
    let names = Names::release();
    let (a, c) = (names.agent(), names.controller());
    let source_ids: BTreeSet<String> = source.iter().map(identity).collect();
    assert_eq!(
        source_ids,
        BTreeSet::from([
            format!("ClusterRole /{a}"),
            format!("ClusterRole /{c}"),
            format!("Role {NAMESPACE}/{c}"),
            format!("Role {EVENTS_NAMESPACE}/{c}-events"),
            format!("Role {EVENTS_NAMESPACE}/{c}-endpoints"),
        ]),
        "{what} holds the agent's ClusterRole and the controller's ClusterRole, \
         Lease Role in {NAMESPACE}, and events and endpoints Roles in {EVENTS_NAMESPACE}"
    );
    let source = by_identity(&source);

    // The chart renders exactly these rules.
    let chart = render_chart(&[]).docs;
    check_rbac(&chart, &names, true, "chart");
    let chart_roles: BTreeMap<String, Value> = by_identity(&chart)
        .into_iter()
        .filter(|(_, d)| matches!(kind_of(d), "ClusterRole" | "Role"))
        .collect();
    assert_eq!(
        chart_roles.keys().collect::<Vec<_>>(),
        source.keys().collect::<Vec<_>>(),
        "chart roles == {what}"
    );
    for (id, role) in &source {
        if let Some(diff) = first_difference(&role["rules"], &chart_roles[id]["rules"], "") {
            panic!("{id}: {what} vs chart: rules{diff}");
        }
    }

    // kustomize uses the file itself: no other file under config/ defines
    // roles, and no transformer moved or changed them (config/default must
    // not set `namespace:`).
    let kust = kustomize_default();
    check_rbac(&kust, &names, true, "config/default");
    let kust_roles: BTreeMap<String, Value> = by_identity(&kust)
        .into_iter()
        .filter(|(_, d)| matches!(kind_of(d), "ClusterRole" | "Role"))
        .collect();
    assert_eq!(kust_roles, source, "config/default roles == {what}");
}
