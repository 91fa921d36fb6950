//! One pure function per object the operator creates or rewrites, and the patch bodies it sends.
//!
//! Nothing here does I/O: every function takes what the planner observed and returns an object
//! (or a JSON patch body) for the cluster layer to send. Each builder's rustdoc says which
//! Kubernetes pitfall its shape avoids (a lost field, an empty volume, a stuck deletion), because
//! most of these shapes exist only to avoid one:
//!
//! - [`names`]: deterministic, DNS-1123, ≤63-character names for everything we create.
//! - [`claim`]: the temporary claim, the claim recreated on the new volume, claim ownerReference
//!   clean-up.
//! - [`pod`]: the WaitForFirstConsumer mounter pod and the member pod recreated from its stash.
//! - [`mod@job`]: the measure / pre-copy / copy / verify Jobs and their one-line JSON results.
//! - [`security`]: the security contexts of the Jobs' and mounter pods (least capabilities).
//! - [`statefulset`]: the recreated StatefulSet and the retention-policy protection patches.
//! - [`volume`]: patch bodies for PersistentVolumes (reclaim policy, claimRef, labels).
//! - [`stash`]: gzip+base64 encoding of stashed manifests, the stash ConfigMap and its size
//!   budget.
//! - [`manifest`]: [`Manifest`], an object's raw JSON as the API server returned it with its
//!   typed view; the StatefulSet and member pods are stashed, edited and recreated as raw JSON
//!   so that fields our API structs do not know survive.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use crate::api::StorageMigrationRequest;
use crate::labels::{self, MEMBER_LABEL};

pub mod claim;
pub mod job;
pub mod manifest;
pub mod names;
pub mod pod;
pub mod progress;
pub mod security;
pub mod stash;
pub mod statefulset;
pub mod volume;

pub use claim::{
    claim_owner_references_patch, is_adoption_ref, is_statefulset_or_pod_ref, kept_metadata,
    swapped_claim, temp_claim,
};
pub use job::{
    AttributesCompared, CopyMode, FsReport, JobFailureCause, JobKind, JobResult, Pass,
    SourceContents, Verification, copy_memory, job, parse_job_result,
};
pub use manifest::Manifest;
pub use names::{
    is_dns1123_label, job_name, mounter_name, stash_config_map_name, stash_key, temp_claim_name,
};
pub use pod::{mounter_pod, recreated_pod};
pub use progress::parse_progress;
pub use stash::{
    STASH_BUDGET, data_size, stash_config_map, stash_decode, stash_encode, stash_fits,
};
pub use statefulset::{
    TemplateChange, original_retention_policy, parse_retention_policy, protected_retention_policy,
    recreated_statefulset, retention_needs_protection,
};
pub use volume::{claim_ref_patch, migrated_by_label_patch, reclaim_policy_patch};

/// Errors of the pure builders (only decoding can fail: building never does).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("job result {message:?} is not the expected one-line JSON: {reason}")]
    JobResult { message: String, reason: String },
    #[error("stash cannot be encoded: {0}")]
    StashEncode(String),
    #[error("stash cannot be decoded: {0}")]
    StashDecode(String),
    #[error("stored retention policy {value:?} cannot be read: {reason}")]
    RetentionPolicy { value: String, reason: String },
    #[error("{kind} manifest cannot be read: {reason}")]
    Manifest { kind: &'static str, reason: String },
}

/// Name of the request, or empty for a request without one (only in hand-made tests).
fn req_name(req: &StorageMigrationRequest) -> String {
    req.metadata.name.clone().unwrap_or_default()
}

/// The labels of an object created for one member: [`labels::owned_labels`] plus [`MEMBER_LABEL`].
pub fn member_labels(req_name: &str, pod: &str) -> BTreeMap<String, String> {
    let mut labels = labels::owned_labels(req_name);
    labels.insert(MEMBER_LABEL.to_string(), pod.to_string());
    labels
}

/// The controller ownerReference to the request, when it has a uid (always, once stored).
///
/// Why: the mounter pod and the Jobs are disposable and must disappear with the request even if
/// the operator never gets to clean them up. `blockOwnerDeletion` keeps a foreground deletion of
/// the request from finishing while they still run. Claims never get one (see
/// [`claim::temp_claim`]).
fn owner_references(req: &StorageMigrationRequest) -> Option<Vec<OwnerReference>> {
    req.controller_owner_ref(&()).map(|r| {
        vec![OwnerReference {
            block_owner_deletion: Some(true),
            ..r
        }]
    })
}

/// Metadata of an object created for one member of `req`.
fn member_meta(req: &StorageMigrationRequest, name: String, pod: &str, owned: bool) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: req.namespace(),
        labels: Some(member_labels(&req_name(req), pod)),
        owner_references: if owned { owner_references(req) } else { None },
        ..Default::default()
    }
}

/// Required node affinity to exactly the node named `node`, matched on the Node's
/// `metadata.name` (`matchFields`, as the DaemonSet controller does).
///
/// Why: `spec.nodeName` bypasses the scheduler, so a WaitForFirstConsumer claim would never get
/// its `volume.kubernetes.io/selected-node` and stay Pending; going through the scheduler also
/// lets it honour the volumes' node affinity. `matchFields` on the name rather than
/// `matchExpressions` on [`labels::HOSTNAME_LABEL`]: the hostname label is not the node name on
/// every cloud (e.g. AWS names nodes `ip-….ec2.internal`, labels them `ip-…`), while the member's
/// node is known by name (`pod.spec.nodeName`).
pub fn pinned_to_node(node: &str) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".to_string(),
                        operator: "In".to_string(),
                        values: Some(vec![node.to_string()]),
                    }]),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Seconds a helper pod stays on a node that stopped answering (taints
/// `node.kubernetes.io/unreachable` and `not-ready`, effect NoExecute) before the taint manager
/// deletes it; its member then fails within `--helper-start-timeout` (see `plan::helpers`).
pub const NODE_GONE_TOLERATION_SECONDS: i64 = 60;

/// Tolerate every taint, but leave a node that stopped answering after
/// [`NODE_GONE_TOLERATION_SECONDS`].
///
/// Why every taint: our helper pods must run on the member's node and nowhere else (node
/// affinity pins them), and that node may carry taints that the workload tolerates (dedicated
/// database nodes); without tolerating them the pod would stay Pending until the request times
/// out. Why not forever on a dead node: a copy pod there would look Running until the request's
/// deadline. The taint manager applies, per taint, the first toleration that matches it, so the
/// two bounded ones come before the catch-all.
fn tolerate_all() -> Vec<Toleration> {
    let gone = |key: &str| Toleration {
        key: Some(key.to_string()),
        operator: Some("Exists".to_string()),
        effect: Some("NoExecute".to_string()),
        toleration_seconds: Some(NODE_GONE_TOLERATION_SECONDS),
        ..Default::default()
    };
    vec![
        gone("node.kubernetes.io/unreachable"),
        gone("node.kubernetes.io/not-ready"),
        Toleration {
            operator: Some("Exists".to_string()),
            ..Default::default()
        },
    ]
}

#[cfg(test)]
pub(crate) mod testdata;
