//! Reads kept from round to round while the watches say nothing they read has changed.
//!
//! A member's migration takes about thirty rounds, and each read the namespace's claims, the
//! member pods, our Jobs and helper pods, the StatefulSet and the stash ConfigMap again: those
//! were two thirds of the operator's API requests, most of them answered as the round before.
//! The operator watches every kind of these ([`Watched`]): pods and claims (metadata, every
//! object in scope), our Jobs (by our label), StatefulSets, PodDisruptionBudgets and
//! StorageClasses (metadata) and our ConfigMaps (metadata, by our label). So a read of one of them is answered from the last answer to the
//! same read while, since that read began,
//! - no watch event of that kind came in that namespace,
//! - the watch of that kind did not fail or list anew,
//! - and has reported again since it last failed (while a watch is down, between its failure
//!   and its next event, nothing of its kind is kept or answered from what is kept: a change
//!   meanwhile would come as no event until it is back, which may take seconds after an API
//!   server outage: [`super::watch_retry`]),
//! - the operator wrote nothing of that kind in that namespace (its own write invalidates at
//!   once, before the watch reports it),
//! - and the answer is younger than the cache's `max_age` ([`super::KEPT_MAX_AGE`]: a watch
//!   that lags without failing cannot keep one longer).
//!
//! A kind watched by our label ([`Watched::by_label`]: Jobs, ConfigMaps) is kept only for a
//! list by a selector that requires our label, or for an object that carries it: a change of
//! anything else of that kind comes as no event.
//!
//! What may be stale here is at most the watch's delay (milliseconds) behind the API server,
//! as in any controller that reads from its watches. A decision that does more than write the
//! status, publish events and create objects is never carried out on kept reads: the controller
//! reads again and decides again first (`controller::decided`). Never kept: anything the
//! [`super::replay`] layer never replays (writes, streams, logs, volumes), and answers other
//! than 200 and 404 (a 404 only for a kind watched in full).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::api::ObjectMeta;
use kube::client::Body;
use kube::runtime::watcher;

use super::replay::{Answer, replayable_read};
use crate::labels::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};

/// The kinds the operator watches, whose reads may be kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Watched {
    Pods,
    Claims,
    Jobs,
    StatefulSets,
    ConfigMaps,
    /// PodDisruptionBudgets.
    Budgets,
    /// StorageClasses (cluster-scoped: their namespace is empty).
    StorageClasses,
}

impl Watched {
    /// The kind of a path's collection (`group` empty for the core group).
    fn of(group: &str, resource: &str) -> Option<Self> {
        Some(match (group, resource) {
            ("", "pods") => Self::Pods,
            ("", "persistentvolumeclaims") => Self::Claims,
            ("batch", "jobs") => Self::Jobs,
            ("apps", "statefulsets") => Self::StatefulSets,
            ("", "configmaps") => Self::ConfigMaps,
            ("policy", "poddisruptionbudgets") => Self::Budgets,
            ("storage.k8s.io", "storageclasses") => Self::StorageClasses,
            _ => return None,
        })
    }

    /// Whether the watch of this kind sees only the objects that carry our label.
    pub fn by_label(self) -> bool {
        matches!(self, Self::Jobs | Self::ConfigMaps)
    }
}

/// A namespaced path of a watched kind: the kind, the namespace, whether it is the collection
/// (a list) and whether it names a subresource (`/log`, `/status`, `/eviction`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub kind: Watched,
    pub namespace: String,
    pub list: bool,
    pub subresource: bool,
}

/// The watched kind and namespace `path` is of (`/api/v1/namespaces/NS/pods...`,
/// `/apis/GROUP/VERSION/namespaces/NS/RESOURCE...`; a cluster-scoped kind's namespace is
/// empty: `/apis/GROUP/VERSION/RESOURCE...`), if any.
pub fn target(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (namespace, resource, named) = match rest {
        ["namespaces", namespace, resource, named @ ..] => (*namespace, *resource, named),
        [resource, named @ ..] if Watched::of(group, resource) == Some(Watched::StorageClasses) => {
            ("", *resource, named)
        }
        _ => return None,
    };
    Some(Target {
        kind: Watched::of(group, resource)?,
        namespace: namespace.to_string(),
        list: named.is_empty(),
        subresource: named.len() > 1,
    })
}

/// Whether `query`'s label selector requires our label (`managed-by=storage-migrator`).
fn selects_ours(query: &str) -> bool {
    let ours = format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}");
    form_urlencoded::parse(query.as_bytes())
        .filter(|(key, _)| key == "labelSelector")
        .any(|(_, selector)| selector.split(',').any(|term| term.trim() == ours))
}

/// Whether the object of a 200 answer carries our label.
fn carries_ours(body: &[u8]) -> bool {
    let Ok(object) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    let key = MANAGED_BY_LABEL.replace('~', "~0").replace('/', "~1");
    object.pointer(&format!("/metadata/labels/{key}")) == Some(&MANAGED_BY_VALUE.into())
}

