//! `spec.membersFrom[]` parsed into typed values: selectors into kube's
//! `Selector`, the URL into an `http::Uri` that is http(s) with a host and
//! no user information, durations into `Duration`s within bounds. Whatever
//! is refused is refused naming the policy, the source (its index and kind)
//! and the reason; a policy with any bad source is invalid as a whole.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::Selector;

use ipsetmgr_api::IPSetPolicy;
use ipsetmgr_api::member_source::{
    FeedFormat, MAX_SOURCES, MemberSource, NodeAddressType, ServiceField,
};
use ipsetmgr_ipset::SetType;

use super::reason::{FeedUrlError, SourceReason};

/// Where a policy is read: what it may draw members from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// The controller: cluster sources and url; no local files.
    Cluster,
    /// Policy files (`apply`, `run`): url and file; no cluster.
    Files,
}

/// The default, shortest and longest refresh interval of a url source.
pub const DEFAULT_URL_INTERVAL: Duration = Duration::from_secs(3600);
pub const MIN_URL_INTERVAL: Duration = Duration::from_secs(60);
/// The default cap on the members of a url source: a feed is someone
/// else's content. A file source has no default cap (see [`FileSpec`]).
pub const DEFAULT_MAX_MEMBERS: usize = 100_000;
/// Label values (a slice names its policy in one) are at most 63 bytes.
const MAX_LABEL_VALUE: usize = 63;

/// One source, typed.
#[derive(Clone, Debug)]
pub enum Source {
    Nodes(NodesSpec),
    Pods(PodsSpec),
    Services(ServicesSpec),
    Url(UrlSpec),
    File(FileSpec),
}

impl Source {
    pub fn kind(&self) -> &'static str {
        match self {
            Source::Nodes(_) => "nodes",
            Source::Pods(_) => "pods",
            Source::Services(_) => "services",
            Source::Url(_) => "url",
            Source::File(_) => "file",
        }
    }
}

#[derive(Clone, Debug)]
pub struct NodesSpec {
    pub selector: Option<Selector>,
    pub address_types: Vec<NodeAddressType>,
}

#[derive(Clone, Debug)]
pub struct PodsSpec {
    pub namespaces: Option<Selector>,
    pub pods: Option<Selector>,
    pub include_host_network: bool,
}

#[derive(Clone, Debug)]
pub struct ServicesSpec {
    pub namespaces: Option<Selector>,
    pub services: Option<Selector>,
    pub fields: Vec<ServiceField>,
}

/// An http or https URL with a host and no user information (credentials
/// belong in headers from a Secret, never in a URL that is shown in logs
/// and statuses).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FeedUrl(http::Uri);

impl FeedUrl {
    pub fn parse(s: &str) -> Result<FeedUrl, FeedUrlError> {
        let uri: http::Uri = s
            .parse()
            .map_err(|e: http::uri::InvalidUri| FeedUrlError::NotAUrl(e.to_string()))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            Some(other) => return Err(FeedUrlError::Scheme(other.to_string())),
            None => return Err(FeedUrlError::NoScheme),
        }
        let Some(authority) = uri.authority() else {
            return Err(FeedUrlError::NoHost);
        };
        if authority.as_str().contains('@') {
            return Err(FeedUrlError::UserInfo);
        }
        if authority.host().is_empty() {
            return Err(FeedUrlError::NoHost);
        }
        Ok(FeedUrl(uri))
    }

    pub fn uri(&self) -> &http::Uri {
        &self.0
    }
}

