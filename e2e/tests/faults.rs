//! Faults injected into the local cluster while a request runs, each in its own namespace with
//! its own operator process (`storage-migrator run --namespace NS`). What the operator does
//! about each fault is listed in `docs/faults.md`.
//!
//! - A member's node is lost (power loss: `localcluster node down`, its Ready condition turns
//!   Unknown, its pods' processes die, nothing of its pods is reported or deleted) while the
//!   operator stops that member's pod: the pod stays `Terminating`; once its grace period plus
//!   `--helper-start-timeout` is over the operator force-deletes it and the request ends
//!   `Failed` within a bounded time, the member's data on its old claim and volume, the
//!   StatefulSet recreated, no temporary claim or Job left; the node then comes back and every
//!   member runs again.
//!
//! Only on the local cluster (the fault needs `localcluster`'s node agent); on another cluster
//! the test says so and passes without running.
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test faults -- --test-threads=2`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use e2e::testing::faults::NodeDown;
use e2e::testing::operator::{
    Operator, create_request, install_crd, summary, wait_final, wait_status,
};
use e2e::testing::{TestCluster, TestNamespace, scenario};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::Api;
use serde_json::json;
use storage_migrator::api::{MemberStep, Phase};

const SET: &str = "app";
/// The members' grace period: their container ignores SIGTERM, so a stopped member stays
/// `Terminating` this long on a live node.
const GRACE_SECONDS: i64 = 30;
/// `--helper-start-timeout` of the operator (the bound after the grace period).
const BOUND_SECONDS: i64 = 10;

/// A generic 3-member StatefulSet: busybox writing its name to its volume, then idling with
/// SIGTERM ignored.
fn app_yaml(class: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {SET}
spec:
  serviceName: {SET}
  replicas: 3
  podManagementPolicy: Parallel
  selector:
    matchLabels: {{app: {SET}}}
  template:
    metadata:
      labels: {{app: {SET}}}
    spec:
      terminationGracePeriodSeconds: {GRACE_SECONDS}
      containers:
        - name: app
          image: busybox
          imagePullPolicy: IfNotPresent
          command: ["sh", "-c", "trap '' TERM; hostname > /data/marker; while true; do sleep 1; done"]
          volumeMounts:
            - {{name: data, mountPath: /data}}
  volumeClaimTemplates:
    - metadata:
        name: data
      spec:
        accessModes: [ReadWriteOnce]
        storageClassName: {class}
        resources:
          requests: {{storage: 64Mi}}
"#
    )
}

/// `claim → volume` of every claim of the namespace.
async fn claims(ns: &TestNamespace) -> BTreeMap<String, String> {
    let api: Api<PersistentVolumeClaim> = ns.api();
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| {
            let volume = c.spec.as_ref().and_then(|s| s.volume_name.clone());
            (c.name_any(), volume.unwrap_or_default())
        })
        .collect()
}

/// Waits until the operator has deleted a member's pod; returns the pod (terminating).
async fn member_being_stopped(ns: &TestNamespace, request: &str) -> Pod {
    let req = wait_status(ns, request, "a member pod deleted", MINUTE * 4, |s| {
        s.members
            .iter()
            .any(|m| m.step == MemberStep::StoppingPod && m.pod_deleted_at.is_some())
    })
    .await
    .unwrap();
    let status = req.status.unwrap_or_default();
    let member = status
        .members
        .iter()
        .find(|m| m.step == MemberStep::StoppingPod)
        .map(|m| m.pod.clone())
        .unwrap();
    let pods: Api<Pod> = ns.api();
    let cond = |p: Option<&Pod>| p.is_some_and(|p| p.metadata.deletion_timestamp.is_some());
    ns.wait_for(pods, &member, "pod terminating", MINUTE, cond, |p| {
        format!("{:?}", p.metadata.deletion_timestamp)
    })
    .await
    .unwrap()
    .unwrap()
}

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_lost_while_its_member_pod_stops_fails_the_request_within_bounds() {
    if TestCluster::local_state().is_none() {
        eprintln!("NOTE skipped: a node can be taken down only on the local cluster");
        return;
    }
    let (cluster, ns) = scenario("smr-node-lost").await;
    install_crd(&ns).await.unwrap();
    ns.apply_yaml(&app_yaml(&cluster.storage_class))
        .await
        .unwrap();
    ns.wait_statefulset_ready(SET, 3, MINUTE * 2).await.unwrap();
    let before = claims(&ns).await;
    let bound = BOUND_SECONDS.to_string();
    let flags = [
        "--helper-start-timeout",
        bound.as_str(),
        "--stage-timeout",
        "120",
    ];
    let _op = Operator::start_with(&ns, 0, None, &flags).await.unwrap();
    let name = "node-lost";
    create_request(
        &ns,
        name,
        json!({
            "type": "StorageClassChange",
            "target": {"kind": "StatefulSet", "name": SET},
            "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
            "timeout": "30m",
            "database": {"engine": "Generic"},
        }),
    )
    .await
    .unwrap();

    // The member's pod is stopping (SIGTERM ignored): its node loses power now.
    let pod = member_being_stopped(&ns, name).await;
    let member = pod.name_any();
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
    let down = NodeDown::take(&cluster, &node, MINUTE).await.unwrap();
    let lost_at = Instant::now();
    eprintln!("NOTE node {node} down while member {member} stops");

    let req = wait_final(&ns, name, MINUTE * 5).await.unwrap();
    let took = lost_at.elapsed();
    let status = req.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Failed, "{}", summary(&req));
    let failure = status.failure.clone().unwrap();
    assert!(
        failure.contains(&format!("member pod {member} was still terminating"))
            && failure.contains(&format!("its node {node} is Unknown")),
        "{failure}"
    );
    // Grace period plus the bound, then the rollback: far below the request's 30 m.
    let limit = Duration::from_secs((GRACE_SECONDS + BOUND_SECONDS) as u64 + 90);
    assert!(took < limit, "Failed {took:?} after the node went down");
    eprintln!("NOTE node lost: Failed {took:?} after the node went down: {failure}");
    let message = status.message.clone().unwrap();
    let claim = format!("data-{member}");
    let old_volume = &before[&claim];
    assert!(
        message.contains(&format!(
            "{member} on claim {claim} -> original volume {old_volume}"
        )),
        "{message}"
    );
    let ms = status.members.iter().find(|m| m.pod == member).unwrap();
    assert_eq!(ms.step, MemberStep::RolledBack, "{}", summary(&req));
    let events = ns.events_for(name).await.unwrap();
    assert!(
        events.iter().any(|e| e.starts_with("PodForceDeleted:")),
        "{events:?}"
    );

    // The StatefulSet is back, every claim on its original volume, nothing of ours left.
    let set: StatefulSet = ns.api().get(SET).await.unwrap();
    assert!(set.metadata.deletion_timestamp.is_none());
    assert_eq!(claims(&ns).await, before, "claims and their volumes");
    let jobs: Api<Job> = ns.api();
    let left: Vec<String> = jobs
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|j| j.name_any())
        .collect();
    assert!(left.is_empty(), "Jobs left: {left:?}");

    // The node comes back: the member's recreated pod starts on its untouched claim.
    down.up(&cluster, MINUTE).await.unwrap();
    ns.wait_statefulset_ready(SET, 3, MINUTE * 3).await.unwrap();
}