/// Whether a read's answer may be kept (see the module doc).
fn keepable(target: &Target, query: &str, answer: &Answer) -> bool {
    if !target.kind.by_label() {
        return matches!(answer.status, StatusCode::OK | StatusCode::NOT_FOUND);
    }
    if target.list {
        answer.status == StatusCode::OK && selects_ours(query)
    } else {
        answer.status == StatusCode::OK && carries_ours(&answer.body)
    }
}

/// Why a read went to the API server (traced).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Miss {
    /// None kept: never read, or changed (or possibly changed) since.
    NoneKept,
    /// The watch of its kind failed or listed anew since it was read.
    Relisted,
    /// Older than the cache's `max_age`.
    TooOld,
    /// The watch of its kind failed and has not reported since.
    WatchDown,
    /// The client reads now ([`Use::ReadNow`]).
    ReadNow,
}

/// Which reads a client answers from what is kept; it reads the others now (and keeps what it
/// read for later).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Use {
    /// Every read it may.
    Kept,
    /// Those of every kind but these.
    KeptBut(BTreeSet<Watched>),
    /// None.
    ReadNow,
}

impl Use {
    /// Whether a read of `kind` may be answered from what is kept.
    fn keeps(&self, kind: Watched) -> bool {
        match self {
            Self::Kept => true,
            Self::KeptBut(now) => !now.contains(&kind),
            Self::ReadNow => false,
        }
    }
}

/// A change of one object of a watched kind in a namespace, from a watch event or from our own
/// write: its name (`None`: not known, which may change any read of the kind there), its new
/// `resourceVersion` and labels, or its deletion.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Change {
    pub name: Option<String>,
    pub version: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub deleted: bool,
}

impl Change {
    /// The change an object's metadata says it is (`deleted`: its deletion).
    fn of(meta: &ObjectMeta, deleted: bool) -> Self {
        Self {
            name: meta.name.clone(),
            version: meta.resource_version.clone(),
            labels: meta.labels.clone().unwrap_or_default(),
            deleted,
        }
    }

    /// The change our own write made, from the object the API server answered with: not known
    /// when the answer is not that object.
    fn of_answer(name: Option<&str>, body: &[u8], deleted: bool) -> Self {
        #[derive(serde::Deserialize)]
        struct Object {
            metadata: ObjectMeta,
        }
        match serde_json::from_slice::<Object>(body) {
            Ok(o) if o.metadata.name.is_some() && o.metadata.resource_version.is_some() => {
                Self::of(&o.metadata, deleted)
            }
            // A deletion answered by a Status: the object named is gone.
            _ if deleted && name.is_some() => Self {
                name: name.map(str::to_string),
                deleted,
                ..Self::default()
            },
            _ => Self::default(),
        }
    }
}

/// What one kept answer shows: for a list, its selector and each object's version; for the
/// read of one object, its name and version (none: not found).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Shows {
    /// `Some(name)` for the read of one object.
    object: Option<String>,
    /// For a list: its label terms (`key`, `Some(value)` for `key=value`; `None` for a term
    /// this cache does not read, which may match anything) and the name its field selector
    /// asks for.
    labels: Vec<(String, Option<String>)>,
    field_name: Option<String>,
    /// Each object's `resourceVersion`, by name.
    versions: HashMap<String, String>,
}

impl Shows {
    /// What the answer `body` to the read of `path` (`target`) with `query` shows; `None`
    /// when it is not an object or a list of them (nothing can tell when it goes stale).
    fn of(target: &Target, path: &str, query: &str, body: &[u8]) -> Option<Self> {
        #[derive(serde::Deserialize, Default)]
        struct Items {
            #[serde(default)]
            items: Vec<Item>,
            #[serde(default)]
            metadata: ObjectMeta,
        }
        #[derive(serde::Deserialize)]
        struct Item {
            metadata: ObjectMeta,
        }
        let parsed: Items = serde_json::from_slice(body).ok()?;
        let metas: Vec<ObjectMeta> = match target.list {
            true => parsed.items.into_iter().map(|i| i.metadata).collect(),
            false => vec![parsed.metadata]
                .into_iter()
                .filter(|m| m.name.is_some())
                .collect(),
        };
        let versions = (metas.into_iter())
            .filter_map(|m| Some((m.name?, m.resource_version.unwrap_or_default())))
            .collect();
        let mut shows = Self {
            versions,
            ..Self::default()
        };
        if !target.list {
            shows.object = path.rsplit('/').next().map(str::to_string);
            return Some(shows);
        }
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            match key.as_ref() {
                "labelSelector" => shows.labels = label_terms(&value),
                "fieldSelector" => shows.field_name = field_name(&value),
                _ => {}
            }
        }
        Some(shows)
    }

    /// Whether `change` may make this answer stale: a new version or the deletion of an object
    /// it shows, or a new one that it would show (by its name, or by its selector).
    fn changed_by(&self, change: &Change) -> bool {
        let Some(name) = &change.name else {
            return true;
        };
        if let Some(version) = self.versions.get(name) {
            return change.deleted || change.version.as_ref() != Some(version);
        }
        if let Some(object) = &self.object {
            return object == name;
        }
        if change.deleted || self.field_name.as_ref().is_some_and(|n| n != name) {
            return false;
        }
        (self.labels.iter()).all(|(key, value)| match value {
            Some(value) => change.labels.get(key) == Some(value),
            None => true,
        })
    }
}

