//! The `IPSetPolicy` resource: one Rust type for the CRD and for policy files.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::de::integer;
use crate::member_source::{MemberSource, SourceStatus};
use ipsetmgr_ipset::SetType;

/// Which address families a policy's sets are created for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum FamilySpec {
    /// IPv4 sets only.
    #[default]
    IPv4,
    /// IPv6 sets only.
    IPv6,
    /// One set per family; members are split by their family.
    Dual,
}

impl std::fmt::Display for FamilySpec {
    /// As the policy spells it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FamilySpec::IPv4 => "IPv4",
            FamilySpec::IPv6 => "IPv6",
            FamilySpec::Dual => "Dual",
        })
    }
}

/// Desired content of one ipset (or one per family) on every selected node.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipsetmgr.io",
    version = "v1alpha1",
    kind = "IPSetPolicy",
    plural = "ipsetpolicies",
    shortname = "ipsp",
    category = "ipsetmgr",
    doc = "Kernel ipsets that ipsetmgr keeps on every selected node. Members come from spec.members and from IPSetMemberSlices labelled ipsetmgr.io/policy=<name>; the controller reports Valid and Ready conditions and a bounded summary.",
    status = "IPSetPolicyStatus",
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.type"}"#,
    printcolumn = r#"{"name":"Family","type":"string","description":"The family; - for types without one (hash:mac)","jsonPath":".status.summary.family"}"#,
    printcolumn = r#"{"name":"Synced","type":"string","description":"Selected nodes whose kernel holds the current generation, of all selected","jsonPath":".status.summary.syncedText"}"#,
    printcolumn = r#"{"name":"Problems","type":"integer","description":"Discrepancies repaired by the last resyncs, summed over nodes","jsonPath":".status.summary.problems"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Members","type":"integer","priority":1,"jsonPath":".status.summary.members"}"#,
    printcolumn = r#"{"name":"Sets","type":"string","priority":1,"description":"Kernel set names","jsonPath":".status.summary.sets"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].message"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.hashSize) || self.type.startsWith('hash:')",
        "message": "hashSize applies to hash:* types only"
    },
    {
        "rule": "has(self.range) == self.type.startsWith('bitmap:')",
        "message": "range is required for bitmap:* types and applies to them only"
    },
    {
        "rule": "!has(self.maxElem) || !self.type.startsWith('bitmap:')",
        "message": "maxElem does not apply to bitmap:* types: the range sets their size"
    },
    {
        "rule": "self.type != 'bitmap:ip' || !has(self.family) || self.family == 'IPv4'",
        "message": "bitmap:ip holds IPv4 addresses only"
    },
    {
        "rule": "(!has(self.netmask) && !has(self.bitmask)) || self.type == 'hash:ip'",
        "message": "netmask and bitmask apply to hash:ip only"
    },
    {
        "rule": "!has(self.netmask) || !has(self.bitmask)",
        "message": "netmask and bitmask exclude each other"
    },
    {
        "rule": "!has(self.except) || size(self.except) == 0 || !(self.type in ['list:set', 'hash:mac', 'bitmap:port'])",
        "message": "except applies to types with an address part; list:set, hash:mac and bitmap:port have none"
    }
]))]
pub struct IPSetPolicySpec {
    /// The kernel set type: hash:ip, hash:net, hash:ip,port, hash:net,port,
    /// hash:ip,port,ip, hash:ip,port,net, hash:net,iface, hash:ip,mark,
    /// bitmap:ip, bitmap:port, hash:mac or list:set.
    #[serde(rename = "type")]
    pub set_type: SetType,
    /// Address family of the sets: IPv4 (default), IPv6, or Dual (one set per
    /// family, members split by family). Ignored by hash:mac.
    #[serde(default)]
    pub family: FamilySpec,
    /// Set members in ipset syntax: addresses (hash:ip), CIDRs (hash:net, with an
    /// optional " nomatch"), "ADDRESS,PROTO:PORT" (hash:ip,port),
    /// "CIDR,PROTO:PORT" (hash:net,port), "ADDRESS,PROTO:PORT,ADDRESS"
    /// (hash:ip,port,ip), "ADDRESS,PROTO:PORT,CIDR" (hash:ip,port,net),
    /// "CIDR,IFACE" or "CIDR,physdev:IFACE" (hash:net,iface), "ADDRESS,MARK"
    /// (hash:ip,mark), IPv4 addresses
    /// (bitmap:ip) or port numbers (bitmap:port) within the range, MAC
    /// addresses (hash:mac) or names of other IPSetPolicies (list:set). Host
    /// names are rejected. Any member but a list:set's may end in
    /// " comment:TEXT" (1-255 printable ASCII characters without `"` or `\`),
    /// kept as the entry's comment. More members can come in
    /// IPSetMemberSlices.
    #[serde(default)]
    #[schemars(schema_with = "members_schema")]
    pub members: Vec<String>,
    /// Nodes that get this policy's sets; absent means every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Maximum number of members of each kernel set, a hard cap (at most
    /// 16777216; a cluster may cap it lower): more members than this are an
    /// error, not a crash. Absent: each set grows with its members (65536,
    /// or the next power of two above its members and a quarter).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "integer"
    )]
    // MAX_MAX_ELEM (a literal here: the attribute takes no constant).
    #[schemars(range(min = 1, max = 16777216u32))]
    pub max_elem: Option<u32>,
    /// Initial hash table size of each kernel set (hash types only; 64 to
    /// 1048576, a cluster may cap it lower). The kernel grows the table as
    /// members are added.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "integer"
    )]
    // MAX_HASH_SIZE.
    #[schemars(range(min = 64, max = 1048576u32))]
    pub hash_size: Option<u32>,
    /// Members computed from the cluster (nodes, pods, services) or fetched
    /// (url), or read from a file (policy files only); each entry is exactly
    /// one source. They join spec.members and the policy's slices; in a
    /// cluster the controller writes them as IPSetMemberSlices owned by
    /// this policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub members_from: Vec<MemberSource>,
    /// The range of a bitmap set, required for bitmap:ip and bitmap:port and
    /// refused elsewhere: IPv4 "FROM-TO" or a CIDR for bitmap:ip
    /// (10.0.0.0/24), "FROM-TO" ports for bitmap:port (0-1023). At most
    /// 65536 elements; members must lie within it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 31), regex(pattern = r"^[0-9./-]+$"))]
    pub range: Option<String>,
    /// hash:ip only: store each address as its network of this prefix
    /// length (24: 10.0.0.5 is the entry 10.0.0.0), as the kernel does.
    /// Not with bitmask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 128))]
    pub netmask: Option<u8>,
    /// hash:ip only: store each address with only these bits (an address
    /// of the policy's family, 255.255.0.255 or ffff::ff; not with Dual), as
    /// the kernel does. Not with netmask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 39), regex(pattern = r"^[0-9a-fA-F.:]+$"))]
    pub bitmask: Option<String>,
    /// Addresses this policy's sets never match, whatever its members or
    /// sources say: CIDRs or single addresses of the policy's family (at
    /// most 1024; host bits are cleared). A member inside an except range
    /// drops out; a network member that holds an except range stays, and
    /// the range is added as a nomatch entry of the same ports or
    /// interface (the more specific entry wins). Every address part of the
    /// multi-part types is checked. Not for list:set, hash:mac and
    /// bitmap:port (no address part); hash:ip with bitmask refuses it, and
    /// with netmask refuses a range that cuts an entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "except_schema")]
    pub except: Vec<String>,
}

