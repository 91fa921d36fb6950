//! The ZooKeeper engine, pure: a ZooKeeper ensemble (3.8 or newer) read through the
//! four-letter words `srvr` and `mntr` on each member's client port (Debian's ZooKeeper runs
//! without the AdminServer). What the members answered, as plain text, is parsed here and
//! becomes a [`HealthReport`]; [`ZooKeeperRules`] decide on it. The client that asks lives in
//! `crate::cluster::database::zookeeper`.
//!
//! - **Facts.** A member is a pod; its `srvr` gives its mode (`leader`, `follower`,
//!   `observer`, `standalone`), its last zxid (the `position`; the epoch, `zxid >> 32`, is the
//!   `term`) and its znode count. Its `mntr` gives `zk_peer_state` (`following - broadcast`
//!   once a follower has synced with the leader) and, on the leader, `zk_synced_followers`.
//!   Observers do not vote: they have no member id and do not count towards the quorum.
//! - **Healthy**: the leader answers as leader; a follower or an observer answers in
//!   `broadcast` (synced). (A follower's zxid is the last transaction it applied: until the
//!   first write of a new epoch it shows the previous epoch, so epochs are not compared.)
//!   Cluster-wide, exactly one member leads and it
//!   counts every other voting member as a synced follower (`zk_synced_followers` =
//!   voting members − 1): ZooKeeper's `ruok` answers `imok` long before that.
//! - **Order**: followers first in ordinal order, the leader last.
//! - **Stop gate**: a leader exists, every member is healthy (every other voting member a
//!   synced follower), and stopping this member leaves a majority of the voting members up.
//!   The leader gets no handover (ZooKeeper moves leadership only through dynamic
//!   reconfiguration, off by default): it stops last, as ZooKeeper's own rolling restarts do,
//!   and the ensemble elects a new leader.
//! - **Rejoin**: the member answers as a synced follower (or leader) and the leader counts
//!   every other voting member synced again.
//! - **Final check**: every member serves the same last zxid and znode count
//!   ([`agreed_state`]). A zxid whose counter is 0 (`epoch << 32`: a member that joined a new
//!   epoch in which nothing was written yet, e.g. every member right after an election) names no
//!   transaction: such a member must be in a later epoch than the last transaction the others
//!   show, and serve the same znode count.

use std::collections::BTreeMap;
use std::fmt;

use super::{
    FinalCheckKind, FinalHash, Gate, HealthReport, HealthUnavailable, MemberHealth, Rules,
    leader_agreed, member, members_gate, members_healthy_with_leader, ordinal_key, quorum_gate,
    returned_gate, unhealthy_members,
};
use crate::api::{DatabaseSpec, ZooKeeperHandover};

/// The zoo.cfg setting that must list the words the engine asks.
pub const WHITELIST_SETTING: &str = "4lw.commands.whitelist=srvr,mntr,ruok";
const STANDALONE: &str = "runs standalone";
/// The zoo.cfg setting `handover: Reconfig` needs; the problem of an ensemble without it names
/// it.
pub const RECONFIG_SETTING: &str = "reconfigEnabled=true";
/// `zk_peer_state` of a learner that has synced with its leader.
const BROADCAST: &str = "broadcast";

/// A member's role as `srvr` reports it (`Mode:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Leader,
    Follower,
    Observer,
    /// A single server, not an ensemble.
    Standalone,
    /// `read-only` and anything else.
    Other(String),
}

impl Mode {
    fn parse(text: &str) -> Mode {
        match text {
            "leader" => Mode::Leader,
            "follower" => Mode::Follower,
            "observer" => Mode::Observer,
            "standalone" => Mode::Standalone,
            other => Mode::Other(other.to_string()),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Leader => f.write_str("leader"),
            Mode::Follower => f.write_str("follower"),
            Mode::Observer => f.write_str("observer"),
            Mode::Standalone => f.write_str("standalone"),
            Mode::Other(m) => f.write_str(m),
        }
    }
}

/// What a member's `srvr` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Srvr {
    pub mode: Mode,
    /// The last zxid the member has applied.
    pub zxid: u64,
    /// `Node count:`: znodes in its data tree.
    pub node_count: Option<u64>,
}

/// What a member's `mntr` says: its `key<TAB>value` lines.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Mntr(pub BTreeMap<String, String>);

impl Mntr {
    fn number(&self, key: &str) -> Option<u64> {
        self.0.get(key).and_then(|v| v.trim().parse().ok())
    }

