//! The RedisSentinel engine, pure: Redis replicas managed by Sentinel, the Sentinels beside each
//! member in the member pod (the Bitnami chart's layout) or behind a Service. What the members
//! and the Sentinels answered (`INFO replication` from each Redis, `SENTINEL
//! get-master-addr-by-name` and `SENTINEL CKQUORUM` from each Sentinel), parsed here, becomes a
//! [`HealthReport`]; [`RedisRules`] decide on it. The client that asks lives in `crate::cluster::database::redis`.
//!
//! - **Facts.** The master is the member the Sentinels name (all that answer must agree), and
//!   that member's own `INFO` must say `role:master`. A member's position is its replication
//!   offset in bytes: the master's `master_repl_offset`, a replica's `slave_repl_offset`. A
//!   replica is healthy when it replicates from that master with `master_link_status:up`; a
//!   member is unhealthy while the Sentinel in its pod (when one runs there) does not answer.
//! - **Order**: replicas first (ordinal order), the master last.
//! - **Stop gate**: every member healthy, every replica within `maxLagBytes` of the master,
//!   a Sentinel answering `CKQUORUM` with OK, and a majority of the Sentinels still up once this
//!   member's pod (and its Sentinel) stops; the master asks for a handover first.
//! - **Handover**: to a healthy replica within `maxLagBytes`, preferring migrated ones (the
//!   client pauses writes on the master, waits for the replica to catch up, has Sentinel fail
//!   over to it with the other replicas' `replica-priority` at 0, then demotes the old master).
//! - **Rejoin**: the member replicates from the master, link up, within `maxLagBytes`.
//! - **Final check**: at one quiet moment, every member at the master's replication offset and
//!   with the master's key count in every database ([`agreed_offsets`]).
//! - **Preflight** denies when Redis and the Sentinels cannot be read (a Sentinel Service with
//!   no ready endpoint included), no Sentinel answers, the Sentinels do not know the master
//!   group or disagree on its master, the quorum cannot be reached, or two members say
//!   `role:master`. A member not in sync is refused only by `apply: IfReady`; with `apply:
//!   Always` the request starts and the gate waits for it.

use std::collections::BTreeMap;

use super::{
    FinalCheckKind, FinalHash, Gate, HealthReport, HealthUnavailable, MemberHealth, Rules,
    caught_up_gate, caught_up_target, followers_first, members_healthy_with_leader, ordinal_key,
    quorum_gate, replicated_gate,
};
use crate::api::DatabaseSpec;

/// Default of `spec.database.maxLagBytes` for RedisSentinel: Redis's default
/// `repl-backlog-size` (a replica further behind may not resynchronise partially).
pub const DEFAULT_MAX_LAG_BYTES: u64 = 1_048_576;
/// Default of `spec.database.redisSentinel.masterName`.
pub const DEFAULT_MASTER_NAME: &str = "mymaster";
/// Default Redis port.
pub const DEFAULT_REDIS_PORT: u16 = 6379;
/// Default Sentinel port.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;
/// Default of `spec.database.redisSentinel.handoverTimeoutSeconds`.
pub const DEFAULT_HANDOVER_TIMEOUT_SECONDS: u32 = 30;

const UNIT: &str = "bytes of replication offset";

/// A member's role as its own `INFO replication` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RedisRole {
    Master,
    #[default]
    Replica,
}

/// One `slaveN:` line of a master's `INFO replication`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnectedReplica {
    pub ip: String,
    pub port: u16,
    /// `online`, `wait_bgsave`, `send_bulk`, ...
    pub state: String,
    pub offset: u64,
}

/// The parts of `INFO replication` the engine reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Replication {
    pub role: RedisRole,
    /// A replica's master (`master_host`, `master_port`).
    pub master_host: Option<String>,
    pub master_port: Option<u16>,
    /// A replica's `master_link_status:up`.
    pub link_up: bool,
    /// A replica's `master_sync_in_progress:1` (a full resynchronisation is running).
    pub sync_in_progress: bool,
    pub master_repl_offset: Option<u64>,
    pub slave_repl_offset: Option<u64>,
    /// A master's `slaveN:` lines.
    pub replicas: Vec<ConnectedReplica>,
}

