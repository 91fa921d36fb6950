//! End-to-end scenario of a StatefulSet that another controller manages, against the cluster
//! `KUBECONFIG` points at, in its own namespace with its own operator process watching only that
//! namespace: the etcd fixture's StatefulSet gets the labels Flux's kustomize-controller puts on
//! what it applies;
//!
//! - a request without `ownerPaused` is denied `ForeignOwner`, naming the Kustomization, and
//!   nothing is touched (same StatefulSet, same claims, no finalizer);
//! - a request with `ownerPaused: true` is accepted, its message saying the owner was declared
//!   paused; it is then deleted, and its finalizer rolls it back before it goes.
//!
//! The operator binary comes from `STORAGE_MIGRATOR_BIN` (default
//! `<workspace>/target/debug/storage-migrator`).
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test owners`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use e2e::testing::operator::{
    Operator, create_request, install_crd, summary, wait_final, wait_status,
};
use e2e::testing::{ETCD_READY, TestNamespace, etcd, scenario};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use storage_migrator::api::{Phase, StorageMigrationRequest};
use storage_migrator::labels::FLUX_KUSTOMIZATION_LABELS;
use tracing::info;

const ROLLBACK: Duration = Duration::from_secs(600);
const SET: &str = "etcd";

/// `claim → (volume, class, requested size)` of the set's claims; each must be Bound.
async fn claims(ns: &TestNamespace) -> BTreeMap<String, (String, String, String)> {
    e2e::testing::assert_claims_bound(ns, SET, 3).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flux_managed_set_is_denied_unless_declared_paused() {
    let (cluster, ns) = scenario("smr-owners").await;
    install_crd(&ns).await.unwrap();
    ns.apply_etcd().await.unwrap();
    let seeded = etcd::seed_keys(&ns, SET, 50).await.unwrap();
    let etcd_before = etcd::assert_keys_everywhere(&ns, SET, 3, &seeded).await;

    let sets: Api<StatefulSet> = ns.api();
    let [name_label, ns_label] = FLUX_KUSTOMIZATION_LABELS;
    let labels = json!({"metadata": {"labels": {name_label: "apps", ns_label: "flux-system"}}});
    let set = sets
        .patch(SET, &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .unwrap();
    let set_uid = set.uid().unwrap();
    let before = claims(&ns).await;
    let _op = Operator::start(&ns, 0, None).await.unwrap();
    let started = Instant::now();

    let spec = |paused: bool| {
        json!({
            "type": "StorageClassChange",
            "target": {"kind": "StatefulSet", "name": SET},
            "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
            "timeout": "30m",
            "database": {"engine": "Etcd"},
            "ownerPaused": paused,
        })
    };

    // Without the declaration: denied, naming the Kustomization; nothing touched.
    create_request(&ns, "unpaused", spec(false)).await.unwrap();
    let denied = wait_final(&ns, "unpaused", Duration::from_secs(60))
        .await
        .unwrap();
    let status = denied.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Denied, "{}", summary(&denied));
    let accepted = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Accepted")
        .unwrap();
    assert_eq!(accepted.reason, "ForeignOwner", "{}", accepted.message);
    assert!(
        accepted
            .message
            .contains("Flux Kustomization flux-system/apps")
            && accepted
                .message
                .contains("flux suspend kustomization apps -n flux-system"),
        "{}",
        accepted.message
    );
    assert!(denied.finalizers().is_empty());
    assert_eq!(sets.get(SET).await.unwrap().uid().unwrap(), set_uid);
    assert_eq!(claims(&ns).await, before);
    info!(took = ?started.elapsed(), "denied ForeignOwner");

    // Declared paused: accepted, the message saying so; then deleted and rolled back.
    create_request(&ns, "paused", spec(true)).await.unwrap();
    let running = wait_status(&ns, "paused", "accepted", Duration::from_secs(60), |s| {
        s.phase != Phase::Pending
    })
    .await
    .unwrap();
    let status = running.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Progressing, "{}", summary(&running));
    assert!(
        status.message.as_deref().is_some_and(|m| m.ends_with(
            "; Flux Kustomization flux-system/apps declared paused by spec.ownerPaused"
        )),
        "{}",
        summary(&running)
    );
    let api: Api<StorageMigrationRequest> = ns.api();
    let uid = running.uid().unwrap();
    api.delete("paused", &DeleteParams::default())
        .await
        .unwrap();
    ns.wait_deleted(api, "paused", &uid, ROLLBACK)
        .await
        .unwrap();
    info!(took = ?started.elapsed(), "paused request accepted, then rolled back and gone");

    ns.wait_statefulset_ready(SET, 3, ETCD_READY).await.unwrap();
    assert_eq!(
        claims(&ns).await,
        before,
        "every claim on its original volume and class"
    );
    assert_eq!(
        etcd::assert_keys_everywhere(&ns, SET, 3, &seeded).await,
        etcd_before,
        "etcd key count and hash unchanged"
    );
}
