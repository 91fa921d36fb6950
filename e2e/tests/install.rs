//! The operator as a user installs it: the chart installed by real Helm 4 into the cluster
//! `KUBECONFIG` points at, the operator running in-cluster from the project's image (which the
//! local cluster's image store must hold: `test-all.sh` builds it and loads it), under the
//! chart's ServiceAccount and RBAC, with two replicas and leader election.
//!
//! One scenario, in its own namespace (the release watches only that namespace, so the host
//! operators of the other tests never meet it), with a client writing to etcd throughout:
//! - both replicas are Ready (`/readyz`: API reachable, every RBAC rule granted); exactly one holds
//!   the Lease and reports `storage_migrator_leader 1` on `/metrics`, the other 0;
//! - a request that sets no `copy.moverImage` migrates the etcd StatefulSet to the other class;
//!   its Jobs run the operator's own image;
//! - the leader pod is deleted (grace 0, so it cannot release the Lease) while a member is being
//!   migrated: the other replica takes over within the lease duration, and the request ends
//!   Successful with every acknowledged write on every member and the etcd member ids unchanged;
//! - `helm uninstall` removes everything it installed; the CRD (and so the requests) stays.
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test install` (after
//! `localcluster image load` of the project's image).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e::testing::helm::{chart_dir, helm, http_get};
use e2e::testing::operator::{create_request, install_crd, summary, wait_final, wait_status};
use e2e::testing::{TestNamespace, describe_pod, etcd, scenario};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;
use storage_migrator::api::{MemberStep, Phase};
use storage_migrator::labels;
use tracing::info;

const SET: &str = "etcd";
const IMAGE: &str = concat!(
    "ghcr.io/storage-migrator/storage-migrator:",
    env!("CARGO_PKG_VERSION")
);
const LEASE_DURATION: Duration = Duration::from_secs(30);
const HTTP_PORT: u16 = 8080;

/// The release's operator pods (by the chart's selector labels).
async fn operator_pods(ns: &TestNamespace, release: &str) -> Vec<Pod> {
    let selector =
        format!("app.kubernetes.io/instance={release},app.kubernetes.io/name=storage-migrator");
    ns.api::<Pod>()
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
}

/// Waits until the Deployment has `n` available replicas; panics with the pods' states.
async fn wait_available(ns: &TestNamespace, release: &str, n: i32, timeout: Duration) {
    let deploys: Api<Deployment> = ns.api();
    let name = format!("{release}-storage-migrator");
    let start = Instant::now();
    loop {
        let d = deploys.get(&name).await.unwrap();
        let available = d.status.as_ref().and_then(|s| s.available_replicas);
        if available == Some(n) {
            info!(took = ?start.elapsed(), "{name}: {n} replicas available");
            return;
        }
        if start.elapsed() > timeout {
            let pods: Vec<String> = operator_pods(ns, release)
                .await
                .iter()
                .map(describe_pod)
                .collect();
            panic!("{name}: {available:?} of {n} available after {timeout:?}; pods: {pods:#?}");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The Lease's holder, if any.
async fn holder(ns: &TestNamespace) -> Option<String> {
    let lease = ns.api::<Lease>().get_opt(labels::LEASE_NAME).await.ok()??;
    lease.spec?.holder_identity
}

/// Every expected key on every member, the member ids unchanged, every claim bound on `class`.
async fn assert_migrated(
    ns: &TestNamespace,
    expected: &BTreeSet<String>,
    ids_before: &BTreeMap<String, u64>,
    class: &str,
) {
    etcd::assert_keys_everywhere(ns, SET, 3, expected).await;
    assert_eq!(
        &etcd::member_ids(ns, SET, 3).await,
        ids_before,
        "etcd member ids"
    );
    let claims = e2e::testing::assert_claims_bound(ns, SET, 3).await;
    for (claim, (_, c, _)) in &claims {
        assert_eq!(c, class, "{claim}");
    }
}

/// Both replicas ready; the Lease holder says leader 1 on /metrics, the other 0. Returns the
/// leader's pod name.
async fn check_endpoints(ns: &TestNamespace, release: &str) -> String {
    let leader = holder(ns).await.expect("the Lease has a holder");
    let pods = operator_pods(ns, release).await;
    assert_eq!(pods.len(), 2, "two operator pods");
    for pod in &pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap();
        let (code, body) = http_get(&ip, HTTP_PORT, "/readyz").await.unwrap();
        assert_eq!((code, body.trim()), (200, "ok"), "{name} /readyz");
        let (code, metrics) = http_get(&ip, HTTP_PORT, "/metrics").await.unwrap();
        assert_eq!(code, 200, "{name} /metrics");
        let want = if name == leader { 1 } else { 0 };
        assert!(
            metrics.contains(&format!("storage_migrator_leader {want}\n")),
            "{name} (leader {leader}) /metrics lacks `storage_migrator_leader {want}`:\n{metrics}"
        );
    }
    assert!(
        pods.iter()
            .any(|p| p.metadata.name.as_deref() == Some(&leader)),
        "the Lease holder {leader} is one of the release's pods"
    );
    leader
}

/// Deletes the leader pod with grace 0 and waits for another pod to hold the Lease; returns how
/// long the takeover took.
async fn kill_leader(ns: &TestNamespace, leader: &str) -> Duration {
    let t0 = Instant::now();
    ns.api::<Pod>()
        .delete(leader, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    loop {
        match holder(ns).await {
            Some(h) if h != leader => {
                info!(new = %h, took = ?t0.elapsed(), "leadership taken over");
                return t0.elapsed();
            }
            _ if t0.elapsed() > LEASE_DURATION * 4 => {
                panic!("no other replica took the Lease within {:?}", t0.elapsed())
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// Until `stop`: the images of every pod the operator creates for its Jobs and mounters
/// (labelled with the job kind), polled every 500 ms.
fn watch_job_images(
    ns: &TestNamespace,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<BTreeSet<String>> {
    let pods: Api<Pod> = ns.api();
    tokio::spawn(async move {
        let mut seen = BTreeSet::new();
        let lp = ListParams::default().labels(labels::JOB_KIND_LABEL);
        while !stop.load(Ordering::Relaxed) {
            if let Ok(list) = pods.list(&lp).await {
                for p in &list.items {
                    let containers = p.spec.iter().flat_map(|s| s.containers.iter());
                    seen.extend(containers.filter_map(|c| c.image.clone()));
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        seen
    })
}

/// Everything `helm install` created is gone after `helm uninstall`; the CRD stays.
async fn check_uninstalled(ns: &TestNamespace, release: &str) {
    helm(&["uninstall", release, "-n", &ns.name, "--wait"])
        .await
        .unwrap();
    let name = format!("{release}-storage-migrator");
    let client = ns.client();
    let start = Instant::now();
    loop {
        let left = [
            ns.api::<Deployment>()
                .get_opt(&name)
                .await
                .unwrap()
                .is_some(),
            ns.api::<ServiceAccount>()
                .get_opt(&name)
                .await
                .unwrap()
                .is_some(),
            ns.api::<Service>()
                .get_opt(&format!("{name}-metrics"))
                .await
                .unwrap()
                .is_some(),
            Api::<ClusterRole>::all(client.clone())
                .get_opt(&name)
                .await
                .unwrap()
                .is_some(),
            Api::<ClusterRoleBinding>::all(client.clone())
                .get_opt(&name)
                .await
                .unwrap()
                .is_some(),
        ];
        if !left.iter().any(|l| *l) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "left after uninstall: {left:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    assert!(
        crds.get_opt("storagemigrationrequests.storagemigrator.io")
            .await
            .unwrap()
            .is_some(),
        "helm uninstall must keep the CRD"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installed_operator_migrates_and_survives_losing_its_leader() {
    let (cluster, ns) = scenario("smr-install").await;
    install_crd(&ns).await.unwrap();
    ns.apply_etcd().await.unwrap();
    let seeded = etcd::seed_keys(&ns, SET, 50).await.unwrap();
    let ids_before = etcd::member_ids(&ns, SET, 3).await;

    let release = format!("smr-{}", ns.name.rsplit('-').next().unwrap_or("x"));
    let chart = chart_dir();
    let watch = format!("watchNamespaces={{{}}}", ns.name);
    helm(&[
        "install",
        &release,
        chart.to_str().unwrap(),
        "-n",
        &ns.name,
        "--set",
        &watch,
    ])
    .await
    .unwrap();
    wait_available(&ns, &release, 2, Duration::from_secs(180)).await;
    let leader = check_endpoints(&ns, &release).await;

    let stop = Arc::new(AtomicBool::new(false));
    let writer = etcd::start_writer(&ns, SET, 3, "seed/w-", stop.clone());
    let spec = json!({
        "type": "StorageClassChange",
        "target": {"kind": "StatefulSet", "name": SET},
        "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
        "timeout": "20m",
        "database": {"engine": "Etcd"},
    });
    create_request(&ns, "move", spec).await.unwrap();
    let jobs_seen = watch_job_images(&ns, stop.clone());
    wait_status(
        &ns,
        "move",
        "a member copying",
        Duration::from_secs(300),
        |s| s.members.iter().any(|m| m.step == MemberStep::Copying),
    )
    .await
    .unwrap();
    let takeover = kill_leader(&ns, &leader).await;
    assert!(
        takeover <= LEASE_DURATION + Duration::from_secs(5),
        "takeover took {takeover:?}, more than the lease duration {LEASE_DURATION:?} (+5 s)"
    );
    let done = wait_final(&ns, "move", Duration::from_secs(900))
        .await
        .unwrap();
    assert_eq!(
        done.status.as_ref().map(|s| s.phase),
        Some(Phase::Successful),
        "{}",
        summary(&done)
    );
    stop.store(true, Ordering::Relaxed);
    let written = writer.await.unwrap();
    let images = jobs_seen.await.unwrap();
    assert_eq!(
        images,
        BTreeSet::from([IMAGE.to_string()]),
        "images of the Job and mounter pods seen during the request"
    );
    let mut expected = seeded.clone();
    expected.extend(written.acked.iter().cloned());
    assert_migrated(&ns, &expected, &ids_before, &cluster.wffc_storage_class).await;
    info!(
        acked = written.acked.len(),
        failures = written.failures,
        ?takeover,
        "migrated in-cluster"
    );

    check_uninstalled(&ns, &release).await;
}
