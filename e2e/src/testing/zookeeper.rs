//! A ZooKeeper ensemble for the tests (`fixtures/zookeeper.yaml`: 3 members of Debian's
//! ZooKeeper 3.8), what its members answer to the four-letter words (read with the operator's
//! own client and parser), a client creating a znode every 20 ms through any member that
//! records each create the ensemble acknowledged, and a client reading every 100 ms that records
//! each read the ensemble refused.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams};
use storage_migrator::cluster::database::zookeeper::four_letter_word;
use storage_migrator::engine::zookeeper::{EnsembleConfig, Mode, parse_mntr, parse_srvr};
use tokio::time::MissedTickBehavior;
use zookeeper_client as zk;

use super::{TestError, TestNamespace, fixture_path, set_template_class};

/// The fixture's StatefulSet.
pub const SET: &str = "zk";
/// The test image `e2e/scripts/build-test-image.sh zookeeper` builds.
pub const IMAGE: &str = "storage-migrator.test/zookeeper:3.8-bookworm";
/// The parent of the writer's znodes.
pub const PARENT: &str = "/smr-writes";
/// Bound on one ZooKeeper request (connection included).
const CALL: Duration = Duration::from_secs(3);

/// The fixture of an ensemble with dynamic reconfiguration on (and the super user's Secret).
pub const RECONFIG_FIXTURE: &str = "zookeeper-reconfig.yaml";
/// Its Secret of the super user's name and password.
pub const ADMIN_SECRET: &str = "zk-admin";

/// Applies the fixture (claim class `class`) and waits until the three members are Ready and
/// one leader counts two synced followers.
pub async fn apply(ns: &TestNamespace, class: &str) -> Result<State, TestError> {
    apply_fixture(ns, class, "zookeeper.yaml").await
}

/// [`apply`] with the fixture `file` (e.g. [`RECONFIG_FIXTURE`]).
pub async fn apply_fixture(
    ns: &TestNamespace,
    class: &str,
    file: &str,
) -> Result<State, TestError> {
    let path = fixture_path(file);
    let yaml = std::fs::read_to_string(&path).map_err(|source| TestError::Fixture {
        path: path.clone(),
        source,
    })?;
    ns.apply_yaml_with(&yaml, |obj: &mut DynamicObject| {
        set_template_class(obj, "standard", class)
    })
    .await?;
    ns.wait_statefulset_ready(SET, 3, Duration::from_secs(300))
        .await?;
    Ok(wait_healthy(ns, Duration::from_secs(120)).await)
}

/// `pod → IP` of the members' running pods, by pod name.
pub async fn member_ips(ns: &TestNamespace) -> Vec<(String, String)> {
    ips_of(&ns.api()).await
}

async fn ips_of(pods: &Api<Pod>) -> Vec<(String, String)> {
    let lp = ListParams::default().labels("app=zk");
    let list = pods.list(&lp).await.map(|l| l.items).unwrap_or_default();
    let mut ips: Vec<(String, String)> = list
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((p.name_any(), p.status.as_ref()?.pod_ip.clone()?)))
        .collect();
    ips.sort();
    ips
}

/// What the members say at one moment.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// The member answering `Mode: leader`.
    pub leader: Option<String>,
    /// The members answering `Mode: follower` in `broadcast`.
    pub synced_followers: BTreeSet<String>,
    /// The leader's `zk_synced_followers`.
    pub leader_counts_synced: Option<u64>,
    /// The leader's zxid (its epoch is `zxid >> 32`).
    pub leader_zxid: Option<u64>,
}

impl State {
    /// One leader that counts every other member synced, and every other member a synced
    /// follower.
    pub fn healthy(&self, members: usize) -> bool {
        let others = members.saturating_sub(1);
        self.leader.is_some()
            && self.synced_followers.len() == others
            && self.leader_counts_synced == Some(others as u64)
    }
}

/// Asks `srvr` and `mntr` of every member.
pub async fn state(ns: &TestNamespace) -> State {
    let mut s = State::default();
    for (pod, ip) in member_ips(ns).await {
        let endpoint = format!("{ip}:2181");
        let Ok(srvr) = four_letter_word(&endpoint, "srvr").await else {
            continue;
        };
        let Ok(srvr) = parse_srvr(&srvr) else {
            continue;
        };
        let mntr = four_letter_word(&endpoint, "mntr").await.ok();
        let mntr = mntr.and_then(|t| parse_mntr(&t).ok());
        match srvr.mode {
            Mode::Leader => {
                s.leader = Some(pod);
                s.leader_zxid = Some(srvr.zxid);
                s.leader_counts_synced = mntr.and_then(|m| m.synced_followers());
            }
            Mode::Follower
                if mntr
                    .is_some_and(|m| m.peer_state().is_some_and(|p| p.ends_with("broadcast"))) =>
            {
                s.synced_followers.insert(pod);
            }
            _ => {}
        }
    }
    s
}

