//! A Patroni cluster for the tests (`fixtures/patroni.yaml`: 3 PostgreSQL 15 members run by
//! Patroni, an etcd for its DCS), what its REST API says, and a client inserting a row every
//! 20 ms into the current leader that records each commit the server acknowledged.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;

use super::{TestError, TestNamespace, fixture_path, set_template_class};

/// The fixture's StatefulSet.
pub const SET: &str = "patroni";
/// The test image `e2e/scripts/build-test-image.sh patroni` builds.
pub const IMAGE: &str = "storage-migrator.test/patroni:pg15-bookworm";
/// The superuser the fixture sets.
const USER: &str = "postgres";
const PASSWORD: &str = "patroni-superuser";
/// Bound on one REST call or one SQL statement.
const CALL: Duration = Duration::from_secs(3);

/// Applies the fixture (claim class `class`, `edit` applied to each object) and waits until
/// the DCS and the three members are Ready and one leader and two streaming replicas answer.
pub async fn apply(
    ns: &TestNamespace,
    class: &str,
    edit: impl Fn(&mut DynamicObject),
) -> Result<State, TestError> {
    let path = fixture_path("patroni.yaml");
    let yaml = std::fs::read_to_string(&path).map_err(|source| TestError::Fixture {
        path: path.clone(),
        source,
    })?;
    ns.apply_yaml_with(&yaml, |obj| {
        set_template_class(obj, "standard", class);
        edit(obj);
    })
    .await?;
    ns.wait_statefulset_ready("patroni-etcd", 1, Duration::from_secs(120))
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
    let lp = ListParams::default().labels("application=patroni,component=postgresql");
    let list = pods.list(&lp).await.map(|l| l.items).unwrap_or_default();
    let mut ips: Vec<(String, String)> = list
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((p.name_any(), p.status.as_ref()?.pod_ip.clone()?)))
        .collect();
    ips.sort();
    ips
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(CALL)
        .build()
        .unwrap_or_default()
}

/// `GET http://<ip>:8008<path>` as JSON.
pub async fn get(ip: &str, path: &str) -> Option<Value> {
    let r = http()
        .get(format!("http://{ip}:8008{path}"))
        .send()
        .await
        .ok()?;
    r.json().await.ok()
}

/// `PATCH /config` with `body` on any member that answers.
pub async fn patch_config(ns: &TestNamespace, body: &Value) -> bool {
    for (_, ip) in member_ips(ns).await {
        let sent = http()
            .patch(format!("http://{ip}:8008/config"))
            .json(body)
            .send()
            .await;
        if sent.is_ok_and(|r| r.status().is_success()) {
            return true;
        }
    }
    false
}

/// What the members say at one moment.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// The leader's pod, from `/cluster`.
    pub leader: Option<String>,
    /// The pods the leader's `pg_stat_replication` shows `streaming`.
    pub streaming: BTreeSet<String>,
    /// The synchronous standbys (`sync_state: sync`).
    pub synchronous: BTreeSet<String>,
    /// The leader's timeline.
    pub timeline: u64,
    /// `/history`: one entry per timeline switch.
    pub history: Vec<Value>,
    /// The leader's IP.
    pub leader_ip: Option<String>,
}

impl State {
    /// One leader, and every other member streaming.
    pub fn healthy(&self, members: usize) -> bool {
        self.leader.is_some() && self.streaming.len() + 1 == members
    }
}

/// Reads `/cluster`, the leader's `/patroni` and `/history` from the members.
pub async fn state(ns: &TestNamespace) -> State {
    state_of(&ns.api()).await
}

async fn state_of(pods: &Api<Pod>) -> State {
    let ips = ips_of(pods).await;
    let mut s = State::default();
    for (_, ip) in &ips {
        let Some(cluster) = get(ip, "/cluster").await else {
            continue;
        };
        let members = cluster["members"].as_array().cloned().unwrap_or_default();
        let leader = members.iter().find(|m| m["role"] == "leader");
        s.leader = leader.and_then(|m| m["name"].as_str().map(str::to_string));
        s.leader_ip = leader.and_then(|m| m["host"].as_str().map(str::to_string));
        s.history = get(ip, "/history")
            .await
            .and_then(|h| h.as_array().cloned())
            .unwrap_or_default();
        break;
    }
    let Some(lip) = s.leader_ip.clone() else {
        return s;
    };
    if let Some(p) = get(&lip, "/patroni").await {
        s.timeline = p["timeline"].as_u64().unwrap_or(0);
        for r in p["replication"].as_array().into_iter().flatten() {
            let name = r["application_name"].as_str().unwrap_or("").to_string();
            if r["state"] == "streaming" {
                s.streaming.insert(name.clone());
            }
            if r["sync_state"] == "sync" {
                s.synchronous.insert(name);
            }
        }
    }
    s
}

