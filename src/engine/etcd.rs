//! The etcd engine, pure: turns what every member answered (`status`, `member list`,
//! `alarm list`, recorded as plain data in [`MemberView`]s) into a [`HealthReport`]: member-to-pod
//! mapping, leader agreement, raft index, alarms, learners and cluster-wide problems. The client
//! that asks the members lives in the cluster layer; the logic here is tested on hand-built views.
//!
//! [`EtcdRules`]: followers first and the leader last; before a stop every member is healthy,
//! a leader is agreed on, every applied index is within [`DEFAULT_MAX_LAG`] entries of the
//! leader's and a voting quorum stays up; the leader moves its leadership (MoveLeader) to a
//! caught-up member first; the final check is `hash_kv` agreed by every member.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;

use super::{
    DEFAULT_MAX_LAG, FinalCheckKind, FinalHashError, Gate, HealthReport, MemberHealth, Rules,
    caught_up_gate, caught_up_target, members_healthy_with_leader, ordinal_key, quorum_gate,
    replicated_gate,
};
use crate::api::DatabaseSpec;

/// Lag is counted in raft log entries.
const UNIT: &str = "raft entries";

/// The rules of the `Etcd` engine (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdRules {
    /// How many raft entries a member may trail the leader.
    pub max_lag: u64,
}

impl Default for EtcdRules {
    fn default() -> Self {
        Self {
            max_lag: DEFAULT_MAX_LAG,
        }
    }
}

/// The rules of a request with `engine: Etcd`.
pub fn rules(_spec: &DatabaseSpec) -> Box<dyn Rules> {
    Box::new(EtcdRules::default())
}

impl Rules for EtcdRules {
    fn gate_before_stop(&self, report: &HealthReport, pod: &str) -> Gate {
        let leader = match replicated_gate(report, pod, self.max_lag, UNIT) {
            Ok(leader) => leader,
            Err(wait) => return wait,
        };
        if let Some(wait) = quorum_gate(report, pod) {
            return wait;
        }
        if leader == pod {
            return Gate::TransferLeadershipFirst;
        }
        Gate::Open
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
        caught_up_target(report, stopping, migrated, self.max_lag)
    }

    fn handover(&self) -> Option<&'static str> {
        Some("its Raft leadership moved (MoveLeader) to a caught-up member, already migrated")
    }

    fn healthy_for_start(&self, report: &HealthReport) -> Result<(), String> {
        members_healthy_with_leader(report)
    }

    fn final_check(&self) -> FinalCheckKind {
        FinalCheckKind::Agreement { what: "hash_kv" }
    }
}

/// One member's answer to `status`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StatusView {
    pub cluster_id: u64,
    /// The id of the member that answered (response header).
    pub member_id: u64,
    /// The leader this member knows (0: none).
    pub leader: u64,
    pub raft_index: u64,
    pub raft_applied_index: u64,
    pub raft_term: u64,
    pub is_learner: bool,
    /// `status.errors` (e.g. active alarms on this member).
    pub errors: Vec<String>,
    /// The member's key-value store revision (response header).
    pub revision: i64,
}

/// One entry of `member list`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemberInfo {
    pub id: u64,
    /// Empty when the member has not started yet.
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

/// One entry of `alarm list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlarmInfo {
    pub member_id: u64,
    /// `NOSPACE`, `CORRUPT`...
    pub alarm: String,
}

/// What one member pod told us (or why it did not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    /// The pod whose endpoint was asked.
    pub pod: String,
    pub endpoint: Option<String>,
    pub status: Result<StatusView, String>,
    pub members: Result<Vec<MemberInfo>, String>,
    pub alarms: Result<Vec<AlarmInfo>, String>,
}

/// The parts of a pod the mapping needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodInfo {
    pub name: String,
    pub ip: Option<String>,
    /// `spec.hostname` (a StatefulSet sets it to the pod name).
    pub hostname: Option<String>,
    /// `spec.subdomain` (the StatefulSet's headless service).
    pub subdomain: Option<String>,
    pub namespace: Option<String>,
    pub terminating: bool,
}

impl PodInfo {
    pub fn from_pod(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        Self {
            name: pod.metadata.name.clone().unwrap_or_default(),
            ip: pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .filter(|ip| !ip.is_empty()),
            hostname: spec.and_then(|s| s.hostname.clone()),
            subdomain: spec.and_then(|s| s.subdomain.clone()),
            namespace: pod.metadata.namespace.clone(),
            terminating: pod.metadata.deletion_timestamp.is_some(),
        }
    }

