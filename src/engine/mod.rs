//! Database engines, pure half: the [`HealthReport`] the planner decides on, and each engine's
//! [`Rules`]: the order of the members, the gate before a member stops and after it returns,
//! whom the leader hands over to, and what the final check is. No I/O: the clients that ask
//! the database live in the cluster layer (`crate::cluster::database`) and hand their answers
//! here as a [`HealthReport`].
//!
//! Every engine is one module here (its rules, and the assessment of its raw answers) and one
//! in the cluster layer (how those answers are read, how a handover is performed). [`rules`]
//! is the one place the planner learns which engines exist ("Adding an engine" in
//! `docs/architecture.md`).
//!
//! - [`generic`]: pod readiness, and an optional pod label that marks the leader.
//! - [`etcd`]: Raft-aware assessment of what every member answered (leader, raft index, alarms,
//!   member-to-pod mapping); leadership moved with MoveLeader.
//! - [`patroni`]: PostgreSQL run by Patroni (roles, timelines, WAL positions; a switchover
//!   before the leader stops).
//! - [`redis`]: Redis replicas managed by Sentinel (roles, replication offsets, Sentinel's
//!   master and quorum; a steered Sentinel failover with writes paused before the master stops).
//! - [`zookeeper`]: a ZooKeeper ensemble through its four-letter words (modes, zxids, the
//!   leader's synced followers; the leader stops last, no handover).

use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

pub use crate::api::Role;
use crate::api::{DatabaseEngine, DatabaseSpec};

pub mod etcd;
pub mod generic;
pub mod patroni;
#[cfg(test)]
mod purity;
pub mod redis;
pub mod zookeeper;

/// Default bound on how far (in Raft log entries) a member's applied index may trail the
/// leader's before an etcd gate waits.
pub const DEFAULT_MAX_LAG: u64 = 1000;

/// The rules of the engine `spec` names: the only list of engines the planner reads.
pub fn rules(spec: &DatabaseSpec) -> Box<dyn Rules> {
    match spec.engine {
        DatabaseEngine::Generic => generic::rules(spec),
        DatabaseEngine::Etcd => etcd::rules(spec),
        DatabaseEngine::Patroni => patroni::rules(spec),
        DatabaseEngine::RedisSentinel => redis::rules(spec),
        DatabaseEngine::ZooKeeper => zookeeper::rules(spec),
    }
}

/// The pure half of an engine: decisions from a [`HealthReport`], never I/O. The planner asks
/// these, and only these, about the database.
pub trait Rules: fmt::Debug + Send + Sync {
    /// The member to migrate next among `remaining` (default: [`followers_first`]).
    fn next_member(&self, report: &HealthReport, remaining: &[String]) -> Option<String> {
        followers_first(report, remaining)
    }

    /// May `pod` stop now? [`Gate::TransferLeadershipFirst`] asks for a handover
    /// ([`Rules::handover_target`]) and a new look.
    fn gate_before_stop(&self, report: &HealthReport, pod: &str) -> Gate;

    /// Is `pod` back after its migration, so that the next member may go? Never
    /// [`Gate::TransferLeadershipFirst`].
    fn gate_after_return(&self, report: &HealthReport, pod: &str) -> Gate;

    /// Whom the leader `stopping` hands over to, preferring members in `migrated`; `None` when
    /// nobody can (the member then waits), and always for an engine without handover.
    fn handover_target(
        &self,
        _report: &HealthReport,
        _stopping: &str,
        _migrated: &[String],
    ) -> Option<String> {
        None
    }

    /// Once the operator has asked `from` to hand over: is the handover complete, so that `from`
    /// may stop? False asks for the handover again (the engine's handover is idempotent).
    /// Default: true (the gate's own look, another member leading, is enough).
    fn handed_over(&self, _report: &HealthReport, _from: &str) -> bool {
        true
    }

    /// How the leader hands over, in words for `kubectl smr plan` ("a MoveLeader"); `None`
    /// when it does not (default).
    fn handover(&self) -> Option<&'static str> {
        None
    }

    /// For `apply: IfReady`: Ok when the database may be migrated now; Err names what is wrong.
    fn healthy_for_start(&self, report: &HealthReport) -> Result<(), String> {
        members_healthy(report)
    }

    /// What preflight denies whatever `apply` says: a database this engine cannot migrate
    /// safely (default: nothing).
    fn preflight(&self, _health: &Result<HealthReport, HealthUnavailable>) -> Result<(), String> {
        Ok(())
    }

    /// The check that must pass before any old volume may be reclaimed.
    fn final_check(&self) -> FinalCheckKind;
}

