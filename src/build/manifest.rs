//! [`Manifest`]: an object as the API server returned it (its raw JSON, every field kept) with
//! the typed view decoded from it.
//!
//! Why: the StatefulSet and the member pods are deleted and recreated from their stash. Going
//! through k8s-openapi's structs would silently drop every field they do not know (a PodSpec
//! field newer than the `v1_33` feature, a field of a container): the recreated set's
//! `spec.template` would then differ from the original, get a new revision hash, and the
//! StatefulSet controller would restart every member in a rolling update outside the migrator's
//! control, and the workload would lose a setting. So these objects are read, stashed, edited
//! and created as raw JSON; the typed view is only for reading fields.

use std::fmt;
use std::ops::Deref;

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::BuildError;

/// An object's raw JSON and its typed view (`K`), decoded from that JSON.
///
/// The raw JSON is what gets stashed ([`Serialize`] writes it, [`Deserialize`] reads it back)
/// and created; the typed view is reached through [`Deref`] and is read-only, so the two cannot
/// drift apart.
#[derive(Clone)]
pub struct Manifest<K> {
    raw: Value,
    typed: K,
}

impl<K> Manifest<K>
where
    K: k8s_openapi::Resource + DeserializeOwned,
{
    /// Wraps the JSON of an object of kind `K`, decoding its typed view.
    ///
    /// `apiVersion` and `kind` are added when absent (items of a list response lack them), so
    /// the raw JSON can be created as it is. Fails when the JSON is not an object of kind `K`.
    pub fn from_raw(mut raw: Value) -> Result<Self, BuildError> {
        let Value::Object(map) = &mut raw else {
            return Err(BuildError::Manifest {
                kind: K::KIND,
                reason: "not a JSON object".to_string(),
            });
        };
        map.entry("apiVersion")
            .or_insert_with(|| Value::from(K::API_VERSION));
        map.entry("kind").or_insert_with(|| Value::from(K::KIND));
        let typed = K::deserialize(&raw).map_err(|e| BuildError::Manifest {
            kind: K::KIND,
            reason: e.to_string(),
        })?;
        Ok(Self { raw, typed })
    }

    /// The same object with annotation `key` set to `value` in its raw JSON (every other field
    /// kept), e.g. the marker that tells the operator's own recreated objects from others.
    pub fn with_annotation(&self, key: &str, value: &str) -> Result<Self, BuildError> {
        let mut raw = self.raw.clone();
        let Some(obj) = raw.as_object_mut() else {
            return Err(BuildError::Manifest {
                kind: K::KIND,
                reason: "not a JSON object".to_string(),
            });
        };
        let meta = obj
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        let Some(meta) = meta.as_object_mut() else {
            return Err(BuildError::Manifest {
                kind: K::KIND,
                reason: "metadata is not an object".to_string(),
            });
        };
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(Map::new()));
        if !annotations.is_object() {
            *annotations = Value::Object(Map::new());
        }
        if let Some(a) = annotations.as_object_mut() {
            a.insert(key.to_string(), Value::from(value));
        }
        Self::from_raw(raw)
    }

    /// Wraps an object built by us (its JSON is exactly what the typed struct serializes to).
    pub fn from_typed(typed: K) -> Result<Self, BuildError>
    where
        K: Serialize,
    {
        let raw = serde_json::to_value(&typed).map_err(|e| BuildError::Manifest {
            kind: K::KIND,
            reason: e.to_string(),
        })?;
        Self::from_raw(raw)
    }
}

impl<K> Manifest<K> {
    /// The JSON as the API server returned it (or as a builder edited it).
    pub fn raw(&self) -> &Value {
        &self.raw
    }

    /// The typed view (also reachable through [`Deref`]).
    pub fn typed(&self) -> &K {
        &self.typed
    }

    pub fn into_raw(self) -> Value {
        self.raw
    }

    /// Test helper: edits the typed view and carries the change over to the raw JSON as a JSON
    /// merge patch (RFC 7386) computed between the typed view before and after, so fields the
    /// typed view does not know are kept (an edited array is replaced as a whole).
    #[cfg(test)]
    pub fn update(&mut self, edit: impl FnOnce(&mut K))
    where
        K: Serialize,
    {
        let before = serde_json::to_value(&self.typed).unwrap();
        edit(&mut self.typed);
        let after = serde_json::to_value(&self.typed).unwrap();
        apply_change(&mut self.raw, &before, &after);
    }
}

/// Applies to `raw` what changed from `before` to `after` (see [`Manifest::update`]).
#[cfg(test)]
fn apply_change(raw: &mut Value, before: &Value, after: &Value) {
    if before == after {
        return;
    }
    let (Value::Object(b), Value::Object(a), Value::Object(r)) = (before, after, &mut *raw) else {
        *raw = after.clone();
        return;
    };
    for k in b.keys().filter(|k| !a.contains_key(*k)) {
        r.remove(k);
    }
    for (k, av) in a {
        match (b.get(k), r.get_mut(k)) {
            (Some(bv), _) if bv == av => {}
            (Some(bv), Some(rv)) => apply_change(rv, bv, av),
            _ => {
                r.insert(k.clone(), av.clone());
            }
        }
    }
}