impl Replication {
    /// The member's own replication offset: the master's `master_repl_offset`, a replica's
    /// `slave_repl_offset`.
    pub fn offset(&self) -> Option<u64> {
        match self.role {
            RedisRole::Master => self.master_repl_offset,
            RedisRole::Replica => self.slave_repl_offset,
        }
    }
}

/// `key:value` lines of an `INFO` answer (section headers and blank lines skipped).
fn info_fields(text: &str) -> BTreeMap<&str, &str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .collect()
}

/// `a=1,b=x` into a map.
fn pairs(value: &str) -> BTreeMap<&str, &str> {
    value.split(',').filter_map(|p| p.split_once('=')).collect()
}

/// Parses `INFO replication`.
pub fn parse_replication(text: &str) -> Result<Replication, String> {
    let fields = info_fields(text);
    let role = match fields.get("role").copied() {
        Some("master") => RedisRole::Master,
        Some("slave") => RedisRole::Replica,
        Some(other) => return Err(format!("INFO replication: unknown role {other}")),
        None => return Err("INFO replication has no role line".to_string()),
    };
    let number = |key: &str| fields.get(key).and_then(|v| v.parse::<u64>().ok());
    let mut replicas: Vec<(u32, ConnectedReplica)> = fields
        .iter()
        .filter_map(|(k, v)| {
            let n = k.strip_prefix("slave")?.parse::<u32>().ok()?;
            let p = pairs(v);
            Some((
                n,
                ConnectedReplica {
                    ip: p.get("ip")?.to_string(),
                    port: p.get("port")?.parse().ok()?,
                    state: p.get("state").copied().unwrap_or("").to_string(),
                    offset: p.get("offset").and_then(|o| o.parse().ok()).unwrap_or(0),
                },
            ))
        })
        .collect();
    replicas.sort_by_key(|(n, _)| *n);
    Ok(Replication {
        role,
        master_host: fields.get("master_host").map(|h| h.to_string()),
        master_port: fields.get("master_port").and_then(|p| p.parse().ok()),
        link_up: fields.get("master_link_status") == Some(&"up"),
        sync_in_progress: fields.get("master_sync_in_progress") == Some(&"1"),
        master_repl_offset: number("master_repl_offset"),
        slave_repl_offset: number("slave_repl_offset"),
        replicas: replicas.into_iter().map(|(_, r)| r).collect(),
    })
}

/// Parses `INFO keyspace`: the key count of every database (`db0` → keys).
pub fn parse_keyspace(text: &str) -> BTreeMap<String, u64> {
    info_fields(text)
        .into_iter()
        .filter(|(k, _)| k.starts_with("db"))
        .filter_map(|(k, v)| Some((k.to_string(), pairs(v).get("keys")?.parse().ok()?)))
        .filter(|(_, keys)| *keys > 0)
        .collect()
}

/// What `SENTINEL CKQUORUM <name>` answered: OK with its words, or the error (`NOQUORUM`,
/// `NOMAJ`, an unknown master).
pub type Quorum = Result<String, String>;

pub use super::PodInfo;

/// What one member pod's Redis answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub pod: PodInfo,
    /// `<podIP>:<redisPort>`, when the pod has an IP.
    pub endpoint: Option<String>,
    pub replication: Result<Replication, String>,
}

/// What one Sentinel answered: beside a member, in its pod (the sidecar layout), or one of the
/// ready endpoints of `redisSentinel.sentinelService`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelView {
    /// Where it was asked (`<ip>:<port>`), or the member pod whose Sentinel has no address.
    pub at: String,
    /// The member pod it runs in, when it runs in one: that member is unhealthy while it does
    /// not answer.
    pub member: Option<String>,
    /// `get-master-addr-by-name`: `None` when it does not know the group.
    pub master: Result<Option<(String, u16)>, String>,
    pub quorum: Quorum,
}

impl SentinelView {
    /// How messages name it: its member pod's Sentinel, or the Sentinel at its address.
    fn label(&self) -> String {
        match &self.member {
            Some(pod) => format!("{pod}'s Sentinel"),
            None => format!("the Sentinel at {}", self.at),
        }
    }
}

