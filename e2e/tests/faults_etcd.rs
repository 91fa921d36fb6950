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

use e2e::testing::TestNamespace;
use e2e::testing::faults::EtcdUnderLoad;
use e2e::testing::operator::{self, Operator, summary};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::watcher;
use storage_migrator::api::{Phase, StorageMigrationRequest};
use storage_migrator::labels;

const MIGRATION: Duration = Duration::from_secs(900);

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
    let run = EtcdUnderLoad::start("fault-mover-deleted")
        .await
        .expect("setup");
    let ns = &run.ns;
    let op = Operator::start(ns, 0, None).await.expect("operator");
    let stop_deleting = Arc::new(AtomicBool::new(false));
    let deleter = delete_copy_pods(ns, stop_deleting.clone());
    run.create_request("mover-deleted").await.expect("request");
    let req = operator::wait_final(ns, "mover-deleted", MIGRATION)
        .await
        .expect("final");
    stop_deleting.store(true, Ordering::Relaxed);
    let deleted = deleter.await.expect("deleter");
    let (_cluster, _ns, written) = run.finish().await;
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
    let run = EtcdUnderLoad::start("fault-operator-killed")
        .await
        .expect("setup");
    let ns = &run.ns;
    let seed = std::env::var("FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 | 1)
        });
    let mut rng = Rng(seed);
    run.create_request("killed").await.expect("request");
    let api: Api<StorageMigrationRequest> = ns.api();
    let started = Instant::now();
    let mut kills = Vec::new();
    for attempt in 0..15 {
        let op = Operator::start(ns, attempt, None).await.expect("operator");
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
    let _op = Operator::start(ns, 99, None).await.expect("operator");
    let req = operator::wait_final(ns, "killed", MIGRATION)
        .await
        .expect("final");
    let (_cluster, _ns, written) = run.finish().await;
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