impl IPSetPolicySpec {
    /// A spec of this type, family and members, every optional field
    /// unset: what loaders, tests and benchmarks start from (with
    /// `..IPSetPolicySpec::new(..)` for the fields they set), so that a new
    /// field is added here and not at each place that builds a spec.
    pub fn new(set_type: SetType, family: FamilySpec, members: Vec<String>) -> IPSetPolicySpec {
        IPSetPolicySpec {
            set_type,
            family,
            members,
            node_selector: None,
            max_elem: None,
            hash_size: None,
            members_from: Vec::new(),
            range: None,
            netmask: None,
            bitmask: None,
            except: Vec::new(),
        }
    }
}

/// The longest member the schema accepts.
pub const MAX_MEMBER_LEN: usize = 400;
/// What the schema accepts of a member (see [`members_schema`]).
pub const MEMBER_PATTERN: &str =
    r#"^[!-~]+( nomatch)?( comment:[!#-\[\]-~]([ !#-\[\]-~]*[!#-\[\]-~])?)?$"#;

/// Schema of `spec.members` (of policies and slices): printable ASCII
/// without spaces, then an optional " nomatch" and an optional
/// " comment:TEXT" (TEXT: printable ASCII without `"` or `\\`, not starting
/// or ending with a space), at most 400 characters each (a 255-character
/// comment fits). This is a cheap first line of defence; every member is
/// still parsed. No maxItems: `maxElem` governs the count.
pub fn members_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Set members in ipset syntax: addresses (hash:ip), CIDRs (hash:net, with an optional \" nomatch\"), \"ADDRESS,PROTO:PORT\" (hash:ip,port), \"CIDR,PROTO:PORT\" (hash:net,port), \"ADDRESS,PROTO:PORT,ADDRESS\" (hash:ip,port,ip), \"ADDRESS,PROTO:PORT,CIDR\" (hash:ip,port,net), \"CIDR,IFACE\" or \"CIDR,physdev:IFACE\" (hash:net,iface), \"ADDRESS,MARK\" (hash:ip,mark), IPv4 addresses (bitmap:ip) or port numbers (bitmap:port) within the range, MAC addresses (hash:mac) or names of other IPSetPolicies (list:set). Host names are rejected. Any member may end in \" comment:TEXT\".",
        "type": "array",
        "items": {
            "type": "string",
            "maxLength": MAX_MEMBER_LEN,
            "pattern": MEMBER_PATTERN
        }
    })
}

