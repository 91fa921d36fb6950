//! The Patroni engine, pure: PostgreSQL run by Patroni. What the members' REST APIs answered
//! (`GET /cluster`, `GET /patroni` on each member, `GET /config`), parsed into the plain data
//! here, becomes a [`HealthReport`]; [`PatroniRules`] decide on it. The client that asks lives in
//! `crate::cluster::database::patroni`.
//!
//! - **Facts.** A member is the pod whose name is the Patroni member's name (Patroni's own
//!   Kubernetes examples set `PATRONI_NAME` from the pod's name), else whose IP is its host.
//!   Its position is its WAL position in bytes: the leader's `xlog.location`, a replica's
//!   `xlog.replayed_location`; its term is its timeline. A replica is healthy when Patroni runs
//!   it, the leader's `pg_stat_replication` (the `replication` list of the leader's
//!   `/patroni`) shows it `streaming`, and it is on the leader's timeline.
//! - **Order** ([`PatroniRules::next_member`]): asynchronous replicas, then synchronous
//!   standbys, then the leader, each group in ordinal order.
//! - **Stop gate**: every member healthy and within `maxLagBytes` of the leader; with
//!   `synchronous_mode_strict`, enough other replicas stay to accept writes; the leader asks for
//!   a switchover first.
//! - **Handover**: a switchover to a healthy replica within `maxLagBytes` (a synchronous standby
//!   when there is one: Patroni refuses others in synchronous mode), preferring migrated ones.
//! - **Rejoin**: the member is healthy (streams on the leader's timeline) and within
//!   `maxLagBytes`.
//! - **Final check**: every member on the leader's timeline has replayed the leader's WAL
//!   position read at the check ([`agreed_replay`]).
//! - **Preflight** denies when the API cannot be read, Patroni is paused, there is no leader,
//!   the cluster is a standby cluster, or a member does not stream.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;

use super::{
    FinalCheckKind, FinalHash, Gate, HealthReport, HealthUnavailable, MemberHealth, Rules,
    caught_up_gate, caught_up_target, members_healthy_with_leader, ordinal_key, replicated_gate,
};
use crate::api::DatabaseSpec;

/// Default of `spec.database.maxLagBytes` for Patroni: Patroni's own `maximum_lag_on_failover`.
pub const DEFAULT_MAX_LAG_BYTES: u64 = 1_048_576;
/// Default REST API port.
pub const DEFAULT_API_PORT: u16 = 8008;
/// Default of `spec.database.patroni.switchoverTimeoutSeconds`.
pub const DEFAULT_SWITCHOVER_TIMEOUT_SECONDS: u32 = 60;

const UNIT: &str = "bytes of WAL";

/// One member as `GET /cluster` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub struct ClusterMember {
    pub name: String,
    /// `leader`, `replica`, `sync_standby`, `standby_leader` (older Patroni: `master`).
    #[serde(default)]
    pub role: String,
    /// `running`, `streaming`, `starting`, `stopped`, ...
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default)]
    pub timeline: Option<u64>,
}

/// `GET /cluster`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub struct ClusterView {
    #[serde(default)]
    pub members: Vec<ClusterMember>,
    /// Maintenance mode.
    #[serde(default)]
    pub pause: bool,
}

/// The `xlog` object of `GET /patroni`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub struct Xlog {
    /// The leader's current WAL position.
    #[serde(default)]
    pub location: Option<u64>,
    /// A replica's last replayed WAL position.
    #[serde(default)]
    pub replayed_location: Option<u64>,
    #[serde(default)]
    pub received_location: Option<u64>,
}

/// One row of the leader's `pg_stat_replication`, as `GET /patroni` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub struct Replication {
    /// The replica's Patroni name.
    #[serde(default)]
    pub application_name: String,
    /// `streaming`, `catchup`, `startup`, `backup`.
    #[serde(default)]
    pub state: String,
    /// `async`, `sync`, `quorum`, `potential`.
    #[serde(default)]
    pub sync_state: String,
}

