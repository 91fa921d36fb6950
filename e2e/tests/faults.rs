//! Faults injected into the local cluster while a request runs on the 3-member etcd fixture and
//! a client writes to it through the whole request (`testing::faults::EtcdUnderLoad`), each in
//! its own namespace with its own operator process (`storage-migrator run --namespace NS`). What
//! the operator does about each fault is listed in `docs/faults.md`.
//!
//! - A member's node is lost (power loss: `localcluster node down`, its Ready condition turns
//!   Unknown, its pods' processes die, nothing of its pods is reported or deleted) while the
//!   operator stops that member's pod. The fixture's members take 20 s to pass SIGTERM on to
//!   etcd (`testing::faults::etcd_slow_stop`, grace period 40 s), and each member has a node of
//!   its own (`one_member_per_node`: a required anti-affinity), so the node goes down while
//!   the pod is `Terminating` and etcd still serves, with no race. The etcd member dies with
//!   its node: the other two keep the quorum and the writer goes on. The pod stays
//!   `Terminating`; once its grace period plus `--helper-start-timeout` is over the request waits
//!   with the condition `NodeLost` naming the node and how to proceed, and forces nothing: a node
//!   that is only unreachable may still run the pod. Then the test taints the node
//!   `node.kubernetes.io/out-of-service`, as an administrator does once it is really down: the
//!   operator force-deletes the pod (or Kubernetes' pod garbage collector does, acting on the
//!   same taint, when it comes first: then the operator fails the member without a copy, which
//!   could only run on that node) and the request ends `Failed` within a bounded time, the
//!   member's data on its old claim and volume, the StatefulSet recreated, no other member pod
//!   ever deleted, no temporary claim, Job or helper pod left; the node then comes back (taint
//!   removed), every member runs again with its old etcd member id, and no acknowledged write is
//!   lost.
//! - The same, but an administrator force-deletes the stuck pod while the node is still
//!   `Unknown` and untainted (`kubectl delete pod --force --grace-period=0`): the member fails
//!   at once, no final copy's Job is ever created (it could only run on that node), and the
//!   rest holds as above. The path the pod garbage collector's deletion takes in the test above
//!   when it comes first, here taken every time.
//!
//! The two take a node down each: they run one after the other (`ONE_NODE_DOWN`).
//!
//! Only on the local cluster (the fault needs `localcluster`'s node agent); on another cluster
//! it fails under CI (`testing::require`) and prints NOT RUN by hand.
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test faults -- --test-threads=2`

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use e2e::testing::faults::{
    ETCD_SET, EtcdUnderLoad, NodeDown, OUT_OF_SERVICE, etcd_slow_stop, one_member_per_node,
};
use e2e::testing::operator::{Operator, summary, wait_final, wait_status};
use e2e::testing::recording::{Recording, Seen};
use e2e::testing::{TestNamespace, etcd};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::watcher;
use storage_migrator::api::{MemberStep, Phase, StorageMigrationRequest};
use storage_migrator::labels::JOB_KIND_LABEL;

/// How long a stopped member keeps etcd running after SIGTERM; its grace period is 20 s more.
const STOP_DELAY_SECONDS: u32 = 20;
/// The members' grace period (see [`etcd_slow_stop`]).
const GRACE_SECONDS: u64 = STOP_DELAY_SECONDS as u64 + 20;
/// `--helper-start-timeout` of the operator (the bound after the grace period).
const BOUND_SECONDS: u64 = 10;
const MINUTE: Duration = Duration::from_secs(60);

/// `pod → uid` of the set's member pods.
async fn member_uids(ns: &TestNamespace) -> BTreeMap<String, String> {
    let pods: Api<Pod> = ns.api();
    let mut uids = BTreeMap::new();
    for i in 0..3 {
        let name = format!("{ETCD_SET}-{i}");
        let uid = pods.get(&name).await.unwrap().uid().unwrap_or_default();
        uids.insert(name, uid);
    }
    uids
}

/// The member pods scheduled on `node`.
async fn members_on(ns: &TestNamespace, node: &str) -> Vec<String> {
    let pods: Api<Pod> = ns.api();
    let mut on = Vec::new();
    for i in 0..3 {
        let name = format!("{ETCD_SET}-{i}");
        let pod = pods.get(&name).await.unwrap();
        if pod.spec.and_then(|s| s.node_name).as_deref() == Some(node) {
            on.push(name);
        }
    }
    on
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

/// With the node still down, the two other members hold the quorum: a put through one is read
/// back through the other.
async fn quorum_of_two(ns: &TestNamespace, lost: &str) {
    let others: Vec<String> = (0..3)
        .map(|i| format!("{ETCD_SET}-{i}"))
        .filter(|p| p != lost)
        .collect();
    let mut a = etcd::member(ns, &others[0]).await.unwrap();
    let mut b = etcd::member(ns, &others[1]).await.unwrap();
    a.put("probe/two-of-three", lost).await.unwrap();
    assert_eq!(
        b.get("probe/two-of-three").await.unwrap().as_deref(),
        Some(lost)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_members_node_lost_while_its_pod_stops_fails_the_request_within_bounds() {
    // A node can be taken down only on the local cluster.
    if e2e::testing::require::local_cluster("faults: node lost while its pod stops").is_none() {
        return;
    }
    let _one = ONE_NODE_DOWN.lock().await;
    let mut lost = LostNode::start("smr-node-lost", "node-lost").await;
    let (ns, name, member) = (&lost.run.ns, lost.name, lost.member.clone());

    // A node that is only unreachable may still run the pod: the request waits, naming the
    // node, and forces nothing (the pod stays Terminating).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let pods: Api<Pod> = ns.api();
    let still = pods
        .get(&member)
        .await
        .expect("the member pod is still there");
    assert!(
        still.metadata.deletion_timestamp.is_some(),
        "{member} terminating"
    );
    let events = ns.events_for(name).await.unwrap_or_default();
    assert!(
        !events.iter().any(|e| e.starts_with("PodForceDeleted:")),
        "force-deleted without the taint: {events:?}"
    );
    // The administrator declares the node down (non-graceful node shutdown): now it goes on.
    lost.down
        .out_of_service(&lost.run.cluster, true)
        .await
        .unwrap();
    let tainted_at = Instant::now();
    let req = wait_final(ns, name, MINUTE * 5).await.unwrap();
    let took = tainted_at.elapsed();
    let deleted_by = assert_failed_cleanly(ns, &req, &member, &lost.node, &lost.before).await;
    assert!(
        took < Duration::from_secs(90),
        "Failed {took:?} after the taint"
    );
    eprintln!(
        "NOTE node lost: waiting ({}); Failed {took:?} after the taint; pod deleted by \
         {deleted_by:?}",
        lost.waiting
    );
    lost.comes_back(req, took).await;
}

/// An administrator force-deletes the member's pod stuck terminating on the lost node, without
/// the out-of-service taint (`kubectl delete pod --force --grace-period=0`): the node is still
/// `Unknown`, so the member's copy could only run there and cannot. The member fails at once
/// (`Failure::NodeLostPodDeleted`), nothing is copied, the operator forces nothing, and the
/// member's data stays on its old claim and volume. Also the path taken when Kubernetes' pod
/// garbage collector comes before the operator in the test above; here it is taken every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_member_pod_force_deleted_by_an_administrator_fails_the_member_without_a_copy() {
    if e2e::testing::require::local_cluster("faults: stuck member pod force-deleted").is_none() {
        return;
    }
    let _one = ONE_NODE_DOWN.lock().await;
    let lost = LostNode::start("smr-node-lost-forced", "node-lost-forced").await;
    let (ns, name, member) = (&lost.run.ns, lost.name, lost.member.clone());
    let pods: Api<Pod> = ns.api();
    let uid = lost.pod_uid.clone();
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let copies = watch_copy_jobs(ns).await;
    pods.delete(&member, &force).await.unwrap();
    let forced_at = Instant::now();
    let req = wait_final(ns, name, MINUTE * 5).await.unwrap();
    let took = forced_at.elapsed();
    let copy_jobs = copies.finish().await;
    let deleted_by = assert_failed_cleanly(ns, &req, &member, &lost.node, &lost.before).await;
    assert_eq!(deleted_by, DeletedBy::Another, "{}", summary(&req));
    let failure = req.status.clone().and_then(|s| s.failure).unwrap();
    assert!(
        failure.contains("was deleted by something else"),
        "the operator never decided to force: {failure}"
    );
    assert!(
        !failure.contains(OUT_OF_SERVICE),
        "the node was never tainted: {failure}"
    );
    assert!(
        copy_jobs.is_empty(),
        "no final copy of {member} (it could only run on the lost node): {copy_jobs:?}"
    );
    assert!(
        took < Duration::from_secs(60),
        "Failed {took:?} after the force-delete"
    );
    eprintln!(
        "NOTE node lost, pod force-deleted by the administrator: waiting ({}); Failed {took:?} \
         after the force-delete",
        lost.waiting
    );
    lost.comes_back(req, took).await;
}

/// Takes nodes down: the tests of this binary run one at a time.
static ONE_NODE_DOWN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A request on the fixture whose member's node went down while the member's pod stopped, and
/// the request waiting for it with the condition `NodeLost`.
struct LostNode {
    run: EtcdUnderLoad,
    name: &'static str,
    /// The claims' volumes, the member pods' uids and etcd member ids before the request.
    before: BTreeMap<String, String>,
    uids_before: BTreeMap<String, String>,
    ids_before: BTreeMap<String, u64>,
    _op: Operator,
    member: String,
    pod_uid: String,
    node: String,
    down: NodeDown,
    /// The `NodeLost` condition's message.
    waiting: String,
}

impl LostNode {
    /// Starts the fixture under load (a member on each node, 20 s to stop) and an operator,
    /// creates request `name`, takes the node of the first member it stops down and waits for
    /// the condition `NodeLost`, within the grace period and the bound.
    async fn start(test: &str, name: &'static str) -> Self {
        let slow_stop = etcd_slow_stop(STOP_DELAY_SECONDS);
        let variant = |obj: &mut kube::api::DynamicObject| {
            slow_stop(obj);
            one_member_per_node(obj);
        };
        let run = EtcdUnderLoad::start_with(test, variant)
            .await
            .expect("setup");
        let (cluster, ns) = (&run.cluster, &run.ns);
        let before = ns.claim_volumes().await;
        let uids_before = member_uids(ns).await;
        let ids_before = etcd::member_ids(ns, ETCD_SET, 3).await;
        let bound = BOUND_SECONDS.to_string();
        let flags = [
            "--helper-start-timeout",
            bound.as_str(),
            "--stage-timeout",
            "120",
        ];
        let op = Operator::start_with(ns, 0, None, &flags).await.unwrap();
        run.create_request(name).await.expect("request");

        // The member's pod is stopping (etcd still serving for 20 s): its node loses power now.
        let pod = member_being_stopped(ns, name).await;
        let member = pod.name_any();
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
        let sharing = members_on(ns, &node).await;
        assert_eq!(
            sharing,
            std::slice::from_ref(&member),
            "members on {node}: the others must survive"
        );
        let down = NodeDown::take(cluster, &node, MINUTE).await.unwrap();
        let lost_at = Instant::now();
        eprintln!("NOTE node {node} down while member {member} stops");
        let waiting = wait_node_lost_condition(ns, name, &node).await;
        let waited = lost_at.elapsed();
        // Grace period plus the bound before the wait: far below the request's 20 m.
        let limit = Duration::from_secs(GRACE_SECONDS + BOUND_SECONDS + 90);
        assert!(
            waited < limit,
            "NodeLost {waited:?} after the node went down"
        );
        LostNode {
            pod_uid: pod.uid().unwrap_or_default(),
            run,
            name,
            before,
            uids_before,
            ids_before,
            _op: op,
            member,
            node,
            down,
            waiting,
        }
    }

    /// With the request ended `req`: the two other members hold the quorum; then the node comes
    /// back (its out-of-service taint removed, as after a repair), the member's recreated pod
    /// starts on its untouched claim and rejoins with its old member id, the other two were
    /// never stopped, and no acknowledged write is lost.
    async fn comes_back(self, req: StorageMigrationRequest, took: Duration) {
        let LostNode {
            run,
            down,
            before,
            uids_before,
            ids_before,
            member,
            node,
            ..
        } = self;
        let (cluster, ns) = (&run.cluster, &run.ns);
        quorum_of_two(ns, &member).await;
        let up_at = Instant::now();
        down.up(cluster, MINUTE).await.unwrap();
        ns.wait_statefulset_ready(ETCD_SET, 3, MINUTE * 3)
            .await
            .unwrap();
        let ready = up_at.elapsed();
        let uids_after = member_uids(ns).await;
        for (pod, uid) in &uids_before {
            if *pod != member {
                assert_eq!(&uids_after[pod], uid, "member {pod} was not stopped");
            }
        }
        assert_eq!(ns.claim_volumes().await, before, "claims and their volumes");
        let ids_after = etcd::member_ids(ns, ETCD_SET, 3).await;
        assert_eq!(
            ids_after, ids_before,
            "etcd member ids (no member on an empty volume)"
        );
        let failure = req.status.and_then(|s| s.failure).unwrap_or_default();
        let (_cluster, _ns, written) = run.finish().await;
        println!(
            "NOTE node lost: member {member} on {node}; Failed {took:?} after the taint or \
             force-delete (bound: grace {GRACE_SECONDS} s + {BOUND_SECONDS} s), every member \
             Ready {ready:?} after the node came back; writes acknowledged {} failed {} \
             (of {} attempts); failure: {failure}",
            written.acked.len(),
            written.failures,
            written.attempts
        );
    }
}

/// Waits until the request has the condition `NodeLost` (True) naming `node`; its message.
async fn wait_node_lost_condition(ns: &TestNamespace, name: &str, node: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(GRACE_SECONDS + BOUND_SECONDS + 90);
    loop {
        let req: StorageMigrationRequest = ns.api().get(name).await.unwrap();
        let status = req.status.clone().unwrap_or_default();
        assert!(
            !status.phase.is_final(),
            "ended without the taint: {}",
            summary(&req)
        );
        let c = status.conditions.iter().find(|c| c.type_ == "NodeLost");
        if let Some(c) = c.filter(|c| c.status == "True" && c.message.contains(node)) {
            assert!(c.message.contains(OUT_OF_SERVICE), "{}", c.message);
            return c.message.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no NodeLost condition: {}",
            summary(&req)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Who deleted the member pod stuck on the lost node: the operator (once the node is tainted
/// out-of-service), or another: Kubernetes' pod garbage collector, which acts on the same taint
/// and sometimes comes first, or an administrator (the operator then sees the pod gone while
/// the node is still down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeletedBy {
    Operator,
    /// Kubernetes' pod garbage collector, or an administrator's force-delete.
    Another,
}

/// The request ended `Failed` naming pod and node, the member rolled back onto its original
/// volume, the pod force-deleted, no other member pod deleted, the StatefulSet recreated. Who
/// deleted the pod: the operator when it says so in a `PodForceDeleted` Event, else another.
async fn assert_failed_cleanly(
    ns: &TestNamespace,
    req: &StorageMigrationRequest,
    member: &str,
    node: &str,
    before: &BTreeMap<String, String>,
) -> DeletedBy {
    let status = req.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Failed, "{}", summary(req));
    let failure = status.failure.clone().unwrap();
    let decided = if failure.contains(&format!("member pod {member} was still terminating")) {
        DeletedBy::Operator
    } else if failure.contains(&format!(
        "member pod {member} was deleted by something else while it was stuck terminating"
    )) && failure.contains("the copy cannot run on that node")
    {
        DeletedBy::Another
    } else {
        panic!("not a lost node's failure for {member}: {failure}")
    };
    assert!(
        failure.contains(&format!("its node {node} is Unknown")),
        "{failure}"
    );
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
    assert_eq!(ms.step, MemberStep::RolledBack, "{}", summary(req));
    // The gate let no second member down: no other member pod was ever deleted.
    for m in status.members.iter().filter(|m| m.pod != member) {
        assert!(m.pod_deleted_at.is_none(), "{} was deleted too", m.pod);
    }
    // The operator force-deletes only a pod it failed the member for as still terminating. The
    // pod garbage collector acts on the same taint and may come between that decision and the
    // rollback's force-delete, which then finds the pod gone and forces nothing (seen in CI:
    // the collector's delete 150 ms before the decision's status write). So a decision to force
    // comes with the Event or without it; a pod another deleted first, never with it.
    let events = ns.events_for(&req.name_any()).await.unwrap();
    let forced = events.iter().any(|e| e.starts_with("PodForceDeleted:"));
    assert!(
        !forced || decided == DeletedBy::Operator,
        "{decided:?}: {events:?}"
    );
    let deleted_by = match forced {
        true => DeletedBy::Operator,
        false => DeletedBy::Another,
    };
    // The StatefulSet is back, every claim on its original volume, nothing of ours left.
    let set: StatefulSet = ns.api().get(ETCD_SET).await.unwrap();
    assert!(set.metadata.deletion_timestamp.is_none());
    assert_eq!(
        &ns.claim_volumes().await,
        before,
        "claims and their volumes"
    );
    let started = Instant::now();
    loop {
        let left = e2e::testing::faults::leftovers_or_error(ns).await;
        if left.is_empty() {
            break;
        }
        assert!(started.elapsed() < MINUTE, "left behind: {left:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    deleted_by
}

/// A watch of the namespace's Jobs of a final copy (`JOB_KIND_LABEL=copy`): the names of every
/// one it sees created, changed or deleted.
async fn watch_copy_jobs(ns: &TestNamespace) -> Recording<BTreeSet<String>> {
    let config = watcher::Config::default().labels(&format!("{JOB_KIND_LABEL}=copy"));
    let record = |seen: &mut BTreeSet<String>, s: Seen<Job>| {
        if let Seen::Applied(j) | Seen::Deleted(j) = s {
            seen.insert(j.name_any());
        }
    };
    Recording::start(ns.api(), config, "copy Job", BTreeSet::new(), record).await
}
