//! End-to-end scenarios of a Deployment's claim (`target.kind: Deployment`), against the cluster
//! `KUBECONFIG` points at, each in its own namespace with its own operator process (under the
//! chart's RBAC): a one-replica Deployment whose writer appends to a log on a 512Mi claim, beside
//! 16 files of random data, with a label and an ownerReference (to a ConfigMap of the test's)
//! on the claim;
//!
//! - a Shrink to 128Mi: the Deployment is scaled to zero and back to one replica, ready; the
//!   claim keeps its name, labels and owner reference on a new 128Mi volume; every data file's
//!   checksum is unchanged and the log kept every line written before the request; the
//!   Deployment's pod template is unchanged;
//! - the same Shrink whose final copy fails (failpoint `copy-job-fails`): the request ends
//!   `Failed`, the Deployment is back to one ready replica on the untouched old claim, and no
//!   temporary claim is left.
//!
//! The operator binary comes from `STORAGE_MIGRATOR_BIN` (default
//! `<workspace>/target/debug/storage-migrator`), built with `--features failpoints`.
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test deployment`

use std::time::Duration;

use e2e::testing::operator::{Operator, create_request, install_crd, summary, wait_final};
use e2e::testing::{TestCluster, TestNamespace, scenario};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{ListParams, PostParams};
use serde_json::json;
use storage_migrator::api::{MemberStep, Phase};

const WEB: &str = "web";
const CLAIM: &str = "data-web";
const FINAL: Duration = Duration::from_secs(600);

/// The claim (512Mi, a label, an owner reference to ConfigMap `keeper`) and the Deployment,
/// Ready; returns the ConfigMap's uid.
async fn web(cluster: &TestCluster, ns: &TestNamespace) -> String {
    let keeper: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "keeper"}})).expect("a ConfigMap");
    let keeper = ns
        .api::<ConfigMap>()
        .create(&PostParams::default(), &keeper)
        .await
        .unwrap();
    let keeper_uid = keeper.uid().unwrap_or_default();
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {
            "name": CLAIM,
            "labels": {"team": "web"},
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "ConfigMap", "name": "keeper", "uid": keeper_uid,
            }],
        },
        "spec": {
            "storageClassName": cluster.storage_class,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "512Mi"}},
        },
    }))
    .expect("a claim");
    ns.api::<PersistentVolumeClaim>()
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    // Data files written once; then a line a tenth of a second to the log, until TERM.
    let script = "trap 'exit 0' TERM; \
        if [ ! -d /data/files ]; then mkdir /data/files; \
          for i in $(seq 1 16); do head -c 262144 /dev/urandom > /data/files/$i; done; sync; fi; \
        n=0; while true; do n=$((n+1)); echo \"$HOSTNAME $n\" >> /data/log; sleep 0.1; done";
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": WEB},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": WEB}},
            "template": {
                "metadata": {"labels": {"app": WEB}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "securityContext": {"runAsUser": 0, "runAsGroup": 0},
                    "containers": [{
                        "name": "writer",
                        "image": cluster.mover_image,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", script],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}}],
                },
            },
        },
    }))
    .expect("a Deployment");
    ns.api::<Deployment>()
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    wait_available(ns).await;
    keeper_uid
}

/// Waits until the Deployment has one replica, updated, ready and available.
async fn wait_available(ns: &TestNamespace) -> Deployment {
    let cond = |d: Option<&Deployment>| {
        d.is_some_and(|d| {
            let s = d.status.clone().unwrap_or_default();
            d.spec.as_ref().and_then(|s| s.replicas) == Some(1)
                && s.observed_generation >= d.metadata.generation
                && s.available_replicas == Some(1)
                && s.ready_replicas == Some(1)
                && s.updated_replicas == Some(1)
                && s.replicas == Some(1)
        })
    };
    let describe = |d: &Deployment| format!("{:?}", d.status);
    let d = ns
        .wait_for(
            ns.api(),
            WEB,
            "Deployment available",
            Duration::from_secs(180),
            cond,
            describe,
        )
        .await
        .unwrap();
    d.expect("the Deployment exists")
}

/// The node of the Deployment's one running pod.
async fn node(ns: &TestNamespace) -> String {
    let pods = ns
        .api::<Pod>()
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap();
    let running = pods
        .items
        .iter()
        .find(|p| p.metadata.deletion_timestamp.is_none());
    running
        .and_then(|p| p.spec.clone())
        .and_then(|s| s.node_name)
        .expect("a running pod of the Deployment")
}

/// Runs `script` in a one-off pod beside the writer with the claim at `/data`; its log.
async fn on_claim(ns: &TestNamespace, name: &str, script: &str) -> String {
    let node = node(ns).await;
    ns.run_on_claim(name, &node, CLAIM, script).await.unwrap()
}

/// The data files' checksums, and the log's first `lines` lines (all of them with 0).
async fn sums(ns: &TestNamespace, name: &str, lines: usize) -> (String, String) {
    let out = on_claim(
        ns,
        name,
        &format!(
            "while [ ! -f /data/log ]; do sleep 0.2; done; \
             cd /data/files && sha256sum $(ls | sort -n); echo ---; \
             if [ {lines} -gt 0 ]; then head -n {lines} /data/log; else cat /data/log; fi"
        ),
    )
    .await;
    let (files, log) = out.split_once("---\n").expect("the separator");
    assert_eq!(files.lines().count(), 16, "{files}");
    (files.to_string(), log.to_string())
}

fn shrink() -> serde_json::Value {
    json!({
        "type": "Shrink",
        "target": {"kind": "Deployment", "name": WEB},
        "shrink": {"size": "128Mi"},
        "timeout": "10m",
    })
}

fn template(d: &Deployment) -> serde_json::Value {
    serde_json::to_value(d.spec.as_ref().map(|s| &s.template)).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployments_claim_shrinks_while_it_is_scaled_to_zero_and_comes_back_whole() {
    let (cluster, ns) = scenario("smr-deployment").await;
    install_crd(&ns).await.unwrap();
    let keeper_uid = web(&cluster, &ns).await;
    let before_template = template(&ns.api::<Deployment>().get(WEB).await.unwrap());
    let old_volume = ns
        .api::<PersistentVolumeClaim>()
        .get(CLAIM)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.volume_name)
        .unwrap_or_default();
    let (files, log) = sums(&ns, "sum-before", 0).await;
    let logged = log.lines().count();
    assert!(logged > 0, "the writer writes");

    let _op = Operator::start(&ns, 0, None).await.unwrap();
    create_request(&ns, "shrink", shrink()).await.unwrap();
    let req = wait_final(&ns, "shrink", FINAL).await.unwrap();
    let status = req.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Phase::Successful, "{}", summary(&req));
    assert_eq!(status.deployment_replicas, Some(1));
    let plan = status.plan.clone().unwrap_or_default();
    assert_eq!(plan.deployment.as_deref(), Some(WEB));
    assert_eq!(
        status.members.first().map(|m| m.step),
        Some(MemberStep::Done)
    );

    let d = wait_available(&ns).await;
    assert_eq!(
        template(&d),
        before_template,
        "the pod template is unchanged"
    );
    let claim = ns.api::<PersistentVolumeClaim>().get(CLAIM).await.unwrap();
    let spec = claim.spec.clone().unwrap_or_default();
    assert_ne!(spec.volume_name.as_deref(), Some(old_volume.as_str()));
    let size = spec
        .resources
        .and_then(|r| r.requests)
        .and_then(|r| r.get("storage").cloned());
    assert_eq!(size.map(|q| q.0).as_deref(), Some("128Mi"));
    assert_eq!(claim.labels().get("team").map(String::as_str), Some("web"));
    let refs: Vec<(&str, &str, &str)> = (claim.owner_references().iter())
        .map(|r| (r.kind.as_str(), r.name.as_str(), r.uid.as_str()))
        .collect();
    assert_eq!(refs, [("ConfigMap", "keeper", keeper_uid.as_str())]);
    let (files_after, log_after) = sums(&ns, "sum-after", logged).await;
    assert_eq!(files_after, files, "every data file is unchanged");
    assert_eq!(log_after, log, "the log kept every line written before");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_final_copy_scales_the_deployment_back_on_its_old_claim() {
    let (cluster, ns) = scenario("smr-deployment-undo").await;
    install_crd(&ns).await.unwrap();
    web(&cluster, &ns).await;
    let claim = ns.api::<PersistentVolumeClaim>().get(CLAIM).await.unwrap();
    let old_volume = claim.spec.clone().and_then(|s| s.volume_name);

    let _op = Operator::start(&ns, 0, Some("copy-job-fails=return"))
        .await
        .unwrap();
    create_request(&ns, "undo", shrink()).await.unwrap();
    let req = wait_final(&ns, "undo", FINAL).await.unwrap();
    let status = req.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Phase::Failed, "{}", summary(&req));
    assert_eq!(
        status.members.first().map(|m| m.step),
        Some(MemberStep::RolledBack)
    );
    let failure = status.failure.clone().unwrap_or_default();
    assert!(failure.contains("copy of claim data-web"), "{failure}");

    wait_available(&ns).await;
    let now = ns.api::<PersistentVolumeClaim>().get(CLAIM).await.unwrap();
    assert_eq!(now.uid(), claim.uid(), "the same claim");
    assert_eq!(now.spec.and_then(|s| s.volume_name), old_volume);
    let claims = ns
        .api::<PersistentVolumeClaim>()
        .list(&ListParams::default())
        .await
        .unwrap();
    let names: Vec<String> = claims.items.iter().map(|c| c.name_any()).collect();
    assert_eq!(names, [CLAIM], "no temporary claim left");
    // The writer runs on it again.
    let log = on_claim(&ns, "log-after", "tail -n 1 /data/log").await;
    assert!(!log.trim().is_empty(), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_target_that_a_deployments_pod_mounts_moves_with_the_deployment_flow() {
    let (cluster, ns) = scenario("smr-deployment-claim").await;
    install_crd(&ns).await.unwrap();
    web(&cluster, &ns).await;
    let (files, _) = sums(&ns, "sum-before", 1).await;

    let _op = Operator::start(&ns, 0, None).await.unwrap();
    create_request(
        &ns,
        "by-claim",
        json!({
            "type": "StorageClassChange",
            "target": {"kind": "PersistentVolumeClaim", "name": CLAIM},
            "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
            "timeout": "10m",
        }),
    )
    .await
    .unwrap();
    let req = wait_final(&ns, "by-claim", FINAL).await.unwrap();
    let status = req.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Phase::Successful, "{}", summary(&req));
    let plan = status.plan.clone().unwrap_or_default();
    assert_eq!(
        plan.deployment.as_deref(),
        Some(WEB),
        "found through its ReplicaSet"
    );
    assert_eq!(plan.target_claim.as_deref(), Some(CLAIM));
    wait_available(&ns).await;
    let claim = ns.api::<PersistentVolumeClaim>().get(CLAIM).await.unwrap();
    assert_eq!(
        claim.spec.and_then(|s| s.storage_class_name).as_deref(),
        Some(cluster.wffc_storage_class.as_str())
    );
    let (files_after, _) = sums(&ns, "sum-after", 1).await;
    assert_eq!(files_after, files);
}
