//! The etcd engine: Raft-aware health, leader, lag, alarms and leadership transfer.
//!
//! Split in two: a thin I/O layer ([`Etcd`]) asks every member on its own endpoint
//! (`http(s)://<podIP>:<clientPort>`, one client per endpoint, no cluster DNS) for `status`,
//! `member list` and `alarm list`, and records the answers as plain data ([`MemberView`]);
//! [`assess`] turns those views into a [`HealthReport`] (member-to-pod mapping, leader agreement,
//! problems). The logic is tested on hand-built views.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{ConstantBuilder, Retryable};
use etcd_client::{
    AlarmAction, AlarmType, Certificate, Client, ConnectOptions, Identity, TlsOptions,
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use tracing::{debug, info, instrument, warn};

use super::{EngineError, HealthReport, MemberHealth, ordinal_key};
use crate::api::EtcdSpec;

/// Bound on establishing a connection to one member.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on one request to one member.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on MoveLeader (the server waits for the transfer, up to about an election timeout).
const MOVE_LEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How often, and how many times, to look for the new leader after a transfer.
const LEADER_POLL: Duration = Duration::from_millis(200);
const LEADER_POLLS: usize = 75;

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

    /// `<hostname>.<subdomain>` when both are set.
    fn dns_prefix(&self) -> Option<String> {
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

fn hex(id: u64) -> String {
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
    let pod_of = |id: u64| by_id.get(&id).cloned();
    let id_of = |pod: &str| by_id.iter().find(|(_, p)| *p == pod).map(|(id, _)| *id);

    // Members without a pod, learners.
    for m in &list {
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
    // Cluster ids.
    let cluster_ids: BTreeSet<u64> = views
        .iter()
        .filter_map(|v| v.status.as_ref().ok().map(|s| s.cluster_id))
        .collect();
    if cluster_ids.len() > 1 {
        let ids: Vec<String> = cluster_ids.iter().map(|i| hex(*i)).collect();
        problems.push(format!(
            "members belong to different etcd clusters: {}",
            ids.join(", ")
        ));
    }
    // Alarms (cluster-wide list, from every member that answered).
    let alarms: BTreeSet<(u64, String)> = views
        .iter()
        .filter_map(|v| v.alarms.as_ref().ok())
        .flatten()
        .map(|a| (a.member_id, a.alarm.clone()))
        .collect();
    for (id, alarm) in &alarms {
        let who = pod_of(*id).unwrap_or_else(|| format!("member id {}", hex(*id)));
        problems.push(format!("alarm {alarm} raised on {who}"));
    }
    // Leader agreement.
    let seen: Vec<(&str, u64)> = views
        .iter()
        .filter_map(|v| v.status.as_ref().ok().map(|s| (v.pod.as_str(), s.leader)))
        .filter(|(_, l)| *l != 0)
        .collect();
    let leader_ids: BTreeSet<u64> = seen.iter().map(|(_, l)| *l).collect();
    let name = |id: u64| pod_of(id).unwrap_or_else(|| format!("id {}", hex(id)));
    let leader = match leader_ids.len() {
        0 => {
            if views.iter().any(|v| v.status.is_ok()) {
                problems.push(
                    "no member knows a leader (election in progress or quorum lost)".to_string(),
                );
            }
            None
        }
        1 => {
            let id = *leader_ids.first().unwrap_or(&0);
            let p = pod_of(id);
            if p.is_none() {
                problems.push(format!("the leader (id {}) matches no pod", hex(id)));
            }
            p
        }
        _ => {
            let parts: Vec<String> = seen
                .iter()
                .map(|(pod, l)| format!("{pod} sees {}", name(*l)))
                .collect();
            problems.push(format!(
                "members disagree on the leader: {}",
                parts.join(", ")
            ));
            None
        }
    };

    let mut members: Vec<MemberHealth> = pods
        .iter()
        .zip(views)
        .map(|(pod, view)| {
            let id = id_of(&pod.name);
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
                if s.is_learner {
                    why.push("is a learner".to_string());
                }
                if s.leader == 0 {
                    why.push("sees no leader".to_string());
                }
                if !s.errors.is_empty() {
                    why.push(format!("reports errors: {}", s.errors.join(", ")));
                }
            }
            if id.is_none() && !list.is_empty() {
                why.push("is not in the etcd member list".to_string());
                problems.push(format!("pod {} is not an etcd member", pod.name));
            }
            if let Some(id) = id {
                for (_, alarm) in alarms.iter().filter(|(a, _)| *a == id) {
                    why.push(format!("alarm {alarm}"));
                }
            }
            let raft_index = status.map(|s| {
                if s.raft_applied_index > 0 {
                    s.raft_applied_index
                } else {
                    s.raft_index
                }
            });
            MemberHealth {
                pod: pod.name.clone(),
                healthy: why.is_empty(),
                leader: leader.as_deref() == Some(pod.name.as_str()),
                raft_index,
                raft_term: status.map(|s| s.raft_term),
                member_id: id.map(hex),
                problem: (!why.is_empty()).then(|| why.join("; ")),
                endpoint: view.endpoint.clone(),
            }
        })
        .collect();
    members.sort_by(|a, b| ordinal_key(&a.pod).cmp(&ordinal_key(&b.pod)));
    let voting = list.iter().filter(|m| !m.is_learner).count();
    HealthReport {
        members,
        leader,
        problems,
        voting_members: (!list.is_empty()).then_some(voting),
        quorum_based: true,
    }
}

/// Client TLS material read from the request's Secret.
#[derive(Clone)]
struct TlsMaterial {
    ca: Vec<u8>,
    /// Client certificate and key (PEM), when the Secret has them.
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// The etcd engine of one request.
#[derive(Clone)]
pub struct Etcd {
    client_port: u16,
    tls: Option<TlsMaterial>,
    auth: Option<(String, String)>,
    /// Endpoint URL → name the member's server certificate is checked against (TLS), learned
    /// by `observe`, so later calls given only a report's endpoints verify the same name.
    tls_names: Arc<Mutex<BTreeMap<String, String>>>,
}

impl fmt::Debug for Etcd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Etcd")
            .field("client_port", &self.client_port)
            .field("tls", &self.tls.is_some())
            .field("auth_user", &self.auth.as_ref().map(|(u, _)| u))
            .finish()
    }
}

/// A connection target: one member pod.
struct Target {
    pod: String,
    url: String,
}

fn secret_bytes(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| v.0.clone())
}