/// The final check of an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalCheckKind {
    /// The engine's client computes a [`FinalHash`] every member agrees on (etcd's `hash_kv`,
    /// Patroni's replayed WAL position); `what` names it in status messages.
    Agreement { what: &'static str },
    /// Each migrated member's copy verification is on record (the engine sees no data).
    CopiesVerified,
}

/// What one member looks like to the database engine at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MemberHealth {
    /// Pod name of the member.
    pub pod: String,
    /// The member answered and reports itself healthy (a replica: it streams from the leader).
    pub healthy: bool,
    /// The member is the leader (engine-specific; always false for a leaderless generic set).
    pub leader: bool,
    /// Where the member is in the replicated log, in the engine's unit (etcd: applied raft
    /// index; Patroni: replayed WAL position in bytes), to judge lag.
    pub position: Option<u64>,
    /// The log's generation as this member sees it (etcd: raft term; Patroni: timeline).
    pub term: Option<u64>,
    /// Engine-specific member id (etcd member id in hex; Patroni member name). A member without
    /// one does not vote and cannot take over.
    pub member_id: Option<String>,
    /// A synchronous standby (Patroni `sync_standby`): migrated after the asynchronous ones.
    #[serde(default)]
    pub synchronous: bool,
    /// Why the member is not healthy, in words a human can act on.
    pub problem: Option<String>,
    /// Where the engine reached the member (etcd: `http(s)://<podIP>:<clientPort>`), so a later
    /// call (a handover) talks to the same endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

impl MemberHealth {
    /// Leader or follower, as the engine sees this member now.
    pub fn role(&self) -> Role {
        if self.leader {
            Role::Leader
        } else {
            Role::Follower
        }
    }
}

/// The database as seen by the engine: one entry per member pod that exists and has an IP,
/// plus cluster-wide problems (alarms, members that match no pod, learners...).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HealthReport {
    pub members: Vec<MemberHealth>,
    /// Pod name of the leader all answering members agree on, if any.
    pub leader: Option<String>,
    /// Cluster-wide problems; non-empty means not healthy.
    pub problems: Vec<String>,
    /// Number of voting members the database itself knows (etcd member list), when known.
    pub voting_members: Option<usize>,
    /// Replicas the leader needs to accept writes (Patroni's `synchronous_mode_strict`: its
    /// `synchronous_node_count`; 0 when writes never wait for a replica).
    #[serde(default)]
    pub replicas_for_writes: usize,
}

/// A gate's verdict: go on, hand leadership over first, or wait with a reason (shown in an
/// Event and a condition; the planner only displays it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    Open,
    /// The member about to stop leads a database that hands leadership over: the caller asks
    /// [`Rules::handover_target`], performs the handover, and looks again.
    TransferLeadershipFirst,
    /// Not now; the message says why.
    Wait(String),
}

impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Gate::Open => f.write_str("open"),
            Gate::TransferLeadershipFirst => f.write_str("leader: transfer first"),
            Gate::Wait(reason) => f.write_str(reason),
        }
    }
}

/// Why the planner has no [`HealthReport`]. The texts are what status and Events show.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HealthUnavailable {
    /// Health is gathered only while preflighting and migrating.
    #[error("not observed in this stage")]
    NotObservedInStage,
    /// The request's engine could not be set up (e.g. a Secret it names cannot be read).
    #[error("{0}")]
    NoEngine(String),
    /// The engine failed while observing.
    #[error("{0}")]
    Engine(String),
}

/// The final digest of the data, and the member pods whose answers it covers (each one's
/// digest was the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalHash {
    /// etcd: `"<hash>@<revision>"`; Patroni: `"timeline <T>, WAL <LSN>"`.
    pub hash: String,
    /// The member pods that answered with that digest.
    pub members: Vec<String>,
}

impl FinalHash {
    /// The members of `planned` it does not cover (no pod, or no answer), in their order.
    pub fn missing<'a>(&self, planned: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
        planned
            .into_iter()
            .filter(|p| !self.members.iter().any(|m| m == p))
            .collect()
    }
}

/// Why the final digest of the data is not known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FinalHashError {
    /// Members disagree where they must agree (etcd: `hash_kv` at a common revision).
    #[error("members are inconsistent: {0}")]
    Inconsistent(String),
    /// The engine could not compute it (a member unreachable, no revision...).
    #[error("{0}")]
    Engine(String),
}

