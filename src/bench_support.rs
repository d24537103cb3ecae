//! The agent's own code paths, for `benches/agent_memory.rs`: the store it
//! keeps of the cluster and its compile step, fed with objects decoded the
//! way its watches decode them. Not an API: it exists so the benchmark
//! measures the agent's code, not a copy of it.

pub use ipsetmgr_agent::store::Store;
pub use ipsetmgr_cluster::tolerant::decode;
pub use ipsetmgr_policy::compile::MemberCache;
pub use ipsetmgr_policy::load::{parse_json_policies, parse_policies};
pub use ipsetmgr_policy::member_list::{ListFormat, parse_member_list};