impl std::fmt::Display for FeedUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UrlSpec {
    pub url: FeedUrl,
    pub interval: Duration,
    pub format: FeedFormat,
    pub max_members: usize,
    /// A Secret (in the controller's namespace) of request headers.
    pub headers_secret: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSpec {
    /// As written: relative paths are resolved against the policy file's
    /// directory by file mode, which knows it.
    pub path: std::path::PathBuf,
    pub interval: Option<Duration>,
    /// `maxMembers` as given. Absent, the reader's byte limit and the
    /// compiler's maxElem (after duplicates and the other family are left
    /// out) are the bounds: the file is the user's own, and the url cap
    /// would refuse a whole FireHOL or Spamhaus list.
    pub max_members: Option<usize>,
}

/// The shortest `interval` of a file source: it is a stat, then a read when
/// the file changed, but a loop of those is still a loop.
pub const MIN_FILE_INTERVAL: Duration = Duration::from_secs(1);

/// A source that cannot be used, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("policy {policy:?}: membersFrom[{index}] ({kind}): {problem}")]
pub struct SourceError {
    pub policy: String,
    pub index: usize,
    pub kind: &'static str,
    /// Why, typed.
    pub problem: SourceReason,
    /// `problem`'s text. Only file mode (`src/files/sources.rs`) still
    /// takes it; drop it once that reads `problem`.
    pub reason: String,
}

impl SourceError {
    fn new(policy: &str, index: usize, kind: &'static str, problem: SourceReason) -> SourceError {
        SourceError {
            policy: policy.to_string(),
            index,
            kind,
            reason: problem.to_string(),
            problem,
        }
    }
}

/// Parse every source of `policy`; any error makes the policy invalid.
pub fn parse_sources(
    policy: &IPSetPolicy,
    setting: Setting,
) -> Result<Vec<Source>, Vec<SourceError>> {
    let name = policy.metadata.name.as_deref().unwrap_or("");
    let from = &policy.spec.members_from;
    let mut errors = Vec::new();
    let mut out = Vec::new();
    if from.len() > MAX_SOURCES {
        errors.push(SourceError::new(
            name,
            MAX_SOURCES,
            "?",
            SourceReason::TooManySources {
                max: MAX_SOURCES,
                found: from.len(),
            },
        ));
        return Err(errors);
    }
    for (index, source) in from.iter().enumerate() {
        match parse_one(policy, source, setting) {
            Ok(s) => out.push(s),
            Err(problem) => errors.push(SourceError::new(name, index, source.kind(), problem)),
        }
    }
    if !from.is_empty() && setting == Setting::Cluster && name.len() > MAX_LABEL_VALUE {
        // Its slices name it in a label.
        errors.push(SourceError::new(
            name,
            0,
            from[0].kind(),
            SourceReason::NameTooLong {
                max: MAX_LABEL_VALUE,
            },
        ));
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

fn selector(
    sel: Option<&LabelSelector>,
    field: &'static str,
) -> Result<Option<Selector>, SourceReason> {
    crate::selector::parse(sel).map_err(|e| SourceReason::Selector {
        field,
        problem: e.0,
    })
}

/// Cluster sources give addresses: only address types may hold them.
fn addresses_fit(policy: &IPSetPolicy) -> Result<(), SourceReason> {
    let t = policy.spec.set_type;
    if matches!(t, SetType::HashIp | SetType::HashNet) {
        return Ok(());
    }
    Err(SourceReason::NotAddresses(t))
}

/// The values listed, sorted and each once, or `default` when none are.
fn distinct_or<T: Ord + Clone>(listed: &[T], default: T) -> Vec<T> {
    let mut v = if listed.is_empty() {
        vec![default]
    } else {
        listed.to_vec()
    };
    v.sort();
    v.dedup();
    v
}

fn cluster_only(setting: Setting) -> Result<(), SourceReason> {
    match setting {
        Setting::Cluster => Ok(()),
        Setting::Files => Err(SourceReason::ClusterOnly),
    }
}

fn interval(s: &str) -> Result<Duration, SourceReason> {
    crate::duration::parse_positive(s).map_err(SourceReason::Interval)
}

fn parse_one(
    policy: &IPSetPolicy,
    source: &MemberSource,
    setting: Setting,
) -> Result<Source, SourceReason> {
    if source.kind() == "?" {
        return Err(SourceReason::NoKind);
    }
    if let Some(n) = &source.nodes {
        cluster_only(setting)?;
        addresses_fit(policy)?;
        return Ok(Source::Nodes(NodesSpec {
            selector: selector(n.selector.as_ref(), "selector")?,
            address_types: distinct_or(&n.address_types, NodeAddressType::InternalIP),
        }));
    }
    if let Some(p) = &source.pods {
        cluster_only(setting)?;
        addresses_fit(policy)?;
        return Ok(Source::Pods(PodsSpec {
            namespaces: selector(p.namespace_selector.as_ref(), "namespaceSelector")?,
            pods: selector(p.pod_selector.as_ref(), "podSelector")?,
            include_host_network: p.include_host_network,
        }));
    }
    if let Some(s) = &source.services {
        cluster_only(setting)?;
        addresses_fit(policy)?;
        return Ok(Source::Services(ServicesSpec {
            namespaces: selector(s.namespace_selector.as_ref(), "namespaceSelector")?,
            services: selector(s.selector.as_ref(), "selector")?,
            fields: distinct_or(&s.fields, ServiceField::ClusterIps),
        }));
    }
    if let Some(u) = &source.url {
        let url = FeedUrl::parse(&u.url).map_err(SourceReason::Url)?;
        let interval = match &u.interval {
            None => DEFAULT_URL_INTERVAL,
            Some(s) => interval(s)?,
        };
        if interval < MIN_URL_INTERVAL {
            return Err(SourceReason::IntervalTooShort {
                interval,
                min: MIN_URL_INTERVAL,
            });
        }
        let headers_secret = match &u.headers_from {
            None => None,
            Some(_) if setting == Setting::Files => return Err(SourceReason::HeadersInFiles),
            // Reading a Secret needs a grant no component has (tests/
            // manifests.rs holds that line); refused clearly until then.
            Some(_) => return Err(SourceReason::HeadersUnsupported),
        };
        return Ok(Source::Url(UrlSpec {
            url,
            interval,
            format: u.format,
            max_members: u.max_members.map_or(DEFAULT_MAX_MEMBERS, |m| m as usize),
            headers_secret,
        }));
    }
    let f = source.file.as_ref().expect("kind() said file");
    if setting == Setting::Cluster {
        return Err(SourceReason::FilesOnly);
    }
    if f.path.is_empty() {
        return Err(SourceReason::EmptyPath);
    }
    if f.path.contains('\0') {
        return Err(SourceReason::NulInPath);
    }
    let interval = f.interval.as_deref().map(interval).transpose()?;
    if let Some(i) = interval.filter(|i| *i < MIN_FILE_INTERVAL) {
        return Err(SourceReason::IntervalTooShort {
            interval: i,
            min: MIN_FILE_INTERVAL,
        });
    }
    Ok(Source::File(FileSpec {
        path: f.path.clone().into(),
        interval,
        max_members: f.max_members.map(|m| m as usize),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(set_type: &str, from: serde_json::Value) -> IPSetPolicy {
        serde_json::from_value(json!({
            "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
            "metadata": {"name": "p"},
            "spec": {"type": set_type, "membersFrom": from}
        }))
        .unwrap()
    }

    fn errors(p: &IPSetPolicy, setting: Setting) -> Vec<String> {
        parse_sources(p, setting)
            .err()
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn good_sources_parse_with_defaults() {
        let p = policy(
            "hash:ip",
            json!([
                {"nodes": {}},
                {"pods": {"podSelector": {"matchLabels": {"app": "db"}}}},
                {"services": {"fields": ["loadBalancer", "clusterIPs", "loadBalancer"]}},
                {"url": {"url": "https://example.com/level1.netset", "interval": "15m"}}
            ]),
        );
        let s = parse_sources(&p, Setting::Cluster).unwrap();
        let kinds: Vec<_> = s.iter().map(Source::kind).collect();
        assert_eq!(kinds, ["nodes", "pods", "services", "url"]);
        let Source::Nodes(n) = &s[0] else { panic!() };
        assert_eq!(n.address_types, [NodeAddressType::InternalIP]);
        let Source::Services(sv) = &s[2] else {
            panic!()
        };
        assert_eq!(
            sv.fields,
            [ServiceField::ClusterIps, ServiceField::LoadBalancer]
        );
        let Source::Url(u) = &s[3] else { panic!() };
        assert_eq!(u.interval, Duration::from_secs(900));
        assert_eq!(u.max_members, DEFAULT_MAX_MEMBERS);
        assert_eq!(u.url.to_string(), "https://example.com/level1.netset");
    }

    #[test]
    fn bad_sources_are_named_with_their_reason() {
        let p = policy(
            "hash:ip",
            json!([
                {"url": {"url": "ftp://example.com/x"}},
                {"url": {"url": "https://user:pw@example.com/x"}},
                {"url": {"url": "https://example.com/x", "interval": "5s"}},
                {"pods": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}},
                {"file": {"path": "/etc/x"}},
                {}
            ]),
        );
        let e = errors(&p, Setting::Cluster);
        assert_eq!(e.len(), 6, "{e:#?}");
        assert!(
            e[0].starts_with("policy \"p\": membersFrom[0] (url): url: scheme \"ftp\""),
            "{}",
            e[0]
        );
        assert!(
            e[1].contains("membersFrom[1] (url): url: user information"),
            "{}",
            e[1]
        );
        assert!(!e[1].contains("pw"), "credentials are not echoed: {}", e[1]);
        assert!(
            e[2].contains("membersFrom[2] (url): interval: 5s is shorter"),
            "{}",
            e[2]
        );
        assert!(
            e[3].contains("membersFrom[3] (pods): podSelector: operator In on \"a\" needs values"),
            "{}",
            e[3]
        );
        assert!(
            e[4].contains("membersFrom[4] (file): a file source works only in policy files"),
            "{}",
            e[4]
        );
        assert!(
            e[5].contains("membersFrom[5] (?): each entry needs exactly one"),
            "{}",
            e[5]
        );
    }

    #[test]
    fn kubernetes_sources_are_refused_in_files_and_for_non_address_types() {
        let p = policy(
            "hash:ip",
            json!([{"nodes": {}}, {"file": {"path": "x.txt"}}]),
        );
        let e = errors(&p, Setting::Files);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].contains("membersFrom[0] (nodes): a Kubernetes source works only in a cluster"),
            "{}",
            e[0]
        );
        let p = policy(
            "hash:ip",
            json!([{"file": {"path": ""}}, {"file": {"path": "x", "interval": "10ms"}}]),
        );
        let e = errors(&p, Setting::Files);
        assert!(
            e[0].contains("membersFrom[0] (file): path: empty"),
            "{}",
            e[0]
        );
        assert!(
            e[1].contains("membersFrom[1] (file): interval: 10ms is shorter"),
            "{}",
            e[1]
        );
        let p = policy("hash:mac", json!([{"services": {}}]));
        let e = errors(&p, Setting::Cluster);
        assert!(e[0].contains("a hash:mac set cannot hold"), "{}", e[0]);
        // A url feeds any type: it is a member list.
        let p = policy(
            "hash:mac",
            json!([{"url": {"url": "http://127.0.0.1:1/macs"}}]),
        );
        assert!(parse_sources(&p, Setting::Cluster).is_ok());
    }

    /// The samples of config/samples-sources are valid in a cluster; the
    /// Kubernetes ones are refused in files, the url one is not.
    #[test]
    fn the_source_samples_parse_in_a_cluster() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/samples-sources");
        let mut seen = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let loaded = crate::load::load_file(&path).unwrap();
            for l in loaded.policies {
                seen += 1;
                let p = &l.policy;
                let parsed = parse_sources(p, Setting::Cluster);
                assert!(parsed.is_ok(), "{}: {:?}", path.display(), parsed.err());
                let in_files = parse_sources(p, Setting::Files);
                let kind = p.spec.members_from[0].kind();
                assert_eq!(in_files.is_ok(), kind == "url", "{}", path.display());
            }
        }
        assert_eq!(seen, 3);
    }

    /// Every reason a source is refused, word for word as statuses and
    /// file mode show it (the ones the tests above check by part too).
    #[test]
    fn every_reason_reads_as_before() {
        let one = |set_type: &str, from: serde_json::Value, setting: Setting| {
            let e = errors(&policy(set_type, from), setting);
            assert_eq!(e.len(), 1, "{e:?}");
            e[0].clone()
        };
        let url = |u: serde_json::Value| one("hash:ip", json!([{ "url": u }]), Setting::Cluster);
        let head = "policy \"p\": membersFrom[0]";
        for (got, want) in [
            (
                url(json!({"url": "example.com/x"})),
                "(url): url: not a URL: invalid format",
            ),
            (
                url(json!({"url": "/x"})),
                "(url): url: no scheme (http:// or https://)",
            ),
            (
                url(json!({"url": "ftp://h/x"})),
                "(url): url: scheme \"ftp\" is not http or https",
            ),
            (
                url(json!({"url": "https://u@h/x"})),
                "(url): url: user information in a URL is refused (use headersFrom for credentials)",
            ),
            (
                url(json!({"url": "https://h/x", "interval": "30s"})),
                "(url): interval: 30s is shorter than the minimum of 60s",
            ),
            (
                url(json!({"url": "https://h/x", "interval": "0"})),
                "(url): interval: invalid duration \"0\": must be more than zero",
            ),
            (
                url(json!({"url": "https://h/x", "headersFrom": {"secretName": "s"}})),
                "(url): headersFrom is not supported yet: the controller is not granted to read Secrets",
            ),
            (
                one(
                    "hash:ip",
                    json!([{"url": {"url": "https://h/x", "headersFrom": {"secretName": "s"}}}]),
                    Setting::Files,
                ),
                "(url): headersFrom names a Secret, which works only in a cluster",
            ),
            (
                one(
                    "hash:ip",
                    json!([{"file": {"path": "a\u{0}b"}}]),
                    Setting::Files,
                ),
                "(file): path: contains a NUL byte",
            ),
            (
                one(
                    "hash:ip",
                    json!([{"file": {"path": "x", "interval": "0"}}]),
                    Setting::Files,
                ),
                "(file): interval: invalid duration \"0\": must be more than zero",
            ),
            (
                one("hash:ip", json!([{"nodes": {}}]), Setting::Files),
                "(nodes): a Kubernetes source works only in a cluster (the controller computes it); policy files can use url and file sources",
            ),
            (
                one("hash:ip,port", json!([{"pods": {}}]), Setting::Cluster),
                "(pods): gives IP addresses, which a hash:ip,port set cannot hold (use hash:ip or hash:net)",
            ),
            (
                one(
                    "hash:ip",
                    json!([{"services": {"selector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}}}]),
                    Setting::Cluster,
                ),
                "(services): selector: ",
            ),
        ] {
            assert!(
                got.starts_with(&format!("{head} {want}")),
                "{got}\n  wanted {want}"
            );
            if !want.ends_with(": ") {
                assert_eq!(got, format!("{head} {want}"));
            }
        }
        let many = serde_json::Value::Array(vec![json!({"nodes": {}}); MAX_SOURCES + 1]);
        assert_eq!(
            one("hash:ip", many, Setting::Cluster),
            format!(
                "policy \"p\": membersFrom[{MAX_SOURCES}] (?): at most {MAX_SOURCES} sources; found {}",
                MAX_SOURCES + 1
            )
        );
        let mut long = policy("hash:ip", json!([{"nodes": {}}]));
        long.metadata.name = Some("n".repeat(64));
        let e = errors(&long, Setting::Cluster);
        assert_eq!(
            e,
            [format!(
                "policy \"{}\": membersFrom[0] (nodes): a policy with membersFrom has a name of at most 63 characters (its slices name it in the label ipsetmgr.io/policy)",
                "n".repeat(64)
            )]
        );
    }
}
