//! PostgreSQL run by Patroni (`database: {engine: Patroni}`), against real Patroni 3.0.2 and
//! PostgreSQL 15 members (`fixtures/patroni.yaml`, image `storage-migrator.test/patroni`, built
//! by `e2e/scripts/build-test-image.sh patroni` and loaded by `test-all.sh`), with a client
//! inserting a row every 20 ms into the current leader:
//!
//! - a `StorageClassChange` and a `Shrink`, each with asynchronous replication and with
//!   `synchronous_mode: true`: no acknowledged row lost on any member, exactly one leader change
//!   and it happened before the old leader's pod was deleted (a switchover, not a failover), the
//!   leader moved last, every replica streaming at the end;
//! - a replica cut off from the leader (it falls behind, then stops streaming) holds the gate,
//!   named, until it is reconnected;
//! - a switchover Patroni refuses (its API wants credentials the request does not give): the
//!   leader is not stopped and the request says why.
//!
//! Each test prints a `NOTE` line: the longest gap between acknowledged writes and each
//! member's downtime. Needs a cluster in `KUBECONFIG` with the image loaded (test-all.sh).

use std::time::{Duration, Instant};

use e2e::testing::operator::{self, Operator, install_crd};
use e2e::testing::patroni::{self, State, Writer, Writes};
use e2e::testing::{TestCluster, TestNamespace, init_tracing, procs};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject};
use serde_json::{Value, json};
use storage_migrator::api::StorageMigrationRequest;

const REQUEST: &str = "pg-move";

/// One Patroni cluster at a time: three of them side by side, with writers and copies, on a
/// 2-core machine measure the machine, not the operator.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn setup(
    test: &str,
    edit: impl Fn(&mut DynamicObject),
) -> (TestCluster, TestNamespace, Option<Operator>, State) {
    init_tracing();
    let cluster = TestCluster::from_env().await.expect("cluster");
    let ns = cluster.namespace(test).await.expect("namespace");
    install_crd(&ns).await.expect("install the CRD");
    let class = cluster.storage_class.clone();
    let state = patroni::apply(&ns, &class, edit)
        .await
        .expect("the Patroni cluster up and healthy");
    let operator = match std::env::var("E2E_OPERATOR").is_ok_and(|v| v == "external") {
        true => None,
        false => Some(
            Operator::start(&ns, 0, None)
                .await
                .expect("start the operator"),
        ),
    };
    (cluster, ns, operator, state)
}

/// A `StorageClassChange` of the set to the cluster's second class, with `database`.
fn class_change(cluster: &TestCluster, database: Value) -> Value {
    json!({
        "type": "StorageClassChange",
        "target": {"kind": "StatefulSet", "name": patroni::SET},
        "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
        "timeout": "20m",
        "database": database,
    })
}

async fn create_request(ns: &TestNamespace, spec: Value) {
    operator::create_request(ns, REQUEST, spec)
        .await
        .expect("create the request");
}

async fn status(ns: &TestNamespace) -> Value {
    let api: Api<StorageMigrationRequest> = ns.api();
    match api.get_opt(REQUEST).await {
        Ok(Some(r)) => serde_json::to_value(r.status).unwrap_or(Value::Null),
        _ => Value::Null,
    }
}

async fn wait_final(ns: &TestNamespace) -> Value {
    let r = operator::wait_final(ns, REQUEST, Duration::from_secs(900))
        .await
        .expect("request final");
    serde_json::to_value(r.status).expect("status as JSON")
}

fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    (status["conditions"].as_array()?)
        .iter()
        .find(|c| c["type"] == type_)
}