/// The terms of a label selector, `key=value` (or `key==value`) read; any other term kept as
/// matching anything.
fn label_terms(selector: &str) -> Vec<(String, Option<String>)> {
    if selector.contains('(') {
        // Set-based terms (`in`, `notin`) hold commas of their own: nothing is read.
        return Vec::new();
    }
    (selector.split(',').map(str::trim).filter(|t| !t.is_empty()))
        .map(|term| match term.split_once('=') {
            Some((key, value)) if !key.ends_with('!') => (
                key.trim().to_string(),
                Some(value.trim_start_matches('=').trim().to_string()),
            ),
            _ => (term.to_string(), None),
        })
        .collect()
}

/// The name a field selector asks for (`metadata.name=NAME`), if that is all it asks.
fn field_name(selector: &str) -> Option<String> {
    let (field, name) = selector.split_once('=')?;
    (field == "metadata.name" && !selector.contains(','))
        .then(|| name.trim_start_matches('=').to_string())
}

/// See the module doc.
#[derive(Debug)]
pub struct ReadCache {
    max_age: Duration,
    inner: Mutex<Inner>,
}

/// How many changes of one kind in one namespace are remembered for the reads in flight; a
/// read that began before the oldest is not kept.
const RECENT_CHANGES: usize = 64;

#[derive(Debug, Default)]
struct Inner {
    /// The changes counted so far, of every kind.
    counted: u64,
    /// For each kind and namespace read lately: its last changes (see [`Recent`]).
    recent: HashMap<Watched, HashMap<String, Recent>>,
    /// For each kind: how many times its watch failed or listed anew.
    relists: HashMap<Watched, u64>,
    /// The kinds whose watch failed and has reported nothing since.
    down: BTreeSet<Watched>,
    /// The answers kept, by the read's path and query.
    kept: HashMap<String, KeptRead>,
}

#[derive(Debug)]
struct KeptRead {
    answer: Answer,
    kind: Watched,
    namespace: String,
    shows: Shows,
    /// The count of relists of its kind when it was read.
    relists: u64,
}

/// The last changes of one kind in one namespace, for the reads in flight.
#[derive(Debug)]
struct Recent {
    /// The last [`RECENT_CHANGES`] changes, each with its count ([`Inner::counted`]).
    changes: VecDeque<(u64, Change)>,
    /// The count of the last change forgotten (0: none).
    forgotten: u64,
    /// When this kind was last read in this namespace (one not read for a while is forgotten).
    read: Instant,
}

/// A read in progress: the counts when it began.
#[derive(Debug, Clone, Copy)]
struct Begun {
    counted: u64,
    relists: u64,
}

impl Inner {
    fn relists(&self, kind: Watched) -> u64 {
        self.relists.get(&kind).copied().unwrap_or_default()
    }
}

impl Default for ReadCache {
    fn default() -> Self {
        Self::new(super::KEPT_MAX_AGE)
    }
}

