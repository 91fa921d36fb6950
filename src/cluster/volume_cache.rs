//! The volumes the rounds read, kept between rounds: a volume read by name is read again only
//! once the watch of the volumes' metadata saw it change (another `resourceVersion`, or its
//! deletion), until that watch fails or lists anew (a change, a deletion, may have gone
//! unseen; and from its failure until it reports again, nothing is kept), or once it is older than the cache's `max_age` ([`super::KEPT_MAX_AGE`]: a watch
//! that lags without failing cannot keep one longer). The rounds of a member's migration read the same few volumes
//! about once a second (the swapped members' volumes stay on `Retain` through
//! `plan::retain::keep_swapped`), which was a third of the operator's API requests.
//!
//! A decision that deletes a claim is never carried out on kept volumes: the controller reads
//! them again and decides again first (`controller::decided`), so the
//! `Retain` a claim delete relies on is read at that moment.
//!
//! A volume read while its watch event is on the way could be kept at the version before the
//! event: so each name counts the changes the watch reported, and a read is kept only if none
//! came between the start of its GET and its answer.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::ResourceExt;
use kube::runtime::watcher;

/// See the module doc.
#[derive(Debug)]
pub struct VolumeCache {
    max_age: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The volumes kept, with when each was read.
    kept: HashMap<String, (PersistentVolume, Instant)>,
    /// For each name read at least once: the changes the watch reported, and when it was
    /// last read (names not read for a while are forgotten).
    changes: HashMap<String, (u64, Instant)>,
    /// Whether the watch failed and has reported nothing since: then nothing is kept.
    down: bool,
}

/// A read in progress: the name's change count when its GET started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begun(u64);

impl Default for VolumeCache {
    fn default() -> Self {
        Self::new(super::KEPT_MAX_AGE)
    }
}

