//! The StatefulSet recreated from its stash, and the patches that keep its retention policy from
//! deleting claims while the migration runs.

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use super::BuildError;

/// Finalizers the garbage collector adds while deleting; a stash taken during the orphan delete
/// may carry them, and on a new object they would block or cascade its next deletion.
const GC_FINALIZERS: [&str; 2] = ["orphan", "foregroundDeletion"];

/// The pre-1.6 annotation form of a claim template's `storageClassName`; it overrides the field.
const BETA_STORAGE_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";

/// The StatefulSet recreated from `stashed`, with claim template `template` moved to `class` and
/// `size`, and `retention` as its `persistentVolumeClaimRetentionPolicy`.
///
/// Why `spec.template` is left untouched, byte for byte (server-set defaults included): the
/// set's update revision is a hash of it. With the same template the new set adopts the orphaned
/// pods and their ControllerRevision as current and restarts nothing; any change, even one
/// annotation, is a new revision and an immediate rolling restart of every member, outside the
/// migrator's control. Why only that claim template changes: volumeClaimTemplates are
/// immutable on a live set (hence the orphan delete and this recreation), and the claims already
/// swapped match the new template. Its `volume.beta.kubernetes.io/storage-class` annotation is
/// dropped because it would override the new class. Why `retention` is a parameter: the live set
/// ran with a protected (Retain/Retain) policy during the migration; the recreated one gets the
/// user's original policy back (recorded with [`original_retention_policy`]).
///
/// Metadata keeps name, namespace, labels, annotations and ownerReferences (a set owned by a
/// higher-level operator stays owned); server state (uid, resourceVersion, creationTimestamp,
/// managedFields, generation, deletion fields), garbage-collector finalizers and status are
/// dropped. A `template` that names no claim template changes no template (preflight checks it
/// exists).
pub fn recreated_statefulset(
    stashed: &StatefulSet,
    template: &str,
    class: &str,
    size: &Quantity,
    retention: Option<StatefulSetPersistentVolumeClaimRetentionPolicy>,
) -> StatefulSet {
    let meta = &stashed.metadata;
    let finalizers: Vec<String> = meta
        .finalizers
        .iter()
        .flatten()
        .filter(|f| !GC_FINALIZERS.contains(&f.as_str()))
        .cloned()
        .collect();
    let mut spec = stashed.spec.clone();
    if let Some(spec) = spec.as_mut() {
        spec.persistent_volume_claim_retention_policy = retention;
        for claim in spec.volume_claim_templates.iter_mut().flatten() {
            if claim.metadata.name.as_deref() != Some(template) {
                continue;
            }
            if let Some(annotations) = claim.metadata.annotations.as_mut() {
                annotations.remove(BETA_STORAGE_CLASS_ANNOTATION);
                if annotations.is_empty() {
                    claim.metadata.annotations = None;
                }
            }
            let claim_spec = claim.spec.get_or_insert_with(Default::default);
            claim_spec.storage_class_name = Some(class.to_string());
            claim_spec
                .resources
                .get_or_insert_with(Default::default)
                .requests
                .get_or_insert_with(Default::default)
                .insert("storage".to_string(), size.clone());
        }
    }
    StatefulSet {
        metadata: ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            labels: meta.labels.clone(),
            annotations: meta.annotations.clone(),
            owner_references: meta.owner_references.clone(),
            finalizers: (!finalizers.is_empty()).then_some(finalizers),
            ..Default::default()
        },
        spec,
        status: None,
    }
}

/// True when the set's retention policy can delete claims (`whenDeleted` or `whenScaled` is
/// `Delete`).
///
/// Why it matters: `whenDeleted: Delete` makes the orphan delete of the set take every claim
/// with it; `whenScaled: Delete` makes deleting a member's pod take its claim (see
/// [`super::is_statefulset_or_pod_ref`]). Either loses data through the volume's reclaim policy.
pub fn retention_needs_protection(sts: &StatefulSet) -> bool {
    sts.spec
        .as_ref()
        .and_then(|s| s.persistent_volume_claim_retention_policy.as_ref())
        .is_some_and(|p| {
            p.when_deleted.as_deref() == Some("Delete")
                || p.when_scaled.as_deref() == Some("Delete")
        })
}

/// The JSON merge patch (step 2) that sets the live set's retention policy to Retain/Retain, or
/// `None` when nothing needs protecting. Allowed on a live set (the policy is one of the few
/// mutable spec fields). Send it before the claims' ownerReferences are removed
/// ([`super::claim_owner_references_patch`]), so the StatefulSet controller does not add them
/// back. A cluster that does not know the field (before 1.23, e.g. the 1.20 test cluster) never
/// returns a policy, so this is `None` there.
pub fn protected_retention_policy(sts: &StatefulSet) -> Option<Value> {
    retention_needs_protection(sts).then(|| {
        json!({
            "spec": {
                "persistentVolumeClaimRetentionPolicy": {
                    "whenDeleted": "Retain",
                    "whenScaled": "Retain",
                }
            }
        })
    })
}

/// The set's retention policy as JSON for `status.originalRetentionPolicy`: the policy object,
/// or `null` when the set has none. Recording `null` distinguishes "recorded: there was none"
/// from the status field being absent ("not recorded yet"). Record it before sending
/// [`protected_retention_policy`]; restore it with [`parse_retention_policy`].
pub fn original_retention_policy(sts: &StatefulSet) -> String {
    let policy = sts
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_claim_retention_policy.as_ref());
    match policy {
        Some(p) => json!(p).to_string(),
        None => "null".to_string(),
    }
}