impl ReadCache {
    pub fn new(max_age: Duration) -> Self {
        Self {
            max_age,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A change of an object of `kind` in `namespace` (a watch event, or our own write): the
    /// answers it may make stale go.
    pub fn changed(&self, kind: Watched, namespace: &str, change: Change) {
        self.changed_as(kind, namespace, || change)
    }

    /// [`ReadCache::changed`], with the change made only for a kind and namespace read lately:
    /// the watches report every object in scope, and most are of no namespace read.
    fn changed_as(&self, kind: Watched, namespace: &str, change: impl FnOnce() -> Change) {
        let mut inner = self.inner();
        let Inner {
            counted,
            recent,
            kept,
            ..
        } = &mut *inner;
        let Some(recent) = recent.get_mut(&kind).and_then(|r| r.get_mut(namespace)) else {
            return;
        };
        let change = change();
        let before = kept.len();
        kept.retain(|_, k| {
            k.kind != kind || k.namespace != namespace || !k.shows.changed_by(&change)
        });
        if kept.len() < before {
            tracing::trace!(?kind, name = ?change.name, version = ?change.version, deleted = change.deleted, voided = before - kept.len(), "kept reads voided");
        }
        *counted += 1;
        recent.changes.push_back((*counted, change));
        if recent.changes.len() > RECENT_CHANGES
            && let Some((count, _)) = recent.changes.pop_front()
        {
            recent.forgotten = count;
        }
    }

    /// The watch of `kind` lists anew: changes may have gone unseen.
    pub fn relisted(&self, kind: Watched) {
        let mut inner = self.inner();
        *inner.relists.entry(kind).or_default() += 1;
        inner.down.remove(&kind);
    }

    /// The watch of `kind` failed: changes may have gone unseen, and until it reports again
    /// none would be seen.
    fn failed(&self, kind: Watched) {
        let mut inner = self.inner();
        *inner.relists.entry(kind).or_default() += 1;
        inner.down.insert(kind);
    }

    /// What the watch of `kind` reports: each object's change, and its failures and new lists.
    pub fn saw<K: kube::Resource>(
        &self,
        kind: Watched,
        event: &Result<watcher::Event<K>, watcher::Error>,
    ) {
        let (obj, deleted) = match event {
            Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) => (obj, false),
            Ok(watcher::Event::Delete(obj)) => (obj, true),
            Ok(watcher::Event::Init | watcher::Event::InitDone) => return self.relisted(kind),
            Err(_) => return self.failed(kind),
        };
        self.inner().down.remove(&kind);
        let namespace = obj.meta().namespace.as_deref().unwrap_or_default();
        self.changed_as(kind, namespace, || Change::of(obj.meta(), deleted));
    }

    /// The answer kept for the read `key`, or why there is none to use.
    fn kept(&self, key: &str) -> Result<Answer, Miss> {
        let inner = self.inner();
        let kept = inner.kept.get(key).ok_or(Miss::NoneKept)?;
        if inner.down.contains(&kept.kind) {
            Err(Miss::WatchDown)
        } else if kept.answer.read.elapsed() >= self.max_age {
            Err(Miss::TooOld)
        } else if kept.relists != inner.relists(kept.kind) {
            Err(Miss::Relisted)
        } else {
            Ok(kept.answer.clone())
        }
    }

    /// Before a read of `target`.
    fn begin(&self, target: &Target) -> Begun {
        let mut inner = self.inner();
        let now = Instant::now();
        let (max_age, forget) = (self.max_age, self.max_age * 6);
        for namespaces in inner.recent.values_mut() {
            namespaces.retain(|_, r| now - r.read < forget);
        }
        inner.kept.retain(|_, k| k.answer.read.elapsed() < max_age);
        let namespaces = inner.recent.entry(target.kind).or_default();
        let recent = (namespaces.entry(target.namespace.clone())).or_insert_with(|| Recent {
            changes: VecDeque::new(),
            forgotten: 0,
            read: now,
        });
        recent.read = now;
        Begun {
            counted: inner.counted,
            relists: inner.relists(target.kind),
        }
    }

    /// After the read `key` of `target` begun at `begun`: kept, unless a change since may have
    /// made it stale (or one may have gone unseen).
    fn keep(&self, key: String, target: &Target, begun: Begun, answer: Answer, shows: Shows) {
        let mut inner = self.inner();
        let recent = (inner.recent.get(&target.kind)).and_then(|r| r.get(&target.namespace));
        let missed = recent.is_none_or(|r| r.forgotten > begun.counted);
        let stale = recent.is_some_and(|r| {
            (r.changes.iter()).any(|(n, change)| *n > begun.counted && shows.changed_by(change))
        });
        let down = inner.down.contains(&target.kind);
        if missed || stale || down || inner.relists(target.kind) != begun.relists {
            inner.kept.remove(&key);
            return;
        }
        let kept = KeptRead {
            answer,
            kind: target.kind,
            namespace: target.namespace.clone(),
            shows,
            relists: begun.relists,
        };
        inner.kept.insert(key, kept);
    }

    /// How many answers are kept, of `kind` in `namespace`.
    #[cfg(test)]
    fn len_of(&self, kind: Watched, namespace: &str) -> usize {
        let inner = self.inner();
        (inner.kept.values())
            .filter(|k| k.kind == kind && k.namespace == namespace)
            .count()
    }

    /// A client that sends its requests through `inner`: the reads of watched kinds answered
    /// from what is kept ([`Use::Kept`]) or read now, and kept; every write of a watched kind
    /// a change, once answered.
    pub fn client(self: &Arc<Self>, inner: Client, reads: Use) -> Client {
        let default_namespace = inner.default_namespace().to_string();
        let cache = self.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let (cache, inner, reads) = (cache.clone(), inner.clone(), reads.clone());
            async move { cache.answer(&inner, &reads, request).await }
        });
        Client::new(service, default_namespace)
    }

    async fn answer(
        &self,
        inner: &Client,
        reads: &Use,
        request: Request<Body>,
    ) -> Result<Response<Body>, kube::Error> {
        let Some(target) = target(request.uri().path()) else {
            return inner.send(request).await;
        };
        if request.method() != Method::GET {
            return self.write(inner, &target, request).await;
        }
        let Some(key) = replayable_read(&request).filter(|_| !target.subresource) else {
            return inner.send(request).await;
        };
        let miss = match reads.keeps(target.kind) {
            true => match self.kept(&key) {
                Ok(answer) => {
                    tracing::trace!(read = %key, "answered from the read cache");
                    return Ok(answer.response());
                }
                Err(miss) => miss,
            },
            false => Miss::ReadNow,
        };
        tracing::trace!(read = %key, ?miss, "read now");
        let (path, query) = (request.uri().path().to_string(), request.uri().query());
        let query = query.unwrap_or_default().to_string();
        let begun = self.begin(&target);
        let response = inner.send(request).await?;
        if !matches!(response.status(), StatusCode::OK | StatusCode::NOT_FOUND) {
            return Ok(response);
        }
        let (answer, response) = Answer::collect(response).await?;
        if keepable(&target, &query, &answer)
            && let Some(shows) = Shows::of(&target, &path, &query, &answer.body)
        {
            self.keep(key, &target, begun, answer, shows);
        }
        Ok(response)
    }

    /// Our own write of `target`: sent, then counted as the change its answer says it made.
    /// The object a create, patch or replace answers with is what a read of it would answer
    /// now: it is kept as that read's answer ([`written_object`]).
    async fn write(
        &self,
        inner: &Client,
        target: &Target,
        request: Request<Body>,
    ) -> Result<Response<Body>, kube::Error> {
        let (method, path) = (request.method().clone(), request.uri().path().to_string());
        let deleted = method == Method::DELETE;
        let named = (!target.list).then(|| path.rsplit('/').nth(usize::from(target.subresource)));
        let name = named.flatten().map(str::to_string);
        let begun = self.begin(target);
        let response = inner.send(request).await;
        let response = match response {
            Ok(response) if response.status().is_success() => response,
            // Refused or failed: it may still have been carried out.
            _ => {
                self.changed(target.kind, &target.namespace, Change::default());
                return response;
            }
        };
        let (answer, response) = Answer::collect(response).await?;
        let change = Change::of_answer(name.as_deref(), &answer.body, deleted);
        let written = written_object(target, &method, &path, &change);
        self.changed(target.kind, &target.namespace, change);
        if let Some((key, object)) = written.filter(|(_, o)| keepable(o, "", &answer))
            && let Some(shows) = Shows::of(&object, &key, "", &answer.body)
        {
            self.keep(key, &object, begun, answer, shows);
        }
        Ok(response)
    }
}

