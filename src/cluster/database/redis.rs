//! The RedisSentinel client: Redis on each member pod at `<podIP>:<port>`; the Sentinels either
//! beside each member, in the member pod (the Bitnami chart's layout: `<podIP>:<sentinelPort>`),
//! or the ready endpoints of the Service `redisSentinel.sentinelService` names (read from its
//! EndpointSlices at every look: no cluster DNS, no ClusterIP). It reads `INFO replication` from every Redis and `SENTINEL get-master-addr-by-name` and
//! `SENTINEL CKQUORUM` from every Sentinel for the pure [`crate::engine::redis::assess`]; it hands
//! the master over with writes paused ([`RedisClient::hand_over`]); and it computes the final
//! check, every member at the master's offset and key counts at a quiet moment. Every call is
//! bounded ([`CALL`]).

use std::collections::BTreeMap;
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, FromRedisValue, IntoConnectionInfo, RedisConnectionInfo};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use tokio::time::{Instant, sleep, timeout};
use tracing::{debug, info, instrument, warn};

use super::secrets;
use super::{Client as DatabaseClient, EngineError};
use crate::api::DatabaseSpec;
use crate::engine::redis::{
    self, DEFAULT_HANDOVER_TIMEOUT_SECONDS, DEFAULT_MASTER_NAME, DEFAULT_REDIS_PORT,
    DEFAULT_SENTINEL_PORT, MemberView, PodInfo, RedisRole, Replication, SentinelView, Snapshot,
    agreed_offsets, parse_keyspace, parse_replication,
};
use crate::engine::{FinalHash, HealthReport};

/// Bound on connecting to one server, and on one command.
const CALL: Duration = Duration::from_secs(2);
/// How often the handover and the final check look again.
const POLL: Duration = Duration::from_millis(50);
/// How long the final check looks for a quiet moment before it reports "not yet" (it is asked
/// again until the request's timeout).
const QUIET_WAIT: Duration = Duration::from_secs(10);
/// How long the old master may take to report its link to the new master up.
const REJOIN_WAIT: Duration = Duration::from_secs(30);

/// Where the Sentinels are.
#[derive(Clone)]
enum Sentinels {
    /// One in each member pod, at the pod's IP.
    InMemberPods,
    /// The ready endpoints of a Service in the request's namespace.
    Service {
        name: String,
        slices: Box<Api<EndpointSlice>>,
    },
}

impl std::fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sentinels::InMemberPods => f.write_str("InMemberPods"),
            Sentinels::Service { name, .. } => write!(f, "Service({name})"),
        }
    }
}

/// One Sentinel to ask: its address and the member pod it runs in, when it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelAddr {
    pub ip: String,
    pub port: u16,
    pub member: Option<String>,
}

/// The RedisSentinel client of one request.
#[derive(Debug)]
pub struct RedisClient {
    sentinels: Sentinels,
    master_name: String,
    redis_port: u16,
    sentinel_port: u16,
    password: Option<String>,
    sentinel_password: Option<String>,
    handover_timeout: Duration,
}

/// An error in words from a Redis call.
type Answer<T> = Result<T, String>;

impl RedisClient {
    /// The client of a request's `spec.database.redisSentinel`: reads the password Secrets when
    /// they are named.
    pub async fn from_spec(
        client: &kube::Client,
        namespace: &str,
        spec: &DatabaseSpec,
    ) -> Result<Self, EngineError> {
        let r = spec.redis_sentinel.clone().unwrap_or_default();
        let password =
            secrets::password(client, namespace, r.password_secret_name.as_deref()).await?;
        let sentinel_password = secrets::password(
            client,
            namespace,
            r.sentinel_password_secret_name.as_deref(),
        )
        .await?;
        let seconds = r
            .handover_timeout_seconds
            .unwrap_or(DEFAULT_HANDOVER_TIMEOUT_SECONDS);
        let sentinels = match r.sentinel_service {
            None => Sentinels::InMemberPods,
            Some(name) => Sentinels::Service {
                name,
                slices: Box::new(Api::namespaced(client.clone(), namespace)),
            },
        };
        Ok(Self {
            sentinels,
            master_name: r
                .master_name
                .unwrap_or_else(|| DEFAULT_MASTER_NAME.to_string()),
            redis_port: r.redis_port.unwrap_or(DEFAULT_REDIS_PORT),
            sentinel_port: r.sentinel_port.unwrap_or(DEFAULT_SENTINEL_PORT),
            password,
            sentinel_password,
            handover_timeout: Duration::from_secs(u64::from(seconds)),
        })
    }

