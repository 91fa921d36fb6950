//! The bodies the executor sends (pure): patches, the status to apply, Events. Each is built
//! from the action and, where the action says so, the object as just re-read.

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::runtime::events::{Event, EventType as KubeEventType};
use serde_json::{Value, json};

use super::error::ClusterError;
use crate::api::{StorageMigrationRequest, StorageMigrationRequestStatus};
use crate::labels;
use crate::plan::EventType;

/// The server-side apply body of a status write, carrying the `resourceVersion` of the request
/// the decision was made from: the API server applies it only while the request is still at that
/// version, and answers 409 Conflict when anything changed it since (another replica's status
/// write, an edit of the spec or metadata), so a write decided on a stale view is refused.
pub fn status_body(
    status: &StorageMigrationRequestStatus,
    resource_version: Option<&str>,
) -> Value {
    let mut body = json!({
        "apiVersion": "storagemigrator.io/v1alpha1",
        "kind": "StorageMigrationRequest",
        "status": status,
    });
    if let Some(rv) = resource_version {
        body["metadata"] = json!({ "resourceVersion": rv });
    }
    body
}

/// The merge patch that adds (`present`) or removes the operator's finalizer of `current`,
/// with its resourceVersion (a concurrent change makes it fail with 409); `None` when there is
/// nothing to change.
pub fn finalizer_patch(current: &StorageMigrationRequest, present: bool) -> Option<Value> {
    let mut finalizers = current.finalizers().to_vec();
    let has = finalizers.iter().any(|f| f == labels::FINALIZER);
    match (present, has) {
        (true, false) => finalizers.push(labels::FINALIZER.into()),
        (false, true) => finalizers.retain(|f| f != labels::FINALIZER),
        _ => return None,
    }
    Some(json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": current.resource_version(),
    }}))
}

/// The merge patch that removes from `claim` the ownerReferences whose uid is in `uids`,
/// keeping every other one; `None` when it has none of them.
///
/// A merge patch replaces the whole list, so the kept references are listed (`null` when none
/// is left), and `metadata.resourceVersion` is included so that a concurrent change to the
/// claim makes the patch fail with 409 (re-read and rebuild) instead of dropping that change.
pub fn owner_references_patch(claim: &PersistentVolumeClaim, uids: &[String]) -> Option<Value> {
    let refs = claim.owner_references();
    if !refs.iter().any(|r| uids.contains(&r.uid)) {
        return None;
    }
    let kept: Vec<_> = refs.iter().filter(|r| !uids.contains(&r.uid)).collect();
    let mut metadata =
        json!({ "ownerReferences": if kept.is_empty() { Value::Null } else { json!(kept) } });
    if let Some(rv) = &claim.metadata.resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    Some(json!({ "metadata": metadata }))
}

/// The merge patch that sets a StatefulSet's retention policy (`policy`: JSON of the policy,
/// `null` to remove it).
pub fn retention_policy_patch(policy: &str) -> Result<Value, ClusterError> {
    let policy: Value = serde_json::from_str(policy).map_err(|e| ClusterError::Invalid {
        what: "retention policy".into(),
        reason: e.to_string(),
    })?;
    Ok(json!({"spec": {"persistentVolumeClaimRetentionPolicy": policy}}))
}

/// The merge patch that sets `key` of the stash ConfigMap `current` to `value`, with its
/// resourceVersion (a concurrent change makes it fail with 409). An error (its reason) when
/// there is no such ConfigMap, or when its `storagemigrator.io/request-uid` label is not
/// `request_uid`: another request's stash is never written.
pub fn stash_patch(
    current: Option<&ConfigMap>,
    request_uid: Option<&str>,
    key: &str,
    value: &str,
) -> Result<Value, String> {
    let Some(cm) = current else {
        return Err("it does not exist".into());
    };
    let label = cm
        .labels()
        .get(labels::REQUEST_UID_LABEL)
        .map(String::as_str);
    if request_uid.is_none() || label != request_uid {
        return Err(format!(
            "its {} label is {label:?}, not the request's uid {request_uid:?}",
            labels::REQUEST_UID_LABEL
        ));
    }
    Ok(json!({
        "metadata": {"resourceVersion": cm.resource_version()},
        "data": {key: value},
    }))
}

/// The merge patch of a `scale` subresource to `replicas`; with a resourceVersion, the API
/// server refuses it (409) when the object changed since.
pub fn scale_patch(replicas: i32, resource_version: Option<&str>) -> Value {
    match resource_version {
        Some(rv) => json!({"metadata": {"resourceVersion": rv}, "spec": {"replicas": replicas}}),
        None => json!({"spec": {"replicas": replicas}}),
    }
}

/// The merge patch that sets (or with `None` removes) one annotation.
pub fn annotation_patch(key: &str, value: Option<&str>) -> Value {
    json!({"metadata": {"annotations": {key: value}}})
}