/// Who the Sentinels say the master is: the pod, the address, or why there is none.
fn sentinel_master<'a>(
    views: &'a [MemberView],
    sentinels: &[SentinelView],
) -> Result<(Option<&'a PodInfo>, String), String> {
    let answers: Vec<(&SentinelView, &(String, u16))> = sentinels
        .iter()
        .filter_map(|s| match &s.master {
            Ok(Some(addr)) => Some((s, addr)),
            _ => None,
        })
        .collect();
    let Some((_, first)) = answers.first() else {
        let unknown = sentinels.iter().any(|s| matches!(s.master, Ok(None)));
        return Err(match unknown {
            true => "the Sentinels do not monitor the master group".to_string(),
            false => "no Sentinel answers".to_string(),
        });
    };
    if let Some((s, other)) = answers.iter().find(|(_, a)| a != first) {
        return Err(format!(
            "the Sentinels disagree on the master: {}:{} and, from {}, {}:{}",
            first.0,
            first.1,
            s.label(),
            other.0,
            other.1
        ));
    }
    let pod = views.iter().map(|v| &v.pod).find(|p| p.is(&first.0));
    Ok((pod, format!("{}:{}", first.0, first.1)))
}

/// Cluster-wide problems: the Sentinels' master unknown, disputed, not a member or not
/// agreeing with its own INFO; no quorum; more than one member saying `role:master`.
fn cluster_problems(
    views: &[MemberView],
    sentinels: &[SentinelView],
    master: &Result<(Option<&PodInfo>, String), String>,
) -> Vec<String> {
    let mut problems = Vec::new();
    match master {
        Err(e) => problems.push(e.clone()),
        Ok((None, addr)) => problems.push(format!(
            "the Sentinels name {addr} as the master, which is no member pod"
        )),
        Ok((Some(pod), addr)) => {
            let own = views.iter().find(|v| v.pod.name == pod.name);
            if let Some(Ok(r)) = own.map(|v| &v.replication)
                && r.role != RedisRole::Master
            {
                problems.push(format!(
                    "the Sentinels name {} ({addr}) as the master, but it reports role:slave",
                    pod.name
                ));
            }
        }
    }
    if !sentinels.iter().any(|s| s.quorum.is_ok()) {
        let why: Vec<String> = (sentinels.iter())
            .filter_map(|s| {
                s.quorum
                    .as_ref()
                    .err()
                    .map(|e| format!("{}: {e}", s.label()))
            })
            .collect();
        problems.push(format!(
            "no Sentinel reaches its quorum (SENTINEL CKQUORUM): {}",
            why.join("; ")
        ));
    }
    let masters: Vec<&str> = (views.iter())
        .filter(|v| matches!(&v.replication, Ok(r) if r.role == RedisRole::Master))
        .map(|v| v.pod.name.as_str())
        .collect();
    if masters.len() > 1 {
        problems.push(format!(
            "more than one member reports role:master: {}",
            masters.join(", ")
        ));
    }
    problems
}

/// Turns one look at the members and the Sentinels into a health report.
pub fn assess(views: &[MemberView], sentinels: &[SentinelView]) -> HealthReport {
    let master = sentinel_master(views, sentinels);
    let problems = cluster_problems(views, sentinels, &master);
    let master_pod = match &master {
        Ok((Some(p), _)) => Some(*p),
        _ => None,
    };
    let master_says_master = master_pod
        .and_then(|p| views.iter().find(|v| v.pod.name == p.name))
        .is_some_and(|v| matches!(&v.replication, Ok(r) if r.role == RedisRole::Master));
    let leader = master_pod.filter(|_| master_says_master);
    let mut members: Vec<MemberHealth> = (views.iter())
        .map(|v| member_health(v, leader, sentinels))
        .collect();
    members.sort_by(|a, b| ordinal_key(&a.pod).cmp(&ordinal_key(&b.pod)));
    HealthReport {
        leader: leader.map(|p| p.name.clone()),
        voting_members: None,
        replicas_for_writes: 0,
        members,
        problems,
    }
}

