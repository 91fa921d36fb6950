//! The database clients: the I/O half of the engines. Each engine's client implements
//! [`Client`]: it reads the Secrets the spec names, asks the members, and hands the answers to
//! its pure assessment in [`crate::engine`] (which decides on them). [`Engine::from_spec`] is
//! the one list of clients.
//!
//! - Generic: asks nothing; health is a pure function of the member pods.
//! - [`etcd`]: one client per member endpoint (`status`, `member list`, `alarm list`,
//!   MoveLeader, `hash_kv`).
//! - [`patroni`]: Patroni's REST API on each member (`/patroni`, `/cluster`, `/config`,
//!   `POST /switchover`).
//! - [`redis`]: Redis and Sentinel on each member pod (`INFO replication`, `SENTINEL
//!   get-master-addr-by-name`, `SENTINEL CKQUORUM`; a Sentinel failover with writes paused).
//! - [`zookeeper`]: the four-letter words `srvr` and `mntr` on each member's client port.
//! - [`secrets`]: the TLS and auth Secrets a request names, read with the API server's client.

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;

use crate::api::{DatabaseEngine, DatabaseSpec};
use crate::engine::generic::Generic;
use crate::engine::{FinalHash, FinalHashError, HealthReport, InvalidSettings};

pub mod etcd;
pub mod patroni;
pub mod redis;
pub mod secrets;
pub mod zookeeper;

pub use etcd::EtcdClient;
pub use patroni::PatroniClient;
pub use redis::RedisClient;
pub use zookeeper::ZooKeeperClient;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot reach member {pod} at {endpoint}: {message}")]
    Unreachable {
        pod: String,
        endpoint: String,
        message: String,
    },
    #[error("leadership transfer from {from} to {to} failed: {message}")]
    LeaderTransfer {
        from: String,
        to: String,
        message: String,
    },
    #[error("cannot read secret {name}: {message}")]
    Secret { name: String, message: String },
    /// RedisSentinel: the Service `redisSentinel.sentinelService` names gives no Sentinel.
    #[error("the Sentinel Service {name} {message}")]
    SentinelService { name: String, message: String },
    /// The request's `spec.database` cannot be used (e.g. a malformed leader label).
    #[error("{0}")]
    Config(#[from] InvalidSettings),
    /// Members disagree where they must agree (etcd: `hash_kv` at a common revision).
    #[error("members are inconsistent: {0}")]
    Inconsistent(String),
    #[error("{0}")]
    Other(String),
}

impl From<FinalHashError> for EngineError {
    fn from(e: FinalHashError) -> Self {
        match e {
            FinalHashError::Inconsistent(message) => EngineError::Inconsistent(message),
            FinalHashError::Engine(message) => EngineError::Other(message),
        }
    }
}

impl From<EngineError> for FinalHashError {
    /// For the planner: the same words, typed by whether members disagree.
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Inconsistent(message) => FinalHashError::Inconsistent(message),
            other => FinalHashError::Engine(other.to_string()),
        }
    }
}

/// `text`, then `": <cause>"` with the innermost cause of `e` (its last `source()`), when that
/// says something `text` does not (a client library's error often hides the cause that
/// matters, e.g. `connection refused`).
pub(crate) fn with_innermost_cause(text: String, e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e.source();
    let mut innermost = None;
    while let Some(c) = cause {
        innermost = Some(c);
        cause = c.source();
    }
    match innermost.map(|c| c.to_string()) {
        Some(c) if !c.is_empty() && !text.contains(&c) => format!("{text}: {c}"),
        _ => text,
    }
}

/// The I/O half of an engine (see the module doc). Members that do not answer are reported
/// unhealthy in the report, not as an error: an error means the client itself could not work.
pub trait Client: std::fmt::Debug + Send + Sync {
    /// Short name for logs and Events.
    fn name(&self) -> &'static str;

    /// Looks at every member pod.
    fn observe<'a>(&'a self, pods: &'a [Pod]) -> BoxFuture<'a, Result<HealthReport, EngineError>>;

    /// Hands leadership from `from` (the current leader) to `to`, and waits (bounded) until `to`
    /// leads. Idempotent: Ok when `to` already leads. Default: an error (an engine whose rules
    /// never ask for a handover).
    fn hand_over<'a>(
        &'a self,
        _report: &'a HealthReport,
        from: &'a str,
        to: &'a str,
    ) -> BoxFuture<'a, Result<(), EngineError>> {
        let name = self.name();
        Box::pin(async move {
            Err(EngineError::LeaderTransfer {
                from: from.to_string(),
                to: to.to_string(),
                message: format!("the {name} engine cannot hand leadership over"),
            })
        })
    }

    /// What keeps this database from being migrated at all that the members' answers do not
    /// show, asked in preflight only (ZooKeeper with `handover: Reconfig`: reconfiguration
    /// off); each becomes a problem of the report. Default: none.
    fn preflight_problems<'a>(&'a self, _pods: &'a [Pod]) -> BoxFuture<'a, Vec<String>> {
        Box::pin(async { Vec::new() })
    }

    /// A digest of the data all members agree on, once every member is migrated, for the
    /// engines whose final check is an agreement; `None` for the others (default).
    fn final_hash<'a>(
        &'a self,
        _pods: &'a [Pod],
    ) -> BoxFuture<'a, Result<Option<FinalHash>, EngineError>> {
        Box::pin(async { Ok(None) })
    }
}