    /// The pods' infos in ordinal order (the order reports list members in).
    pub fn in_ordinal_order(pods: &[Pod]) -> Vec<Self> {
        let mut infos: Vec<Self> = pods.iter().map(Self::from_pod).collect();
        infos.sort_by(|a, b| ordinal_key(&a.name).cmp(&ordinal_key(&b.name)));
        infos
    }

    /// `<hostname>.<subdomain>` when both are set.
    pub fn dns_prefix(&self) -> Option<String> {
        Some(format!(
            "{}.{}",
            self.hostname.as_deref()?,
            self.subdomain.as_deref()?
        ))
    }

    /// Does a URL host (from a peer or client URL) name this pod?
    fn matches_host(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if self.ip.as_deref().is_some_and(|ip| ip == host) {
            return true;
        }
        if let Some(prefix) = self.dns_prefix().map(|p| p.to_ascii_lowercase())
            && (host == prefix || host.starts_with(&format!("{prefix}.")))
        {
            return true;
        }
        self.hostname
            .as_deref()
            .is_some_and(|h| h.eq_ignore_ascii_case(&host))
    }
}

/// The host part of `scheme://host:port/path` (IPv6 brackets removed).
fn url_host(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split_once(']').map(|(h, _)| h);
    }
    let host = authority.split_once(':').map_or(authority, |(h, _)| h);
    (!host.is_empty()).then_some(host)
}

/// An etcd member id as etcd prints it (lower-case hex).
pub fn hex(id: u64) -> String {
    format!("{id:x}")
}

/// The member list most answering members report, and a problem when they disagree.
fn agreed_member_list(views: &[MemberView]) -> (Option<Vec<MemberInfo>>, Option<String>) {
    let mut groups: Vec<(BTreeSet<u64>, &Vec<MemberInfo>, Vec<&str>)> = Vec::new();
    for v in views {
        let Ok(list) = &v.members else { continue };
        let ids: BTreeSet<u64> = list.iter().map(|m| m.id).collect();
        match groups.iter_mut().find(|g| g.0 == ids) {
            Some(g) => g.2.push(&v.pod),
            None => groups.push((ids, list, vec![&v.pod])),
        }
    }
    let problem = (groups.len() > 1).then(|| {
        let parts: Vec<String> = groups
            .iter()
            .map(|(ids, _, pods)| {
                let ids: Vec<String> = ids.iter().map(|i| hex(*i)).collect();
                format!("{} see [{}]", pods.join(", "), ids.join(", "))
            })
            .collect();
        format!("members disagree on the member list: {}", parts.join("; "))
    });
    // Largest group wins; ties go to the first seen (pods come in ordinal order).
    let best = groups
        .iter()
        .enumerate()
        .max_by(|(ia, a), (ib, b)| a.2.len().cmp(&b.2.len()).then(ib.cmp(ia)))
        .map(|(_, g)| g.1.clone());
    (best, problem)
}

/// Maps every etcd member id to a pod name: by the id a pod's endpoint answered with, else by
/// member name == pod name, else by a peer/client URL host naming the pod (`hostname.subdomain`
/// or its IP). Returns the mapping and problems (a pod answering as a member named after another
/// pod).
pub fn map_members(
    pods: &[PodInfo],
    members: &[MemberInfo],
    views: &[MemberView],
) -> (BTreeMap<u64, String>, Vec<String>) {
    let mut by_id: BTreeMap<u64, String> = BTreeMap::new();
    let mut problems = Vec::new();
    let known: BTreeSet<u64> = members.iter().map(|m| m.id).collect();
    let taken = |by_id: &BTreeMap<u64, String>, pod: &str| by_id.values().any(|p| p == pod);
    // 1. self-identification: the endpoint of pod P answered as member M.
    for v in views {
        let Ok(s) = &v.status else { continue };
        if known.contains(&s.member_id) && !taken(&by_id, &v.pod) {
            by_id.entry(s.member_id).or_insert_with(|| v.pod.clone());
        }
    }
    // 2. member name == pod name.
    for m in members {
        if by_id.contains_key(&m.id) || m.name.is_empty() {
            continue;
        }
        if let Some(p) = pods.iter().find(|p| p.name == m.name)
            && !taken(&by_id, &p.name)
        {
            by_id.insert(m.id, p.name.clone());
        }
    }
    // 3. a peer or client URL host naming the pod.
    for m in members {
        if by_id.contains_key(&m.id) {
            continue;
        }
        let hosts: Vec<&str> = m
            .peer_urls
            .iter()
            .chain(&m.client_urls)
            .filter_map(|u| url_host(u))
            .collect();
        if let Some(p) = pods
            .iter()
            .find(|p| !taken(&by_id, &p.name) && hosts.iter().any(|h| p.matches_host(h)))
        {
            by_id.insert(m.id, p.name.clone());
        }
    }
    // A pod answering under another pod's member name means volumes got mixed up.
    for m in members {
        if let Some(pod) = by_id.get(&m.id)
            && !m.name.is_empty()
            && m.name != *pod
            && pods.iter().any(|p| p.name == m.name)
        {
            problems.push(format!(
                "pod {pod} runs etcd member {} (id {}), which is named after another pod",
                m.name,
                hex(m.id)
            ));
        }
    }
    (by_id, problems)
}

