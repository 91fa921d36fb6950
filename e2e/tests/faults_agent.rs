//! The node agent (the local cluster's kubelet) killed during a member's final copy, and
//! started again (issue 13's fault-injection suite; `docs/faults.md`). A test binary of its own:
//! while the agent is down no pod of any test is started, probed or deleted.
//!
//! The agent is killed with SIGKILL (no cleanup) once a member is stopped and its copy Job's pod
//! runs, kept down about 5 s, and started again with the same command line. Its containers keep
//! running meanwhile; the new agent re-adopts them (a kubelet restart). Asserted: the request
//! ends `Successful`, every acknowledged write is on every member, nothing of the request is
//! left, every member is Ready, and the members not being migrated kept their pod (uid) and
//! their running container (restart count 0, same `startedAt`) across the restart.
//!
//! Only on the local cluster (`localcluster` restarts its agent); on another cluster the test
//! says so and passes without running.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use e2e::controlplane::restart_agent;
use e2e::testing::faults::{ETCD_SET, EtcdUnderLoad};
use e2e::testing::operator::{self, Operator, summary};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use storage_migrator::api::{MemberStep, Phase, StorageMigrationRequest};
use storage_migrator::labels::{JOB_KIND_LABEL, REQUEST_LABEL};

const MIGRATION: Duration = Duration::from_secs(900);
const DOWN_FOR: Duration = Duration::from_secs(5);

/// What must not change about a pod across the agent restart: uid, restart count, start time
/// of its container.
type Identity = (String, i32, String);

fn identity(p: &Pod) -> Option<Identity> {
    let st = p.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let started = st.state.as_ref()?.running.as_ref()?.started_at.as_ref()?;
    Some((
        p.metadata.uid.clone()?,
        st.restart_count,
        started.0.to_string(),
    ))
}

fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Waits until a member is at `Copying` with its copy Job's pod running; returns that member's
/// pod name and the copy pod's name.
async fn wait_for_final_copy(ns: &e2e::testing::TestNamespace, name: &str) -> (String, String) {
    let reqs: kube::Api<StorageMigrationRequest> = ns.api();
    let pods: kube::Api<Pod> = ns.api();
    let copies = ListParams::default().labels(&format!("{REQUEST_LABEL},{JOB_KIND_LABEL}=copy"));
    let deadline = Instant::now() + MIGRATION;
    loop {
        let copying: Vec<String> = reqs
            .get(name)
            .await
            .ok()
            .and_then(|r| r.status)
            .map(|s| s.members)
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m.step == MemberStep::Copying)
            .map(|m| m.pod)
            .collect();
        if let (Some(member), Ok(list)) = (copying.first(), pods.list(&copies).await)
            && let Some(copy) = list.items.iter().find(|p| running(p))
            && pods
                .get_opt(member)
                .await
                .ok()
                .flatten()
                .is_none_or(|p| !running(&p))
        {
            return (
                member.clone(),
                copy.metadata.name.clone().unwrap_or_default(),
            );
        }
        assert!(
            Instant::now() < deadline,
            "no member reached its final copy"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The identities of the set's running pods but `except`.
async fn members(ns: &e2e::testing::TestNamespace, except: &str) -> BTreeMap<String, Identity> {
    let pods: kube::Api<Pod> = ns.api();
    let list = pods
        .list(&ListParams::default().labels(&format!("app={ETCD_SET}")))
        .await
        .expect("list members");
    list.items
        .iter()
        .filter(|p| p.metadata.name.as_deref() != Some(except))
        .filter_map(|p| Some((p.metadata.name.clone()?, identity(p)?)))
        .collect()
}

/// Whether the agent's log, from byte `from` on, tells of the re-adoption of pod `name`.
fn adopted_in(log: &std::path::Path, from: u64, name: &str) -> bool {
    let text = std::fs::read(log).unwrap_or_default();
    let tail = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default());
    tail.lines()
        .any(|l| l.contains("re-adopting the pod's containers") && l.contains(name))
}

/// Waits until the restarted agent has logged the re-adoption of every pod of `names`.
async fn wait_adopted(log: &std::path::Path, from: u64, names: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if names.iter().all(|n| adopted_in(log, from, n)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not re-adopt {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Follows the copy pod until it is gone: the last exit code its container was reported with.
fn follow_copy(
    ns: &e2e::testing::TestNamespace,
    copy: &str,
) -> tokio::task::JoinHandle<Option<i32>> {
    let pods: kube::Api<Pod> = ns.api();
    let copy = copy.to_string();
    tokio::spawn(async move {
        let deadline = Instant::now() + MIGRATION;
        let mut last = None;
        while Instant::now() < deadline {
            let Ok(Some(p)) = pods.get_opt(&copy).await else {
                break;
            };
            let code = p
                .status
                .and_then(|s| s.container_statuses)
                .and_then(|l| l.into_iter().next())
                .and_then(|c| c.state)
                .and_then(|s| s.terminated)
                .map(|t| t.exit_code);
            last = code.or(last);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        last
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_killed_during_a_copy_readopts_its_containers() {
    // It restarts the node agent.
    let Some(state) = e2e::testing::require::local_cluster("faults agent") else {
        return;
    };
    let run = EtcdUnderLoad::start("fault-agent").await.expect("setup");
    let ns = &run.ns;
    let _op = Operator::start(ns, 0, None).await.expect("operator");
    let t0 = Instant::now();
    run.create_request("agent").await.expect("request");
    let (member, copy) = wait_for_final_copy(ns, "agent").await;
    let copy_exit = follow_copy(ns, &copy);
    let before = members(ns, &member).await;
    assert_eq!(
        before.len(),
        2,
        "two members running besides {member}: {before:?}"
    );
    let log = e2e::controlplane::log_path(&state.dir, "agent");
    let log_len = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let restart = restart_agent(&state, DOWN_FOR)
        .await
        .expect("restart the agent");
    let names: Vec<String> = before.keys().cloned().collect();
    wait_adopted(&log, log_len, &names).await;
    let copy_adopted = adopted_in(&log, log_len, &copy);
    // For a few seconds after the re-adoption, the reported pods stay the very same runs.
    let window = Instant::now() + Duration::from_secs(5);
    while Instant::now() < window {
        assert_eq!(
            members(ns, &member).await,
            before,
            "members changed across the restart"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let req = operator::wait_final(ns, "agent", MIGRATION)
        .await
        .expect("final");
    let took = t0.elapsed();
    let copy_code = copy_exit.await.expect("copy pod follower");
    let (_cluster, ns, written) = run.finish().await;
    for i in 0..3 {
        ns.wait_pod_ready(&format!("{ETCD_SET}-{i}"), Duration::from_secs(120))
            .await
            .expect("every member Ready");
    }
    println!(
        "NOTE faults agent: killed during {member}'s final copy (pod {copy}); down {:.1}s, nodes \
         Ready {:.1}s after the start; {} members re-adopted unchanged; copy pod re-adopted \
         {copy_adopted}, its container reported exit {copy_code:?}; request {:.0}s, {}; writes acknowledged {} failed {}",
        restart.down.as_secs_f64(),
        restart.until_ready.as_secs_f64(),
        before.len(),
        took.as_secs_f64(),
        summary(&req),
        written.acked.len(),
        written.failures
    );
    assert_eq!(
        req.status.as_ref().map(|s| s.phase),
        Some(Phase::Successful),
        "{}",
        summary(&req)
    );
    assert_eq!(copy_code, Some(0), "the final copy's exit code as reported");
}
