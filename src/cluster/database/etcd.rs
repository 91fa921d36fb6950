//! The etcd client: asks every member on its own endpoint (`http(s)://<podIP>:<clientPort>`,
//! one client per endpoint, no cluster DNS) for `status`, `member list` and `alarm list`, and
//! records the answers as plain data ([`MemberView`]) for the pure [`assess`]; moves the
//! leadership (MoveLeader) and compares `hash_kv` across members.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{ConstantBuilder, Retryable};
use etcd_client::{
    AlarmAction, AlarmType, Certificate, Client, ConnectOptions, Identity, TlsOptions,
};
use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, info, instrument, warn};

use super::Client as DatabaseClient;
use super::EngineError;
use super::secrets::{self, Credentials};
use crate::api::DatabaseSpec;
use crate::engine::etcd::{
    AlarmInfo, MemberHash, MemberInfo, MemberView, PodInfo, StatusView, agreed_hash, assess,
    common_revision, hex,
};
use crate::engine::{FinalHash, HealthReport, MemberHealth};

/// Bound on establishing a connection to one member.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on one request to one member.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on MoveLeader (the server waits for the transfer, up to about an election timeout).
const MOVE_LEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How often, and how many times, to look for the new leader after a transfer.
const LEADER_POLL: Duration = Duration::from_millis(200);
const LEADER_POLLS: usize = 75;

/// The etcd client of one request.
#[derive(Clone)]
pub struct EtcdClient {
    client_port: u16,
    credentials: Credentials,
    /// Endpoint URL → name the member's server certificate is checked against (TLS), learned
    /// by `observe`, so later calls given only a report's endpoints verify the same name.
    tls_names: Arc<Mutex<BTreeMap<String, String>>>,
}

impl fmt::Debug for EtcdClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdClient")
            .field("client_port", &self.client_port)
            .field("tls", &self.credentials.tls.is_some())
            .field(
                "auth_user",
                &self.credentials.auth.as_ref().map(|a| &a.user),
            )
            .finish()
    }
}

/// A connection target: one member pod.
struct Target {
    pod: String,
    url: String,
}