    /// A connection to `ip:port`, authenticated with `password` when there is one.
    async fn connect(
        &self,
        ip: &str,
        port: u16,
        password: Option<&str>,
    ) -> Answer<MultiplexedConnection> {
        let mut settings = RedisConnectionInfo::default().set_skip_set_lib_name();
        if let Some(p) = password {
            settings = settings.set_password(p);
        }
        let info = (ip.to_string(), port)
            .into_connection_info()
            .map_err(|e| e.to_string())?
            .set_redis_settings(settings);
        let client = ::redis::Client::open(info).map_err(|e| e.to_string())?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CALL))
            .set_response_timeout(Some(CALL));
        timeout(
            CALL * 2,
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await
        .map_err(|_| format!("connecting to {ip}:{port} timed out"))?
        .map_err(|e| e.to_string())
    }

    /// The Redis server of `ip`.
    async fn redis(&self, ip: &str) -> Answer<MultiplexedConnection> {
        self.connect(ip, self.redis_port, self.password.as_deref())
            .await
    }

    /// The Sentinel at `ip:port`.
    async fn sentinel(&self, ip: &str, port: u16) -> Answer<MultiplexedConnection> {
        self.connect(ip, port, self.sentinel_password.as_deref())
            .await
    }

    /// What one member pod's Redis answers: its `INFO replication`.
    async fn view(&self, pod: PodInfo) -> MemberView {
        let Some(ip) = pod.ip.clone() else {
            return MemberView {
                pod,
                endpoint: None,
                replication: Err("the pod has no IP".to_string()),
            };
        };
        let replication = match self.redis(&ip).await {
            Ok(mut con) => replication(&mut con).await,
            Err(e) => Err(e),
        };
        MemberView {
            endpoint: Some(format!("{ip}:{}", self.redis_port)),
            pod,
            replication,
        }
    }

    /// What one Sentinel answers: the group's master and `CKQUORUM`.
    async fn sentinel_view(&self, s: SentinelAddr) -> SentinelView {
        let at = format!("{}:{}", s.ip, s.port);
        let (master, quorum) = match self.sentinel(&s.ip, s.port).await {
            Ok(mut con) => {
                let master = self.master_addr(&mut con).await;
                let quorum = run::<String>(
                    &mut con,
                    ::redis::cmd("SENTINEL")
                        .arg("CKQUORUM")
                        .arg(&self.master_name),
                )
                .await;
                (master, quorum)
            }
            Err(e) => (Err(format!("at {at}: {e}")), Err(e)),
        };
        SentinelView {
            at,
            member: s.member,
            master,
            quorum,
        }
    }

    /// The Sentinels to ask: one in each of `pods` (a pod with no IP answers for its Sentinel
    /// that it has none), or the Service's ready endpoints.
    async fn sentinel_addrs(
        &self,
        pods: &[PodInfo],
    ) -> Result<(Vec<SentinelAddr>, Vec<SentinelView>), EngineError> {
        let Sentinels::Service { name, slices } = &self.sentinels else {
            let (with_ip, without): (Vec<&PodInfo>, Vec<&PodInfo>) =
                pods.iter().partition(|p| p.ip.is_some());
            let addrs = (with_ip.into_iter())
                .filter_map(|p| {
                    Some(SentinelAddr {
                        ip: p.ip.clone()?,
                        port: self.sentinel_port,
                        member: Some(p.name.clone()),
                    })
                })
                .collect();
            let silent = (without.into_iter())
                .map(|p| SentinelView {
                    at: p.name.clone(),
                    member: Some(p.name.clone()),
                    master: Err("the pod has no IP".to_string()),
                    quorum: Err("the pod has no IP".to_string()),
                })
                .collect();
            return Ok((addrs, silent));
        };
        let found = service_sentinels(slices, name, self.sentinel_port).await?;
        Ok((found, Vec::new()))
    }

    /// The Sentinels' addresses as [`RedisClient::sentinel_addrs`] finds them, from a report.
    async fn sentinels_of(&self, report: &HealthReport) -> Answer<Vec<(String, u16)>> {
        match &self.sentinels {
            Sentinels::InMemberPods => Ok((member_ips(report).into_iter())
                .map(|ip| (ip, self.sentinel_port))
                .collect()),
            Sentinels::Service { name, slices } => {
                let found = service_sentinels(slices, name, self.sentinel_port)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(found.into_iter().map(|s| (s.ip, s.port)).collect())
            }
        }
    }

    /// `SENTINEL get-master-addr-by-name`: `None` when the Sentinel does not know the group.
    async fn master_addr(&self, con: &mut MultiplexedConnection) -> Answer<Option<(String, u16)>> {
        let cmd = ::redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master_name)
            .clone();
        let answer: Option<Vec<String>> = run(con, &cmd).await?;
        match answer.as_deref() {
            None => Ok(None),
            Some([host, port]) => port
                .parse()
                .map(|p| Some((host.clone(), p)))
                .map_err(|_| format!("get-master-addr-by-name: port {port}")),
            Some(other) => Err(format!("get-master-addr-by-name answered {other:?}")),
        }
    }

    /// Looks at every member pod.
    #[instrument(skip_all, fields(pods = pods.len()))]
    pub async fn observe(&self, pods: &[Pod]) -> Result<HealthReport, EngineError> {
        let infos = sorted(pods);
        let (addrs, mut sentinels) = self.sentinel_addrs(&infos).await?;
        let asked = addrs.into_iter().map(|a| self.sentinel_view(a));
        let views = futures::future::join_all(infos.into_iter().map(|p| self.view(p)));
        let (views, asked) = futures::future::join(views, futures::future::join_all(asked)).await;
        sentinels.extend(asked);
        let report = redis::assess(&views, &sentinels);
        debug!(leader = ?report.leader, problems = ?report.problems, "redis health");
        Ok(report)
    }
}

