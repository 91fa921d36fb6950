//! A Redis master group with Sentinels for the tests (`fixtures/redis-sentinel.yaml`: 3 Redis 7
//! members, a Sentinel beside each), what the members and Sentinels say, and a client writing a
//! key every 20 ms on the master Sentinel names that records each write acknowledged: `SET`
//! answered OK and a following `WAIT 1` reporting at least one replica with it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, FromRedisValue};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::{TestError, TestNamespace, fixture_path, set_template_class};

/// The fixture's StatefulSet.
pub const SET: &str = "redis";
/// The master group the Sentinels monitor.
pub const MASTER_NAME: &str = "mymaster";
/// Bound on connecting, and on one command.
const CALL: Duration = Duration::from_secs(2);
/// The writer's `WAIT 1 <ms>`: how long the master waits for a replica to have a write (under
/// [`CALL`], so a `WAIT` that times out still answers, with 0).
const WAIT_MS: u64 = 1000;

/// Applies the fixture (claim class `class`) and waits until the three members are Ready, and
/// one master, two replicas in sync and three agreeing Sentinels answer.
pub async fn apply(ns: &TestNamespace, class: &str) -> Result<State, TestError> {
    let path = fixture_path("redis-sentinel.yaml");
    let yaml = std::fs::read_to_string(&path).map_err(|source| TestError::Fixture {
        path: path.clone(),
        source,
    })?;
    ns.apply_yaml_with(&yaml, |obj| set_template_class(obj, "standard", class))
        .await?;
    ns.wait_statefulset_ready(SET, 3, Duration::from_secs(300))
        .await?;
    Ok(wait_healthy(ns, Duration::from_secs(120)).await)
}

/// `pod → IP` of the members' running pods.
pub async fn member_ips(ns: &TestNamespace) -> Vec<(String, String)> {
    ips_of(&ns.api()).await
}

async fn ips_of(pods: &Api<Pod>) -> Vec<(String, String)> {
    let lp = ListParams::default().labels("app=redis");
    let list = pods.list(&lp).await.map(|l| l.items).unwrap_or_default();
    let mut ips: Vec<(String, String)> = list
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((p.name_any(), p.status.as_ref()?.pod_ip.clone()?)))
        .collect();
    ips.sort();
    ips
}

/// A connection to `ip:port`, bounded.
pub async fn connect(ip: &str, port: u16) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(format!("redis://{ip}:{port}/")).map_err(|e| e.to_string())?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CALL))
        .set_response_timeout(Some(CALL));
    tokio::time::timeout(
        CALL * 2,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    .map_err(|_| format!("connect to {ip}:{port}: timed out"))?
    .map_err(|e| format!("connect to {ip}:{port}: {e}"))
}

/// Runs `cmd`, bounded.
pub async fn run<T: FromRedisValue>(
    con: &mut MultiplexedConnection,
    cmd: &redis::Cmd,
) -> Result<T, String> {
    tokio::time::timeout(CALL, cmd.query_async::<T>(con))
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| e.to_string())
}

/// `cmd` on the server at `ip:port`.
pub async fn ask<T: FromRedisValue>(ip: &str, port: u16, cmd: &redis::Cmd) -> Result<T, String> {
    run(&mut connect(ip, port).await?, cmd).await
}

/// The master's IP the Sentinel at `ip` names.
pub async fn sentinel_master(ip: &str) -> Option<String> {
    let cmd = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(MASTER_NAME)
        .clone();
    let answer: Option<Vec<String>> = ask(ip, 26379, &cmd).await.ok()?;
    answer?.into_iter().next()
}

/// What the group says at one moment.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// The master's pod, when every Sentinel that answers names the same member.
    pub master: Option<String>,
    pub master_ip: Option<String>,
    /// The Sentinels' `config-epoch` of the group (one more per failover).
    pub epoch: Option<u64>,
    /// The replicas whose link to that master is up.
    pub in_sync: BTreeSet<String>,
    /// Sentinels that answered.
    pub sentinels: usize,
}

impl State {
    /// One master, every other member replicating from it, every Sentinel answering.
    pub fn healthy(&self, members: usize) -> bool {
        self.master.is_some() && self.in_sync.len() + 1 == members && self.sentinels == members
    }
}

/// Reads every member's Sentinel and `INFO replication`.
pub async fn state(ns: &TestNamespace) -> State {
    state_of(&ns.api()).await
}

async fn state_of(pods: &Api<Pod>) -> State {
    let ips = ips_of(pods).await;
    let mut s = State::default();
    let mut named = BTreeSet::new();
    for (_, ip) in &ips {
        if let Some(m) = sentinel_master(ip).await {
            s.sentinels += 1;
            named.insert(m);
            s.epoch = s.epoch.max(epoch(ip).await);
        }
    }
    let named: Vec<String> = named.into_iter().collect();
    let [master_ip] = &named[..] else {
        return s;
    };
    let master_ip = master_ip.clone();
    s.master = ips
        .iter()
        .find(|(_, ip)| ip == &master_ip)
        .map(|(p, _)| p.clone());
    s.master_ip = Some(master_ip.clone());
    for (pod, ip) in ips.iter().filter(|(_, ip)| ip != &master_ip) {
        let info: String = ask(ip, 6379, redis::cmd("INFO").arg("replication"))
            .await
            .unwrap_or_default();
        let host = format!("master_host:{master_ip}\r");
        if info.contains(&host) && info.contains("master_link_status:up") {
            s.in_sync.insert(pod.clone());
        }
    }
    s
}

