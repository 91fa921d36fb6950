//! The ZooKeeper client: the four-letter words `srvr` and `mntr` on each member pod's client
//! port, at `<podIP>:<clientPort>` (no cluster DNS needed). One word per TCP connection: the
//! word is written, the answer read until the server closes the connection, every step bounded.
//! ZooKeeper answers only the words listed in `4lw.commands.whitelist` in zoo.cfg
//! (`srvr,mntr,ruok`); a member that refuses one is an unhealthy member whose problem names that
//! setting. The answers go to the pure [`crate::engine::zookeeper::assess`]; the final check is
//! every member serving the same last zxid and znode count.

use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::{debug, instrument};

use super::secrets::{self, Auth};
use super::{Client as DatabaseClient, EngineError};
use crate::api::{DatabaseSpec, ZooKeeperHandover, ZooKeeperSpec};
use crate::engine::InvalidSettings;
use crate::engine::zookeeper::{self, MemberView, PodInfo, Refusal, ServedState, agreed_state};
use crate::engine::{FinalHash, HealthReport, pod_ordinal};

/// Bound on one word: connecting, writing, and reading the whole answer.
const WORD_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on the size of an answer (`mntr` is a few KiB).
const MAX_ANSWER: u64 = 1 << 20;
/// How often the final check reads the members again while they differ.
const POLL: Duration = Duration::from_millis(100);
/// How long the final check reads until the members agree before it reports "not yet" (it
/// is asked again until the request's timeout).
const AGREE_WAIT: Duration = Duration::from_secs(10);

/// The ZooKeeper client of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZooKeeperClient {
    /// `spec.database.zookeeper.clientPort`.
    port: u16,
    /// `spec.database.zookeeper.handover`.
    handover: ZooKeeperHandover,
    /// The digest auth sent before a `reconfig` (`authSecretName`).
    auth: Option<Auth>,
}

impl ZooKeeperClient {
    /// The client of a request's `spec.database.zookeeper`, with the auth Secret it names read
    /// in `namespace` (the words need no credentials; a `reconfig` may).
    pub async fn from_spec(
        client: &kube::Client,
        namespace: &str,
        spec: &DatabaseSpec,
    ) -> Result<Self, EngineError> {
        let settings = spec.zookeeper.clone().unwrap_or_default();
        let name = settings.auth_secret_name.as_deref();
        if name.is_some() && settings.handover != ZooKeeperHandover::Reconfig {
            return Err(EngineError::Config(InvalidSettings(
                "spec.database.zookeeper.authSecretName is only for handover: Reconfig".into(),
            )));
        }
        let auth = secrets::credentials(client, namespace, None, name)
            .await?
            .auth;
        Ok(Self::new(&settings, auth))
    }

    /// The client of `settings`, with `auth` already read.
    pub fn new(settings: &ZooKeeperSpec, auth: Option<Auth>) -> Self {
        Self {
            port: settings.client_port,
            handover: settings.handover,
            auth,
        }
    }

    fn endpoint(&self, pod: &Pod) -> Option<String> {
        let ip = pod.status.as_ref()?.pod_ip.as_deref()?;
        Some(match ip.contains(':') {
            true => format!("[{ip}]:{}", self.port),
            false => format!("{ip}:{}", self.port),
        })
    }

    /// `srvr` and `mntr` of one pod.
    async fn view(&self, pod: &Pod) -> MemberView {
        let info = PodInfo {
            name: pod.metadata.name.clone().unwrap_or_default(),
            terminating: pod.metadata.deletion_timestamp.is_some(),
        };
        let Some(endpoint) = self.endpoint(pod) else {
            let none = || Refusal::NoAnswer {
                word: "srvr".into(),
                endpoint: "(no IP)".into(),
                message: "the pod has no IP".into(),
            };
            return MemberView {
                pod: info,
                endpoint: None,
                srvr: Err(none()),
                mntr: Err(none()),
            };
        };
        let (srvr, mntr) = futures::join!(
            four_letter_word(&endpoint, "srvr"),
            four_letter_word(&endpoint, "mntr")
        );
        MemberView {
            pod: info,
            srvr: srvr.and_then(|t| zookeeper::parse_srvr(&t)),
            mntr: mntr.and_then(|t| zookeeper::parse_mntr(&t)),
            endpoint: Some(endpoint),
        }
    }

    /// Every member pod's `srvr` and `mntr`, assessed.
    #[instrument(skip_all, fields(pods = pods.len()))]
    pub async fn observe(&self, pods: &[Pod]) -> HealthReport {
        let views = futures::future::join_all(sorted(pods).into_iter().map(|p| self.view(p))).await;
        let report = zookeeper::assess(&views);
        debug!(leader = ?report.leader, problems = ?report.problems, "zookeeper health");
        report
    }

