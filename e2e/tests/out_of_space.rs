//! End-to-end: a Shrink whose data passes preflight, then grows past what the new volume holds,
//! runs out of space in its copy (issue 13, items 5 and 6: "a shrink target that passes a naive
//! `du` check runs out of space during the copy"). Against the cluster `KUBECONFIG` points at,
//! in its own namespace with its own operator process.
//!
//! The workload is a generic one-member StatefulSet (the mover image running `sh`) with 4 MiB of
//! data on a 256Mi claim of the local provisioner, whose volumes are ext4 images of their size:
//! a full volume really returns ENOSPC. The Shrink to 64Mi is accepted (4 MiB plus headroom fit
//! the ~50 MiB such a volume holds). The operator runs with the failpoint `step-PreCopying` (or,
//! without pre-copy, `step-GatingStop`) and exits once the member's temporary claim is bound,
//! before any copy Job exists; the test then writes 96 MiB more on the member's claim and starts
//! the operator again. So the pre-copy (or the final copy, the member stopped) runs out of space
//! every time, with no race against the copy. Each test checks the failure's numbers, the data
//! (checksums) on the old claim, the pod Ready on it, and that no temporary claim, volume, Job or
//! helper pod is left.
//!
//! The operator binary comes from `STORAGE_MIGRATOR_BIN` (default
//! `<workspace>/target/debug/storage-migrator`), built with `--features failpoints`.
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test out_of_space`

use std::time::{Duration, Instant};

use e2e::testing::operator::{
    Operator, create_request, install_crd, summary, wait_final, wait_status,
};
use e2e::testing::{MoverSpec, TestNamespace, one_member_set, scenario};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use storage_migrator::api::{MemberStep, Phase};
use storage_migrator::build;
use tracing::info;

const SET: &str = "app";
const REQ: &str = "enospc";
const CLAIM: &str = "data-app-0";

/// A one-member StatefulSet in the mover image: 4 MiB of random data written once, then idle
/// (a TERM ends it at once).
fn app_set(image: &str, class: &str) -> StatefulSet {
    let script = "trap 'exit 0' TERM\n\
                  [ -f /data/seed ] || head -c 4194304 /dev/urandom > /data/seed\n\
                  while true; do sleep 1; done";
    one_member_set(SET, image, class, "256Mi", script)
}

/// Runs `script` in a one-off pod on `node` with the member's claim at `/data`; its log.
async fn on_claim(ns: &TestNamespace, name: &str, node: &str, script: &str) -> String {
    let spec = MoverSpec::shell(name, script)
        .on_node(node)
        .mount(CLAIM, "/data");
    let out = ns.run_pod(&spec, Duration::from_secs(120)).await.unwrap();
    assert!(out.succeeded(), "{name}: {}", out.output());
    let _ = ns.api::<Pod>().delete(name, &DeleteParams::default()).await;
    out.logs
}

/// Checksums of every file on the member's claim.
async fn checksums(ns: &TestNamespace, name: &str, node: &str) -> String {
    let sums = on_claim(
        ns,
        name,
        node,
        "cd /data && find . -type f | sort | xargs sha256sum",
    )
    .await;
    assert!(sums.contains("./seed"), "{sums}");
    sums
}

/// The number of MiB after `prefix` in `message` ("... now uses 100.1Mi ...").
fn mib_after(message: &str, prefix: &str) -> f64 {
    message
        .split_once(prefix)
        .and_then(|(_, rest)| rest.split_once("Mi"))
        .and_then(|(n, _)| n.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no \"{prefix}<n>Mi\" in {message:?}"))
}

/// Waits until `what` holds (`check` returns the names still there), failing after `timeout`.
async fn wait_gone<F, Fut>(what: &str, timeout: Duration, check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Vec<String>>,
{
    let started = Instant::now();
    loop {
        let left = check().await;
        if left.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < timeout,
            "{what}: still there after {timeout:?}: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shrink_whose_data_grows_after_preflight_runs_out_of_space_in_the_pre_copy() {
    out_of_space("smr-enospc-pre", true).await;
}

/// Without pre-copy the final copy runs out of space while the member is stopped: its pod is
/// brought back on its old claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shrink_whose_data_grows_after_preflight_runs_out_of_space_in_the_final_copy() {
    out_of_space("smr-enospc-final", false).await;
}

/// The scenario of the module documentation; with `pre_copy` off the operator stops at
/// `GatingStop` instead, and the final copy (the member stopped) runs out of space.
async fn out_of_space(test: &str, pre_copy: bool) {
    let (cluster, ns) = scenario(test).await;
    install_crd(&ns).await.unwrap();
    let set = app_set(&cluster.mover_image, &cluster.storage_class);
    ns.api::<StatefulSet>()
        .create(&PostParams::default(), &set)
        .await
        .unwrap();
    ns.wait_statefulset_ready(SET, 1, Duration::from_secs(120))
        .await
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let old_volume = claims.get(CLAIM).await.unwrap().spec.unwrap().volume_name;
    let node = (ns.api::<Pod>().get("app-0").await.unwrap().spec)
        .and_then(|s| s.node_name)
        .unwrap();

    // Accepted with the data as it is; the operator stops once the temporary claim is bound.
    let (stop_at, step, pass) = if pre_copy {
        ("step-PreCopying=return", MemberStep::PreCopying, "pre-copy")
    } else {
        (
            "step-GatingStop=return",
            MemberStep::GatingStop,
            "final copy",
        )
    };
    let mut op = Operator::start(&ns, 0, Some(stop_at)).await.unwrap();
    create_request(
        &ns,
        REQ,
        json!({
            "type": "Shrink",
            "target": {"kind": "StatefulSet", "name": SET},
            "shrink": {"size": "64Mi"},
            "timeout": "10m",
            "copy": {"preCopy": pre_copy},
            "database": {"engine": "Generic"},
        }),
    )
    .await
    .unwrap();
    let code = op.wait_exit(Duration::from_secs(300)).await.unwrap();
    assert_eq!(code, 86, "operator log {}", op.log().display());
    let req = wait_status(&ns, REQ, "copy next", Duration::from_secs(10), move |s| {
        s.members.first().map(|m| m.step) == Some(step)
    })
    .await
    .unwrap();
    let status = req.status.clone().unwrap();
    let measured = status.plan.as_ref().unwrap().members[0].used_bytes.unwrap();
    assert!(measured < 8 << 20, "preflight measured {measured}");
    let temp_volume = status.members[0].new_volume.clone().unwrap();
    let temp_claim = build::temp_claim_name(REQ, CLAIM);
    info!(measured, %temp_volume, %temp_claim, "accepted; growing the data");

    // The data grows past what a 64Mi volume holds.
    on_claim(
        &ns,
        "grow",
        &node,
        "head -c 100663296 /dev/urandom > /data/grown && sync",
    )
    .await;
    let before = checksums(&ns, "sums-before", &node).await;
    assert!(before.contains("./grown"), "{before}");

    let _op = Operator::start(&ns, 1, None).await.unwrap();
    let req = wait_final(&ns, REQ, Duration::from_secs(600))
        .await
        .unwrap();
    let status = req.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Failed, "{}", summary(&req));
    let failure = status.failure.clone().unwrap();
    info!(%failure, "out of space");
    for want in [
        &format!("the {pass} of member app-0 ran out of space on temporary claim"),
        &format!("on temporary claim {temp_claim} (64Mi: its filesystem holds "),
        "claim data-app-0 now uses ",
        "preflight measured ",
        "the member stays on its untouched old claim data-app-0; retry with a larger size",
        "which an ext4 volume of ",
        "(runbook: docs/runbook.md#failed-out-of-space-during-a-copy)",
    ] {
        assert!(failure.contains(want), "{want:?} not in {failure}");
    }
    let fs_size = mib_after(&failure, "its filesystem holds ");
    assert!(fs_size > 40.0 && fs_size <= 64.0, "{failure}");
    assert!(mib_after(&failure, "now uses ") >= 100.0, "{failure}");
    assert!(
        mib_after(&failure, "which an ext4 volume of ") > 110.0,
        "{failure}"
    );
    let member = &status.members[0];
    assert_eq!(member.step, MemberStep::RolledBack, "{}", summary(&req));
    let message = member.message.clone().unwrap_or_default();
    assert!(
        message.contains("data stays on claim data-app-0"),
        "{message}"
    );

    // The member serves again from its old claim, with its data as it was.
    ns.wait_statefulset_ready(SET, 1, Duration::from_secs(120))
        .await
        .unwrap();
    let pod = ns.api::<Pod>().get("app-0").await.unwrap();
    let pod_claims: Vec<String> = (pod.spec.and_then(|s| s.volumes).unwrap_or_default())
        .into_iter()
        .filter_map(|v| v.persistent_volume_claim.map(|c| c.claim_name))
        .collect();
    assert_eq!(pod_claims, [CLAIM]);
    let claim = claims.get(CLAIM).await.unwrap();
    assert_eq!(claim.spec.unwrap().volume_name, old_volume, "same volume");
    assert_eq!(checksums(&ns, "sums-after", &node).await, before);

    // Nothing of the request is left: temporary claim, its volume, Jobs, helper pods.
    assert!(
        claims.get_opt(&temp_claim).await.unwrap().is_none(),
        "temporary claim {temp_claim} left"
    );
    let volumes: Api<PersistentVolume> = Api::all(ns.client());
    wait_gone("temporary volume", Duration::from_secs(60), || async {
        (volumes.get_opt(&temp_volume).await.unwrap())
            .map(|v| v.name_any())
            .into_iter()
            .collect()
    })
    .await;
    let jobs: Api<Job> = ns.api();
    let pods: Api<Pod> = ns.api();
    wait_gone("Jobs and helper pods", Duration::from_secs(60), || async {
        let mut left: Vec<String> = (jobs.list(&Default::default()).await.unwrap().items)
            .iter()
            .map(|j| format!("job {}", j.name_any()))
            .collect();
        left.extend(
            (pods.list(&Default::default()).await.unwrap().items)
                .iter()
                .map(|p| p.name_any())
                .filter(|n| n != "app-0" && !n.starts_with("sums-") && n != "grow")
                .map(|n| format!("pod {n}")),
        );
        left
    })
    .await;
}