/// The group's `config-epoch` as the Sentinel at `ip` knows it.
async fn epoch(ip: &str) -> Option<u64> {
    let cmd = redis::cmd("SENTINEL")
        .arg("MASTER")
        .arg(MASTER_NAME)
        .clone();
    let flat: Vec<String> = ask(ip, 26379, &cmd).await.ok()?;
    let at = flat.iter().position(|k| k == "config-epoch")?;
    flat.get(at + 1)?.parse().ok()
}

/// Waits (bounded) until the group is healthy.
pub async fn wait_healthy(ns: &TestNamespace, timeout: Duration) -> State {
    let deadline = Instant::now() + timeout;
    loop {
        let s = state(ns).await;
        if s.healthy(3) {
            return s;
        }
        assert!(Instant::now() < deadline, "Redis not healthy: {s:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What the writer saw.
#[derive(Debug, Default)]
pub struct Writes {
    pub attempted: u64,
    pub failed: u64,
    /// Every n whose `SET w:n n` the master took and a replica had (`WAIT 1` answered >= 1),
    /// in order: the writes that must never be lost.
    pub acked: Vec<u64>,
    /// Every n whose `SET` the master took but `WAIT 1` answered 0 replicas for (within
    /// [`WAIT_MS`]): not acknowledged, not asserted as kept.
    pub unreplicated: Vec<u64>,
    /// The longest time between two acknowledged writes, and when it ended (since the start).
    pub longest_gap: Duration,
    pub longest_gap_ended: Duration,
    /// Each change of the master the Sentinels name: (when, master IP).
    pub masters: Vec<(jiff::Timestamp, String)>,
    /// The first errors, with when they happened.
    pub errors: Vec<String>,
}

/// Writes `SET w:n n` then `WAIT 1 WAIT_MS` every 20 ms on the master a Sentinel names, asking
/// again after a failure.
pub struct Writer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Writes>,
}

impl Writer {
    pub fn start(ns: &TestNamespace) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(write(ns.api(), stop.clone()));
        Writer { stop, task }
    }

    /// Stops writing and returns what was seen.
    pub async fn finish(self) -> Writes {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("writer task")
    }
}

/// The master a member's Sentinel names now, with a connection to it.
async fn current_master(pods: &Api<Pod>) -> Option<(String, MultiplexedConnection)> {
    for (_, ip) in ips_of(pods).await {
        if let Some(m) = sentinel_master(&ip).await {
            let con = connect(&m, 6379).await.ok()?;
            return Some((m, con));
        }
    }
    None
}

async fn write(pods: Api<Pod>, stop: Arc<AtomicBool>) -> Writes {
    let started = Instant::now();
    let mut w = Writes::default();
    let mut last_ack = started;
    let mut master: Option<(String, MultiplexedConnection)> = None;
    let mut n: u64 = 0;
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if master.is_none() {
            master = current_master(&pods).await;
            if let Some((ip, _)) = &master
                && w.masters.last().is_none_or(|(_, m)| m != ip)
            {
                w.masters.push((jiff::Timestamp::now(), ip.clone()));
            }
        }
        let Some((_, con)) = master.as_mut() else {
            continue;
        };
        n += 1;
        w.attempted += 1;
        match set_and_wait(con, n).await {
            Ok(0) => w.unreplicated.push(n),
            Ok(_) => {
                let now = Instant::now();
                if now - last_ack > w.longest_gap {
                    w.longest_gap = now - last_ack;
                    w.longest_gap_ended = now - started;
                }
                last_ack = now;
                w.acked.push(n);
            }
            Err(e) => {
                w.failed += 1;
                if w.errors.len() < 10 {
                    w.errors.push(format!("{:?}: {e}", started.elapsed()));
                }
                master = None;
            }
        }
    }
    w
}

/// `SET w:n n`, then `WAIT 1 WAIT_MS`: how many replicas have the write.
async fn set_and_wait(con: &mut MultiplexedConnection, n: u64) -> Result<u64, String> {
    let set = redis::cmd("SET").arg(format!("w:{n}")).arg(n).clone();
    run::<()>(con, &set).await?;
    let wait = redis::cmd("WAIT").arg(1).arg(WAIT_MS).clone();
    run::<u64>(con, &wait)
        .await
        .map_err(|e| format!("WAIT: {e}"))
}

/// The n of every `w:n` key on the member at `ip`.
pub async fn written_on(ip: &str) -> Result<BTreeSet<u64>, String> {
    let keys: Vec<String> = ask(ip, 6379, redis::cmd("KEYS").arg("w:*")).await?;
    Ok(keys
        .iter()
        .filter_map(|k| k.strip_prefix("w:")?.parse().ok())
        .collect())
}
