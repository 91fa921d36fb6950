//! End-to-end: a Shrink of the 3-member etcd set whose data passes preflight, then grows past
//! what the new volume holds, runs out of space in its copy (issue 13, items 5 and 6: "a shrink
//! target that passes a naive `du` check runs out of space during the copy"; "every scenario
//! runs with a client writing to etcd through the whole request"). Against the cluster
//! `KUBECONFIG` points at, in its own namespace with its own operator process.
//!
//! The workload is the etcd fixture (`testing::faults::EtcdUnderLoad`: 50 seeded keys and a
//! client writing a key every 100 ms until the end) on 1Gi claims of the local provisioner,
//! whose volumes are ext4 images of their size: a full volume really returns ENOSPC. The Shrink
//! to 256Mi is accepted (etcd's preallocated WAL files, about 128 MiB by `du`, plus headroom fit
//! what such a volume holds). The operator runs with the failpoint `step-PreCopying` (or, without
//! pre-copy, `step-GatingStop`) and exits once the first member's temporary claim is bound,
//! before any copy Job exists; the test then writes a 256 MiB filler file beside etcd's data on
//! that member's claim (a one-off pod on its node) and starts the operator again. So the
//! pre-copy (or the final copy, the member stopped) runs out of space every time, with no race
//! against the copy. Each test checks the failure's numbers, that the member is back on its
//! untouched old claim and volume (the filler's checksum unchanged, the etcd member id
//! unchanged), every member Ready, no acknowledged write lost and every member holding the same
//! data, and no temporary claim, volume, Job or helper pod left.
//!
//! The operator binary comes from `STORAGE_MIGRATOR_BIN` (default
//! `<workspace>/target/debug/storage-migrator`), built with `--features failpoints`.
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test out_of_space -- --test-threads=2`

use std::time::{Duration, Instant};

use e2e::testing::faults::{ETCD_SET, EtcdUnderLoad, leftovers_or_error};
use e2e::testing::operator::{Operator, create_request, summary, wait_final, wait_status};
use e2e::testing::{TestNamespace, etcd};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::Api;
use serde_json::json;
use storage_migrator::api::{MemberStep, Phase};
use storage_migrator::build;
use tracing::info;

const REQ: &str = "enospc";
/// The Shrink's size: etcd's data (two preallocated 64 MiB WAL files and a small database)
/// fits it with headroom.
const TARGET: &str = "256Mi";
/// What the test writes on the member's claim after preflight: by itself more than a 256Mi ext4
/// volume holds (about 225 MiB with this provisioner, which reserves no blocks). etcd's own data
/// is no help: `du` counts its preallocated WAL files (about 128 MiB) but the copy keeps them
/// sparse, so a filler of 224 MiB was still copied, the new volume full to the last block (and
/// etcd crash-looped on it).
const FILLER_MIB: u64 = 256;

/// The checksum of the filler file on `claim`.
async fn filler_sum(ns: &TestNamespace, name: &str, node: &str, claim: &str) -> String {
    let sum = ns
        .run_on_claim(name, node, claim, "sha256sum /data/filler")
        .await
        .unwrap();
    assert!(sum.contains("/data/filler"), "{sum}");
    sum
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

/// Held for the whole of each test: two 3-member etcd sets, two writers and two fillers
/// side by side starve a 2-core machine (etcd's own requests time out), which measures the
/// machine, not the operator.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_shrink_whose_data_grows_after_preflight_runs_out_of_space_in_the_pre_copy() {
    out_of_space("smr-enospc-pre", true).await;
}

/// Without pre-copy the final copy runs out of space while the member is stopped: its pod is
/// brought back on its old claim, and the other two members keep the quorum meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_shrink_whose_data_grows_after_preflight_runs_out_of_space_in_the_final_copy() {
    out_of_space("smr-enospc-final", false).await;
}

/// The member the operator stopped at, once its temporary claim was bound.
struct Stopped {
    pod: String,
    claim: String,
    node: String,
    measured: i64,
    temp_claim: String,
    temp_volume: String,
}

/// Runs the operator with the failpoint of `step` until it exits there; the member in flight.
async fn stop_before_the_copy(ns: &TestNamespace, pre_copy: bool, step: MemberStep) -> Stopped {
    let failpoint = format!("step-{step:?}=return");
    let mut op = Operator::start(ns, 0, Some(failpoint.as_str()))
        .await
        .unwrap();
    let spec = json!({
        "type": "Shrink",
        "target": {"kind": "StatefulSet", "name": ETCD_SET},
        "shrink": {"size": TARGET},
        "timeout": "15m",
        "copy": {"preCopy": pre_copy},
        "database": {"engine": "Etcd"},
    });
    create_request(ns, REQ, spec).await.unwrap();
    let code = op.wait_exit(Duration::from_secs(300)).await.unwrap();
    assert_eq!(code, 86, "operator log {}", op.log().display());
    let req = wait_status(ns, REQ, "copy next", Duration::from_secs(10), move |s| {
        s.members.iter().any(|m| m.step == step)
    })
    .await
    .unwrap();
    let status = req.status.unwrap();
    let member = status.members.iter().find(|m| m.step == step).unwrap();
    let planned = (status.plan.as_ref().unwrap().members.iter())
        .find(|p| p.pod == member.pod)
        .unwrap();
    let measured = planned.used_bytes.unwrap();
    assert!(measured < 160 << 20, "preflight measured {measured}");
    Stopped {
        pod: member.pod.clone(),
        claim: planned.claim.clone(),
        node: planned.node.clone(),
        measured,
        temp_claim: build::temp_claim_name(REQ, &planned.claim),
        temp_volume: member.first_claim.new_volume.clone().unwrap(),
    }
}

/// The scenario of the module documentation; with `pre_copy` off the operator stops at
/// `GatingStop` instead, and the final copy (the member stopped) runs out of space.
async fn out_of_space(test: &str, pre_copy: bool) {
    let _one = ONE_AT_A_TIME.lock().await;
    let run = EtcdUnderLoad::start(test).await.expect("setup");
    let ns = &run.ns;
    let claims_before = ns.claim_volumes().await;
    let ids_before = etcd::member_ids(ns, ETCD_SET, 3).await;
    let (step, pass) = if pre_copy {
        (MemberStep::PreCopying, "pre-copy")
    } else {
        (MemberStep::GatingStop, "final copy")
    };
    let s = stop_before_the_copy(ns, pre_copy, step).await;
    info!(s.measured, %s.temp_volume, %s.temp_claim, "accepted; growing the data");

    // The data grows past what a 256Mi volume holds.
    let grow = format!(
        "head -c {} /dev/urandom > /data/filler && sync",
        FILLER_MIB << 20
    );
    ns.run_on_claim("grow", &s.node, &s.claim, &grow)
        .await
        .unwrap();
    let before = filler_sum(ns, "sums-before", &s.node, &s.claim).await;

    let started = Instant::now();
    let _op = Operator::start(ns, 1, None).await.unwrap();
    let req = wait_final(ns, REQ, Duration::from_secs(600)).await.unwrap();
    let took = started.elapsed();
    let status = req.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Failed, "{}", summary(&req));
    let failure = status.failure.clone().unwrap();
    info!(%failure, "out of space");
    assert_out_of_space(&failure, &s, pass);
    let member = status.members.iter().find(|m| m.pod == s.pod).unwrap();
    assert_eq!(member.step, MemberStep::RolledBack, "{}", summary(&req));
    let message = member.message.clone().unwrap_or_default();
    let stays = format!("data stays on claim {}", s.claim);
    assert!(message.contains(&stays), "{message}");

    // Every member serves again, this one from its old claim with its data as it was.
    ns.wait_statefulset_ready(ETCD_SET, 3, Duration::from_secs(180))
        .await
        .unwrap();
    let ready = started.elapsed();
    let pod = ns.api::<Pod>().get(&s.pod).await.unwrap();
    let pod_claims: Vec<String> = (pod.spec.and_then(|s| s.volumes).unwrap_or_default())
        .into_iter()
        .filter_map(|v| v.persistent_volume_claim.map(|c| c.claim_name))
        .collect();
    assert_eq!(pod_claims, std::slice::from_ref(&s.claim));
    assert_eq!(
        ns.claim_volumes().await,
        claims_before,
        "claims and their volumes"
    );
    assert_eq!(
        filler_sum(ns, "sums-after", &s.node, &s.claim).await,
        before
    );
    let ids_after = etcd::member_ids(ns, ETCD_SET, 3).await;
    assert_eq!(
        ids_after, ids_before,
        "etcd member ids (no member on an empty volume)"
    );
    assert_nothing_left(ns, &s).await;
    let (_cluster, _ns, written) = run.finish().await;
    println!(
        "NOTE out of space ({pass}): member {} measured {:.1} MiB at preflight, {FILLER_MIB} MiB \
         added; Failed {took:?} after the operator restarted, every member Ready after {ready:?}; writes acknowledged {} failed {} \
         (of {} attempts); failure: {failure}",
        s.pod,
        s.measured as f64 / f64::from(1 << 20),
        written.acked.len(),
        written.failures,
        written.attempts
    );
}

/// The failure names the pass, the temporary claim and the numbers.
fn assert_out_of_space(failure: &str, s: &Stopped, pass: &str) {
    for want in [
        format!(
            "the {pass} of member {} ran out of space on temporary claim",
            s.pod
        ),
        format!(
            "on temporary claim {} ({TARGET}: its filesystem holds ",
            s.temp_claim
        ),
        format!("claim {} now uses ", s.claim),
        "preflight measured ".to_string(),
        format!(
            "the member stays on its untouched old claim {}; retry with a larger size",
            s.claim
        ),
        "which an ext4 volume of ".to_string(),
        "(runbook: docs/runbook.md#failed-out-of-space-during-a-copy)".to_string(),
    ] {
        assert!(failure.contains(&want), "{want:?} not in {failure}");
    }
    let fs_size = mib_after(failure, "its filesystem holds ");
    assert!(fs_size > 160.0 && fs_size <= 256.0, "{failure}");
    assert!(
        mib_after(failure, "now uses ") >= FILLER_MIB as f64,
        "{failure}"
    );
    assert!(
        mib_after(failure, "which an ext4 volume of ") > 256.0,
        "{failure}"
    );
}

/// Nothing of the request is left: temporary claim, its volume, Jobs, helper pods.
async fn assert_nothing_left(ns: &TestNamespace, s: &Stopped) {
    let claims: Api<PersistentVolumeClaim> = ns.api();
    assert!(
        claims.get_opt(&s.temp_claim).await.unwrap().is_none(),
        "temporary claim {} left",
        s.temp_claim
    );
    let volumes: Api<PersistentVolume> = Api::all(ns.client());
    wait_gone("temporary volume", Duration::from_secs(60), || async {
        (volumes.get_opt(&s.temp_volume).await.unwrap())
            .map(|v| v.name_any())
            .into_iter()
            .collect()
    })
    .await;
    wait_gone("Jobs and helper pods", Duration::from_secs(60), || {
        leftovers_or_error(ns)
    })
    .await;
}
