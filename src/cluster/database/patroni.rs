//! The Patroni client: Patroni's REST API on each member pod, at
//! `http(s)://<podIP>:<port>` (no cluster DNS; with TLS the pod's own host name, resolved to its
//! IP, so the certificate is checked against the name it was made for). It reads `/patroni` on
//! every member and `/cluster` + `/config` from one that answers, for the pure
//! [`crate::engine::patroni::assess`]; it asks the leader for a switchover (answered once the
//! candidate leads); and it computes the final check, every replica having replayed the leader's
//! WAL position.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use serde::de::DeserializeOwned;
use tracing::{debug, info, instrument};

use super::secrets::{self, Auth, Credentials};
use super::{Client as DatabaseClient, EngineError};
use crate::api::DatabaseSpec;
use crate::engine::patroni::{
    self, ClusterView, DEFAULT_SWITCHOVER_TIMEOUT_SECONDS, DynamicConfig, MemberStatus, MemberView,
    Observed, PodInfo, agreed_replay,
};
use crate::engine::{FinalHash, HealthReport};

/// Bound on one request to one member (connection included).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How often to look for replayed positions at the final check.
const POLL: Duration = Duration::from_millis(200);
/// How long the final check waits for every replica to replay the leader's position before it
/// reports "not yet" (it is asked again until the request's timeout).
const REPLAY_WAIT: Duration = Duration::from_secs(10);

/// The Patroni client of one request.
#[derive(Debug)]
pub struct PatroniClient {
    /// `spec.database.patroni.apiPort`, else per pod ([`patroni::api_port`]).
    port: Option<u16>,
    credentials: Credentials,
    /// Bound on `POST /switchover`, which Patroni answers once the candidate leads.
    switchover_timeout: Duration,
    /// The HTTP client of every endpoint reached, so a later call of the same round (the
    /// switchover, given a report's endpoints) reaches it the same way.
    reached: Mutex<BTreeMap<String, reqwest::Client>>,
}

/// One member's API: its base URL and the HTTP client that reaches it.
struct Target {
    pod: String,
    base: String,
    http: reqwest::Client,
}

impl PatroniClient {
    /// The client of a request's `spec.database.patroni`: reads the TLS and auth Secrets when
    /// they are named.
    pub async fn from_spec(
        client: &kube::Client,
        namespace: &str,
        spec: &DatabaseSpec,
    ) -> Result<Self, EngineError> {
        let p = spec.patroni.clone().unwrap_or_default();
        let credentials = secrets::credentials(
            client,
            namespace,
            p.tls_secret_name.as_deref(),
            p.auth_secret_name.as_deref(),
        )
        .await?;
        let seconds = p
            .switchover_timeout_seconds
            .unwrap_or(DEFAULT_SWITCHOVER_TIMEOUT_SECONDS);
        Ok(Self {
            port: p.api_port,
            credentials,
            switchover_timeout: Duration::from_secs(u64::from(seconds)),
            reached: Mutex::default(),
        })
    }