/// The member pods in ordinal order.
fn sorted(pods: &[Pod]) -> Vec<PodInfo> {
    let mut infos: Vec<PodInfo> = pods.iter().map(PodInfo::of).collect();
    infos.sort_by_key(|p| {
        (
            crate::engine::pod_ordinal(&p.name).unwrap_or(u32::MAX),
            p.name.clone(),
        )
    });
    infos
}

/// The ready Sentinels of Service `name` (its EndpointSlices, `kubernetes.io/service-name`);
/// an error naming the Service when it has none.
async fn service_sentinels(
    slices: &Api<EndpointSlice>,
    name: &str,
    default_port: u16,
) -> Result<Vec<SentinelAddr>, EngineError> {
    let fail = |message: String| EngineError::SentinelService {
        name: name.to_string(),
        message,
    };
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={name}"));
    let list = slices
        .list(&lp)
        .await
        .map_err(|e| fail(format!("cannot list its EndpointSlices: {e}")))?;
    if list.items.is_empty() {
        return Err(fail(
            "has no EndpointSlice (does the Service exist in the request's namespace?)".to_string(),
        ));
    }
    let found = ready_sentinels(&list.items, default_port);
    match found.is_empty() {
        true => Err(fail("has no ready endpoint".to_string())),
        false => Ok(found),
    }
}

/// The ready endpoints of a Service's EndpointSlices (`ready` unset counts as ready, as the API
/// says), each once, in address order: the port named `sentinel` when a slice has one, else
/// `default_port`; the member pod a `Pod` target reference names.
pub fn ready_sentinels(slices: &[EndpointSlice], default_port: u16) -> Vec<SentinelAddr> {
    let mut found: Vec<SentinelAddr> = Vec::new();
    for slice in slices {
        let port = (slice.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some("sentinel"))
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(default_port);
        let ready = (slice.endpoints.iter())
            .filter(|e| (e.conditions.as_ref()).is_none_or(|c| c.ready != Some(false)));
        for e in ready {
            let member = (e.target_ref.as_ref())
                .filter(|t| t.kind.as_deref() == Some("Pod"))
                .and_then(|t| t.name.clone());
            for ip in &e.addresses {
                let addr = SentinelAddr {
                    ip: ip.clone(),
                    port,
                    member: member.clone(),
                };
                if !found.contains(&addr) {
                    found.push(addr);
                }
            }
        }
    }
    found.sort_by(|a, b| (&a.ip, a.port).cmp(&(&b.ip, b.port)));
    found
}

/// The members' IPs, from the endpoints `observe` reached.
fn member_ips(report: &HealthReport) -> Vec<String> {
    (report.members.iter())
        .filter_map(|m| m.endpoint.as_deref()?.rsplit_once(':'))
        .map(|(ip, _)| ip.to_string())
        .collect()
}