/// The read a write's answer is the answer of, with its target: the object created (`POST` to
/// its collection), patched or replaced (not a subresource: its answer may not be the object as
/// a read returns it). None for any other write, and for one whose answer names no object.
fn written_object(
    target: &Target,
    method: &Method,
    path: &str,
    change: &Change,
) -> Option<(String, Target)> {
    let name = change.name.as_ref().filter(|_| !change.deleted)?;
    let key = match *method {
        Method::POST if target.list => format!("{path}/{name}"),
        Method::PATCH | Method::PUT if !target.list && !target.subresource => path.to_string(),
        _ => return None,
    };
    let object = Target {
        list: false,
        ..target.clone()
    };
    Some((key, object))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    use kube::api::{Api, ListParams, Patch, PatchParams};
    use kube::core::PartialObjectMeta;
    use serde_json::{Value, json};

    use super::*;

    const PODS: &str = "/api/v1/namespaces/demo/pods";

    /// A client whose API server answers every request with `status` and `body`, counting them.
    fn server(status: u16, body: Value) -> (Client, Arc<AtomicUsize>) {
        let sent = Arc::new(AtomicUsize::new(0));
        let counted = sent.clone();
        let service = tower::service_fn(move |_request: Request<Body>| {
            counted.fetch_add(1, Ordering::SeqCst);
            let body = serde_json::to_vec(&body).unwrap_or_default();
            let mut response = Response::new(Body::from(body));
            *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            async move { Ok::<_, std::convert::Infallible>(response) }
        });
        (Client::new(service, "default"), sent)
    }

    /// A pod's metadata: `name` at `version`, labelled `app: APP`.
    fn pod(name: &str, version: &str, app: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "demo", "resourceVersion": version,
            "labels": {"app": app}}})
    }

    fn pod_list(items: Vec<Value>) -> Value {
        json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
    }

    async fn list_pods(client: &Client, ns: &str) {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        pods.list(&ListParams::default().labels("app=etcd"))
            .await
            .unwrap();
    }

    /// A change of pod `name` to `version`, labelled `app: APP`.
    fn change(name: &str, version: &str, app: &str) -> Change {
        Change {
            name: Some(name.into()),
            version: Some(version.into()),
            labels: BTreeMap::from([("app".to_string(), app.to_string())]),
            deleted: false,
        }
    }

    fn sent(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::SeqCst)
    }

    #[test]
    fn paths_of_watched_kinds_are_told_apart() {
        let of = |path: &str| target(path).map(|t| (t.kind, t.namespace, t.list, t.subresource));
        let demo = || "demo".to_string();
        assert_eq!(of(PODS), Some((Watched::Pods, demo(), true, false)));
        assert_eq!(
            of("/api/v1/namespaces/demo/pods/etcd-0/log"),
            Some((Watched::Pods, demo(), false, true))
        );
        assert_eq!(
            of("/api/v1/namespaces/demo/persistentvolumeclaims/data-etcd-0"),
            Some((Watched::Claims, demo(), false, false))
        );
        assert_eq!(
            of("/apis/batch/v1/namespaces/demo/jobs"),
            Some((Watched::Jobs, demo(), true, false))
        );
        assert_eq!(
            of("/apis/apps/v1/namespaces/demo/statefulsets/etcd"),
            Some((Watched::StatefulSets, demo(), false, false))
        );
        assert_eq!(
            of("/api/v1/namespaces/demo/configmaps/move-stash"),
            Some((Watched::ConfigMaps, demo(), false, false))
        );
        assert_eq!(
            of("/apis/policy/v1/namespaces/demo/poddisruptionbudgets"),
            Some((Watched::Budgets, demo(), true, false))
        );
        assert_eq!(
            of("/apis/storage.k8s.io/v1/storageclasses"),
            Some((Watched::StorageClasses, String::new(), true, false))
        );
        for unwatched in [
            "/api/v1/persistentvolumes/pv-1",
            "/api/v1/namespaces/demo/events",
            "/api/v1/namespaces/demo/secrets/tls",
            "/apis/apps/v1/namespaces/demo/deployments/web",
            "/apis/storage.k8s.io/v1/volumeattachments",
            "/apis/policy/v1/poddisruptionbudgets",
            "/api/v1/namespaces/demo",
        ] {
            assert_eq!(of(unwatched), None, "{unwatched}");
        }
    }

    #[test]
    fn a_kind_watched_by_our_label_is_kept_only_for_what_the_watch_sees() {
        let answer = |status: StatusCode, body: Value| Answer {
            status,
            headers: http::HeaderMap::new(),
            body: serde_json::to_vec(&body).unwrap_or_default().into(),
            read: Instant::now(),
        };
        let (jobs, stash, set) = (
            target("/apis/batch/v1/namespaces/demo/jobs").unwrap(),
            target("/api/v1/namespaces/demo/configmaps/move-stash").unwrap(),
            target("/apis/apps/v1/namespaces/demo/statefulsets/etcd").unwrap(),
        );
        let ok = answer(StatusCode::OK, pod_list(Vec::new()));
        let ours = form_urlencoded::Serializer::new(String::new())
            .append_pair("labelSelector", &crate::labels::owned_selector("move"))
            .finish();
        assert!(keepable(&jobs, &ours, &ok));
        let theirs = "labelSelector=storagemigrator.io%2Frequest%3Dmove";
        assert!(
            !keepable(&jobs, theirs, &ok),
            "a Job without our label is not watched"
        );
        let labelled = json!({"metadata": {"labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}}});
        assert!(keepable(&stash, "", &answer(StatusCode::OK, labelled)));
        let unlabelled = json!({"metadata": {"labels": {"app": "x"}}});
        assert!(!keepable(&stash, "", &answer(StatusCode::OK, unlabelled)));
        let missing = answer(StatusCode::NOT_FOUND, json!({}));
        assert!(
            !keepable(&stash, "", &missing),
            "one made without our label is not seen"
        );
        assert!(keepable(&set, "", &missing), "sets are watched in full");
        assert!(!keepable(
            &set,
            "",
            &answer(StatusCode::FORBIDDEN, json!({}))
        ));
    }

    /// A list is stale after a new version or the deletion of an object it shows, or a new
    /// object its selector takes; not after the version it shows (the echo of a write it
    /// already shows), another object's deletion, or an object its selector leaves out.
    #[test]
    fn a_list_is_stale_only_after_a_change_it_does_not_show() {
        let target = target(PODS).unwrap();
        let query = "&labelSelector=app%3Detcd";
        let body = serde_json::to_vec(&pod_list(vec![pod("etcd-0", "5", "etcd")])).unwrap();
        let shows = Shows::of(&target, PODS, query, &body).unwrap();
        assert!(
            !shows.changed_by(&change("etcd-0", "5", "etcd")),
            "the version shown"
        );
        assert!(shows.changed_by(&change("etcd-0", "6", "etcd")));
        assert!(
            shows.changed_by(&change("etcd-0", "6", "other")),
            "left the selector"
        );
        assert!(shows.changed_by(&Change {
            deleted: true,
            ..change("etcd-0", "5", "etcd")
        }));
        assert!(
            shows.changed_by(&change("etcd-1", "7", "etcd")),
            "a new one it selects"
        );
        assert!(
            !shows.changed_by(&change("move-0", "8", "other")),
            "one it leaves out"
        );
        assert!(!shows.changed_by(&Change {
            deleted: true,
            ..change("etcd-1", "7", "etcd")
        }));
        assert!(shows.changed_by(&Change::default()), "an unknown change");
        let by_name = Shows::of(
            &target,
            PODS,
            "&fieldSelector=metadata.name%3Detcd-0",
            &body,
        )
        .unwrap();
        assert!(!by_name.changed_by(&change("etcd-1", "7", "etcd")));
        let set_based = Shows::of(&target, PODS, "&labelSelector=app+in+%28a%2Cb%29", &body);
        let set_based = set_based.unwrap();
        assert!(
            set_based.changed_by(&change("x", "1", "c")),
            "not read: may match"
        );
        let object = Shows::of(
            &target_of("/configmaps/s"),
            "/api/v1/namespaces/demo/configmaps/s",
            "",
            b"{}",
        )
        .unwrap();
        assert!(
            Shows::of(&target, PODS, query, b"not json").is_none(),
            "an answer that shows nothing readable is not kept"
        );
        assert!(
            object.changed_by(&change("s", "1", "")),
            "the object it did not find"
        );
        assert!(!object.changed_by(&change("t", "1", "")));
    }

    fn target_of(path: &str) -> Target {
        target(&format!("/api/v1/namespaces/demo{path}")).unwrap()
    }

    #[tokio::test]
    async fn a_read_is_kept_until_a_change_may_make_it_stale() {
        let (plain, counter) = server(200, pod_list(vec![pod("etcd-0", "5", "etcd")]));
        let cache = Arc::new(ReadCache::default());
        let kept = cache.client(plain.clone(), Use::Kept);
        list_pods(&kept, "demo").await;
        list_pods(&kept, "demo").await;
        assert_eq!(sent(&counter), 1, "the second answered from the first");
        cache.changed(Watched::Pods, "other", Change::default());
        cache.changed(Watched::Claims, "demo", Change::default());
        cache.changed(Watched::Pods, "demo", change("etcd-0", "5", "etcd"));
        list_pods(&kept, "demo").await;
        assert_eq!(
            sent(&counter),
            1,
            "another namespace, another kind, the same version"
        );
        cache.changed(Watched::Pods, "demo", change("etcd-0", "6", "etcd"));
        list_pods(&kept, "demo").await;
        assert_eq!(sent(&counter), 2, "a pod it shows changed");
        cache.relisted(Watched::Pods);
        list_pods(&kept, "demo").await;
        assert_eq!(sent(&counter), 3, "the watch listed anew");
        list_pods(&cache.client(plain.clone(), Use::ReadNow), "demo").await;
        assert_eq!(sent(&counter), 4, "read now when asked");
        list_pods(&kept, "demo").await;
        assert_eq!(sent(&counter), 4, "and kept");
        let claims_now = Use::KeptBut(BTreeSet::from([Watched::Claims]));
        list_pods(&cache.client(plain.clone(), claims_now), "demo").await;
        assert_eq!(sent(&counter), 4, "another kind read now");
        let pods_now = Use::KeptBut(BTreeSet::from([Watched::Pods]));
        list_pods(&cache.client(plain, pods_now), "demo").await;
        assert_eq!(sent(&counter), 5, "its kind read now");
    }

    /// Our write of an object is a change (lists that show another version of it are stale),
    /// and its answer is the answer of the object's read until it changes again; the echo of
    /// the write by the watch changes nothing.
    #[tokio::test]
    async fn our_own_write_is_a_change_and_its_answer_is_kept() {
        let stash = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "move-stash", "namespace": "demo", "resourceVersion": "9",
            "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}}});
        let (plain, counter) = server(200, stash);
        let cache = Arc::new(ReadCache::default());
        let maps: Api<ConfigMap> =
            Api::namespaced(cache.client(plain.clone(), Use::ReadNow), "demo");
        let patch = Patch::Merge(json!({"data": {"a": "b"}}));
        maps.patch("move-stash", &PatchParams::default(), &patch)
            .await
            .unwrap();
        let kept: Api<ConfigMap> = Api::namespaced(cache.client(plain, Use::Kept), "demo");
        let read = kept.get("move-stash").await.unwrap();
        assert_eq!(read.metadata.resource_version.as_deref(), Some("9"));
        assert_eq!(sent(&counter), 1, "answered by the patch's answer");
        let echo = Change {
            name: Some("move-stash".into()),
            version: Some("9".into()),
            ..Change::default()
        };
        cache.changed(Watched::ConfigMaps, "demo", echo.clone());
        kept.get("move-stash").await.unwrap();
        assert_eq!(sent(&counter), 1, "the echo of our write");
        let edited = Change {
            version: Some("10".into()),
            ..echo
        };
        cache.changed(Watched::ConfigMaps, "demo", edited);
        kept.get("move-stash").await.unwrap();
        assert_eq!(sent(&counter), 2, "edited since");
    }

    #[tokio::test]
    async fn a_write_the_api_server_refused_voids_what_is_kept_of_its_kind() {
        let (plain, counter) = server(409, json!({"kind": "Status", "code": 409}));
        let cache = Arc::new(ReadCache::default());
        let (ok, _) = server(200, pod_list(Vec::new()));
        list_pods(&cache.client(ok, Use::Kept), "demo").await;
        assert_eq!(cache.len_of(Watched::Pods, "demo"), 1);
        let pods: Api<Pod> = Api::namespaced(cache.client(plain, Use::ReadNow), "demo");
        let deleted = pods.delete("etcd-0", &Default::default()).await;
        assert!(deleted.is_err());
        assert_eq!(sent(&counter), 1);
        assert_eq!(
            cache.len_of(Watched::Pods, "demo"),
            0,
            "it may have been carried out"
        );
    }

    #[tokio::test]
    async fn a_read_during_which_what_it_shows_changed_is_not_kept() {
        let cache = Arc::new(ReadCache::default());
        let racing = cache.clone();
        let counter = Arc::new(AtomicUsize::new(0));
        let counted = counter.clone();
        // The change comes while the API server answers.
        let service = tower::service_fn(move |_request: Request<Body>| {
            counted.fetch_add(1, Ordering::SeqCst);
            racing.changed(Watched::Pods, "demo", change("etcd-0", "6", "etcd"));
            let body = serde_json::to_vec(&pod_list(vec![pod("etcd-0", "5", "etcd")]));
            let body = body.unwrap_or_default();
            async move { Ok::<_, std::convert::Infallible>(Response::new(Body::from(body))) }
        });
        let kept = cache.client(Client::new(service, "default"), Use::Kept);
        list_pods(&kept, "demo").await;
        assert_eq!(cache.len_of(Watched::Pods, "demo"), 0);
        list_pods(&kept, "demo").await;
        assert_eq!(sent(&counter), 2);
    }

    #[tokio::test]
    async fn a_read_that_began_before_the_changes_remembered_is_not_kept() {
        let cache = Arc::new(ReadCache::default());
        let racing = cache.clone();
        // More changes while the API server answers than are remembered, none of an object
        // the answer shows: the first ones are forgotten, so the read is not kept.
        let service = tower::service_fn(move |_request: Request<Body>| {
            for n in 0..=RECENT_CHANGES {
                racing.changed(Watched::Pods, "demo", change(&format!("x-{n}"), "1", "x"));
            }
            let body = serde_json::to_vec(&pod_list(Vec::new())).unwrap_or_default();
            async move { Ok::<_, std::convert::Infallible>(Response::new(Body::from(body))) }
        });
        list_pods(
            &cache.client(Client::new(service, "default"), Use::Kept),
            "demo",
        )
        .await;
        assert_eq!(cache.len_of(Watched::Pods, "demo"), 0);
    }

    #[tokio::test]
    async fn a_kept_answer_older_than_the_max_age_is_read_again() {
        let (plain, counter) = server(200, pod_list(Vec::new()));
        let cache = Arc::new(ReadCache::new(Duration::from_millis(20)));
        let kept = cache.client(plain, Use::Kept);
        list_pods(&kept, "demo").await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        list_pods(&kept, "demo").await;
        assert_eq!(sent(&counter), 2);
    }

    #[tokio::test]
    async fn watch_events_and_failures_void_what_they_may_change() {
        let (plain, counter) = server(200, pod_list(vec![pod("etcd-0", "5", "etcd")]));
        let cache = Arc::new(ReadCache::default());
        let kept = cache.client(plain, Use::Kept);
        list_pods(&kept, "demo").await;
        let meta = |ns: &str, name: &str| {
            let mut pod = PartialObjectMeta::<Pod>::default();
            pod.metadata.namespace = Some(ns.to_string());
            pod.metadata.name = Some(name.to_string());
            pod
        };
        cache.saw(
            Watched::Pods,
            &Ok(watcher::Event::Apply(meta("other", "etcd-0"))),
        );
        cache.saw(
            Watched::Pods,
            &Ok(watcher::Event::Delete(meta("demo", "gone"))),
        );
        assert_eq!(cache.len_of(Watched::Pods, "demo"), 1);
        cache.saw(
            Watched::Pods,
            &Ok(watcher::Event::Delete(meta("demo", "etcd-0"))),
        );
        assert_eq!(cache.len_of(Watched::Pods, "demo"), 0);
        list_pods(&kept, "demo").await;
        cache.saw::<PartialObjectMeta<Pod>>(Watched::Pods, &Err(watcher::Error::NoResourceVersion));
        list_pods(&kept, "demo").await;
        assert_eq!(sent(&counter), 3);
    }

    /// A watch that failed sees no change until it is back: every read of its kind meanwhile
    /// goes to the API server and none is kept (the Job that ends while the watch of Jobs is
    /// down must not be answered as still running), whatever the kept reads' age.
    #[tokio::test]
    async fn nothing_is_kept_while_the_watch_of_its_kind_is_down() {
        let (plain, counter) = server(200, pod_list(vec![pod("etcd-0", "5", "etcd")]));
        let cache = Arc::new(ReadCache::default());
        let kept = cache.client(plain, Use::Kept);
        let failed: Result<watcher::Event<PartialObjectMeta<Pod>>, _> =
            Err(watcher::Error::NoResourceVersion);
        cache.saw(Watched::Pods, &failed);
        for _ in 0..3 {
            list_pods(&kept, "demo").await;
        }
        assert_eq!(sent(&counter), 3, "read through while the watch is down");
        assert_eq!(cache.len_of(Watched::Pods, "demo"), 0);
        // Another kind's watch is not concerned.
        assert!(!cache.inner().down.contains(&Watched::Jobs));
        // Back: its first event (here, of an object no read showed).
        let mut other = PartialObjectMeta::<Pod>::default();
        other.metadata.namespace = Some("elsewhere".into());
        other.metadata.name = Some("web-0".into());
        cache.saw(Watched::Pods, &Ok(watcher::Event::Apply(other)));
        list_pods(&kept, "demo").await;
        list_pods(&kept, "demo").await;
        assert_eq!(sent(&counter), 4, "kept again once the watch is back");
        // A failure again: what was kept is not used.
        cache.saw(Watched::Pods, &failed);
        list_pods(&kept, "demo").await;
        assert_eq!(sent(&counter), 5);
        // A new list brings it back too.
        cache.saw::<PartialObjectMeta<Pod>>(Watched::Pods, &Ok(watcher::Event::Init));
        list_pods(&kept, "demo").await;
        list_pods(&kept, "demo").await;
        assert_eq!(sent(&counter), 6);
    }
}
