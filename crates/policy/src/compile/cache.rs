//! What a long-running compiler (the agent, the controller) remembers
//! between compiles: each member source parsed once per version, and each
//! policy's result once per generation and slice versions.
//!
//! A source is a policy's `spec.members` (versioned by the policy's uid and
//! generation: any spec change bumps it) or one member slice (versioned by
//! its resourceVersion), parsed for the policy's type and family. With the
//! sources cached, a ten-member change in one slice of a million-member
//! policy parses that one slice and merges; an unchanged policy is not even
//! merged, and the manager recognises its sets as the same (`Arc`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::errors::PolicyError;
use super::parse::ParsedSource;
use ipsetmgr_api::policy::{FamilySpec, IPSetPolicy};
use ipsetmgr_ipset::SetType;
use ipsetmgr_sets::DesiredSet;

/// Where members come from, with the version of that content.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Origin {
    Inline {
        policy: String,
        uid: Option<String>,
        generation: i64,
    },
    Slice {
        name: String,
        version: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SourceKey {
    pub origin: Origin,
    pub set_type: SetType,
    pub family: FamilySpec,
}

impl SourceKey {
    /// The inline members of a server object (with a generation); file
    /// policies have none and are never cached.
    pub fn inline(p: &IPSetPolicy) -> Option<SourceKey> {
        Some(SourceKey {
            origin: Origin::Inline {
                policy: p.metadata.name.clone().unwrap_or_default(),
                uid: p.metadata.uid.clone(),
                generation: p.metadata.generation?,
            },
            set_type: p.spec.set_type,
            family: p.spec.family,
        })
    }

    /// A slice with a version (objects from the API server have one).
    pub fn slice(name: &str, version: &str, p: &IPSetPolicy) -> Option<SourceKey> {
        (!version.is_empty()).then(|| SourceKey {
            origin: Origin::Slice {
                name: name.to_string(),
                version: version.to_string(),
            },
            set_type: p.spec.set_type,
            family: p.spec.family,
        })
    }
}

/// A policy's compile result: its sets, or why it has none.
pub(crate) type PolicyResult = Result<Vec<DesiredSet>, Vec<PolicyError>>;

/// A policy's compile result is valid for this exact set of sources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PolicyKey {
    pub sources: Vec<SourceKey>,
    /// The caller's extra except ranges.
    pub extra_except: Vec<String>,
}

#[derive(Debug)]
struct PolicyEntry {
    key: PolicyKey,
    result: Result<Vec<DesiredSet>, Vec<PolicyError>>,
    /// Members spec.except dropped or cut.
    excepted: u64,
}

/// The compiler's memory; see the module doc.
#[derive(Debug, Default)]
pub struct MemberCache {
    sources: HashMap<SourceKey, Arc<ParsedSource>>,
    policies: HashMap<String, PolicyEntry>,
    /// Keys used by the compile in progress (everything else is dropped).
    used_sources: HashSet<SourceKey>,
    used_policies: HashSet<String>,
}

impl MemberCache {
    /// Whether `p`'s own members are parsed for its current generation: an
    /// agent may then drop the member strings of its copy.
    pub fn has_inline(&self, p: &IPSetPolicy) -> bool {
        SourceKey::inline(p).is_some_and(|k| self.sources.contains_key(&k))
    }

    pub(crate) fn source(&mut self, key: &Option<SourceKey>) -> Option<Arc<ParsedSource>> {
        let key = key.as_ref()?;
        self.used_sources.insert(key.clone());
        self.sources.get(key).cloned()
    }

    pub(crate) fn keep_source(&mut self, key: Option<SourceKey>, parsed: &Arc<ParsedSource>) {
        if let Some(key) = key {
            self.used_sources.insert(key.clone());
            self.sources.insert(key, parsed.clone());
        }
    }

    pub(crate) fn result(
        &mut self,
        policy: &str,
        key: &Option<PolicyKey>,
    ) -> Option<(PolicyResult, u64)> {
        let key = key.as_ref()?;
        let entry = self.policies.get(policy).filter(|e| e.key == *key)?;
        self.used_policies.insert(policy.to_string());
        self.used_sources.extend(key.sources.iter().cloned());
        Some((entry.result.clone(), entry.excepted))
    }

    pub(crate) fn keep_result(
        &mut self,
        policy: &str,
        key: Option<PolicyKey>,
        result: &Result<Vec<DesiredSet>, Vec<PolicyError>>,
        excepted: u64,
    ) {
        if let Some(key) = key {
            self.used_policies.insert(policy.to_string());
            let entry = PolicyEntry {
                key,
                result: result.clone(),
                excepted,
            };
            self.policies.insert(policy.to_string(), entry);
        }
    }

    /// Start a compile: nothing is in use yet.
    pub(crate) fn begin(&mut self) {
        self.used_sources.clear();
        self.used_policies.clear();
    }

    /// End a compile: forget what it did not use (deleted policies and
    /// slices, old versions).
    pub(crate) fn finish(&mut self) {
        let used = std::mem::take(&mut self.used_sources);
        self.sources.retain(|k, _| used.contains(k));
        let used = std::mem::take(&mut self.used_policies);
        self.policies.retain(|k, _| used.contains(k));
    }
}