    /// `zk_peer_state`, e.g. `following - broadcast`, `leading - broadcast`,
    /// `following - synchronization`, `looking`.
    pub fn peer_state(&self) -> Option<&str> {
        self.0.get("zk_peer_state").map(String::as_str)
    }

    /// The leader's `zk_synced_followers`: voting followers in sync with it.
    pub fn synced_followers(&self) -> Option<u64> {
        self.number("zk_synced_followers")
    }

    /// `zk_quorum_size`: the ensemble's voting members.
    pub fn quorum_size(&self) -> Option<u64> {
        self.number("zk_quorum_size")
    }

    /// `zk_znode_count`.
    pub fn znode_count(&self) -> Option<u64> {
        self.number("zk_znode_count")
    }
}

/// Why a four-letter word gave no usable answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The word is not in `4lw.commands.whitelist`.
    #[error(
        "refuses the four-letter word {word}: it is not in the whitelist; add it to zoo.cfg \
         ({WHITELIST_SETTING})"
    )]
    NotWhitelisted { word: String },
    /// The server runs but does not serve (no quorum, electing, or syncing).
    #[error("is not serving requests (electing a leader, or not yet synced with one)")]
    NotServing,
    /// No answer at all (connection refused, timeout...).
    #[error("does not answer {word} at {endpoint}: {message}")]
    NoAnswer {
        word: String,
        endpoint: String,
        message: String,
    },
    /// An answer the engine cannot read.
    #[error("answered {word} with something unexpected: {first_line}")]
    Malformed { word: String, first_line: String },
}

/// The common refusals in an answer's text, before the word's own parsing.
fn refusal(word: &str, text: &str) -> Option<Refusal> {
    if text.contains("is not executed because it is not in the whitelist") {
        return Some(Refusal::NotWhitelisted {
            word: word.to_string(),
        });
    }
    text.contains("not currently serving requests")
        .then_some(Refusal::NotServing)
}

fn malformed(word: &str, text: &str) -> Refusal {
    Refusal::Malformed {
        word: word.to_string(),
        first_line: text
            .lines()
            .next()
            .unwrap_or("(empty)")
            .chars()
            .take(200)
            .collect(),
    }
}

/// Parses the answer to `srvr`.
pub fn parse_srvr(text: &str) -> Result<Srvr, Refusal> {
    if let Some(r) = refusal("srvr", text) {
        return Err(r);
    }
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim())
    };
    let zxid =
        field("Zxid:").and_then(|z| u64::from_str_radix(z.trim_start_matches("0x"), 16).ok());
    let mode = field("Mode:").map(Mode::parse);
    let node_count = field("Node count:").and_then(|n| n.parse().ok());
    match (mode, zxid) {
        (Some(mode), Some(zxid)) => Ok(Srvr {
            mode,
            zxid,
            node_count,
        }),
        _ => Err(malformed("srvr", text)),
    }
}

/// Parses the answer to `mntr` (`key<TAB>value` lines).
pub fn parse_mntr(text: &str) -> Result<Mntr, Refusal> {
    if let Some(r) = refusal("mntr", text) {
        return Err(r);
    }
    let values: BTreeMap<String, String> = text
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    if !values.contains_key("zk_server_state") {
        return Err(malformed("mntr", text));
    }
    Ok(Mntr(values))
}

/// A member pod as the engine sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodInfo {
    pub name: String,
    pub terminating: bool,
}

/// What one pod answered: `srvr` and `mntr`, parsed, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub pod: PodInfo,
    /// `<podIP>:<clientPort>`, when the pod has an IP.
    pub endpoint: Option<String>,
    pub srvr: Result<Srvr, Refusal>,
    pub mntr: Result<Mntr, Refusal>,
}

/// The epoch of a zxid (its high 32 bits).
pub fn epoch(zxid: u64) -> u64 {
    zxid >> 32
}

/// A zxid as ZooKeeper writes it (`0x100000002`).
pub fn hex(zxid: u64) -> String {
    format!("0x{zxid:x}")
}

fn mode_of(v: &MemberView) -> Option<&Mode> {
    v.srvr.as_ref().ok().map(|s| &s.mode)
}

