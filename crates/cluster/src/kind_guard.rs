//! Whether this project's kinds are in place, so that losing one is never
//! mistaken for "every policy (or every slice) was deleted".
//!
//! Deleting a CustomResourceDefinition makes the API server delete every
//! object of its kind first: the agent's watch then reports each one as
//! deleted, exactly as if a user had removed them all, and the agent would
//! prune every owned set (or every sliced member). The documented promise
//! is the opposite (uninstalling leaves the kernel as it is), so the agent
//! watches the CRDs too: while one is terminating, absent, or a list of its
//! kind answers 404, the kernel is left exactly as it is (fail static) and
//! the agent says so loudly.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::runtime::watcher::Event;

/// What is known of one kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KindState {
    /// Not seen yet: nothing is applied until it is.
    Unknown,
    Present,
    /// The CRD has a deletion timestamp: its objects are being deleted.
    Terminating,
    /// The CRD is gone, or the API server answered 404 for the kind.
    Gone,
}

#[derive(Debug, Clone, Copy)]
struct Kind {
    state: KindState,
    /// Whether the current initial list of the CRD watch found the object.
    init_seen: bool,
}

/// The state of each watched CRD, by name (`<plural>.<group>`).
#[derive(Debug)]
pub struct KindGuard {
    kinds: BTreeMap<String, Kind>,
}

fn state_of(crd: &CustomResourceDefinition) -> KindState {
    if crd.metadata.deletion_timestamp.is_some() {
        KindState::Terminating
    } else {
        KindState::Present
    }
}

impl KindGuard {
    /// Guard the kinds of these CRDs.
    pub fn new(crds: &[String]) -> KindGuard {
        let unknown = Kind {
            state: KindState::Unknown,
            init_seen: false,
        };
        KindGuard {
            kinds: crds.iter().map(|n| (n.clone(), unknown)).collect(),
        }
    }

    /// Only when every kind is present may the kernel be changed.
    pub fn may_apply(&self) -> bool {
        self.kinds.values().all(|k| k.state == KindState::Present)
    }

    /// The kinds that are not present, for messages.
    pub fn missing(&self) -> Vec<(String, KindState)> {
        self.kinds
            .iter()
            .filter(|(_, k)| k.state != KindState::Present)
            .map(|(n, k)| (n.clone(), k.state))
            .collect()
    }

    /// Feed one event of the watch on CRD `name`; returns whether its state
    /// changed.
    pub fn on_event(&mut self, name: &str, ev: Event<CustomResourceDefinition>) -> bool {
        let Some(kind) = self.kinds.get_mut(name) else {
            return false;
        };
        let new = match ev {
            Event::Init => {
                kind.init_seen = false;
                return false;
            }
            Event::InitApply(crd) => {
                kind.init_seen = true;
                state_of(&crd)
            }
            Event::InitDone if kind.init_seen => return false,
            Event::InitDone | Event::Delete(_) => KindState::Gone,
            Event::Apply(crd) => state_of(&crd),
        };
        self.set(name, new)
    }

    /// A list or watch of CRD `name`'s kind answered 404: it vanished.
    pub fn kind_not_found(&mut self, name: &str) -> bool {
        self.set(name, KindState::Gone)
    }

    fn set(&mut self, name: &str, new: KindState) -> bool {
        let Some(kind) = self.kinds.get_mut(name) else {
            return false;
        };
        let changed = new != kind.state;
        kind.state = new;
        if changed {
            match new {
                KindState::Present => tracing::info!(crd = name, "kind present"),
                KindState::Terminating | KindState::Gone => tracing::error!(
                    crd = name,
                    state = ?new,
                    "a CRD of ipsetmgr is being deleted or is gone: the kernel sets are left \
                     exactly as they are (fail static) until it is back"
                ),
                KindState::Unknown => {}
            }
        }
        changed
    }
}

/// Whether a watch error says that the kind does not exist (404), as
/// opposed to a passing failure (or 410 Gone, which only means "relist").
pub fn is_kind_not_found(e: &kube::runtime::watcher::Error) -> bool {
    use kube::runtime::watcher::Error as W;
    match e {
        W::InitialListFailed(kube::Error::Api(s))
        | W::WatchStartFailed(kube::Error::Api(s))
        | W::WatchFailed(kube::Error::Api(s)) => s.code == 404,
        W::WatchError(s) => s.code == 404,
        _ => false,
    }
}

/// A CustomResourceDefinition named `name` (being deleted or not), for the
/// roles' tests (feature `mock`).
#[cfg(any(test, feature = "mock"))]
pub fn test_crd(name: &str, deleting: bool) -> CustomResourceDefinition {
    let mut meta = serde_json::json!({"name": name});
    if deleting {
        meta["deletionTimestamp"] = serde_json::json!("2026-12-01T00:00:00Z");
    }
    serde_json::from_value(serde_json::json!({
        "metadata": meta,
        "spec": {"group": "ipsetmgr.io", "scope": "Cluster", "versions": [],
                 "names": {"kind": "X", "plural": "xs"}}
    }))
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::test_crd as crd;
    use super::*;

    #[test]
    fn only_present_kinds_allow_changes() {
        let names = ["a.ipsetmgr.io".to_string(), "b.ipsetmgr.io".to_string()];
        let mut g = KindGuard::new(&names);
        assert!(!g.may_apply(), "unknown at start");
        for n in &names {
            g.on_event(n, Event::Init);
            g.on_event(n, Event::InitApply(crd(n, false)));
            g.on_event(n, Event::InitDone);
        }
        assert!(g.may_apply());
        assert!(g.on_event(&names[1], Event::Apply(crd(&names[1], true))));
        assert!(!g.may_apply(), "one terminating kind stops everything");
        assert_eq!(g.missing(), [(names[1].clone(), KindState::Terminating)]);
        g.on_event(&names[1], Event::Delete(crd(&names[1], true)));
        // A relist that finds nothing: still gone.
        g.on_event(&names[1], Event::Init);
        g.on_event(&names[1], Event::InitDone);
        assert_eq!(g.missing(), [(names[1].clone(), KindState::Gone)]);
        assert!(g.on_event(&names[1], Event::Apply(crd(&names[1], false))));
        assert!(g.may_apply(), "reinstalled");
        assert!(g.kind_not_found(&names[0]));
        assert!(!g.may_apply());
        assert!(
            !g.on_event("other.io", Event::InitDone),
            "unwatched names are ignored"
        );
    }

    #[test]
    fn only_404_means_the_kind_is_gone() {
        use kube::runtime::watcher::Error as W;
        let status = |code| {
            Box::new(kube::core::Status {
                code,
                ..Default::default()
            })
        };
        assert!(is_kind_not_found(&W::InitialListFailed(kube::Error::Api(
            status(404)
        ))));
        assert!(is_kind_not_found(&W::WatchError(status(404))));
        assert!(!is_kind_not_found(&W::WatchError(status(410))));
        assert!(!is_kind_not_found(&W::InitialListFailed(kube::Error::Api(
            status(500)
        ))));
        assert!(!is_kind_not_found(&W::NoResourceVersion));
    }
}