fn required(secret: &Secret, name: &str, key: &str) -> Result<Vec<u8>, EngineError> {
    secret_bytes(secret, key).ok_or_else(|| EngineError::Secret {
        name: name.to_string(),
        message: format!("key {key} is missing"),
    })
}

/// An etcd client error in one line: for gRPC errors the status message, its code and the
/// innermost cause (e.g. `tcp connect error (Unavailable): deadline has elapsed`).
fn describe(e: &etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            let mut text = format!("{} ({:?})", status.message(), status.code());
            let mut cause = std::error::Error::source(status);
            let mut innermost = None;
            while let Some(c) = cause {
                innermost = Some(c);
                cause = c.source();
            }
            if let Some(c) = innermost {
                let c = c.to_string();
                if !c.is_empty() && !text.contains(&c) {
                    text = format!("{text}: {c}");
                }
            }
            text
        }
        other => other.to_string(),
    }
}

/// Bounds one request (beyond the client's own timeout, which does not cover waiting for a
/// connection) and turns its error into words.
async fn bounded<T>(
    limit: Duration,
    f: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(describe(&e)),
        Err(_) => Err(format!("no answer within {} ms", limit.as_millis())),
    }
}

fn status_view(s: &etcd_client::StatusResponse) -> StatusView {
    let header = s.header();
    StatusView {
        cluster_id: header.map_or(0, |h| h.cluster_id()),
        member_id: header.map_or(0, |h| h.member_id()),
        leader: s.leader(),
        raft_index: s.raft_index(),
        raft_applied_index: s.raft_applied_index(),
        raft_term: s.raft_term(),
        is_learner: s.is_learner(),
        errors: s.errors().to_vec(),
        revision: header.map_or(0, |h| h.revision()),
    }
}