/// Turns one look at the members into a health report.
pub fn assess(views: &[MemberView]) -> HealthReport {
    let leaders: Vec<&MemberView> = (views.iter())
        .filter(|v| mode_of(v) == Some(&Mode::Leader))
        .collect();
    let leader = (leaders.len() == 1).then(|| leaders[0]);
    // The leader's `zk_quorum_size` is the ensemble's voting membership; without it, every pod
    // that does not answer as an observer is counted as a voter.
    let voting = leader
        .and_then(|l| l.mntr.as_ref().ok())
        .and_then(|m| m.quorum_size())
        .map(|n| n as usize)
        .unwrap_or_else(|| {
            (views.iter())
                .filter(|v| mode_of(v) != Some(&Mode::Observer))
                .count()
        });
    let mut problems = Vec::new();
    match leaders.as_slice() {
        [] => problems.push(
            "no member answers as leader (an election is under way, or the ensemble has lost \
             its quorum)"
                .to_string(),
        ),
        [one] => problems.extend(synced_problem(one, voting)),
        many => problems.push(format!(
            "more than one member answers as leader: {}",
            many.iter()
                .map(|v| v.pod.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
    let mut members: Vec<MemberHealth> = views.iter().map(member_health).collect();
    members.sort_by(|a, b| ordinal_key(&a.pod).cmp(&ordinal_key(&b.pod)));
    HealthReport {
        members,
        leader: leader.map(|l| l.pod.name.clone()),
        problems,
        voting_members: Some(voting),
        replicas_for_writes: 0,
    }
}

/// The leader must count every other voting member as a synced follower.
fn synced_problem(leader: &MemberView, voting: usize) -> Option<String> {
    let name = &leader.pod.name;
    let expected = voting.saturating_sub(1) as u64;
    match leader.mntr.as_ref().map(Mntr::synced_followers) {
        Err(e) => Some(format!(
            "the leader {name}'s synced followers are unknown: it {e}"
        )),
        Ok(None) => Some(format!(
            "the leader {name}'s mntr has no zk_synced_followers"
        )),
        Ok(Some(synced)) if synced < expected => Some(format!(
            "the leader {name} counts {synced} synced follower(s); the ensemble's {voting} \
             voting members need {expected}"
        )),
        Ok(Some(_)) => None,
    }
}

/// One pod's health (see the module doc).
fn member_health(v: &MemberView) -> MemberHealth {
    let mut why = Vec::new();
    if v.endpoint.is_none() {
        why.push("the pod has no IP".to_string());
    }
    if v.pod.terminating {
        why.push("pod is being deleted".to_string());
    }
    let srvr = match &v.srvr {
        Ok(s) => Some(s),
        Err(e) => {
            why.push(e.to_string());
            None
        }
    };
    if let Some(s) = srvr {
        why.extend(role_problems(v, s));
    }
    let observer = srvr.is_some_and(|s| s.mode == Mode::Observer);
    MemberHealth {
        pod: v.pod.name.clone(),
        healthy: why.is_empty(),
        leader: srvr.is_some_and(|s| s.mode == Mode::Leader),
        position: srvr.map(|s| s.zxid),
        term: srvr.map(|s| epoch(s.zxid)),
        member_id: (!observer).then(|| v.pod.name.clone()),
        synchronous: false,
        problem: (!why.is_empty()).then(|| why.join("; ")),
        endpoint: v.endpoint.clone(),
    }
}

/// Why a member that answered `srvr` is not a synced member of the ensemble.
fn role_problems(v: &MemberView, s: &Srvr) -> Vec<String> {
    match &s.mode {
        Mode::Leader => return Vec::new(),
        Mode::Follower | Mode::Observer => {}
        Mode::Standalone => {
            return vec![format!(
                "{STANDALONE}, not in an ensemble: nothing would serve while it moves"
            )];
        }
        other => {
            return vec![format!(
                "is in mode {other}, not leader, follower or observer"
            )];
        }
    }
    let mut why = Vec::new();
    match v.mntr.as_ref().map(|m| m.peer_state()) {
        Err(e) => why.push(format!("its sync state is unknown: it {e}")),
        Ok(None) => why.push("its mntr has no zk_peer_state".to_string()),
        Ok(Some(state)) if !state.ends_with(BROADCAST) => why.push(format!(
            "is not synced with the leader (peer state {state})"
        )),
        Ok(Some(_)) => {}
    }
    why
}

/// One member's answer for the final check: its last zxid and its znode count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServedState {
    pub zxid: u64,
    pub znodes: u64,
}

impl ServedState {
    /// The zxid names a transaction; `epoch << 32` (counter 0) only says the member has joined
    /// that epoch, in which nothing has been written yet (its last transaction is in an earlier
    /// epoch, and `srvr` does not say which).
    fn names_a_transaction(&self) -> bool {
        self.zxid & 0xffff_ffff != 0
    }
}

/// The final check: every member's state read at one moment. Ok when all serve the same znode
/// count, every zxid that names a transaction is the same one, and every member showing only an
/// epoch (counter 0) is in a later epoch than that transaction; otherwise why not (the client
/// reads again).
pub fn agreed_state(
    answers: &[(String, Result<ServedState, String>)],
) -> Result<FinalHash, String> {
    let failed: Vec<String> = (answers.iter())
        .filter_map(|(pod, a)| a.as_ref().err().map(|e| format!("{pod}: {e}")))
        .collect();
    if !failed.is_empty() {
        return Err(format!("not every member answered: {}", failed.join("; ")));
    }
    let states: Vec<(&str, ServedState)> = (answers.iter())
        .filter_map(|(pod, a)| a.as_ref().ok().map(|s| (pod.as_str(), *s)))
        .collect();
    let Some((_, first)) = states.first() else {
        return Err("no member pod to compare".to_string());
    };
    let last_txn = (states.iter())
        .filter(|(_, s)| s.names_a_transaction())
        .map(|(_, s)| s.zxid)
        .max();
    let agreed = states.iter().all(|(_, s)| {
        s.znodes == first.znodes
            && match (s.names_a_transaction(), last_txn) {
                (true, txn) => Some(s.zxid) == txn,
                (false, Some(txn)) => epoch(s.zxid) > epoch(txn),
                (false, None) => true,
            }
    });
    if !agreed {
        return Err(format!(
            "the members do not serve the same state yet: {}",
            (states.iter())
                .map(|(p, s)| format!("{p} at zxid {}, {} znodes", hex(s.zxid), s.znodes))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    let at = match last_txn {
        Some(txn) => format!("zxid {}", hex(txn)),
        None => format!(
            "epoch {}",
            states.iter().map(|(_, s)| epoch(s.zxid)).max().unwrap_or(0)
        ),
    };
    Ok(FinalHash {
        hash: format!("{at}, {} znodes", first.znodes),
        members: states.iter().map(|(p, _)| p.to_string()).collect(),
    })
}

/// The rules of the `ZooKeeper` engine (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ZooKeeperRules {
    /// How the leader's leadership moves (`spec.database.zookeeper.handover`).
    pub handover: ZooKeeperHandover,
}

/// The rules of a request with `engine: ZooKeeper`.
pub fn rules(spec: &DatabaseSpec) -> Box<dyn Rules> {
    Box::new(ZooKeeperRules {
        handover: spec
            .zookeeper
            .as_ref()
            .map(|z| z.handover)
            .unwrap_or_default(),
    })
}

impl Rules for ZooKeeperRules {
    fn gate_before_stop(&self, report: &HealthReport, pod: &str) -> Gate {
        if let Err(wait) = leader_agreed(report) {
            return wait;
        }
        // Name the members that are not synced first: the leader's count only says how many.
        let not_synced = unhealthy_members(report);
        if !not_synced.is_empty() {
            let mut why = not_synced;
            why.extend(report.problems.iter().cloned());
            return Gate::Wait(format!(
                "not every member is a synced member of the ensemble: {}",
                why.join("; ")
            ));
        }
        if let Some(wait) = members_gate(report, pod) {
            return wait;
        }
        // With `Reconfig` the leader hands over first; else it stops last, without a handover,
        // and the ensemble elects another.
        if self.handover == ZooKeeperHandover::Reconfig && report.leader.as_deref() == Some(pod) {
            return Gate::TransferLeadershipFirst;
        }
        quorum_gate(report, pod).unwrap_or(Gate::Open)
    }

    /// A synced voting member other than `stopping`, preferring a migrated one, then ordinal
    /// order. ZooKeeper designates the new leader itself, among the voters that acknowledged
    /// the reconfiguration: this is the member the operator expects, not one it can impose.
    fn handover_target(
        &self,
        report: &HealthReport,
        stopping: &str,
        migrated: &[String],
    ) -> Option<String> {
        if self.handover != ZooKeeperHandover::Reconfig {
            return None;
        }
        (report.members.iter())
            .filter(|m| m.pod != stopping && m.healthy && m.member_id.is_some())
            .min_by_key(|m| (!migrated.contains(&m.pod), ordinal_key(&m.pod)))
            .map(|m| m.pod.clone())
    }

    /// With `Reconfig`, the handover ends only once the old leader votes again: a member that
    /// still answers as an observer (a handover cut short between its two reconfigurations)
    /// is handed over again, which makes it a participant.
    fn handed_over(&self, report: &HealthReport, from: &str) -> bool {
        self.handover != ZooKeeperHandover::Reconfig
            || member(report, from).is_none_or(|m| m.member_id.is_some())
    }

    fn gate_after_return(&self, report: &HealthReport, pod: &str) -> Gate {
        if let Some(wait) = returned_gate(report, pod) {
            return wait;
        }
        match leader_agreed(report) {
            Ok(_) => Gate::Open,
            Err(wait) => wait,
        }
    }

    fn healthy_for_start(&self, report: &HealthReport) -> Result<(), String> {
        members_healthy_with_leader(report)
    }

    /// Denied whatever `apply` says: the members cannot be read, a member refuses the words
    /// (the whitelist), or runs standalone, or `handover: Reconfig` meets an ensemble without
    /// [`RECONFIG_SETTING`] (the client's problem). A member out of sync only waits (`apply:
    /// Always`) or is refused by `apply: IfReady` ([`Rules::healthy_for_start`]).
    fn preflight(&self, health: &Result<HealthReport, HealthUnavailable>) -> Result<(), String> {
        let report = match health {
            Err(e) => return Err(format!("the ZooKeeper members cannot be read: {e}")),
            Ok(report) => report,
        };
        let mut refused: Vec<String> = (report.members.iter())
            .filter_map(|m| Some((m, m.problem.as_deref()?)))
            .filter(|(_, p)| p.contains(WHITELIST_SETTING) || p.contains(STANDALONE))
            .map(|(m, p)| format!("{}: {p}", m.pod))
            .collect();
        refused.extend(
            (report.problems.iter())
                .filter(|p| p.contains(RECONFIG_SETTING))
                .cloned(),
        );
        match refused.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "the ZooKeeper ensemble cannot be migrated as it is: {}",
                refused.join("; ")
            )),
        }
    }

    fn handover(&self) -> Option<&'static str> {
        Some(match self.handover {
            ZooKeeperHandover::Election => {
                "no handover (ZooKeeper moves leadership only by dynamic reconfiguration): the \
                 other members, migrated and synced, elect a new leader when it stops"
            }
            ZooKeeperHandover::Reconfig => {
                "a reconfiguration: the leader made an observer (ZooKeeper hands leadership to \
                 a synced voter it designates, without an election), then a participant again, \
                 before it stops"
            }
        })
    }

    fn final_check(&self) -> FinalCheckKind {
        FinalCheckKind::Agreement {
            what: "last zxid and znode count",
        }
    }
}

/// A server's role in the ensemble's configuration (`/zookeeper/config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerRole {
    Participant,
    Observer,
}

