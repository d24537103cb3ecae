//! The API server's endpoint addresses, for the url egress guard
//! (docs/member-sources.md, "Egress"). The guard knows the API server by its
//! client's URL host and `KUBERNETES_SERVICE_HOST`, which are usually the
//! Service's address; the servers themselves answer on the endpoints of
//! Service `default/kubernetes` (a pod-network or node address, often
//! inside a range an operator allows for an internal feed). Its
//! EndpointSlices are watched, in `default` only (the chart's
//! `<name>-controller-endpoints` Role), and the guard follows them.
//!
//! When they cannot be read (a Role missing) the guard keeps what it knows,
//! and a warning says so once per failing streak.

use std::collections::BTreeMap;
use std::net::IpAddr;

use futures::StreamExt;
use ipsetmgr_feeds::egress::ApiServerAddresses;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};

/// Where the API server's Service is, and the label of its slices.
const NAMESPACE: &str = "default";
const SELECTOR: &str = "kubernetes.io/service-name=kubernetes";

/// Follow the slices until the stream ends (never, in practice: the watch
/// retries with backoff; the controller aborts the task when it stops).
pub async fn follow(client: Client, addresses: ApiServerAddresses) {
    let api: Api<EndpointSlice> = Api::namespaced(client, NAMESPACE);
    let mut events = watcher::watcher(api, watcher::Config::default().labels(SELECTOR))
        .default_backoff()
        .boxed();
    let mut slices = Slices::default();
    let mut failing = false;
    while let Some(ev) = events.next().await {
        match ev {
            Ok(ev) => {
                failing = false;
                if let Some(all) = slices.on_event(ev)
                    && addresses.set_endpoints(all)
                {
                    tracing::info!(addresses = ?addresses.all(), "url sources may not connect to the API server's addresses (its endpoints changed)");
                }
            }
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(
                    error = %ipsetmgr_cluster::api_error::describe_watch(&e),
                    known = ?addresses.all(),
                    "cannot read the API server's EndpointSlices ({NAMESPACE}/kubernetes); url sources are guarded with the addresses known"
                );
            }
            Err(e) => {
                tracing::debug!(error = %ipsetmgr_cluster::api_error::describe_watch(&e), "API server EndpointSlices still not readable");
            }
        }
    }
}

/// The addresses of every slice by name, as the watch delivers them.
#[derive(Default)]
struct Slices {
    listed: BTreeMap<String, Vec<IpAddr>>,
    /// A relist in progress: it replaces `listed` when done.
    relist: Option<BTreeMap<String, Vec<IpAddr>>>,
}

impl Slices {
    /// Take one event; every address now, when they may have changed.
    fn on_event(&mut self, ev: Event<EndpointSlice>) -> Option<Vec<IpAddr>> {
        match ev {
            Event::Init => {
                self.relist = Some(BTreeMap::new());
                return None;
            }
            Event::InitApply(s) => {
                if let Some(r) = self.relist.as_mut() {
                    r.insert(s.name_any(), addresses_of(&s));
                }
                return None;
            }
            Event::InitDone => self.listed = self.relist.take().unwrap_or_default(),
            Event::Apply(s) => {
                self.listed.insert(s.name_any(), addresses_of(&s));
            }
            Event::Delete(s) => {
                self.listed.remove(&s.name_any());
            }
        }
        Some(self.listed.values().flatten().copied().collect())
    }
}

/// Every address of a slice, ready or not (a server that is starting is
/// still the API server); FQDN slices name no address.
fn addresses_of(s: &EndpointSlice) -> Vec<IpAddr> {
    s.endpoints
        .iter()
        .flatten()
        .flat_map(|e| &e.addresses)
        .filter_map(|a| a.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::Endpoint;

    fn slice(name: &str, addrs: &[&str]) -> EndpointSlice {
        EndpointSlice {
            metadata: kube::core::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: Some(
                addrs
                    .iter()
                    .map(|a| Endpoint {
                        addresses: vec![a.to_string()],
                        ..Default::default()
                    })
                    .collect(),
            ),
            ports: None,
        }
    }

    fn ips(list: &[&str]) -> Option<Vec<IpAddr>> {
        Some(list.iter().map(|a| a.parse().unwrap()).collect())
    }

    #[test]
    fn slices_are_followed_through_changes_deletions_and_relists() {
        let mut s = Slices::default();
        assert_eq!(s.on_event(Event::Init), None);
        assert_eq!(
            s.on_event(Event::InitApply(slice("a", &["10.0.0.1"]))),
            None
        );
        assert_eq!(s.on_event(Event::InitDone), ips(&["10.0.0.1"]));
        assert_eq!(
            s.on_event(Event::Apply(slice("b", &["10.0.0.2", "fd00::1"]))),
            ips(&["10.0.0.1", "10.0.0.2", "fd00::1"])
        );
        assert_eq!(
            s.on_event(Event::Apply(slice("a", &["10.0.0.3"]))),
            ips(&["10.0.0.3", "10.0.0.2", "fd00::1"])
        );
        assert_eq!(
            s.on_event(Event::Delete(slice("b", &[]))),
            ips(&["10.0.0.3"])
        );
        // A relist without "a": it is gone once the relist is done.
        s.on_event(Event::Init);
        s.on_event(Event::InitApply(slice("c", &["10.0.0.4", "not-an-ip"])));
        assert_eq!(s.on_event(Event::InitDone), ips(&["10.0.0.4"]));
    }
}