fn member_label(m: &MemberInfo) -> String {
    if m.name.is_empty() {
        format!("(unstarted, id {})", hex(m.id))
    } else {
        format!("{} (id {})", m.name, hex(m.id))
    }
}

/// The member id a pod is mapped to.
fn id_of(by_id: &BTreeMap<u64, String>, pod: &str) -> Option<u64> {
    by_id.iter().find(|(_, p)| *p == pod).map(|(id, _)| *id)
}

/// A member id in words: its pod, else `<prefix><hex id>`.
fn pod_or_id(by_id: &BTreeMap<u64, String>, id: u64, prefix: &str) -> String {
    by_id
        .get(&id)
        .cloned()
        .unwrap_or_else(|| format!("{prefix}{}", hex(id)))
}

/// Turns the views of every member pod into a health report. `pods` and `views` are in the
/// same order (one view per pod).
pub fn assess(pods: &[PodInfo], views: &[MemberView]) -> HealthReport {
    let mut problems: Vec<String> = Vec::new();
    let (list, disagreement) = agreed_member_list(views);
    problems.extend(disagreement);
    let list = list.unwrap_or_default();
    if list.is_empty() && !views.is_empty() {
        problems.push("no member answered the member list".to_string());
    }
    let (by_id, mapping_problems) = map_members(pods, &list, views);
    problems.extend(mapping_problems);
    problems.extend(membership_problems(&list, &by_id));
    problems.extend(cluster_id_problem(views));
    let alarms = raised_alarms(views);
    problems.extend(alarm_problems(&alarms, &by_id));
    let (leader, leader_problem) = agreed_leader(views, &by_id);
    problems.extend(leader_problem);

    let listed = !list.is_empty();
    let mut members: Vec<MemberHealth> = Vec::new();
    for (pod, view) in pods.iter().zip(views) {
        let id = id_of(&by_id, &pod.name);
        if id.is_none() && listed {
            problems.push(format!("pod {} is not an etcd member", pod.name));
        }
        let context = MemberContext {
            id,
            listed,
            alarms: &alarms,
            leader: leader.as_deref(),
        };
        members.push(member_health(pod, view, &context));
    }
    members.sort_by(|a, b| ordinal_key(&a.pod).cmp(&ordinal_key(&b.pod)));
    let voting = list.iter().filter(|m| !m.is_learner).count();
    HealthReport {
        members,
        leader,
        problems,
        voting_members: listed.then_some(voting),
        replicas_for_writes: 0,
    }
}

/// Members of the agreed list that match no pod, and learners (in list order).
fn membership_problems(list: &[MemberInfo], by_id: &BTreeMap<u64, String>) -> Vec<String> {
    let mut problems = Vec::new();
    for m in list {
        if !by_id.contains_key(&m.id) {
            problems.push(format!(
                "etcd member {} matches no pod of the StatefulSet",
                member_label(m)
            ));
        }
        if m.is_learner {
            problems.push(format!("etcd member {} is a learner", member_label(m)));
        }
    }
    problems
}

/// A problem when the answering members belong to more than one etcd cluster.
fn cluster_id_problem(views: &[MemberView]) -> Option<String> {
    let cluster_ids: BTreeSet<u64> = views
        .iter()
        .filter_map(|v| v.status.as_ref().ok().map(|s| s.cluster_id))
        .collect();
    (cluster_ids.len() > 1).then(|| {
        let ids: Vec<String> = cluster_ids.iter().map(|i| hex(*i)).collect();
        format!(
            "members belong to different etcd clusters: {}",
            ids.join(", ")
        )
    })
}

/// Every alarm any answering member lists, as (member id, alarm), deduplicated.
fn raised_alarms(views: &[MemberView]) -> BTreeSet<(u64, String)> {
    views
        .iter()
        .filter_map(|v| v.alarms.as_ref().ok())
        .flatten()
        .map(|a| (a.member_id, a.alarm.clone()))
        .collect()
}

fn alarm_problems(alarms: &BTreeSet<(u64, String)>, by_id: &BTreeMap<u64, String>) -> Vec<String> {
    alarms
        .iter()
        .map(|(id, alarm)| {
            let who = pod_or_id(by_id, *id, "member id ");
            format!("alarm {alarm} raised on {who}")
        })
        .collect()
}