/// Waits (bounded) until the cluster is healthy: a leader and every other member streaming.
pub async fn wait_healthy(ns: &TestNamespace, timeout: Duration) -> State {
    let deadline = Instant::now() + timeout;
    loop {
        let s = state(ns).await;
        if s.healthy(3) {
            return s;
        }
        assert!(Instant::now() < deadline, "Patroni not healthy: {s:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Runs `sql` on the member at `ip` as the superuser; the rows' first column as text.
pub async fn query(ip: &str, sql: &str) -> Result<Vec<String>, String> {
    let client = connect(ip).await?;
    let rows = tokio::time::timeout(CALL * 10, client.simple_query(sql))
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(rows
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .collect())
}

async fn connect(ip: &str) -> Result<tokio_postgres::Client, String> {
    let config = format!(
        "host={ip} port=5432 user={USER} password={PASSWORD} dbname=postgres connect_timeout=2"
    );
    let (client, connection) = tokio::time::timeout(
        CALL,
        tokio_postgres::connect(&config, tokio_postgres::NoTls),
    )
    .await
    .map_err(|_| format!("connect to {ip}: timed out"))?
    .map_err(|e| format!("connect to {ip}: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// What the writer saw.
#[derive(Debug, Default)]
pub struct Writes {
    pub attempted: u64,
    pub failed: u64,
    /// Every id whose INSERT the server acknowledged (committed), in order.
    pub acked: Vec<i64>,
    /// The longest time between two acknowledged inserts.
    pub longest_gap: Duration,
    /// When the longest gap ended (since the writer started).
    pub longest_gap_ended: Duration,
    /// The first errors, with when they happened.
    pub errors: Vec<String>,
}

/// Inserts a row every 20 ms into table `writes` on the leader `/cluster` names, re-finding the
/// leader after a failed insert.
pub struct Writer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Writes>,
}

impl Writer {
    /// Creates the table on the leader, then starts writing.
    pub async fn start(ns: &TestNamespace) -> Writer {
        let leader = state(ns).await.leader_ip.expect("a leader to write to");
        query(
            &leader,
            "CREATE TABLE IF NOT EXISTS writes (id bigint PRIMARY KEY)",
        )
        .await
        .expect("create the table");
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

async fn write(pods: Api<Pod>, stop: Arc<AtomicBool>) -> Writes {
    let started = Instant::now();
    let mut w = Writes::default();
    let mut last_ack = started;
    let mut client: Option<tokio_postgres::Client> = None;
    let mut id: i64 = 0;
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if client.as_ref().is_none_or(|c| c.is_closed()) {
            client = match state_of(&pods).await.leader_ip {
                Some(ip) => connect(&ip).await.ok(),
                None => None,
            };
        }
        let Some(c) = client.as_ref() else {
            continue;
        };
        id += 1;
        w.attempted += 1;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&id];
        let insert = c.execute("INSERT INTO writes (id) VALUES ($1)", &params);
        match tokio::time::timeout(CALL, insert).await {
            Ok(Ok(_)) => {
                let now = Instant::now();
                if now - last_ack > w.longest_gap {
                    w.longest_gap = now - last_ack;
                    w.longest_gap_ended = now - started;
                }
                last_ack = now;
                w.acked.push(id);
            }
            outcome => {
                w.failed += 1;
                if w.errors.len() < 10 {
                    let why = match outcome {
                        Ok(Err(e)) => e.to_string(),
                        _ => "timed out".to_string(),
                    };
                    w.errors.push(format!("{:?}: {why}", started.elapsed()));
                }
                client = None;
            }
        }
    }
    w
}

/// The ids in table `writes` on the member at `ip`.
pub async fn ids_on(ip: &str) -> Result<BTreeSet<i64>, String> {
    let rows = query(ip, "SELECT id FROM writes").await?;
    Ok(rows.iter().filter_map(|r| r.parse().ok()).collect())
}