impl fmt::Display for ServerRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ServerRole::Participant => "participant",
            ServerRole::Observer => "observer",
        })
    }
}

/// One `server.N=` line of the ensemble's configuration:
/// `host:quorumPort:electionPort[:role][;[clientAddress:]clientPort]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLine {
    pub id: u64,
    /// The host as written (an IPv6 address in brackets).
    host: String,
    quorum_port: String,
    election_port: String,
    pub role: ServerRole,
    /// After `;`, as written.
    client: Option<String>,
}

impl ServerLine {
    fn parse(id: u64, spec: &str) -> Result<ServerLine, String> {
        let bad = |why: &str| format!("server.{id}={spec}: {why}");
        if spec.contains('|') {
            return Err(bad("a server with several addresses is not supported"));
        }
        let (left, client) = match spec.split_once(';') {
            Some((l, c)) => (l, Some(c.trim().to_string())),
            None => (spec, None),
        };
        let (host, rest) = match left.strip_prefix('[') {
            Some(v6) => v6.split_once("]:").map(|(h, r)| (format!("[{h}]"), r)),
            None => left.split_once(':').map(|(h, r)| (h.to_string(), r)),
        }
        .ok_or_else(|| bad("no ports"))?;
        let parts: Vec<&str> = rest.split(':').map(str::trim).collect();
        let role = match parts.get(2).copied() {
            None | Some("participant") => ServerRole::Participant,
            Some("observer") => ServerRole::Observer,
            Some(other) => return Err(bad(&format!("unknown role {other}"))),
        };
        match (parts.first(), parts.get(1), parts.len()) {
            (Some(q), Some(e), 2 | 3) => Ok(ServerLine {
                id,
                host: host.trim().to_string(),
                quorum_port: q.to_string(),
                election_port: e.to_string(),
                role,
                client: client.filter(|c| !c.is_empty()),
            }),
            _ => Err(bad("expected host:quorumPort:electionPort[:role]")),
        }
    }