/// The pod of the leader every answering member names, or the problem: nobody knows a leader,
/// members name different leaders, or the leader matches no pod.
fn agreed_leader(
    views: &[MemberView],
    by_id: &BTreeMap<u64, String>,
) -> (Option<String>, Option<String>) {
    let seen: Vec<(&str, u64)> = views
        .iter()
        .filter_map(|v| v.status.as_ref().ok().map(|s| (v.pod.as_str(), s.leader)))
        .filter(|(_, l)| *l != 0)
        .collect();
    let leader_ids: BTreeSet<u64> = seen.iter().map(|(_, l)| *l).collect();
    match (leader_ids.len(), leader_ids.first()) {
        (0, _) => {
            let problem = views.iter().any(|v| v.status.is_ok()).then(|| {
                "no member knows a leader (election in progress or quorum lost)".to_string()
            });
            (None, problem)
        }
        (1, Some(id)) => match by_id.get(id) {
            Some(pod) => (Some(pod.clone()), None),
            None => (
                None,
                Some(format!("the leader (id {}) matches no pod", hex(*id))),
            ),
        },
        _ => {
            let parts: Vec<String> = seen
                .iter()
                .map(|(pod, l)| format!("{pod} sees {}", pod_or_id(by_id, *l, "id ")))
                .collect();
            let problem = format!("members disagree on the leader: {}", parts.join(", "));
            (None, Some(problem))
        }
    }
}

/// What [`member_health`] needs to know about the cluster as a whole.
struct MemberContext<'a> {
    /// The member id the pod is mapped to.
    id: Option<u64>,
    /// Some member answered the member list (so a pod without a member id is no member).
    listed: bool,
    alarms: &'a BTreeSet<(u64, String)>,
    /// The agreed leader's pod.
    leader: Option<&'a str>,
}

/// One pod's health: why it is not healthy (unreachable, being deleted, a learner, sees no
/// leader, reports errors, is no member, has alarms), its raft index and role.
fn member_health(pod: &PodInfo, view: &MemberView, cx: &MemberContext<'_>) -> MemberHealth {
    let mut why: Vec<String> = Vec::new();
    let status = match &view.status {
        Ok(s) => Some(s),
        Err(e) => {
            why.push(match &view.endpoint {
                Some(ep) => format!("cannot be queried at {ep}: {e}"),
                None => e.clone(),
            });
            None
        }
    };
    if pod.terminating {
        why.push("pod is being deleted".to_string());
    }
    if let Some(s) = status {
        why.extend(status_problems(s));
    }
    if cx.id.is_none() && cx.listed {
        why.push("is not in the etcd member list".to_string());
    }
    if let Some(id) = cx.id {
        for (_, alarm) in cx.alarms.iter().filter(|(a, _)| *a == id) {
            why.push(format!("alarm {alarm}"));
        }
    }
    MemberHealth {
        pod: pod.name.clone(),
        healthy: why.is_empty(),
        leader: cx.leader == Some(pod.name.as_str()),
        position: status.map(applied_index),
        term: status.map(|s| s.raft_term),
        member_id: cx.id.map(hex),
        synchronous: false,
        problem: (!why.is_empty()).then(|| why.join("; ")),
        endpoint: view.endpoint.clone(),
    }
}

/// What a member's own `status` says is wrong with it.
fn status_problems(s: &StatusView) -> Vec<String> {
    let mut why = Vec::new();
    if s.is_learner {
        why.push("is a learner".to_string());
    }
    if s.leader == 0 {
        why.push("sees no leader".to_string());
    }
    if !s.errors.is_empty() {
        why.push(format!("reports errors: {}", s.errors.join(", ")));
    }
    why
}

/// The index lag is judged on: the applied index, or the raft index when the member does not
/// report the applied one.
pub fn applied_index(s: &StatusView) -> u64 {
    if s.raft_applied_index > 0 {
        s.raft_applied_index
    } else {
        s.raft_index
    }
}

/// One member's answer to `hash_kv`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberHash {
    pub pod: String,
    pub hash: u32,
    /// The revision the member's store is compacted at.
    pub compact_revision: i64,
}

/// The revision every member can hash at: the lowest current revision among them; `None` when
/// there is no member or one reports no revision.
pub fn common_revision(revisions: &[i64]) -> Option<i64> {
    revisions.iter().copied().min().filter(|r| *r >= 1)
}

