//! Stashed manifests (the StatefulSet, each stopped member's pod): gzip + base64 JSON, kept in
//! the request's annotations while they fit, else in a ConfigMap.
//!
//! Why stash at all: between the orphan delete of the set and its recreation, and between a
//! member pod's deletion and its recreation, the stash is the only copy of those manifests. It
//! lives in the cluster (not in the operator's memory) so that a restarted operator, or a human,
//! can recreate them.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::StorageMigrationRequest;
use crate::labels;

use super::{BuildError, req_name, stash_config_map_name};

/// Budget for the request's annotations, stash included: 200 KiB, well under the API server's
/// 256 KiB limit on an object's annotations (keys plus values), leaving room for
/// `kubectl.kubernetes.io/last-applied-configuration` and other tools' annotations.
pub const STASH_ANNOTATION_BUDGET: usize = 200 * 1024;

/// Largest decoded stash accepted (a StatefulSet or pod is a few KiB; this only guards against a
/// corrupted or hostile annotation inflating without bound).
const MAX_DECODED: u64 = 16 * 1024 * 1024;

/// `obj` as base64 of gzipped JSON.
///
/// Why compressed: a pod or StatefulSet manifest is 3 to 20 KiB of JSON; gzipped it is about a
/// fifth, so a set and several pods fit in the annotation budget.
pub fn stash_encode<T: Serialize>(obj: &T) -> Result<String, BuildError> {
    let json = serde_json::to_vec(obj).map_err(|e| BuildError::StashEncode(e.to_string()))?;
    let mut gz = GzEncoder::new(Vec::new(), Compression::best());
    gz.write_all(&json)
        .map_err(|e| BuildError::StashEncode(e.to_string()))?;
    let bytes = gz
        .finish()
        .map_err(|e| BuildError::StashEncode(e.to_string()))?;
    Ok(STANDARD.encode(bytes))
}

/// Reads back what [`stash_encode`] wrote.
pub fn stash_decode<T: DeserializeOwned>(encoded: &str) -> Result<T, BuildError> {
    let bytes = STANDARD
        .decode(encoded.trim())
        .map_err(|e| BuildError::StashDecode(format!("base64: {e}")))?;
    let mut json = Vec::new();
    GzDecoder::new(bytes.as_slice())
        .take(MAX_DECODED + 1)
        .read_to_end(&mut json)
        .map_err(|e| BuildError::StashDecode(format!("gzip: {e}")))?;
    if json.len() as u64 > MAX_DECODED {
        return Err(BuildError::StashDecode(format!(
            "decoded stash exceeds {MAX_DECODED} bytes"
        )));
    }
    serde_json::from_slice(&json).map_err(|e| BuildError::StashDecode(format!("json: {e}")))
}

