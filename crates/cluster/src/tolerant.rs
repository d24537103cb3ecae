//! Reading objects one by one, so that one object that does not fit the
//! Rust types (stored under an older, looser schema, say `maxElem:
//! 8589934592`) is reported and held alone instead of failing the whole
//! list of its kind. Watches deliver untyped objects; each is then decoded
//! on its own.

use std::collections::BTreeMap;

use futures::{Stream, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// Longest decode error kept (it may quote the object).
const MAX_ERROR_LEN: usize = 512;

/// One object of a watch, typed if it could be.
#[derive(Clone, Debug)]
pub struct Tolerant<K> {
    pub name: String,
    pub uid: Option<String>,
    pub resource_version: String,
    pub generation: Option<i64>,
    pub labels: BTreeMap<String, String>,
    /// `Err(why)` when the object does not deserialize into `K`.
    pub value: Result<K, Unreadable>,
}

/// Why a [`Tolerant`] object has no typed value. The compiler borrows the
/// text ([`Unreadable::as_str`]) for its own error of the policy or slice.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    /// It does not deserialize into the Rust type: serde's sentence,
    /// bounded (it may quote the object; serde's error is not `Clone`).
    #[error("{0}")]
    Decode(String),
    /// A deletion seen in metadata only: there is no object to decode.
    #[error("deleted")]
    Deleted,
}

impl Unreadable {
    /// The Display text, borrowed.
    pub fn as_str(&self) -> &str {
        match self {
            Unreadable::Decode(why) => why,
            Unreadable::Deleted => "deleted",
        }
    }
}

/// A watch event with its object turned into another type.
pub fn map_event<A, B>(ev: Event<A>, f: impl FnOnce(A) -> B) -> Event<B> {
    match ev {
        Event::Apply(a) => Event::Apply(f(a)),
        Event::Delete(a) => Event::Delete(f(a)),
        Event::Init => Event::Init,
        Event::InitApply(a) => Event::InitApply(f(a)),
        Event::InitDone => Event::InitDone,
    }
}

/// The API resource of `K`, for untyped watches of it.
pub fn resource<K: Resource<DynamicType = ()>>() -> ApiResource {
    ApiResource::erase::<K>(&())
}