/// The request's `spec.database` cannot be used (e.g. a malformed leader label).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid database settings: {0}")]
pub struct InvalidSettings(pub String);

/// A member pod as an engine that reaches members at their IP sees it (Patroni, Redis).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodInfo {
    pub name: String,
    pub ip: Option<String>,
    pub terminating: bool,
}

impl PodInfo {
    /// Name, IP and whether it is being deleted.
    pub fn of(pod: &Pod) -> Self {
        Self {
            name: pod.metadata.name.clone().unwrap_or_default(),
            ip: pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
            terminating: pod.metadata.deletion_timestamp.is_some(),
        }
    }

    /// Is `host` this pod: its IP, or a DNS name whose first label is the pod's name (the
    /// StatefulSet hostname `NAME-N.SVC.NS.svc.cluster.local`)?
    pub fn is(&self, host: &str) -> bool {
        self.ip.as_deref() == Some(host)
            || (host.parse::<std::net::IpAddr>().is_err()
                && host.split('.').next() == Some(self.name.as_str()))
    }
}

/// Ordinal of a StatefulSet pod name (`etcd-2` → 2).
pub fn pod_ordinal(pod: &str) -> Option<u32> {
    pod.rsplit_once('-').and_then(|(_, n)| n.parse().ok())
}

/// Sort key giving the stable ordinal order (pods without an ordinal last, by name).
fn ordinal_key(pod: &str) -> (u32, &str) {
    (pod_ordinal(pod).unwrap_or(u32::MAX), pod)
}

fn member<'a>(report: &'a HealthReport, pod: &str) -> Option<&'a MemberHealth> {
    report.members.iter().find(|m| m.pod == pod)
}

fn leader_position(report: &HealthReport) -> Option<u64> {
    report
        .leader
        .as_deref()
        .and_then(|l| member(report, l))
        .and_then(|m| m.position)
}

/// How far `m` trails the leader, when both positions are known.
fn lag_of(report: &HealthReport, m: &MemberHealth) -> Option<u64> {
    Some(leader_position(report)?.saturating_sub(m.position?))
}

fn unhealthy_members(report: &HealthReport) -> Vec<String> {
    report
        .members
        .iter()
        .filter(|m| !m.healthy)
        .map(|m| match &m.problem {
            Some(p) => format!("{}: {p}", m.pod),
            None => format!("{}: not healthy", m.pod),
        })
        .collect()
}

/// Pods the caller expects (the plan's members) that are not in the report become problems, so
/// the gates cannot open while a member's pod is missing (the generic engine sees only the pods
/// it is given).
pub fn note_missing_pods(report: &mut HealthReport, expected: &[String]) {
    for pod in expected {
        if member(report, pod).is_none() {
            report.problems.push(format!(
                "member pod {pod} does not exist or was not observed"
            ));
        }
    }
}

/// The part of every engine's gate before a stop: no cluster problem, `pod` observed, every
/// member healthy. `None` when all hold.
pub fn members_gate(report: &HealthReport, pod: &str) -> Option<Gate> {
    if !report.problems.is_empty() {
        return Some(Gate::Wait(report.problems.join("; ")));
    }
    if member(report, pod).is_none() {
        return Some(Gate::Wait(format!(
            "{pod} is not observed (no running pod with an IP)"
        )));
    }
    let unhealthy = unhealthy_members(report);
    if !unhealthy.is_empty() {
        return Some(Gate::Wait(format!(
            "not every member is healthy: {}",
            unhealthy.join("; ")
        )));
    }
    None
}

/// The part of every engine's gate after a return: `pod` observed and healthy, no cluster
/// problem. `None` when all hold.
pub fn returned_gate(report: &HealthReport, pod: &str) -> Option<Gate> {
    let Some(m) = member(report, pod) else {
        return Some(Gate::Wait(format!(
            "{pod} is not back yet (no running pod with an IP)"
        )));
    };
    if !m.healthy {
        return Some(Gate::Wait(format!(
            "{pod} is not healthy yet: {}",
            m.problem.as_deref().unwrap_or("no reason given")
        )));
    }
    if !report.problems.is_empty() {
        return Some(Gate::Wait(report.problems.join("; ")));
    }
    None
}

/// The leader every member agrees on, or a Wait saying there is none.
pub fn leader_agreed(report: &HealthReport) -> Result<&str, Gate> {
    report
        .leader
        .as_deref()
        .ok_or_else(|| Gate::Wait("the members agree on no leader".to_string()))
}

