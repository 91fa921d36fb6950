//! Pods: the mounter that gets a WaitForFirstConsumer volume provisioned on the member's node, and
//! the member pod recreated from its stashed manifest.

use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaimVolumeSource, Pod, PodSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::api::{PlannedMember, StorageMigrationRequest};

use super::{member_meta, mounter_name, pinned_to_node, req_name, tolerate_all};

/// The mounter's command: sleep until deleted, and exit at once on SIGTERM (a plain `sleep` as
/// PID 1 ignores SIGTERM and would hold the deletion for the whole grace period); the trap also
/// ends the sleep, so no process is left holding the mount.
pub const MOUNTER_COMMAND: [&str; 3] = [
    "sh",
    "-c",
    "sleep 3600 & pid=$!; trap 'kill \"$pid\" 2>/dev/null; exit 0' TERM INT; wait \"$pid\"",
];

/// Where the mounter mounts the temporary claim.
pub const MOUNTER_PATH: &str = "/target";

/// The pod that mounts `member`'s temporary claim on the member's node, so that a
/// WaitForFirstConsumer class provisions the new volume there.
///
/// Why node affinity and not `spec.nodeName`: the volume is provisioned only when the scheduler
/// places a pod using the claim (it writes `volume.kubernetes.io/selected-node`); `nodeName`
/// skips the scheduler and the claim stays Pending forever (see [`super::pinned_to_node`]). Why
/// the member's node: the copy Jobs must mount the old and the new volume together, and local
/// or zonal volumes are reachable only from their node or zone. Why an ownerReference to the
/// request: the pod is disposable and must not outlive it. Why `restartPolicy: Never`, no
/// service-account token and a short grace period: nothing here should run longer or do more
/// than hold the mount until the claim is bound.
pub fn mounter_pod(req: &StorageMigrationRequest, member: &PlannedMember) -> Pod {
    Pod {
        metadata: member_meta(
            req,
            mounter_name(&req_name(req), &member.pod),
            &member.pod,
            true,
        ),
        spec: Some(PodSpec {
            affinity: Some(pinned_to_node(&member.node)),
            tolerations: Some(tolerate_all()),
            restart_policy: Some("Never".to_string()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(5),
            containers: vec![Container {
                name: "mounter".to_string(),
                image: Some(req.spec.copy.mover_image().to_string()),
                image_pull_policy: Some("IfNotPresent".to_string()),
                command: Some(MOUNTER_COMMAND.iter().map(|s| s.to_string()).collect()),
                volume_mounts: Some(vec![VolumeMount {
                    name: "target".to_string(),
                    mount_path: MOUNTER_PATH.to_string(),
                    ..Default::default()
                }]),
                ..Default::default()
            }],
            volumes: Some(vec![Volume {
                name: "target".to_string(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: member.temp_claim.clone(),
                    read_only: None,
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The member pod recreated from its stashed manifest.
///
/// Why each removal:
/// - uid, resourceVersion, creationTimestamp, managedFields, generation, deletion fields and
///   status are the old object's server state; a create carrying a resourceVersion is refused.
/// - ownerReferences: the set was orphan-deleted; a reference to its old uid would make the
///   garbage collector delete the new pod, and the recreated StatefulSet adopts the pod itself
///   (it keeps the `controller-revision-hash` label, so it is adopted without a restart).
/// - `spec.nodeName`: it bypasses the scheduler; dropped, the scheduler honours the new volume's
///   node affinity (after a StorageClassChange the volume may live elsewhere).
/// - `spec.ephemeralContainers`: the API refuses them on create.
/// - `spec.priority` and `spec.preemptionPolicy`: admission computes them from
///   `priorityClassName` and refuses a pod whose stale values disagree with the class now.
///
/// Everything else (labels, annotations, finalizers, the rest of the spec) is kept as it was.
pub fn recreated_pod(stashed: &Pod) -> Pod {
    let meta = &stashed.metadata;
    let mut spec = stashed.spec.clone();
    if let Some(spec) = spec.as_mut() {
        spec.node_name = None;
        spec.ephemeral_containers = None;
        spec.priority = None;
        spec.preemption_policy = None;
    }
    Pod {
        metadata: ObjectMeta {
            name: meta.name.clone(),
            generate_name: meta.generate_name.clone(),
            namespace: meta.namespace.clone(),
            labels: meta.labels.clone(),
            annotations: meta.annotations.clone(),
            finalizers: meta.finalizers.clone(),
            ..Default::default()
        },
        spec,
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::testdata;

    #[test]
    fn mounter_pod_snapshot_and_invariants() {
        let req = testdata::request();
        let member = testdata::member();
        let pod = mounter_pod(&req, &member);
        insta::assert_yaml_snapshot!(pod);
        let spec = pod.spec.clone().unwrap();
        assert!(
            spec.node_name.is_none(),
            "pinned by affinity, never nodeName"
        );
        let terms = spec
            .affinity
            .unwrap()
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 1);
        let fields = terms[0].match_fields.clone().unwrap();
        assert_eq!(fields[0].key, "metadata.name");
        assert_eq!(fields[0].values, Some(vec!["node-b".to_string()]));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let refs = pod.metadata.owner_references.unwrap();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].kind, "StorageMigrationRequest");
        assert_eq!(refs[0].controller, Some(true));
        let claim = spec.volumes.unwrap()[0]
            .persistent_volume_claim
            .clone()
            .unwrap();
        assert_eq!(claim.claim_name, member.temp_claim);
        assert!(crate::build::is_dns1123_label(
            pod.metadata.name.as_deref().unwrap()
        ));
    }

    #[test]
    fn recreated_pod_snapshot_and_invariants() {
        let stashed = testdata::pod();
        let pod = recreated_pod(&stashed);
        insta::assert_yaml_snapshot!(pod);
        let meta = &pod.metadata;
        assert_eq!(meta.name.as_deref(), Some("etcd-1"));
        assert!(meta.uid.is_none() && meta.resource_version.is_none());
        assert!(meta.creation_timestamp.is_none() && meta.managed_fields.is_none());
        assert!(meta.owner_references.is_none());
        assert!(meta.deletion_timestamp.is_none());
        assert_eq!(
            meta.labels, stashed.metadata.labels,
            "revision hash label kept"
        );
        assert!(pod.status.is_none());
        let spec = pod.spec.unwrap();
        assert!(spec.node_name.is_none());
        assert!(spec.ephemeral_containers.is_none());
        assert!(spec.priority.is_none());
        let old = stashed.spec.unwrap();
        assert_eq!(spec.containers, old.containers);
        assert_eq!(spec.volumes, old.volumes);
        assert_eq!(spec.hostname, old.hostname);
        assert_eq!(spec.subdomain, old.subdomain);
    }
}