    /// The API of `pod`, when it has an IP: plain HTTP at the IP, or HTTPS at the pod's host
    /// name (`hostname.subdomain.namespace.svc.cluster.local`, resolved to the IP).
    fn target(&self, pod: &Pod) -> Result<Option<Target>, EngineError> {
        let info = PodInfo::of(pod);
        let Some(ip) = info.ip.as_deref().and_then(|ip| ip.parse::<IpAddr>().ok()) else {
            return Ok(None);
        };
        let port = self.port.unwrap_or_else(|| patroni::api_port(pod));
        let mut builder = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(REQUEST_TIMEOUT);
        let base = match &self.credentials.tls {
            None => format!("http://{ip}:{port}"),
            Some(tls) => {
                let host = patroni::tls_host(pod).unwrap_or_else(|| ip.to_string());
                builder =
                    builder
                        .use_rustls_tls()
                        .tls_built_in_root_certs(false)
                        .add_root_certificate(reqwest::Certificate::from_pem(&tls.ca).map_err(
                            |e| EngineError::Other(format!("the TLS Secret's ca.crt: {e}")),
                        )?)
                        .resolve(&host, SocketAddr::new(ip, port));
                if let Some((cert, key)) = &tls.identity {
                    let pem = [cert.as_slice(), b"\n", key.as_slice()].concat();
                    let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
                        EngineError::Other(format!("the TLS Secret's tls.crt/tls.key: {e}"))
                    })?;
                    builder = builder.identity(identity);
                }
                format!("https://{host}:{port}")
            }
        };
        let http = builder
            .build()
            .map_err(|e| EngineError::Other(format!("cannot build the HTTP client: {e}")))?;
        if let Ok(mut reached) = self.reached.lock() {
            reached.insert(base.clone(), http.clone());
        }
        Ok(Some(Target {
            pod: info.name,
            base,
            http,
        }))
    }

    fn authorized(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.credentials.auth {
            Some(Auth { user, password }) => r.basic_auth(user, Some(password)),
            None => r,
        }
    }

    /// `GET <base><path>` as JSON; an error in words.
    async fn get<T: DeserializeOwned>(&self, t: &Target, path: &str) -> Result<T, String> {
        let url = format!("{}{path}", t.base);
        let response =
            (self.authorized(t.http.get(&url)).send().await).map_err(|e| describe(&e))?;
        let status = response.status();
        let body = response.text().await.map_err(|e| describe(&e))?;
        // `/patroni` answers 503 on a member whose PostgreSQL is not running, with the same body.
        let answered = status.is_success() || (path == "/patroni" && status.as_u16() == 503);
        if !answered {
            return Err(format!("{path}: HTTP {status}: {}", first_line(&body)));
        }
        serde_json::from_str(&body).map_err(|e| format!("{path}: unexpected answer: {e}"))
    }

    async fn view(&self, target: Option<&Target>, pod: &str) -> MemberView {
        let Some(t) = target else {
            return MemberView {
                pod: pod.to_string(),
                endpoint: None,
                status: Err("the pod has no IP".to_string()),
            };
        };
        MemberView {
            pod: t.pod.clone(),
            endpoint: Some(t.base.clone()),
            status: self.get::<MemberStatus>(t, "/patroni").await,
        }
    }

    /// Every member pod's `/patroni`, then `/cluster` and `/config` from the first that
    /// answered; assessed.
    #[instrument(skip_all, fields(pods = pods.len()))]
    pub async fn observe(&self, pods: &[Pod]) -> Result<HealthReport, EngineError> {
        let (infos, targets) = self.targets(pods)?;
        let views = futures::future::join_all(
            infos
                .iter()
                .zip(&targets)
                .map(|(i, t)| self.view(t.as_ref(), &i.name)),
        )
        .await;
        let answering = (views.iter().zip(&targets))
            .find(|(v, _)| v.status.is_ok())
            .and_then(|(_, t)| t.as_ref());
        let (cluster, config) = match answering {
            None => (Err("no member's API answered".to_string()), None),
            Some(t) => (
                self.get::<ClusterView>(t, "/cluster").await,
                self.get::<DynamicConfig>(t, "/config").await.ok(),
            ),
        };
        let report = patroni::assess(
            &infos,
            &Observed {
                cluster,
                config,
                views,
            },
        );
        debug!(leader = ?report.leader, problems = ?report.problems, "patroni health");
        Ok(report)
    }

    /// The pods in ordinal order with their targets.
    fn targets(&self, pods: &[Pod]) -> Result<(Vec<PodInfo>, Vec<Option<Target>>), EngineError> {
        let mut sorted: Vec<&Pod> = pods.iter().collect();
        sorted.sort_by_key(|p| patroni::sort_key(p));
        let infos = sorted.iter().map(|p| PodInfo::of(p)).collect();
        let targets = sorted
            .iter()
            .map(|p| self.target(p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((infos, targets))
    }

    /// `POST /switchover` on the leader `from` naming `to` as candidate. Patroni answers once
    /// the candidate holds the leader lock; no wait follows (the gate waits for the old leader
    /// to stream again). Ok at once when `to` already leads. A refusal (not 2xx) and an answer
    /// that does not come within the switchover timeout are errors; after a timeout Patroni may
    /// still complete the switchover, which the next observation shows.
    #[instrument(skip(self, report))]
    pub async fn switchover(
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
        let name = |pod: &str| {
            (report.members.iter())
                .find(|m| m.pod == pod)
                .and_then(|m| m.member_id.clone())
                .ok_or_else(|| fail(format!("no Patroni member name known for {pod}")))
        };
        let (leader, candidate) = (name(from)?, name(to)?);
        let endpoint = (report.members.iter())
            .find(|m| m.pod == from)
            .and_then(|m| m.endpoint.clone())
            .ok_or_else(|| fail(format!("no API endpoint known for {from}")))?;
        let body = serde_json::json!({"leader": leader, "candidate": candidate});
        info!(%leader, %candidate, "asking Patroni for a switchover");
        let http = self.http_for(&endpoint).map_err(|e| fail(e.to_string()))?;
        let request = http
            .post(format!("{endpoint}/switchover"))
            .timeout(self.switchover_timeout)
            .json(&body);
        let response = self.authorized(request).send().await.map_err(|e| {
            fail(match e.is_timeout() {
                true => format!(
                    "Patroni did not answer POST /switchover within {} s (it may still switch \
                     over; the next look at the cluster shows whether it did)",
                    self.switchover_timeout.as_secs()
                ),
                false => format!("POST /switchover: {}", describe(&e)),
            })
        })?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        if !status.is_success() {
            return Err(fail(format!(
                "Patroni refused the switchover (HTTP {status}): {}",
                first_line(&text)
            )));
        }
        info!(answer = %first_line(&text), "Patroni switched over");
        Ok(())
    }

    /// The HTTP client of an endpoint `observe` reached in this round (the same TLS host name
    /// and address).
    fn http_for(&self, endpoint: &str) -> Result<reqwest::Client, EngineError> {
        let known = self
            .reached
            .lock()
            .ok()
            .and_then(|m| m.get(endpoint).cloned());
        known.ok_or_else(|| {
            EngineError::Other(format!(
                "{endpoint} was not reached by this round's observation"
            ))
        })
    }

    /// The leader's WAL position and timeline now, then (bounded) until every replica has
    /// replayed it on that timeline.
    #[instrument(skip_all)]
    pub async fn final_hash(&self, pods: &[Pod]) -> Result<FinalHash, EngineError> {
        let report = self.observe(pods).await?;
        let leader = report
            .leader
            .clone()
            .ok_or_else(|| EngineError::Other("Patroni reports no leader".to_string()))?;
        let (infos, targets) = self.targets(pods)?;
        let target = |pod: &str| {
            (infos.iter().zip(&targets))
                .find(|(i, _)| i.name == pod)
                .and_then(|(_, t)| t.as_ref())
        };
        let lt = target(&leader)
            .ok_or_else(|| EngineError::Other(format!("the leader {leader} has no IP")))?;
        let s: MemberStatus = self.get(lt, "/patroni").await.map_err(EngineError::Other)?;
        let (Some(timeline), Some(position)) = (s.timeline, s.xlog.location) else {
            return Err(EngineError::Other(format!(
                "the leader {leader} reports no timeline or WAL position"
            )));
        };
        let deadline = tokio::time::Instant::now() + REPLAY_WAIT;
        loop {
            let mut replicas = Vec::new();
            for i in infos.iter().filter(|i| i.name != leader) {
                let status = match target(&i.name) {
                    Some(t) => self.get::<MemberStatus>(t, "/patroni").await.ok(),
                    None => None,
                };
                replicas.push((
                    i.name.clone(),
                    status.as_ref().and_then(|s| s.timeline),
                    status.as_ref().and_then(|s| s.xlog.replayed_location),
                ));
            }
            match agreed_replay((&leader, timeline, position), &replicas) {
                Ok(h) => return Ok(h),
                Err(why) if tokio::time::Instant::now() >= deadline => {
                    return Err(EngineError::Other(why));
                }
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
    }
}

/// The Patroni client as the engine's I/O half; a handover is a switchover (Patroni answers once
/// the candidate leads; the rejoin of the old leader is the gate's to wait for).
impl DatabaseClient for PatroniClient {
    fn name(&self) -> &'static str {
        "Patroni"
    }

    fn observe<'a>(&'a self, pods: &'a [Pod]) -> BoxFuture<'a, Result<HealthReport, EngineError>> {
        Box::pin(PatroniClient::observe(self, pods))
    }

    fn hand_over<'a>(
        &'a self,
        report: &'a HealthReport,
        from: &'a str,
        to: &'a str,
    ) -> BoxFuture<'a, Result<(), EngineError>> {
        Box::pin(self.switchover(report, from, to))
    }

    fn final_hash<'a>(
        &'a self,
        pods: &'a [Pod],
    ) -> BoxFuture<'a, Result<Option<FinalHash>, EngineError>> {
        Box::pin(async move { PatroniClient::final_hash(self, pods).await.map(Some) })
    }
}

/// An HTTP client error in one line, with its innermost cause.
fn describe(e: &reqwest::Error) -> String {
    super::with_innermost_cause(e.to_string(), e)
}

fn first_line(body: &str) -> String {
    body.lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(300)
        .collect()
}