/// The IP of `pod`'s endpoint in the report.
fn member_ips_of(report: &HealthReport, pod: &str) -> Option<String> {
    (report.members.iter())
        .find(|m| m.pod == pod)
        .and_then(|m| m.endpoint.as_deref()?.rsplit_once(':'))
        .map(|(ip, _)| ip.to_string())
}

/// A flat `[k1, v1, k2, v2, ...]` answer as a map.
fn as_map(flat: &[String]) -> BTreeMap<String, String> {
    flat.chunks(2)
        .filter_map(|kv| Some((kv.first()?.clone(), kv.get(1)?.clone())))
        .collect()
}

/// Runs one command, bounded; an error (a refusal included) in words.
async fn run<T: FromRedisValue>(con: &mut MultiplexedConnection, cmd: &::redis::Cmd) -> Answer<T> {
    timeout(CALL, cmd.query_async::<T>(con))
        .await
        .map_err(|_| "no answer in time".to_string())?
        .map_err(|e| e.to_string())
}

async fn replication(con: &mut MultiplexedConnection) -> Answer<Replication> {
    let text: String = run(con, ::redis::cmd("INFO").arg("replication")).await?;
    parse_replication(&text)
}

async fn snapshot(pod: &str, con: Option<&mut MultiplexedConnection>) -> Snapshot {
    let mut s = Snapshot {
        pod: pod.to_string(),
        offset: None,
        keys: None,
    };
    let Some(con) = con else { return s };
    s.offset = replication(con).await.ok().and_then(|r| r.offset());
    let keys: Answer<String> = run(con, ::redis::cmd("INFO").arg("keyspace")).await;
    s.keys = keys.ok().map(|k| parse_keyspace(&k));
    s
}

/// A member the handover talks to: its pod and its Redis.
struct Member {
    pod: String,
    ip: String,
    con: MultiplexedConnection,
}

/// The Sentinel a handover talks to.
struct Sentinel {
    ip: String,
    con: MultiplexedConnection,
}

/// A `replica-priority` changed for the handover, to put back.
struct Steered {
    member: Member,
    was: String,
}

impl RedisClient {
    async fn member(&self, report: &HealthReport, pod: &str) -> Answer<Member> {
        let ip = (report.members.iter())
            .find(|m| m.pod == pod)
            .and_then(|m| m.endpoint.as_deref())
            .and_then(|ep| ep.rsplit_once(':'))
            .map(|(ip, _)| ip.to_string())
            .ok_or_else(|| format!("no address known for {pod}"))?;
        let con = self.redis(&ip).await.map_err(|e| format!("{pod}: {e}"))?;
        Ok(Member {
            pod: pod.to_string(),
            ip,
            con,
        })
    }

    /// Sets `replica-priority` to `value` on `m`, returning what it was.
    async fn set_priority(m: &mut Member, value: &str) -> Answer<String> {
        let get = ::redis::cmd("CONFIG")
            .arg("GET")
            .arg("replica-priority")
            .clone();
        let was: Vec<String> = run(&mut m.con, &get).await?;
        let was = was.get(1).cloned().unwrap_or_else(|| "100".to_string());
        let set = ::redis::cmd("CONFIG")
            .arg("SET")
            .arg("replica-priority")
            .arg(value)
            .clone();
        run::<()>(&mut m.con, &set)
            .await
            .map_err(|e| format!("CONFIG SET replica-priority on {}: {e}", m.pod))?;
        Ok(was)
    }

    /// Every replica but `to` gets `replica-priority 0` (Sentinel never promotes it); `to` gets
    /// a non-zero one.
    async fn steer(&self, report: &HealthReport, from: &str, to: &str) -> Answer<Vec<Steered>> {
        let mut steered = Vec::new();
        let others = report.members.iter().filter(|m| m.pod != from);
        for pod in others.map(|m| m.pod.clone()).collect::<Vec<_>>() {
            let mut member = match self.member(report, &pod).await {
                Ok(m) => m,
                Err(e) => {
                    restore(steered).await;
                    return Err(e);
                }
            };
            let value = if pod == to { "100" } else { "0" };
            let was = match Self::set_priority(&mut member, value).await {
                Ok(was) => was,
                Err(e) => {
                    restore(steered).await;
                    return Err(e);
                }
            };
            if pod == to && was != "0" {
                // Put back what it was, not our 100.
                let _ = Self::set_priority(&mut member, &was).await;
                continue;
            }
            steered.push(Steered { member, was });
        }
        Ok(steered)
    }
}

