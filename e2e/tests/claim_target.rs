//! End-to-end scenarios of a claim as the target (`target.kind: PersistentVolumeClaim`), against
//! the cluster `KUBECONFIG` points at, each in its own namespace with its own operator process:
//!
//! - a class change of one member's claim of a three-member generic StatefulSet: only that
//!   member's pod is stopped and recreated, its claim moves to the new class with its data
//!   (checksum compared), the other members' pods, claims and volumes are the same objects as
//!   before, and the recreated set keeps its template's class;
//! - a claim no pod mounts is denied `ClaimUnused`, and nothing is touched;
//! - the claim of a bare pod (no controller) moves to another class: the pod is stashed,
//!   deleted, and recreated under its name on the new volume with its data.
//!
//! The operator binary comes from `STORAGE_MIGRATOR_BIN` (default
//! `<workspace>/target/debug/storage-migrator`).
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test claim_target`

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::testing::operator::{
    Operator, accepted_condition, create_request, install_crd, summary, wait_final,
};
use e2e::testing::{TestNamespace, one_member_set, scenario};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use serde_json::json;
use storage_migrator::api::{MemberStep, Phase};

const APP: &str = "app";
const TARGET: &str = "data-app-1";
const FINAL: Duration = Duration::from_secs(600);

/// The checksum of the member's random file, read on its node.
async fn data_sum(ns: &TestNamespace, reader: &str, member: usize) -> String {
    let node = node_of(ns, member).await;
    let claim = format!("data-{APP}-{member}");
    let sum = ns
        .run_on_claim(reader, &node, &claim, "sha256sum /data/random")
        .await
        .unwrap();
    assert!(sum.contains("/data/random"), "{sum}");
    sum
}

async fn node_of(ns: &TestNamespace, member: usize) -> String {
    let pod = ns
        .api::<Pod>()
        .get(&format!("{APP}-{member}"))
        .await
        .unwrap();
    pod.spec.and_then(|s| s.node_name).unwrap_or_default()
}

/// `name → uid` of the members' pods and claims, and `claim → volume`.
async fn identities(ns: &TestNamespace) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut uids = BTreeMap::new();
    let mut volumes = BTreeMap::new();
    for i in 0..3 {
        let pod = ns.api::<Pod>().get(&format!("{APP}-{i}")).await.unwrap();
        uids.insert(pod.name_any(), pod.uid().unwrap_or_default());
        let claim = ns
            .api::<PersistentVolumeClaim>()
            .get(&format!("data-{APP}-{i}"))
            .await
            .unwrap();
        uids.insert(claim.name_any(), claim.uid().unwrap_or_default());
        let volume = claim.spec.as_ref().and_then(|s| s.volume_name.clone());
        volumes.insert(claim.name_any(), volume.unwrap_or_default());
    }
    (uids, volumes)
}

/// Three members, each writing 8 MiB of random data once, then idle (a TERM ends them at once).
fn three_members(image: &str, class: &str) -> StatefulSet {
    let script = "trap 'exit 0' TERM; [ -f /data/random ] || \
                  head -c 8388608 /dev/urandom > /data/random; sync; \
                  while true; do sleep 1; done";
    let mut set = one_member_set(APP, image, class, "64Mi", script);
    if let Some(spec) = set.spec.as_mut() {
        spec.replicas = Some(3);
    }
    set
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_members_claim_moves_to_another_class_and_the_others_are_left_running() {
    let (cluster, ns) = scenario("smr-claim-target").await;
    install_crd(&ns).await.unwrap();
    let set = three_members(&cluster.mover_image, &cluster.storage_class);
    ns.create_statefulset_ready(&set).await.unwrap();
    let before = data_sum(&ns, "sum-before", 1).await;
    let (uids, volumes) = identities(&ns).await;

    let _op = Operator::start(&ns, 0, None).await.unwrap();
    create_request(
        &ns,
        "one-claim",
        json!({
            "type": "StorageClassChange",
            "target": {"kind": "PersistentVolumeClaim", "name": TARGET},
            "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
            "timeout": "10m",
            "database": {"engine": "Generic"},
        }),
    )
    .await
    .unwrap();
    let req = wait_final(&ns, "one-claim", FINAL).await.unwrap();
    let status = req.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Phase::Successful, "{}", summary(&req));
    let plan = status.plan.clone().unwrap_or_default();
    assert_eq!(plan.target_claim.as_deref(), Some(TARGET));
    assert_eq!(plan.stateful_set, APP);
    let steps: BTreeMap<&str, MemberStep> = (status.members.iter())
        .map(|m| (m.pod.as_str(), m.step))
        .collect();
    assert_eq!(
        steps,
        BTreeMap::from([
            ("app-0", MemberStep::NotTargeted),
            ("app-1", MemberStep::Done),
            ("app-2", MemberStep::NotTargeted),
        ])
    );

    // The set adopted every pod again; only app-1 was recreated.
    ns.wait_statefulset_ready(APP, 3, Duration::from_secs(180))
        .await
        .unwrap();
    let (after_uids, after_volumes) = identities(&ns).await;
    for name in ["app-0", "app-2", "data-app-0", "data-app-2"] {
        assert_eq!(after_uids[name], uids[name], "{name} is the same object");
    }
    for claim in ["data-app-0", "data-app-2"] {
        assert_eq!(
            after_volumes[claim], volumes[claim],
            "{claim} kept its volume"
        );
    }
    assert_ne!(after_uids["app-1"], uids["app-1"], "app-1 was restarted");
    assert_ne!(
        after_volumes[TARGET], volumes[TARGET],
        "moved to a new volume"
    );
    let moved = ns.api::<PersistentVolumeClaim>().get(TARGET).await.unwrap();
    assert_eq!(
        moved.spec.and_then(|s| s.storage_class_name).as_deref(),
        Some(cluster.wffc_storage_class.as_str())
    );
    assert_eq!(data_sum(&ns, "sum-after", 1).await, before, "the same data");

    // The recreated set keeps its template's class.
    let set = ns.api::<StatefulSet>().get(APP).await.unwrap();
    let template = set
        .spec
        .and_then(|s| s.volume_claim_templates)
        .and_then(|t| t.into_iter().next())
        .and_then(|t| t.spec)
        .and_then(|s| s.storage_class_name);
    assert_eq!(template.as_deref(), Some(cluster.storage_class.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_no_pod_mounts_is_denied_and_left_alone() {
    let (cluster, ns) = scenario("smr-claim-unused").await;
    install_crd(&ns).await.unwrap();
    let claim = ns
        .create_pvc("loose", &cluster.storage_class, "64Mi")
        .await
        .unwrap();
    let _op = Operator::start(&ns, 0, None).await.unwrap();
    create_request(
        &ns,
        "loose",
        json!({
            "type": "Shrink",
            "target": {"kind": "PersistentVolumeClaim", "name": "loose"},
            "shrink": {"size": "32Mi"},
            "timeout": "10m",
        }),
    )
    .await
    .unwrap();
    let req = wait_final(&ns, "loose", Duration::from_secs(60))
        .await
        .unwrap();
    let status = req.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Phase::Denied, "{}", summary(&req));
    let (reason, message) = accepted_condition(&req);
    assert_eq!(reason, "ClaimUnused", "{message}");
    assert!(
        message.starts_with("no pod mounts claim loose:"),
        "{message}"
    );
    assert!(req.finalizers().is_empty(), "{:?}", req.finalizers());
    let now = ns
        .api::<PersistentVolumeClaim>()
        .get("loose")
        .await
        .unwrap();
    assert_eq!(now.uid(), claim.uid(), "the claim is untouched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_pods_claim_moves_and_the_pod_comes_back_from_its_manifest() {
    let (cluster, ns) = scenario("smr-claim-bare-pod").await;
    install_crd(&ns).await.unwrap();
    ns.create_pvc("solo-data", &cluster.storage_class, "64Mi")
        .await
        .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "solo", "labels": {"app": "solo"}},
        "spec": {
            // No API access needed; and without the token mount the API server does not refuse
            // the pod of a namespace so new that its service account has no token yet.
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 5,
            "securityContext": {"runAsUser": 0, "runAsGroup": 0},
            "containers": [{
                "name": "app",
                "image": cluster.mover_image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "trap 'exit 0' TERM; [ -f /data/random ] || \
                    head -c 8388608 /dev/urandom > /data/random; sync; \
                    while true; do sleep 1; done"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "solo-data"}}],
        },
    }))
    .expect("a pod");
    let before = ns
        .api::<Pod>()
        .create(&kube::api::PostParams::default(), &pod)
        .await
        .unwrap();
    ns.wait_pod_ready("solo", Duration::from_secs(180))
        .await
        .unwrap();
    let node = ns
        .api::<Pod>()
        .get("solo")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.node_name)
        .unwrap_or_default();
    let script = "while [ ! -f /data/random ]; do sleep 0.2; done; sha256sum /data/random";
    let sum_before = ns
        .run_on_claim("sum-before", &node, "solo-data", script)
        .await
        .unwrap();

    let _op = Operator::start(&ns, 0, None).await.unwrap();
    create_request(
        &ns,
        "solo",
        json!({
            "type": "StorageClassChange",
            "target": {"kind": "PersistentVolumeClaim", "name": "solo-data"},
            "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
            "timeout": "10m",
        }),
    )
    .await
    .unwrap();
    let req = wait_final(&ns, "solo", FINAL).await.unwrap();
    let status = req.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Phase::Successful, "{}", summary(&req));
    let plan = status.plan.clone().unwrap_or_default();
    assert_eq!(plan.pod.as_deref(), Some("solo"));
    assert_eq!(plan.stateful_set, "");
    let after = ns
        .wait_pod_ready("solo", Duration::from_secs(180))
        .await
        .unwrap();
    assert_ne!(after.uid(), before.uid(), "recreated");
    let claim = ns
        .api::<PersistentVolumeClaim>()
        .get("solo-data")
        .await
        .unwrap();
    assert_eq!(
        claim.spec.and_then(|s| s.storage_class_name).as_deref(),
        Some(cluster.wffc_storage_class.as_str())
    );
    let sum_after = ns
        .run_on_claim("sum-after", &node, "solo-data", script)
        .await
        .unwrap();
    assert_eq!(sum_after, sum_before, "the same data");
}
