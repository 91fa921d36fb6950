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
use crate::labels::{self, BINDING_ANNOTATIONS, GC_FINALIZERS, PVC_PROTECTION_FINALIZER};

/// Finalizers the control plane adds on create; copying them is pointless and a stale
/// `foregroundDeletion`/`orphan` would be wrong.
const SYSTEM_FINALIZERS: [&str; 3] = [PVC_PROTECTION_FINALIZER, GC_FINALIZERS[0], GC_FINALIZERS[1]];

/// The temporary claim for `member`: target class and size, the original's access modes and
/// volume mode, labelled [`super::member_labels`] and [`labels::REQUEST_UID_LABEL`] (the
/// request's uid: its name is derived from the request's name, so the uid is what tells this
/// request's claim from one of the same name; see `plan::claims::temp_claim_is_ours`), named
/// `member.temp_claim`.
///
/// Why no ownerReferences: a claim owned by the request would be garbage-collected with it, and
/// after the swap this claim's volume holds the member's only up-to-date data. Claims are never
/// deleted by the garbage collector on our behalf; the operator deletes temporary claims itself,
/// and only before their volume holds anything or after it was re-bound under the original name.
/// Why no selector or dataSource from the original: they describe how the old volume was found
/// or filled, and would keep the new one from being provisioned fresh on the target class. The
/// volumeAttributesClassName is kept: it is how the user asked the volume to perform (IOPS,
/// throughput), and the swapped claim keeps it.
pub fn temp_claim(
    req: &StorageMigrationRequest,
    plan: &Plan,
    member: &PlannedMember,
    original: &PersistentVolumeClaim,
) -> PersistentVolumeClaim {
    let original_spec = original.spec.clone().unwrap_or_default();
    let mut metadata = member_meta(req, member.temp_claim.clone(), &member.pod, false);
    if let (Some(uid), Some(l)) = (req.metadata.uid.clone(), metadata.labels.as_mut()) {
        l.insert(labels::REQUEST_UID_LABEL.to_string(), uid);
    }
    PersistentVolumeClaim {
        metadata,
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: original_spec.access_modes,
            volume_mode: original_spec.volume_mode,
            storage_class_name: Some(plan.target_storage_class.clone()),
            resources: Some(storage_request(&member.new_size)),
            // The new volume is made with the claim's VolumeAttributesClass, so that the claim
            // recreated on it (which keeps the class) can bind it.
            volume_attributes_class_name: original_spec.volume_attributes_class_name,
            ..Default::default()
        }),
        status: None,
    }
}

/// The original claim recreated under its own name, pre-bound to `new_volume` on `class` with
/// `size`; `stateful_set` and `pod` name the member's StatefulSet (orphan-deleted, then
/// recreated) and pod (deleted, then recreated).
///
/// Why `spec.volumeName`: together with the new PV's `claimRef` (see
/// [`super::claim_ref_patch`]) it binds exactly that volume, never a fresh one. Why `class` and
/// `size` from the new volume: a claim binds only a PV of its own class and not smaller than
/// itself (`VolumeMismatch`).
///
/// The claim comes back whole ([`kept_metadata`]): name, namespace, every label and annotation
/// but the control plane's and ours, every ownerReference but the StatefulSet's and the pod's,
/// other finalizers, accessModes, volumeMode, volumeAttributesClassName (the temporary claim
/// carried it too, so the new volume has it: a claim binds only a volume of its own
/// VolumeAttributesClass). Dropped besides: everything the server sets (uid, resourceVersion,
/// creationTimestamp, managedFields, status, deletion fields, generation), the selector,
/// dataSource and dataSourceRef (they belong to the old volume's provisioning and could keep the
/// claim from binding the new volume).
pub fn swapped_claim(
    original: &PersistentVolumeClaim,
    new_volume: &str,
    class: &str,
    size: &Quantity,
    stateful_set: &str,
    pod: &str,
) -> PersistentVolumeClaim {
    let meta = kept_metadata(&original.metadata, stateful_set, pod);
    let spec = original.spec.clone().unwrap_or_default();
    let mut resources = spec.resources.unwrap_or_default();
    resources
        .requests
        .get_or_insert_with(BTreeMap::new)
        .insert("storage".to_string(), size.clone());
    PersistentVolumeClaim {
        metadata: meta,
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: spec.access_modes,
            volume_mode: spec.volume_mode,
            storage_class_name: Some(class.to_string()),
            volume_name: Some(new_volume.to_string()),
            resources: Some(resources),
            selector: None,
            data_source: None,
            data_source_ref: None,
            volume_attributes_class_name: spec.volume_attributes_class_name,
        }),
        status: None,
    }
}