/// Size of annotations as the API server counts it against its limit: keys plus values.
pub fn annotations_size(annotations: &BTreeMap<String, String>) -> usize {
    annotations.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// Whether the request's annotations (`current`), with `additions` set (added or replacing the
/// same keys), stay within [`STASH_ANNOTATION_BUDGET`].
///
/// Why: an update that pushes an object's annotations over 256 KiB is refused; a StatefulSet
/// with a large template and many members' pods can get there. When this is false the stash goes
/// to the ConfigMap of [`stash_config_map`] instead.
pub fn stash_fits_in_annotations<K, V>(
    current: &BTreeMap<String, String>,
    additions: impl IntoIterator<Item = (K, V)>,
) -> bool
where
    K: AsRef<str>,
    V: AsRef<str>,
{
    let mut size = annotations_size(current);
    for (k, v) in additions {
        let (k, v) = (k.as_ref(), v.as_ref());
        if let Some(old) = current.get(k) {
            size -= k.len() + old.len();
        }
        size += k.len() + v.len();
    }
    size <= STASH_ANNOTATION_BUDGET
}

/// The key under which the ConfigMap stash keeps the value of stash annotation `annotation`: its
/// name part (`stash-statefulset`, `stash-pod-<pod>`), which is a valid ConfigMap key.
pub fn stash_config_map_key(annotation: &str) -> &str {
    annotation
        .strip_prefix(&format!("{}/", labels::GROUP))
        .unwrap_or(annotation)
}

/// The ConfigMap `<req>-stash` holding `entries` (annotation key → encoded value; stored under
/// [`stash_config_map_key`]), labelled [`labels::owned_labels`].
///
/// Why no ownerReference: if the request is deleted mid-flight, the stash is the only copy of
/// stopped pods' manifests and of the orphan-deleted StatefulSet; it must survive for a human to
/// recreate them. The operator deletes it at the end of the request.
pub fn stash_config_map(
    req: &StorageMigrationRequest,
    entries: &BTreeMap<String, String>,
) -> ConfigMap {
    let name = req_name(req);
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(stash_config_map_name(&name)),
            namespace: req.namespace(),
            labels: Some(labels::owned_labels(&name)),
            ..Default::default()
        },
        data: Some(
            entries
                .iter()
                .map(|(k, v)| (stash_config_map_key(k).to_string(), v.clone()))
                .collect(),
        ),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::{Manifest, stash_pod_annotation, testdata};
    use crate::labels::STASH_STATEFULSET_ANNOTATION;
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

    #[test]
    fn round_trip_statefulset_and_pod() {
        // What is stashed is the raw JSON as the API server returned it.
        let sts = testdata::statefulset_manifest();
        let encoded = stash_encode(&sts).unwrap();
        let decoded: Manifest<StatefulSet> = stash_decode(&encoded).unwrap();
        assert_eq!(decoded.raw(), sts.raw());
        assert_eq!(decoded.typed(), sts.typed());
        let pod = testdata::pod_manifest();
        let decoded: Manifest<Pod> = stash_decode(&stash_encode(&pod).unwrap()).unwrap();
        assert_eq!(decoded.raw(), pod.raw());
        // A typed object still round-trips (stashed claims are typed).
        let claim = testdata::claim();
        let decoded: PersistentVolumeClaim = stash_decode(&stash_encode(&claim).unwrap()).unwrap();
        assert_eq!(decoded, claim);
        // Compressed well below the JSON size.
        let json_len = serde_json::to_vec(&sts).unwrap().len();
        assert!(encoded.len() < json_len, "{} >= {json_len}", encoded.len());
    }

    #[test]
    fn encoding_is_deterministic() {
        let sts = testdata::statefulset_manifest();
        assert_eq!(stash_encode(&sts).unwrap(), stash_encode(&sts).unwrap());
    }

    #[test]
    fn decode_rejects_garbage() {
        for bad in [
            "",
            "not base64!",
            "aGVsbG8=",
            &STANDARD.encode(b"\x1f\x8bgarbage"),
        ] {
            let r: Result<Pod, _> = stash_decode(bad);
            assert!(matches!(r, Err(BuildError::StashDecode(_))), "{bad:?}");
        }
        // Valid gzip+base64, but not a pod.
        let r: Result<Pod, _> = stash_decode(&stash_encode(&"a string").unwrap());
        assert!(matches!(r, Err(BuildError::StashDecode(_))));
        let r: Result<Manifest<Pod>, _> = stash_decode(&stash_encode(&"a string").unwrap());
        assert!(matches!(r, Err(BuildError::StashDecode(_))));
        // A StatefulSet is not a pod.
        let sts = stash_encode(&testdata::statefulset_manifest()).unwrap();
        let r: Result<Manifest<Pod>, _> = stash_decode(&sts);
        assert!(matches!(r, Err(BuildError::StashDecode(_))));
    }

    #[test]
    fn decode_refuses_a_gzip_bomb() {
        let zeros = vec![b' '; (MAX_DECODED + 10) as usize];
        let mut gz = GzEncoder::new(Vec::new(), Compression::best());
        gz.write_all(&zeros).unwrap();
        let encoded = STANDARD.encode(gz.finish().unwrap());
        let r: Result<serde_json::Value, _> = stash_decode(&encoded);
        assert!(matches!(r, Err(BuildError::StashDecode(m)) if m.contains("exceeds")));
    }

    #[test]
    fn budget() {
        let mut current = BTreeMap::from([("a".to_string(), "x".repeat(100))]);
        assert_eq!(annotations_size(&current), 101);
        let empty: [(&str, &str); 0] = [];
        assert!(stash_fits_in_annotations(&current, empty));
        let big = "y".repeat(STASH_ANNOTATION_BUDGET - 101 - 3);
        assert!(stash_fits_in_annotations(&current, [("key", big.as_str())]));
        assert!(!stash_fits_in_annotations(
            &current,
            [("key2", big.as_str())]
        ));
        // Replacing a key counts the new value only.
        current.insert("key".to_string(), big.clone());
        assert!(stash_fits_in_annotations(&current, [("key", big.as_str())]));
        assert!(!stash_fits_in_annotations(&current, [("b", "z")]));
    }

    #[test]
    fn realistic_stash_fits() {
        let sts = stash_encode(&testdata::statefulset_manifest()).unwrap();
        let mut additions = vec![(STASH_STATEFULSET_ANNOTATION.to_string(), sts)];
        for i in 0..5 {
            let mut pod = testdata::pod_manifest().into_raw();
            pod["metadata"]["name"] = format!("etcd-{i}").into();
            additions.push((
                stash_pod_annotation(&format!("etcd-{i}")),
                stash_encode(&pod).unwrap(),
            ));
        }
        assert!(stash_fits_in_annotations(&BTreeMap::new(), additions));
    }

    #[test]
    fn config_map_stash() {
        let req = testdata::request();
        let entries = BTreeMap::from([
            (
                STASH_STATEFULSET_ANNOTATION.to_string(),
                "H4sI-sts".to_string(),
            ),
            (stash_pod_annotation("etcd-1"), "H4sI-pod".to_string()),
        ]);
        let cm = stash_config_map(&req, &entries);
        insta::assert_yaml_snapshot!(cm);
        assert!(cm.metadata.owner_references.is_none());
        assert_eq!(cm.metadata.name.as_deref(), Some("etcd-to-fast-stash"));
        let data = cm.data.unwrap();
        assert_eq!(data["stash-statefulset"], "H4sI-sts");
        assert_eq!(data["stash-pod-etcd-1"], "H4sI-pod");
    }
}
