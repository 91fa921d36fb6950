//! Pods: the mounter that gets a WaitForFirstConsumer volume provisioned on the member's node, and
//! the member pod recreated from its stashed manifest.

use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaimVolumeSource, Pod, PodSpec, Volume, VolumeMount,
};

use serde_json::Value;

use crate::api::{PlannedMember, StorageMigrationRequest};
use crate::image::ImageRef;

use super::manifest::{Manifest, for_create};
use super::security::{MOUNTER_UID, container_security, pod_security};
use super::{BuildError, member_meta, mounter_name, pinned_to_node, req_name, tolerate_all};

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
/// than hold the mount until the claim is bound. Why non-root with no capability at all, no
/// privilege escalation, a read-only root and a read-only mount: it only holds the mount (see
/// [`super::security`]). Its image is the Jobs' (the request's
/// `moverImage`, else `image`, the operator's own), which the node pulls anyway.
pub fn mounter_pod(
    req: &StorageMigrationRequest,
    image: &ImageRef,
    member: &PlannedMember,
    subject: &str,
) -> Pod {
    Pod {
        metadata: member_meta(
            req,
            mounter_name(&req_name(req), subject),
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
            security_context: Some(pod_security(MOUNTER_UID)),
            containers: vec![Container {
                name: "mounter".to_string(),
                security_context: Some(container_security(&[])),
                image: Some(image.as_str().to_string()),
                image_pull_policy: Some("IfNotPresent".to_string()),
                command: Some(MOUNTER_COMMAND.iter().map(|s| s.to_string()).collect()),
                volume_mounts: Some(vec![VolumeMount {
                    name: "target".to_string(),
                    mount_path: MOUNTER_PATH.to_string(),
                    read_only: Some(true),
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

/// Fields of the pod's spec dropped on recreation (see [`recreated_pod`]).
const DROPPED_SPEC_FIELDS: [&str; 4] = [
    "nodeName",
    "ephemeralContainers",
    "priority",
    "preemptionPolicy",
];

/// The member pod recreated from its stashed manifest (the raw JSON as the API server returned
/// it, edited as JSON so that fields k8s-openapi does not know survive).
///
/// Why each removal:
/// - uid, resourceVersion, creationTimestamp, managedFields, generation, deletion fields,
///   selfLink and status are the old object's server state; a create carrying a resourceVersion
///   is refused.
/// - ownerReferences: the set was orphan-deleted; a reference to its old uid would make the
///   garbage collector delete the new pod, and the recreated StatefulSet adopts the pod itself
///   (it keeps the `controller-revision-hash` label, so it is adopted without a restart).
/// - `spec.nodeName`: it bypasses the scheduler; dropped, the scheduler honours the new volume's
///   node affinity (after a StorageClassChange the volume may live elsewhere).
/// - `spec.ephemeralContainers`: the API refuses them on create.
/// - `spec.priority` and `spec.preemptionPolicy`: admission computes them from
///   `priorityClassName` and refuses a pod whose stale values disagree with the class now.
///
/// Everything else (labels, annotations, finalizers, the rest of the spec, fields newer than our
/// API structs) is kept as it was. Fails only if the edited JSON no longer reads as a Pod (it
/// always does).
pub fn recreated_pod(stashed: &Manifest<Pod>) -> Result<Manifest<Pod>, BuildError> {
    let mut obj = for_create(stashed.raw(), &["ownerReferences"]);
    if let Some(Value::Object(spec)) = obj.get_mut("spec") {
        for field in DROPPED_SPEC_FIELDS {
            spec.remove(field);
        }
    }
    Manifest::from_raw(Value::Object(obj))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::{stash_decode, stash_encode, testdata};

    #[test]
    fn mounter_pod_snapshot_and_invariants() {
        let req = testdata::request();
        let member = testdata::member();
        let pod = mounter_pod(&req, &testdata::image(), &member, &member.pod);
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
        let image = spec.containers[0].image.as_deref();
        assert_eq!(image, Some(testdata::IMAGE), "the operator's image");
        // Non-root, no capability at all, nothing writable.
        let psc = spec.security_context.clone().unwrap();
        assert_eq!(psc.run_as_user, Some(65532));
        assert_eq!(psc.run_as_non_root, Some(true));
        let sc = spec.containers[0].security_context.clone().unwrap();
        let caps = sc.capabilities.unwrap();
        assert_eq!((caps.add, caps.drop), (None, Some(vec!["ALL".to_string()])));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let mounts = spec.containers[0].volume_mounts.clone().unwrap();
        assert_eq!(mounts[0].read_only, Some(true));
        // The builder runs the image it is given (the planner's choice, see
        // `plan::Settings::mover_image`), never the request's own.
        let mut own = req.clone();
        own.spec.copy.mover_image = Some("registry.test/my-mover:1".into());
        let pod = mounter_pod(&own, &testdata::image(), &member, &member.pod);
        let image = pod.spec.unwrap().containers[0].image.clone();
        assert_eq!(image.as_deref(), Some(testdata::IMAGE));
    }

    #[test]
    fn recreated_pod_snapshot_and_invariants() {
        let stashed = testdata::pod_manifest();
        let pod = recreated_pod(&stashed).unwrap();
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
        assert_eq!(meta.generate_name, stashed.metadata.generate_name);
        assert!(pod.raw().get("status").is_none());
        let spec = pod.spec.clone().unwrap();
        assert!(spec.node_name.is_none());
        assert!(spec.ephemeral_containers.is_none());
        assert!(spec.priority.is_none());
        assert!(spec.preemption_policy.is_none());
        let (old, new) = (&stashed.raw()["spec"], &pod.raw()["spec"]);
        for field in [
            "containers",
            "volumes",
            "hostname",
            "subdomain",
            "tolerations",
        ] {
            assert_eq!(new[field], old[field], "spec.{field}");
        }
        // Nothing else of the spec changed.
        let mut kept = old.as_object().unwrap().clone();
        for field in DROPPED_SPEC_FIELDS {
            kept.remove(field);
        }
        assert_eq!(new, &Value::Object(kept));
    }

    /// A field of a newer API (unknown to k8s-openapi) in the pod spec, in a container and in a
    /// volume mount survives stash encode → decode → recreation.
    #[test]
    fn unknown_pod_fields_survive_the_stash_and_the_recreation() {
        let live = testdata::with_future_fields(&testdata::pod_manifest(), "/spec");
        let typed = serde_json::to_value(live.typed()).unwrap();
        assert!(
            typed["spec"].get("someFutureField").is_none(),
            "typed drops it"
        );

        let stashed: Manifest<Pod> = stash_decode(&stash_encode(&live).unwrap()).unwrap();
        assert_eq!(stashed, live);
        let pod = recreated_pod(&stashed).unwrap();
        let (old, new) = (&live.raw()["spec"], &pod.raw()["spec"]);
        assert_eq!(new["someFutureField"], serde_json::json!({"x": 1}));
        assert_eq!(new["containers"], old["containers"]);
        assert_eq!(
            new["containers"][0]["volumeMounts"][0]["futureMountField"],
            serde_json::json!("y")
        );
        let mut kept = old.as_object().unwrap().clone();
        for field in DROPPED_SPEC_FIELDS {
            kept.remove(field);
        }
        assert_eq!(new, &Value::Object(kept));
    }
}
