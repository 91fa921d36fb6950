//! End-to-end: a helper pod refused at admission. A ResourceQuota that allows no pod with
//! resource requests (scope `NotBestEffort`, `pods: 0`) lets the workload and the mounter pod
//! (both BestEffort) run, but refuses every pod of the copy Jobs (the request sets
//! `spec.copy.resources`, as a namespace under a quota would need).
//! The Job controller reports that only as `FailedCreate` Events on the Job; the operator reads
//! the newest one and fails the member within `--helper-start-timeout` with the API server's own
//! reason (the quota's name), instead of waiting for the request's timeout. The member never
//! stopped (the pre-copy is the first Job), so its pod keeps running on its untouched claim and
//! nothing of the request is left. Against the cluster `KUBECONFIG` points at, in its own
//! namespace with its own operator process.
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test quota`

use std::time::{Duration, Instant};

use e2e::testing::faults::request_leftovers;
use e2e::testing::operator::{Operator, create_request, install_crd, summary, wait_final};
use e2e::testing::{TestNamespace, one_member_set, scenario};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, ResourceQuota};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;
use storage_migrator::api::{MemberStep, Phase};

const SET: &str = "app";
const REQ: &str = "refused";
const CLAIM: &str = "data-app-0";
const QUOTA: &str = "no-sized-pods";
const START_TIMEOUT: u64 = 15;

/// Creates the quota and waits until the quota controller has filled in its status (before
/// that, admission refuses with "status unknown" instead of the quota's numbers).
async fn create_quota(ns: &TestNamespace) {
    let quota: ResourceQuota = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": QUOTA},
        "spec": {"hard": {"pods": "0"}, "scopes": ["NotBestEffort"]},
    }))
    .unwrap();
    let api: Api<ResourceQuota> = ns.api();
    api.create(&PostParams::default(), &quota).await.unwrap();
    let filled = |q: Option<&ResourceQuota>| {
        q.and_then(|q| q.status.as_ref())
            .is_some_and(|s| s.hard.is_some())
    };
    ns.wait_for(
        api,
        QUOTA,
        "quota status filled in",
        Duration::from_secs(60),
        filled,
        |q| format!("{:?}", q.status),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_pod_refused_by_a_quota_fails_the_member_with_the_api_servers_reason() {
    let (cluster, ns) = scenario("smr-quota").await;
    install_crd(&ns).await.unwrap();
    let script = "trap 'exit 0' TERM\nwhile true; do sleep 1; done";
    let set = one_member_set(
        SET,
        &cluster.mover_image,
        &cluster.storage_class,
        "64Mi",
        script,
    );
    ns.create_statefulset_ready(&set).await.unwrap();
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let volume = claims.get(CLAIM).await.unwrap().spec.unwrap().volume_name;
    let pod_uid = ns.api::<Pod>().get("app-0").await.unwrap().uid();
    create_quota(&ns).await;

    let timeout = START_TIMEOUT.to_string();
    let _op = Operator::start_with(&ns, 0, None, &["--helper-start-timeout", &timeout])
        .await
        .unwrap();
    let started = Instant::now();
    create_request(
        &ns,
        REQ,
        json!({
            "type": "StorageClassChange",
            "target": {"kind": "StatefulSet", "name": SET},
            "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
            "timeout": "15m",
            "copy": {"resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}},
            "database": {"engine": "Generic"},
        }),
    )
    .await
    .unwrap();
    let req = wait_final(&ns, REQ, Duration::from_secs(300))
        .await
        .unwrap();
    let took = started.elapsed();
    let status = req.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Failed, "{}", summary(&req));
    let failure = status.failure.clone().unwrap();
    eprintln!("NOTE copy pod refused by a quota: Failed after {took:?}: {failure}");
    for want in [
        &format!("has created no pod within {START_TIMEOUT}s: the API server refused its pod:"),
        "exceeded quota",
        QUOTA,
    ] {
        assert!(failure.contains(want), "no {want:?} in {failure}");
    }
    // The start bound plus claim provisioning and the rollback, far from the 15 m timeout.
    assert!(took < Duration::from_secs(120), "failed after {took:?}");
    assert_eq!(
        status.members.first().map(|m| m.step),
        Some(MemberStep::RolledBack),
        "{}",
        summary(&req)
    );

    // The member never stopped: the same pod, on its untouched claim; nothing left behind.
    let claim = claims.get(CLAIM).await.unwrap();
    assert_eq!(claim.spec.unwrap().volume_name, volume);
    let pod = ns.api::<Pod>().get("app-0").await.unwrap();
    assert_eq!(pod.uid(), pod_uid, "the member's pod was never replaced");
    ns.wait_statefulset_ready(SET, 1, Duration::from_secs(60))
        .await
        .unwrap();
    let left = request_leftovers(&ns).await;
    assert!(
        left.as_ref().is_ok_and(Vec::is_empty),
        "left behind: {left:?}"
    );
}