/// The database client a request uses, chosen by `spec.database.engine`.
#[derive(Debug)]
pub struct Engine(Box<dyn Client>);

impl Engine {
    /// Builds the client of a request's engine, reading the Secrets its settings name: the
    /// only list of clients.
    pub async fn from_spec(
        client: &kube::Client,
        namespace: &str,
        spec: &DatabaseSpec,
    ) -> Result<Engine, EngineError> {
        Ok(Engine(match spec.engine {
            DatabaseEngine::Generic => Box::new(Generic::new(spec.generic.as_ref())?),
            DatabaseEngine::Etcd => Box::new(EtcdClient::from_spec(client, namespace, spec).await?),
            DatabaseEngine::Patroni => {
                Box::new(PatroniClient::from_spec(client, namespace, spec).await?)
            }
            DatabaseEngine::RedisSentinel => {
                Box::new(RedisClient::from_spec(client, namespace, spec).await?)
            }
            DatabaseEngine::ZooKeeper => {
                Box::new(ZooKeeperClient::from_spec(client, namespace, spec).await?)
            }
        }))
    }

    /// Short name for logs and Events.
    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    /// See [`Client::observe`].
    pub async fn observe(&self, pods: &[Pod]) -> Result<HealthReport, EngineError> {
        self.0.observe(pods).await
    }

    /// See [`Client::preflight_problems`].
    pub async fn preflight_problems(&self, pods: &[Pod]) -> Vec<String> {
        self.0.preflight_problems(pods).await
    }

    /// See [`Client::hand_over`].
    pub async fn transfer_leadership(
        &self,
        report: &HealthReport,
        from: &str,
        to: &str,
    ) -> Result<(), EngineError> {
        self.0.hand_over(report, from, to).await
    }

    /// See [`Client::final_hash`].
    pub async fn final_hash(&self, pods: &[Pod]) -> Result<Option<FinalHash>, EngineError> {
        self.0.final_hash(pods).await
    }
}

/// The Generic engine asks nothing: its health is a pure function of the pods.
impl Client for Generic {
    fn name(&self) -> &'static str {
        "Generic"
    }

    fn observe<'a>(&'a self, pods: &'a [Pod]) -> BoxFuture<'a, Result<HealthReport, EngineError>> {
        let report = Generic::observe(self, pods);
        Box::pin(async move { Ok(report) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine whose only trait is a preflight problem.
    #[derive(Debug)]
    struct RefusesInPreflight;

    impl Client for RefusesInPreflight {
        fn name(&self) -> &'static str {
            "test"
        }

        fn observe<'a>(&'a self, _: &'a [Pod]) -> BoxFuture<'a, Result<HealthReport, EngineError>> {
            Box::pin(async { Ok(HealthReport::default()) })
        }

        fn preflight_problems<'a>(&'a self, _: &'a [Pod]) -> BoxFuture<'a, Vec<String>> {
            Box::pin(async { vec!["reconfiguration is off".to_string()] })
        }
    }

    #[tokio::test]
    async fn preflight_problems_are_not_part_of_every_look() {
        let engine = Engine(Box::new(RefusesInPreflight));
        assert_eq!(
            engine.preflight_problems(&[]).await,
            ["reconfiguration is off"]
        );
        let report = engine.observe(&[]).await.unwrap();
        assert!(report.problems.is_empty(), "{report:?}");
    }

    #[test]
    fn final_hash_errors_keep_their_words() {
        let inconsistent = EngineError::Inconsistent("hash_kv at revision 4 differs".into());
        let text = inconsistent.to_string();
        let typed = FinalHashError::from(inconsistent);
        assert_eq!(
            typed,
            FinalHashError::Inconsistent("hash_kv at revision 4 differs".into())
        );
        assert_eq!(typed.to_string(), text);
        let unreachable = EngineError::Unreachable {
            pod: "etcd-0".into(),
            endpoint: "http://198.18.0.10:2379".into(),
            message: "refused".into(),
        };
        let text = unreachable.to_string();
        assert_eq!(FinalHashError::from(unreachable).to_string(), text);
        let back = EngineError::from(FinalHashError::Inconsistent("x".into()));
        assert!(matches!(back, EngineError::Inconsistent(m) if m == "x"));
    }

    #[test]
    fn settings_errors_keep_their_words() {
        let e = EngineError::from(InvalidSettings("leaderLabel must be key=value".into()));
        assert_eq!(
            e.to_string(),
            "invalid database settings: leaderLabel must be key=value"
        );
    }
}
