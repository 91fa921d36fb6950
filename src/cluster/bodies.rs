//! The bodies the executor sends (pure): patches, the status to apply, Events. Each is built
//! from the action and, where the action says so, the object as just re-read.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::runtime::events::{Event, EventType as KubeEventType};
use serde_json::{Value, json};

use super::error::ClusterError;
use crate::api::{StorageMigrationRequest, StorageMigrationRequestStatus};
use crate::labels;
use crate::plan::EventType;

/// The server-side apply body of a status write.
pub fn status_body(status: &StorageMigrationRequestStatus) -> Value {
    json!({
        "apiVersion": "storagemigrator.io/v1alpha1",
        "kind": "StorageMigrationRequest",
        "status": status,
    })
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
