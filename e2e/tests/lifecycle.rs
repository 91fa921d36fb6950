//! End-to-end scenarios about a request's life cycle, against the cluster `KUBECONFIG` points
//! at, each in its own namespace with its own operator process watching only that namespace
//! (`storage-migrator run --namespace NS`):
//!
//! - a request deleted while it is `Progressing`: the finalizer keeps it until the member in
//!   flight is rolled back and the StatefulSet recreated; then it goes, leaving the workload
//!   as it was and nothing of its own behind;
//! - engine `Generic` with `leaderLabel`: the labelled pod is migrated last; the ended request
//!   carries no finalizer, and one put back on it (the operator died between the two writes
//!   that end a request) is lifted;
//! - an operator killed without releasing its Lease, restarted under the same identity once the
//!   renewal on record is past the fence's end but not yet expired: it waits for its own renewal
//!   and keeps leading;
//! - readiness: a call the API server refuses (a rule withdrawn from the operator's Role while
//!   it is ready) turns `/readyz` to 503 naming the rule, and it is ready again once the rule is
//!   back.
//!
//! The operator binary comes from `STORAGE_MIGRATOR_BIN` (default
//! `<workspace>/target/debug/storage-migrator`).
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test lifecycle -- --test-threads=2`

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use e2e::testing::helm::http_get;
use e2e::testing::operator::{
    Operator, create_request, install_crd, summary, wait_final, wait_status,
};
use e2e::testing::{ETCD_READY, TestCluster, TestNamespace, etcd, rbac, scenario};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role as RbacRole};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use storage_migrator::api::{MemberStep, Phase, Role, StorageMigrationRequest};
use storage_migrator::labels::LEASE_NAME;
use tracing::info;

const MIGRATION: Duration = Duration::from_secs(600);
const SET: &str = "etcd";
const MINUTE: Duration = Duration::from_secs(60);
const FINALIZER: &str = "storagemigrator.io/finalizer";
const REQUEST_LABEL: &str = "storagemigrator.io/request";

/// The CRD, then the etcd fixture (claims on the cluster's Immediate class), 3/3 Ready.
async fn setup(test: &str) -> (TestCluster, TestNamespace) {
    let (cluster, ns) = scenario(test).await;
    install_crd(&ns).await.unwrap();
    ns.apply_etcd().await.unwrap();
    (cluster, ns)
}

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

/// Names of the objects labelled `storagemigrator.io/request=<request>` of type `K`.
async fn labelled<K>(ns: &TestNamespace, request: &str) -> Vec<String>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
    <K as kube::Resource>::DynamicType: Default,
{
    let lp = ListParams::default().labels(&format!("{REQUEST_LABEL}={request}"));
    ns.api::<K>()
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| o.name_any())
        .collect()
}

/// Waits (bounded) until no claim, Job, pod or ConfigMap of the request is left, except the
/// ConfigMaps named in `kept` (the stash of a request that ended Failed is kept).
async fn wait_nothing_left(ns: &TestNamespace, request: &str, timeout: Duration, kept: &[&str]) {
    let started = Instant::now();
    loop {
        let mut configmaps = labelled::<ConfigMap>(ns, request).await;
        configmaps.retain(|n| !kept.contains(&n.as_str()));
        let left = [
            (
                "claims",
                labelled::<PersistentVolumeClaim>(ns, request).await,
            ),
            ("jobs", labelled::<Job>(ns, request).await),
            ("pods", labelled::<Pod>(ns, request).await),
            ("configmaps", configmaps),
        ];
        if left.iter().all(|(_, names)| names.is_empty()) {
            return;
        }
        assert!(
            started.elapsed() < timeout,
            "objects of request {request} left after {timeout:?}: {left:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

// ------------------------------------------------------------------------------------------
// Scenarios.

/// The request is deleted while its first member is down and its final copy cannot run (no
/// pre-copy, a mover image no node has, a long timeout): a deterministic point in the middle
/// of a member's migration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_progressing_request_rolls_back_then_removes_it() {
    let (cluster, ns) = setup("smr-delete-progressing").await;
    let seeded = seed(&ns, 200).await;
    let before = claims(&ns).await;
    for (claim, (_, class, _)) in &before {
        assert_eq!(class, &cluster.storage_class, "{claim}");
    }
    let etcd_before = check_etcd(&ns, &seeded).await;
    // A mover image no node has keeps the copy Job from starting: allowed for the request, and
    // waited for longer than the test lasts.
    let flags = [
        "--allow-request-mover-image",
        "--helper-start-timeout",
        "3600",
    ];
    let _op = Operator::start_with(&ns, 0, None, &flags).await.unwrap();

    let name = "deleted";
    create_request(
        &ns,
        name,
        json!({
            "type": "StorageClassChange",
            "target": {"kind": "StatefulSet", "name": SET},
            "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
            "timeout": "30m",
            "copy": {"preCopy": false, "moverImage": "registry.invalid/no-such-mover:0"},
            "database": {"engine": "Etcd"},
        }),
    )
    .await
    .unwrap();
    let req = wait_status(
        &ns,
        name,
        "first member copying",
        Duration::from_secs(180),
        |s| {
            s.phase == Phase::Progressing
                && s.members
                    .first()
                    .is_some_and(|m| m.step == MemberStep::Copying)
        },
    )
    .await
    .unwrap();
    info!(status = %summary(&req), "deleting the request while it progresses");
    let in_flight = req.status.as_ref().unwrap().members[0].pod.clone();
    let uid = req.uid().unwrap();
    assert!(req.finalizers().iter().any(|f| f == FINALIZER));

    let api: Api<StorageMigrationRequest> = ns.api();
    let deleted_at = Instant::now();
    let still = api
        .delete(name, &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("the finalizer keeps the request after the delete");
    assert!(still.metadata.deletion_timestamp.is_some());
    assert!(still.finalizers().iter().any(|f| f == FINALIZER));
    // Still there a moment later: the operator rolls back before it lets go.
    let again = api.get_opt(name).await.unwrap();
    assert!(again.is_some(), "the request vanished at once");

    ns.wait_deleted(api.clone(), name, &uid, MIGRATION)
        .await
        .unwrap();
    info!(took = ?deleted_at.elapsed(), "request gone after its rollback");

    let events = ns.events_for(name).await.unwrap();
    for reason in ["RollingBack", "MemberRolledBack", "StatefulSetRecreated"] {
        assert!(
            events.iter().any(|e| e.starts_with(reason)),
            "no {reason} event in {events:?}"
        );
    }
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("MemberRolledBack") && e.contains(&in_flight)),
        "no MemberRolledBack event naming {in_flight}: {events:?}"
    );

    let set: StatefulSet = ns.api().get(SET).await.unwrap();
    assert!(set.metadata.deletion_timestamp.is_none());
    ns.wait_statefulset_ready(SET, 3, ETCD_READY).await.unwrap();
    assert_eq!(
        claims(&ns).await,
        before,
        "every claim Bound under its name, on its original volume and class"
    );
    assert_eq!(
        check_etcd(&ns, &seeded).await,
        etcd_before,
        "etcd key count and hash unchanged"
    );
    // The request ended Failed (rolled back) before it went: its stash is kept, with the
    // StatefulSet's manifest and the stopped member's pod.
    let stash = format!("{name}-stash");
    wait_nothing_left(&ns, name, Duration::from_secs(60), &[stash.as_str()]).await;
    let cm = ns.api::<ConfigMap>().get(&stash).await.unwrap();
    let data = cm.data.unwrap_or_default();
    assert!(data.contains_key("statefulset"), "{:?}", data.keys());
    assert!(
        data.keys().any(|k| k.starts_with("pod-")),
        "{:?}",
        data.keys()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_engine_migrates_the_labelled_leader_last() {
    let (cluster, ns) = setup("smr-generic-leader").await;
    let seeded = seed(&ns, 200).await;
    let etcd_before = check_etcd(&ns, &seeded).await;
    let before = claims(&ns).await;
    let leader = format!("{SET}-0");
    ns.api::<Pod>()
        .patch(
            &leader,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"role": "leader"}}})),
        )
        .await
        .unwrap();
    let _op = Operator::start(&ns, 0, None).await.unwrap();

    let name = "generic";
    let started = Instant::now();
    create_request(
        &ns,
        name,
        json!({
            "type": "StorageClassChange",
            "target": {"kind": "StatefulSet", "name": SET},
            "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
            "timeout": "15m",
            "database": {"engine": "Generic", "generic": {"leaderLabel": "role=leader"}},
        }),
    )
    .await
    .unwrap();
    let req = wait_final(&ns, name, MIGRATION).await.unwrap();
    info!(took = ?started.elapsed(), status = %summary(&req), "generic migration done");
    let status = req.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Successful, "{}", summary(&req));
    let order: Vec<&str> = status.members.iter().map(|m| m.pod.as_str()).collect();
    assert_eq!(order.len(), 3, "{order:?}");
    assert_eq!(
        order.last(),
        Some(&leader.as_str()),
        "the leader goes last: {order:?}"
    );
    assert!(
        status.members.iter().all(|m| m.step == MemberStep::Done),
        "{}",
        summary(&req)
    );
    let plan = status.plan.clone().unwrap();
    let roles: Vec<(String, Option<Role>)> = plan
        .members
        .iter()
        .map(|m| (m.pod.clone(), m.role))
        .collect();
    for (pod, role) in &roles {
        let want = if *pod == leader {
            Role::Leader
        } else {
            Role::Follower
        };
        assert_eq!(*role, Some(want), "role of {pod}: {roles:?}");
    }

    ns.wait_statefulset_ready(SET, 3, ETCD_READY).await.unwrap();
    let after = claims(&ns).await;
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    for (claim, (volume, class, _)) in &after {
        assert_eq!(class, &cluster.wffc_storage_class, "{claim}");
        assert_ne!(volume, &before[claim].0, "{claim} is on a new volume");
    }
    assert_eq!(
        check_etcd(&ns, &seeded).await,
        etcd_before,
        "etcd key count and hash unchanged"
    );
    wait_nothing_left(&ns, name, Duration::from_secs(60), &[]).await;
    finalizer_lifted_from_ended(&ns, name).await;
}

/// The ended request `name` carries no finalizer, and one put back on it (as when the operator
/// died between the status write that ended the request and its finalizer patch) is lifted by
/// the operator, the status untouched: an ended request never holds up its namespace's or the
/// CRD's deletion once the operator is gone.
async fn finalizer_lifted_from_ended(ns: &TestNamespace, name: &str) {
    let api: Api<StorageMigrationRequest> = ns.api();
    let none = |r: Option<&StorageMigrationRequest>| r.is_some_and(|r| r.finalizers().is_empty());
    let describe = |r: &StorageMigrationRequest| format!("finalizers {:?}", r.finalizers());
    let ended = ns
        .wait_for(api.clone(), name, "no finalizer", MINUTE, none, describe)
        .await
        .unwrap()
        .unwrap();
    let put_back = json!({"metadata": {"finalizers": [FINALIZER]}});
    let patched = api
        .patch(name, &PatchParams::default(), &Patch::Merge(&put_back))
        .await
        .unwrap();
    assert_eq!(patched.finalizers(), [FINALIZER]);
    let started = Instant::now();
    let lifted = ns
        .wait_for(
            api,
            name,
            "the finalizer lifted again",
            MINUTE,
            none,
            describe,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        lifted.status, ended.status,
        "an ended request's status is left alone"
    );
    info!(took = ?started.elapsed(), "the finalizer put back on the ended request was lifted");
}

/// The Lease's holder and last renewal, once `identity` holds it (waits up to 30 s).
async fn held_by(ns: &TestNamespace, identity: &str) -> std::time::SystemTime {
    let t0 = Instant::now();
    loop {
        let lease = ns.api::<Lease>().get_opt(LEASE_NAME).await.unwrap();
        let spec = lease.and_then(|l| l.spec);
        if let Some(spec) = spec.filter(|s| s.holder_identity.as_deref() == Some(identity)) {
            let renewed = spec.renew_time.expect("a held Lease has a renewTime");
            return std::time::SystemTime::from(renewed.0);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{identity} never held the Lease"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A container restarted in its pod keeps its identity. The lease manager then takes the old
/// Lease over without writing and renews it at once only if the renewal on record is due. Here
/// the restart comes 13 s after the last renewal: past the fence's end (12.5 s), before the Lease
/// expires (15 s). The operator must wait for its own renewal and keep leading; it used to read
/// the stale renewal and exit at once ("stopped acting").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_under_the_same_identity_keeps_leading_past_a_stale_renewal() {
    let (_cluster, ns) = scenario("smr-stale-lease").await;
    install_crd(&ns).await.unwrap();
    let identity = format!("e2e-{}", ns.name);
    // A failpoint that never fires keeps the process unsupervised: an exit is seen, not hidden
    // by a restart.
    let mut first = Operator::start(&ns, 0, Some("stage-Migrating=off"))
        .await
        .unwrap();
    held_by(&ns, &identity).await;
    let pid = first.pid().expect("the first operator runs");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    assert_eq!(first.wait_exit(Duration::from_secs(10)).await.unwrap(), -1);
    let renewed = held_by(&ns, &identity).await;
    let restart_at = renewed + Duration::from_secs(13);
    let wait = restart_at
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    info!(?wait, "restarting 13 s after the last renewal");
    tokio::time::sleep(wait).await;
    let late = std::time::SystemTime::now()
        .duration_since(renewed)
        .unwrap_or_default();
    assert!(
        late < Duration::from_secs(14),
        "the restart came {late:?} after the renewal; the Lease nearly expired: test void"
    );
    let mut second = Operator::start(&ns, 1, Some("stage-Migrating=off"))
        .await
        .unwrap();
    second
        .check_running(Duration::from_secs(8))
        .await
        .unwrap_or_else(|e| panic!("the restarted operator stopped: {e}"));
    let renewed_again = held_by(&ns, &identity).await;
    assert!(
        renewed_again > renewed,
        "the restarted operator renewed the Lease ({renewed:?} -> {renewed_again:?})"
    );
    let log = std::fs::read_to_string(second.log()).unwrap();
    assert!(log.contains("became the leader"), "{log}");
    assert!(!log.contains("stopped acting"), "{log}");
}

/// Waits up to `timeout` for `/readyz` at `addr` to answer `code`; the body it answered.
async fn readyz_answers(addr: std::net::SocketAddr, code: u16, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    let mut last = None;
    while Instant::now() < deadline {
        match http_get(&addr.ip().to_string(), addr.port(), "/readyz").await {
            Ok((c, body)) if c == code => return body,
            answer => last = Some(answer),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("/readyz did not answer {code} within {timeout:?}; last: {last:?}");
}

/// Once ready, the readiness check asks only the API server (no permission reviews); a call the
/// API server refuses with 403 makes it ask every permission again, within 30 s of the last
/// check: here the claims rule is withdrawn from the operator's Role while it is ready, a
/// request makes the operator list claims, and `/readyz` answers 503 naming the rule; with the
/// rule back it is ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_call_makes_the_operator_not_ready_naming_the_rule_until_it_is_back() {
    let (_cluster, ns) = scenario("ready-refused").await;
    install_crd(&ns).await.unwrap();
    let operator = Operator::start(&ns, 0, None).await.unwrap();
    let addr = operator
        .http_address(Duration::from_secs(30))
        .await
        .unwrap();
    readyz_answers(addr, 200, Duration::from_secs(60)).await;
    let roles: Api<RbacRole> = ns.api();
    let name = rbac::service_account(&ns.name);
    let granted = roles.get(&name).await.unwrap().rules.unwrap_or_default();
    let claims_rule =
        |r: &PolicyRule| (r.resources.iter().flatten()).any(|res| res == "persistentvolumeclaims");
    let withdrawn: Vec<_> = granted.iter().filter(|r| !claims_rule(r)).collect();
    assert!(
        withdrawn.len() < granted.len(),
        "no claims rule in {granted:?}"
    );
    let patch = |rules: serde_json::Value| Patch::Merge(json!({ "rules": rules }));
    roles
        .patch(&name, &PatchParams::default(), &patch(json!(withdrawn)))
        .await
        .unwrap();
    create_request(
        &ns,
        "move",
        json!({
            "type": "StorageClassChange",
            "target": {"kind": "StatefulSet", "name": SET},
            "storageClassChange": {"storageClassName": "standard"},
            "timeout": "5m",
        }),
    )
    .await
    .unwrap();
    let body = readyz_answers(addr, 503, Duration::from_secs(120)).await;
    info!(%body, "not ready after the refused call");
    assert!(
        body.contains("persistentvolumeclaims"),
        "/readyz names the withdrawn rule: {body}"
    );
    roles
        .patch(&name, &PatchParams::default(), &patch(json!(granted)))
        .await
        .unwrap();
    readyz_answers(addr, 200, Duration::from_secs(120)).await;
}