/// One member's health (see the module doc).
fn member_health(
    view: &MemberView,
    master: Option<&PodInfo>,
    sentinels: &[SentinelView],
) -> MemberHealth {
    let is_master = master.is_some_and(|m| m.name == view.pod.name);
    let mut why = Vec::new();
    if view.pod.terminating {
        why.push("pod is being deleted".to_string());
    }
    match &view.replication {
        Err(e) => why.push(match &view.endpoint {
            Some(ep) => format!("Redis does not answer at {ep}: {e}"),
            None => e.clone(),
        }),
        Ok(r) if !is_master => why.extend(replica_problems(r, master)),
        Ok(_) => {}
    }
    let own = sentinels
        .iter()
        .filter(|s| s.member.as_deref() == Some(view.pod.name.as_str()));
    for e in own.filter_map(|s| s.master.as_ref().err()) {
        why.push(format!("its Sentinel does not answer: {e}"));
    }
    let replication = view.replication.as_ref().ok();
    MemberHealth {
        pod: view.pod.name.clone(),
        healthy: why.is_empty(),
        leader: is_master,
        position: replication.and_then(Replication::offset),
        term: None,
        member_id: replication.and(view.endpoint.clone()),
        synchronous: false,
        problem: (!why.is_empty()).then(|| why.join("; ")),
        endpoint: view.endpoint.clone(),
    }
}

/// Why a member that is not the master does not replicate from it in sync.
fn replica_problems(r: &Replication, master: Option<&PodInfo>) -> Vec<String> {
    let mut why = Vec::new();
    if r.role == RedisRole::Master {
        why.push("reports role:master but is not the Sentinels' master".to_string());
        return why;
    }
    let host = r.master_host.as_deref().unwrap_or("(none)");
    if let Some(m) = master
        && !m.is(host)
    {
        why.push(format!(
            "replicates from {host}, not from the master {}",
            m.name
        ));
    }
    if !r.link_up {
        why.push("master_link_status is down".to_string());
    }
    if r.sync_in_progress {
        why.push("a full resynchronisation is in progress".to_string());
    }
    if r.slave_repl_offset.is_none() {
        why.push("reports no replication offset".to_string());
    }
    why
}

/// Does a Sentinel's `SENTINEL REPLICAS <name>` (each replica's fields as pairs) show the
/// steering the handover needs: `target` listed, up, with a non-zero `slave-priority`, and every
/// other listed replica that is one of `others` at priority 0? Sentinel reads priorities from
/// its replicas' `INFO` only every 10 s, so the handover waits for this before it pauses writes.
pub fn steered(
    replicas: &[BTreeMap<String, String>],
    target: &PodInfo,
    others: &[PodInfo],
) -> Result<(), String> {
    let field = |r: &BTreeMap<String, String>, k: &str| r.get(k).cloned().unwrap_or_default();
    let listed = |p: &PodInfo| {
        (replicas.iter())
            .filter(|r| p.is(&field(r, "ip")))
            .collect::<Vec<_>>()
    };
    let t = listed(target);
    let usable = t.iter().any(|r| {
        field(r, "slave-priority") != "0"
            && !field(r, "flags").contains("s_down")
            && !field(r, "flags").contains("disconnected")
    });
    if !usable {
        return Err(format!(
            "the Sentinel does not list {} as a usable replica yet",
            target.name
        ));
    }
    let unsteered: Vec<&str> = (others.iter())
        .filter(|o| listed(o).iter().any(|r| field(r, "slave-priority") != "0"))
        .map(|o| o.name.as_str())
        .collect();
    match unsteered.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "the Sentinel does not see replica-priority 0 on {} yet",
            unsteered.join(", ")
        )),
    }
}

/// What one member answered at the final check: its offset and key counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub pod: String,
    pub offset: Option<u64>,
    pub keys: Option<BTreeMap<String, u64>>,
}