fn member_info(m: &etcd_client::Member) -> MemberInfo {
    MemberInfo {
        id: m.id(),
        name: m.name().to_string(),
        peer_urls: m.peer_urls().to_vec(),
        client_urls: m.client_urls().to_vec(),
        is_learner: m.is_learner(),
    }
}

fn alarm_infos(r: &etcd_client::AlarmResponse) -> Vec<AlarmInfo> {
    r.alarms()
        .iter()
        .filter(|a| a.alarm() != AlarmType::None)
        .map(|a| AlarmInfo {
            member_id: a.member_id(),
            alarm: a.alarm().as_str_name().to_string(),
        })
        .collect()
}

impl Etcd {
    /// An engine without TLS or auth.
    pub fn new(client_port: u16) -> Self {
        Self {
            client_port,
            tls: None,
            auth: None,
            tls_names: Arc::default(),
        }
    }

    /// Reads the Secrets the spec names, in the request's namespace: TLS `ca.crt` (required)
    /// with `tls.crt` + `tls.key` (both or neither); auth `username` + `password`.
    pub async fn from_spec(
        client: &kube::Client,
        namespace: &str,
        spec: Option<&EtcdSpec>,
    ) -> Result<Self, EngineError> {
        let spec = spec.cloned().unwrap_or_default();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let read = |name: String| {
            let secrets = secrets.clone();
            async move {
                match secrets.get(&name).await {
                    Ok(s) => Ok((name, s)),
                    Err(e) => Err(EngineError::Secret {
                        name,
                        message: e.to_string(),
                    }),
                }
            }
        };
        let tls = match spec.tls_secret_name {
            None => None,
            Some(name) => {
                let (name, s) = read(name).await?;
                let ca = required(&s, &name, "ca.crt")?;
                let identity = match (secret_bytes(&s, "tls.crt"), secret_bytes(&s, "tls.key")) {
                    (Some(c), Some(k)) => Some((c, k)),
                    (None, None) => None,
                    _ => {
                        return Err(EngineError::Secret {
                            name,
                            message: "tls.crt and tls.key must be both present or both absent"
                                .to_string(),
                        });
                    }
                };
                Some(TlsMaterial { ca, identity })
            }
        };
        let auth = match spec.auth_secret_name {
            None => None,
            Some(name) => {
                let (name, s) = read(name).await?;
                let text = |key: &str| -> Result<String, EngineError> {
                    String::from_utf8(required(&s, &name, key)?).map_err(|_| EngineError::Secret {
                        name: name.clone(),
                        message: format!("key {key} is not UTF-8"),
                    })
                };
                Some((text("username")?, text("password")?))
            }
        };
        Ok(Self {
            client_port: spec.client_port,
            tls,
            auth,
            tls_names: Arc::default(),
        })
    }