/// `"<hash>@<revision>"` when every member's `hash_kv` is the same; else which member has what.
pub fn agreed_hash(hashes: &[MemberHash], revision: i64) -> Result<String, FinalHashError> {
    let distinct: BTreeSet<u32> = hashes.iter().map(|h| h.hash).collect();
    match (distinct.len(), distinct.first()) {
        (1, Some(hash)) => Ok(format!("{hash}@{revision}")),
        _ => {
            let parts: Vec<String> = hashes
                .iter()
                .map(|h| {
                    format!(
                        "{}: {} (compacted at revision {})",
                        h.pod, h.hash, h.compact_revision
                    )
                })
                .collect();
            Err(FinalHashError::Inconsistent(format!(
                "hash_kv at revision {revision} differs: {}",
                parts.join(", ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Gate, Rules};
    use super::*;

    const CLUSTER: u64 = 0xc1;

    fn id(i: u32) -> u64 {
        0x1000 + u64::from(i)
    }

    fn pod(i: u32) -> PodInfo {
        PodInfo {
            name: format!("etcd-{i}"),
            ip: Some(format!("198.18.0.{}", 10 + i)),
            hostname: Some(format!("etcd-{i}")),
            subdomain: Some("etcd".to_string()),
            namespace: Some("db".to_string()),
            terminating: false,
        }
    }

    fn member(i: u32) -> MemberInfo {
        MemberInfo {
            id: id(i),
            name: format!("etcd-{i}"),
            peer_urls: vec![format!("http://etcd-{i}.etcd.db.svc.cluster.local:2380")],
            client_urls: vec![format!("http://etcd-{i}.etcd.db.svc.cluster.local:2379")],
            is_learner: false,
        }
    }

    fn status(i: u32, leader: u32, index: u64) -> StatusView {
        StatusView {
            cluster_id: CLUSTER,
            member_id: id(i),
            leader: id(leader),
            raft_index: index,
            raft_applied_index: index,
            raft_term: 4,
            is_learner: false,
            errors: vec![],
            revision: 77,
        }
    }

    fn view(i: u32, leader: u32, members: &[MemberInfo]) -> MemberView {
        MemberView {
            pod: format!("etcd-{i}"),
            endpoint: Some(format!("http://198.18.0.{}:2379", 10 + i)),
            status: Ok(status(i, leader, 100)),
            members: Ok(members.to_vec()),
            alarms: Ok(vec![]),
        }
    }

    /// `n` healthy members, `leader` leading.
    fn cluster(n: u32, leader: u32) -> (Vec<PodInfo>, Vec<MemberView>) {
        let members: Vec<MemberInfo> = (0..n).map(member).collect();
        (
            (0..n).map(pod).collect(),
            (0..n).map(|i| view(i, leader, &members)).collect(),
        )
    }

    fn down(v: &mut MemberView, why: &str) {
        v.status = Err(why.to_string());
        v.members = Err(why.to_string());
        v.alarms = Err(why.to_string());
    }

    #[test]
    fn healthy_three_member_cluster() {
        let (pods, views) = cluster(3, 1);
        let r = assess(&pods, &views);
        assert_eq!(r.problems, Vec::<String>::new());
        assert_eq!(r.leader.as_deref(), Some("etcd-1"));
        assert_eq!(r.voting_members, Some(3));
        assert!(r.members.iter().all(|m| m.healthy));
        assert_eq!(r.members[1].member_id.as_deref(), Some("1001"));
        assert!(r.members[1].leader && !r.members[0].leader);
        assert_eq!(
            r.members[2].endpoint.as_deref(),
            Some("http://198.18.0.12:2379")
        );
        assert_eq!(r.members[0].position, Some(100));
        assert_eq!(
            EtcdRules::default().gate_before_stop(&r, "etcd-0"),
            Gate::Open
        );
        let all: Vec<String> = (0..3).map(|i| format!("etcd-{i}")).collect();
        assert_eq!(
            EtcdRules::default().next_member(&r, &all).as_deref(),
            Some("etcd-0")
        );
    }

    #[test]
    fn maps_by_member_name_when_the_member_does_not_answer() {
        let (pods, mut views) = cluster(3, 0);
        down(&mut views[2], "connection refused");
        let r = assess(&pods, &views);
        assert_eq!(r.members[2].member_id.as_deref(), Some("1002"));
        assert!(!r.members[2].healthy);
        assert_eq!(
            r.members[2].problem.as_deref(),
            Some("cannot be queried at http://198.18.0.12:2379: connection refused")
        );
        // The member is known and mapped: no cluster-wide problem, but the gates wait.
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert!(
            matches!(EtcdRules::default().gate_before_stop(&r, "etcd-1"), Gate::Wait(w) if w.contains("etcd-2: cannot be queried"))
        );
    }

    #[test]
    fn maps_by_peer_url_host_or_ip() {
        // Members named differently from their pods (e.g. a hand-made cluster): peer URLs decide.
        let mut m0 = member(0);
        m0.name = "infra0".to_string();
        let mut m1 = member(1);
        m1.name = "infra1".to_string();
        m1.peer_urls = vec!["https://etcd-1.etcd:2380".to_string()];
        m1.client_urls = vec![];
        let mut m2 = member(2);
        m2.name = String::new(); // not started yet
        m2.peer_urls = vec!["http://198.18.0.12:2380".to_string()];
        let members = vec![m0, m1, m2];
        let pods: Vec<PodInfo> = (0..3).map(pod).collect();
        let mut views: Vec<MemberView> = (0..3).map(|i| view(i, 0, &members)).collect();
        for v in &mut views {
            down(v, "refused");
        }
        views[0] = view(0, 0, &members);
        // Only etcd-0 answers; the others are mapped by URL.
        let (by_id, problems) = map_members(&pods, &members, &views);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(by_id.get(&id(0)).map(String::as_str), Some("etcd-0"));
        assert_eq!(by_id.get(&id(1)).map(String::as_str), Some("etcd-1"));
        assert_eq!(by_id.get(&id(2)).map(String::as_str), Some("etcd-2"));
    }

    #[test]
    fn self_identification_beats_names_and_reveals_swapped_members() {
        let (pods, mut views) = cluster(3, 0);
        // The endpoint of pod etcd-1 answers as member etcd-2 and vice versa.
        if let Ok(s) = &mut views[1].status {
            s.member_id = id(2);
        }
        if let Ok(s) = &mut views[2].status {
            s.member_id = id(1);
        }
        let r = assess(&pods, &views);
        assert_eq!(r.members[1].member_id.as_deref(), Some("1002"));
        assert!(
            r.problems
                .iter()
                .any(|p| p == "pod etcd-1 runs etcd member etcd-2 (id 1002), which is named after another pod"),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn member_without_pod_and_pod_without_member() {
        let members: Vec<MemberInfo> = (0..4).map(member).collect();
        // 4 members, pods 0..2 plus a pod etcd-5 that is no member.
        let mut pods: Vec<PodInfo> = (0..3).map(pod).collect();
        pods.push(pod(5));
        let mut views: Vec<MemberView> = (0..3).map(|i| view(i, 0, &members)).collect();
        let mut v5 = view(5, 0, &members);
        down(&mut v5, "refused");
        views.push(v5);
        let r = assess(&pods, &views);
        assert_eq!(r.voting_members, Some(4));
        assert!(
            r.problems.contains(
                &"etcd member etcd-3 (id 1003) matches no pod of the StatefulSet".to_string()
            ),
            "{:?}",
            r.problems
        );
        assert!(
            r.problems
                .contains(&"pod etcd-5 is not an etcd member".to_string()),
            "{:?}",
            r.problems
        );
        let m5 = r.members.iter().find(|m| m.pod == "etcd-5").unwrap();
        assert!(
            !m5.healthy
                && m5
                    .problem
                    .as_deref()
                    .unwrap()
                    .contains("not in the etcd member list")
        );
        assert!(EtcdRules::default().healthy_for_start(&r).is_err());
    }

    #[test]
    fn learner_is_a_problem() {
        let mut members: Vec<MemberInfo> = (0..3).map(member).collect();
        members[2].is_learner = true;
        let pods: Vec<PodInfo> = (0..3).map(pod).collect();
        let mut views: Vec<MemberView> = (0..3).map(|i| view(i, 0, &members)).collect();
        if let Ok(s) = &mut views[2].status {
            s.is_learner = true;
        }
        let r = assess(&pods, &views);
        assert_eq!(r.voting_members, Some(2));
        assert_eq!(
            r.problems,
            vec!["etcd member etcd-2 (id 1002) is a learner"]
        );
        assert_eq!(r.members[2].problem.as_deref(), Some("is a learner"));
    }

    #[test]
    fn leader_disagreement_is_a_problem() {
        let (pods, mut views) = cluster(3, 0);
        if let Ok(s) = &mut views[2].status {
            s.leader = id(2);
        }
        let r = assess(&pods, &views);
        assert_eq!(r.leader, None);
        assert_eq!(
            r.problems,
            vec![
                "members disagree on the leader: etcd-0 sees etcd-0, etcd-1 sees etcd-0, etcd-2 sees etcd-2"
            ]
        );
    }

    #[test]
    fn no_leader_known() {
        let (pods, mut views) = cluster(3, 0);
        for v in &mut views {
            if let Ok(s) = &mut v.status {
                s.leader = 0;
            }
        }
        let r = assess(&pods, &views);
        assert_eq!(r.leader, None);
        assert!(r.problems[0].contains("no member knows a leader"));
        assert!(
            r.members
                .iter()
                .all(|m| m.problem.as_deref() == Some("sees no leader"))
        );
    }

    #[test]
    fn alarms_are_problems_and_mark_the_member() {
        let (pods, mut views) = cluster(3, 0);
        for v in &mut views {
            v.alarms = Ok(vec![AlarmInfo {
                member_id: id(1),
                alarm: "NOSPACE".to_string(),
            }]);
        }
        if let Ok(s) = &mut views[1].status {
            s.errors = vec!["memberID:4097 alarm:NOSPACE".to_string()];
        }
        let r = assess(&pods, &views);
        assert_eq!(r.problems, vec!["alarm NOSPACE raised on etcd-1"]);
        assert_eq!(
            r.members[1].problem.as_deref(),
            Some("reports errors: memberID:4097 alarm:NOSPACE; alarm NOSPACE")
        );
    }

    #[test]
    fn member_list_disagreement() {
        let (pods, mut views) = cluster(3, 0);
        views[2].members = Ok(vec![member(0), member(2)]);
        let r = assess(&pods, &views);
        assert_eq!(
            r.problems,
            vec![
                "members disagree on the member list: etcd-0, etcd-1 see [1000, 1001, 1002]; etcd-2 see [1000, 1002]"
            ]
        );
        assert_eq!(r.voting_members, Some(3));
    }

    #[test]
    fn foreign_cluster_is_a_problem() {
        let (pods, mut views) = cluster(3, 0);
        if let Ok(s) = &mut views[2].status {
            s.cluster_id = 0xbad;
        }
        let r = assess(&pods, &views);
        assert_eq!(
            r.problems,
            vec!["members belong to different etcd clusters: c1, bad"]
        );
    }

    #[test]
    fn nobody_answers() {
        let (pods, mut views) = cluster(3, 0);
        for v in &mut views {
            down(v, "refused");
        }
        let r = assess(&pods, &views);
        assert_eq!(r.problems, vec!["no member answered the member list"]);
        assert_eq!(r.leader, None);
        assert_eq!(r.voting_members, None);
        assert!(
            r.members
                .iter()
                .all(|m| !m.healthy && m.member_id.is_none())
        );
    }

    #[test]
    fn lag_uses_the_applied_index() {
        let (pods, mut views) = cluster(3, 0);
        if let Ok(s) = &mut views[0].status {
            s.raft_index = 5000;
            s.raft_applied_index = 5000;
        }
        if let Ok(s) = &mut views[2].status {
            s.raft_index = 5000;
            s.raft_applied_index = 3000;
        }
        if let Ok(s) = &mut views[1].status {
            s.raft_index = 4999;
            s.raft_applied_index = 0; // an etcd that does not report it
        }
        let r = assess(&pods, &views);
        assert_eq!(r.members[1].position, Some(4999));
        assert!(
            matches!(EtcdRules::default().gate_before_stop(&r, "etcd-1"), Gate::Wait(w) if w.contains("etcd-2 is 2000 raft entries behind"))
        );
    }

    #[test]
    fn terminating_pod_is_unhealthy() {
        let (mut pods, views) = cluster(3, 0);
        pods[1].terminating = true;
        let r = assess(&pods, &views);
        assert_eq!(
            r.members[1].problem.as_deref(),
            Some("pod is being deleted")
        );
    }

    #[test]
    fn url_hosts() {
        assert_eq!(url_host("http://10.0.0.1:2380"), Some("10.0.0.1"));
        assert_eq!(
            url_host("https://etcd-0.etcd.ns.svc:2379/"),
            Some("etcd-0.etcd.ns.svc")
        );
        assert_eq!(url_host("http://[fd00::1]:2380"), Some("fd00::1"));
        assert_eq!(url_host("etcd-0:2380"), Some("etcd-0"));
        assert_eq!(url_host("http://:2380"), None);
        let p = pod(0);
        assert!(p.matches_host("etcd-0.etcd"));
        assert!(p.matches_host("ETCD-0.etcd.db.svc.cluster.local."));
        assert!(p.matches_host("198.18.0.10"));
        assert!(p.matches_host("etcd-0"));
        assert!(!p.matches_host("etcd-0.etcdx"));
        assert!(!p.matches_host("etcd-00.etcd"));
    }

    #[test]
    fn hashes_must_agree() {
        let h = |pod: &str, hash: u32| MemberHash {
            pod: pod.to_string(),
            hash,
            compact_revision: 0,
        };
        assert_eq!(
            agreed_hash(&[h("etcd-0", 7), h("etcd-1", 7)], 42).unwrap(),
            "7@42"
        );
        let err = agreed_hash(&[h("etcd-0", 7), h("etcd-1", 8)], 42).unwrap_err();
        assert_eq!(
            err,
            FinalHashError::Inconsistent(
                "hash_kv at revision 42 differs: etcd-0: 7 (compacted at revision 0), etcd-1: 8 \
                 (compacted at revision 0)"
                    .to_string()
            )
        );
        assert!(
            err.to_string()
                .starts_with("members are inconsistent: hash_kv")
        );
    }

    #[test]
    fn common_revision_is_the_lowest_and_positive() {
        assert_eq!(common_revision(&[80, 77, 90]), Some(77));
        assert_eq!(common_revision(&[80, 0]), None);
        assert_eq!(common_revision(&[]), None);
    }

    #[test]
    fn quorum_counts_a_voting_member_without_a_pod() {
        // Three voting members, but the pod of etcd-2 is gone: the report has two pods, the
        // member list still counts three, so stopping another member would lose quorum.
        let members: Vec<MemberInfo> = (0..3).map(member).collect();
        let pods: Vec<PodInfo> = (0..2).map(pod).collect();
        let views: Vec<MemberView> = (0..2).map(|i| view(i, 0, &members)).collect();
        let r = assess(&pods, &views);
        assert_eq!(r.voting_members, Some(3));
        assert_eq!(r.members.len(), 2);
        assert_eq!(
            r.problems,
            vec!["etcd member etcd-2 (id 1002) matches no pod of the StatefulSet"]
        );
        // Without the cluster-wide problem, the quorum rule alone closes the gate.
        let mut quorum_only = r.clone();
        quorum_only.problems.clear();
        assert_eq!(
            EtcdRules::default().gate_before_stop(&quorum_only, "etcd-1"),
            Gate::Wait(
                "stopping etcd-1 would leave 1 of 3 voting members up; quorum needs 2".to_string()
            )
        );
        assert!(
            matches!(EtcdRules::default().gate_before_stop(&r, "etcd-1"), Gate::Wait(w) if w.contains("matches no pod"))
        );
    }

    #[test]
    fn leader_matching_no_pod_is_a_problem() {
        let members: Vec<MemberInfo> = (0..3).map(member).collect();
        let pods: Vec<PodInfo> = (0..2).map(pod).collect();
        let views: Vec<MemberView> = (0..2).map(|i| view(i, 2, &members)).collect();
        let r = assess(&pods, &views);
        assert_eq!(r.leader, None);
        assert!(
            r.problems
                .contains(&"the leader (id 1002) matches no pod".to_string()),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn the_leader_leads_and_must_hand_over_first() {
        let (pods, views) = cluster(3, 2);
        let r = assess(&pods, &views);
        assert_eq!(r.leader.as_deref(), Some("etcd-2"));
        assert_eq!(r.members[2].role(), super::super::Role::Leader);
        assert_eq!(r.members[0].role(), super::super::Role::Follower);
        assert_eq!(
            EtcdRules::default().gate_before_stop(&r, "etcd-2"),
            Gate::TransferLeadershipFirst
        );
    }

    #[test]
    fn unstarted_member_without_pod() {
        let mut unstarted = member(3);
        unstarted.name = String::new();
        unstarted.peer_urls = vec!["http://198.18.0.99:2380".to_string()];
        unstarted.client_urls = vec![];
        let mut members: Vec<MemberInfo> = (0..3).map(member).collect();
        members.push(unstarted);
        let (by_id, _) = map_members(&(0..3).map(pod).collect::<Vec<_>>(), &members, &[]);
        assert_eq!(
            membership_problems(&members, &by_id),
            vec!["etcd member (unstarted, id 1003) matches no pod of the StatefulSet"]
        );
    }

    #[test]
    fn alarm_on_an_unknown_member_names_its_id() {
        let (pods, mut views) = cluster(3, 0);
        views[0].alarms = Ok(vec![AlarmInfo {
            member_id: 0xdead,
            alarm: "CORRUPT".to_string(),
        }]);
        let r = assess(&pods, &views);
        assert_eq!(r.problems, vec!["alarm CORRUPT raised on member id dead"]);
        assert!(r.members.iter().all(|m| m.healthy));
    }

    #[test]
    fn member_health_of_an_unreachable_pod_without_ip() {
        let mut v = view(0, 0, &[]);
        v.endpoint = None;
        down(&mut v, "pod has no IP (not running)");
        let alarms = BTreeSet::new();
        let cx = MemberContext {
            id: Some(id(0)),
            listed: true,
            alarms: &alarms,
            leader: None,
        };
        let h = member_health(&pod(0), &v, &cx);
        assert!(!h.healthy);
        assert_eq!(h.problem.as_deref(), Some("pod has no IP (not running)"));
        assert_eq!(h.position, None);
        assert_eq!(h.member_id.as_deref(), Some("1000"));
    }
}