/// Waits (bounded) until the ensemble is healthy ([`State::healthy`] with 3 members).
pub async fn wait_healthy(ns: &TestNamespace, timeout: Duration) -> State {
    let deadline = Instant::now() + timeout;
    loop {
        let s = state(ns).await;
        if s.healthy(3) {
            return s;
        }
        assert!(Instant::now() < deadline, "ZooKeeper not healthy: {s:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A session to the members at `endpoints` (`ip:port,ip:port`).
pub async fn connect(endpoints: &str) -> Result<zk::Client, String> {
    let connecting = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .with_connection_timeout(CALL)
        .with_fail_eagerly()
        .connect(endpoints);
    match tokio::time::timeout(CALL * 2, connecting).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(format!("connect to {endpoints}: {e}")),
        Err(_) => Err(format!("connect to {endpoints}: timed out")),
    }
}

/// The ensemble's configuration (`/zookeeper/config`) as its members serve it now.
pub async fn config(ns: &TestNamespace) -> Result<EnsembleConfig, String> {
    let client = connect(&endpoints(&member_ips(ns).await)).await?;
    let (data, _) = match tokio::time::timeout(CALL, client.get_config()).await {
        Ok(Ok(config)) => config,
        Ok(Err(e)) => return Err(format!("read /zookeeper/config: {e}")),
        Err(_) => return Err("read /zookeeper/config: timed out".to_string()),
    };
    EnsembleConfig::parse(&String::from_utf8_lossy(&data))
}

fn endpoints(ips: &[(String, String)]) -> String {
    (ips.iter())
        .map(|(_, ip)| format!("{ip}:2181"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The names of the writer's znodes as the member at `ip` serves them, after a `sync` (so a
/// follower has applied everything the leader committed before).
pub async fn znodes_on(ip: &str) -> Result<BTreeSet<String>, String> {
    let client = connect(&format!("{ip}:2181")).await?;
    let read = async {
        client.sync(PARENT).await?;
        client.list_children(PARENT).await
    };
    match tokio::time::timeout(CALL * 10, read).await {
        Ok(Ok(children)) => Ok(children.into_iter().collect()),
        Ok(Err(e)) => Err(format!("{ip}: {e}")),
        Err(_) => Err(format!("{ip}: timed out")),
    }
}

/// What the writer saw.
#[derive(Debug, Default)]
pub struct Writes {
    pub attempted: u64,
    pub failed: u64,
    /// Every znode name whose create the ensemble acknowledged, in order.
    pub acked: Vec<String>,
    /// The longest time between two acknowledged creates.
    pub longest_gap: Duration,
    /// When the longest gap ended (since the writer started).
    pub longest_gap_ended: Duration,
    /// The first errors, with when they happened.
    pub errors: Vec<String>,
}

/// Creates a znode under [`PARENT`] every 20 ms through a session to all members; after a
/// failed create it connects anew to the members' current IPs (pods come back with new ones).
pub struct Writer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Writes>,
}

impl Writer {
    /// Creates the parent znode, then starts writing.
    pub async fn start(ns: &TestNamespace) -> Writer {
        let client = connect(&endpoints(&member_ips(ns).await))
            .await
            .expect("a session to the ensemble");
        let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        match client.create(PARENT, b"", &options).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => panic!("create {PARENT}: {e}"),
        }
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
    let mut client: Option<zk::Client> = None;
    let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let mut id: u64 = 0;
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if client.is_none() {
            client = connect(&endpoints(&ips_of(&pods).await)).await.ok();
        }
        let Some(c) = client.as_ref() else {
            continue;
        };
        id += 1;
        w.attempted += 1;
        let name = format!("w-{id:08}");
        let path = format!("{PARENT}/{name}");
        match tokio::time::timeout(CALL, c.create(&path, b"x", &options)).await {
            Ok(Ok(_)) => {
                let now = Instant::now();
                if now - last_ack > w.longest_gap {
                    w.longest_gap = now - last_ack;
                    w.longest_gap_ended = now - started;
                }
                last_ack = now;
                w.acked.push(name);
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

/// How often the [`Reader`] reads.
pub const READ_EVERY: Duration = Duration::from_millis(100);

/// How long the [`Reader`] waits for a read's answer before counting it refused and moving to
/// another member. A member serves a read from its own copy in milliseconds, but a member that is
/// stopping may keep the connection open without answering (measured: a read on the stopping
/// leader hung for the whole 3 s of [`CALL`]); a longer wait would measure the client, not the
/// ensemble. A read this slow from a serving member is one refused read, a streak well under
/// a second.
pub const READ_TIMEOUT: Duration = Duration::from_millis(500);

/// A run of consecutive refused reads.
#[derive(Debug, Clone)]
pub struct Streak {
    /// When the run's first refused read was sent (wall clock, to set against `status` times).
    pub start: jiff::Timestamp,
    /// From then until the next read the ensemble served was answered (or the reader stopped).
    pub length: Duration,
    /// The refused reads in the run.
    pub reads: u64,
}

impl Streak {
    /// When the run ended.
    pub fn end(&self) -> jiff::Timestamp {
        let length = jiff::SignedDuration::try_from(self.length).unwrap_or_default();
        self.start + length
    }
}

/// What the reader saw.
#[derive(Debug, Default)]
pub struct Reads {
    /// Reads the ensemble served.
    pub ok: u64,
    /// Reads it refused: errors, timeouts, and no member taking a session.
    pub refused: u64,
    /// Every refused read: when it was sent, and why.
    pub refusals: Vec<(jiff::Timestamp, String)>,
    /// The runs of refused reads, in order.
    pub streaks: Vec<Streak>,
}

impl Reads {
    /// The longest run of refused reads (zero when none was refused).
    pub fn longest_streak(&self) -> Duration {
        (self.streaks.iter().map(|s| s.length).max()).unwrap_or_default()
    }
}

/// Reads [`PARENT`] (`getData`) every [`READ_EVERY`] through a session to all members, as the
/// [`Writer`] writes: after a refused read it connects anew to the members' current IPs. A
/// member serves reads from its own copy, but only while it follows (or is) a leader: one that
/// lost its leader closes its sessions and refuses new ones until an election ends.
pub struct Reader {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Reads>,
}

impl Reader {
    /// Starts reading; [`PARENT`] must exist (the [`Writer`] creates it).
    pub fn start(ns: &TestNamespace) -> Reader {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(read(ns.api(), stop.clone()));
        Reader { stop, task }
    }

    /// Stops reading and returns what was seen.
    pub async fn finish(self) -> Reads {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("reader task")
    }
}

async fn read(pods: Api<Pod>, stop: Arc<AtomicBool>) -> Reads {
    let mut r = Reads::default();
    let mut client: Option<zk::Client> = None;
    // The open run: when its first refused read was sent, and how many it has.
    let mut open: Option<(jiff::Timestamp, Instant, u64)> = None;
    let mut tick = tokio::time::interval(READ_EVERY);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let (at, sent) = (jiff::Timestamp::now(), Instant::now());
        match read_once(&pods, &mut client).await {
            Ok(()) => {
                r.ok += 1;
                if let Some((start, since, reads)) = open.take() {
                    let length = since.elapsed();
                    r.streaks.push(Streak {
                        start,
                        length,
                        reads,
                    });
                }
            }
            Err(why) => {
                r.refused += 1;
                r.refusals.push((at, why));
                let run = open.get_or_insert((at, sent, 0));
                run.2 += 1;
            }
        }
    }
    if let Some((start, since, reads)) = open {
        let length = since.elapsed();
        r.streaks.push(Streak {
            start,
            length,
            reads,
        });
    }
    r
}

/// One read of [`PARENT`], connecting first when there is no session; a refused read drops the
/// session.
async fn read_once(pods: &Api<Pod>, client: &mut Option<zk::Client>) -> Result<(), String> {
    if client.is_none() {
        *client = Some(connect(&endpoints(&ips_of(pods).await)).await?);
    }
    let c = client.as_ref().expect("a session, connected above");
    match tokio::time::timeout(READ_TIMEOUT, c.get_data(PARENT)).await {
        Ok(Ok(_)) => Ok(()),
        outcome => {
            *client = None;
            Err(match outcome {
                Ok(Err(e)) => e.to_string(),
                _ => "timed out".to_string(),
            })
        }
    }
}