impl<K> Deref for Manifest<K> {
    type Target = K;
    fn deref(&self) -> &K {
        &self.typed
    }
}

/// Equal when the raw JSON is equal (the typed view is decoded from it).
impl<K> PartialEq for Manifest<K> {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl<K> fmt::Debug for Manifest<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Manifest").field(&self.raw).finish()
    }
}

/// Writes the raw JSON.
impl<K> Serialize for Manifest<K> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(s)
    }
}

/// Reads raw JSON and decodes the typed view ([`Manifest::from_raw`]).
impl<'de, K> Deserialize<'de> for Manifest<K>
where
    K: k8s_openapi::Resource + DeserializeOwned,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Value::deserialize(d)?;
        Self::from_raw(raw).map_err(D::Error::custom)
    }
}

/// The object at `key` of `map`, made an empty object first when absent or not an object.
pub(crate) fn object_at<'a>(
    map: &'a mut Map<String, Value>,
    key: &str,
) -> &'a mut Map<String, Value> {
    let v = map.entry(key).or_insert_with(|| Value::Object(Map::new()));
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    match v {
        Value::Object(m) => m,
        _ => unreachable!("made an object above"),
    }
}

/// Metadata fields that are the old object's server state: uid, resourceVersion (a create
/// carrying one is refused), creation time, managedFields, generation, deletion fields and the
/// legacy selfLink.
pub(crate) const SERVER_METADATA: [&str; 8] = [
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "managedFields",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
];

/// A copy of the object `raw` fit to be created again: without `status`, without the
/// [`SERVER_METADATA`] and the `also` metadata fields; every other field, known to k8s-openapi or
/// not, as it was.
pub(crate) fn for_create(raw: &Value, also: &[&str]) -> Map<String, Value> {
    let mut obj = raw.as_object().cloned().unwrap_or_default();
    obj.remove("status");
    if let Some(Value::Object(meta)) = obj.get_mut("metadata") {
        for key in SERVER_METADATA.iter().chain(also) {
            meta.remove(*key);
        }
    }
    obj
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    use super::*;
    use crate::build::testdata;

    #[test]
    fn from_raw_adds_the_type_of_list_items() {
        let item = json!({"metadata": {"name": "etcd-0"}, "spec": {"containers": []}});
        let pod: Manifest<Pod> = Manifest::from_raw(item).unwrap();
        assert_eq!(pod.raw()["apiVersion"], "v1");
        assert_eq!(pod.raw()["kind"], "Pod");
        assert_eq!(pod.metadata.name.as_deref(), Some("etcd-0"));
    }

    #[test]
    fn from_raw_refuses_another_kind_or_a_non_object() {
        let sts = testdata::statefulset_manifest().into_raw();
        let r: Result<Manifest<Pod>, _> = Manifest::from_raw(sts);
        assert!(
            matches!(r, Err(BuildError::Manifest { kind: "Pod", .. })),
            "{r:?}"
        );
        let r: Result<Manifest<Pod>, _> = Manifest::from_raw(json!([1]));
        assert!(matches!(r, Err(BuildError::Manifest { .. })));
    }

    #[test]
    fn typed_view_misses_unknown_fields_raw_keeps_them() {
        let live = testdata::with_future_fields(&testdata::pod_manifest(), "/spec");
        let typed_json = serde_json::to_value(live.typed()).unwrap();
        assert!(typed_json["spec"].get("someFutureField").is_none());
        assert_eq!(live.raw()["spec"]["someFutureField"], json!({"x": 1}));
        // Serialize writes the raw JSON; Deserialize reads it back whole.
        let text = serde_json::to_string(&live).unwrap();
        let back: Manifest<Pod> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, live);
        assert_eq!(back.typed(), live.typed());
    }

    #[test]
    fn update_carries_typed_edits_over_and_keeps_unknown_fields() {
        let mut live: Manifest<StatefulSet> =
            testdata::with_future_fields(&testdata::statefulset_manifest(), "/spec/template/spec");
        let template = live.raw()["spec"]["template"].clone();
        live.update(|s| {
            s.status = None;
            s.metadata.uid = Some("new".into());
            s.spec.as_mut().unwrap().replicas = Some(5);
        });
        assert!(live.raw().get("status").is_none());
        assert_eq!(live.raw()["metadata"]["uid"], "new");
        assert_eq!(live.raw()["spec"]["replicas"], 5);
        assert_eq!(live.raw()["spec"]["template"], template);
        assert_eq!(live.spec.as_ref().unwrap().replicas, Some(5));
    }

    #[test]
    fn for_create_drops_server_state_only() {
        let raw = json!({
            "apiVersion": "v1", "kind": "Pod", "future": 1,
            "metadata": {"name": "p", "uid": "u", "resourceVersion": "1", "labels": {"a": "b"},
                         "ownerReferences": [], "futureMeta": true},
            "spec": {"containers": []},
            "status": {"phase": "Running"},
        });
        let obj = for_create(&raw, &["ownerReferences"]);
        assert_eq!(
            Value::Object(obj),
            json!({
                "apiVersion": "v1", "kind": "Pod", "future": 1,
                "metadata": {"name": "p", "labels": {"a": "b"}, "futureMeta": true},
                "spec": {"containers": []},
            })
        );
    }
}
