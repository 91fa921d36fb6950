//! The StatefulSet recreated from its stash, and the patches that keep its retention policy from
//! deleting claims while the migration runs.

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};

use super::BuildError;
use super::manifest::{Manifest, for_create, object_at};
use crate::labels::{BETA_STORAGE_CLASS_ANNOTATION, GC_FINALIZERS};

/// `spec.persistentVolumeClaimRetentionPolicy` of a StatefulSet.
const RETENTION_FIELD: &str = "persistentVolumeClaimRetentionPolicy";

/// The StatefulSet recreated from `stashed` (its raw JSON as the API server returned it), with
/// claim template `template` moved to `class` and `size`, and `retention` as its
/// `persistentVolumeClaimRetentionPolicy`.
///
/// Why the raw JSON is edited, and `spec.template` is left untouched, byte for byte (server-set
/// defaults and fields k8s-openapi does not know included): the set's update revision is a hash
/// of the template. With the same template the new set adopts the orphaned pods and their
/// ControllerRevision as current and restarts nothing; any change, even one annotation or a
/// field dropped by a typed round trip on a cluster newer than our API structs, is a new
/// revision and an immediate rolling restart of every member, outside the migrator's control.
/// Why only that claim template changes: volumeClaimTemplates are immutable on a live set
/// (hence the orphan delete and this recreation), and the claims already swapped match the new
/// template. Its `volume.beta.kubernetes.io/storage-class` annotation is dropped because it
/// would override the new class. Why `retention` is a parameter: the live set ran with a
/// protected (Retain/Retain) policy during the migration; the recreated one gets the user's
/// original policy back (recorded with [`original_retention_policy`]); `None` removes the field.
///
/// Metadata keeps everything but server state (uid, resourceVersion, creationTimestamp,
/// managedFields, generation, deletion fields, selfLink) and garbage-collector finalizers:
/// ownerReferences stay (a set owned by a higher-level operator stays owned). Status is dropped.
/// A change that names no claim template changes no template (preflight checks they exist).
/// Fails only if the edited JSON no longer reads as a StatefulSet (it always does).
/// The class and size one volumeClaimTemplate of the recreated set gets.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateChange {
    pub template: String,
    pub class: String,
    pub size: Quantity,
}