    /// Whether this line names the pod `pod` (its host name, `pod` or `pod.<service>...`) or
    /// its IP `ip`.
    pub fn names(&self, pod: &str, ip: Option<&str>) -> bool {
        let host = self.host.trim_start_matches('[').trim_end_matches(']');
        host == pod
            || host.strip_prefix(pod).is_some_and(|r| r.starts_with('.'))
            || ip.is_some_and(|ip| ip == host)
    }

    /// The line with role `role`, for an incremental `reconfig` (which needs the client port:
    /// `client_port` when the line has none).
    pub fn with_role(&self, role: ServerRole, client_port: u16) -> String {
        let client = (self.client.clone()).unwrap_or_else(|| client_port.to_string());
        format!(
            "server.{}={}:{}:{}:{role};{client}",
            self.id, self.host, self.quorum_port, self.election_port
        )
    }
}

/// The ensemble's configuration as `/zookeeper/config` serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsembleConfig {
    /// `version=` (hex), the precondition of the next `reconfig`.
    pub version: i64,
    pub servers: Vec<ServerLine>,
}

impl EnsembleConfig {
    /// Parses `server.N=...` lines and `version=<hex>`; other lines are ignored.
    pub fn parse(text: &str) -> Result<EnsembleConfig, String> {
        let mut version = None;
        let mut servers = Vec::new();
        for line in text.lines().map(str::trim) {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            if key == "version" {
                version = Some(i64::from_str_radix(value.trim(), 16).map_err(|e| {
                    format!("/zookeeper/config: version={value} is not hexadecimal: {e}")
                })?);
            } else if let Some(id) = key.strip_prefix("server.") {
                let id = (id.parse::<u64>())
                    .map_err(|e| format!("/zookeeper/config: {key} is not server.<id>: {e}"))?;
                servers.push(ServerLine::parse(id, value.trim())?);
            }
        }
        let version = version.ok_or("/zookeeper/config has no version= line")?;
        Ok(EnsembleConfig { version, servers })
    }

