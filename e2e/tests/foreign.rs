//! End-to-end scenarios of a StatefulSet that something else recreates while a request runs,
//! against the cluster `KUBECONFIG` points at, each in its own namespace with its own operator
//! process watching only that namespace, with a client writing to etcd throughout.
//!
//! The actor plays a GitOps self-heal or an owning operator that was not paused: once the first
//! member has started, it creates the original StatefulSet (as it was before the request) again
//! every second whenever it is missing.
//!
//! - the actor runs for the whole request: the request is `Blocked` (naming the set), takes no
//!   destructive step, and at its timeout ends `Failed` with a reason that names the recreated
//!   set, which it leaves alone; every member is still on its original claim;
//! - the actor stops after a while and the recreated set is deleted (`--cascade=orphan`): the
//!   condition is cleared and the request ends `Successful`.
//!
//! In both: no acknowledged write is lost, no member restarts on an empty volume (the etcd member
//! ids are unchanged), and the end state is asserted.
//!
//! The operator binary comes from `STORAGE_MIGRATOR_BIN` (default
//! `<workspace>/target/debug/storage-migrator`).
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test foreign -- --test-threads=2`

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e::testing::operator::{
    Operator, create_request, install_crd, summary, wait_final, wait_status,
};
use e2e::testing::{ETCD_READY, FINAL_EVENT, TestCluster, TestNamespace, etcd, scenario};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};
use serde_json::json;
use storage_migrator::api::{MemberStep, Phase, StorageMigrationRequestStatus, conditions};
use storage_migrator::labels::CREATED_BY_REQUEST_ANNOTATION;
use tracing::info;

const SET: &str = "etcd";
const FINAL: Duration = Duration::from_secs(600);

/// `claim → (volume, class, requested size)` of the set's claims; each must be Bound.
async fn claims(ns: &TestNamespace) -> BTreeMap<String, (String, String, String)> {
    e2e::testing::assert_claims_bound(ns, SET, 3).await
}

/// The StatefulSet as its owner would apply it again: the live object without what the API
/// server set.
async fn original_set(ns: &TestNamespace) -> StatefulSet {
    let mut set = ns.api::<StatefulSet>().get(SET).await.unwrap();
    let meta = &mut set.metadata;
    meta.uid = None;
    meta.resource_version = None;
    meta.creation_timestamp = None;
    meta.generation = None;
    meta.managed_fields = None;
    meta.owner_references = None;
    set.status = None;
    set
}

/// Every second until `stop`: creates `set` when it is missing. Returns the uids it created.
fn start_actor(
    ns: &TestNamespace,
    set: StatefulSet,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<String>> {
    let api: Api<StatefulSet> = ns.api();
    tokio::spawn(async move {
        let mut created = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            if let Ok(s) = api.create(&PostParams::default(), &set).await {
                let uid = s.uid().unwrap_or_default();
                info!(%uid, "actor recreated the StatefulSet");
                created.push(uid);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        created
    })
}

fn first_member_started(s: &StorageMigrationRequestStatus) -> bool {
    s.members.iter().any(|m| m.step != MemberStep::Pending)
}

fn blocked(s: &StorageMigrationRequestStatus) -> Option<(String, String, String)> {
    conditions::get(&s.conditions, conditions::BLOCKED)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The etcd fixture, seeded; the operator; the writer; the request with `timeout`; the actor
/// started once the request's status satisfies `actor_when`. Returns what the checks need.
struct Run {
    cluster: TestCluster,
    ns: TestNamespace,
    _op: Operator,
    seeded: BTreeSet<String>,
    ids: BTreeMap<String, u64>,
    before: BTreeMap<String, (String, String, String)>,
    stop_writer: Arc<AtomicBool>,
    writer: tokio::task::JoinHandle<etcd::Written>,
    stop_actor: Arc<AtomicBool>,
    actor: tokio::task::JoinHandle<Vec<String>>,
    started: Instant,
}

async fn start(
    test: &str,
    request: &str,
    timeout: &str,
    actor_when: fn(&StorageMigrationRequestStatus) -> bool,
) -> Run {
    let (cluster, ns) = scenario(test).await;
    install_crd(&ns).await.unwrap();
    ns.apply_etcd().await.unwrap();
    let seeded = etcd::seed_keys(&ns, SET, 50).await.unwrap();
    let ids = etcd::member_ids(&ns, SET, 3).await;
    let before = claims(&ns).await;
    let original = original_set(&ns).await;
    let stop_writer = Arc::new(AtomicBool::new(false));
    let writer = etcd::start_writer(&ns, SET, 3, "seed/w-", stop_writer.clone());
    let op = Operator::start(&ns, 0, None).await.unwrap();
    let started = Instant::now();
    create_request(
        &ns,
        request,
        json!({
            "type": "StorageClassChange",
            "target": {"kind": "StatefulSet", "name": SET},
            "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
            "timeout": timeout,
            "database": {"engine": "Etcd"},
        }),
    )
    .await
    .unwrap();
    wait_status(&ns, request, "the actor's cue", FINAL, actor_when)
        .await
        .unwrap();
    let stop_actor = Arc::new(AtomicBool::new(false));
    let actor = start_actor(&ns, original, stop_actor.clone());
    info!(took = ?started.elapsed(), "actor started");
    Run {
        cluster,
        ns,
        _op: op,
        seeded,
        ids,
        before,
        stop_writer,
        writer,
        stop_actor,
        actor,
        started,
    }
}

/// Waits for `Blocked=True` naming the live foreign set; returns its uid and the message.
async fn wait_blocked(ns: &TestNamespace, request: &str) -> (String, String) {
    let req = wait_status(ns, request, "Blocked", Duration::from_secs(120), |s| {
        blocked(s)
            .is_some_and(|(status, reason, _)| status == "True" && reason == "ForeignStatefulSet")
    })
    .await
    .unwrap();
    let (_, _, message) = blocked(req.status.as_ref().unwrap()).unwrap();
    let uid = ns
        .api::<StatefulSet>()
        .get(SET)
        .await
        .unwrap()
        .uid()
        .unwrap();
    assert!(
        message.starts_with(&format!(
            "StatefulSet {SET} (uid {uid}) was created by someone else while the request was"
        )),
        "{message}"
    );
    (uid, message)
}

/// Stops the writer; every acknowledged write and seeded key is on every member, and the member
/// ids are those from before.
async fn check_etcd(run: Run) -> (etcd::Written, TestNamespace) {
    tokio::time::sleep(Duration::from_secs(2)).await;
    run.stop_writer.store(true, Ordering::Relaxed);
    let written = run.writer.await.unwrap();
    assert!(!written.acked.is_empty(), "the writer wrote");
    run.ns
        .wait_statefulset_ready(SET, 3, ETCD_READY)
        .await
        .unwrap();
    let mut expected = run.seeded.clone();
    expected.extend(written.acked.iter().cloned());
    let (count, hash) = etcd::assert_keys_everywhere(&run.ns, SET, 3, &expected).await;
    assert!(count >= expected.len());
    assert_eq!(
        etcd::member_ids(&run.ns, SET, 3).await,
        run.ids,
        "no member restarted on an empty volume: the etcd member ids are unchanged"
    );
    info!(
        count,
        hash,
        acked = written.acked.len(),
        failures = written.failures,
        "etcd intact"
    );
    (written, run.ns)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_recreated_for_the_whole_request_fails_it_naming_the_set() {
    let mut run = start("smr-foreign-fail", "held", "60s", first_member_started).await;
    let ns = &run.ns;
    let (uid, message) = wait_blocked(ns, "held").await;
    info!(took = ?run.started.elapsed(), %message, "blocked");
    let req = wait_final(ns, "held", FINAL).await.unwrap();
    let took = run.started.elapsed();
    let status = req.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Failed, "{}", summary(&req));
    let named = format!("StatefulSet {SET} (uid {uid})");
    let failure = status.failure.clone().unwrap();
    assert!(
        failure.contains(&named) && failure.contains("created by someone else"),
        "{failure}"
    );
    let final_message = status.message.clone().unwrap();
    assert!(
        final_message.contains(&format!(
            "{named} was created by someone else and is left alone"
        )),
        "{final_message}"
    );
    assert!(
        status.members.iter().all(|m| m.step != MemberStep::Done),
        "{}",
        summary(&req)
    );
    // The actor ran the whole request; the recreated set was left alone.
    run.stop_actor.store(true, Ordering::Relaxed);
    let created = (&mut run.actor).await.unwrap();
    assert!(created.contains(&uid), "{created:?}");
    let live = ns.api::<StatefulSet>().get(SET).await.unwrap();
    assert_eq!(live.uid().as_deref(), Some(uid.as_str()));
    assert!(
        !live
            .annotations()
            .contains_key(CREATED_BY_REQUEST_ANNOTATION)
    );
    assert_eq!(
        claims(ns).await,
        run.before,
        "every member on its original claim and volume"
    );
    let events = ns
        .events_through("held", "Failed", FINAL_EVENT)
        .await
        .unwrap();
    for reason in ["Blocked", "RollingBack", "Failed"] {
        assert!(
            events.iter().any(|e| e.starts_with(reason)),
            "no {reason} event in {events:?}"
        );
    }
    info!(?took, %failure, "failed naming the set");
    check_etcd(run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_recreated_then_removed_lets_the_request_finish() {
    let run = start("smr-foreign-resume", "resumes", "10m", first_member_started).await;
    let ns = &run.ns;
    let (uid, _) = wait_blocked(ns, "resumes").await;
    // Held still for a while: no member moves on.
    let step = |s: &StorageMigrationRequestStatus| s.members.iter().map(|m| m.step).max();
    let held = wait_status(ns, "resumes", "blocked", Duration::from_secs(10), |_| true)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let still = wait_status(ns, "resumes", "blocked", Duration::from_secs(10), |_| true)
        .await
        .unwrap();
    let (held, still) = (held.status.unwrap(), still.status.unwrap());
    assert_eq!(step(&held), step(&still), "nothing moved while blocked");
    assert!(step(&still) <= Some(MemberStep::StoppingPod), "{still:?}");
    // The owner is paused (the actor stops) and the set it recreated is deleted, orphaning pods.
    run.stop_actor.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..Default::default()
    };
    ns.api::<StatefulSet>().delete(SET, &dp).await.unwrap();
    info!(took = ?run.started.elapsed(), "foreign set deleted");
    let req = wait_final(ns, "resumes", FINAL).await.unwrap();
    let took = run.started.elapsed();
    let status = req.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Successful, "{}", summary(&req));
    let (cleared, reason, _) = blocked(&status).unwrap();
    assert_eq!((cleared.as_str(), reason.as_str()), ("False", "Clear"));
    // The set there now is the operator's own, recorded.
    let ours = ns.api::<StatefulSet>().get(SET).await.unwrap();
    assert_ne!(ours.uid().as_deref(), Some(uid.as_str()));
    assert_eq!(status.recreated_stateful_set_uid, ours.uid());
    assert_eq!(
        ours.annotations().get(CREATED_BY_REQUEST_ANNOTATION),
        req.uid().as_ref()
    );
    for (claim, (_, class, _)) in claims(ns).await {
        assert_eq!(class, run.cluster.wffc_storage_class, "{claim}");
    }
    let events = ns
        .events_through("resumes", "Successful", FINAL_EVENT)
        .await
        .unwrap();
    for reason in ["Blocked", "Unblocked", "Successful"] {
        assert!(
            events.iter().any(|e| e.starts_with(reason)),
            "no {reason} event in {events:?}"
        );
    }
    info!(?took, "successful after the actor stopped");
    check_etcd(run).await;
}

/// The case: the set comes back while the first member is down for its final copy. The
/// set's controller starts that member again on its old claim; the request must not swap a stale
/// copy in, nor delete the claim the pod uses: it rolls back (at once, or when its timeout
/// expires while blocked), naming the set, with every member on its original claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_recreated_while_a_member_is_down_keeps_it_on_its_old_claim() {
    let mut run = start("smr-foreign-down", "down", "60s", |s| {
        s.members.iter().any(|m| m.step >= MemberStep::Copying)
    })
    .await;
    let ns = &run.ns;
    let req = wait_final(ns, "down", FINAL).await.unwrap();
    let took = run.started.elapsed();
    let status = req.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Failed, "{}", summary(&req));
    let uid = ns
        .api::<StatefulSet>()
        .get(SET)
        .await
        .unwrap()
        .uid()
        .unwrap();
    let named = format!("StatefulSet {SET} (uid {uid})");
    let failure = status.failure.clone().unwrap();
    assert!(failure.contains(&named), "{failure}");
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or_default()
            .contains(&format!(
                "{named} was created by someone else and is left alone"
            )),
        "{}",
        summary(&req)
    );
    run.stop_actor.store(true, Ordering::Relaxed);
    let created = (&mut run.actor).await.unwrap();
    assert_eq!(created.first(), Some(&uid), "{created:?}");
    assert_eq!(
        claims(ns).await,
        run.before,
        "every member on its original claim and volume"
    );
    info!(?took, %failure, "member kept on its old claim");
    check_etcd(run).await;
}
