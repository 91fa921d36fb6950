//! Faults injected while a 3-member etcd is migrated and a client writes to it through the whole
//! request (issue 13's fault-injection suite; `docs/faults.md` lists every fault tried). Each
//! scenario must end in a clear state (Successful, or Failed after a rollback), with every
//! acknowledged write on every member, the members agreeing, and nothing of the request left:
//! no Job, no helper pod, no temporary claim.
//!
//! - the first mover pod of each final copy deleted as soon as it appears, for every member;
//! - the operator killed (SIGKILL) at random moments, many times over one request.
//!
//! The crash loop of a member while another waits at its gate is in `etcd_quorum.rs`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e::testing::operator::{self, Operator, install_crd, summary};
use e2e::testing::{TestCluster, TestNamespace, etcd, scenario};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::watcher;
use serde_json::json;
use storage_migrator::api::{Phase, StorageMigrationRequest};
use storage_migrator::labels;

const SET: &str = "etcd";
const MIGRATION: Duration = Duration::from_secs(900);

/// The etcd fixture, seeded, and a writer putting `seed/w-<n>` keys until the returned flag is
/// set.
async fn setup(
    test: &str,
) -> (
    TestCluster,
    TestNamespace,
    BTreeSet<String>,
    Arc<AtomicBool>,
    tokio::task::JoinHandle<etcd::Written>,
) {
    let (cluster, ns) = scenario(test).await;
    install_crd(&ns).await.expect("CRD");
    ns.apply_etcd().await.expect("etcd");
    let seeded = etcd::seed_keys(&ns, SET, 50).await.expect("seed");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = etcd::start_writer(&ns, SET, 3, "seed/w-", stop.clone());
    (cluster, ns, seeded, stop, writer)
}

/// Creates request `name`: the set's volumes to the WaitForFirstConsumer class.
async fn create(ns: &TestNamespace, cluster: &TestCluster, name: &str) {
    let spec = json!({
        "type": "StorageClassChange",
        "target": {"kind": "StatefulSet", "name": SET},
        "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
        "timeout": "20m",
        "database": {"engine": "Etcd"},
    });
    operator::create_request(ns, name, spec)
        .await
        .expect("create the request");
}

/// The end of every scenario: the writer stopped, every acknowledged and seeded key on every
/// member (which agree), nothing of the request left. Returns the writer's counts for the NOTE.
async fn check_end(
    ns: &TestNamespace,
    seeded: BTreeSet<String>,
    stop: Arc<AtomicBool>,
    writer: tokio::task::JoinHandle<etcd::Written>,
) -> etcd::Written {
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let written = writer.await.expect("writer");
    let mut expected = seeded;
    expected.extend(written.acked.iter().cloned());
    etcd::assert_keys_everywhere(ns, SET, 3, &expected).await;
    let left = leftovers(ns).await;
    assert!(left.is_empty(), "left behind: {left:?}");
    written
}

/// The request's Jobs, helper pods and temporary claims still in the namespace.
async fn leftovers(ns: &TestNamespace) -> Vec<String> {
    let mut left = Vec::new();
    let jobs: Api<Job> = ns.api();
    for j in jobs.list(&ListParams::default()).await.expect("jobs").items {
        left.push(format!("job {}", j.name_any()));
    }
    let pods: Api<Pod> = ns.api();
    let ours = ListParams::default().labels(labels::REQUEST_LABEL);
    for p in pods.list(&ours).await.expect("pods").items {
        left.push(format!("pod {}", p.name_any()));
    }
    let claims: Api<PersistentVolumeClaim> = ns.api();
    for c in claims
        .list(&ListParams::default())
        .await
        .expect("claims")
        .items
    {
        if c.name_any().contains("-smr-") {
            left.push(format!("claim {}", c.name_any()));
        }
    }
    left
}