/// Reads back what [`original_retention_policy`] recorded.
pub fn parse_retention_policy(
    recorded: &str,
) -> Result<Option<StatefulSetPersistentVolumeClaimRetentionPolicy>, BuildError> {
    serde_json::from_str(recorded).map_err(|e| BuildError::RetentionPolicy {
        value: recorded.chars().take(200).collect(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::testdata;

    fn policy(deleted: &str, scaled: &str) -> StatefulSetPersistentVolumeClaimRetentionPolicy {
        StatefulSetPersistentVolumeClaimRetentionPolicy {
            when_deleted: Some(deleted.to_string()),
            when_scaled: Some(scaled.to_string()),
        }
    }

    #[test]
    fn recreated_statefulset_snapshot() {
        let stashed = testdata::statefulset();
        let sts = recreated_statefulset(
            &stashed,
            "data",
            "fast",
            &Quantity("1Gi".into()),
            Some(policy("Delete", "Retain")),
        );
        insta::assert_yaml_snapshot!(sts);
    }

    #[test]
    fn recreated_statefulset_keeps_the_template_byte_for_byte() {
        let stashed = testdata::statefulset();
        let sts = recreated_statefulset(&stashed, "data", "fast", &Quantity("256Mi".into()), None);
        let old = stashed.spec.clone().unwrap();
        let new = sts.spec.clone().unwrap();
        assert_eq!(
            serde_json::to_value(&new.template).unwrap(),
            serde_json::to_value(&old.template).unwrap()
        );
        assert_eq!(new.selector, old.selector);
        assert_eq!(new.service_name, old.service_name);
        assert_eq!(new.replicas, old.replicas);
        assert_eq!(new.update_strategy, old.update_strategy);
        assert_eq!(new.pod_management_policy, old.pod_management_policy);
        assert!(new.persistent_volume_claim_retention_policy.is_none());

        let templates = new.volume_claim_templates.unwrap();
        let data = &templates[0];
        let spec = data.spec.clone().unwrap();
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(
            spec.resources.unwrap().requests.unwrap()["storage"],
            Quantity("256Mi".into())
        );
        assert!(
            data.metadata.annotations.is_none(),
            "beta class annotation dropped"
        );
        assert_eq!(
            data.metadata.labels,
            old.volume_claim_templates.as_ref().unwrap()[0]
                .metadata
                .labels
        );
        // The other template is untouched.
        assert_eq!(
            serde_json::to_value(&templates[1]).unwrap(),
            serde_json::to_value(&old.volume_claim_templates.unwrap()[1]).unwrap()
        );

        let meta = &sts.metadata;
        assert!(meta.uid.is_none() && meta.resource_version.is_none());
        assert!(meta.creation_timestamp.is_none() && meta.managed_fields.is_none());
        assert!(meta.generation.is_none());
        assert_eq!(meta.labels, stashed.metadata.labels);
        assert_eq!(meta.annotations, stashed.metadata.annotations);
        assert!(sts.status.is_none());
    }

    #[test]
    fn recreated_statefulset_drops_gc_finalizers_only() {
        let mut stashed = testdata::statefulset();
        stashed.metadata.finalizers = Some(vec!["orphan".into(), "example.com/keep".into()]);
        let sts = recreated_statefulset(&stashed, "data", "fast", &Quantity("1Gi".into()), None);
        assert_eq!(
            sts.metadata.finalizers,
            Some(vec!["example.com/keep".to_string()])
        );
    }

    #[test]
    fn unknown_template_changes_nothing_but_retention() {
        let stashed = testdata::statefulset();
        let sts = recreated_statefulset(&stashed, "nope", "fast", &Quantity("1Gi".into()), None);
        assert_eq!(
            serde_json::to_value(sts.spec.unwrap().volume_claim_templates).unwrap(),
            serde_json::to_value(stashed.spec.unwrap().volume_claim_templates).unwrap()
        );
    }

    #[test]
    fn retention_protection() {
        let mut sts = testdata::statefulset();
        assert!(retention_needs_protection(&sts));
        let recorded = original_retention_policy(&sts);
        assert_eq!(
            recorded,
            r#"{"whenDeleted":"Delete","whenScaled":"Retain"}"#
        );
        insta::assert_yaml_snapshot!(protected_retention_policy(&sts).unwrap());
        assert_eq!(
            parse_retention_policy(&recorded).unwrap(),
            Some(policy("Delete", "Retain"))
        );

        sts.spec
            .as_mut()
            .unwrap()
            .persistent_volume_claim_retention_policy = Some(policy("Retain", "Delete"));
        assert!(retention_needs_protection(&sts));

        sts.spec
            .as_mut()
            .unwrap()
            .persistent_volume_claim_retention_policy = Some(policy("Retain", "Retain"));
        assert!(!retention_needs_protection(&sts));
        assert!(protected_retention_policy(&sts).is_none());

        // What a 1.20 server returns: the field is dropped.
        sts.spec
            .as_mut()
            .unwrap()
            .persistent_volume_claim_retention_policy = None;
        assert!(!retention_needs_protection(&sts));
        assert!(protected_retention_policy(&sts).is_none());
        assert_eq!(original_retention_policy(&sts), "null");
        assert_eq!(parse_retention_policy("null").unwrap(), None);

        assert!(matches!(
            parse_retention_policy("{not json"),
            Err(BuildError::RetentionPolicy { .. })
        ));
    }

    #[test]
    fn restore_round_trip_through_status() {
        let stashed = testdata::statefulset();
        let recorded = original_retention_policy(&stashed);
        let restored = parse_retention_policy(&recorded).unwrap();
        let sts =
            recreated_statefulset(&stashed, "data", "fast", &Quantity("1Gi".into()), restored);
        assert_eq!(
            sts.spec.unwrap().persistent_volume_claim_retention_policy,
            stashed
                .spec
                .unwrap()
                .persistent_volume_claim_retention_policy
        );
    }
}