/// Puts every steered `replica-priority` back (best effort: logged).
async fn restore(steered: Vec<Steered>) {
    for mut s in steered {
        if let Err(e) = RedisClient::set_priority(&mut s.member, &s.was).await {
            warn!(pod = %s.member.pod, error = %e, "cannot put replica-priority back");
        }
    }
}

/// How a handover ended once writes were paused.
enum Switch {
    /// Sentinel names the target (at this address); the old master is demoted.
    Done((String, u16)),
    /// Not done; the old master still leads and takes writes again.
    Failed(String),
}

impl RedisClient {
    /// Hands the master over from `from` to `to` with no window in which an acknowledged write
    /// can be lost (see `docs/engines/redis-sentinel.md`): the other replicas' `replica-priority`
    /// at 0; `CLIENT PAUSE WRITE` on the master; wait until `to` has the master's offset;
    /// `SENTINEL FAILOVER`; wait until Sentinel names `to`; `REPLICAOF` it on the old master,
    /// which only then takes commands again (its paused writes now answered `READONLY`); the
    /// priorities put back; a bounded wait for the old master's link. Ok at once when `to`
    /// already leads.
    #[instrument(skip(self, report))]
    pub async fn hand_over(
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
        if report.leader.as_deref() == Some(to) {
            return Ok(());
        }
        let mut master = self.member(report, from).await.map_err(fail)?;
        let mut target = self.member(report, to).await.map_err(fail)?;
        if let Some(m) = report.members.iter().find(|m| m.pod == to && !m.healthy) {
            return Err(fail(format!(
                "{to} is not healthy: {}",
                m.problem.as_deref().unwrap_or("no reason given")
            )));
        }
        let deadline = Instant::now() + self.handover_timeout;
        let mut sentinel = self.any_sentinel(report).await.map_err(fail)?;
        let steered = self.steer(report, from, to).await.map_err(fail)?;
        let outcome = match self
            .await_steering(&mut sentinel, report, from, to, deadline)
            .await
        {
            Ok(()) => {
                let mut members = (&mut master, &mut target);
                self.switch(&mut sentinel, report, &mut members, deadline)
                    .await
            }
            Err(why) => Switch::Failed(why),
        };
        restore(steered).await;
        match outcome {
            Switch::Failed(why) => Err(fail(why)),
            Switch::Done(addr) => {
                self.repoint(report, from, to, &addr).await;
                self.await_rejoin(&mut master, &target.ip).await;
                Ok(())
            }
        }
    }

    /// The first Sentinel that names a master for the group.
    async fn any_sentinel(&self, report: &HealthReport) -> Answer<Sentinel> {
        let mut why = Vec::new();
        for (ip, port) in self.sentinels_of(report).await? {
            let at = format!("{ip}:{port}");
            match self.sentinel(&ip, port).await {
                Ok(mut con) => match self.master_addr(&mut con).await {
                    Ok(Some(_)) => return Ok(Sentinel { ip: at, con }),
                    Ok(None) => why.push(format!("{at}: does not monitor {}", self.master_name)),
                    Err(e) => why.push(format!("{at}: {e}")),
                },
                Err(e) => why.push(format!("{at}: {e}")),
            }
        }
        Err(format!("no Sentinel to fail over with: {}", why.join("; ")))
    }

    /// Waits until `sentinel` sees the replicas' priorities as steered (it reads them from
    /// their `INFO` every 10 s), before writes are paused.
    async fn await_steering(
        &self,
        sentinel: &mut Sentinel,
        report: &HealthReport,
        from: &str,
        to: &str,
        deadline: Instant,
    ) -> Answer<()> {
        let info = |pod: &str| PodInfo {
            name: pod.to_string(),
            ip: member_ips_of(report, pod),
            terminating: false,
        };
        let target = info(to);
        let others: Vec<PodInfo> = (report.members.iter())
            .filter(|m| m.pod != from && m.pod != to)
            .map(|m| info(&m.pod))
            .collect();
        let replicas = ::redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(&self.master_name)
            .clone();
        loop {
            let listed: Vec<Vec<String>> = run(&mut sentinel.con, &replicas).await?;
            let maps: Vec<BTreeMap<String, String>> = listed.iter().map(|r| as_map(r)).collect();
            let why = match redis::steered(&maps, &target, &others) {
                Ok(()) => return Ok(()),
                Err(why) => why,
            };
            if Instant::now() >= deadline {
                return Err(format!("{why} (Sentinel at {})", sentinel.ip));
            }
            sleep(POLL * 4).await;
        }
    }

