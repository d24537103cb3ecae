//! `IPSetNodeState`: what one node's kernel holds, one object per node,
//! named after the node and written only by that node's agent (server-side
//! apply of its status). The controller reads them all to judge each
//! policy's readiness; agents never read each other's.
//!
//! One object per node instead of per-node entries inside each policy: a
//! status write then wakes only the controller, never every agent with the
//! whole (possibly huge) policy.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Nothing to configure: the node is the object's name.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipsetmgr.io",
    version = "v1alpha1",
    kind = "IPSetNodeState",
    plural = "ipsetnodestates",
    shortname = "ipsns",
    category = "ipsetmgr",
    doc = "What one node's kernel holds of each IPSetPolicy, written by that node's ipsetmgr agent. Named after the node; deleted with it (ownerReference).",
    status = "IPSetNodeStateStatus",
    printcolumn = r#"{"name":"Synced","type":"string","description":"Policies whose sets this node holds as declared, of the policies selecting it","jsonPath":".status.syncedText"}"#,
    printcolumn = r#"{"name":"Problems","type":"integer","description":"Discrepancies repaired by the last resync, over all policies","jsonPath":".status.problems"}"#,
    printcolumn = r#"{"name":"Heartbeat","type":"date","jsonPath":".status.heartbeatTime"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Agent","type":"string","priority":1,"jsonPath":".status.agentVersion"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.message"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPSetNodeStateSpec {}

/// Schema of `status.policies`: a list-map keyed by the policy name.
fn policies_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    crate::list_map_schema::<PolicyState>(
        generator,
        "name",
        "One entry per policy that selects this node.",
    )
}

/// The node's view, refreshed after every apply and at every heartbeat.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPSetNodeStateStatus {
    /// When the agent last confirmed this state (RFC 3339). The controller
    /// counts a node whose heartbeat is older than a few intervals as not
    /// synced: its agent may be dead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_time: Option<String>,
    /// Seconds between heartbeats, so readers know what "stale" means.
    #[serde(default)]
    pub heartbeat_interval_seconds: i64,
    /// The agent's version.
    #[serde(default)]
    pub agent_version: String,
    /// Synced policies of all in `policies`, e.g. "3/3".
    #[serde(default)]
    pub synced_text: String,
    /// Problems summed over `policies`.
    #[serde(default)]
    pub problems: i64,
    /// Empty when every policy is synced; else the first that is not, and
    /// why (for `kubectl get -o wide`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 1024))]
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "policies_schema")]
    pub policies: Vec<PolicyState>,
}

/// The state of one policy's sets on this node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyState {
    /// The policy's name (the list key).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The policy generation this node last applied.
    #[serde(default)]
    pub observed_generation: i64,
    /// Identifies what was applied: the policy's uid and generation and the
    /// versions of its member slices. The controller counts the node as
    /// synced only when this equals its own view, so a slice change is
    /// waited for like a spec change.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub revision: String,
    /// Whether the kernel holds exactly the desired sets of that generation.
    #[serde(default)]
    pub synced: bool,
    /// Kernel set names (usable in iptables rules, or in nft rules of the
    /// agent's table with `--backend nft`); with `--backend both` the nft
    /// sets follow as `nft:<name>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set_names: Vec<String>,
    /// Members across the policy's sets on this node.
    #[serde(default)]
    pub members: i64,
    /// Discrepancies found and repaired by the last full resync.
    #[serde(default)]
    pub problems: i64,
    /// When the kernel last matched (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<String>,
    /// Why not synced (bounded).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 1024))]
    pub error: String,
}