/// The metadata a recreated claim gets back from the `original` of a member whose StatefulSet is
/// `stateful_set` and pod is `pod`: name, namespace and
///
/// - every label, except our own keys ([`labels::is_own_key`]: a request's bookkeeping);
/// - every annotation, except the [`BINDING_ANNOTATIONS`] (the control plane wrote them about the
///   old binding or the old volume's provisioning: `bind-completed` and `bound-by-controller`
///   come back when the PV controller binds the new volume, and a stale `bound-by-controller`
///   would let it treat the pre-bound claim as its own to unbind; a stale `storage-provisioner`,
///   `selected-node`, `migrated-to` or beta `storage-class` names the old volume's provisioner,
///   node or class) and our own keys (e.g. the bind nudge);
/// - every ownerReference, except one to the member's StatefulSet or pod
///   ([`is_adoption_ref`]): they point at objects deleted during the swap (the garbage collector
///   would delete a claim whose owners are all gone), and the recreated set puts its own back
///   when its retention policy asks for them (`whenDeleted: Delete` → the set, `whenScaled:
///   Delete` → a pod being scaled away; clusters from 1.23 on). A reference to anything else (a
///   user's own owner, another workload) stays, uid included;
/// - every finalizer, except the control plane's ([`SYSTEM_FINALIZERS`]).
pub fn kept_metadata(original: &ObjectMeta, stateful_set: &str, pod: &str) -> ObjectMeta {
    let keep = |map: &Option<BTreeMap<String, String>>, dropped: &[&str]| {
        let kept: BTreeMap<String, String> = map
            .iter()
            .flatten()
            .filter(|(k, _)| !labels::is_own_key(k) && !dropped.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        (!kept.is_empty()).then_some(kept)
    };
    let finalizers: Vec<String> = original
        .finalizers
        .iter()
        .flatten()
        .filter(|f| !SYSTEM_FINALIZERS.contains(&f.as_str()))
        .cloned()
        .collect();
    let owner_references: Vec<OwnerReference> = original
        .owner_references
        .iter()
        .flatten()
        .filter(|r| !is_adoption_ref(r, stateful_set, pod))
        .cloned()
        .collect();
    ObjectMeta {
        name: original.name.clone(),
        namespace: original.namespace.clone(),
        labels: keep(&original.labels, &[]),
        annotations: keep(&original.annotations, &BINDING_ANNOTATIONS),
        finalizers: (!finalizers.is_empty()).then_some(finalizers),
        owner_references: (!owner_references.is_empty()).then_some(owner_references),
        ..Default::default()
    }
}

/// True for an ownerReference to the StatefulSet named `stateful_set` or the Pod named `pod`
/// (any uid): the references a member's StatefulSet puts on its claim through its retention
/// policy. Step 2 removes them from the live claim ([`is_statefulset_or_pod_ref`] says why) and
/// the recreated claim does not get them back.
pub fn is_adoption_ref(r: &OwnerReference, stateful_set: &str, pod: &str) -> bool {
    is_statefulset_or_pod_ref(r)
        && match r.kind.as_str() {
            "StatefulSet" => r.name == stateful_set,
            _ => r.name == pod,
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
        assert_eq!(
            labels.get(labels::REQUEST_UID_LABEL),
            req.metadata.uid.as_ref(),
            "the request's uid tells its claim from one of the same name"
        );
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
            "etcd",
            "etcd-1",
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

    /// A claim's VolumeAttributesClass goes with it: onto the temporary claim (so the new
    /// volume is made with it) and back onto the swapped claim (which binds only a volume of
    /// its own class).
    #[test]
    fn the_volume_attributes_class_is_kept_on_both_claims() {
        let mut original = testdata::claim();
        if let Some(spec) = original.spec.as_mut() {
            spec.volume_attributes_class_name = Some("gold".into());
        }
        let req = testdata::request();
        let temp = temp_claim(&req, &testdata::plan(), &testdata::member(), &original);
        let vac = |c: &PersistentVolumeClaim| {
            c.spec
                .as_ref()
                .and_then(|s| s.volume_attributes_class_name.clone())
        };
        assert_eq!(vac(&temp).as_deref(), Some("gold"));
        let size = Quantity("1Gi".to_string());
        let swapped = swapped_claim(&original, "pvc-new", "fast", &size, "etcd", "etcd-1");
        assert_eq!(vac(&swapped).as_deref(), Some("gold"));
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
        let pvc = swapped_claim(
            &original,
            "pv1",
            "fast",
            &Quantity("256Mi".into()),
            "x",
            "x-0",
        );
        assert!(pvc.metadata.annotations.is_none());
        assert!(pvc.metadata.owner_references.is_none());
        let spec = pvc.spec.unwrap();
        assert_eq!(
            spec.resources.unwrap().requests.unwrap()["storage"],
            Quantity("256Mi".into())
        );
    }

    fn owner(api_version: &str, kind: &str, name: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            ..Default::default()
        }
    }

    /// What a recreated claim keeps and drops, key by key.
    #[test]
    fn kept_metadata_keeps_the_users_and_drops_the_control_planes_and_ours() {
        let mut meta = testdata::claim().metadata;
        let labels = meta.labels.get_or_insert_with(BTreeMap::new);
        labels.insert("team".into(), "db".into());
        labels.insert(crate::labels::REQUEST_LABEL.into(), "old".into());
        let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
        annotations.insert(crate::labels::BIND_NUDGE_ANNOTATION.into(), "1".into());
        annotations.insert(
            "kubectl.kubernetes.io/last-applied-configuration".into(),
            "{}".into(),
        );
        meta.finalizers = Some(vec![
            PVC_PROTECTION_FINALIZER.into(),
            "foregroundDeletion".into(),
            "example.com/keep".into(),
        ]);
        meta.owner_references = Some(vec![
            owner("apps/v1", "StatefulSet", "etcd"),
            owner("v1", "Pod", "etcd-1"),
            owner("v1", "ConfigMap", "etcd-owner"),
            owner("apps/v1", "StatefulSet", "other"),
            owner("v1", "Pod", "etcd-0"),
            owner("example.com/v1", "StatefulSet", "etcd"),
        ]);
        let kept = kept_metadata(&meta, "etcd", "etcd-1");

        let labels: Vec<&str> = kept
            .labels
            .iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(labels, ["app", "team"]);
        let annotations: Vec<&str> = kept
            .annotations
            .iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(
            annotations,
            [
                "example.com/backup",
                "kubectl.kubernetes.io/last-applied-configuration"
            ]
        );
        assert_eq!(kept.finalizers, Some(vec!["example.com/keep".to_string()]));
        let refs: Vec<(&str, &str)> = kept
            .owner_references
            .iter()
            .flatten()
            .map(|r| (r.kind.as_str(), r.name.as_str()))
            .collect();
        assert_eq!(
            refs,
            [
                ("ConfigMap", "etcd-owner"),
                ("StatefulSet", "other"),
                ("Pod", "etcd-0"),
                ("StatefulSet", "etcd"),
            ],
            "only the member's own set and pod are dropped (the last is not an apps/* set)"
        );
        assert_eq!(
            kept.owner_references.as_ref().unwrap()[0].uid,
            "uid-etcd-owner"
        );
        assert_eq!(kept.name, meta.name);
        assert_eq!(kept.namespace, meta.namespace);
        assert!(kept.uid.is_none() && kept.resource_version.is_none());
        assert!(kept.creation_timestamp.is_none() && kept.managed_fields.is_none());
    }

    #[test]
    fn adoption_refs_are_the_members_set_and_pod() {
        assert!(is_adoption_ref(
            &owner("apps/v1", "StatefulSet", "db"),
            "db",
            "db-0"
        ));
        assert!(is_adoption_ref(&owner("v1", "Pod", "db-0"), "db", "db-0"));
        assert!(!is_adoption_ref(&owner("v1", "Pod", "db-1"), "db", "db-0"));
        assert!(!is_adoption_ref(
            &owner("apps/v1", "StatefulSet", "db-0"),
            "db",
            "db-0"
        ));
        assert!(!is_adoption_ref(
            &owner("v1", "ConfigMap", "db"),
            "db",
            "db-0"
        ));
        assert!(!is_adoption_ref(
            &owner("apps/v1", "Deployment", "db"),
            "db",
            "db-0"
        ));
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