/// The final check: the master's snapshot read before and after the replicas' (`before` and
/// `after` equal, so nothing was written in between: a quiet moment), and every replica at the
/// master's offset with the master's key count in every database. Otherwise why not yet (the
/// client polls, the planner asks again until the request's timeout).
pub fn agreed_offsets(
    before: &Snapshot,
    after: &Snapshot,
    replicas: &[Snapshot],
) -> Result<FinalHash, String> {
    let (Some(offset), Some(keys)) = (before.offset, before.keys.as_ref()) else {
        return Err(format!(
            "the master {} reports no replication offset or keyspace",
            before.pod
        ));
    };
    if before != after {
        return Err(format!(
            "the master {} was written to during the check (offset {offset} then {})",
            before.pod,
            after
                .offset
                .map_or("unknown".to_string(), |o| o.to_string())
        ));
    }
    let mut differ = Vec::new();
    for r in replicas {
        match (r.offset, r.keys.as_ref()) {
            (Some(o), _) if o != offset => differ.push(format!(
                "{} is at offset {o}, the master at {offset}",
                r.pod
            )),
            (Some(_), Some(k)) if k != keys => differ.push(format!(
                "{} has keys {}, the master {}",
                r.pod,
                keyspace(k),
                keyspace(keys)
            )),
            (Some(_), Some(_)) => {}
            _ => differ.push(format!("{} reports no offset or keyspace", r.pod)),
        }
    }
    if !differ.is_empty() {
        return Err(format!(
            "not every member agrees with the master {}: {}",
            before.pod,
            differ.join("; ")
        ));
    }
    let mut members = vec![before.pod.clone()];
    members.extend(replicas.iter().map(|r| r.pod.clone()));
    Ok(FinalHash {
        hash: format!("offset {offset}, keys {}", keyspace(keys)),
        members,
    })
}

/// Key counts as `db0=12 db3=4` (`none` for an empty dataset).
pub fn keyspace(keys: &BTreeMap<String, u64>) -> String {
    match keys.is_empty() {
        true => "none".to_string(),
        false => (keys.iter())
            .map(|(db, n)| format!("{db}={n}"))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// The rules of the `RedisSentinel` engine (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisRules {
    /// `spec.database.maxLagBytes`.
    pub max_lag: u64,
}

impl Default for RedisRules {
    fn default() -> Self {
        Self {
            max_lag: DEFAULT_MAX_LAG_BYTES,
        }
    }
}

/// The rules of a request with `engine: RedisSentinel`.
pub fn rules(spec: &DatabaseSpec) -> Box<dyn Rules> {
    Box::new(RedisRules {
        max_lag: spec.max_lag_bytes.unwrap_or(DEFAULT_MAX_LAG_BYTES),
    })
}

impl Rules for RedisRules {
    fn next_member(&self, report: &HealthReport, remaining: &[String]) -> Option<String> {
        followers_first(report, remaining)
    }

    fn gate_before_stop(&self, report: &HealthReport, pod: &str) -> Gate {
        let leader = match replicated_gate(report, pod, self.max_lag, UNIT) {
            Ok(leader) => leader,
            Err(wait) => return wait,
        };
        // Each member pod runs a Sentinel: a majority of them must stay up.
        if let Some(wait) = quorum_gate(report, pod) {
            return wait;
        }
        match leader == pod {
            true => Gate::TransferLeadershipFirst,
            false => Gate::Open,
        }
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
        Some(
            "a Sentinel failover to a replica within maxLagBytes, already migrated: writes \
             paused on the master until the replica has its offset, the other replicas' \
             replica-priority at 0, the old master made a replica of the new one; it stops once \
             it replicates from the new master",
        )
    }

    fn healthy_for_start(&self, report: &HealthReport) -> Result<(), String> {
        members_healthy_with_leader(report)
    }

    /// Denied whatever `apply` says: Redis and the Sentinels cannot be read (the Sentinel
    /// Service gives none included), or the group as a whole is wrong (no master the Sentinels
    /// agree on, no quorum, two masters). A member out of sync only waits (`apply: Always`) or
    /// is refused by `apply: IfReady` ([`Rules::healthy_for_start`]).
    fn preflight(&self, health: &Result<HealthReport, HealthUnavailable>) -> Result<(), String> {
        let report = match health {
            Err(e) => return Err(format!("Redis and its Sentinels cannot be read: {e}")),
            Ok(report) => report,
        };
        let mut wrong = report.problems.clone();
        if wrong.is_empty() && report.leader.is_none() {
            wrong.push("the Sentinels name no master".to_string());
        }
        match wrong.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "the Redis master group is not ready to migrate: {}",
                wrong.join("; ")
            )),
        }
    }

    fn final_check(&self) -> FinalCheckKind {
        FinalCheckKind::Agreement {
            what: "replication offset and key counts",
        }
    }
}

#[cfg(test)]
#[path = "redis_tests.rs"]
mod tests;