    /// The one server line naming `pod` (or its IP); an error names what matched.
    pub fn server_of(&self, pod: &str, ip: Option<&str>) -> Result<&ServerLine, String> {
        let found: Vec<&ServerLine> = (self.servers.iter()).filter(|s| s.names(pod, ip)).collect();
        match found.as_slice() {
            [one] => Ok(one),
            [] => Err(format!(
                "no server in /zookeeper/config is the pod {pod} (by its host name, or its IP \
                 {})",
                ip.unwrap_or("unknown")
            )),
            many => Err(format!(
                "several servers in /zookeeper/config are the pod {pod}: {}",
                (many.iter())
                    .map(|s| format!("server.{}", s.id))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

/// What a handover by reconfiguration does next, from what the leader `from` is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReconfigStep {
    /// `from` leads as a participant: make it an observer (ZooKeeper designates a new leader).
    MakeObserver,
    /// `from` is an observer under another leader: make it a participant again.
    MakeParticipant,
    /// Not yet (no other leader yet, or `from` not following yet): look again.
    Wait(String),
    /// `from` is a participant again and another member leads.
    Done,
}

/// The next step of a handover by reconfiguration: `role` is `from`'s role in the
/// configuration, `mode` what its `srvr` answers, `other_leader` the member that leads if not
/// `from`.
pub fn reconfig_step(
    role: ServerRole,
    mode: Option<&Mode>,
    other_leader: Option<&str>,
) -> ReconfigStep {
    match (role, mode, other_leader) {
        (ServerRole::Participant, Some(Mode::Leader), _) => ReconfigStep::MakeObserver,
        (ServerRole::Observer, _, Some(_)) => ReconfigStep::MakeParticipant,
        (ServerRole::Observer, _, None) => {
            ReconfigStep::Wait("no other member leads yet".to_string())
        }
        (ServerRole::Participant, Some(Mode::Follower), Some(_)) => ReconfigStep::Done,
        (ServerRole::Participant, mode, leader) => ReconfigStep::Wait(format!(
            "it answers {}; {}",
            mode.map_or("nothing".to_string(), |m| format!("mode {m}")),
            leader.map_or("no member leads".to_string(), |l| format!("{l} leads"))
        )),
    }
}

#[cfg(test)]
#[path = "zookeeper_tests.rs"]
mod tests;