/// `GET /patroni` of one member.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub struct MemberStatus {
    /// `running`, `starting`, `stopped`, `restarting`, `crashed`, ...
    #[serde(default)]
    pub state: String,
    /// `master`/`primary`, `replica`, `standby_leader`.
    #[serde(default)]
    pub role: String,
    #[serde(default)]
    pub timeline: Option<u64>,
    #[serde(default)]
    pub xlog: Xlog,
    /// The leader's replicas (absent on a replica).
    #[serde(default)]
    pub replication: Vec<Replication>,
    #[serde(default)]
    pub pause: bool,
}

/// The parts of `GET /config` (Patroni's dynamic configuration) the gates need.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub struct DynamicConfig {
    #[serde(default)]
    pub synchronous_mode: bool,
    #[serde(default)]
    pub synchronous_mode_strict: bool,
    #[serde(default)]
    pub synchronous_node_count: Option<usize>,
    #[serde(default)]
    pub pause: bool,
}

pub use super::PodInfo;

/// Ordinal order of pods by name.
pub fn sort_key(pod: &Pod) -> (u32, String) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    (super::pod_ordinal(&name).unwrap_or(u32::MAX), name)
}

/// The REST API's port on `pod`: a container port named `patroni` or `restapi`, else the port
/// of `PATRONI_RESTAPI_LISTEN` (`host:port`) in a container's environment, else 8008.
pub fn api_port(pod: &Pod) -> u16 {
    let containers = pod.spec.iter().flat_map(|s| &s.containers);
    let named = containers
        .clone()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| matches!(p.name.as_deref(), Some("patroni" | "restapi")))
        .and_then(|p| u16::try_from(p.container_port).ok());
    let listen = || {
        containers
            .flat_map(|c| c.env.iter().flatten())
            .find(|e| e.name == "PATRONI_RESTAPI_LISTEN")
            .and_then(|e| e.value.as_deref())
            .and_then(|v| v.rsplit_once(':'))
            .and_then(|(_, port)| port.parse().ok())
    };
    named.or_else(listen).unwrap_or(DEFAULT_API_PORT)
}

/// The name a member's TLS certificate is made for: the pod's DNS name under its StatefulSet's
/// headless Service (`hostname.subdomain.namespace.svc.cluster.local`), when it has one.
pub fn tls_host(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let namespace = pod.metadata.namespace.as_deref()?;
    Some(format!(
        "{}.{}.{namespace}.svc.cluster.local",
        spec.hostname.as_deref()?,
        spec.subdomain.as_deref()?
    ))
}

/// What one pod's API answered: its `/patroni`, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub pod: String,
    /// `http(s)://<podIP>:<port>`, when the pod has an IP.
    pub endpoint: Option<String>,
    pub status: Result<MemberStatus, String>,
}

/// Everything read in one look: `/cluster` and `/config` from one member that answered, and
/// every pod's `/patroni`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub cluster: Result<ClusterView, String>,
    pub config: Option<DynamicConfig>,
    pub views: Vec<MemberView>,
}

fn is_leader_role(role: &str) -> bool {
    matches!(role, "leader" | "master" | "primary" | "standby_leader")
}

fn is_sync_role(role: &str) -> bool {
    matches!(role, "sync_standby" | "synchronous_standby")
}

/// The `/cluster` member of `pod`: by name, else by host = pod IP.
fn listed<'a>(cluster: &'a ClusterView, pod: &PodInfo) -> Option<&'a ClusterMember> {
    (cluster.members.iter().find(|m| m.name == pod.name)).or_else(|| {
        let ip = pod.ip.as_deref()?;
        cluster
            .members
            .iter()
            .find(|m| m.host.as_deref() == Some(ip))
    })
}

