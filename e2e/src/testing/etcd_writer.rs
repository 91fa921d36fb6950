//! A client writing to etcd through a migration, as a client behind the Service would: what
//! was acknowledged, what failed, and the longest gap between two acknowledged writes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::TestNamespace;

/// True when the pod's `Ready` condition is `True`.
pub fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A client for one endpoint that gives up quickly (1 s to connect, 2 s per request).
pub async fn connect(endpoint: &str) -> Option<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(2));
    tokio::time::timeout(
        Duration::from_secs(3),
        Client::connect([endpoint], Some(options)),
    )
    .await
    .ok()?
    .ok()
}

/// How many failed or retried writes [`Writes`] describes.
const KEPT: usize = 10;

/// Attempts per write, through different members: a write that fails all of them was refused
/// for at least two deadlines (or a leader handover and a deadline), far beyond one handover.
const ATTEMPTS: usize = 3;

/// An attempt refused faster than this was refused by a member that answered (not a timeout).
const FAST_REFUSAL: Duration = Duration::from_millis(250);

/// The pause before retrying a write refused at once: long enough for a leader handover to end
/// on a loaded machine (etcd's handover is a heartbeat round or two).
const REFUSED_PAUSE: Duration = Duration::from_millis(300);

/// Counts of a writer that puts `w/<n>` keys through the members while the migration runs.
#[derive(Debug, Default)]
pub struct Writes {
    pub attempted: u64,
    /// Writes acknowledged only on a later attempt.
    pub retried: u64,
    /// Writes that failed on every attempt.
    pub failed: u64,
    /// The `n` of every acknowledged key `w/<n>`, in order.
    pub acked: Vec<u64>,
    /// The longest time between two acknowledged writes (from the start for the first).
    pub longest_gap: Duration,
    /// When the longest gap ended (since the writer started).
    pub longest_gap_ended: Duration,
    /// The first failed writes: when (since the writer started), and each attempt's member,
    /// error and duration, so that a failure says whether a member, an election or the cluster
    /// refused it.
    pub failures: Vec<String>,
    /// The first writes acknowledged only on their retry, described the same way: where a gap
    /// between acknowledged writes comes from.
    pub retries: Vec<String>,
}

/// One write every ~20 ms through the members in turn (one client per Ready member pod, like a
/// client behind the Service; re-read from the API every 250 ms as pods stop and come back with
/// new IPs); a failed write is retried through the next member, up to [`ATTEMPTS`] attempts in
/// all, on a list re-read first if the failed attempt took longer than that; a member that failed
/// a write gets none until the next re-read, as a gRPC balancer routes around a failed
/// connection (without these, a write could wait out a whole connect timeout on a member the
/// previous write, or the list, already showed gone).
///
/// A refusal that comes back at once (the leader's "raft proposal dropped" while it hands
/// leadership over) is retried after [`REFUSED_PAUSE`]: a retry at once goes to a follower,
/// which forwards the write to the same leader, still handing over; the leader drops it without
/// telling the follower, and the follower's request waits out its whole deadline (etcd's raft
/// drops proposals while a transfer is in progress). A CI run saw exactly that: dropped in
/// 3 ms, then no answer in 2 s.
pub struct Writer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Writes>,
}

/// `pod → (endpoint, client)` of the Ready members.
type Clients = BTreeMap<String, (String, Client)>;

/// The writer's view of the members: a client per Ready member, re-read from the API every
/// 250 ms, and the members that failed a write since.
struct Members {
    pods: Api<Pod>,
    clients: Clients,
    failed: BTreeSet<String>,
    refreshed: Option<Instant>,
}

