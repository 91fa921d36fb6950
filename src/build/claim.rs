//! Claims: the temporary claim the new volume is provisioned for, the claim recreated under the
//! original name on the new volume, and the removal of ownerReferences that could delete a claim.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::{Value, json};

use crate::api::{Plan, PlannedMember, StorageMigrationRequest};

use super::member_meta;
use crate::labels::{BINDING_ANNOTATIONS, GC_FINALIZERS, PVC_PROTECTION_FINALIZER};

/// Finalizers the control plane adds on create; copying them is pointless and a stale
/// `foregroundDeletion`/`orphan` would be wrong.
const SYSTEM_FINALIZERS: [&str; 3] = [PVC_PROTECTION_FINALIZER, GC_FINALIZERS[0], GC_FINALIZERS[1]];

/// The temporary claim for `member`: target class and size, the original's access modes and
/// volume mode, labelled [`super::member_labels`], named `member.temp_claim`.
///
/// Why no ownerReferences: a claim owned by the request would be garbage-collected with it, and
/// after the swap this claim's volume holds the member's only up-to-date data. Claims are never
/// deleted by the garbage collector on our behalf; the operator deletes temporary claims itself,
/// and only before their volume holds anything or after it was re-bound under the original name.
/// Why no selector, dataSource or volumeAttributesClassName from the original: they describe
/// how the old volume was found or filled, and would keep the new one from being provisioned
/// fresh on the target class.
pub fn temp_claim(
    req: &StorageMigrationRequest,
    plan: &Plan,
    member: &PlannedMember,
    original: &PersistentVolumeClaim,
) -> PersistentVolumeClaim {
    let original_spec = original.spec.clone().unwrap_or_default();
    PersistentVolumeClaim {
        metadata: member_meta(req, member.temp_claim.clone(), &member.pod, false),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: original_spec.access_modes,
            volume_mode: original_spec.volume_mode,
            storage_class_name: Some(plan.target_storage_class.clone()),
            resources: Some(storage_request(&member.new_size)),
            ..Default::default()
        }),
        status: None,
    }
}

/// The original claim recreated under its own name, pre-bound to `new_volume` on `class` with
/// `size`.
///
/// Why `spec.volumeName`: together with the new PV's `claimRef` (see
/// [`super::claim_ref_patch`]) it binds exactly that volume, never a fresh one. Why `class` and
/// `size` from the new volume: a claim binds only a PV of its own class and not smaller than
/// itself (`VolumeMismatch`). Kept: name, namespace, labels, the user's annotations,
/// accessModes, volumeMode, other finalizers, ownerReferences to anything but a StatefulSet or a
/// pod (those would let the garbage collector delete the claim, see
/// [`is_statefulset_or_pod_ref`]). Dropped: everything the server sets (uid, resourceVersion,
/// creationTimestamp, managedFields, status, deletion fields, generation), the
/// [`BINDING_ANNOTATIONS`] (they describe the old binding), the selector, dataSource,
/// dataSourceRef and volumeAttributesClassName (they belong to the old volume's provisioning and
/// could keep the claim from binding the new volume).
pub fn swapped_claim(
    original: &PersistentVolumeClaim,
    new_volume: &str,
    class: &str,
    size: &Quantity,
) -> PersistentVolumeClaim {
    let meta = &original.metadata;
    let annotations: BTreeMap<String, String> = meta
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| !BINDING_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let finalizers: Vec<String> = meta
        .finalizers
        .iter()
        .flatten()
        .filter(|f| !SYSTEM_FINALIZERS.contains(&f.as_str()))
        .cloned()
        .collect();
    let owner_references: Vec<OwnerReference> = meta
        .owner_references
        .iter()
        .flatten()
        .filter(|r| !is_statefulset_or_pod_ref(r))
        .cloned()
        .collect();
    let spec = original.spec.clone().unwrap_or_default();
    let mut resources = spec.resources.unwrap_or_default();
    resources
        .requests
        .get_or_insert_with(BTreeMap::new)
        .insert("storage".to_string(), size.clone());
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            labels: meta.labels.clone(),
            annotations: (!annotations.is_empty()).then_some(annotations),
            finalizers: (!finalizers.is_empty()).then_some(finalizers),
            owner_references: (!owner_references.is_empty()).then_some(owner_references),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: spec.access_modes,
            volume_mode: spec.volume_mode,
            storage_class_name: Some(class.to_string()),
            volume_name: Some(new_volume.to_string()),
            resources: Some(resources),
            selector: None,
            data_source: None,
            data_source_ref: None,
            volume_attributes_class_name: None,
        }),
        status: None,
    }
}

/// True for an ownerReference to a StatefulSet (`apps/*`) or a Pod (`v1`).
///
/// Why: a StatefulSet's `persistentVolumeClaimRetentionPolicy` puts exactly these on its claims
/// (`whenDeleted: Delete` → the set, `whenScaled: Delete` → the pod); with them in place, orphan-
/// deleting the set or deleting a member's pod garbage-collects the claim and, through the
/// volume's `Delete` reclaim policy, the member's data.
pub fn is_statefulset_or_pod_ref(r: &OwnerReference) -> bool {
    (r.kind == "StatefulSet" && r.api_version.starts_with("apps/"))
        || (r.kind == "Pod" && r.api_version == "v1")
}

