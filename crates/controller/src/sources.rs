//! Every policy's `membersFrom`, evaluated against what the controller
//! watches and has fetched: the members of each source, the slices that
//! carry them (`materialise`), the per-source status entries, the policies
//! whose sources are invalid, and which extra kinds must be watched at all
//! (Pods, Services and Namespaces are watched only while some policy's
//! sources need them: a cluster's Pods are the largest list there is).

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::feeds::FeedResults;
use super::inputs::Needs;
use super::materialise::{SlicePlan, Wanted, plan_orphans, plan_source};
use super::store::Store;
use ipsetmgr_api::SourceStatus;
use ipsetmgr_api::member_source::MAX_SOURCES;
use ipsetmgr_policy::sources::cluster::{node_members, pod_members, service_members};
use ipsetmgr_policy::sources::content::digest;
use ipsetmgr_policy::sources::spec::{Setting, Source, SourceError, parse_sources};

/// Status entries' errors are cut to this many bytes (the CRD's maxLength).
const MAX_ERROR_LEN: usize = 1000;

/// What the controller remembers of one source between evaluations: when
/// its members last changed (a status field that must not move unless
/// they do).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Remembered {
    kind: &'static str,
    digest: [u8; 8],
    members: i64,
    since: Timestamp,
}

pub(crate) type Memory = BTreeMap<(String, usize), Remembered>;

#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub plan: SlicePlan,
    pub statuses: BTreeMap<String, Vec<SourceStatus>>,
    pub needs: Needs,
    /// Url sources to fetch: (policy, index) and what to fetch.
    pub feeds: BTreeMap<(String, usize), super::feeds::FeedJob>,
}

fn needs_of(sources: &[Source], needs: &mut Needs) {
    for s in sources {
        match s {
            Source::Pods(p) => {
                needs.pods = true;
                needs.namespaces |= p.namespaces.is_some();
            }
            Source::Services(s) => {
                needs.services = true;
                needs.namespaces |= s.namespaces.is_some();
            }
            _ => {}
        }
    }
}

/// Evaluate every policy's sources.
pub(crate) fn evaluate_sources(
    store: &Store,
    fetched: &FeedResults,
    memory: &mut Memory,
    now: Timestamp,
) -> Outcome {
    let mut out = Outcome::default();
    let mut counts: BTreeMap<&str, Option<usize>> = BTreeMap::new();
    let namespaces = store.namespaces.items();
    for (name, t) in store.policy_store.policies.items() {
        let Ok(policy) = &t.value else {
            counts.insert(name, None);
            continue;
        };
        let sources = match parse_sources(policy, Setting::Cluster) {
            Ok(s) => s,
            Err(errors) => {
                // Invalid (the compile says why, in Valid): keep its slices, whatever they are, and say so
                // per source of the spec as it is now.
                counts.insert(name, None);
                let entries = refused_entries(policy, name, &errors, memory, now);
                if !entries.is_empty() {
                    out.statuses.insert(name.clone(), entries);
                }
                continue;
            }
        };
        counts.insert(name, Some(sources.len()));
        needs_of(&sources, &mut out.needs);
        let mut statuses = Vec::new();
        for (index, source) in sources.iter().enumerate() {
            let family = policy.spec.family;
            let unlisted = |kinds: &[&str]| -> Result<Option<Vec<String>>, Unavailable> {
                match kinds.iter().find_map(|k| store.watch_errors.get(k)) {
                    Some(e) => Err(Unavailable::Watch(e.clone())),
                    None => Ok(None),
                }
            };
            let computed: Result<Option<Vec<String>>, Unavailable> = match source {
                Source::Nodes(spec) => Ok(store
                    .nodes
                    .listed()
                    .then(|| node_members(spec, store.nodes.items().values(), family))),
                Source::Pods(spec) => {
                    if store.pods.listed()
                        && (spec.namespaces.is_none() || store.namespaces.listed())
                    {
                        Ok(Some(pod_members(
                            spec,
                            store.pods.items().values().flatten(),
                            namespaces,
                            family,
                        )))
                    } else {
                        unlisted(&["pods", "namespaces"])
                    }
                }
                Source::Services(spec) => {
                    if store.services.listed()
                        && (spec.namespaces.is_none() || store.namespaces.listed())
                    {
                        Ok(Some(service_members(
                            spec,
                            store.services.items().values(),
                            namespaces,
                            family,
                        )))
                    } else {
                        unlisted(&["services", "namespaces"])
                    }
                }
                Source::Url(spec) => {
                    let key = (name.clone(), index);
                    out.feeds.insert(
                        key.clone(),
                        super::feeds::FeedJob {
                            spec: spec.clone(),
                            set_type: policy.spec.set_type,
                            family,
                        },
                    );
                    match fetched.get(&key) {
                        // Fetched for another spec (the URL changed): not yet.
                        Some(r) if r.spec != *spec => Ok(None),
                        Some(r) => match (&r.good, &r.error) {
                            (Some(good), None) => Ok(Some(good.to_vec())),
                            (_, Some(e)) => Err(Unavailable::Fetch(e.clone())),
                            (None, None) => Ok(None),
                        },
                        None => Ok(None),
                    }
                }
                // Refused by parse_sources in a cluster.
                Source::File(_) => Ok(None),
            };
            let (members, error) = match computed {
                Ok(m) => (m, None),
                Err(e) => (None, Some(e.to_string())),
            };
            let wanted = match &members {
                Some(m) => Wanted::Members(m),
                None => Wanted::Keep,
            };
            let mut error = error;
            if let Err(e) = plan_source(
                policy,
                index,
                wanted,
                store.policy_store.slices.items(),
                &mut out.plan,
            ) {
                error = Some(e.to_string());
            }
            statuses.push(status_entry(
                name,
                index,
                source.kind(),
                members.as_deref(),
                error,
                memory,
                now,
            ));
        }
        if !statuses.is_empty() {
            out.statuses.insert(name.clone(), statuses);
        }
    }
    plan_orphans(store.policy_store.slices.items(), &counts, &mut out.plan);
    memory.retain(|(p, i), _| {
        counts
            .get(p.as_str())
            .is_some_and(|c| c.is_none_or(|c| *i < c))
    });
    out
}

