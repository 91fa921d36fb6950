//! A StatefulSet whose `persistentVolumeClaimRetentionPolicy` deletes its claims
//! (`whenDeleted: Delete, whenScaled: Delete`, GA since Kubernetes 1.32), moved by a
//! `StorageClassChange` and then by a `Shrink`, with a client writing to etcd throughout, against
//! the cluster `KUBECONFIG` points at (a server that knows the field: older ones drop it, and the
//! first assertion fails there).
//!
//! The one path where a mistake deletes every claim of a database at once: the operator
//! orphan-deletes the set and recreates it. A watch on the namespace's claims, started before
//! the first request, records every claim the API server deletes; each member's claim must be
//! deleted exactly once per request (by the swap, which recreates it on the new volume) and each
//! temporary claim at most once, nothing else. The recreated set carries the user's policy, and
//! a `kubectl delete` of the set afterwards (background propagation) garbage-collects its
//! claims, as the policy says. No acknowledged write is lost; every member keeps its etcd id.
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test retention`

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use e2e::testing::TestNamespace;
use e2e::testing::etcd;
use e2e::testing::faults::{ETCD_SET, EtcdUnderLoad};
use e2e::testing::operator::{self, Operator, summary};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject};
use kube::runtime::watcher;
use serde_json::json;
use storage_migrator::api::Phase;

const MIGRATION: Duration = Duration::from_secs(900);
const MEMBERS: usize = 3;

/// The fixture's StatefulSet with a retention policy that deletes claims.
fn deleting_retention(obj: &mut DynamicObject) {
    if obj.types.as_ref().is_some_and(|t| t.kind == "StatefulSet") {
        obj.data["spec"]["persistentVolumeClaimRetentionPolicy"] =
            json!({"whenDeleted": "Delete", "whenScaled": "Delete"});
    }
}

/// Every claim deletion the watch saw, by claim name (one entry per deletion: the uid).
type Deletions = Arc<Mutex<BTreeMap<String, Vec<String>>>>;

/// Records every claim deletion in the namespace until the returned task is aborted.
fn watch_claim_deletions(ns: &TestNamespace) -> (Deletions, tokio::task::JoinHandle<()>) {
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let seen: Deletions = Arc::default();
    let record = seen.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher::watcher(claims, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Delete(c)) = event {
                let mut seen = record.lock().unwrap_or_else(PoisonError::into_inner);
                seen.entry(c.name_any())
                    .or_default()
                    .push(c.uid().unwrap_or_default());
            }
        }
    });
    (seen, task)
}

fn member_claims() -> Vec<String> {
    (0..MEMBERS)
        .map(|i| format!("data-{ETCD_SET}-{i}"))
        .collect()
}

/// Waits until every member claim has an ownerReference to the set `uid` (the StatefulSet
/// controller adds it for `whenDeleted: Delete`).
async fn wait_claims_owned_by(ns: &TestNamespace, uid: &str) {
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut owned = 0;
        for name in member_claims() {
            let c = claims.get(&name).await.expect("get claim");
            let refs = c.metadata.owner_references.unwrap_or_default();
            owned += usize::from(refs.iter().any(|r| r.kind == "StatefulSet" && r.uid == uid));
        }
        if owned == MEMBERS {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{owned} of {MEMBERS} claims have an ownerReference to the set {uid}: the server \
             does not apply persistentVolumeClaimRetentionPolicy"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The set's policy, and its uid.
async fn set_policy(ns: &TestNamespace) -> (serde_json::Value, String) {
    let sets: Api<StatefulSet> = ns.api();
    let set = sets.get(ETCD_SET).await.expect("get the set");
    let policy = set
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_claim_retention_policy.clone());
    (
        serde_json::to_value(policy).unwrap_or_default(),
        set.uid().unwrap_or_default(),
    )
}

/// Runs request `name` with `spec` to Successful.
async fn run_request(ns: &TestNamespace, name: &str, spec: serde_json::Value) {
    operator::create_request(ns, name, spec)
        .await
        .expect("create the request");
    let req = operator::wait_final(ns, name, MIGRATION)
        .await
        .expect("final");
    println!("NOTE retention {name}: {}", summary(&req));
    assert_eq!(
        req.status.as_ref().map(|s| s.phase),
        Some(Phase::Successful),
        "{}",
        summary(&req)
    );
}

/// Each member claim deleted exactly `per_claim` times (the swaps), each temporary claim at
/// most once, no other claim.
fn assert_only_swap_deletions(deletions: &Deletions, per_claim: usize) {
    let seen = deletions
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    for name in member_claims() {
        let n = seen.get(&name).map_or(0, Vec::len);
        assert_eq!(n, per_claim, "{name} deleted {n} times: {seen:?}");
    }
    for (name, uids) in &seen {
        if member_claims().contains(name) {
            continue;
        }
        assert!(
            name.contains("-smr-") && uids.len() == 1,
            "claim {name} deleted {} times, and it is no temporary claim: {seen:?}",
            uids.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_whose_policy_deletes_claims_moves_and_shrinks_without_losing_one() {
    let run = EtcdUnderLoad::start_with("smr-retention", deleting_retention)
        .await
        .expect("setup");
    let ns = &run.ns;
    let (policy, uid) = set_policy(ns).await;
    assert_eq!(
        policy,
        json!({"whenDeleted": "Delete", "whenScaled": "Delete"}),
        "the server kept the policy"
    );
    wait_claims_owned_by(ns, &uid).await;
    let ids_before = etcd::member_ids(ns, ETCD_SET, MEMBERS).await;
    let (deletions, watch) = watch_claim_deletions(ns);
    let _op = Operator::start(ns, 0, None).await.expect("operator");

    run.create_request("to-fast").await.expect("request");
    let req = operator::wait_final(ns, "to-fast", MIGRATION)
        .await
        .expect("final");
    assert_eq!(
        req.status.as_ref().map(|s| s.phase),
        Some(Phase::Successful),
        "{}",
        summary(&req)
    );
    assert_only_swap_deletions(&deletions, 1);
    let (policy_after, uid_after) = set_policy(ns).await;
    assert_eq!(
        policy_after, policy,
        "the recreated set has the user's policy"
    );
    wait_claims_owned_by(ns, &uid_after).await;

    let shrink = json!({
        "type": "Shrink",
        "target": {"kind": "StatefulSet", "name": ETCD_SET},
        "shrink": {"size": "512Mi"},
        "timeout": "20m",
        "database": {"engine": "Etcd"},
    });
    run_request(ns, "shrink", shrink).await;
    assert_only_swap_deletions(&deletions, 2);
    let (policy_after, uid_after) = set_policy(ns).await;
    assert_eq!(
        policy_after, policy,
        "the recreated set has the user's policy"
    );
    wait_claims_owned_by(ns, &uid_after).await;
    let claims: Api<PersistentVolumeClaim> = ns.api();
    for name in member_claims() {
        let claim = claims.get(&name).await.expect("claim");
        let size = claim.spec.as_ref().map(e2e::testing::requested_size);
        assert_eq!(size.as_deref(), Some("512Mi"), "{name} shrunk");
    }

    let (_cluster, ns, _written) = run.finish().await;
    assert_eq!(
        etcd::member_ids(&ns, ETCD_SET, MEMBERS).await,
        ids_before,
        "every member kept its identity"
    );
    watch.abort();

    // What the user's policy says a delete of the set does: its claims go with it.
    let sets: Api<StatefulSet> = ns.api();
    sets.delete(ETCD_SET, &DeleteParams::background())
        .await
        .expect("delete the set");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut left = Vec::new();
        for name in member_claims() {
            if claims.get_opt(&name).await.expect("get claim").is_some() {
                left.push(name);
            }
        }
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "whenDeleted: Delete, yet {left:?} outlived the set"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