/// The JSON merge patch that removes every StatefulSet/pod ownerReference from `claim` (step 2
/// of the flow), or `None` when it has none.
///
/// Send it as `Patch::Merge`: a merge patch replaces the whole list, so the kept references are
/// listed, and `metadata.resourceVersion` is included so that a concurrent change to the claim
/// makes the patch fail with 409 (re-read and rebuild) instead of dropping that change.
pub fn claim_owner_references_patch(claim: &PersistentVolumeClaim) -> Option<Value> {
    let refs = claim
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    if !refs.iter().any(is_statefulset_or_pod_ref) {
        return None;
    }
    let kept: Vec<&OwnerReference> = refs
        .iter()
        .filter(|r| !is_statefulset_or_pod_ref(r))
        .collect();
    let mut metadata =
        json!({ "ownerReferences": if kept.is_empty() { Value::Null } else { json!(kept) } });
    if let Some(rv) = &claim.metadata.resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    Some(json!({ "metadata": metadata }))
}

fn storage_request(size: &Quantity) -> VolumeResourceRequirements {
    VolumeResourceRequirements {
        requests: Some(BTreeMap::from([("storage".to_string(), size.clone())])),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::testdata;

    #[test]
    fn temp_claim_snapshot_and_invariants() {
        let req = testdata::request();
        let plan = testdata::plan();
        let member = testdata::member();
        let pvc = temp_claim(&req, &plan, &member, &testdata::claim());
        insta::assert_yaml_snapshot!(pvc);
        assert!(
            pvc.metadata.owner_references.is_none(),
            "claims are never owned"
        );
        let spec = pvc.spec.unwrap();
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
        assert!(spec.selector.is_none() && spec.volume_name.is_none());
        assert_eq!(
            pvc.metadata.name.as_deref(),
            Some(member.temp_claim.as_str())
        );
        let labels = pvc.metadata.labels.unwrap();
        assert_eq!(labels["storagemigrator.io/member"], "etcd-1");
        assert_eq!(labels["storagemigrator.io/request"], "etcd-to-fast");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "storage-migrator");
    }

    #[test]
    fn temp_claim_takes_the_shrunk_size() {
        let req = testdata::request();
        let mut plan = testdata::plan();
        plan.target_size = Quantity("256Mi".into());
        let mut member = testdata::member();
        member.new_size = Quantity("256Mi".into());
        let pvc = temp_claim(&req, &plan, &member, &testdata::claim());
        let requests = pvc.spec.unwrap().resources.unwrap().requests.unwrap();
        assert_eq!(requests["storage"], Quantity("256Mi".into()));
    }

    #[test]
    fn swapped_claim_snapshot_and_invariants() {
        let original = testdata::claim();
        let pvc = swapped_claim(
            &original,
            "pvc-new-0000",
            "fast",
            &Quantity("1Gi".to_string()),
        );
        insta::assert_yaml_snapshot!(pvc);
        let meta = &pvc.metadata;
        assert_eq!(meta.name.as_deref(), Some("data-etcd-1"));
        assert_eq!(meta.namespace.as_deref(), Some("demo"));
        assert_eq!(meta.labels, original.metadata.labels);
        let annotations = meta.annotations.clone().unwrap();
        for a in BINDING_ANNOTATIONS {
            assert!(!annotations.contains_key(a), "binding annotation {a} kept");
        }
        assert_eq!(annotations["example.com/backup"], "daily");
        assert!(meta.uid.is_none() && meta.resource_version.is_none());
        assert!(meta.creation_timestamp.is_none() && meta.managed_fields.is_none());
        assert!(meta.finalizers.is_none());
        let refs = meta.owner_references.clone().unwrap();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].kind, "Backup");
        assert!(pvc.status.is_none());
        let spec = pvc.spec.unwrap();
        assert_eq!(spec.volume_name.as_deref(), Some("pvc-new-0000"));
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert!(spec.selector.is_none());
    }

    #[test]
    fn swapped_claim_of_a_bare_claim() {
        let original = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data-x-0".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: None,
            status: None,
        };
        let pvc = swapped_claim(&original, "pv1", "fast", &Quantity("256Mi".into()));
        assert!(pvc.metadata.annotations.is_none());
        assert!(pvc.metadata.owner_references.is_none());
        let spec = pvc.spec.unwrap();
        assert_eq!(
            spec.resources.unwrap().requests.unwrap()["storage"],
            Quantity("256Mi".into())
        );
    }

    #[test]
    fn owner_reference_patch() {
        let claim = testdata::claim();
        let patch = claim_owner_references_patch(&claim).unwrap();
        insta::assert_yaml_snapshot!(patch);

        let mut only_set = claim.clone();
        only_set.metadata.owner_references = Some(vec![
            claim.metadata.owner_references.clone().unwrap()[0].clone(),
        ]);
        let patch = claim_owner_references_patch(&only_set).unwrap();
        assert_eq!(patch["metadata"]["ownerReferences"], Value::Null);

        let mut none = claim;
        none.metadata.owner_references = None;
        assert!(claim_owner_references_patch(&none).is_none());
    }
}