/// The status entries of a policy whose sources are refused: one per
/// source of its spec (at most [`MAX_SOURCES`]), so none is left over from
/// an earlier spec; each with the members its kept slices still hold, and
/// the refused ones with why. A refusal of the policy as a whole (too many
/// sources) is on every entry.
fn refused_entries(
    policy: &ipsetmgr_api::IPSetPolicy,
    name: &str,
    errors: &[SourceError],
    memory: &mut Memory,
    now: Timestamp,
) -> Vec<SourceStatus> {
    let from = &policy.spec.members_from;
    let listed = from.len().min(MAX_SOURCES);
    let whole: Vec<String> = errors
        .iter()
        .filter(|e| e.index >= listed)
        .map(|e| e.problem.to_string())
        .collect();
    (0..listed)
        .map(|index| {
            let reasons: Vec<String> = errors
                .iter()
                .filter(|e| e.index == index)
                .map(|e| e.problem.to_string())
                .chain(whole.iter().cloned())
                .collect();
            let error = (!reasons.is_empty()).then(|| reasons.join("; "));
            status_entry(name, index, from[index].kind(), None, error, memory, now)
        })
        .collect()
}

/// The status entry of one source, remembering when its members changed.
/// Why a source's members are not known now (its status says it).
#[derive(Debug, thiserror::Error)]
enum Unavailable {
    /// A watch the source needs fails; its error's text as the watch
    /// reported it.
    #[error(
        "{0} (if this is 403 Forbidden: the controller may list Pods and Services only when the chart's memberSources.pods / memberSources.services is true)"
    )]
    Watch(String),
    /// The url source's last fetch failed (the feeds task's text).
    #[error("{0}")]
    Fetch(String),
}

fn status_entry(
    policy: &str,
    index: usize,
    kind: &'static str,
    members: Option<&[String]>,
    error: Option<String>,
    memory: &mut Memory,
    now: Timestamp,
) -> SourceStatus {
    let key = (policy.to_string(), index);
    if let Some(members) = members {
        let d = digest(members.iter().map(String::as_str));
        let changed = memory
            .get(&key)
            .is_none_or(|r| r.digest != d || r.kind != kind);
        if changed {
            memory.insert(
                key.clone(),
                Remembered {
                    kind,
                    digest: d,
                    members: members.len() as i64,
                    since: now.round(jiff::Unit::Second).unwrap_or(now),
                },
            );
        }
    }
    let known = memory.get(&key).filter(|r| r.kind == kind);
    SourceStatus {
        index: index as i32,
        kind: kind.to_string(),
        members: known.map_or(0, |r| r.members),
        last_update: known.map(|r| Time(r.since)),
        error: error.map(|e| ipsetmgr_policy::text::bounded(&e, MAX_ERROR_LEN).into_owned()),
    }
}

/// The condition that says whether every source is in force.
pub(crate) fn sources_message(statuses: &[SourceStatus]) -> Option<String> {
    let failing: Vec<String> = statuses
        .iter()
        .filter_map(|s| {
            s.error
                .as_ref()
                .map(|e| format!("membersFrom[{}] ({}): {e}", s.index, s.kind))
        })
        .collect();
    (!failing.is_empty()).then(|| failing.join("; "))
}
