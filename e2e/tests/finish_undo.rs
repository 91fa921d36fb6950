//! End-to-end scenario of a request that failed part way, finished, then undone, against the
//! cluster `KUBECONFIG` points at, in its own namespace with its own operator process, with a
//! client writing to etcd throughout:
//!
//! 1. a StorageClassChange of the 3-member etcd set from `standard` to a second Immediate class
//!    of the same provisioner (created for the test: the way back must bind the same way) whose
//!    second copy Job fails (failpoint `copy-job-fails=1*off->return`: the first copy succeeds):
//!    `Failed`, one member on the new class, two on `standard`, and the status records where each
//!    member's data is (`members[].dataLocation`, the message's summary by class);
//! 2. a second request to the same class (an operator without failpoints): the member already
//!    there is planned `AlreadyThere` and never stopped (same pod uid, no restart), the other two
//!    migrate; `Successful`, the StatefulSet's template on the new class like its claims;
//! 3. a third request back to `standard` moves all three back; the template follows.
//!
//! And the undo of the same partial failure: a request back to `standard` right after it moves
//! only the migrated member; the two members already there are never stopped.
//!
//! Throughout: no acknowledged write is lost and no member restarts on an empty volume (the etcd
//! member ids are unchanged).
//!
//! The operator binary comes from `STORAGE_MIGRATOR_BIN` (default
//! `<workspace>/target/debug/storage-migrator`), built with `--features failpoints`.
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --all-features --test finish_undo`

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e::testing::operator::{Operator, create_request, install_crd, summary, wait_final};
use e2e::testing::{ETCD_READY, TestCluster, TestNamespace, etcd, scenario};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;
use storage_migrator::api::{DataState, MemberStep, Phase, PlannedWork, StorageMigrationRequest};
use tracing::info;

const SET: &str = "etcd";
const FINAL: Duration = Duration::from_secs(900);

/// `claim → (volume, class, requested size)` of the set's claims; each must be Bound.
async fn claims(ns: &TestNamespace) -> BTreeMap<String, (String, String, String)> {
    e2e::testing::assert_claims_bound(ns, SET, 3).await
}

/// A copy of the cluster's Immediate class under another name (same provisioner and binding
/// mode, so that the way back is not a WaitForFirstConsumer → Immediate change).
async fn second_class(cluster: &TestCluster, ns: &TestNamespace) -> String {
    let api: Api<StorageClass> = Api::all(ns.client());
    let mut class = api.get(&cluster.storage_class).await.unwrap();
    let name = format!("{}-b", ns.name);
    class.metadata = kube::api::ObjectMeta {
        name: Some(name.clone()),
        labels: class.metadata.labels.clone(),
        ..Default::default()
    };
    api.create(&PostParams::default(), &class).await.unwrap();
    name
}

/// The class of the set's volumeClaimTemplate.
async fn template_class(ns: &TestNamespace) -> String {
    let set = ns.api::<StatefulSet>().get(SET).await.unwrap();
    let templates = set.spec.unwrap().volume_claim_templates.unwrap_or_default();
    templates[0]
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default()
}

/// `pod → (uid, restarts)` of the members.
async fn pods(ns: &TestNamespace) -> BTreeMap<String, (String, i32)> {
    let api: Api<Pod> = ns.api();
    let mut out = BTreeMap::new();
    for i in 0..3 {
        let name = format!("{SET}-{i}");
        let p = api.get(&name).await.unwrap();
        let restarts = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map(|cs| cs.iter().map(|c| c.restart_count).sum())
            .unwrap_or(0);
        out.insert(name, (p.uid().unwrap(), restarts));
    }
    out
}

/// Every claim and its volume on `class`, and the set's template too.
async fn assert_all_on(ns: &TestNamespace, class: &str) {
    let pvs: Api<PersistentVolume> = Api::all(ns.client());
    for (claim, (volume, claim_class, _)) in claims(ns).await {
        assert_eq!(claim_class, class, "{claim}");
        let pv = pvs.get(&volume).await.unwrap();
        let pv_class = pv.spec.and_then(|s| s.storage_class_name);
        assert_eq!(pv_class.as_deref(), Some(class), "{volume} of {claim}");
    }
    assert_eq!(
        template_class(ns).await,
        class,
        "the StatefulSet's template agrees with its claims"
    );
}

fn class_change(class: &str) -> serde_json::Value {
    json!({
        "type": "StorageClassChange",
        "target": {"kind": "StatefulSet", "name": SET},
        "storageClassChange": {"storageClassName": class},
        "timeout": "15m",
        "database": {"engine": "Etcd"},
    })
}

/// Runs request `name` to its end; returns it.
async fn run_request(ns: &TestNamespace, name: &str, class: &str) -> StorageMigrationRequest {
    let started = Instant::now();
    create_request(ns, name, class_change(class)).await.unwrap();
    let req = wait_final(ns, name, FINAL).await.unwrap();
    info!(took = ?started.elapsed(), summary = %summary(&req), "{name} ended");
    ns.wait_statefulset_ready(SET, 3, ETCD_READY).await.unwrap();
    req
}

fn step_of(req: &StorageMigrationRequest, pod: &str) -> MemberStep {
    let status = req.status.as_ref().unwrap();
    let m = status.members.iter().find(|m| m.pod == pod);
    m.map(|m| m.step).unwrap_or_default()
}

/// Request 1 failed after its first member: returns that member's pod.
async fn check_partly_failed(
    ns: &TestNamespace,
    req: &StorageMigrationRequest,
    class_b: &str,
    source: &str,
) -> String {
    let status = req.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Failed, "{}", summary(req));
    let failure = status.failure.clone().unwrap();
    assert!(failure.contains("injected failure"), "{failure}");
    let steps: Vec<MemberStep> = status.members.iter().map(|m| m.step).collect();
    assert_eq!(
        steps,
        [
            MemberStep::Done,
            MemberStep::RolledBack,
            MemberStep::Pending
        ],
        "{}",
        summary(req)
    );
    let done = status.members[0].pod.clone();
    let now = claims(ns).await;
    for m in &status.members {
        let claim = format!("data-{}", m.pod);
        let loc = m
            .first_claim
            .data_location
            .clone()
            .expect("dataLocation on Failed");
        let (volume, class, _) = &now[&claim];
        assert_eq!(loc.claim, claim);
        assert_eq!(&loc.volume, volume, "{claim}: the volume it is bound to");
        assert_eq!(&loc.storage_class, class, "{claim}");
        let (want_class, want_state) = if m.pod == done {
            (class_b, DataState::Migrated)
        } else {
            (source, DataState::Untouched)
        };
        assert_eq!(loc.storage_class, want_class, "{claim}");
        assert_eq!(loc.state, want_state, "{claim}");
    }
    let message = status.message.unwrap();
    assert!(
        message.contains(&format!("on StorageClass {class_b}: {done}")),
        "{message}"
    );
    // The state the issue starts from: the template went back to the source class, one claim
    // disagrees with it.
    assert_eq!(template_class(ns).await, source);
    done
}

/// Request 2 finished the rest without touching the member already there.
async fn check_finished(
    ns: &TestNamespace,
    req: &StorageMigrationRequest,
    done: &str,
    pods_before: &BTreeMap<String, (String, i32)>,
    class_b: &str,
) {
    let status = req.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Successful, "{}", summary(req));
    let plan = status.plan.clone().unwrap();
    for m in &plan.members {
        let want = if m.pod == done {
            PlannedWork::AlreadyThere
        } else {
            PlannedWork::Migrate
        };
        assert_eq!(m.work, want, "{}", m.pod);
    }
    assert_eq!(step_of(req, done), MemberStep::AlreadyThere);
    let message = status.message.unwrap();
    assert!(
        message.contains(&format!("already there, left running: {done}")),
        "{message}"
    );
    let pods_after = pods(ns).await;
    assert_eq!(
        pods_after[done], pods_before[done],
        "the member already there was neither stopped nor restarted"
    );
    for (pod, (uid, _)) in &pods_after {
        if pod != done {
            assert_ne!(uid, &pods_before[pod].0, "{pod} was migrated");
        }
    }
    assert_all_on(ns, class_b).await;
}

/// The etcd fixture on the cluster's Immediate class, seeded, with a client writing; the second
/// class; the first request run with its second copy Job failing (then its operator stopped).
struct Run {
    /// Kept for the whole run, as the scenario gave it.
    _cluster: TestCluster,
    ns: TestNamespace,
    source: String,
    class_b: String,
    seeded: std::collections::BTreeSet<String>,
    ids: BTreeMap<String, u64>,
    stop: Arc<AtomicBool>,
    writer: tokio::task::JoinHandle<etcd::Written>,
    started: Instant,
    /// The member the failed request migrated.
    done: String,
}

async fn partly_failed(test: &str) -> Run {
    let (cluster, ns) = scenario(test).await;
    install_crd(&ns).await.unwrap();
    ns.apply_etcd().await.unwrap();
    let source = cluster.storage_class.clone();
    let class_b = second_class(&cluster, &ns).await;
    let seeded = etcd::seed_keys(&ns, SET, 50).await.unwrap();
    let ids = etcd::member_ids(&ns, SET, 3).await;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = etcd::start_writer(&ns, SET, 3, "seed/w-", stop.clone());
    let started = Instant::now();
    let op = Operator::start(&ns, 0, Some("copy-job-fails=1*off->return"))
        .await
        .unwrap();
    let req = run_request(&ns, "to-b", &class_b).await;
    op.stop(Duration::from_secs(10)).await;
    let done = check_partly_failed(&ns, &req, &class_b, &source).await;
    assert_eq!(etcd::member_ids(&ns, SET, 3).await, ids);
    Run {
        _cluster: cluster,
        ns,
        source,
        class_b,
        seeded,
        ids,
        stop,
        writer,
        started,
        done,
    }
}

/// Stops the writer: every acknowledged write and seeded key on every member, the member ids
/// those from before; the second class deleted.
async fn check_etcd(run: Run) {
    tokio::time::sleep(Duration::from_secs(2)).await;
    run.stop.store(true, Ordering::Relaxed);
    let written = run.writer.await.unwrap();
    assert!(!written.acked.is_empty(), "the writer wrote");
    let mut expected = run.seeded.clone();
    expected.extend(written.acked.iter().cloned());
    let (count, hash) = etcd::assert_keys_everywhere(&run.ns, SET, 3, &expected).await;
    assert_eq!(
        etcd::member_ids(&run.ns, SET, 3).await,
        run.ids,
        "no member restarted on an empty volume: the etcd member ids are unchanged"
    );
    info!(took = ?run.started.elapsed(), count, hash, acked = written.acked.len(), failures = written.failures, "etcd intact");
    let classes: Api<StorageClass> = Api::all(run.ns.client());
    classes
        .delete(&run.class_b, &Default::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partly_failed_request_is_finished_then_undone() {
    let run = partly_failed("smr-finish-undo").await;
    let ns = &run.ns;

    // The same class again: only the other two move.
    let pods_before = pods(ns).await;
    let _op = Operator::start(ns, 1, None).await.unwrap();
    let req = run_request(ns, "finish", &run.class_b).await;
    check_finished(ns, &req, &run.done, &pods_before, &run.class_b).await;
    assert_eq!(etcd::member_ids(ns, SET, 3).await, run.ids);

    // Everything back to the source class.
    let req = run_request(ns, "back", &run.source).await;
    let status = req.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Successful, "{}", summary(&req));
    assert!(
        status.members.iter().all(|m| m.step == MemberStep::Done),
        "{}",
        summary(&req)
    );
    assert_all_on(ns, &run.source).await;
    check_etcd(run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partly_failed_request_is_undone_moving_only_the_migrated_member() {
    let run = partly_failed("smr-undo").await;
    let ns = &run.ns;
    let pods_before = pods(ns).await;
    let _op = Operator::start(ns, 1, None).await.unwrap();
    let req = run_request(ns, "undo", &run.source).await;
    let status = req.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Successful, "{}", summary(&req));
    let pods_after = pods(ns).await;
    for (pod, before) in &pods_before {
        if *pod == run.done {
            assert_eq!(step_of(&req, pod), MemberStep::Done);
            assert_ne!(pods_after[pod].0, before.0, "{pod} was moved back");
        } else {
            assert_eq!(step_of(&req, pod), MemberStep::AlreadyThere);
            assert_eq!(
                &pods_after[pod], before,
                "{pod} was neither stopped nor restarted"
            );
        }
    }
    let message = status.message.unwrap();
    assert!(message.starts_with("migrated 1 members"), "{message}");
    assert_all_on(ns, &run.source).await;
    check_etcd(run).await;
}
