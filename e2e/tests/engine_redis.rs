//! Redis with Sentinel (`database: {engine: RedisSentinel}`), against real Redis 7.0 members with
//! a Sentinel beside each (`fixtures/redis-sentinel.yaml`, image `storage-migrator.test/redis`,
//! built by `e2e/scripts/build-test-image.sh redis` and loaded by `test-all.sh`), with a client
//! writing a key every 20 ms on the master the Sentinels name:
//!
//! - a `StorageClassChange` and a `Shrink`, each: Successful; no acknowledged write lost on any
//!   member; the replicas first and the master last; exactly one master change (the Sentinels'
//!   config-epoch one higher), made before the old master's pod was deleted (the operator's
//!   handover, not a failover after the pod went); the Sentinels name the new master at the end,
//!   every replica in sync.
//!
//! - a replica kept out of sync before its turn (cut off from the master by a blackhole route in
//!   its pod's network namespace, the request created with `apply: Always`): the request waits
//!   with `HealthGate` False naming that replica, the replica that would go first is not
//!   stopped while it waits; once reconnected, Successful, the master last, no acknowledged
//!   write lost. This request finds the Sentinels through a Service (`sentinelService:
//!   redis-sentinel`, the fixture's), the others in the member pods.
//!
//! A write counts as acknowledged when `SET` answered OK and the `WAIT 1` after it reported a
//! replica with it; writes the master took with no replica reported are counted apart, not
//! asserted as kept. Each prints a `NOTE` line: the longest gap between acknowledged writes and
//! each member's downtime (the gate test: the message it was held with). Needs a cluster in
//! `KUBECONFIG` with the image loaded (test-all.sh).

use std::time::{Duration, Instant};

use e2e::testing::operator::{self, Operator, install_crd};
use e2e::testing::redis::{self, State, Writer, Writes};
use e2e::testing::{TestCluster, TestNamespace, init_tracing, procs};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::{Value, json};
use storage_migrator::api::StorageMigrationRequest;

const REQUEST: &str = "redis-move";

