//! Whether the IPSetPolicy kind itself is in place, so that losing it is
//! never mistaken for "every policy was deleted".
//!
//! Deleting the CustomResourceDefinition makes the API server delete every
//! IPSetPolicy first: the agent's watch then reports each one as deleted,
//! exactly as if a user had removed them all, and the agent would prune
//! every owned set. The documented promise is the opposite (uninstalling
//! leaves the kernel as it is), so the agent watches the CRD too: while the
//! CRD is terminating, absent, or a list of the kind answers 404, the kernel
//! is left exactly as it is (fail static) and the agent says so loudly.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::runtime::watcher::Event;

/// The CRD's name, for the watch's field selector and RBAC.
pub fn crd_name() -> String {
    use kube::CustomResourceExt;
    crate::policy::IPSetPolicy::crd_name().to_string()
}

/// What the agent knows of the IPSetPolicy kind.
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

#[derive(Debug)]
pub struct KindGuard {
    state: KindState,
    /// Whether the initial list of the CRD watch found an object.
    init_seen: bool,
}

impl Default for KindGuard {
    fn default() -> Self {
        KindGuard {
            state: KindState::Unknown,
            init_seen: false,
        }
    }
}

fn state_of(crd: &CustomResourceDefinition) -> KindState {
    if crd.metadata.deletion_timestamp.is_some() {
        KindState::Terminating
    } else {
        KindState::Present
    }
}

impl KindGuard {
    pub fn state(&self) -> KindState {
        self.state
    }

    /// Only a present, healthy kind lets the agent change the kernel.
    pub fn may_apply(&self) -> bool {
        self.state == KindState::Present
    }

    /// Feed one event of the CRD watch; returns whether the state changed.
    pub fn on_event(&mut self, ev: Event<CustomResourceDefinition>) -> bool {
        let new = match ev {
            Event::Init => {
                self.init_seen = false;
                return false;
            }
            Event::InitApply(crd) => {
                self.init_seen = true;
                state_of(&crd)
            }
            Event::InitDone if self.init_seen => return false,
            Event::InitDone | Event::Delete(_) => KindState::Gone,
            Event::Apply(crd) => state_of(&crd),
        };
        self.set(new)
    }

    /// A list or watch of IPSetPolicies answered 404: the kind vanished.
    pub fn kind_not_found(&mut self) -> bool {
        self.set(KindState::Gone)
    }

    fn set(&mut self, new: KindState) -> bool {
        let changed = new != self.state;
        if changed {
            match new {
                KindState::Present => tracing::info!("the IPSetPolicy kind is present"),
                KindState::Terminating | KindState::Gone => tracing::error!(
                    state = ?new,
                    "the IPSetPolicy CRD is being deleted or is gone: the kernel sets are left \
                     exactly as they are (fail static) until it is back"
                ),
                KindState::Unknown => {}
            }
        }
        self.state = new;
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd(deleting: bool) -> CustomResourceDefinition {
        let mut c: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": crd_name()},
            "spec": {"group": "ipsetmgr.io", "names": {"kind": "IPSetPolicy", "plural": "ipsetpolicies"},
                     "scope": "Cluster", "versions": []}
        }))
        .unwrap();
        if deleting {
            c.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
        }
        c
    }

    #[test]
    fn only_a_present_kind_allows_changes() {
        let mut g = KindGuard::default();
        assert!(!g.may_apply(), "unknown at start");
        g.on_event(Event::Init);
        g.on_event(Event::InitApply(crd(false)));
        g.on_event(Event::InitDone);
        assert!(g.may_apply());
        assert!(g.on_event(Event::Apply(crd(true))));
        assert_eq!(g.state(), KindState::Terminating);
        assert!(!g.may_apply());
        g.on_event(Event::Delete(crd(true)));
        assert_eq!(g.state(), KindState::Gone);
        // A relist that finds nothing: still gone.
        g.on_event(Event::Init);
        g.on_event(Event::InitDone);
        assert_eq!(g.state(), KindState::Gone);
        // Reinstalled.
        assert!(g.on_event(Event::Apply(crd(false))));
        assert!(g.may_apply());
        assert!(g.kind_not_found());
        assert!(!g.may_apply());
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
