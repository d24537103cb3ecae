//! The objects of one watch, kept by name. A watcher (re)lists with
//! Init / InitApply* / InitDone; the new listing replaces the old one only
//! when complete, so a relist after a 410 Gone never looks like "every
//! object deleted" halfway through. Whether the first complete list has
//! arrived is what decides that deletions may be trusted at all.

use std::collections::BTreeMap;

use kube::runtime::watcher::Event;

/// What one event changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// Whether anything changed.
    pub changed: bool,
    /// Whether objects were removed (deletions deserve extra care).
    pub removed: bool,
}

/// Objects of one kind by name, keyed by `key` from each event's object.
#[derive(Debug)]
pub struct Listing<T> {
    items: BTreeMap<String, T>,
    pending: Option<BTreeMap<String, T>>,
    listed: bool,
}

impl<T> Default for Listing<T> {
    fn default() -> Self {
        Listing {
            items: BTreeMap::new(),
            pending: None,
            listed: false,
        }
    }
}

impl<T> Listing<T> {
    /// Whether a complete list has arrived.
    pub fn listed(&self) -> bool {
        self.listed
    }

    pub fn items(&self) -> &BTreeMap<String, T> {
        &self.items
    }

    pub fn items_mut(&mut self) -> &mut BTreeMap<String, T> {
        &mut self.items
    }

    pub fn get(&self, name: &str) -> Option<&T> {
        self.items.get(name)
    }

    /// Apply one watch event; `named` turns an object into (name, item);
    /// `same` tells an update that changes nothing (e.g. a status-only
    /// write) from a real one.
    pub fn apply<K>(
        &mut self,
        ev: Event<K>,
        named: impl Fn(K) -> (String, T),
        same: impl Fn(&T, &T) -> bool,
    ) -> Change {
        match ev {
            Event::Init => {
                self.pending = Some(BTreeMap::new());
                Change::default()
            }
            Event::InitApply(obj) => {
                let (name, item) = named(obj);
                self.pending
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name, item);
                Change::default()
            }
            Event::InitDone => {
                let listed = self.pending.take().unwrap_or_default();
                let removed = self.items.keys().any(|k| !listed.contains_key(k));
                self.items = listed;
                self.listed = true;
                Change {
                    changed: true,
                    removed,
                }
            }
            Event::Apply(obj) => {
                let (name, item) = named(obj);
                let unchanged = self.items.get(&name).is_some_and(|old| same(old, &item));
                self.items.insert(name, item);
                Change {
                    changed: !unchanged,
                    removed: false,
                }
            }
            Event::Delete(obj) => {
                let (name, _) = named(obj);
                let removed = self.items.remove(&name).is_some();
                Change {
                    changed: removed,
                    removed,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(s: (&'static str, u32)) -> (String, u32) {
        (s.0.to_string(), s.1)
    }

    #[test]
    fn a_relist_replaces_the_listing_only_when_complete() {
        let mut l: Listing<u32> = Listing::default();
        let same = |a: &u32, b: &u32| a == b;
        assert!(!l.listed());
        l.apply(Event::Init, named, same);
        l.apply(Event::InitApply(("a", 1)), named, same);
        l.apply(Event::InitApply(("b", 1)), named, same);
        assert!(l.items().is_empty(), "not before InitDone");
        let c = l.apply(Event::InitDone, named, same);
        assert!(l.listed() && c.changed && !c.removed);
        assert_eq!(l.items().len(), 2);
        // Same content: no change; new content: a change.
        assert!(!l.apply(Event::Apply(("a", 1)), named, same).changed);
        assert!(l.apply(Event::Apply(("a", 2)), named, same).changed);
        // A relist (after 410 Gone) in progress keeps the old listing.
        l.apply(Event::Init, named, same);
        l.apply(Event::InitApply(("a", 2)), named, same);
        assert_eq!(l.items().len(), 2);
        let c = l.apply(Event::InitDone, named, same);
        assert!(c.removed, "b is gone after the relist");
        assert_eq!(l.items().keys().collect::<Vec<_>>(), ["a"]);
        let c = l.apply(Event::Delete(("a", 0)), named, same);
        assert!(c.removed && l.items().is_empty());
        assert!(!l.apply(Event::Delete(("zz", 0)), named, same).changed);
    }
}