/// The most `spec.except` entries a policy may have: each is looked up for
/// every member, and each may add a nomatch entry per member that holds it.
pub const MAX_EXCEPT: usize = 1024;

/// Schema of `spec.except`: at most [`MAX_EXCEPT`] short strings of address
/// characters (an IPv6 address and `/128` fit in 43). Each is still parsed
/// by the compiler; no CEL per item, which keeps the cost budget small on
/// every supported server (isCIDR needs 1.31).
pub fn except_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Addresses this policy's sets never match, whatever its members or sources say: CIDRs or single addresses of the policy's family (at most 1024; host bits are cleared). A member inside an except range drops out; a network member that holds an except range stays, and the range is added as a nomatch entry of the same ports or interface (the more specific entry wins). Every address part of the multi-part types is checked. Not for list:set, hash:mac and bitmap:port (no address part).",
        "type": "array",
        "maxItems": MAX_EXCEPT,
        "items": {
            "type": "string",
            "maxLength": 43,
            "pattern": "^[0-9a-fA-F.:]+(/[0-9]{1,3})?$"
        }
    })
}

/// Schema of `status.conditions`: the standard condition list, a list-map
/// keyed by `type` (server-side apply merges entries by it).
fn conditions_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    crate::list_map_schema::<Condition>(
        generator,
        "type",
        "Valid (the policy and its slices compile) and Ready (every selected node holds the current generation, with a fresh heartbeat).",
    )
}

/// Observed state, written by the controller only.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPSetPolicyStatus {
    /// The generation the controller last looked at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Valid and Ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Totals over the selected nodes, of bounded size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<StatusSummary>,
    /// One entry per spec.membersFrom source: its members, last change and
    /// last error.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "sources_schema")]
    pub sources: Vec<SourceStatus>,
}

/// Schema of `status.sources`: a list-map keyed by the source's index.
fn sources_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut s = crate::list_map_schema::<SourceStatus>(
        generator,
        "index",
        "One entry per spec.membersFrom source, by its index.",
    );
    s.insert("maxItems".into(), 16.into());
    s
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// Totals over the selected nodes; its size does not grow with the cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusSummary {
    /// Nodes selected by the policy.
    pub nodes: i64,
    /// Selected nodes holding the current generation, with a fresh heartbeat.
    pub synced: i64,
    /// "synced/nodes", for `kubectl get`.
    #[serde(default)]
    pub synced_text: String,
    /// Problems (drift repaired by resyncs) summed over nodes.
    pub problems: i64,
    /// Members of the policy (inline and slices), per the controller's compile.
    #[serde(default)]
    pub members: i64,
    /// Members that spec.except dropped or cut (kept, with a nomatch entry
    /// for the excepted range), per the controller's compile.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub excepted: i64,
    /// The family, for `kubectl get`: `-` for types without one (hash:mac).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub family: String,
    /// The kernel set names, comma-separated, for `kubectl get -o wide`
    /// and firewall rules.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sets: String,
    /// Some of the selected nodes that are not synced (at most 5), so the
    /// object's size stays bounded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5))]
    pub failing_nodes: Vec<String>,
}