impl Members {
    /// Re-reads the members when the last reading is 250 ms old (also before a retry that
    /// follows a slow attempt): pods being deleted or not Ready are left out, a client is kept
    /// while its pod's endpoint is unchanged, and the failed members get writes again.
    async fn fresh(&mut self) {
        if self
            .refreshed
            .is_some_and(|t| t.elapsed() <= Duration::from_millis(250))
        {
            return;
        }
        self.refreshed = Some(Instant::now());
        let Ok(list) = self
            .pods
            .list(&ListParams::default().labels("app=etcd"))
            .await
        else {
            return;
        };
        let mut fresh = BTreeMap::new();
        for p in list.items {
            if p.metadata.deletion_timestamp.is_some() || !ready(&p) {
                continue;
            }
            let Some(ip) = p.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
                continue;
            };
            let ep = format!("http://{ip}:2379");
            let name = p.name_any();
            match self.clients.remove(&name) {
                Some((old, c)) if old == ep => {
                    fresh.insert(name, (ep, c));
                }
                _ => {
                    if let Some(c) = connect(&ep).await {
                        fresh.insert(name, (ep, c));
                    }
                }
            }
        }
        self.clients = fresh;
        self.failed.clear();
    }

    /// The member at `turn` among those that have not failed (all of them when every one has).
    fn pick(&self, turn: usize) -> Option<String> {
        let mut names: Vec<&String> = self
            .clients
            .keys()
            .filter(|n| !self.failed.contains(*n))
            .collect();
        if names.is_empty() {
            names = self.clients.keys().collect();
        }
        (!names.is_empty()).then(|| names[turn % names.len()].clone())
    }

    /// Puts `w/<key>` through the member at `turn`, then through the next ones, up to
    /// [`ATTEMPTS`] in all (after [`REFUSED_PAUSE`] when an attempt was refused at once); a
    /// member that fails gets no write until the next reading. Returns the attempt that
    /// succeeded, and each failed attempt's member, error and duration.
    async fn write(&mut self, key: u64, turn: usize) -> (Option<usize>, Vec<String>) {
        let mut errors = Vec::new();
        for attempt in 0..ATTEMPTS {
            self.fresh().await;
            let Some(name) = self.pick(turn + attempt) else {
                errors.push("no Ready member".to_string());
                break;
            };
            let Some((_, c)) = self.clients.get_mut(&name) else {
                continue;
            };
            let t0 = Instant::now();
            let put = c.put(format!("w/{key:08}"), key.to_string(), None);
            let error = match tokio::time::timeout(Duration::from_secs(2), put).await {
                Ok(Ok(_)) => return (Some(attempt), errors),
                Ok(Err(e)) => e.to_string(),
                Err(_) => "no answer in 2 s".to_string(),
            };
            let took = t0.elapsed();
            errors.push(format!("{name}: {error} ({} ms)", took.as_millis()));
            self.failed.insert(name);
            if took < FAST_REFUSAL && attempt + 1 < ATTEMPTS {
                tokio::time::sleep(REFUSED_PAUSE).await;
            }
        }
        (None, errors)
    }
}

impl Writes {
    /// Counts one write that started `at` (since the writer started).
    fn count(&mut self, key: u64, outcome: Option<usize>, errors: &[String], at: Duration) {
        let what = || {
            format!(
                "write {key} at {:.1}s: {}",
                at.as_secs_f64(),
                errors.join("; ")
            )
        };
        match outcome {
            Some(attempt) => {
                self.acked.push(key);
                if attempt > 0 {
                    self.retried += 1;
                    if self.retries.len() < KEPT {
                        self.retries.push(what());
                    }
                }
            }
            None => {
                self.failed += 1;
                if self.failures.len() < KEPT {
                    self.failures.push(what());
                }
            }
        }
    }
}

impl Writer {
    /// Starts writing to the members (pods labelled `app=etcd`) of `ns`.
    pub fn start(ns: &TestNamespace) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let mut members = Members {
            pods: Api::namespaced(ns.client(), &ns.name),
            clients: Clients::new(),
            failed: BTreeSet::new(),
            refreshed: None,
        };
        let task = tokio::spawn(async move {
            let mut w = Writes::default();
            let (started, mut last_ack) = (Instant::now(), Instant::now());
            while !flag.load(Ordering::Relaxed) {
                w.attempted += 1;
                let (key, at) = (w.attempted, started.elapsed());
                let (outcome, errors) = members.write(key, key as usize).await;
                w.count(key, outcome, &errors, at);
                if outcome.is_some() {
                    if last_ack.elapsed() > w.longest_gap {
                        w.longest_gap = last_ack.elapsed();
                        w.longest_gap_ended = started.elapsed();
                    }
                    last_ack = Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            w
        });
        Writer { stop, task }
    }

    /// Stops writing; what was written (an error if the writer's task panicked).
    pub async fn finish(self) -> Result<Writes, tokio::task::JoinError> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await
    }
}
