//! The stash read back: manifests stashed on the request (annotations) or in its stash
//! ConfigMap, decoded.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use serde::de::DeserializeOwned;
use tracing::warn;

use super::Cluster;
use super::error::{ClusterError, kube_err};
use crate::api::{StorageMigrationRequest, StorageMigrationRequestStatus};
use crate::build;
use crate::labels;
use crate::plan::Stash;

impl Cluster {
    /// Decodes the stash from the request's annotations and the stash ConfigMap; also says
    /// whether that ConfigMap exists.
    pub(crate) async fn stash(
        &self,
        req: &StorageMigrationRequest,
        ns: &str,
        status: &StorageMigrationRequestStatus,
    ) -> Result<(Stash, bool), ClusterError> {
        let mut entries: BTreeMap<String, String> = req.annotations().clone();
        let mut exists = false;
        if let Some(cm) = &status.stash_config_map
            && let Some(cm) = self
                .ns_api::<ConfigMap>(ns)
                .get_opt(cm)
                .await
                .map_err(kube_err(format!("get stash ConfigMap {cm}")))?
        {
            exists = true;
            entries.extend(config_map_entries(cm));
        }
        let stash = decode_stash(&entries, status);
        for (key, e) in &stash.errors {
            warn!(key, error = %e, "stash entry cannot be decoded");
        }
        Ok((stash, exists))
    }
}

/// The stash ConfigMap's data as the annotations they stand for (`<group>/<key>`).
fn config_map_entries(cm: ConfigMap) -> impl Iterator<Item = (String, String)> {
    cm.data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (format!("{}/{k}", labels::GROUP), v))
}

/// Decodes the stash entries (annotation key to encoded manifest) the plan names: the
/// StatefulSet, and each member's pod and claim. An entry that cannot be decoded is recorded in
/// `errors`, not dropped silently.
pub fn decode_stash(
    entries: &BTreeMap<String, String>,
    status: &StorageMigrationRequestStatus,
) -> Stash {
    let mut stash = Stash::default();
    let mut errors = Vec::new();
    stash.stateful_set = decode_entry(
        entries,
        labels::STASH_STATEFULSET_ANNOTATION.to_string(),
        &mut errors,
    );
    for m in status.plan.iter().flat_map(|p| p.members.iter()) {
        let key = build::stash_pod_annotation(&m.pod);
        if let Some(p) = decode_entry(entries, key, &mut errors) {
            stash.pods.insert(m.pod.clone(), p);
        }
        let key = format!("{}{}", labels::STASH_CLAIM_ANNOTATION_PREFIX, m.claim);
        if let Some(c) = decode_entry(entries, key, &mut errors) {
            stash.claims.insert(m.claim.clone(), c);
        }
    }
    stash.errors = errors;
    stash
}

/// The entry `key` decoded; `None` when it is absent, or when it cannot be decoded (then the
/// key and the reason are added to `errors`).
fn decode_entry<T: DeserializeOwned>(
    entries: &BTreeMap<String, String>,
    key: String,
    errors: &mut Vec<(String, String)>,
) -> Option<T> {
    let value = entries.get(&key)?;
    match build::stash_decode(value) {
        Ok(v) => Some(v),
        Err(e) => {
            errors.push((key, e.to_string()));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Plan, PlannedMember};
    use crate::plan::fixtures::{self, manifest};

    fn status() -> StorageMigrationRequestStatus {
        StorageMigrationRequestStatus {
            plan: Some(Plan {
                members: vec![PlannedMember {
                    pod: "etcd-0".into(),
                    claim: "data-etcd-0".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_plans_entries_are_decoded_and_bad_ones_reported() {
        let set = manifest(fixtures::stateful_set(3));
        let pod = manifest(fixtures::member_pod(0));
        let claim = fixtures::bound_claim("data-etcd-0", "standard", "1Gi", "pv-old-0");
        let claim_key = format!("{}data-etcd-0", labels::STASH_CLAIM_ANNOTATION_PREFIX);
        let entries = BTreeMap::from([
            (
                labels::STASH_STATEFULSET_ANNOTATION.to_string(),
                build::stash_encode(&set).unwrap(),
            ),
            (
                build::stash_pod_annotation("etcd-0"),
                build::stash_encode(&pod).unwrap(),
            ),
            (claim_key.clone(), "not base64!".to_string()),
            (
                build::stash_pod_annotation("etcd-9"),
                build::stash_encode(&pod).unwrap(),
            ),
        ]);
        let stash = decode_stash(&entries, &status());
        assert_eq!(stash.stateful_set, Some(set));
        assert_eq!(stash.pods.keys().collect::<Vec<_>>(), ["etcd-0"]);
        assert_eq!(stash.pods["etcd-0"], pod);
        assert!(stash.claims.is_empty());
        assert_eq!(stash.errors.len(), 1);
        assert_eq!(stash.errors[0].0, claim_key);
        // A claim decodes when its entry is good.
        let entries = BTreeMap::from([(claim_key, build::stash_encode(&claim).unwrap())]);
        let stash = decode_stash(&entries, &status());
        assert_eq!(stash.claims["data-etcd-0"], claim);
        assert!(stash.errors.is_empty() && stash.stateful_set.is_none());
    }

    #[test]
    fn config_map_keys_stand_for_annotations_of_the_group() {
        let cm = ConfigMap {
            data: Some(BTreeMap::from([("k".to_string(), "v".to_string())])),
            ..Default::default()
        };
        let entries: Vec<_> = config_map_entries(cm).collect();
        assert_eq!(entries, [(format!("{}/k", labels::GROUP), "v".to_string())]);
        assert_eq!(config_map_entries(ConfigMap::default()).count(), 0);
    }
}