    /// The member's endpoint `http(s)://<podIP>:<clientPort>`; with TLS, remembers the name
    /// its certificate is checked against: `<hostname>.<subdomain>.<namespace>.svc.cluster.local`
    /// when the pod has them (StatefulSet members do), else the IP.
    fn target(&self, pod: &PodInfo) -> Option<Target> {
        let ip = pod.ip.as_deref()?;
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip.to_string()
        };
        let url = format!("{scheme}://{host}:{}", self.client_port);
        if self.tls.is_some() {
            let name = match (pod.dns_prefix(), &pod.namespace) {
                (Some(prefix), Some(ns)) => format!("{prefix}.{ns}.svc.cluster.local"),
                _ => ip.to_string(),
            };
            if let Ok(mut names) = self.tls_names.lock() {
                names.insert(url.clone(), name);
            }
        }
        Some(Target {
            pod: pod.name.clone(),
            url,
        })
    }

    async fn connect(&self, target: &Target, request_timeout: Duration) -> Result<Client, String> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(request_timeout);
        if let Some(tls) = &self.tls {
            let mut t = TlsOptions::new().ca_certificate(Certificate::from_pem(&tls.ca));
            if let Some((cert, key)) = &tls.identity {
                t = t.identity(Identity::from_pem(cert, key));
            }
            let name = self
                .tls_names
                .lock()
                .ok()
                .and_then(|names| names.get(&target.url).cloned());
            if let Some(name) = name {
                t = t.domain_name(name);
            }
            options = options.with_tls(t);
        }
        if let Some((user, password)) = &self.auth {
            options = options.with_user(user.clone(), password.clone());
        }
        bounded(
            CONNECT_TIMEOUT + request_timeout,
            Client::connect([target.url.as_str()], Some(options)),
        )
        .await
        .map_err(|e| format!("connect: {e}"))
    }

    /// Asks one member for status, member list and alarms (concurrently, each bounded).
    async fn view(&self, pod: &PodInfo) -> MemberView {
        let Some(target) = self.target(pod) else {
            let why = "pod has no IP (not running)".to_string();
            return MemberView {
                pod: pod.name.clone(),
                endpoint: None,
                status: Err(why.clone()),
                members: Err(why.clone()),
                alarms: Err(why),
            };
        };
        let client = match self.connect(&target, REQUEST_TIMEOUT).await {
            Ok(c) => c,
            Err(e) => {
                return MemberView {
                    pod: pod.name.clone(),
                    endpoint: Some(target.url),
                    status: Err(e.clone()),
                    members: Err(e.clone()),
                    alarms: Err(e),
                };
            }
        };
        let limit = REQUEST_TIMEOUT + Duration::from_millis(500);
        let (mut c1, mut c2, mut c3) = (client.clone(), client.clone(), client);
        let (status, members, alarms) = tokio::join!(
            bounded(
                limit,
                async move { c1.status().await.map(|s| status_view(&s)) }
            ),
            bounded(limit, async move {
                c2.member_list()
                    .await
                    .map(|r| r.members().iter().map(member_info).collect::<Vec<_>>())
            }),
            bounded(limit, async move {
                c3.alarm(AlarmAction::Get, AlarmType::None, None)
                    .await
                    .map(|r| alarm_infos(&r))
            }),
        );
        let view = MemberView {
            pod: pod.name.clone(),
            endpoint: Some(target.url),
            status,
            members,
            alarms,
        };
        debug!(member = %view.pod, ?view, "etcd member view");
        view
    }

    /// Observes every member pod on its own endpoint and assesses the answers.
    #[instrument(skip_all, fields(pods = pods.len()))]
    pub async fn observe(&self, pods: &[Pod]) -> HealthReport {
        let mut infos: Vec<PodInfo> = pods.iter().map(PodInfo::from_pod).collect();
        infos.sort_by(|a, b| ordinal_key(&a.name).cmp(&ordinal_key(&b.name)));
        let views = futures::future::join_all(infos.iter().map(|p| self.view(p))).await;
        let report = assess(&infos, &views);
        debug!(leader = ?report.leader, problems = ?report.problems, "etcd health");
        report
    }

    /// MoveLeader sent to the current leader's endpoint (from the report), then wait (bounded)
    /// until every member of the report sees the new leader. Ok at once when `to` already leads;
    /// an error when `from` no longer leads (observe again).
    #[instrument(skip(self, report))]
    pub async fn transfer_leadership(
        &self,
        report: &HealthReport,
        from: &str,
        to: &str,
    ) -> Result<(), EngineError> {
        let fail = |message: String| EngineError::LeaderTransfer {
            from: from.to_string(),
            to: to.to_string(),
            message,
        };
        let find = |pod: &str| {
            report
                .members
                .iter()
                .find(|m| m.pod == pod)
                .ok_or_else(|| fail(format!("{pod} is not in the health report")))
        };
        let id_of = |m: &MemberHealth| {
            m.member_id
                .as_deref()
                .and_then(|id| u64::from_str_radix(id, 16).ok())
                .ok_or_else(|| fail(format!("no etcd member id known for {}", m.pod)))
        };
        let (source, dest) = (find(from)?, find(to)?);
        let (from_id, to_id) = (id_of(source)?, id_of(dest)?);
        let target = Target {
            pod: from.to_string(),
            url: source
                .endpoint
                .clone()
                .ok_or_else(|| fail(format!("no endpoint known for {from}")))?,
        };
        let mut client = self
            .connect(&target, MOVE_LEADER_TIMEOUT)
            .await
            .map_err(|e| fail(format!("cannot reach {from} at {}: {e}", target.url)))?;
        let status = bounded(REQUEST_TIMEOUT, client.status())
            .await
            .map_err(|e| fail(format!("status of {from}: {e}")))?;
        if status.leader() == to_id {
            info!("{to} already leads");
        } else if status.leader() != from_id {
            return Err(fail(format!(
                "{from} is not the leader any more (it sees leader id {}); observe again",
                hex(status.leader())
            )));
        } else {
            info!("moving etcd leadership");
            bounded(
                MOVE_LEADER_TIMEOUT + Duration::from_secs(1),
                client.move_leader(to_id),
            )
            .await
            .map_err(|e| fail(format!("MoveLeader: {e}")))?;
        }
        (|| self.all_see_leader(report, to_id))
            .retry(
                ConstantBuilder::default()
                    .with_delay(LEADER_POLL)
                    .with_max_times(LEADER_POLLS),
            )
            .await
            .map_err(|e| {
                fail(format!(
                    "the new leader is not confirmed by every member: {e}"
                ))
            })?;
        info!("every member sees {to} as leader");
        Ok(())
    }

    /// Ok when every member of the report that has an endpoint sees `leader_id` as leader.
    async fn all_see_leader(&self, report: &HealthReport, leader_id: u64) -> Result<(), String> {
        let checks = report.members.iter().filter_map(|m| {
            let url = m.endpoint.clone()?;
            Some(async move {
                let target = Target {
                    pod: m.pod.clone(),
                    url,
                };
                let mut client = self.connect(&target, REQUEST_TIMEOUT).await?;
                let s = bounded(REQUEST_TIMEOUT, client.status()).await?;
                if s.leader() == leader_id {
                    Ok(())
                } else {
                    Err(format!("{} sees leader id {}", target.pod, hex(s.leader())))
                }
            })
        });
        let errors: Vec<String> = futures::future::join_all(checks)
            .await
            .into_iter()
            .filter_map(Result::err)
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    /// `hash_kv` at a common revision (the lowest current revision among the members) on
    /// every member: `"<hash>@<revision>"` when all agree, [`EngineError::Inconsistent`] when not.
    #[instrument(skip_all, fields(pods = pods.len()))]
    pub async fn final_hash(&self, pods: &[Pod]) -> Result<String, EngineError> {
        let mut infos: Vec<PodInfo> = pods.iter().map(PodInfo::from_pod).collect();
        infos.sort_by(|a, b| ordinal_key(&a.name).cmp(&ordinal_key(&b.name)));
        if infos.is_empty() {
            return Err(EngineError::Other("no member pod to hash".to_string()));
        }
        let unreachable = |t: &Target, message: String| EngineError::Unreachable {
            pod: t.pod.clone(),
            endpoint: t.url.clone(),
            message,
        };
        let mut clients = Vec::new();
        for info in &infos {
            let target = self.target(info).ok_or_else(|| EngineError::Unreachable {
                pod: info.name.clone(),
                endpoint: String::new(),
                message: "pod has no IP (not running)".to_string(),
            })?;
            let client = self
                .connect(&target, REQUEST_TIMEOUT)
                .await
                .map_err(|e| unreachable(&target, e))?;
            clients.push((target, client));
        }
        let mut revision = i64::MAX;
        for (t, c) in &mut clients {
            let s = bounded(REQUEST_TIMEOUT, c.status())
                .await
                .map_err(|e| unreachable(t, e))?;
            revision = revision.min(status_view(&s).revision);
        }
        if revision < 1 {
            return Err(EngineError::Other(
                "a member reports no key-value revision".to_string(),
            ));
        }
        let mut hashes: Vec<(String, u32, i64)> = Vec::new();
        for (t, c) in &mut clients {
            let h = bounded(REQUEST_TIMEOUT, c.hash_kv(revision))
                .await
                .map_err(|e| unreachable(t, e))?;
            hashes.push((t.pod.clone(), h.hash(), h.compact_version()));
        }
        compare_hashes(&hashes, revision)
    }
}

