//! JSON merge patch bodies for PersistentVolumes (send each as `Patch::Merge`).

use serde_json::{Value, json};

use crate::labels::MIGRATED_BY_LABEL;

/// Sets a PV's `persistentVolumeReclaimPolicy` (`Retain`, `Delete`).
///
/// Why: a dynamically provisioned volume usually has `Delete`, so deleting its claim deletes the
/// data. Both volumes are set to `Retain` before either claim is deleted (their original
/// policies recorded in the member's status first), and the policy is restored or applied
/// only once the request is over.
pub fn reclaim_policy_patch(policy: &str) -> Value {
    json!({ "spec": { "persistentVolumeReclaimPolicy": policy } })
}

/// Points a PV's `claimRef` at claim `namespace/claim`, with no uid or resourceVersion.
///
/// Why: once its (temporary) claim is deleted, a PV stays `Released` with a claimRef carrying
/// the deleted claim's uid and binds nothing. A claimRef with only namespace and name reserves
/// the volume for the claim about to be recreated under that name (pre-binding; together with
/// the claim's `spec.volumeName`, see [`super::swapped_claim`]). A merge patch merges into the
/// existing claimRef, so the stale `uid`, `resourceVersion` and `fieldPath` are removed with
/// explicit nulls.
pub fn claim_ref_patch(namespace: &str, claim: &str) -> Value {
    json!({
        "spec": {
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": namespace,
                "name": claim,
                "uid": null,
                "resourceVersion": null,
                "fieldPath": null,
            }
        }
    })
}

/// Labels an old PV `storagemigrator.io/migrated-by=<request>` at the end of a successful
/// request, so a human (or a `Retain` policy's later clean-up) can find what was left behind.
pub fn migrated_by_label_patch(req_name: &str) -> Value {
    json!({ "metadata": { "labels": { MIGRATED_BY_LABEL: req_name } } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_patches() {
        insta::assert_yaml_snapshot!(
            "volume_patches",
            json!({
                "retain": reclaim_policy_patch("Retain"),
                "claimRef": claim_ref_patch("demo", "data-etcd-1"),
                "migratedBy": migrated_by_label_patch("etcd-to-fast"),
            })
        );
    }

    #[test]
    fn claim_ref_patch_clears_the_stale_binding() {
        // Applying the merge patch (RFC 7386) to a Released PV's claimRef leaves only the name.
        let mut claim_ref = json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "demo",
            "name": "data-etcd-1-smr-abc123", "uid": "1234", "resourceVersion": "99"
        });
        let patch = claim_ref_patch("demo", "data-etcd-1");
        merge(&mut claim_ref, &patch["spec"]["claimRef"]);
        assert_eq!(
            claim_ref,
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "demo",
                   "name": "data-etcd-1"})
        );
    }

    /// RFC 7386 JSON merge patch.
    fn merge(target: &mut Value, patch: &Value) {
        if let Value::Object(p) = patch {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        } else {
            *target = patch.clone();
        }
    }
}
