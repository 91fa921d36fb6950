//! Every label, annotation, finalizer and field-manager name the operator reads or writes, in one
//! place. Names of our own start with [`GROUP`]; the others belong to Kubernetes and are listed
//! here so that a reader sees every key the operator depends on.

use std::collections::BTreeMap;

/// API group of every object this operator defines, and the prefix of its own keys.
pub const GROUP: &str = "storagemigrator.io";
/// Field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "storage-migrator";
/// `reportingController` of the operator's Events.
pub const EVENT_REPORTER: &str = "storage-migrator";
/// The Lease the replicas elect a leader on.
pub const LEASE_NAME: &str = "storage-migrator";

// ---- our own keys ------------------------------------------------------------------------------

/// Finalizer that lets a deleted, still progressing request roll back before it goes.
pub const FINALIZER: &str = "storagemigrator.io/finalizer";
/// Label naming the request on every object created for it (and on old PVs after success).
pub const REQUEST_LABEL: &str = "storagemigrator.io/request";
/// Label on every object created for one member (temporary claim, mounter pod, Jobs).
pub const MEMBER_LABEL: &str = "storagemigrator.io/member";
/// Label on the Jobs (and their pods) naming the `JobKind`.
pub const JOB_KIND_LABEL: &str = "storagemigrator.io/job-kind";
/// Label put on old PersistentVolumes once the request succeeded.
pub const MIGRATED_BY_LABEL: &str = "storagemigrator.io/migrated-by";
/// Label on the stash ConfigMap naming the uid of the request it belongs to (with
/// [`REQUEST_LABEL`] naming the request): a stash left by an earlier request of the same name is
/// never taken for this request's.
pub const REQUEST_UID_LABEL: &str = "storagemigrator.io/request-uid";
/// Key in the stash ConfigMap of the stashed StatefulSet.
pub const STASH_STATEFULSET_KEY: &str = "statefulset";
/// Prefix of the keys in the stash ConfigMap of stashed pods (the pod name follows).
pub const STASH_POD_KEY_PREFIX: &str = "pod-";
/// Prefix of the keys in the stash ConfigMap of stashed claims (the claim name follows).
pub const STASH_CLAIM_KEY_PREFIX: &str = "claim-";
/// Annotation written on a recreated claim that stays Pending, to make the PV controller look at
/// it again (value: unix seconds of the nudge); removed once the claim is bound.
pub const BIND_NUDGE_ANNOTATION: &str = "storagemigrator.io/bind-nudge";

/// True for a label or annotation key of our own ([`GROUP`]`/...`): bookkeeping of a request,
/// never carried to an object the operator recreates from a user's one (see
/// `build::swapped_claim`).
pub fn is_own_key(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(prefix, _)| prefix == GROUP)
}

/// Label `kubectl smr fleet` puts on the requests it writes (value:
/// `build::names::fleet_label_value`, `<from>-to-<to>`): `kubectl smr watch --all -l` follows
/// them, `kubectl get smr -l` lists them.
pub const FLEET_LABEL: &str = "storagemigrator.io/fleet";

/// Annotation a user (or `kubectl smr abort`) puts on a progressing request to have it rolled
/// back, like a timeout: any value asks for it (the plugin writes the time it asked). Honoured
/// while the request orphans the StatefulSet or migrates members; later stages finish.
pub const ABORT_ANNOTATION: &str = "storagemigrator.io/abort";

/// Annotation on the StatefulSet and the member pods the operator recreates (value: the uid of
/// the request that created them): what tells them from a set or pod that something else
/// created under the same name while the request ran (see `plan::foreign`).
pub const CREATED_BY_REQUEST_ANNOTATION: &str = "storagemigrator.io/created-by-request";

// ---- recommended labels ------------------------------------------------------------------------

/// `app.kubernetes.io/managed-by`, set to [`MANAGED_BY_VALUE`] on everything we create.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`] on our objects.
pub const MANAGED_BY_VALUE: &str = "storage-migrator";

// ---- keys of other controllers that manage a StatefulSet ---------------------------------------

/// Annotation Argo CD's resource tracking (the `annotation` and `annotation+label` methods) puts
/// on every object an Application manages: `<app>:<group>/<kind>:<namespace>/<name>`.
pub const ARGOCD_TRACKING_ID_ANNOTATION: &str = "argocd.argoproj.io/tracking-id";
/// Label Argo CD tracks an Application's objects with when configured as its tracking label
/// (value: the Application's name). The default tracking label, `app.kubernetes.io/instance`,
/// is not looked at: many charts set it without Argo CD.
pub const ARGOCD_INSTANCE_LABEL: &str = "argocd.argoproj.io/instance";
/// Labels Flux's kustomize-controller puts on every object a Kustomization applies: its name and
/// namespace.
pub const FLUX_KUSTOMIZATION_LABELS: [&str; 2] = [
    "kustomize.toolkit.fluxcd.io/name",
    "kustomize.toolkit.fluxcd.io/namespace",
];
/// Labels Flux's helm-controller puts on every object a HelmRelease renders: its name and
/// namespace.
pub const FLUX_HELM_RELEASE_LABELS: [&str; 2] = [
    "helm.toolkit.fluxcd.io/name",
    "helm.toolkit.fluxcd.io/namespace",
];