/// An etcd client error in one line: for gRPC errors the status message, its code and the
/// innermost cause (e.g. `tcp connect error (Unavailable): deadline has elapsed`).
fn describe(e: &etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(status) => super::with_innermost_cause(
            format!("{} ({:?})", status.message(), status.code()),
            status,
        ),
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

impl EtcdClient {
    /// A client of the members on `client_port`, with the TLS and auth material read from the
    /// request's Secrets.
    pub fn new(client_port: u16, credentials: Credentials) -> Self {
        Self {
            client_port,
            credentials,
            tls_names: Arc::default(),
        }
    }

    /// The client of a request's `spec.database.etcd`: reads the TLS Secret (`ca.crt`,
    /// `tls.crt`, `tls.key`) and the auth Secret (`username`, `password`) when they are named.
    pub async fn from_spec(
        client: &kube::Client,
        namespace: &str,
        spec: &DatabaseSpec,
    ) -> Result<Self, EngineError> {
        let etcd = spec.etcd.clone().unwrap_or_default();
        let credentials = secrets::credentials(
            client,
            namespace,
            etcd.tls_secret_name.as_deref(),
            etcd.auth_secret_name.as_deref(),
        )
        .await?;
        Ok(Self::new(etcd.client_port, credentials))
    }

    /// The member's endpoint (see [`endpoint`]); with TLS, remembers the name its certificate
    /// is checked against (see [`tls_server_name`]).
    fn target(&self, pod: &PodInfo) -> Option<Target> {
        let tls = self.credentials.tls.is_some();
        let url = endpoint(pod, self.client_port, tls)?;
        if tls
            && let Some(name) = tls_server_name(pod)
            && let Ok(mut names) = self.tls_names.lock()
        {
            names.insert(url.clone(), name);
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
        if let Some(tls) = &self.credentials.tls {
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
        if let Some(auth) = &self.credentials.auth {
            options = options.with_user(auth.user.clone(), auth.password.clone());
        }
        bounded(
            CONNECT_TIMEOUT + request_timeout,
            Client::connect([target.url.as_str()], Some(options)),
        )
        .await
        .map_err(|e| format!("connect: {e}"))
    }

    /// Asks one member for status, member list and alarms (concurrently, each bounded).
    /// A pod being deleted is not asked: it is unhealthy whatever it answers, and once its
    /// process is gone its address may answer nothing until the connect timeout, which would
    /// hold every decision of the request (the member's stop among them) for seconds.
    async fn view(&self, pod: &PodInfo) -> MemberView {
        let target = if pod.terminating {
            None
        } else {
            self.target(pod)
        };
        let Some(target) = target else {
            let why = if pod.terminating {
                "not asked: the pod is being deleted".to_string()
            } else {
                "pod has no IP (not running)".to_string()
            };
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
        let infos = PodInfo::in_ordinal_order(pods);
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
            member_id(m).ok_or_else(|| fail(format!("no etcd member id known for {}", m.pod)))
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
    pub async fn final_hash(&self, pods: &[Pod]) -> Result<FinalHash, EngineError> {
        let infos = PodInfo::in_ordinal_order(pods);
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
        let mut revisions = Vec::new();
        for (t, c) in &mut clients {
            let s = bounded(REQUEST_TIMEOUT, c.status())
                .await
                .map_err(|e| unreachable(t, e))?;
            revisions.push(status_view(&s).revision);
        }
        let Some(revision) = common_revision(&revisions) else {
            return Err(EngineError::Other(
                "a member reports no key-value revision".to_string(),
            ));
        };
        let mut hashes: Vec<MemberHash> = Vec::new();
        for (t, c) in &mut clients {
            let h = bounded(REQUEST_TIMEOUT, c.hash_kv(revision))
                .await
                .map_err(|e| unreachable(t, e))?;
            hashes.push(MemberHash {
                pod: t.pod.clone(),
                hash: h.hash(),
                compact_revision: h.compact_version(),
            });
        }
        match agreed_hash(&hashes, revision) {
            Ok(hash) => {
                info!(hash, revision, "all members agree on hash_kv");
                Ok(FinalHash {
                    hash,
                    members: hashes.into_iter().map(|h| h.pod).collect(),
                })
            }
            Err(e) => {
                warn!(revision, error = %e, "members differ on hash_kv");
                Err(e.into())
            }
        }
    }
}

/// The etcd member id of a report's member (kept there in hex).
fn member_id(m: &MemberHealth) -> Option<u64> {
    m.member_id
        .as_deref()
        .and_then(|id| u64::from_str_radix(id, 16).ok())
}

/// The member's endpoint `http(s)://<podIP>:<clientPort>` (IPv6 in brackets); `None` without
/// an IP.
pub fn endpoint(pod: &PodInfo, client_port: u16, tls: bool) -> Option<String> {
    let ip = pod.ip.as_deref()?;
    let scheme = if tls { "https" } else { "http" };
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    Some(format!("{scheme}://{host}:{client_port}"))
}

/// The name a member's server certificate is checked against:
/// `<hostname>.<subdomain>.<namespace>.svc.cluster.local` when the pod has them (StatefulSet
/// members do), else its IP; `None` without an IP.
pub fn tls_server_name(pod: &PodInfo) -> Option<String> {
    let ip = pod.ip.as_deref()?;
    Some(match (pod.dns_prefix(), &pod.namespace) {
        (Some(prefix), Some(ns)) => format!("{prefix}.{ns}.svc.cluster.local"),
        _ => ip.to_string(),
    })
}

impl DatabaseClient for EtcdClient {
    fn name(&self) -> &'static str {
        "Etcd"
    }

    fn observe<'a>(
        &'a self,
        pods: &'a [Pod],
    ) -> futures::future::BoxFuture<'a, Result<HealthReport, EngineError>> {
        Box::pin(async move { Ok(EtcdClient::observe(self, pods).await) })
    }

    fn hand_over<'a>(
        &'a self,
        report: &'a HealthReport,
        from: &'a str,
        to: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<(), EngineError>> {
        Box::pin(self.transfer_leadership(report, from, to))
    }

    fn final_hash<'a>(
        &'a self,
        pods: &'a [Pod],
    ) -> futures::future::BoxFuture<'a, Result<Option<FinalHash>, EngineError>> {
        Box::pin(async move { EtcdClient::final_hash(self, pods).await.map(Some) })
    }
}

#[cfg(test)]
mod tests {
    use super::super::secrets::TlsMaterial;
    use super::*;

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

    #[test]
    fn endpoints_and_tls_names() {
        let e = EtcdClient::new(2379, Credentials::default());
        let t = e.target(&pod(1)).unwrap();
        assert_eq!(t.url, "http://198.18.0.11:2379");
        assert!(e.target(&PodInfo::default()).is_none());
        let e = EtcdClient::new(
            12379,
            Credentials {
                tls: Some(TlsMaterial {
                    ca: vec![],
                    identity: None,
                }),
                auth: None,
            },
        );
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
    fn member_ids_parse_from_hex() {
        let m = MemberHealth {
            pod: "etcd-0".to_string(),
            member_id: Some("1a2b".to_string()),
            ..MemberHealth::default()
        };
        assert_eq!(member_id(&m), Some(0x1a2b));
        assert_eq!(member_id(&MemberHealth::default()), None);
    }
}
