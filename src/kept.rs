//! The requests as the rounds last read or wrote them ([`Kept`]).
//!
//! A round decides on the request as it is now. Between two rounds only the operator writes a
//! live request's status, and every other change of the request (its spec, labels,
//! annotations, finalizers, deletion) reaches the operator through its watch of the requests.
//! So the copy a round read, or the one its status write returned, is still the request as it
//! is while no such change arrived since before that read or write: the next round decides on
//! it without reading the request again. A change counted after the copy was taken voids it,
//! and so does a write the copy does not carry (the round takes the copy; only a round that
//! ends well keeps one again).

use std::collections::HashMap;
use std::hash::Hash;

/// Per request: how many changes of it the watch delivered, and the copy kept, with the count
/// taken before it was read or written.
#[derive(Debug)]
pub struct Kept<K, V> {
    by_key: HashMap<K, Entry<V>>,
}

impl<K, V> Default for Kept<K, V> {
    fn default() -> Self {
        Self {
            by_key: HashMap::new(),
        }
    }
}

#[derive(Debug)]
struct Entry<V> {
    changes: u64,
    copy: Option<(V, u64)>,
}

impl<V> Default for Entry<V> {
    fn default() -> Self {
        Self {
            changes: 0,
            copy: None,
        }
    }
}

impl<K: Hash + Eq + Clone, V> Kept<K, V> {
    /// Counts a change of `key` delivered by the watch; the copy kept of it is void.
    pub fn changed(&mut self, key: &K) {
        let entry = self.by_key.entry(key.clone()).or_default();
        entry.changes += 1;
        entry.copy = None;
    }

    /// The count of `key`'s changes, taken before a read or a write of it.
    pub fn count(&mut self, key: &K) -> u64 {
        self.by_key.entry(key.clone()).or_default().changes
    }

    /// Keeps `copy` of `key`, read or written after its changes were counted at `seen`; not
    /// when a change came since (the copy may not carry it).
    pub fn keep(&mut self, key: &K, copy: V, seen: u64) {
        let entry = self.by_key.entry(key.clone()).or_default();
        entry.copy = (entry.changes == seen).then_some((copy, seen));
    }

    /// The copy kept of `key`, taken out (a round that ends well keeps one again), with the
    /// count it was kept at; `None` when there is none.
    pub fn take(&mut self, key: &K) -> Option<(V, u64)> {
        self.by_key.get_mut(key)?.copy.take()
    }

    /// Forgets `key` (the request is gone).
    pub fn forget(&mut self, key: &K) {
        self.by_key.remove(key);
    }

    /// How many requests are kept.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_given_back_once_while_nothing_changed() {
        let mut kept = Kept::default();
        let seen = kept.count(&"a");
        kept.keep(&"a", "written", seen);
        assert_eq!(kept.take(&"a"), Some(("written", seen)));
        assert_eq!(kept.take(&"a"), None, "taken out: a round keeps one again");
        assert_eq!(kept.take(&"b"), None);
    }

    #[test]
    fn a_change_counted_after_the_count_voids_the_copy() {
        let mut kept = Kept::default();
        let seen = kept.count(&"a");
        kept.keep(&"a", "read", seen);
        kept.changed(&"a");
        assert_eq!(kept.take(&"a"), None, "changed after it was kept");
        // A change between the count and the read or write: not kept at all.
        let seen = kept.count(&"a");
        kept.changed(&"a");
        kept.keep(&"a", "read", seen);
        assert_eq!(kept.take(&"a"), None, "changed before it was kept");
        let seen = kept.count(&"a");
        kept.keep(&"a", "read again", seen);
        assert_eq!(kept.take(&"a"), Some(("read again", seen)));
    }

    #[test]
    fn changes_of_one_request_leave_the_others_copies() {
        let mut kept = Kept::default();
        let (a, b) = (kept.count(&"a"), kept.count(&"b"));
        kept.keep(&"a", 1, a);
        kept.keep(&"b", 2, b);
        kept.changed(&"b");
        assert_eq!(kept.take(&"a"), Some((1, a)));
        assert_eq!(kept.take(&"b"), None);
    }

    #[test]
    fn a_request_gone_is_forgotten() {
        let mut kept = Kept::default();
        let seen = kept.count(&"a");
        kept.keep(&"a", 1, seen);
        assert_eq!(kept.len(), 1);
        kept.forget(&"a");
        assert!(kept.is_empty());
        assert_eq!(kept.take(&"a"), None);
    }
}