impl VolumeCache {
    pub fn new(max_age: Duration) -> Self {
        Self {
            max_age,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The volume `name` as kept, unless changed since or older than `max_age`.
    pub fn get(&self, name: &str) -> Option<PersistentVolume> {
        let inner = self.inner();
        if inner.down {
            return None;
        }
        let (pv, read) = inner.kept.get(name)?;
        (read.elapsed() < self.max_age).then(|| pv.clone())
    }

    /// Before a GET of `name`.
    pub fn begin(&self, name: &str) -> Begun {
        let mut inner = self.inner();
        let now = Instant::now();
        let forget = self.max_age * 6;
        inner.changes.retain(|_, (_, read)| now - *read < forget);
        inner.kept.retain(|_, (_, read)| now - *read < self.max_age);
        let (count, read) = inner.changes.entry(name.to_string()).or_insert((0, now));
        *read = now;
        Begun(*count)
    }

    /// After the GET `begun`: keeps `pv` unless the watch reported a change of it since.
    pub fn keep(&self, name: &str, pv: Option<&PersistentVolume>, begun: Begun) {
        let mut inner = self.inner();
        let unchanged = inner.changes.get(name).map(|(c, _)| Begun(*c)) == Some(begun);
        match pv {
            Some(pv) if unchanged && !inner.down => {
                inner
                    .kept
                    .insert(name.to_string(), (pv.clone(), Instant::now()));
            }
            _ => {
                inner.kept.remove(name);
            }
        }
    }

    /// What the watch of the volumes reports: each volume's change; its failures and new
    /// lists, after which nothing kept is used ([`VolumeCache::relisted`]), and after a
    /// failure nothing is kept until it reports again.
    pub fn saw<K: ResourceExt>(&self, event: &Result<watcher::Event<K>, watcher::Error>) {
        self.inner().down = event.is_err();
        match event {
            Ok(
                watcher::Event::Apply(v) | watcher::Event::InitApply(v) | watcher::Event::Delete(v),
            ) => self.changed(v),
            Ok(watcher::Event::Init) | Err(_) => self.relisted(),
            Ok(watcher::Event::InitDone) => {}
        }
    }

    /// The watch of the volumes failed or lists anew: a change or a deletion may have gone
    /// unseen, so nothing kept is used, and no read under way is kept.
    fn relisted(&self) {
        let mut inner = self.inner();
        inner.kept.clear();
        for (count, _) in inner.changes.values_mut() {
            *count += 1;
        }
    }

    /// The watch saw `volume` (changed, or deleted: its last version): what is kept of it goes
    /// unless it is that very version.
    fn changed(&self, volume: &impl ResourceExt) {
        let name = volume.name_any();
        let version = volume.resource_version();
        let mut inner = self.inner();
        let Inner { kept, changes, .. } = &mut *inner;
        let Some((count, _)) = changes.get_mut(&name) else {
            return;
        };
        if kept.get(&name).map(|(pv, _)| pv.resource_version()) == Some(version) {
            return;
        }
        *count += 1;
        kept.remove(&name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn pv(name: &str, version: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            ..PersistentVolume::default()
        }
    }

    fn version(p: Option<PersistentVolume>) -> Option<String> {
        p.and_then(|p| p.resource_version())
    }

    /// A GET of `name` that answered `version`, with no change seen while it ran.
    fn read(cache: &VolumeCache, name: &str, version: &str) {
        let begun = cache.begin(name);
        cache.keep(name, Some(&pv(name, version)), begun);
    }

    #[test]
    fn a_volume_read_is_kept_until_the_watch_sees_another_version() {
        let cache = VolumeCache::default();
        assert_eq!(cache.get("pv-a"), None);
        read(&cache, "pv-a", "7");
        assert_eq!(version(cache.get("pv-a")), Some("7".into()));
        // The watch reporting the version kept (a re-list) changes nothing.
        cache.changed(&pv("pv-a", "7"));
        assert_eq!(version(cache.get("pv-a")), Some("7".into()));
        // Another volume's event neither.
        cache.changed(&pv("pv-b", "9"));
        assert_eq!(version(cache.get("pv-a")), Some("7".into()));
        cache.changed(&pv("pv-a", "8"));
        assert_eq!(cache.get("pv-a"), None);
    }

    #[test]
    fn a_read_the_watch_saw_change_while_it_ran_is_not_kept() {
        let cache = VolumeCache::default();
        let begun = cache.begin("pv-a");
        cache.changed(&pv("pv-a", "8"));
        cache.keep("pv-a", Some(&pv("pv-a", "7")), begun);
        assert_eq!(cache.get("pv-a"), None);
        // The next read, with no event between, is kept.
        read(&cache, "pv-a", "8");
        assert_eq!(version(cache.get("pv-a")), Some("8".into()));
    }

    #[test]
    fn a_missing_volume_is_not_kept_and_forgets_what_was() {
        let cache = VolumeCache::default();
        read(&cache, "pv-a", "7");
        let begun = cache.begin("pv-a");
        cache.keep("pv-a", None, begun);
        assert_eq!(cache.get("pv-a"), None);
    }

    #[test]
    fn a_failure_or_new_list_of_the_watch_voids_every_kept_volume_and_read_under_way() {
        let cache = VolumeCache::default();
        read(&cache, "pv-a", "7");
        let under_way = cache.begin("pv-b");
        cache.saw::<PersistentVolume>(&Ok(watcher::Event::Init));
        // A volume deleted while the watch was down comes as no event of its own.
        assert_eq!(cache.get("pv-a"), None);
        cache.keep("pv-b", Some(&pv("pv-b", "3")), under_way);
        assert_eq!(cache.get("pv-b"), None);
        // A read begun after the new list is kept again.
        read(&cache, "pv-a", "7");
        assert_eq!(version(cache.get("pv-a")), Some("7".into()));
    }

    #[test]
    fn nothing_is_kept_from_a_failure_of_the_watch_until_it_reports_again() {
        let cache = VolumeCache::default();
        cache.saw::<PersistentVolume>(&Err(watcher::Error::NoResourceVersion));
        // Read while the watch is down: a change now would come as no event.
        read(&cache, "pv-a", "7");
        assert_eq!(cache.get("pv-a"), None);
        // Back: any event of it.
        cache.saw(&Ok(watcher::Event::Apply(pv("pv-z", "1"))));
        read(&cache, "pv-a", "7");
        assert_eq!(version(cache.get("pv-a")), Some("7".into()));
        cache.saw::<PersistentVolume>(&Err(watcher::Error::NoResourceVersion));
        assert_eq!(cache.get("pv-a"), None);
    }

    #[test]
    fn a_kept_volume_older_than_the_max_age_is_read_again() {
        let cache = VolumeCache::new(Duration::from_millis(20));
        read(&cache, "pv-a", "7");
        assert!(cache.get("pv-a").is_some());
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(cache.get("pv-a"), None);
    }
}