/// The Event of an [`crate::plan::Action::Event`]. The recorder folds events with the same
/// action and reason into one series; the message tells members apart, so a hash of it goes
/// into the action. The note is cut to 1000 characters.
pub fn event(type_: EventType, reason: &str, message: &str) -> Event {
    Event {
        type_: match type_ {
            EventType::Normal => KubeEventType::Normal,
            EventType::Warning => KubeEventType::Warning,
        },
        reason: reason.to_string(),
        note: Some(message.chars().take(1000).collect()),
        action: format!("{reason}-{:08x}", fnv(message)),
        secondary: None,
    }
}

/// FNV-1a, 32 bits.
fn fnv(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::action::contract::owner;
    use crate::plan::fixtures;

    #[test]
    fn owner_references_patch_removes_exactly_the_listed_uids() {
        let mut claim = fixtures::bound_claim("data-etcd-0", "standard", "1Gi", "pv-old-0");
        claim.metadata.resource_version = Some("42".into());
        let set = owner("StatefulSet", "apps/v1", "uid-set");
        let pod = owner("Pod", "v1", "uid-pod");
        let other = owner("Backup", "example.com/v1", "uid-backup");
        claim.metadata.owner_references = Some(vec![set.clone(), pod.clone(), other.clone()]);
        let patch = owner_references_patch(&claim, &["uid-set".into()]).unwrap();
        assert_eq!(
            patch,
            json!({"metadata": {
                "ownerReferences": [pod, other],
                "resourceVersion": "42",
            }})
        );
        let all = ["uid-set".to_string(), "uid-pod".into(), "uid-backup".into()];
        let patch = owner_references_patch(&claim, &all).unwrap();
        assert_eq!(patch["metadata"]["ownerReferences"], Value::Null);
        assert_eq!(owner_references_patch(&claim, &["uid-gone".into()]), None);
        claim.metadata.owner_references = None;
        assert_eq!(owner_references_patch(&claim, &["uid-set".into()]), None);
    }

    #[test]
    fn stash_patch_writes_only_the_requests_own_config_map() {
        let mut cm = ConfigMap::default();
        cm.metadata.resource_version = Some("7".into());
        cm.metadata.labels = Some(labels::stash_labels("move", "uid-1"));
        let patch = stash_patch(Some(&cm), Some("uid-1"), "pod-etcd-0", "H4sI").unwrap();
        assert_eq!(
            patch,
            json!({"metadata": {"resourceVersion": "7"}, "data": {"pod-etcd-0": "H4sI"}})
        );
        // Another request's (an earlier one of the same name), unlabelled, or missing: refused.
        let e = stash_patch(Some(&cm), Some("uid-2"), "k", "v").unwrap_err();
        assert!(e.contains("uid-1") && e.contains("uid-2"), "{e}");
        assert!(stash_patch(Some(&cm), None, "k", "v").is_err());
        cm.metadata.labels = None;
        assert!(stash_patch(Some(&cm), Some("uid-1"), "k", "v").is_err());
        assert!(stash_patch(None, Some("uid-1"), "k", "v").is_err());
    }

    #[test]
    fn finalizer_patch_adds_or_removes_only_ours() {
        let mut req = fixtures::request(fixtures::spec_class_change("fast"));
        req.metadata.resource_version = Some("7".into());
        req.metadata.finalizers = Some(vec!["other".into()]);
        assert_eq!(
            finalizer_patch(&req, true),
            Some(json!({"metadata": {
                "finalizers": ["other", labels::FINALIZER],
                "resourceVersion": "7",
            }}))
        );
        assert_eq!(finalizer_patch(&req, false), None);
        req.metadata.finalizers = Some(vec![labels::FINALIZER.into(), "other".into()]);
        assert_eq!(finalizer_patch(&req, true), None);
        assert_eq!(
            finalizer_patch(&req, false).unwrap()["metadata"]["finalizers"],
            json!(["other"])
        );
    }

    #[test]
    fn retention_policy_patch_needs_json() {
        assert_eq!(
            retention_policy_patch("null").unwrap(),
            json!({"spec": {"persistentVolumeClaimRetentionPolicy": null}})
        );
        assert!(matches!(
            retention_policy_patch("{not json"),
            Err(ClusterError::Invalid { .. })
        ));
    }

    #[test]
    fn events_are_keyed_by_reason_and_message() {
        let long = "x".repeat(2000);
        let a = event(EventType::Warning, "RollingBack", &long);
        assert_eq!(a.type_, KubeEventType::Warning);
        assert_eq!(a.note.as_ref().map(String::len), Some(1000));
        let b = event(EventType::Normal, "RollingBack", "other");
        assert_ne!(a.action, b.action);
        assert!(b.action.starts_with("RollingBack-"));
        assert_eq!(
            b.action,
            event(EventType::Normal, "RollingBack", "other").action
        );
        assert_eq!(
            annotation_patch("k", None),
            json!({"metadata": {"annotations": {"k": null}}})
        );
    }
}