    /// Pauses writes on the master and has Sentinel fail over to the target (see
    /// [`RedisClient::hand_over`]).
    async fn switch(
        &self,
        sentinel: &mut Sentinel,
        report: &HealthReport,
        (master, target): &mut (&mut Member, &mut Member),
        deadline: Instant,
    ) -> Switch {
        // Paused longer than the handover may take: the pause must outlast a failover in flight.
        let pause_ms = (self.handover_timeout + Duration::from_secs(10)).as_millis();
        let pause = ::redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(pause_ms.to_string())
            .arg("WRITE")
            .clone();
        if let Err(e) = run::<()>(&mut master.con, &pause).await {
            return Switch::Failed(format!("CLIENT PAUSE WRITE on {}: {e}", master.pod));
        }
        info!(master = %master.pod, target = %target.pod, "writes paused; waiting for the target");
        let step = match self.caught_up(master, target, deadline).await {
            Ok(()) => self.sentinel_failover(sentinel, target, deadline).await,
            Err(e) => Err(e),
        };
        match step {
            Ok(addr) => self.demote(master, &addr).await,
            Err(why) => self.abort(report, master, target, why).await,
        }
    }

    /// Waits until the target's offset reaches the (paused) master's.
    async fn caught_up(
        &self,
        master: &mut Member,
        target: &mut Member,
        deadline: Instant,
    ) -> Answer<()> {
        loop {
            let m = replication(&mut master.con).await?;
            let t = replication(&mut target.con).await?;
            let (mo, to) = (m.offset(), t.offset());
            if t.role == RedisRole::Replica && t.link_up && mo.is_some() && to >= mo {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} did not reach the master's offset {mo:?} within {} s (it is at {to:?})",
                    target.pod,
                    self.handover_timeout.as_secs()
                ));
            }
            sleep(POLL).await;
        }
    }

    /// `SENTINEL FAILOVER` on `sentinel`, then waits until it names the target; the address it
    /// names.
    async fn sentinel_failover(
        &self,
        sentinel: &mut Sentinel,
        target: &Member,
        deadline: Instant,
    ) -> Answer<(String, u16)> {
        let failover = ::redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(&self.master_name)
            .clone();
        run::<()>(&mut sentinel.con, &failover).await.map_err(|e| {
            format!(
                "the Sentinel at {} refused SENTINEL FAILOVER: {e}",
                sentinel.ip
            )
        })?;
        info!(sentinel = %sentinel.ip, "Sentinel accepted the failover");
        self.await_sentinel(&mut sentinel.con, target, deadline)
            .await
    }

    async fn await_sentinel(
        &self,
        con: &mut MultiplexedConnection,
        target: &Member,
        deadline: Instant,
    ) -> Answer<(String, u16)> {
        let who = PodInfo {
            name: target.pod.clone(),
            ip: Some(target.ip.clone()),
            terminating: false,
        };
        loop {
            if let Ok(Some(addr)) = self.master_addr(con).await
                && who.is(&addr.0)
            {
                return Ok(addr);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "Sentinel did not name {} as the master within {} s",
                    target.pod,
                    self.handover_timeout.as_secs()
                ));
            }
            sleep(POLL).await;
        }
    }

    /// The old master replicates from the new one (still paused: its paused writes are then
    /// refused `READONLY`), then takes commands again. When `REPLICAOF` fails, the pause is
    /// left to run out: Sentinel converts the old master itself within seconds, before that.
    async fn demote(&self, master: &mut Member, addr: &(String, u16)) -> Switch {
        let replicaof = ::redis::cmd("REPLICAOF").arg(&addr.0).arg(addr.1).clone();
        match run::<()>(&mut master.con, &replicaof).await {
            Ok(()) => {
                let unpause = ::redis::cmd("CLIENT").arg("UNPAUSE").clone();
                if let Err(e) = run::<()>(&mut master.con, &unpause).await {
                    warn!(pod = %master.pod, error = %e, "CLIENT UNPAUSE failed; the pause runs out");
                }
            }
            Err(e) => warn!(
                pod = %master.pod,
                error = %e,
                "REPLICAOF on the old master failed: it stays paused until Sentinel converts it"
            ),
        }
        info!(old = %master.pod, new = %format!("{}:{}", addr.0, addr.1), "Sentinel names the new master");
        Switch::Done(addr.clone())
    }

    /// The handover did not finish in time: if a Sentinel names the target after all, the old
    /// master is demoted (nothing it acknowledged is lost: it was paused since before); else
    /// writes resume on it.
    async fn abort(
        &self,
        report: &HealthReport,
        master: &mut Member,
        target: &Member,
        why: String,
    ) -> Switch {
        if let Some(addr) = self.named_by_a_sentinel(report, target).await {
            warn!(%why, "Sentinel named the target after all: demoting the old master");
            return self.demote(master, &addr).await;
        }
        let unpause = ::redis::cmd("CLIENT").arg("UNPAUSE").clone();
        if let Err(e) = run::<()>(&mut master.con, &unpause).await {
            warn!(pod = %master.pod, error = %e, "CLIENT UNPAUSE failed; the pause runs out");
        }
        Switch::Failed(why)
    }

    /// The address a Sentinel names as master, when it is `target`'s.
    async fn named_by_a_sentinel(
        &self,
        report: &HealthReport,
        target: &Member,
    ) -> Option<(String, u16)> {
        let who = PodInfo {
            name: target.pod.clone(),
            ip: Some(target.ip.clone()),
            terminating: false,
        };
        for (ip, port) in self.sentinels_of(report).await.ok()? {
            let Ok(mut con) = self.sentinel(&ip, port).await else {
                continue;
            };
            if let Ok(Some(addr)) = self.master_addr(&mut con).await
                && who.is(&addr.0)
            {
                return Some(addr);
            }
        }
        None
    }

    /// Sentinel reconfigures only the replicas it has discovered (from the master's `INFO`,
    /// every 10 s): a member recreated shortly before can still replicate from the old master.
    /// Those are pointed at the new master here (best effort: logged; the gate waits for them).
    async fn repoint(&self, report: &HealthReport, from: &str, to: &str, addr: &(String, u16)) {
        let new = PodInfo {
            name: to.to_string(),
            ip: member_ips_of(report, to),
            terminating: false,
        };
        let others = report
            .members
            .iter()
            .filter(|m| m.pod != from && m.pod != to);
        for pod in others.map(|m| m.pod.clone()).collect::<Vec<_>>() {
            let Ok(mut m) = self.member(report, &pod).await else {
                continue;
            };
            let Ok(r) = replication(&mut m.con).await else {
                continue;
            };
            if r.role == RedisRole::Master || r.master_host.as_deref().is_some_and(|h| new.is(h)) {
                continue;
            }
            let replicaof = ::redis::cmd("REPLICAOF").arg(&addr.0).arg(addr.1).clone();
            match run::<()>(&mut m.con, &replicaof).await {
                Ok(()) => info!(%pod, "pointed at the new master (Sentinel had not discovered it)"),
                Err(e) => warn!(%pod, error = %e, "cannot point it at the new master"),
            }
        }
    }

    /// Waits (bounded) until the old master reports its link to the new master up; only
    /// logged when it does not (the gate waits for it before the pod stops).
    async fn await_rejoin(&self, master: &mut Member, new_ip: &str) {
        let deadline = Instant::now() + REJOIN_WAIT;
        while Instant::now() < deadline {
            if let Ok(r) = replication(&mut master.con).await
                && r.role == RedisRole::Replica
                && r.link_up
            {
                info!(old = %master.pod, new = %new_ip, "the old master replicates from the new one");
                return;
            }
            sleep(POLL * 4).await;
        }
        warn!(old = %master.pod, "the old master's link is not up yet; the gate waits for it");
    }

    /// At a quiet moment (the master unchanged before and after the replicas were read), every
    /// member's offset and key counts; polled for [`QUIET_WAIT`].
    #[instrument(skip_all)]
    pub async fn final_hash(&self, pods: &[Pod]) -> Result<FinalHash, EngineError> {
        let report = self.observe(pods).await?;
        let leader = (report.leader.clone())
            .ok_or_else(|| EngineError::Other("the Sentinels name no master".to_string()))?;
        let mut cons = Vec::new();
        for m in &report.members {
            let ip = m
                .endpoint
                .as_deref()
                .and_then(|e| e.rsplit_once(':'))
                .map(|(ip, _)| ip);
            let con = match ip {
                Some(ip) => self.redis(ip).await.ok(),
                None => None,
            };
            cons.push((m.pod.clone(), con));
        }
        let deadline = Instant::now() + QUIET_WAIT;
        loop {
            match quiet_look(&leader, &mut cons).await {
                Ok(h) => return Ok(h),
                Err(why) if Instant::now() >= deadline => return Err(EngineError::Other(why)),
                Err(_) => sleep(POLL).await,
            }
        }
    }
}

