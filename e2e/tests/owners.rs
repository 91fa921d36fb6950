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
//! And the owners a claim has itself: a one-member generic StatefulSet whose claim a user gave a
//! label, an annotation and an ownerReference to a ConfigMap of their own is moved to another
//! class; the recreated claim has all three back (the ConfigMap by its uid), none of the
//! control plane's binding annotations of the old claim and no key of ours.
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
use e2e::testing::{ETCD_READY, TestNamespace, etcd, one_member_set, scenario};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use storage_migrator::api::{Phase, StorageMigrationRequest};
use storage_migrator::labels::{self, FLUX_KUSTOMIZATION_LABELS};
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

const APP: &str = "app";
const APP_CLAIM: &str = "data-app-0";

/// A one-member StatefulSet in the mover image, idle on a 64Mi claim (a TERM ends it at once).
fn app_set(image: &str, class: &str) -> StatefulSet {
    let script = "trap 'exit 0' TERM; echo x > /data/x; while true; do sleep 1; done";
    one_member_set(APP, image, class, "64Mi", script)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_claim_keeps_its_users_labels_annotations_and_owners() {
    let (cluster, ns) = scenario("smr-claim-owners").await;
    install_crd(&ns).await.unwrap();
    let set = app_set(&cluster.mover_image, &cluster.storage_class);
    ns.create_statefulset_ready(&set).await.unwrap();
    let keeper: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "keeper"}})).unwrap();
    let keeper = ns
        .api::<ConfigMap>()
        .create(&PostParams::default(), &keeper)
        .await
        .unwrap();
    let keeper_uid = keeper.uid().unwrap();
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let patch = json!({"metadata": {
        "labels": {"team": "db"},
        "annotations": {"example.com/backup": "daily"},
        "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "keeper", "uid": keeper_uid,
        }],
    }});
    let before = claims
        .patch(APP_CLAIM, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let old_volume = before.spec.clone().unwrap().volume_name.unwrap();
    info!(annotations = ?before.annotations(), "claim before");

    let _op = Operator::start(&ns, 0, None).await.unwrap();
    create_request(
        &ns,
        "owners",
        json!({
            "type": "StorageClassChange",
            "target": {"kind": "StatefulSet", "name": APP},
            "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
            "timeout": "10m",
            "database": {"engine": "Generic"},
        }),
    )
    .await
    .unwrap();
    let req = wait_final(&ns, "owners", Duration::from_secs(600))
        .await
        .unwrap();
    assert_eq!(
        req.status.clone().unwrap().phase,
        Phase::Successful,
        "{}",
        summary(&req)
    );

    let after = claims.get(APP_CLAIM).await.unwrap();
    info!(annotations = ?after.annotations(), labels = ?after.labels(), "claim after");
    let spec = after.spec.clone().unwrap();
    assert_ne!(spec.volume_name.as_deref(), Some(old_volume.as_str()));
    assert_eq!(
        spec.storage_class_name.as_deref(),
        Some(cluster.wffc_storage_class.as_str())
    );
    assert_ne!(after.uid(), before.uid(), "recreated");
    assert_eq!(after.labels().get("team").map(String::as_str), Some("db"));
    assert_eq!(
        after.labels().get("app").map(String::as_str),
        Some(APP),
        "the template's label"
    );
    assert_eq!(
        after
            .annotations()
            .get("example.com/backup")
            .map(String::as_str),
        Some("daily")
    );
    let refs: Vec<(&str, &str, &str)> = after
        .owner_references()
        .iter()
        .map(|r| (r.kind.as_str(), r.name.as_str(), r.uid.as_str()))
        .collect();
    assert_eq!(refs, [("ConfigMap", "keeper", keeper_uid.as_str())]);
    for key in after.labels().keys().chain(after.annotations().keys()) {
        assert!(
            !labels::is_own_key(key),
            "key {key} of ours left on the claim"
        );
    }
    // Dynamically provisioned, the old claim was bound by the controller; the recreated one is
    // pre-bound by the operator, and the old claim's marker is not carried over.
    assert_eq!(
        before
            .annotations()
            .get("pv.kubernetes.io/bound-by-controller")
            .map(String::as_str),
        Some("yes")
    );
    assert!(
        !after
            .annotations()
            .contains_key("pv.kubernetes.io/bound-by-controller"),
        "{:?}",
        after.annotations()
    );
    assert_eq!(
        after
            .annotations()
            .get("pv.kubernetes.io/bind-completed")
            .map(String::as_str),
        Some("yes"),
        "bound again by the PV controller"
    );
    ns.wait_statefulset_ready(APP, 1, Duration::from_secs(120))
        .await
        .unwrap();
}