/// Deletes the first pod of every final-copy Job as soon as the watch shows it, until `stop`;
/// returns how many it deleted.
fn delete_copy_pods(ns: &TestNamespace, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<usize> {
    let pods: Api<Pod> = ns.api();
    tokio::spawn(async move {
        let selector = format!("{}=copy", labels::JOB_KIND_LABEL);
        let config = watcher::Config::default().labels(&selector);
        let mut stream = watcher::watcher(pods.clone(), config).boxed();
        let mut deleted = BTreeSet::new();
        while !stop.load(Ordering::Relaxed) {
            let next = tokio::time::timeout(Duration::from_millis(500), stream.next()).await;
            let Ok(Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)))) = next
            else {
                continue;
            };
            // The first pod of each copy Job only: the Job's replacement is left to finish.
            let name = pod.name_any();
            let job = pod.labels().get("job-name").cloned().unwrap_or_default();
            if pod.metadata.deletion_timestamp.is_none() && deleted.insert(job) {
                let gone = pods.delete(&name, &DeleteParams::default()).await;
                println!(
                    "NOTE faults: deleted copy pod {name}: {:?}",
                    gone.map(|_| ())
                );
            }
        }
        deleted.len()
    })
}

/// The first mover pod of each final copy is deleted the moment it appears (while the member is
/// down):
/// the Job replaces it or the member rolls back; either way the request ends in a clear state
/// with no write lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mover_pod_deleted_during_the_final_copy_loses_nothing() {
    let (cluster, ns, seeded, stop, writer) = setup("fault-mover-deleted").await;
    let op = Operator::start(&ns, 0, None).await.expect("operator");
    let stop_deleting = Arc::new(AtomicBool::new(false));
    let deleter = delete_copy_pods(&ns, stop_deleting.clone());
    create(&ns, &cluster, "mover-deleted").await;
    let req = operator::wait_final(&ns, "mover-deleted", MIGRATION)
        .await
        .expect("final");
    stop_deleting.store(true, Ordering::Relaxed);
    let deleted = deleter.await.expect("deleter");
    let written = check_end(&ns, seeded, stop, writer).await;
    let status = req.status.clone().unwrap_or_default();
    println!(
        "NOTE faults mover-deleted: {deleted} copy pod(s) deleted; operator restarts {}; ended \
         {:?}: {}; writes acknowledged {} failed {}",
        op.restarts(),
        status.phase,
        summary(&req),
        written.acked.len(),
        written.failures
    );
    assert!(deleted >= 1, "no copy pod was seen and deleted");
    assert!(
        matches!(status.phase, Phase::Successful | Phase::Failed),
        "{}",
        summary(&req)
    );
    if status.phase == Phase::Failed {
        assert!(
            status
                .message
                .as_deref()
                .is_some_and(|m| m.contains("Data:")),
            "a failure says where the data is: {}",
            summary(&req)
        );
    }
}

/// A tiny deterministic generator (xorshift) for the kill times; its seed is printed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The operator is killed with SIGKILL at random moments (0.5 to 8 s after each start), up to
/// 15 times over one request, then left to finish: the request ends Successful with every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_killed_at_random_moments_many_times_still_finishes() {
    let (cluster, ns, seeded, stop, writer) = setup("fault-operator-killed").await;
    let seed = std::env::var("FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 | 1)
        });
    let mut rng = Rng(seed);
    create(&ns, &cluster, "killed").await;
    let api: Api<StorageMigrationRequest> = ns.api();
    let started = Instant::now();
    let mut kills = Vec::new();
    for run in 0..15 {
        let op = Operator::start(&ns, run, None).await.expect("operator");
        let after = Duration::from_millis(500 + rng.below(7500));
        tokio::time::sleep(after).await;
        drop(op); // SIGKILL
        let req = api.get("killed").await.expect("request");
        let status = req.status.clone().unwrap_or_default();
        kills.push(format!("{after:?}: {:?}", status.stage));
        if status.phase.is_final() {
            break;
        }
    }
    let _op = Operator::start(&ns, 99, None).await.expect("operator");
    let req = operator::wait_final(&ns, "killed", MIGRATION)
        .await
        .expect("final");
    let written = check_end(&ns, seeded, stop, writer).await;
    println!(
        "NOTE faults operator-killed: seed {seed} (FAULT_SEED to replay); {} kill(s) [{}]; \
         ended after {:?}: {}; writes acknowledged {} failed {}",
        kills.len(),
        kills.join(", "),
        started.elapsed(),
        summary(&req),
        written.acked.len(),
        written.failures
    );
    assert!(kills.len() >= 5, "killed only {} times", kills.len());
    assert_eq!(
        req.status.as_ref().map(|s| s.phase),
        Some(Phase::Successful),
        "{}",
        summary(&req)
    );
}