/// One look for the final check: the master, every replica, the master again.
async fn quiet_look(
    leader: &str,
    cons: &mut [(String, Option<MultiplexedConnection>)],
) -> Result<FinalHash, String> {
    let (masters, replicas): (Vec<_>, Vec<_>) = cons.iter_mut().partition(|(p, _)| p == leader);
    let Some((_, master)) = masters.into_iter().next() else {
        return Err(format!("the master {leader} is not observed"));
    };
    let before = snapshot(leader, master.as_mut()).await;
    let mut seen = Vec::new();
    for (pod, con) in replicas {
        seen.push(snapshot(pod, con.as_mut()).await);
    }
    let after = snapshot(leader, master.as_mut()).await;
    agreed_offsets(&before, &after, &seen)
}

/// The RedisSentinel client as the engine's I/O half.
impl DatabaseClient for RedisClient {
    fn name(&self) -> &'static str {
        "RedisSentinel"
    }

    fn observe<'a>(&'a self, pods: &'a [Pod]) -> BoxFuture<'a, Result<HealthReport, EngineError>> {
        Box::pin(RedisClient::observe(self, pods))
    }

    fn hand_over<'a>(
        &'a self,
        report: &'a HealthReport,
        from: &'a str,
        to: &'a str,
    ) -> BoxFuture<'a, Result<(), EngineError>> {
        Box::pin(RedisClient::hand_over(self, report, from, to))
    }

    fn final_hash<'a>(
        &'a self,
        pods: &'a [Pod],
    ) -> BoxFuture<'a, Result<Option<FinalHash>, EngineError>> {
        Box::pin(async move { RedisClient::final_hash(self, pods).await.map(Some) })
    }
}