pub fn recreated_statefulset(
    stashed: &Manifest<StatefulSet>,
    changes: &[TemplateChange],
    retention: Option<StatefulSetPersistentVolumeClaimRetentionPolicy>,
) -> Result<Manifest<StatefulSet>, BuildError> {
    let mut obj = for_create(stashed.raw(), &[]);
    if let Some(Value::Object(meta)) = obj.get_mut("metadata")
        && let Some(Value::Array(finalizers)) = meta.get_mut("finalizers")
    {
        finalizers.retain(|f| !f.as_str().is_some_and(|f| GC_FINALIZERS.contains(&f)));
        if finalizers.is_empty() {
            meta.remove("finalizers");
        }
    }
    if let Some(Value::Object(spec)) = obj.get_mut("spec") {
        match retention {
            Some(policy) => {
                let policy = serde_json::to_value(policy).map_err(|e| BuildError::Manifest {
                    kind: "StatefulSet",
                    reason: e.to_string(),
                })?;
                spec.insert(RETENTION_FIELD.to_string(), policy);
            }
            None => {
                spec.remove(RETENTION_FIELD);
            }
        }
        let templates = spec
            .get_mut("volumeClaimTemplates")
            .and_then(Value::as_array_mut);
        for claim in templates.into_iter().flatten() {
            let Some(claim) = claim.as_object_mut() else {
                continue;
            };
            let name = claim.get("metadata").and_then(|m| m.get("name"));
            let name = name.and_then(Value::as_str);
            let Some(TemplateChange { class, size, .. }) =
                changes.iter().find(|c| Some(c.template.as_str()) == name)
            else {
                continue;
            };
            let meta = object_at(claim, "metadata");
            if let Some(Value::Object(annotations)) = meta.get_mut("annotations")
                && annotations.remove(BETA_STORAGE_CLASS_ANNOTATION).is_some()
                && annotations.is_empty()
            {
                meta.remove("annotations");
            }
            let claim_spec = object_at(claim, "spec");
            claim_spec.insert("storageClassName".to_string(), Value::from(class.as_str()));
            let requests = object_at(object_at(claim_spec, "resources"), "requests");
            requests.insert("storage".to_string(), Value::from(size.0.as_str()));
        }
    }
    Manifest::from_raw(Value::Object(obj))
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

    fn change(template: &str, class: &str, size: &str) -> Vec<TemplateChange> {
        vec![TemplateChange {
            template: template.to_string(),
            class: class.to_string(),
            size: Quantity(size.to_string()),
        }]
    }
    use crate::build::{stash_decode, stash_encode, testdata};

    fn policy(deleted: &str, scaled: &str) -> StatefulSetPersistentVolumeClaimRetentionPolicy {
        StatefulSetPersistentVolumeClaimRetentionPolicy {
            when_deleted: Some(deleted.to_string()),
            when_scaled: Some(scaled.to_string()),
        }
    }

    #[test]
    fn recreated_statefulset_snapshot() {
        let stashed = testdata::statefulset_manifest();
        let sts = recreated_statefulset(
            &stashed,
            &change("data", "fast", "1Gi"),
            Some(policy("Delete", "Retain")),
        )
        .unwrap();
        insta::assert_yaml_snapshot!(sts);
    }

    #[test]
    fn recreated_statefulset_keeps_the_template_byte_for_byte() {
        let stashed = testdata::statefulset_manifest();
        let sts = recreated_statefulset(&stashed, &change("data", "fast", "256Mi"), None).unwrap();
        let (old, new) = (stashed.raw(), sts.raw());
        for field in [
            "template",
            "selector",
            "serviceName",
            "replicas",
            "updateStrategy",
            "podManagementPolicy",
            "revisionHistoryLimit",
        ] {
            assert_eq!(new["spec"][field], old["spec"][field], "spec.{field}");
        }
        assert_eq!(
            new["spec"]["template"]["metadata"]["creationTimestamp"],
            Value::Null,
            "kept as the server returned it"
        );
        assert!(new["spec"].get(RETENTION_FIELD).is_none());

        let typed = sts.spec.clone().unwrap();
        let templates = typed.volume_claim_templates.unwrap();
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
        let old_data = &old["spec"]["volumeClaimTemplates"][0];
        let new_data = &new["spec"]["volumeClaimTemplates"][0];
        assert_eq!(
            new_data["metadata"]["labels"],
            old_data["metadata"]["labels"]
        );
        assert_eq!(new_data["status"], old_data["status"]);
        assert_eq!(
            new_data["spec"]["accessModes"],
            old_data["spec"]["accessModes"]
        );
        // The other template is untouched.
        assert_eq!(
            new["spec"]["volumeClaimTemplates"][1],
            old["spec"]["volumeClaimTemplates"][1]
        );

        let meta = &sts.metadata;
        assert!(meta.uid.is_none() && meta.resource_version.is_none());
        assert!(meta.creation_timestamp.is_none() && meta.managed_fields.is_none());
        assert!(meta.generation.is_none());
        assert_eq!(new["metadata"]["labels"], old["metadata"]["labels"]);
        assert_eq!(
            new["metadata"]["annotations"],
            old["metadata"]["annotations"]
        );
        assert!(new.get("status").is_none());
    }

    /// A field of a newer API (unknown to k8s-openapi) in the pod template, in a container and
    /// in a volume mount survives stash encode → decode → recreation: the template is the
    /// original's, value for value.
    #[test]
    fn unknown_template_fields_survive_the_stash_and_the_recreation() {
        let live =
            testdata::with_future_fields(&testdata::statefulset_manifest(), "/spec/template/spec");
        let mut raw = live.raw().clone();
        let meta = raw["metadata"].as_object_mut().unwrap();
        meta.insert("futureMetaField".into(), json!("m"));
        raw["spec"]
            .as_object_mut()
            .unwrap()
            .insert("futureSetField".into(), json!(7));
        let live: Manifest<StatefulSet> = Manifest::from_raw(raw).unwrap();
        // The typed view does not see them: a typed round trip would lose them.
        let typed = serde_json::to_value(live.typed()).unwrap();
        assert!(
            typed["spec"]["template"]["spec"]
                .get("someFutureField")
                .is_none()
        );

        let stashed: Manifest<StatefulSet> = stash_decode(&stash_encode(&live).unwrap()).unwrap();
        assert_eq!(stashed, live);
        let sts = recreated_statefulset(
            &stashed,
            &change("data", "fast", "2Gi"),
            Some(policy("Delete", "Retain")),
        )
        .unwrap();
        let new = sts.raw();
        assert_eq!(new["spec"]["template"], live.raw()["spec"]["template"]);
        assert_eq!(
            new["spec"]["template"]["spec"]["someFutureField"],
            json!({"x": 1})
        );
        assert_eq!(
            new["spec"]["template"]["spec"]["containers"][0]["futureContainerField"],
            json!(["a", {"b": true}])
        );
        assert_eq!(new["metadata"]["futureMetaField"], json!("m"));
        assert_eq!(new["spec"]["futureSetField"], json!(7));
        // And what goes to the API server is that JSON.
        let body: Value = serde_json::from_slice(&serde_json::to_vec(&sts).unwrap()).unwrap();
        assert_eq!(&body, new);
    }

    #[test]
    fn recreated_statefulset_drops_gc_finalizers_only() {
        let mut raw = testdata::statefulset_manifest().into_raw();
        raw["metadata"]["finalizers"] = json!(["orphan", "example.com/keep"]);
        let stashed = Manifest::from_raw(raw).unwrap();
        let sts = recreated_statefulset(&stashed, &change("data", "fast", "1Gi"), None).unwrap();
        assert_eq!(
            sts.metadata.finalizers,
            Some(vec!["example.com/keep".to_string()])
        );

        let mut raw = testdata::statefulset_manifest().into_raw();
        raw["metadata"]["finalizers"] = json!(["orphan", "foregroundDeletion"]);
        let stashed = Manifest::from_raw(raw).unwrap();
        let sts = recreated_statefulset(&stashed, &change("data", "fast", "1Gi"), None).unwrap();
        assert!(sts.raw()["metadata"].get("finalizers").is_none());
    }

    #[test]
    fn unknown_template_changes_nothing_but_retention() {
        let stashed = testdata::statefulset_manifest();
        let sts = recreated_statefulset(&stashed, &change("nope", "fast", "1Gi"), None).unwrap();
        assert_eq!(
            sts.raw()["spec"]["volumeClaimTemplates"],
            stashed.raw()["spec"]["volumeClaimTemplates"]
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
        let stashed = testdata::statefulset_manifest();
        let recorded = original_retention_policy(&stashed);
        let restored = parse_retention_policy(&recorded).unwrap();
        let sts =
            recreated_statefulset(&stashed, &change("data", "fast", "1Gi"), restored).unwrap();
        assert_eq!(
            sts.spec
                .clone()
                .unwrap()
                .persistent_volume_claim_retention_policy,
            stashed
                .spec
                .clone()
                .unwrap()
                .persistent_volume_claim_retention_policy
        );
    }
}
