//! End-to-end scenarios of a member claim that another pod mounts too (a backup pod, here on the
//! member's node beside it), against the cluster `KUBECONFIG` points at, each in its own
//! namespace with its own operator process:
//!
//! - at preflight: the request is `Denied` with reason `ClaimShared`, naming the claim, the member
//!   and the other pod; nothing is touched. Once that pod is gone, the same request succeeds;
//! - during the final copy (the operator stopped at a failpoint right after the member entered
//!   `Copying`, the other pod started then): the request ends `Failed` naming the pod, the member
//!   runs again on its untouched old claim, and no temporary claim or Job is left.
//!
//! The operator binary comes from `STORAGE_MIGRATOR_BIN` (default
//! `<workspace>/target/debug/storage-migrator`), built with `--features failpoints`.
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test shared_claim`

use std::time::Duration;

use e2e::testing::faults::request_leftovers;
use e2e::testing::operator::{
    Operator, accepted_condition, create_request, install_crd, summary, wait_final,
};
use e2e::testing::{TestCluster, TestNamespace, one_member_set, scenario};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use storage_migrator::api::Phase;

const APP: &str = "app";
const MEMBER: &str = "app-0";
const CLAIM: &str = "data-app-0";
const BACKUP: &str = "backup";
const FINAL: Duration = Duration::from_secs(600);

/// A one-member StatefulSet in the mover image, idle on a 64Mi claim, Ready; returns the
/// member's node and its claim's volume.
async fn app(cluster: &TestCluster, ns: &TestNamespace) -> (String, String) {
    install_crd(ns).await.unwrap();
    let script = "trap 'exit 0' TERM; echo x > /data/x; while true; do sleep 1; done";
    let set = one_member_set(
        APP,
        &cluster.mover_image,
        &cluster.storage_class,
        "64Mi",
        script,
    );
    ns.create_statefulset_ready(&set).await.unwrap();
    let pod: Pod = ns.api().get(MEMBER).await.unwrap();
    let node = pod.spec.and_then(|s| s.node_name).unwrap();
    (node, volume_of(ns).await)
}

async fn volume_of(ns: &TestNamespace) -> String {
    let claim: PersistentVolumeClaim = ns.api().get(CLAIM).await.unwrap();
    claim.spec.and_then(|s| s.volume_name).unwrap()
}

/// A pod on `node` that mounts the member's claim and appends to a file of its own there, as a
/// backup or a second workload would; Running.
async fn start_backup(cluster: &TestCluster, ns: &TestNamespace, node: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": BACKUP},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "backup",
                "image": cluster.mover_image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c",
                    "trap 'exit 0' TERM; while true; do date >> /data/backup.log; sleep 1; done"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}}],
        },
    }))
    .unwrap();
    ns.api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    ns.wait_pod_ready(BACKUP, Duration::from_secs(120))
        .await
        .unwrap();
}

fn spec(cluster: &TestCluster) -> serde_json::Value {
    json!({
        "type": "StorageClassChange",
        "target": {"kind": "StatefulSet", "name": APP},
        "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
        "timeout": "10m",
        "database": {"engine": "Generic"},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_another_pod_mounts_is_denied_until_that_pod_is_gone() {
    let (cluster, ns) = scenario("smr-shared-claim").await;
    let (node, volume) = app(&cluster, &ns).await;
    start_backup(&cluster, &ns, &node).await;
    let member_uid = ns.api::<Pod>().get(MEMBER).await.unwrap().uid();
    let set_uid = ns.api::<StatefulSet>().get(APP).await.unwrap().uid();
    let _op = Operator::start(&ns, 0, None).await.unwrap();

    create_request(&ns, "shared", spec(&cluster)).await.unwrap();
    let req = wait_final(&ns, "shared", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        req.status.clone().unwrap_or_default().phase,
        Phase::Denied,
        "{}",
        summary(&req)
    );
    let (reason, message) = accepted_condition(&req);
    assert_eq!(reason, "ClaimShared", "{message}");
    assert!(
        message.starts_with(&format!(
            "claim {CLAIM} of member {MEMBER} is also mounted by pod {BACKUP}:"
        )),
        "{message}"
    );
    assert!(
        message.contains("runbook: docs/runbook.md#denied-claimshared"),
        "{message}"
    );
    // Nothing touched: the same set, member pod and volume; the backup still runs.
    assert_eq!(
        ns.api::<StatefulSet>().get(APP).await.unwrap().uid(),
        set_uid
    );
    assert_eq!(ns.api::<Pod>().get(MEMBER).await.unwrap().uid(), member_uid);
    assert_eq!(volume_of(&ns).await, volume);
    ns.wait_pod_ready(BACKUP, Duration::from_secs(5))
        .await
        .unwrap();

    // The backup gone, the same request is accepted and moves the claim.
    let backup_uid = ns.api::<Pod>().get(BACKUP).await.unwrap().uid().unwrap();
    ns.api::<Pod>()
        .delete(BACKUP, &DeleteParams::default())
        .await
        .unwrap();
    ns.wait_deleted(
        ns.api::<Pod>(),
        BACKUP,
        &backup_uid,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    create_request(&ns, "alone", spec(&cluster)).await.unwrap();
    let req = wait_final(&ns, "alone", FINAL).await.unwrap();
    assert_eq!(
        req.status.clone().unwrap_or_default().phase,
        Phase::Successful,
        "{}",
        summary(&req)
    );
    assert_ne!(volume_of(&ns).await, volume, "moved to a new volume");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_mounts_the_claim_during_the_copy_fails_the_member_onto_its_old_claim() {
    let (cluster, ns) = scenario("smr-shared-copy").await;
    let (node, volume) = app(&cluster, &ns).await;
    let member_uid = ns.api::<Pod>().get(MEMBER).await.unwrap().uid().unwrap();
    create_request(&ns, "copying", spec(&cluster))
        .await
        .unwrap();
    // The member is stopped and the request records `Copying`; the operator exits there.
    let mut op = Operator::start(&ns, 0, Some("step-Copying=return"))
        .await
        .unwrap();
    let code = op.wait_exit(Duration::from_secs(300)).await.unwrap();
    assert_eq!(code, 86, "log {}", op.log().display());
    ns.wait_deleted(
        ns.api::<Pod>(),
        MEMBER,
        &member_uid,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    start_backup(&cluster, &ns, &node).await;

    let _op = Operator::start(&ns, 1, None).await.unwrap();
    let req = wait_final(&ns, "copying", FINAL).await.unwrap();
    let status = req.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Phase::Failed, "{}", summary(&req));
    let failure = status.failure.clone().unwrap_or_default();
    assert!(
        failure.contains(&format!(
            "claim {CLAIM} of member {MEMBER} is mounted by pod {BACKUP} during its copy"
        )),
        "{failure}"
    );
    // The member runs again on its old volume; nothing of the request is left.
    ns.wait_statefulset_ready(APP, 1, Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(volume_of(&ns).await, volume, "the old volume");
    let left = request_leftovers(&ns).await;
    assert!(
        left.as_ref().is_ok_and(Vec::is_empty),
        "left behind: {left:?}"
    );
}
