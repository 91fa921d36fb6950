//! The etcd engine against a real etcd StatefulSet (ignored by default: needs a cluster).
//!
//! ```sh
//! export KUBECONFIG=/tmp/dir/kubeconfig      # e.g. from `localcluster up`
//! kubectl create ns engine-live
//! kubectl apply -n engine-live --server-side -f e2e/fixtures/etcd.yaml   # wait for 3/3 Ready
//! SM_ENGINE_NAMESPACE=engine-live cargo test -p storage-migrator --test engine_etcd_live \
//!     -- --ignored --nocapture
//! ```
//!
//! Checks: every member observed through its own endpoint, 3 voting members, one leader; the
//! gates and the order (followers first, leader last); a leadership transfer to a follower that
//! every member confirms and that raises the term by exactly one; `hash_kv` agreement.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use storage_migrator::api::{DatabaseEngine, DatabaseSpec, EtcdSpec};
use storage_migrator::engine::{
    self, DEFAULT_MAX_LAG, Engine, Gate, HealthReport, LEADER_TRANSFER_FIRST,
};

async fn pods(client: &Client, ns: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default().labels("app=etcd"))
        .await
        .unwrap()
        .items
}

fn term(report: &HealthReport) -> u64 {
    report
        .members
        .iter()
        .filter_map(|m| m.raft_term)
        .max()
        .unwrap()
}

#[tokio::test]
#[ignore = "needs a cluster with the etcd fixture (see the file's doc)"]
async fn etcd_engine_against_a_real_cluster() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "storage_migrator=info".into()),
        )
        .with_test_writer()
        .try_init();
    let ns = std::env::var("SM_ENGINE_NAMESPACE").unwrap_or_else(|_| "default".to_string());
    let client = Client::try_default().await.unwrap();
    let spec = DatabaseSpec {
        engine: DatabaseEngine::Etcd,
        generic: None,
        etcd: Some(EtcdSpec::default()),
    };
    let engine = Engine::from_spec(&client, &ns, &spec).await.unwrap();
    let pods = pods(&client, &ns).await;
    assert_eq!(pods.len(), 3, "the fixture has 3 members");

    let started = std::time::Instant::now();
    let report = engine.observe(&pods).await.unwrap();
    println!("observe took {:?}:\n{report:#?}", started.elapsed());
    assert_eq!(report.problems, Vec::<String>::new());
    assert_eq!(report.voting_members, Some(3));
    assert!(report.members.iter().all(|m| m.healthy));
    assert_eq!(engine::is_healthy_for_start(&report), Ok(()));
    let leader = report.leader.clone().expect("a leader");
    let names: Vec<String> = report.members.iter().map(|m| m.pod.clone()).collect();
    assert_eq!(names, ["etcd-0", "etcd-1", "etcd-2"]);

    // Order: followers first, leader last.
    let first = engine::next_member(&report, &names).unwrap();
    assert_ne!(first, leader);
    assert_eq!(
        engine::next_member(&report, std::slice::from_ref(&leader)).as_deref(),
        Some(leader.as_str())
    );
    // Gates: a follower may stop, the leader must hand over first.
    assert_eq!(
        engine::gate_before_stop(&report, &first, DEFAULT_MAX_LAG),
        Gate::Open
    );
    assert_eq!(
        engine::gate_before_stop(&report, &leader, DEFAULT_MAX_LAG),
        Gate::Wait(LEADER_TRANSFER_FIRST.to_string())
    );
    assert_eq!(
        engine::gate_after_return(&report, &first, DEFAULT_MAX_LAG),
        Gate::Open
    );

    // Transfer to a follower, preferring one "already migrated".
    let migrated = vec![first.clone()];
    let to = engine::transfer_target(&report, &leader, &migrated).unwrap();
    assert_eq!(to, first);
    let term_before = term(&report);
    let started = std::time::Instant::now();
    engine
        .transfer_leadership(&report, &leader, &to)
        .await
        .unwrap();
    println!(
        "transfer {leader} -> {to} took {:?} (confirmed by every member)",
        started.elapsed()
    );
    let after = engine.observe(&pods).await.unwrap();
    assert_eq!(after.leader.as_deref(), Some(to.as_str()));
    assert_eq!(after.problems, Vec::<String>::new());
    assert_eq!(
        term(&after),
        term_before + 1,
        "one handover, one term: no election timeout"
    );
    // The old leader is now a follower and may stop.
    assert_eq!(
        engine::gate_before_stop(&after, &leader, DEFAULT_MAX_LAG),
        Gate::Open
    );
    // Idempotent: repeating the transfer with the stale report is Ok at once.
    let stale = engine.transfer_leadership(&report, &leader, &to).await;
    assert!(stale.is_ok(), "to already leads: Ok ({stale:?})");

    // hash_kv agrees.
    let hash = engine.final_hash(&pods).await.unwrap().unwrap();
    println!("final hash {hash}");
    assert!(hash.contains('@'));

    // Transfer back, so the test can be run again from the same state.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let back = engine.transfer_leadership(&after, &to, &leader).await;
    println!("transfer back: {back:?}");
}

