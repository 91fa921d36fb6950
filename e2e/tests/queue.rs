//! End-to-end scenario of the request queue, against the cluster `KUBECONFIG` points at, in its
//! own namespace with its own operator process watching only that namespace: three requests on
//! one StatefulSet, applied together before the operator starts, are judged one at a time,
//! oldest first (creation time, then name):
//!
//! - `q1-bad`, a Shrink to a size that is not smaller, is denied with its own reason: it is
//!   neither held up by the others nor holds them up once denied;
//! - `q2-move`, a StorageClassChange, runs and ends `Successful`;
//! - `q3-shrink`, a Shrink of the same set, waits `Pending` with the condition `Queued` naming
//!   `q2-move` while that one runs, then runs and ends `Successful`.
//!
//! The operator binary comes from `STORAGE_MIGRATOR_BIN` (default
//! `<workspace>/target/debug/storage-migrator`).
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test queue`

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use e2e::testing::operator::{
    Operator, create_request, install_crd, summary, wait_final, wait_status,
};
use e2e::testing::{ETCD_READY, FINAL_EVENT, TestNamespace, etcd, scenario};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::json;
use storage_migrator::api::{Phase, StorageMigrationRequestStatus};
use tracing::info;

const MIGRATION: Duration = Duration::from_secs(600);
const SET: &str = "etcd";

/// `claim → (volume, class, requested size)` of the set's claims; each must be Bound.
async fn claims(ns: &TestNamespace) -> BTreeMap<String, (String, String, String)> {
    e2e::testing::assert_claims_bound(ns, SET, 3).await
}

/// Writes `n` keys `seed/<i>` through one member; returns them.
async fn seed(ns: &TestNamespace, n: usize) -> BTreeSet<String> {
    etcd::seed_keys(ns, SET, n).await.unwrap()
}

/// Every seeded key through every member, equal counts and `hash_kv` (see
/// [`etcd::assert_keys_everywhere`]). Returns (key count, hash).
async fn check_etcd(ns: &TestNamespace, expected: &BTreeSet<String>) -> (usize, u32) {
    etcd::assert_keys_everywhere(ns, SET, 3, expected).await
}

fn condition<'a>(s: &'a StorageMigrationRequestStatus, type_: &str) -> Option<&'a Condition> {
    s.conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the request waits in `Pending` with `Queued=True` naming `ahead` as `Progressing`
/// (seen by a periodic look: nothing of the request ahead wakes the waiting one).
fn queued_behind(s: &StorageMigrationRequestStatus, ahead: &str) -> bool {
    s.phase == Phase::Pending
        && condition(s, "Queued").is_some_and(|c| {
            c.status == "True"
                && c.reason == "WaitingForRequest"
                && c.message
                    .contains(&format!("request {ahead} (Progressing)"))
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_on_one_set_are_judged_one_at_a_time_oldest_first() {
    let (cluster, ns) = scenario("smr-queue").await;
    install_crd(&ns).await.unwrap();
    ns.apply_etcd().await.unwrap();
    let seeded = seed(&ns, 50).await;
    let before = claims(&ns).await;
    let etcd_before = check_etcd(&ns, &seeded).await;

    // Applied together (possibly in the same second: the names then give the order), before
    // the operator looks at any of them.
    let request = |type_: &str, block: serde_json::Value| {
        let mut spec = json!({
            "type": type_,
            "target": {"kind": "StatefulSet", "name": SET},
            "timeout": "10m",
            "database": {"engine": "Etcd"},
        });
        spec.as_object_mut()
            .unwrap()
            .extend(block.as_object().unwrap().clone());
        spec
    };
    let shrink_too_big = json!({"shrink": {"size": "2Gi"}});
    let to_wffc = json!({"storageClassChange": {"storageClassName": cluster.wffc_storage_class}});
    let shrink = json!({"shrink": {"size": "256Mi"}});
    create_request(&ns, "q1-bad", request("Shrink", shrink_too_big))
        .await
        .unwrap();
    create_request(&ns, "q2-move", request("StorageClassChange", to_wffc))
        .await
        .unwrap();
    create_request(&ns, "q3-shrink", request("Shrink", shrink))
        .await
        .unwrap();
    let started = Instant::now();
    let _op = Operator::start(&ns, 0, None).await.unwrap();

    // The oldest is judged first and denied with its own reason, never queued.
    let bad = wait_final(&ns, "q1-bad", Duration::from_secs(60))
        .await
        .unwrap();
    let status = bad.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Denied, "{}", summary(&bad));
    let accepted = condition(&status, "Accepted").unwrap();
    assert_eq!(accepted.reason, "NotSmaller", "{}", accepted.message);
    assert!(
        condition(&status, "Queued").is_none(),
        "{:?}",
        status.conditions
    );

    // The next one runs; the last one waits for it, naming it, with nothing of its own.
    wait_status(
        &ns,
        "q2-move",
        "progressing",
        Duration::from_secs(60),
        |s| s.phase == Phase::Progressing,
    )
    .await
    .unwrap();
    let waiting = wait_status(
        &ns,
        "q3-shrink",
        "queued behind q2-move",
        Duration::from_secs(60),
        |s| queued_behind(s, "q2-move"),
    )
    .await
    .unwrap();
    info!(status = %summary(&waiting), "q3-shrink waits");
    assert!(waiting.metadata.finalizers.unwrap_or_default().is_empty());
    // The status is written before the step's events: wait for the event, do not list them.
    let queued = ns
        .wait_for_event("q3-shrink", "Queued", FINAL_EVENT)
        .await
        .unwrap();
    // Emitted once, when it starts waiting: behind q1-bad or q2-move, whichever was ahead then.
    assert!(
        queued.starts_with("waiting for request q"),
        "Queued event: {queued}"
    );

    let moved = wait_final(&ns, "q2-move", MIGRATION).await.unwrap();
    info!(took = ?started.elapsed(), status = %summary(&moved), "q2-move done");
    let moved = moved.status.unwrap();
    assert_eq!(moved.phase, Phase::Successful);

    let shrunk = wait_final(&ns, "q3-shrink", MIGRATION).await.unwrap();
    info!(took = ?started.elapsed(), status = %summary(&shrunk), "q3-shrink done");
    let status = shrunk.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Successful, "{}", summary(&shrunk));
    let queued = condition(&status, "Queued").unwrap();
    assert_eq!(
        (queued.status.as_str(), queued.reason.as_str()),
        ("False", "TurnCame")
    );
    // It started only once q2-move had ended.
    let (ended, began) = (moved.completion_time.unwrap(), status.start_time.unwrap());
    assert!(
        began.0 >= ended.0,
        "q3-shrink began {began:?}, q2-move ended {ended:?}"
    );

    ns.wait_statefulset_ready(SET, 3, ETCD_READY).await.unwrap();
    let after = claims(&ns).await;
    for (claim, (volume, class, size)) in &after {
        assert_eq!(class, &cluster.wffc_storage_class, "{claim}");
        assert_eq!(size, "256Mi", "{claim}");
        assert_ne!(volume, &before[claim].0, "{claim} is on a new volume");
    }
    assert_eq!(
        check_etcd(&ns, &seeded).await,
        etcd_before,
        "etcd key count and hash unchanged"
    );
}