/// Every acknowledged id is on every member (each given up to 30 s to replay).
async fn no_acknowledged_row_lost(ns: &TestNamespace, writes: &Writes) {
    assert!(
        !writes.acked.is_empty(),
        "the writer got no insert acknowledged"
    );
    for (pod, ip) in patroni::member_ips(ns).await {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ids = patroni::ids_on(&ip).await.unwrap_or_default();
            let lost: Vec<i64> = (writes.acked.iter())
                .filter(|id| !ids.contains(id))
                .copied()
                .collect();
            if lost.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{pod} misses {} acknowledged rows, e.g. {:?}",
                lost.len(),
                &lost[..lost.len().min(10)]
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// A migration of the whole set while the writer runs; returns the final status, the state
/// before and after, and the writes.
async fn migrate_while_writing(
    ns: &TestNamespace,
    before: &State,
    spec: Value,
) -> (Value, State, Writes) {
    let writer = Writer::start(ns).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    create_request(ns, spec).await;
    let status = wait_final(ns).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes = writer.finish().await;
    assert_eq!(status["phase"], "Successful", "{status:#}");
    let after = patroni::wait_healthy(ns, Duration::from_secs(120)).await;
    assert!(
        after.leader.is_some() && after.leader != before.leader,
        "{after:?}"
    );
    (status, after, writes)
}

/// What every migration must show: no acknowledged row lost, the leader moved last, exactly
/// one leader change, made before the old leader's pod was deleted (a switchover), every
/// replica streaming, the final check on record.
async fn check_switched_over_once(
    test: &str,
    ns: &TestNamespace,
    before: &State,
    (status, after, writes): &(Value, State, Writes),
) {
    println!(
        "NOTE {test}: writes attempted {} acknowledged {} failed {}; longest gap between \
         acknowledged writes {} ms (ended {:?} in); downtime {:?}; timeline {} -> {}; order {:?}; \
         final check {}; first errors {:?}",
        writes.attempted,
        writes.acked.len(),
        writes.failed,
        writes.longest_gap.as_millis(),
        writes.longest_gap_ended,
        operator::member_downtimes(status),
        before.timeline,
        after.timeline,
        operator::member_order(status),
        status["finalHash"],
        writes.errors,
    );
    no_acknowledged_row_lost(ns, writes).await;
    let old_leader = before.leader.clone().expect("a leader before");
    assert_eq!(
        operator::member_order(status).last(),
        Some(&old_leader),
        "the leader moves last"
    );
    assert_eq!(
        after.history.len(),
        before.history.len() + 1,
        "exactly one leader change: {:?}",
        after.history
    );
    let switched: jiff::Timestamp = (after.history.last())
        .and_then(|h| h[3].as_str())
        .and_then(|t| t.parse().ok())
        .expect("the change's time in /history");
    let last = status["members"].as_array().and_then(|m| m.last()).cloned();
    let deleted: jiff::Timestamp = last
        .as_ref()
        .and_then(|m| m["podDeletedAt"].as_str())
        .and_then(|t| t.parse().ok())
        .expect("the old leader's podDeletedAt");
    assert!(
        switched < deleted,
        "the leader changed at {switched}, before its pod was deleted at {deleted} (a \
         switchover, not a failover)"
    );
    let new_leader = after.leader.clone().expect("a leader after");
    let handover = operator::handover_on_record(status, &old_leader, &new_leader);
    println!("NOTE {test}: switchover on record: {handover} s");
    assert!(
        after.healthy(3),
        "every replica streams at the end: {after:?}"
    );
    assert!(
        (status["finalHash"].as_str()).is_some_and(|h| h.starts_with("timeline ")),
        "{status:#}"
    );
    assert!(
        writes.longest_gap < Duration::from_secs(20),
        "a gap of {:?} between acknowledged writes is a failover's, not a switchover's",
        writes.longest_gap
    );
}

/// Which migration a test runs.
#[derive(Clone, Copy)]
enum Kind {
    ClassChange,
    Shrink,
}

/// The request of `kind` for the whole set, engine Patroni.
fn request_of(cluster: &TestCluster, kind: Kind) -> Value {
    match kind {
        Kind::ClassChange => class_change(cluster, json!({"engine": "Patroni"})),
        Kind::Shrink => json!({
            "type": "Shrink",
            "target": {"kind": "StatefulSet", "name": patroni::SET},
            "shrink": {"size": "512Mi"},
            "timeout": "20m",
            "database": {"engine": "Patroni"},
        }),
    }
}

/// Turns on `synchronous_mode` and waits until Patroni names one synchronous standby.
async fn synchronous(ns: &TestNamespace) -> State {
    assert!(
        patroni::patch_config(ns, &json!({"synchronous_mode": true})).await,
        "PATCH /config synchronous_mode"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = patroni::state(ns).await;
        if s.healthy(3) && s.synchronous.len() == 1 {
            return s;
        }
        assert!(Instant::now() < deadline, "no synchronous standby: {s:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A migration of `kind` while writing, with asynchronous replication or (`sync`)
/// `synchronous_mode: true`; checks what every migration must show, and in synchronous mode
/// that the asynchronous replica goes first and the synchronous standby second.
async fn migrate(test: &str, kind: Kind, sync: bool) {
    let _one = ONE_AT_A_TIME.lock().await;
    let (cluster, ns, _operator, before) = setup(test, |_| {}).await;
    let before = match sync {
        true => synchronous(&ns).await,
        false => before,
    };
    let outcome = migrate_while_writing(&ns, &before, request_of(&cluster, kind)).await;
    check_switched_over_once(test, &ns, &before, &outcome).await;
    if let Some(standby) = before.synchronous.iter().next().filter(|_| sync) {
        let used = operator::member_order(&outcome.0);
        assert_eq!(
            used.get(1),
            Some(standby),
            "the synchronous standby second: {used:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_cluster_changes_class_with_one_switchover_and_no_lost_row() {
    migrate("patroni-async-class", Kind::ClassChange, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_cluster_shrinks_with_one_switchover_and_no_lost_row() {
    migrate("patroni-async-shrink", Kind::Shrink, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_cluster_changes_class_with_one_switchover_and_no_lost_row() {
    migrate("patroni-sync-class", Kind::ClassChange, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_cluster_shrinks_with_one_switchover_and_no_lost_row() {
    migrate("patroni-sync-shrink", Kind::Shrink, true).await;
}

/// A process of member pod `pod` (its network namespace is the pod's).
fn member_pid(ns: &TestNamespace, pod: &str) -> i32 {
    let pids = [("postgres", ""), ("python3", "patroni")]
        .iter()
        .flat_map(|(program, arg)| procs::pod_processes(program, arg, &ns.name, pod))
        .collect::<Vec<_>>();
    *pids
        .first()
        .unwrap_or_else(|| panic!("no process of {pod} found"))
}

/// Cuts replica `pod` off from the leader (a blackhole route in its pod's network namespace:
/// it stops receiving WAL; Patroni cannot undo that, as it undoes a paused replay) and writes a
/// few MB on the leader, so that the replica trails by more than `maxLagBytes`, then stops
/// streaming once the leader's `wal_sender_timeout` drops it.
async fn make_lag(ns: &TestNamespace, pod: &str, leader_ip: &str) -> i32 {
    let pid = member_pid(ns, pod);
    procs::cut_off(pid, leader_ip).expect("cut the replica off from the leader");
    patroni::query(
        leader_ip,
        "CREATE TABLE filler AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 20000) g",
    )
    .await
    .expect("write on the leader");
    pid
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_holds_the_gate_naming_itself_until_it_catches_up() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (cluster, ns, _operator, before) = setup("patroni-lag", |_| {}).await;
    let leader = before.leader.clone().expect("leader");
    let mut replicas: Vec<String> = before.streaming.iter().cloned().collect();
    replicas.sort();
    // The first replica goes first; the second lags before that.
    let (first, lagging) = (replicas[0].clone(), replicas[1].clone());
    let leader_ip = before.leader_ip.clone().expect("leader IP");
    let pid = make_lag(&ns, &lagging, &leader_ip).await;
    let database = json!({"engine": "Patroni", "maxLagBytes": 65536});
    create_request(&ns, class_change(&cluster, database)).await;
    let deadline = Instant::now() + Duration::from_secs(240);
    let held = loop {
        let s = status(&ns).await;
        if let Some(c) = condition(&s, "HealthGate").filter(|c| c["status"] == "False") {
            let m = c["message"].as_str().unwrap_or("");
            let lags = m.contains(&format!("{lagging} is")) && m.contains("bytes of WAL behind");
            let gone = m.contains(&format!("{lagging}: does not stream from the leader"));
            if lags || gone {
                break s;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the gate did not name {lagging}: {s:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let pods: Api<Pod> = ns.api();
    assert!(
        (pods.get(&first).await).is_ok_and(|p| p.metadata.deletion_timestamp.is_none()),
        "{first} is not stopped while {lagging} lags: {held:#}"
    );
    procs::reconnect(pid, &leader_ip).expect("reconnect the replica");
    let done = wait_final(&ns).await;
    assert_eq!(done["phase"], "Successful", "{done:#}");
    assert_eq!(
        operator::member_order(&done).last(),
        Some(&leader),
        "the leader moves last"
    );
    println!(
        "NOTE patroni-lag: held with {:?}; downtime {:?}",
        condition(&held, "HealthGate").map(|c| &c["message"]),
        operator::member_downtimes(&done)
    );
}

/// The fixture with basic authentication on Patroni's unsafe endpoints (a switchover needs it).
fn with_api_password(obj: &mut DynamicObject) {
    let containers = obj.data.pointer_mut("/spec/template/spec/containers");
    let Some(containers) = containers.and_then(Value::as_array_mut) else {
        return;
    };
    for env in containers
        .iter_mut()
        .filter_map(|c| c["env"].as_array_mut())
    {
        for e in env
            .iter_mut()
            .filter(|e| e["name"] == "PATRONI_CONFIGURATION")
        {
            let config = e["value"].as_str().unwrap_or("").replace(
                "restapi:\n",
                "restapi:\n  authentication:\n    username: admin\n    password: not-given\n",
            );
            e["value"] = Value::String(config);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_switchover_leaves_the_leader_running_and_says_why() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (cluster, ns, _operator, before) = setup("patroni-refused", with_api_password).await;
    let leader = before.leader.clone().expect("leader");
    let pods: Api<Pod> = ns.api();
    let uid = pods.get(&leader).await.expect("leader pod").uid();
    create_request(&ns, class_change(&cluster, json!({"engine": "Patroni"}))).await;
    let deadline = Instant::now() + Duration::from_secs(300);
    let refused = loop {
        let s = status(&ns).await;
        let c = condition(&s, "HealthGate").filter(|c| c["reason"] == "HandoverRefused");
        if let Some(c) = c {
            break c["message"].as_str().unwrap_or("").to_string();
        }
        assert_ne!(s["phase"], "Successful", "{s:#}");
        assert!(Instant::now() < deadline, "no HandoverRefused: {s:#}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(refused.contains("401"), "{refused}");
    // Refused again and again: the leader keeps running and leading.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let still = pods.get(&leader).await.expect("leader pod");
    assert_eq!(still.uid(), uid, "the leader's pod was not replaced");
    assert!(
        still.metadata.deletion_timestamp.is_none(),
        "the leader is not stopped"
    );
    assert_eq!(patroni::state(&ns).await.leader, Some(leader.clone()));
    let s = status(&ns).await;
    assert_eq!(s["phase"], "Progressing", "it waits: {s:#}");
    println!("NOTE patroni-refused: {refused}");
}