/// Cluster-wide problems: the API unread, maintenance mode, a standby cluster, no leader,
/// listed members that match no pod.
fn cluster_problems(o: &Observed, pods: &[PodInfo]) -> Vec<String> {
    let cluster = match &o.cluster {
        Ok(c) => c,
        Err(e) => {
            return vec![format!(
                "Patroni's /cluster cannot be read from any member: {e}"
            )];
        }
    };
    let mut problems = Vec::new();
    if cluster.pause || o.config.as_ref().is_some_and(|c| c.pause) {
        problems.push(
            "Patroni is paused (maintenance mode): it would not fail over nor switch over; \
             resume it (patronictl resume)"
                .to_string(),
        );
    }
    if let Some(standby) = cluster.members.iter().find(|m| m.role == "standby_leader") {
        problems.push(format!(
            "this is a Patroni standby cluster (its leader {} is a standby_leader that \
             replicates from another cluster): migrate it as a Generic set, or migrate the \
             primary cluster",
            standby.name
        ));
    }
    if !cluster.members.iter().any(|m| is_leader_role(&m.role)) {
        problems.push("Patroni reports no leader".to_string());
    }
    for m in &cluster.members {
        let matched = pods
            .iter()
            .any(|p| listed(cluster, p).is_some_and(|l| l.name == m.name));
        if !matched {
            problems.push(format!("Patroni member {} matches no member pod", m.name));
        }
    }
    problems
}

/// Turns one look at the members into a health report (`pods` and `o.views` in the same order).
pub fn assess(pods: &[PodInfo], o: &Observed) -> HealthReport {
    let problems = cluster_problems(o, pods);
    let empty = ClusterView::default();
    let cluster = o.cluster.as_ref().unwrap_or(&empty);
    let leader = cluster.members.iter().find(|m| is_leader_role(&m.role));
    let leader_pod = leader.and_then(|l| pods.iter().find(|p| listed(cluster, p) == Some(l)));
    let leader_status = leader_pod
        .and_then(|p| o.views.iter().find(|v| v.pod == p.name))
        .and_then(|v| v.status.as_ref().ok());
    let streaming: BTreeMap<&str, &Replication> = leader_status
        .map(|s| {
            s.replication
                .iter()
                .map(|r| (r.application_name.as_str(), r))
                .collect()
        })
        .unwrap_or_default();
    let cx = MemberContext {
        cluster,
        live: leader_status.is_some(),
        leader,
        leader_timeline: leader_status
            .and_then(|s| s.timeline)
            .or(leader.and_then(|l| l.timeline)),
        streaming,
    };
    let mut members: Vec<MemberHealth> = pods
        .iter()
        .zip(&o.views)
        .map(|(pod, view)| member_health(pod, view, &cx))
        .collect();
    members.sort_by(|a, b| ordinal_key(&a.pod).cmp(&ordinal_key(&b.pod)));
    let strict = o
        .config
        .as_ref()
        .filter(|c| c.synchronous_mode && c.synchronous_mode_strict);
    HealthReport {
        leader: leader_pod.map(|p| p.name.clone()),
        voting_members: None,
        replicas_for_writes: strict.map_or(0, |c| c.synchronous_node_count.unwrap_or(1).max(1)),
        members,
        problems,
    }
}

struct MemberContext<'a> {
    cluster: &'a ClusterView,
    /// The leader's own `/patroni` was read: its `pg_stat_replication` says who is synchronous
    /// now (`/cluster` is rewritten only once per Patroni loop).
    live: bool,
    leader: Option<&'a ClusterMember>,
    leader_timeline: Option<u64>,
    streaming: BTreeMap<&'a str, &'a Replication>,
}