/// An untyped watch of `K`'s kind (with kube's default backoff), each
/// object decoded on its own.
pub fn watch<K>(
    client: &Client,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<Tolerant<K>>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Send + 'static,
{
    let ar = resource::<K>();
    watcher::watcher(Api::<DynamicObject>::all_with(client.clone(), &ar), config)
        .default_backoff()
        .map(|r| r.map(|ev| map_event(ev, decode::<K>)))
}

/// Decode one untyped object into `K`.
pub fn decode<K: DeserializeOwned>(mut obj: DynamicObject) -> Tolerant<K> {
    // Nobody reads them, and they are large.
    obj.metadata.managed_fields = None;
    // The identity first: decoding consumes the object.
    let mut t = Tolerant::of_meta(&obj.metadata, Err(Unreadable::Deleted));
    t.value = serde_json::to_value(obj)
        .and_then(serde_json::from_value::<K>)
        .map_err(|e| {
            Unreadable::Decode(
                ipsetmgr_policy::text::bounded(&e.to_string(), MAX_ERROR_LEN).into_owned(),
            )
        });
    t
}

impl<K> Tolerant<K> {
    /// The object's identity from its metadata, with `value` as read.
    fn of_meta(m: &kube::api::ObjectMeta, value: Result<K, Unreadable>) -> Tolerant<K> {
        Tolerant {
            // As ResourceExt::name_any reads it.
            name: m
                .name
                .clone()
                .or_else(|| m.generate_name.clone())
                .unwrap_or_default(),
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone().unwrap_or_default(),
            generation: m.generation,
            labels: m.labels.clone().unwrap_or_default(),
            value,
        }
    }
}

/// Why [`watch_by_generation`] yields no object now; its Display is a
/// sentence (`api_error.rs`), never kube's debug dump.
#[derive(Debug, thiserror::Error)]
pub enum SpecWatchError {
    /// The watch itself (the kind guard reads a 404 of it).
    #[error("{}", super::api_error::describe_watch(.0))]
    Watch(watcher::Error),
    /// Reading one object whole; retried.
    #[error("{0}")]
    Get(String),
}

/// A watch of `K` that moves only metadata, and reads an object whole
/// (one GET, decoded on its own) only when its spec may have changed: a new
/// uid or generation. Every status write of a policy reaches every watcher;
/// with a full watch that is the whole policy (a 50,000-member policy is
/// 0.75 MB) to every agent, with this one about a kilobyte. What it yields
/// is what [`watch`] yields, except that status-only changes yield nothing.
///
/// A GET that fails is retried (the error reported in between) before
/// anything else of the watch is taken, so a relist is never completed
/// without an object it listed (that would read as "deleted"); an object
/// gone between its event and the GET (404) is skipped: its deletion
/// follows.
pub fn watch_by_generation<K>(
    client: &Client,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<Tolerant<K>>, SpecWatchError>> + Send + 'static
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    use kube::core::PartialObjectMeta;
    type Meta<K> = Event<PartialObjectMeta<K>>;
    struct State<K: Resource<DynamicType = ()>> {
        events: futures::stream::BoxStream<'static, Result<Meta<K>, watcher::Error>>,
        api: Api<DynamicObject>,
        /// (uid, generation) of each object as last read whole.
        known: BTreeMap<String, (Option<String>, Option<i64>)>,
        /// An event whose GET failed, and the next wait before retrying.
        retry: Option<(Meta<K>, std::time::Duration)>,
    }
    let state = State {
        events: watcher::watcher(Api::<PartialObjectMeta<K>>::all(client.clone()), config)
            .default_backoff()
            .boxed(),
        api: Api::<DynamicObject>::all_with(client.clone(), &resource::<K>()),
        known: BTreeMap::new(),
        retry: None,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            let (ev, wait) = match st.retry.take() {
                Some((ev, wait)) => {
                    tokio::time::sleep(wait).await;
                    (ev, wait)
                }
                None => match st.events.next().await? {
                    Ok(ev) => (ev, std::time::Duration::from_secs(1)),
                    Err(e) => return Some((Err(SpecWatchError::Watch(e)), st)),
                },
            };
            let (meta, init) = match ev {
                Event::Init => return Some((Ok(Event::Init), st)),
                Event::InitDone => return Some((Ok(Event::InitDone), st)),
                Event::Delete(m) => {
                    st.known.remove(&m.name_any());
                    let gone = Tolerant::of_meta(&m.metadata, Err(Unreadable::Deleted));
                    return Some((Ok(Event::Delete(gone)), st));
                }
                Event::Apply(m) => (m, false),
                Event::InitApply(m) => (m, true),
            };
            let name = meta.name_any();
            let version = (meta.metadata.uid.clone(), meta.metadata.generation);
            // Status and metadata only: nothing the agent reads changed.
            if !init && st.known.get(&name) == Some(&version) {
                continue;
            }
            match st.api.get(&name).await {
                Ok(obj) => {
                    let t = decode::<K>(obj);
                    st.known.insert(name, (t.uid.clone(), t.generation));
                    let ev = if init {
                        Event::InitApply(t)
                    } else {
                        Event::Apply(t)
                    };
                    return Some((Ok(ev), st));
                }
                Err(kube::Error::Api(s)) if s.is_not_found() => continue,
                Err(e) => {
                    let again = if init {
                        Event::InitApply(meta)
                    } else {
                        Event::Apply(meta)
                    };
                    st.retry = Some((again, (wait * 2).min(std::time::Duration::from_secs(30))));
                    let e = super::api_error::describe(&e);
                    return Some((Err(SpecWatchError::Get(format!("reading {name}: {e}"))), st));
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipsetmgr_api::IPSetPolicy;
    use serde_json::json;

    fn dynamic(v: serde_json::Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn one_bad_object_is_an_error_of_its_own() {
        let good = decode::<IPSetPolicy>(dynamic(json!({
            "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
            "metadata": {"name": "ok", "resourceVersion": "7", "labels": {"a": "b"},
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"type": "hash:ip", "members": ["10.0.0.1"]}
        })));
        assert_eq!(good.name, "ok");
        assert_eq!(good.resource_version, "7");
        assert_eq!(good.labels["a"], "b");
        let p = good.value.unwrap();
        assert_eq!(p.spec.members, ["10.0.0.1"]);
        assert!(p.metadata.managed_fields.is_none());

        let bad = decode::<IPSetPolicy>(dynamic(json!({
            "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy",
            "metadata": {"name": "old"},
            "spec": {"type": "hash:ip", "maxElem": 8589934592u64}
        })));
        assert_eq!(bad.name, "old");
        let e = bad.value.unwrap_err().to_string();
        assert!(e.contains("8589934592"), "{e}");
    }
}