// ---- Kubernetes' own keys ----------------------------------------------------------------------

/// The namespace label of Pod Security admission's enforced level (`privileged`, `baseline`,
/// `restricted`), read by preflight: the copy Jobs need what `restricted` refuses.
pub const POD_SECURITY_ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";
/// Node label the scheduler and volume topology use for a single node.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// Annotation on a claim naming the node a WaitForFirstConsumer volume is provisioned for.
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";
/// The pre-1.6 annotation form of a claim's `storageClassName`; it overrides the field.
pub const BETA_STORAGE_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";
/// Label the Job controller puts on a Job's pods (the legacy and the current spelling).
pub const JOB_NAME_LABELS: [&str; 2] = ["job-name", "batch.kubernetes.io/job-name"];

/// Annotations the control plane writes while binding or provisioning a claim. They describe the
/// old binding and must not be carried to a claim bound to another volume.
pub const BINDING_ANNOTATIONS: [&str; 7] = [
    "pv.kubernetes.io/bind-completed",
    "pv.kubernetes.io/bound-by-controller",
    "pv.kubernetes.io/migrated-to",
    "volume.beta.kubernetes.io/storage-provisioner",
    "volume.kubernetes.io/storage-provisioner",
    SELECTED_NODE_ANNOTATION,
    // When present it takes precedence over the field in the PV controller, so a stale value
    // would keep the claim on the old class.
    BETA_STORAGE_CLASS_ANNOTATION,
];

/// The claim-protection finalizer the control plane adds to every claim.
pub const PVC_PROTECTION_FINALIZER: &str = "kubernetes.io/pvc-protection";
/// Finalizers the garbage collector adds while deleting; on a new object they would block or
/// cascade its next deletion.
pub const GC_FINALIZERS: [&str; 2] = ["orphan", "foregroundDeletion"];

/// Labels put on every object the operator creates for a request.
pub fn owned_labels(request_name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string()),
        (REQUEST_LABEL.to_string(), request_name.to_string()),
    ])
}

/// Label selector of every object the operator manages.
pub fn managed_by_selector() -> String {
    format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}")
}

/// Labels of the request's stash ConfigMap: [`owned_labels`] plus [`REQUEST_UID_LABEL`].
pub fn stash_labels(request_name: &str, request_uid: &str) -> BTreeMap<String, String> {
    let mut labels = owned_labels(request_name);
    labels.insert(REQUEST_UID_LABEL.to_string(), request_uid.to_string());
    labels
}

/// Label selector of the objects created for one request.
pub fn request_selector(request_name: &str) -> String {
    format!("{REQUEST_LABEL}={request_name}")
}

/// Label selector of what the operator created for one request: [`request_selector`] and
/// [`managed_by_selector`], so that the watch of our objects (by the latter) sees every object
/// a list by it returns (`cluster::read_cache`).
pub fn owned_selector(request_name: &str) -> String {
    format!(
        "{},{}",
        request_selector(request_name),
        managed_by_selector()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_keys_live_under_the_api_group() {
        for key in [
            FINALIZER,
            REQUEST_LABEL,
            MEMBER_LABEL,
            JOB_KIND_LABEL,
            MIGRATED_BY_LABEL,
            REQUEST_UID_LABEL,
            BIND_NUDGE_ANNOTATION,
        ] {
            assert_eq!(key.split_once('/').map(|(g, _)| g), Some(GROUP), "{key}");
        }
    }

    #[test]
    fn own_keys_are_the_group_prefixed_ones() {
        assert!(is_own_key(BIND_NUDGE_ANNOTATION) && is_own_key(REQUEST_LABEL));
        for key in [
            "app",
            MANAGED_BY_LABEL,
            "example.com/storagemigrator.io",
            "x.storagemigrator.io/a",
            "storagemigrator.io",
        ] {
            assert!(!is_own_key(key), "{key}");
        }
    }

    #[test]
    fn selectors_match_the_owned_labels() {
        let labels = owned_labels("move");
        assert_eq!(labels[REQUEST_LABEL], "move");
        assert_eq!(request_selector("move"), "storagemigrator.io/request=move");
        assert_eq!(
            managed_by_selector(),
            format!("{MANAGED_BY_LABEL}={}", labels[MANAGED_BY_LABEL])
        );
        let owned: BTreeMap<String, String> = (owned_selector("move").split(','))
            .filter_map(|t| t.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(owned, labels, "every owned label");
    }
}