/// One pod's health (see the module doc).
fn member_health(pod: &PodInfo, view: &MemberView, cx: &MemberContext<'_>) -> MemberHealth {
    let listed = listed(cx.cluster, pod);
    let is_leader = listed.is_some() && listed == cx.leader;
    let status = view.status.as_ref().ok();
    let mut why = Vec::new();
    if let Err(e) = &view.status {
        why.push(match &view.endpoint {
            Some(ep) => format!("Patroni's API does not answer at {ep}: {e}"),
            None => e.clone(),
        });
    }
    if pod.terminating {
        why.push("pod is being deleted".to_string());
    }
    let Some(listed) = listed else {
        why.push("is not a member of the Patroni cluster (/cluster does not list it)".to_string());
        return unhealthy(pod, view, why);
    };
    if let Some(s) = status.filter(|s| s.state != "running") {
        why.push(format!("PostgreSQL is {} (not running)", s.state));
    }
    if !is_leader {
        why.extend(replica_problems(listed, status, cx));
    }
    let position = status.and_then(|s| match is_leader {
        true => s.xlog.location,
        false => s.xlog.replayed_location,
    });
    MemberHealth {
        pod: pod.name.clone(),
        healthy: why.is_empty(),
        leader: is_leader,
        position,
        term: status.and_then(|s| s.timeline).or(listed.timeline),
        member_id: Some(listed.name.clone()),
        synchronous: match cx.live {
            true => {
                (cx.streaming.get(listed.name.as_str())).is_some_and(|r| r.sync_state == "sync")
            }
            false => is_sync_role(&listed.role),
        },
        problem: (!why.is_empty()).then(|| why.join("; ")),
        endpoint: view.endpoint.clone(),
    }
}

/// Why a replica is not streaming from the leader on its timeline.
fn replica_problems(
    listed: &ClusterMember,
    status: Option<&MemberStatus>,
    cx: &MemberContext<'_>,
) -> Vec<String> {
    let mut why = Vec::new();
    match cx.streaming.get(listed.name.as_str()) {
        Some(r) if r.state == "streaming" => {}
        Some(r) => why.push(format!(
            "does not stream from the leader (replication state {})",
            r.state
        )),
        None if cx.leader.is_some() => {
            why.push("does not stream from the leader (not in its pg_stat_replication)".to_string())
        }
        None => {}
    }
    let timeline = status.and_then(|s| s.timeline).or(listed.timeline);
    if let (Some(mine), Some(leader)) = (timeline, cx.leader_timeline)
        && mine != leader
    {
        why.push(format!("is on timeline {mine}, the leader on {leader}"));
    }
    if status.is_some_and(|s| s.xlog.replayed_location.is_none()) {
        why.push("reports no replayed WAL position".to_string());
    }
    why
}

fn unhealthy(pod: &PodInfo, view: &MemberView, why: Vec<String>) -> MemberHealth {
    MemberHealth {
        pod: pod.name.clone(),
        problem: Some(why.join("; ")),
        endpoint: view.endpoint.clone(),
        ..MemberHealth::default()
    }
}

/// The final check: the leader `(pod, timeline, position)` read at the check, and what each
/// replica has replayed since. Ok when every replica is on the leader's timeline and has
/// replayed at least that position; otherwise why not yet (retried until the request's
/// timeout).
pub fn agreed_replay(
    leader: (&str, u64, u64),
    replicas: &[(String, Option<u64>, Option<u64>)],
) -> Result<FinalHash, String> {
    let (leader_pod, timeline, position) = leader;
    let mut behind = Vec::new();
    for (pod, tl, replayed) in replicas {
        match (tl, replayed) {
            (Some(tl), _) if *tl != timeline => behind.push(format!(
                "{pod} is on timeline {tl}, the leader on {timeline}"
            )),
            (_, Some(r)) if *r >= position => {}
            (_, Some(r)) => behind.push(format!(
                "{pod} has replayed {} of {}",
                lsn(*r),
                lsn(position)
            )),
            (_, None) => behind.push(format!("{pod} reports no replayed WAL position")),
        }
    }
    if !behind.is_empty() {
        return Err(format!(
            "not every member has replayed the leader {leader_pod}'s WAL position yet: {}",
            behind.join("; ")
        ));
    }
    let mut members = vec![leader_pod.to_string()];
    members.extend(replicas.iter().map(|(p, _, _)| p.clone()));
    Ok(FinalHash {
        hash: format!("timeline {timeline}, WAL {}", lsn(position)),
        members,
    })
}