async fn setup(test: &str) -> (TestCluster, TestNamespace, Option<Operator>, State) {
    init_tracing();
    let cluster = TestCluster::from_env().await.expect("cluster");
    let ns = cluster.namespace(test).await.expect("namespace");
    install_crd(&ns).await.expect("install the CRD");
    let class = cluster.storage_class.clone();
    let state = redis::apply(&ns, &class)
        .await
        .expect("the Redis group up and healthy");
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

fn order(status: &Value) -> Vec<String> {
    (status["members"].as_array().into_iter().flatten())
        .filter_map(|m| m["pod"].as_str().map(str::to_string))
        .collect()
}

fn downtimes(status: &Value) -> Vec<String> {
    (status["members"].as_array().into_iter().flatten())
        .map(|m| {
            format!(
                "{} {}s",
                m["pod"].as_str().unwrap_or("?"),
                m["downtimeSeconds"]
            )
        })
        .collect()
}

/// Every acknowledged write is on every member (each given up to 30 s to replicate).
async fn no_acknowledged_write_lost(ns: &TestNamespace, writes: &Writes) {
    assert!(
        !writes.acked.is_empty(),
        "the writer got no write acknowledged"
    );
    for (pod, ip) in redis::member_ips(ns).await {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let keys = redis::written_on(&ip).await.unwrap_or_default();
            let lost: Vec<u64> = (writes.acked.iter())
                .filter(|n| !keys.contains(n))
                .copied()
                .collect();
            if lost.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{pod} misses {} acknowledged writes, e.g. {:?}",
                lost.len(),
                &lost[..lost.len().min(10)]
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// One Redis group at a time: two side by side, with writers and copies, on a 2-core machine
/// measure the machine, not the operator.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_group_changes_class_with_one_handover_and_no_lost_write() {
    let _one = ONE_AT_A_TIME.lock().await;
    let test = "redis-class";
    let (cluster, ns, _operator, before) = setup(test).await;
    let spec = json!({
        "type": "StorageClassChange",
        "target": {"kind": "StatefulSet", "name": redis::SET},
        "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
        "timeout": "20m",
        "database": {"engine": "RedisSentinel", "redisSentinel": {"masterName": "mymaster"}},
    });
    migrate_with_one_handover(test, &ns, &before, spec).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_group_shrinks_with_one_handover_and_no_lost_write() {
    let _one = ONE_AT_A_TIME.lock().await;
    let test = "redis-shrink";
    let (_cluster, ns, _operator, before) = setup(test).await;
    let spec = json!({
        "type": "Shrink",
        "target": {"kind": "StatefulSet", "name": redis::SET},
        "shrink": {"size": "512Mi"},
        "timeout": "20m",
        "database": {"engine": "RedisSentinel", "maxLagBytes": 1048576},
    });
    migrate_with_one_handover(test, &ns, &before, spec).await;
}

/// Migrates the whole group while the writer runs, and checks what every migration must show
/// (see the module doc).
async fn migrate_with_one_handover(test: &str, ns: &TestNamespace, before: &State, spec: Value) {
    let writer = Writer::start(ns);
    tokio::time::sleep(Duration::from_secs(2)).await;
    operator::create_request(ns, REQUEST, spec)
        .await
        .expect("create the request");
    let done = operator::wait_final(ns, REQUEST, Duration::from_secs(900))
        .await
        .expect("request final");
    let status = serde_json::to_value(done.status).expect("status as JSON");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes = writer.finish().await;
    println!(
        "NOTE {test}: writes attempted {} acknowledged {} taken with no replica (WAIT 0) {} \
         failed {}; longest gap between acknowledged writes {} ms (ended {:?} in); downtime \
         {:?}; order {:?}; masters {:?}; final check {}; first errors {:?}",
        writes.attempted,
        writes.acked.len(),
        writes.unreplicated.len(),
        writes.failed,
        writes.longest_gap.as_millis(),
        writes.longest_gap_ended,
        downtimes(&status),
        order(&status),
        writes.masters,
        status["finalHash"],
        writes.errors,
    );
    assert_eq!(status["phase"], "Successful", "{status:#}");
    no_acknowledged_write_lost(ns, &writes).await;
    let old_master = before.master.clone().expect("a master before");
    assert_eq!(
        order(&status).last(),
        Some(&old_master),
        "replicas first, the master last"
    );
    let after = redis::wait_healthy(ns, Duration::from_secs(120)).await;
    assert!(
        after.master.is_some() && after.master != before.master,
        "the Sentinels name a new master: {after:?}"
    );
    let new_master = after.master.clone().unwrap_or_default();
    let handover = operator::handover_on_record(&status, &old_master, &new_master);
    println!("NOTE {test}: failover on record: {handover} s");
    assert_eq!(
        after.epoch.zip(before.epoch).map(|(a, b)| a - b),
        Some(1),
        "exactly one master change: {before:?} -> {after:?}"
    );
    let changed = writes
        .masters
        .get(1)
        .map(|(t, _)| *t)
        .expect("the writer saw the new master");
    assert_eq!(writes.masters.len(), 2, "{:?}", writes.masters);
    let deleted: jiff::Timestamp = (status["members"].as_array())
        .and_then(|m| m.last())
        .and_then(|m| m["podDeletedAt"].as_str())
        .and_then(|t| t.parse().ok())
        .expect("the old master's podDeletedAt");
    // podDeletedAt is in whole seconds; the writer sees the new master only after its first
    // write on the old one is refused, so `changed` is late, never early. A failover after the
    // pod went would come at least Sentinel's down-after-milliseconds (5 s) after it.
    let precision = jiff::SignedDuration::from_secs(1);
    assert!(
        changed < deleted + precision,
        "the master changed at {changed}, before its pod was deleted at {deleted} (a handover, \
         not a failover)"
    );
    assert!(
        (status["finalHash"].as_str()).is_some_and(|h| h.starts_with("offset ")),
        "{status:#}"
    );
}

async fn status(ns: &TestNamespace) -> Value {
    let api: Api<StorageMigrationRequest> = ns.api();
    match api.get_opt(REQUEST).await {
        Ok(Some(r)) => serde_json::to_value(r.status).unwrap_or(Value::Null),
        _ => Value::Null,
    }
}

fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    (status["conditions"].as_array()?)
        .iter()
        .find(|c| c["type"] == type_)
}

/// Cuts replica `cut` off from the master at `master_ip` and waits (bounded) until its link to
/// the master is down; the pid of its Redis server, to reconnect it with.
async fn cut_replica_off(ns: &TestNamespace, master_ip: &str, cut: &str) -> i32 {
    let ips = redis::member_ips(ns).await;
    let cut_ip = &ips
        .iter()
        .find(|(p, _)| p == cut)
        .expect("the replica's IP")
        .1;
    let pid = *procs::redis_server(&ns.name, cut_ip)
        .first()
        .unwrap_or_else(|| panic!("no redis-server of {cut} at {cut_ip} found"));
    // The replica notices a silent master after repl-timeout (60 s by default): 5 s here; the
    // writer's stream (a write every 20 ms) keeps a connected replica from taking the master
    // for silent. (The master pinging its replicas every second instead, repl-ping-replica-period
    // 1, left the old master a full resync at the handover: ~5 s in which the new master had no
    // replica acknowledging.)
    let timeout = ::redis::cmd("CONFIG")
        .arg("SET")
        .arg("repl-timeout")
        .arg(5)
        .clone();
    redis::ask::<()>(cut_ip, 6379, &timeout)
        .await
        .expect("CONFIG SET on the replica");
    procs::cut_off(pid, master_ip).expect("cut the replica off");
    let deadline = Instant::now() + Duration::from_secs(90);
    while redis::state(ns).await.in_sync.contains(cut) {
        if Instant::now() >= deadline {
            let _ = procs::reconnect(pid, master_ip);
            panic!("{cut}'s link to the master still up after 90 s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    pid
}

/// Waits (bounded) until the request's `HealthGate` is False naming `cut`; the status then.
async fn held_naming(ns: &TestNamespace, cut: &str, on_timeout: impl FnOnce()) -> Value {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let s = status(ns).await;
        if let Some(c) = condition(&s, "HealthGate").filter(|c| c["status"] == "False")
            && c["message"]
                .as_str()
                .unwrap_or("")
                .contains(&format!("{cut}: "))
        {
            return s;
        }
        if Instant::now() >= deadline || !s["completionTime"].is_null() {
            on_timeout();
            panic!("the gate did not name {cut}: {s:#}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_out_of_sync_before_its_turn_holds_the_gate_naming_it() {
    let _one = ONE_AT_A_TIME.lock().await;
    let test = "redis-gate";
    let (cluster, ns, _operator, before) = setup(test).await;
    let master = before.master.clone().expect("a master");
    let master_ip = before.master_ip.clone().expect("the master's IP");
    // Replicas go in ordinal order: the first would go first; the second is cut off before.
    let replicas: Vec<String> = before.in_sync.iter().cloned().collect();
    let (first, cut) = (replicas[0].clone(), replicas[1].clone());
    let (writer, started) = (Writer::start(&ns), jiff::Timestamp::now());
    let pid = cut_replica_off(&ns, &master_ip, &cut).await;
    let link_down = jiff::Timestamp::now();
    // `apply: Always`: the request starts although a replica is out of sync, and must wait.
    let spec = json!({
        "type": "StorageClassChange",
        "target": {"kind": "StatefulSet", "name": redis::SET},
        "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
        "timeout": "20m",
        "apply": "Always",
        "database": {
            "engine": "RedisSentinel",
            "redisSentinel": {"masterName": "mymaster", "sentinelService": "redis-sentinel"},
        },
    });
    operator::create_request(&ns, REQUEST, spec)
        .await
        .expect("create the request");
    let held = held_naming(&ns, &cut, || {
        let _ = procs::reconnect(pid, &master_ip);
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let pods: Api<Pod> = ns.api();
    let first_alive =
        (pods.get(&first).await).is_ok_and(|p| p.metadata.deletion_timestamp.is_none());
    let later = status(&ns).await;
    procs::reconnect(pid, &master_ip).expect("reconnect the replica");
    assert!(
        first_alive,
        "{first} is not stopped while {cut} is out of sync: {later:#}"
    );
    let done = operator::wait_final(&ns, REQUEST, Duration::from_secs(900))
        .await
        .expect("request final");
    let done = serde_json::to_value(done.status).expect("status as JSON");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes = writer.finish().await;
    println!(
        "NOTE {test}: held with {:?}; 10 s later {:?}; writes acknowledged {} taken with no \
         replica (WAIT 0) {} failed {}; longest gap between acknowledged writes {} ms (ended \
         {:?} in, writer started {started}, its link down at {link_down}); downtime {:?}; order {:?}; \
         masters {:?}; first errors {:?}",
        condition(&held, "HealthGate").map(|c| &c["message"]),
        condition(&later, "HealthGate").map(|c| &c["message"]),
        writes.acked.len(),
        writes.unreplicated.len(),
        writes.failed,
        writes.longest_gap.as_millis(),
        writes.longest_gap_ended,
        downtimes(&done),
        order(&done),
        writes.masters,
        writes.errors,
    );
    assert_eq!(done["phase"], "Successful", "{done:#}");
    assert_eq!(order(&done).last(), Some(&master), "the master moves last");
    no_acknowledged_write_lost(&ns, &writes).await;
}