/// The first member (ordinal order) trailing the leader by more than `max_lag` `unit`s (e.g.
/// "raft entries"), or whose position is unknown, as a Wait.
pub fn lag_gate(report: &HealthReport, max_lag: u64, unit: &str) -> Option<Gate> {
    let leader = match leader_agreed(report) {
        Ok(l) => l,
        Err(wait) => return Some(wait),
    };
    if leader_position(report).is_none() {
        return Some(Gate::Wait(format!(
            "the position of the leader {leader} is unknown"
        )));
    }
    report
        .members
        .iter()
        .find_map(|m| member_lag_gate(report, &m.pod, max_lag, unit))
}

/// `pod` trails the leader by more than `max_lag` `unit`s, or its position or the leader's
/// is unknown, as a Wait.
pub fn member_lag_gate(report: &HealthReport, pod: &str, max_lag: u64, unit: &str) -> Option<Gate> {
    let leader = report.leader.as_deref().unwrap_or("(none)");
    match member(report, pod).and_then(|m| lag_of(report, m)) {
        None => Some(Gate::Wait(format!(
            "the position of {pod} or of the leader {leader} is unknown"
        ))),
        Some(lag) if lag > max_lag => Some(Gate::Wait(format!(
            "{pod} is {lag} {unit} behind the leader {leader} (at most {max_lag} allowed)"
        ))),
        Some(_) => None,
    }
}

/// The common start of a replicated database's gate before `pod` stops: [`members_gate`], a
/// leader agreed on, every member within `max_lag` `unit`s ([`lag_gate`]); Ok names the leader.
pub fn replicated_gate<'a>(
    report: &'a HealthReport,
    pod: &str,
    max_lag: u64,
    unit: &str,
) -> Result<&'a str, Gate> {
    if let Some(wait) = members_gate(report, pod) {
        return Err(wait);
    }
    let leader = leader_agreed(report)?;
    match lag_gate(report, max_lag, unit) {
        Some(wait) => Err(wait),
        None => Ok(leader),
    }
}

/// A replicated database's gate after `pod` returns: [`returned_gate`], a leader agreed on,
/// `pod` within `max_lag` `unit`s of it.
pub fn caught_up_gate(report: &HealthReport, pod: &str, max_lag: u64, unit: &str) -> Gate {
    if let Some(wait) = returned_gate(report, pod) {
        return wait;
    }
    if let Err(wait) = leader_agreed(report) {
        return wait;
    }
    member_lag_gate(report, pod, max_lag, unit).unwrap_or(Gate::Open)
}

/// A voting quorum (a majority of `voting_members`, else of the report's members) of healthy
/// members with a member id is still up once `pod` stops; else a Wait.
pub fn quorum_gate(report: &HealthReport, pod: &str) -> Option<Gate> {
    let voting = report.voting_members.unwrap_or(report.members.len());
    let needed = voting / 2 + 1;
    let up_after = report
        .members
        .iter()
        .filter(|m| m.healthy && m.member_id.is_some() && m.pod != pod)
        .count();
    (up_after < needed).then(|| {
        Gate::Wait(format!(
            "stopping {pod} would leave {up_after} of {voting} voting members up; quorum needs \
             {needed}"
        ))
    })
}

/// Followers first in ordinal order, the leader last; with no known leader, plain ordinal
/// order.
pub fn followers_first(report: &HealthReport, remaining: &[String]) -> Option<String> {
    let mut ordered: Vec<&String> = remaining.iter().collect();
    ordered.sort_by(|a, b| ordinal_key(a).cmp(&ordinal_key(b)));
    let leader = report.leader.as_deref();
    ordered
        .iter()
        .find(|p| Some(p.as_str()) != leader)
        .or_else(|| ordered.first())
        .map(|p| p.to_string())
}

/// A healthy member with a member id within `max_lag` of the leader, other than `stopping`,
/// preferring one in `migrated`, then the one least behind, then ordinal order.
pub fn caught_up_target(
    report: &HealthReport,
    stopping: &str,
    migrated: &[String],
    max_lag: u64,
) -> Option<String> {
    let mut candidates: Vec<(bool, u64, &MemberHealth)> = report
        .members
        .iter()
        .filter(|m| m.pod != stopping && m.healthy && m.member_id.is_some())
        .filter_map(|m| {
            let lag = lag_of(report, m)?;
            (lag <= max_lag).then_some((!migrated.contains(&m.pod), lag, m))
        })
        .collect();
    candidates
        .sort_by(|a, b| (a.0, a.1, ordinal_key(&a.2.pod)).cmp(&(b.0, b.1, ordinal_key(&b.2.pod))));
    candidates.first().map(|c| c.2.pod.clone())
}