/// Polls `f` every 500 ms until it is true, at most `secs` seconds.
async fn eventually<F, Fut>(secs: u64, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A stopped member (StatefulSet orphan-deleted, one pod deleted) is named by `IfReady` and
/// closes the gates; an endpoint that does not answer costs a bounded time; after the member
/// returns, the after-gate opens.
#[tokio::test]
#[ignore = "needs a cluster with the etcd fixture (see the file's doc)"]
async fn etcd_engine_with_a_stopped_member() {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use kube::api::{DeleteParams, PostParams};

    let ns = std::env::var("SM_ENGINE_NAMESPACE").unwrap_or_else(|_| "default".to_string());
    let client = Client::try_default().await.unwrap();
    let spec = DatabaseSpec {
        engine: DatabaseEngine::Etcd,
        generic: None,
        etcd: None,
    };
    let engine = Engine::from_spec(&client, &ns, &spec).await.unwrap();
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let stash = sets.get("etcd").await.unwrap();
    sets.delete("etcd", &DeleteParams::orphan()).await.unwrap();
    eventually(60, "StatefulSet gone", || async {
        sets.get_opt("etcd").await.unwrap().is_none()
    })
    .await;
    pod_api
        .delete("etcd-2", &DeleteParams::default())
        .await
        .unwrap();
    eventually(60, "etcd-2 gone", || async {
        pod_api.get_opt("etcd-2").await.unwrap().is_none()
    })
    .await;

    let two = pods(&client, &ns).await;
    assert_eq!(two.len(), 2);
    let report = engine.observe(&two).await.unwrap();
    println!("with etcd-2 stopped: {:?}", report.problems);
    assert_eq!(report.voting_members, Some(3));
    let err = engine::is_healthy_for_start(&report).unwrap_err();
    assert!(err.contains("etcd-2"), "{err}");
    let follower = report
        .members
        .iter()
        .find(|m| !m.leader)
        .unwrap()
        .pod
        .clone();
    assert!(matches!(
        engine::gate_before_stop(&report, &follower, DEFAULT_MAX_LAG),
        Gate::Wait(w) if w.contains("etcd-2")
    ));

    // A member pod whose endpoint does not answer (an unused address of the pod range).
    let mut ghost = two[0].clone();
    ghost.metadata.name = Some("etcd-2".to_string());
    let ip = ghost
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap();
    let unused = format!("{}.250", ip.rsplit_once('.').unwrap().0);
    ghost.status.as_mut().unwrap().pod_ip = Some(unused);
    let mut with_ghost = two.clone();
    with_ghost.push(ghost);
    let started = std::time::Instant::now();
    let report = engine.observe(&with_ghost).await.unwrap();
    let took = started.elapsed();
    let g = report.members.iter().find(|m| m.pod == "etcd-2").unwrap();
    println!("unanswering endpoint: {:?} after {took:?}", g.problem);
    assert!(!g.healthy);
    assert!(took < Duration::from_secs(8), "bounded: {took:?}");

    // Bring the member back: recreate the set from the stash (it recreates etcd-2 on its claim).
    let mut again = stash.clone();
    again.metadata = kube::api::ObjectMeta {
        name: stash.metadata.name.clone(),
        labels: stash.metadata.labels.clone(),
        ..Default::default()
    };
    again.status = None;
    sets.create(&PostParams::default(), &again).await.unwrap();
    eventually(120, "etcd-2 back and caught up", || async {
        let all = pods(&client, &ns).await;
        if all.len() != 3 {
            return false;
        }
        let r = engine.observe(&all).await.unwrap();
        engine::gate_after_return(&r, "etcd-2", DEFAULT_MAX_LAG) == Gate::Open
            && engine::is_healthy_for_start(&r).is_ok()
    })
    .await;
}
