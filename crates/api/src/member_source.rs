//! `spec.membersFrom[]` of an IPSetPolicy: members that are computed rather
//! than typed. Each entry names exactly one source; its members join the
//! policy's inline members and slices. In a cluster the controller
//! materialises every source into IPSetMemberSlices owned by the policy
//! (agents stay as they are); in file mode only `url` and `file` work.
//!
//! These types are only the shape (what the CRD schema checks); what the
//! strings mean (selectors, the URL, durations) is parsed into typed values
//! by `ipsetmgr` (its `sources::spec`), which names the policy, the source and the
//! reason for anything it refuses.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::de::integer;

/// At most this many sources per policy (each has a status entry, and the
/// status must stay bounded).
pub const MAX_SOURCES: usize = 16;

/// One source of members. Exactly one field is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("minProperties" = 1, "maxProperties" = 1))]
pub struct MemberSource {
    /// The addresses of the Nodes the selector selects (cluster only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodesSource>,
    /// The status.podIPs of running Pods (cluster only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<PodsSource>,
    /// Addresses of Services (cluster only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<ServicesSource>,
    /// A member list fetched over HTTP(S) and refreshed every interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<UrlSource>,
    /// A member list read from a local file (policy files only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<FileSource>,
}

impl MemberSource {
    /// The kind of source, as the spec spells it ("?" when none or several
    /// are set, which validation refuses).
    pub fn kind(&self) -> &'static str {
        let set = [
            ("nodes", self.nodes.is_some()),
            ("pods", self.pods.is_some()),
            ("services", self.services.is_some()),
            ("url", self.url.is_some()),
            ("file", self.file.is_some()),
        ];
        let mut kinds = set.iter().filter(|(_, s)| *s).map(|(k, _)| *k);
        match (kinds.next(), kinds.next()) {
            (Some(k), None) => k,
            _ => "?",
        }
    }
}

/// Node addresses.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodesSource {
    /// Nodes whose addresses are members; absent means every Node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Which of status.addresses are used (default InternalIP).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 2))]
    pub address_types: Vec<NodeAddressType>,
}

/// A Node address type whose addresses are IPs.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum NodeAddressType {
    InternalIP,
    ExternalIP,
}

impl NodeAddressType {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeAddressType::InternalIP => "InternalIP",
            NodeAddressType::ExternalIP => "ExternalIP",
        }
    }
}

/// Pod addresses.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodsSource {
    /// Namespaces whose Pods count; absent means every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Pods that count; absent means every Pod of those namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// Whether host-network Pods count (their IPs are their Node's).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub include_host_network: bool,
}

/// Service addresses.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServicesSource {
    /// Namespaces whose Services count; absent means every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Services that count; absent means every Service of those namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Which addresses are used (default clusterIPs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub fields: Vec<ServiceField>,
}

/// An address field of a Service.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum ServiceField {
    /// spec.clusterIPs (not "None" of headless Services).
    #[serde(rename = "clusterIPs")]
    ClusterIps,
    /// spec.externalIPs.
    #[serde(rename = "externalIPs")]
    ExternalIps,
    /// status.loadBalancer.ingress[].ip (host names are skipped).
    #[serde(rename = "loadBalancer")]
    LoadBalancer,
}

/// The syntax of a fetched member list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FeedFormat {
    /// One member per line; `#` and ` ;` start comments (FireHOL, Spamhaus).
    #[default]
    Text,
    /// A JSON array of strings, or an object with a `members` array.
    Json,
}

/// A member list fetched over HTTP(S).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UrlSource {
    /// An http or https URL, without user information.
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,
    /// How often it is fetched again (default 1h, at least 1m), e.g. 15m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub interval: Option<String>,
    /// text (default) or json.
    #[serde(default)]
    pub format: FeedFormat,
    /// More members than this (default 100000) refuse the content; the last
    /// good content stays in force.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "integer"
    )]
    #[schemars(range(min = 1, max = 10000000u32))]
    pub max_members: Option<u32>,
    /// Request headers from a Secret in the controller's namespace (cluster
    /// only): each key is a header name, its value the header's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers_from: Option<SecretRef>,
}

/// A Secret in the controller's own namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
}

/// A member list read from a local file (policy files only).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileSource {
    /// The file; relative paths are relative to the policy file's directory.
    #[schemars(length(min = 1, max = 4096))]
    pub path: String,
    /// How often it is read again by `ipsetmgr run` (default: with every
    /// resync).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub interval: Option<String>,
    /// More members than this refuse the file, which holds its policy (its
    /// sets stay as they are). No default: the file's size limit (256 MiB) and the
    /// policy's maxElem bound it, so a million-member blocklist can be
    /// used as it is.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "integer"
    )]
    #[schemars(range(min = 1, max = 10000000u32))]
    pub max_members: Option<u32>,
}

/// What one source last did, in the policy's status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceStatus {
    /// The index of the source in spec.membersFrom.
    pub index: i32,
    /// nodes, pods, services, url or file.
    pub kind: String,
    /// Members the source contributes now (its last good content).
    pub members: i64,
    /// When its members last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update: Option<Time>,
    /// Why the last refresh failed (its last good members stay in force).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub error: Option<String>,
}