/// A WAL position as PostgreSQL writes it (`0/3000060`).
pub fn lsn(position: u64) -> String {
    format!("{:X}/{:X}", position >> 32, position & 0xffff_ffff)
}

/// The rules of the `Patroni` engine (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatroniRules {
    /// `spec.database.maxLagBytes`.
    pub max_lag: u64,
}

impl Default for PatroniRules {
    fn default() -> Self {
        Self {
            max_lag: DEFAULT_MAX_LAG_BYTES,
        }
    }
}

/// The rules of a request with `engine: Patroni`.
pub fn rules(spec: &DatabaseSpec) -> Box<dyn Rules> {
    Box::new(PatroniRules {
        max_lag: spec.max_lag_bytes.unwrap_or(DEFAULT_MAX_LAG_BYTES),
    })
}

impl PatroniRules {
    /// With `synchronous_mode_strict`, stopping `pod` must leave as many healthy replicas as
    /// writes need.
    fn writes_gate(report: &HealthReport, pod: &str) -> Option<Gate> {
        let needed = report.replicas_for_writes;
        if needed == 0 {
            return None;
        }
        let left = (report.members.iter())
            .filter(|m| m.healthy && !m.leader && m.pod != pod)
            .count();
        (left < needed).then(|| {
            Gate::Wait(format!(
                "stopping {pod} would leave {left} replica(s) to confirm writes; \
                 synchronous_mode_strict needs {needed}: the leader would stop accepting writes"
            ))
        })
    }
}

impl Rules for PatroniRules {
    fn next_member(&self, report: &HealthReport, remaining: &[String]) -> Option<String> {
        let class = |pod: &str| match report.members.iter().find(|m| m.pod == pod) {
            Some(m) if m.leader => 2,
            Some(m) if m.synchronous => 1,
            _ => 0,
        };
        (remaining.iter())
            .min_by(|a, b| (class(a), ordinal_key(a)).cmp(&(class(b), ordinal_key(b))))
            .cloned()
    }

    fn gate_before_stop(&self, report: &HealthReport, pod: &str) -> Gate {
        let leader = match replicated_gate(report, pod, self.max_lag, UNIT) {
            Ok(leader) => leader,
            Err(wait) => return wait,
        };
        if leader == pod {
            return Gate::TransferLeadershipFirst;
        }
        Self::writes_gate(report, pod).unwrap_or(Gate::Open)
    }

    fn gate_after_return(&self, report: &HealthReport, pod: &str) -> Gate {
        caught_up_gate(report, pod, self.max_lag, UNIT)
    }

    fn handover_target(
        &self,
        report: &HealthReport,
        stopping: &str,
        migrated: &[String],
    ) -> Option<String> {
        // In synchronous mode Patroni switches over only to a synchronous standby.
        let sync = report
            .members
            .iter()
            .any(|m| m.synchronous && m.healthy && m.pod != stopping);
        let mut eligible = report.clone();
        eligible
            .members
            .retain(|m| !sync || m.synchronous || m.leader);
        caught_up_target(&eligible, stopping, migrated, self.max_lag)
    }

    fn handover(&self) -> Option<&'static str> {
        Some(
            "a Patroni switchover (POST /switchover) to a replica within maxLagBytes, already \
             migrated (the synchronous standby in synchronous mode); it stops once it streams \
             from the new leader",
        )
    }

    fn healthy_for_start(&self, report: &HealthReport) -> Result<(), String> {
        members_healthy_with_leader(report)
    }

    fn preflight(&self, health: &Result<HealthReport, HealthUnavailable>) -> Result<(), String> {
        match health {
            Err(e) => Err(format!("Patroni's REST API cannot be read: {e}")),
            Ok(report) => members_healthy_with_leader(report)
                .map_err(|wrong| format!("the Patroni cluster is not ready to migrate: {wrong}")),
        }
    }

    fn final_check(&self) -> FinalCheckKind {
        FinalCheckKind::Agreement {
            what: "replayed WAL position",
        }
    }
}

#[cfg(test)]
#[path = "patroni_tests.rs"]
mod tests;