/// `"<hash>@<revision>"` when every member's `hash_kv` is the same; else which member has what.
fn compare_hashes(hashes: &[(String, u32, i64)], revision: i64) -> Result<String, EngineError> {
    let distinct: BTreeSet<u32> = hashes.iter().map(|h| h.1).collect();
    match (distinct.len(), distinct.first()) {
        (1, Some(hash)) => {
            info!(hash, revision, "all members agree on hash_kv");
            Ok(format!("{hash}@{revision}"))
        }
        _ => {
            let parts: Vec<String> = hashes
                .iter()
                .map(|(pod, h, compact)| format!("{pod}: {h} (compacted at revision {compact})"))
                .collect();
            warn!(revision, ?parts, "members differ on hash_kv");
            Err(EngineError::Inconsistent(format!(
                "hash_kv at revision {revision} differs: {}",
                parts.join(", ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{DEFAULT_MAX_LAG, Gate, gate_before_stop, next_member};
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
        assert!(r.quorum_based);
        assert!(r.members.iter().all(|m| m.healthy));
        assert_eq!(r.members[1].member_id.as_deref(), Some("1001"));
        assert!(r.members[1].leader && !r.members[0].leader);
        assert_eq!(
            r.members[2].endpoint.as_deref(),
            Some("http://198.18.0.12:2379")
        );
        assert_eq!(r.members[0].raft_index, Some(100));
        assert_eq!(gate_before_stop(&r, "etcd-0", DEFAULT_MAX_LAG), Gate::Open);
        let all: Vec<String> = (0..3).map(|i| format!("etcd-{i}")).collect();
        assert_eq!(next_member(&r, &all).as_deref(), Some("etcd-0"));
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
            matches!(gate_before_stop(&r, "etcd-1", DEFAULT_MAX_LAG), Gate::Wait(w) if w.contains("etcd-2: cannot be queried"))
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
        assert!(super::super::is_healthy_for_start(&r).is_err());
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
        assert_eq!(r.members[1].raft_index, Some(4999));
        assert!(
            matches!(gate_before_stop(&r, "etcd-1", DEFAULT_MAX_LAG), Gate::Wait(w) if w.contains("etcd-2 is 2000 raft entries behind"))
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
    fn endpoints_and_tls_names() {
        let e = Etcd::new(2379);
        let t = e.target(&pod(1)).unwrap();
        assert_eq!(t.url, "http://198.18.0.11:2379");
        assert!(e.target(&PodInfo::default()).is_none());
        let mut e = Etcd::new(12379);
        e.tls = Some(TlsMaterial {
            ca: vec![],
            identity: None,
        });
        let t = e.target(&pod(2)).unwrap();
        assert_eq!(t.url, "https://198.18.0.12:12379");
        assert_eq!(
            e.tls_names.lock().unwrap().get(&t.url).map(String::as_str),
            Some("etcd-2.etcd.db.svc.cluster.local")
        );
        let mut v6 = pod(3);
        v6.ip = Some("fd00::3".to_string());
        v6.hostname = None;
        let t = e.target(&v6).unwrap();
        assert_eq!(t.url, "https://[fd00::3]:12379");
        assert_eq!(
            e.tls_names.lock().unwrap().get(&t.url).map(String::as_str),
            Some("fd00::3")
        );
    }

    #[test]
    fn hashes_must_agree() {
        let same = vec![("etcd-0".to_string(), 7, 0), ("etcd-1".to_string(), 7, 0)];
        assert_eq!(compare_hashes(&same, 42).unwrap(), "7@42");
        let differ = vec![("etcd-0".to_string(), 7, 0), ("etcd-1".to_string(), 8, 0)];
        let err = compare_hashes(&differ, 42).unwrap_err().to_string();
        assert!(err.contains("etcd-1: 8"), "{err}");
    }
}
