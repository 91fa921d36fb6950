//! What the planner asks of the cluster: a [`Decision`] of [`Action`]s, run in order.
//!
//! Each [`Action`] variant's doc comment is its contract. Two parties honour it: the cluster
//! layer (`crate::cluster`, the real API server) and the planner's simulator
//! (`plan::fixtures::Sim`); both are tested against the same contract. Common to every action:
//! - the cluster layer runs a decision's actions in order and stops at the first error; the
//!   next reconcile gathers a fresh snapshot and decides again;
//! - every action is idempotent: running it twice, or after a crash halfway through, leaves the
//!   cluster as running it once does. A create that finds an object of that name and a delete or
//!   patch that finds nothing are successes;
//! - objects are in the request's namespace, except volumes (cluster-scoped).

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::ResourceExt;

use crate::api::StorageMigrationRequestStatus;
use crate::build::Manifest;

/// What one reconcile decided: actions to run in order, and when to look again.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub actions: Vec<Action>,
    pub requeue: Duration,
}

impl Decision {
    pub fn wait(requeue: Duration) -> Self {
        Self {
            actions: Vec::new(),
            requeue,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// An object the operator creates. Pods and StatefulSets are created from their raw JSON (a
/// recreated member pod or StatefulSet carries fields our API structs may not know).
#[derive(Debug, Clone, PartialEq)]
pub enum Object {
    Claim(Box<PersistentVolumeClaim>),
    Pod(Box<Manifest<Pod>>),
    Job(Box<Job>),
    StatefulSet(Box<Manifest<StatefulSet>>),
    ConfigMap(Box<ConfigMap>),
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Object::Claim(_) => Kind::Claim,
            Object::Pod(_) => Kind::Pod,
            Object::Job(_) => Kind::Job,
            Object::StatefulSet(_) => Kind::StatefulSet,
            Object::ConfigMap(_) => Kind::ConfigMap,
        }
    }
    pub fn name(&self) -> String {
        match self {
            Object::Claim(o) => o.name_any(),
            Object::Pod(o) => o.name_any(),
            Object::Job(o) => o.name_any(),
            Object::StatefulSet(o) => o.name_any(),
            Object::ConfigMap(o) => o.name_any(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Claim,
    Pod,
    Job,
    StatefulSet,
    ConfigMap,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    Background,
    Orphan,
}

/// One idempotent operation on the cluster; each variant's doc comment is its contract.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Write the request's status (always the first action when the status changes).
    ///
    /// - Precondition: the request exists (a missing request is an error).
    /// - Success: the status subresource holds this status, written by server-side apply with
    ///   the operator's field manager (forced), so fields written by others are kept.
    /// - Idempotent: writing the same status again changes nothing.
    SetStatus(Box<StorageMigrationRequestStatus>),
    /// Add the operator's finalizer to the request.
    ///
    /// - Success: the request (re-read first) lists the finalizer once.
    /// - Idempotent: a request that has it already, or that is gone, is left alone.
    /// - The write carries the re-read resourceVersion: a concurrent change of the request
    ///   fails it (retried on the next reconcile) instead of being overwritten.
    AddFinalizer,
    /// Remove the operator's finalizer from the request.
    ///
    /// - Success: the request (re-read first) no longer lists it; other finalizers are kept.
    /// - Idempotent: a request without it, or that is gone, is left alone.
    /// - The write carries the re-read resourceVersion, as for [`Action::AddFinalizer`].
    RemoveFinalizer,
    /// Publish a Kubernetes Event on the request and log the message.
    ///
    /// - Never fails: an Event that cannot be published is logged and dropped.
    /// - Not deduplicated: the planner emits an Event only with the change it reports.
    Event {
        type_: EventType,
        reason: String,
        message: String,
    },
    /// Store an encoded manifest (see `build::stash_encode`) under `key` of the request's
    /// stash ConfigMap `config_map` (created beforehand by a [`Action::Create`] of
    /// `build::stash_config_map`).
    ///
    /// - Precondition: the ConfigMap exists and its `storagemigrator.io/request-uid` label is
    ///   the request's uid; else an error, nothing is written (never another request's stash).
    /// - Success: its data `key` is `value`; other keys are kept. The write carries the
    ///   resourceVersion read with the label check: a concurrent change fails it (retried on the
    ///   next reconcile).
    /// - Idempotent: storing the same value again changes nothing.
    Stash {
        config_map: String,
        key: String,
        value: String,
    },
    /// Create an object.
    ///
    /// - Success: an object of that name exists. An existing object (409 AlreadyExists) is a
    ///   success and is left as it is: nothing is compared or updated. Except for a
    ///   StatefulSet: a set of that name may be one that someone else created, so a 409 is an
    ///   error (transient); the next decision tells the operator's own set (by its
    ///   `created-by-request` annotation and recorded uid) from a foreign one.
    /// - Pods and StatefulSets are sent as their raw JSON, unknown fields included.
    /// - Test builds only (feature `failpoints`): the failpoint `copy-job-fails` replaces a
    ///   copy Job's script by one that fails (see `crate::failpoints`).
    Create(Object),
    /// Delete an object with this propagation policy.
    ///
    /// - `uid`: when set, sent as the delete's uid precondition, so that a successor created
    ///   under the same name (another uid) is never deleted; a failed precondition (409) is a
    ///   success: the object the planner meant is gone.
    /// - `resource_version`: when set, sent as the delete's resourceVersion precondition (with
    ///   `uid`), so that an object changed since the planner saw it is not deleted. A failed
    ///   precondition (409) is then an error (transient): the object may have changed, and the
    ///   next reconcile looks at it again.
    /// - Success: the deletion was accepted (the object may linger while terminating), or the
    ///   object does not exist (404).
    /// - `Orphan` leaves the object's dependents (a StatefulSet's pods) running, with the
    ///   ownerReference to it removed.
    Delete {
        kind: Kind,
        name: String,
        propagation: Propagation,
        uid: Option<String>,
        resource_version: Option<String>,
    },
    /// Force-delete a pod (grace period 0), as Kubernetes' pod garbage collector does for a pod
    /// whose node is gone and for a terminated pod: the planner asks for it only for a member pod
    /// that is already terminating past its grace period on a node that is NotReady, Unknown or
    /// gone, and then only when the Node is gone, tainted `node.kubernetes.io/out-of-service`,
    /// or the request sets `spec.forceDeleteOnLostNode` (see `plan::helpers::lost_pod` and
    /// `LostPod::force`), for our own helper pods stuck the same way, and for those that have
    /// finished (`Succeeded`, `Failed`: every container has exited) and name a claim being swapped.
    ///
    /// - `uid`: sent as the delete's uid precondition, so that a successor of the same name is
    ///   never deleted; a failed precondition (409) is a success.
    /// - Success: the API server removed the pod object (the kubelet's confirmation is not
    ///   awaited), or it does not exist (404).
    ForceDeletePod { name: String, uid: Option<String> },
    /// Set a volume's `persistentVolumeReclaimPolicy` (`Retain` or `Delete`).
    ///
    /// - Success: the volume has that policy; a missing volume (404) is a success.
    /// - Idempotent: a merge patch of one field.
    PatchReclaimPolicy { volume: String, policy: String },
    /// Point a volume's claimRef at `namespace/claim` (the request's namespace), with the
    /// stale `uid`, `resourceVersion` and `fieldPath` removed, so that it binds to the claim
    /// about to be (re)created under that name.
    ///
    /// - Success: the claimRef names that claim and carries no uid; a missing volume (404) is
    ///   a success.
    /// - Idempotent: a merge patch.
    SetClaimRef { volume: String, claim: String },
    /// Remove from a claim the ownerReferences whose uid is one of `uids`.
    ///
    /// The planner lists the StatefulSet and pod references it saw on the claim; the next
    /// decision looks at the claim again and lists any that are still (or newly) there.
    /// - Success: the claim (re-read first) has none of these references; every other
    ///   reference is kept, whatever its kind.
    /// - Idempotent: a claim that has none of them, or that is gone, is left alone.
    /// - The write carries the re-read resourceVersion: a concurrent change of the claim fails
    ///   it (retried on the next reconcile) instead of being overwritten.
    RemoveOwnerReferences { claim: String, uids: Vec<String> },
    /// Set the StatefulSet's `persistentVolumeClaimRetentionPolicy` (JSON of the policy,
    /// `null` to remove it).
    ///
    /// - Precondition: `policy` is valid JSON (else an error, nothing is sent).
    /// - Success: the set has that policy; a missing set (404) is a success.
    /// - Idempotent: a merge patch of one field.
    PatchRetentionPolicy {
        stateful_set: String,
        policy: String,
    },
    /// Scale a Deployment to `replicas` through its `scale` subresource (as `kubectl scale`
    /// does): its template is never changed.
    ///
    /// - Precondition: the Deployment's resourceVersion is still `resource_version`: one
    ///   changed since the snapshot is a conflict (retried on the next reconcile), never
    ///   overwritten.
    /// - Success: `spec.replicas` is `replicas`.
    /// - Idempotent: a merge patch of one field.
    ScaleDeployment {
        deployment: String,
        replicas: i32,
        resource_version: Option<String>,
    },
    /// Hand the database's leadership from one member to another (etcd MoveLeader).
    ///
    /// - Precondition: the snapshot has an engine and a health report (else an error).
    /// - Success: the engine accepted the transfer; the next snapshot's health report shows
    ///   the new leader.
    TransferLeadership { from: String, to: String },
    /// Label a volume `storagemigrator.io/migrated-by=<request>`.
    ///
    /// - Success: the volume carries the label; other labels are kept; a missing volume (404)
    ///   is a success.
    /// - Idempotent: a merge patch.
    LabelVolume { volume: String },
    /// Set (or with `None` remove) one annotation of a claim.
    ///
    /// - Success: the claim's annotation `key` is `value` (or absent); other annotations are
    ///   kept; a missing claim (404) is a success.
    /// - Idempotent: a merge patch.
    AnnotateClaim {
        claim: String,
        key: String,
        value: Option<String>,
    },
}

impl Action {
    /// A short name for logs and failpoints (`Create-Job`, `Delete-Pod`, `SetStatus`, ...).
    pub fn name(&self) -> String {
        match self {
            Action::SetStatus(_) => "SetStatus".into(),
            Action::AddFinalizer => "AddFinalizer".into(),
            Action::RemoveFinalizer => "RemoveFinalizer".into(),
            Action::Event { .. } => "Event".into(),
            Action::Stash { .. } => "Stash".into(),
            Action::Create(o) => format!("Create-{:?}", o.kind()),
            Action::Delete { kind, .. } => format!("Delete-{kind:?}"),
            Action::ForceDeletePod { .. } => "ForceDeletePod".into(),
            Action::PatchReclaimPolicy { .. } => "PatchReclaimPolicy".into(),
            Action::SetClaimRef { .. } => "SetClaimRef".into(),
            Action::RemoveOwnerReferences { .. } => "RemoveOwnerReferences".into(),
            Action::PatchRetentionPolicy { .. } => "PatchRetentionPolicy".into(),
            Action::ScaleDeployment { .. } => "ScaleDeployment".into(),
            Action::TransferLeadership { .. } => "TransferLeadership".into(),
            Action::LabelVolume { .. } => "LabelVolume".into(),
            Action::AnnotateClaim { .. } => "AnnotateClaim".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn action_names_name_the_kind_of_creates_and_deletes() {
        let job = Action::Create(Object::Job(Box::default()));
        assert_eq!(job.name(), "Create-Job");
        let delete = Action::Delete {
            kind: Kind::Claim,
            name: "data-etcd-0".into(),
            propagation: Propagation::Background,
            uid: None,
            resource_version: None,
        };
        assert_eq!(delete.name(), "Delete-Claim");
        assert_eq!(Action::SetStatus(Box::default()).name(), "SetStatus");
        let refs = Action::RemoveOwnerReferences {
            claim: "c".into(),
            uids: vec![],
        };
        assert_eq!(refs.name(), "RemoveOwnerReferences");
    }
}

/// Cases of the contracts that both the simulator and the cluster layer are tested against.
#[cfg(test)]
pub(crate) mod contract {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    /// One case of [`super::Action::RemoveOwnerReferences`] on an existing claim.
    pub struct RemoveOwnerReferencesCase {
        pub name: &'static str,
        /// The claim's ownerReferences when the action runs.
        pub before: Vec<OwnerReference>,
        pub uids: Vec<String>,
        /// Its ownerReferences afterwards; `None` when nothing is written.
        pub after: Option<Vec<OwnerReference>>,
    }

    pub fn owner(kind: &str, api_version: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: format!("owner-{uid}"),
            uid: uid.into(),
            ..Default::default()
        }
    }

    pub fn remove_owner_references_cases() -> Vec<RemoveOwnerReferencesCase> {
        let set = owner("StatefulSet", "apps/v1", "uid-set");
        let pod = owner("Pod", "v1", "uid-pod");
        let other = owner("Backup", "example.com/v1", "uid-backup");
        let successor = owner("StatefulSet", "apps/v1", "uid-set-2");
        let uids = |u: &[&str]| u.iter().map(|s| s.to_string()).collect();
        vec![
            RemoveOwnerReferencesCase {
                name: "the listed set and pod references go, another kind stays",
                before: vec![set.clone(), pod.clone(), other.clone()],
                uids: uids(&["uid-set", "uid-pod"]),
                after: Some(vec![other.clone()]),
            },
            RemoveOwnerReferencesCase {
                name: "a StatefulSet reference not listed stays",
                before: vec![set.clone(), successor.clone()],
                uids: uids(&["uid-set"]),
                after: Some(vec![successor]),
            },
            RemoveOwnerReferencesCase {
                name: "the last reference goes",
                before: vec![pod],
                uids: uids(&["uid-pod"]),
                after: Some(vec![]),
            },
            RemoveOwnerReferencesCase {
                name: "none of the listed uids: nothing is written",
                before: vec![set, other],
                uids: uids(&["uid-gone"]),
                after: None,
            },
        ]
    }
}