#[cfg(test)]
#[path = "redis_local_tests.rs"]
mod local_tests;

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};

    use super::*;

    fn endpoint(ip: &str, ready: Option<bool>, pod: Option<&str>) -> Endpoint {
        Endpoint {
            addresses: vec![ip.to_string()],
            conditions: Some(EndpointConditions {
                ready,
                ..EndpointConditions::default()
            }),
            target_ref: pod.map(|p| ObjectReference {
                kind: Some("Pod".into()),
                name: Some(p.into()),
                ..ObjectReference::default()
            }),
            ..Endpoint::default()
        }
    }

    fn slice(ports: &[(&str, i32)], endpoints: Vec<Endpoint>) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            endpoints,
            ports: Some(
                (ports.iter())
                    .map(|(name, port)| EndpointPort {
                        name: Some(name.to_string()),
                        port: Some(*port),
                        ..EndpointPort::default()
                    })
                    .collect(),
            ),
            ..EndpointSlice::default()
        }
    }

    #[test]
    fn the_sentinels_are_the_ready_endpoints_at_the_port_named_sentinel() {
        let slices = [
            slice(
                &[("redis", 6379), ("sentinel", 26380)],
                vec![
                    endpoint("198.18.4.12", Some(true), Some("redis-2")),
                    endpoint("198.18.4.10", None, Some("redis-0")),
                    endpoint("198.18.4.11", Some(false), Some("redis-1")),
                ],
            ),
            // the same endpoint in a second slice counts once
            slice(
                &[("sentinel", 26380)],
                vec![endpoint("198.18.4.12", Some(true), Some("redis-2"))],
            ),
        ];
        let found = ready_sentinels(&slices, 26379);
        let at: Vec<(&str, u16, Option<&str>)> = (found.iter())
            .map(|s| (s.ip.as_str(), s.port, s.member.as_deref()))
            .collect();
        assert_eq!(
            at,
            [
                ("198.18.4.10", 26380, Some("redis-0")),
                ("198.18.4.12", 26380, Some("redis-2")),
            ]
        );
    }

    #[test]
    fn without_a_port_named_sentinel_the_sentinel_port_is_used() {
        let slices = [slice(
            &[("", 26379)],
            vec![endpoint("198.18.7.1", Some(true), None)],
        )];
        assert_eq!(
            ready_sentinels(&slices, 26390),
            [SentinelAddr {
                ip: "198.18.7.1".into(),
                port: 26390,
                member: None,
            }]
        );
        let none_ready = [slice(
            &[("sentinel", 26379)],
            vec![endpoint("198.18.7.1", Some(false), None)],
        )];
        assert!(ready_sentinels(&none_ready, 26379).is_empty());
    }
}
