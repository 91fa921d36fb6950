//! Stashed manifests (the StatefulSet, each stopped member's pod, each swapped claim): gzip +
//! base64 JSON, kept in the request's stash ConfigMap ([`stash_config_map`]).
//!
//! Why stash at all: between the orphan delete of the set and its recreation, and between a
//! member pod's deletion and its recreation, the stash is the only copy of those manifests. It
//! lives in the cluster (not in the operator's memory) so that a restarted operator, or a human,
//! can recreate them; and in an object of its own (not on the request) so that a `kubectl
//! replace` or `apply` of the request, which drops its annotations, or the request's deletion,
//! does not lose it.

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

/// Budget for the stash ConfigMap's data (keys plus values): 900 KiB, under the API server's
/// 1 MiB limit on a ConfigMap's data, leaving room for its metadata. A gzipped pod or StatefulSet
/// is typically 1 to 5 KiB, a claim under 1 KiB: the budget holds a set with a few hundred
/// members. A stash that would exceed it is refused before the destructive step it precedes
/// (see `plan::stash`).
pub const STASH_BUDGET: usize = 900 * 1024;

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

/// Size of a ConfigMap's data as the API server counts it against its limit: keys plus values.
pub fn data_size(data: &BTreeMap<String, String>) -> usize {
    data.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// Whether stash data of `current_size` (see [`data_size`]), with `key` set to `value` (added,
/// or replacing an entry of `replaced_size`: its key plus its value), stays within
/// [`STASH_BUDGET`].
pub fn stash_fits(
    current_size: usize,
    replaced_size: Option<usize>,
    key: &str,
    value: &str,
) -> bool {
    let without = current_size.saturating_sub(replaced_size.unwrap_or(0));
    without + key.len() + value.len() <= STASH_BUDGET
}

/// The empty stash ConfigMap of `req`, `<req>-stash` ([`stash_config_map_name`]), labelled
/// [`labels::stash_labels`] (request name and uid); the planner creates it before the first
/// destructive step and sets one key per stashed manifest.
///
/// Why no ownerReference: if the request is deleted mid-flight (or after it Failed), the stash
/// is the only copy of stopped pods' manifests and of the orphan-deleted StatefulSet; it must
/// survive for a human to recreate them. The operator deletes it once the request succeeded.
/// Why the uid label: a stash kept after a failed request must never be taken for the stash of
/// a later request of the same name.
pub fn stash_config_map(req: &StorageMigrationRequest) -> ConfigMap {
    let name = req_name(req);
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(stash_config_map_name(&name)),
            namespace: req.namespace(),
            labels: Some(labels::stash_labels(
                &name,
                req.metadata.uid.as_deref().unwrap_or_default(),
            )),
            ..Default::default()
        },
        data: Some(BTreeMap::new()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::{Manifest, testdata};
    use crate::labels::STASH_STATEFULSET_KEY;
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
        let data = BTreeMap::from([("a".to_string(), "x".repeat(100))]);
        assert_eq!(data_size(&data), 101);
        assert!(stash_fits(101, None, "b", "y"));
        let big = "y".repeat(STASH_BUDGET - 101 - 3);
        assert!(stash_fits(101, None, "key", &big));
        assert!(!stash_fits(101, None, "key2", &big));
        // Replacing a key counts the new value only.
        let size = 101 + 3 + big.len();
        assert!(stash_fits(size, Some(3 + big.len()), "key", &big));
        assert!(!stash_fits(size, None, "b", "z"));
    }

    #[test]
    fn a_realistic_stash_fits_many_times_over() {
        let sts = stash_encode(&testdata::statefulset_manifest()).unwrap();
        let mut data = BTreeMap::from([(STASH_STATEFULSET_KEY.to_string(), sts)]);
        for i in 0..100 {
            let mut pod = testdata::pod_manifest().into_raw();
            pod["metadata"]["name"] = format!("etcd-{i}").into();
            data.insert(format!("pod-etcd-{i}"), stash_encode(&pod).unwrap());
            let claim = stash_encode(&testdata::claim()).unwrap();
            data.insert(format!("claim-data-etcd-{i}"), claim);
        }
        assert!(data_size(&data) <= STASH_BUDGET, "{}", data_size(&data));
    }

    #[test]
    fn config_map_stash() {
        let mut req = testdata::request();
        req.metadata.uid = Some("uid-1".into());
        let cm = stash_config_map(&req);
        insta::assert_yaml_snapshot!(cm);
        assert!(cm.metadata.owner_references.is_none());
        assert_eq!(cm.metadata.name.as_deref(), Some("etcd-to-fast-stash"));
        let labels = cm.metadata.labels.unwrap();
        assert_eq!(labels[labels::REQUEST_LABEL], "etcd-to-fast");
        assert_eq!(labels[labels::REQUEST_UID_LABEL], "uid-1");
        assert_eq!(cm.data, Some(BTreeMap::new()));
    }
}