    /// Each member's last zxid and znode count, read together, until (bounded) all agree.
    #[instrument(skip_all)]
    pub async fn final_hash(&self, pods: &[Pod]) -> Result<FinalHash, EngineError> {
        let pods = sorted(pods);
        if pods.is_empty() {
            return Err(EngineError::Other("no member pod to compare".to_string()));
        }
        let deadline = tokio::time::Instant::now() + AGREE_WAIT;
        loop {
            let views = futures::future::join_all(pods.iter().map(|p| self.state(p))).await;
            match agreed_state(&views) {
                Ok(h) => return Ok(h),
                Err(why) if tokio::time::Instant::now() >= deadline => {
                    return Err(EngineError::Other(why));
                }
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// `(pod, its last zxid and znode count)` from one `srvr`.
    async fn state(&self, pod: &Pod) -> (String, Result<ServedState, String>) {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let Some(endpoint) = self.endpoint(pod) else {
            return (name, Err("the pod has no IP".to_string()));
        };
        let answer = four_letter_word(&endpoint, "srvr")
            .await
            .and_then(|t| zookeeper::parse_srvr(&t))
            .map_err(|e| e.to_string())
            .and_then(|s| match s.node_count {
                Some(znodes) => Ok(ServedState {
                    zxid: s.zxid,
                    znodes,
                }),
                None => Err("srvr gives no node count".to_string()),
            });
        (name, answer)
    }
}

#[path = "zookeeper_reconfig.rs"]
mod reconfig;

fn sorted(pods: &[Pod]) -> Vec<&Pod> {
    let mut sorted: Vec<&Pod> = pods.iter().collect();
    sorted.sort_by_key(|p| {
        let name = p.metadata.name.clone().unwrap_or_default();
        (pod_ordinal(&name).unwrap_or(u32::MAX), name)
    });
    sorted
}

/// Sends `word` to `endpoint` and reads the answer until the server closes the connection.
pub async fn four_letter_word(endpoint: &str, word: &str) -> Result<String, Refusal> {
    let no_answer = |message: String| Refusal::NoAnswer {
        word: word.to_string(),
        endpoint: endpoint.to_string(),
        message,
    };
    let exchange = async {
        let mut stream = TcpStream::connect(endpoint).await?;
        stream.write_all(word.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.take(MAX_ANSWER).read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    match tokio::time::timeout(WORD_TIMEOUT, exchange).await {
        Err(_) => Err(no_answer(format!(
            "no complete answer within {} s",
            WORD_TIMEOUT.as_secs()
        ))),
        Ok(Err(e)) => Err(no_answer(e.to_string())),
        Ok(Ok(bytes)) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
    }
}

/// The ZooKeeper client as the engine's I/O half: a handover only with `handover: Reconfig`
/// (see `reconfig`).
impl DatabaseClient for ZooKeeperClient {
    fn name(&self) -> &'static str {
        "ZooKeeper"
    }

    fn hand_over<'a>(
        &'a self,
        report: &'a HealthReport,
        from: &'a str,
        to: &'a str,
    ) -> BoxFuture<'a, Result<(), EngineError>> {
        Box::pin(async move {
            self.hand_over_by_reconfig(report, from)
                .await
                .map_err(|message| EngineError::LeaderTransfer {
                    from: from.to_string(),
                    to: to.to_string(),
                    message,
                })
        })
    }

    fn observe<'a>(&'a self, pods: &'a [Pod]) -> BoxFuture<'a, Result<HealthReport, EngineError>> {
        Box::pin(async move { Ok(ZooKeeperClient::observe(self, pods).await) })
    }

    /// With `handover: Reconfig`: whether the ensemble allows reconfiguration (a handover
    /// refused later for it is reported by the handover itself).
    fn preflight_problems<'a>(&'a self, pods: &'a [Pod]) -> BoxFuture<'a, Vec<String>> {
        Box::pin(async move {
            if self.handover != ZooKeeperHandover::Reconfig {
                return Vec::new();
            }
            let endpoints: Vec<String> = pods.iter().filter_map(|p| self.endpoint(p)).collect();
            self.reconfig_allowed(&endpoints)
                .await
                .err()
                .into_iter()
                .collect()
        })
    }

    fn final_hash<'a>(
        &'a self,
        pods: &'a [Pod],
    ) -> BoxFuture<'a, Result<Option<FinalHash>, EngineError>> {
        Box::pin(async move { ZooKeeperClient::final_hash(self, pods).await.map(Some) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A one-shot server answering each connection with `answer` after reading the word.
    async fn server(answer: &'static str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let mut word = [0u8; 4];
                let _ = s.read_exact(&mut word).await;
                let _ = s.write_all(answer.as_bytes()).await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_word_is_answered_until_the_server_closes() {
        let addr = server("Zxid: 0x10\nMode: follower\nNode count: 5\n").await;
        let text = four_letter_word(&addr, "srvr").await.unwrap();
        let s = zookeeper::parse_srvr(&text).unwrap();
        assert_eq!((s.zxid, s.node_count), (0x10, Some(5)));
        let refused = server("mntr is not executed because it is not in the whitelist.\n").await;
        let text = four_letter_word(&refused, "mntr").await.unwrap();
        let e = zookeeper::parse_mntr(&text).unwrap_err();
        assert!(e.to_string().contains("4lw.commands.whitelist"), "{e}");
    }

    #[tokio::test]
    async fn a_closed_port_is_no_answer() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let e = four_letter_word(&addr, "srvr").await.unwrap_err();
        assert!(
            matches!(&e, Refusal::NoAnswer { word, endpoint, .. } if word == "srvr" && *endpoint == addr),
            "{e:?}"
        );
    }

    #[test]
    fn the_port_and_the_handover_come_from_the_settings() {
        let mut settings = ZooKeeperSpec::default();
        let client = ZooKeeperClient::new(&settings, None);
        assert_eq!(
            (client.port, client.handover),
            (2181, ZooKeeperHandover::Election)
        );
        settings.client_port = 12181;
        settings.handover = ZooKeeperHandover::Reconfig;
        let client = ZooKeeperClient::new(&settings, None);
        assert_eq!(
            (client.port, client.handover),
            (12181, ZooKeeperHandover::Reconfig)
        );
    }
}