/// Ok when every member is healthy, at least one was observed, and there is no cluster
/// problem; Err names what is wrong.
pub fn members_healthy(report: &HealthReport) -> Result<(), String> {
    let mut wrong: Vec<String> = unhealthy_members(report)
        .into_iter()
        .map(|u| format!("member {u}"))
        .collect();
    wrong.extend(report.problems.iter().cloned());
    if report.members.is_empty() {
        wrong.push("no member pod was observed".to_string());
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// [`members_healthy`], and a leader agreed on (for engines with a leader).
pub fn members_healthy_with_leader(report: &HealthReport) -> Result<(), String> {
    let mut wrong: Vec<String> = members_healthy(report).err().into_iter().collect();
    if report.leader.is_none() && report.problems.is_empty() {
        wrong.push("the members agree on no leader".to_string());
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd::EtcdRules;
    use generic::GenericRules;

    fn etcd(max_lag: u64) -> EtcdRules {
        EtcdRules { max_lag }
    }

    #[test]
    fn a_final_hash_names_the_planned_members_it_does_not_cover() {
        let h = FinalHash {
            hash: "7@42".into(),
            members: vec!["etcd-0".into(), "etcd-2".into()],
        };
        assert_eq!(h.missing(["etcd-0", "etcd-1", "etcd-2"]), ["etcd-1"]);
        assert!(h.missing(["etcd-2", "etcd-0"]).is_empty());
        let none = FinalHash {
            hash: "7@42".into(),
            members: Vec::new(),
        };
        assert_eq!(none.missing(["etcd-0"]), ["etcd-0"]);
    }

    fn m(pod: &str, index: u64) -> MemberHealth {
        MemberHealth {
            pod: pod.to_string(),
            healthy: true,
            leader: false,
            position: Some(index),
            term: Some(2),
            synchronous: false,
            member_id: Some(format!("{:x}", 0xa0 + pod_ordinal(pod).unwrap_or(0) as u64)),
            problem: None,
            endpoint: Some(format!(
                "http://198.18.0.{}:2379",
                pod_ordinal(pod).unwrap_or(0) + 10
            )),
        }
    }

    /// A healthy etcd-like cluster of `n` members, `leader` leading, all at index 100.
    fn raft(n: u32, leader: &str) -> HealthReport {
        let mut members: Vec<MemberHealth> = (0..n).map(|i| m(&format!("etcd-{i}"), 100)).collect();
        for x in &mut members {
            x.leader = x.pod == leader;
        }
        HealthReport {
            members,
            leader: Some(leader.to_string()),
            problems: vec![],
            voting_members: Some(n as usize),
            replicas_for_writes: 0,
        }
    }

    fn sick(r: &mut HealthReport, pod: &str, why: &str) {
        let x = r.members.iter_mut().find(|x| x.pod == pod).unwrap();
        x.healthy = false;
        x.problem = Some(why.to_string());
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ordinals() {
        assert_eq!(pod_ordinal("etcd-12"), Some(12));
        assert_eq!(pod_ordinal("my-db-0"), Some(0));
        assert_eq!(pod_ordinal("etcd"), None);
        assert_eq!(pod_ordinal("etcd-x"), None);
    }

    #[test]
    fn followers_first_leader_last_in_ordinal_order() {
        let r = raft(3, "etcd-0");
        let all = names(&["etcd-2", "etcd-0", "etcd-1"]);
        assert_eq!(
            etcd(DEFAULT_MAX_LAG).next_member(&r, &all).as_deref(),
            Some("etcd-1")
        );
        assert_eq!(
            etcd(DEFAULT_MAX_LAG)
                .next_member(&r, &names(&["etcd-2", "etcd-0"]))
                .as_deref(),
            Some("etcd-2")
        );
        assert_eq!(
            etcd(DEFAULT_MAX_LAG)
                .next_member(&r, &names(&["etcd-0"]))
                .as_deref(),
            Some("etcd-0")
        );
        assert_eq!(etcd(DEFAULT_MAX_LAG).next_member(&r, &[]), None);
        // ordinal, not lexical: etcd-10 after etcd-9
        let r = raft(11, "etcd-1");
        assert_eq!(
            etcd(DEFAULT_MAX_LAG)
                .next_member(&r, &names(&["etcd-10", "etcd-9", "etcd-1"]))
                .as_deref(),
            Some("etcd-9")
        );
    }

    #[test]
    fn unknown_leader_means_ordinal_order() {
        let mut r = raft(3, "etcd-0");
        r.leader = None;
        assert_eq!(
            etcd(DEFAULT_MAX_LAG)
                .next_member(&r, &names(&["etcd-2", "etcd-0", "etcd-1"]))
                .as_deref(),
            Some("etcd-0")
        );
    }

    #[test]
    fn leadership_moved_by_someone_else_changes_the_order() {
        let r = raft(3, "etcd-1");
        assert_eq!(
            etcd(DEFAULT_MAX_LAG)
                .next_member(&r, &names(&["etcd-1", "etcd-2"]))
                .as_deref(),
            Some("etcd-2")
        );
        let r = raft(3, "etcd-2");
        assert_eq!(
            etcd(DEFAULT_MAX_LAG)
                .next_member(&r, &names(&["etcd-1", "etcd-2"]))
                .as_deref(),
            Some("etcd-1")
        );
    }

    #[test]
    fn gate_opens_for_a_healthy_follower() {
        let r = raft(3, "etcd-0");
        assert_eq!(
            etcd(DEFAULT_MAX_LAG).gate_before_stop(&r, "etcd-1"),
            Gate::Open
        );
        assert_eq!(
            etcd(DEFAULT_MAX_LAG).gate_before_stop(&r, "etcd-2"),
            Gate::Open
        );
    }

    #[test]
    fn gate_asks_the_leader_to_transfer_first() {
        let r = raft(3, "etcd-0");
        assert_eq!(
            etcd(DEFAULT_MAX_LAG).gate_before_stop(&r, "etcd-0"),
            Gate::TransferLeadershipFirst
        );
        assert_eq!(
            etcd(DEFAULT_MAX_LAG).gate_before_stop(&r, "etcd-1"),
            Gate::Open
        );
    }

    #[test]
    fn gate_waits_on_lag() {
        let mut r = raft(3, "etcd-0");
        r.members[0].position = Some(5000);
        r.members[2].position = Some(4500);
        r.members[1].position = Some(3000);
        let Gate::Wait(why) = etcd(DEFAULT_MAX_LAG).gate_before_stop(&r, "etcd-2") else {
            panic!("lagging member must close the gate")
        };
        assert!(why.contains("etcd-1 is 2000 raft entries behind"), "{why}");
        // within the bound
        r.members[1].position = Some(4000);
        assert_eq!(
            etcd(DEFAULT_MAX_LAG).gate_before_stop(&r, "etcd-2"),
            Gate::Open
        );
        // a follower ahead of the leader's applied index is fine
        r.members[1].position = Some(5001);
        assert_eq!(
            etcd(DEFAULT_MAX_LAG).gate_before_stop(&r, "etcd-2"),
            Gate::Open
        );
        // unknown index
        r.members[1].position = None;
        assert!(
            matches!(etcd(10).gate_before_stop(&r, "etcd-2"), Gate::Wait(w) if w.contains("unknown"))
        );
    }

    #[test]
    fn gate_waits_on_an_unhealthy_member() {
        let mut r = raft(3, "etcd-0");
        sick(&mut r, "etcd-2", "does not answer");
        let Gate::Wait(why) = etcd(DEFAULT_MAX_LAG).gate_before_stop(&r, "etcd-1") else {
            panic!()
        };
        assert!(why.contains("etcd-2: does not answer"), "{why}");
        // even stopping the sick member itself waits: it must be healthy before it stops
        assert!(matches!(
            etcd(DEFAULT_MAX_LAG).gate_before_stop(&r, "etcd-2"),
            Gate::Wait(_)
        ));
    }

    #[test]
    fn quorum_with_three_and_five_members() {
        // 3 healthy of 3: stopping one leaves 2 >= 2.
        assert_eq!(
            etcd(10).gate_before_stop(&raft(3, "etcd-0"), "etcd-1"),
            Gate::Open
        );
        // 3 voting but the report has only 2 healthy pods (one member's pod gone, counted
        // by the member list): stopping another leaves 1 < 2.
        let mut r = raft(3, "etcd-0");
        r.members.retain(|m| m.pod != "etcd-2");
        let Gate::Wait(why) = etcd(10).gate_before_stop(&r, "etcd-1") else {
            panic!()
        };
        assert!(
            why.contains("1 of 3 voting members up; quorum needs 2"),
            "{why}"
        );
        // 5 voting, 4 pods up: stopping one leaves 3 >= 3.
        let mut r = raft(5, "etcd-0");
        r.members.retain(|m| m.pod != "etcd-4");
        assert_eq!(etcd(10).gate_before_stop(&r, "etcd-1"), Gate::Open);
        // 5 voting, 3 pods up: stopping one leaves 2 < 3.
        r.members.retain(|m| m.pod != "etcd-3");
        let Gate::Wait(why) = etcd(10).gate_before_stop(&r, "etcd-1") else {
            panic!()
        };
        assert!(
            why.contains("2 of 5 voting members up; quorum needs 3"),
            "{why}"
        );
        // a single-member cluster can never keep quorum while its member stops
        let r = raft(1, "etcd-0");
        assert!(
            matches!(etcd(10).gate_before_stop(&r, "etcd-0"), Gate::Wait(w) if w.contains("quorum"))
        );
    }

    #[test]
    fn gate_waits_on_alarms_and_problems() {
        let mut r = raft(3, "etcd-0");
        r.problems
            .push("alarm NOSPACE raised on etcd-2".to_string());
        let Gate::Wait(why) = etcd(DEFAULT_MAX_LAG).gate_before_stop(&r, "etcd-1") else {
            panic!()
        };
        assert!(why.contains("NOSPACE"));
        assert!(
            matches!(etcd(DEFAULT_MAX_LAG).gate_after_return(&r, "etcd-1"), Gate::Wait(w) if w.contains("NOSPACE"))
        );
        assert!(
            etcd(DEFAULT_MAX_LAG)
                .healthy_for_start(&r)
                .unwrap_err()
                .contains("NOSPACE")
        );
    }

    #[test]
    fn gate_waits_without_a_leader() {
        let mut r = raft(3, "etcd-0");
        r.leader = None;
        assert!(
            matches!(etcd(10).gate_before_stop(&r, "etcd-1"), Gate::Wait(w) if w.contains("no leader"))
        );
        assert!(
            matches!(etcd(10).gate_after_return(&r, "etcd-1"), Gate::Wait(w) if w.contains("no leader"))
        );
        assert!(
            etcd(DEFAULT_MAX_LAG)
                .healthy_for_start(&r)
                .unwrap_err()
                .contains("no leader")
        );
    }

    #[test]
    fn gate_after_return_waits_for_the_member() {
        let mut r = raft(3, "etcd-0");
        assert_eq!(etcd(100).gate_after_return(&r, "etcd-1"), Gate::Open);
        r.members[1].position = Some(10);
        assert!(
            matches!(etcd(50).gate_after_return(&r, "etcd-1"), Gate::Wait(w) if w.contains("90 raft entries behind"))
        );
        sick(&mut r, "etcd-1", "sees no leader");
        assert!(
            matches!(etcd(100).gate_after_return(&r, "etcd-1"), Gate::Wait(w) if w.contains("not healthy yet: sees no leader"))
        );
        r.members.retain(|m| m.pod != "etcd-1");
        assert!(
            matches!(etcd(100).gate_after_return(&r, "etcd-1"), Gate::Wait(w) if w.contains("not back yet"))
        );
    }

    #[test]
    fn transfer_prefers_a_migrated_caught_up_follower() {
        let mut r = raft(5, "etcd-0");
        assert_eq!(
            etcd(DEFAULT_MAX_LAG)
                .handover_target(&r, "etcd-0", &[])
                .as_deref(),
            Some("etcd-1")
        );
        assert_eq!(
            etcd(DEFAULT_MAX_LAG)
                .handover_target(&r, "etcd-0", &names(&["etcd-3", "etcd-4"]))
                .as_deref(),
            Some("etcd-3")
        );
        // a migrated member too far behind is skipped; an unhealthy one too
        r.members[3].position = Some(0);
        r.members[0].position = Some(5000);
        for i in [1, 2, 4] {
            r.members[i].position = Some(4990);
        }
        sick(&mut r, "etcd-4", "sees no leader");
        assert_eq!(
            etcd(DEFAULT_MAX_LAG)
                .handover_target(&r, "etcd-0", &names(&["etcd-3", "etcd-4"]))
                .as_deref(),
            Some("etcd-1")
        );
        // nobody suitable
        let mut r = raft(3, "etcd-0");
        sick(&mut r, "etcd-1", "x");
        sick(&mut r, "etcd-2", "y");
        assert_eq!(
            etcd(DEFAULT_MAX_LAG).handover_target(&r, "etcd-0", &[]),
            None
        );
        // generic engines never transfer
        let r = raft(3, "etcd-0");
        assert_eq!(GenericRules.handover_target(&r, "etcd-0", &[]), None);
    }

    #[test]
    fn healthy_for_start_names_the_unhealthy_members() {
        let mut r = raft(3, "etcd-0");
        assert_eq!(etcd(DEFAULT_MAX_LAG).healthy_for_start(&r), Ok(()));
        sick(
            &mut r,
            "etcd-2",
            "does not answer at http://198.18.0.12:2379",
        );
        let err = etcd(DEFAULT_MAX_LAG).healthy_for_start(&r).unwrap_err();
        assert!(err.contains("member etcd-2: does not answer"), "{err}");
        assert!(
            etcd(DEFAULT_MAX_LAG)
                .healthy_for_start(&HealthReport::default())
                .is_err()
        );
    }

    #[test]
    fn generic_gates_ignore_leader_and_quorum() {
        let mut r = raft(1, "etcd-0");
        r.voting_members = None;
        for m in &mut r.members {
            m.position = None;
            m.member_id = None;
        }
        // single replica, also the label-marked leader: may stop (downtime is inherent)
        assert_eq!(GenericRules.gate_before_stop(&r, "etcd-0"), Gate::Open);
        assert_eq!(GenericRules.gate_after_return(&r, "etcd-0"), Gate::Open);
        // the etcd rules wait for what the generic ones ignore
        assert!(matches!(
            etcd(0).gate_before_stop(&r, "etcd-0"),
            Gate::Wait(_)
        ));
    }

    #[test]
    fn missing_pods_become_problems() {
        let mut r = raft(3, "etcd-0");
        r.members.retain(|m| m.pod != "etcd-2");
        note_missing_pods(&mut r, &names(&["etcd-0", "etcd-1", "etcd-2"]));
        assert_eq!(
            r.problems,
            vec!["member pod etcd-2 does not exist or was not observed"]
        );
        assert!(
            matches!(etcd(10).gate_before_stop(&r, "etcd-1"), Gate::Wait(w) if w.contains("etcd-2"))
        );
    }

    #[test]
    fn role_keeps_its_json_values() {
        assert_eq!(serde_json::to_value(Role::Leader).unwrap(), "leader");
        assert_eq!(serde_json::to_value(Role::Follower).unwrap(), "follower");
        let m: crate::api::PlannedMember = serde_json::from_value(serde_json::json!({
            "ordinal": 1, "pod": "etcd-1", "node": "n", "claim": "c", "oldVolume": "v",
            "tempClaim": "t", "oldSize": "1Gi", "newSize": "1Gi", "role": "follower"
        }))
        .unwrap();
        assert_eq!(m.role, Some(Role::Follower));
        assert!(serde_json::from_value::<Role>(serde_json::json!("Leader")).is_err());
        let r = raft(3, "etcd-1");
        let roles: Vec<Role> = r.members.iter().map(MemberHealth::role).collect();
        assert_eq!(roles, [Role::Follower, Role::Leader, Role::Follower]);
    }

    #[test]
    fn gate_verdicts_read_as_before() {
        assert_eq!(
            Gate::TransferLeadershipFirst.to_string(),
            "leader: transfer first"
        );
        assert_eq!(Gate::Wait("x is down".to_string()).to_string(), "x is down");
        // Only the leader of a database that hands over is asked to.
        let r = raft(3, "etcd-0");
        for pod in ["etcd-0", "etcd-1", "etcd-2"] {
            let transfer =
                etcd(DEFAULT_MAX_LAG).gate_before_stop(&r, pod) == Gate::TransferLeadershipFirst;
            assert_eq!(transfer, pod == "etcd-0", "{pod}");
        }
        assert_eq!(GenericRules.gate_before_stop(&r, "etcd-0"), Gate::Open);
    }

    #[test]
    fn unavailable_health_and_hash_read_as_before() {
        assert_eq!(
            HealthUnavailable::NotObservedInStage.to_string(),
            "not observed in this stage"
        );
        assert_eq!(
            HealthUnavailable::NoEngine("database engine: cannot read secret s: gone".into())
                .to_string(),
            "database engine: cannot read secret s: gone"
        );
        assert_eq!(
            HealthUnavailable::Engine("connection refused".into()).to_string(),
            "connection refused"
        );
        assert_eq!(
            FinalHashError::Inconsistent("hash_kv differs".into()).to_string(),
            "members are inconsistent: hash_kv differs"
        );
        assert_eq!(
            FinalHashError::Engine("no member pod to hash".into()).to_string(),
            "no member pod to hash"
        );
        assert_eq!(
            InvalidSettings("bad label".into()).to_string(),
            "invalid database settings: bad label"
        );
    }
}
