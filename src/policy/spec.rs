//! The `IPSetPolicy` resource: one Rust type for the CRD and for policy files.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ipset::SetType;

/// Which address families a policy's sets are created for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum FamilySpec {
    /// IPv4 sets only.
    #[default]
    IPv4,
    /// IPv6 sets only.
    IPv6,
    /// One set per family; members are split by their family.
    Dual,
}

/// Desired content of one ipset (or one per family) on every selected node.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipsetmgr.io",
    version = "v1alpha1",
    kind = "IPSetPolicy",
    plural = "ipsetpolicies",
    shortname = "ipsp",
    doc = "Kernel ipsets that the ipsetmgr agent keeps on every selected node, with per-node sync status.",
    status = "IPSetPolicyStatus",
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.type"}"#,
    printcolumn = r#"{"name":"Family","type":"string","jsonPath":".spec.family"}"#,
    printcolumn = r#"{"name":"Synced","type":"string","description":"Selected nodes whose kernel holds the policy, of all selected","jsonPath":".status.summary.syncedText"}"#,
    printcolumn = r#"{"name":"Problems","type":"integer","description":"Discrepancies repaired by the last resync, summed over nodes","jsonPath":".status.summary.problems"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.hashSize) || self.type.startsWith('hash:')",
        "message": "hashSize applies to hash:* types only"
    }
]))]
pub struct IPSetPolicySpec {
    /// The kernel set type: hash:ip, hash:net, hash:ip,port, hash:mac or list:set.
    #[serde(rename = "type")]
    pub set_type: SetType,
    /// Address family of the sets: IPv4 (default), IPv6, or Dual (one set per
    /// family, members split by family). Ignored by hash:mac.
    #[serde(default)]
    pub family: FamilySpec,
    /// Set members in ipset syntax: addresses (hash:ip), CIDRs (hash:net, with an
    /// optional " nomatch"), "ADDRESS,PROTO:PORT" (hash:ip,port), MAC addresses
    /// (hash:mac) or names of other IPSetPolicies (list:set). Host names are
    /// rejected.
    #[serde(default)]
    #[schemars(schema_with = "members_schema")]
    pub members: Vec<String>,
    /// Nodes that get this policy's sets; absent means every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Maximum number of members of each kernel set (default 65536). More members
    /// than this are an error, not a crash.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "integer"
    )]
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub max_elem: Option<u32>,
    /// Initial hash table size of each kernel set (hash types only; 64 to
    /// 67108864). The kernel grows the table as members are added.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "integer"
    )]
    #[schemars(range(min = 64, max = 67108864u32))]
    pub hash_size: Option<u32>,
}

/// An optional u32 written as a number. A quoted `"100"` is refused: YAML
/// would read it as a string everywhere else, and the schema says integer.
/// Numbers out of range are refused with the value and the bound.
fn integer<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    struct Visitor;
    impl serde::de::Visitor<'_> for Visitor {
        type Value = Option<u32>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an integer from 0 to 4294967295 (not a string)")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            u32::try_from(v)
                .map(Some)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            u32::try_from(v)
                .map(Some)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    d.deserialize_any(Visitor)
}

/// Schema of `spec.members`: printable ASCII without spaces (an optional
/// trailing " nomatch" aside), at most 253 characters each. This is a cheap
/// first line of defence; every member is still parsed by the agent. No
/// maxItems: `maxElem` governs the count.
fn members_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Set members in ipset syntax: addresses (hash:ip), CIDRs (hash:net, with an optional \" nomatch\"), \"ADDRESS,PROTO:PORT\" (hash:ip,port), MAC addresses (hash:mac) or names of other IPSetPolicies (list:set). Host names are rejected.",
        "type": "array",
        "items": {
            "type": "string",
            "maxLength": 253,
            "pattern": "^[!-~]+( nomatch)?$"
        }
    })
}

/// Schema of `status.nodes`: a list-map keyed by nodeName, so each agent
/// owns its own entry under server-side apply.
fn node_status_list_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut items = generator.subschema_for::<NodeStatus>();
    // Inline the item schema: CRD schemas cannot use $ref.
    if items.get("$ref").is_some() {
        items = NodeStatus::json_schema(generator);
    }
    schemars::json_schema!({
        "description": "One entry per selected node, each written by that node's agent (server-side apply, field manager ipsetmgr-agent-<node>).",
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["nodeName"],
        "items": items
    })
}

/// Observed state, written by the agents.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPSetPolicyStatus {
    /// One entry per selected node, each written by that node's agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "node_status_list_schema")]
    pub nodes: Vec<NodeStatus>,
    /// Totals over `nodes`, written by one elected agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<StatusSummary>,
}

/// The state of a policy's sets on one node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// The node this entry describes (the list key).
    #[schemars(length(min = 1, max = 253))]
    pub node_name: String,
    /// The policy generation the node last applied.
    #[serde(default)]
    pub observed_generation: i64,
    /// Whether the node's kernel holds exactly the desired sets.
    #[serde(default)]
    pub synced: bool,
    /// Kernel set names on this node (usable in iptables rules).
    #[serde(default)]
    pub set_names: Vec<String>,
    /// Members across this policy's sets on the node.
    #[serde(default)]
    pub members: i64,
    /// Discrepancies found and repaired by the last resync.
    #[serde(default)]
    pub problems: i64,
    /// When the node last confirmed the kernel state (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<String>,
    /// Human-readable reason when not synced.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// Totals over the per-node entries.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusSummary {
    /// Nodes selected by the policy.
    pub nodes: i64,
    /// Selected nodes reporting synced for the current generation.
    pub synced: i64,
    /// "synced/nodes", for `kubectl get`.
    #[serde(default)]
    pub synced_text: String,
    /// Problems summed over nodes.
    pub problems: i64,
    /// The generation the summary describes.
    pub observed_generation: i64,
}
