//! The database clients: the I/O half of the engines. [`Engine`] is chosen by
//! `spec.database.engine`; it reads the Secrets the spec names, asks the members, and hands the
//! answers to the pure assessment in [`crate::engine`].
//!
//! - Generic: lists nothing itself; health is a pure function of the member pods.
//! - [`etcd`]: one client per member endpoint (`status`, `member list`, `alarm list`,
//!   MoveLeader, `hash_kv`).
//! - [`secrets`]: the TLS and auth Secrets of an etcd request, read with the API server's client.

use k8s_openapi::api::core::v1::Pod;

use crate::api::{DatabaseEngine, DatabaseSpec};
use crate::engine::generic::Generic;
use crate::engine::{FinalHash, FinalHashError, HealthReport, InvalidSettings};

pub mod etcd;
pub mod secrets;

pub use etcd::EtcdClient;

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

/// The database logic a request uses, chosen by `spec.database.engine`.
#[derive(Debug)]
pub enum Engine {
    Generic(Generic),
    Etcd(EtcdClient),
}

impl Engine {
    /// Builds the engine of a request. Etcd: reads the TLS Secret (`ca.crt`, `tls.crt`,
    /// `tls.key`) and the auth Secret (`username`, `password`) when they are named.
    pub async fn from_spec(
        client: &kube::Client,
        namespace: &str,
        spec: &DatabaseSpec,
    ) -> Result<Engine, EngineError> {
        match spec.engine {
            DatabaseEngine::Generic => Ok(Engine::Generic(Generic::new(spec.generic.as_ref())?)),
            DatabaseEngine::Etcd => {
                let etcd = spec.etcd.clone().unwrap_or_default();
                let credentials = secrets::etcd_credentials(client, namespace, &etcd).await?;
                Ok(Engine::Etcd(EtcdClient::new(etcd.client_port, credentials)))
            }
        }
    }

    /// Short name for logs and Events.
    pub fn name(&self) -> &'static str {
        match self {
            Engine::Generic(_) => "Generic",
            Engine::Etcd(_) => "Etcd",
        }
    }

    /// Looks at every member pod. Members that do not answer are reported unhealthy in the
    /// report (not as an error); an error means the engine itself could not work.
    pub async fn observe(&self, pods: &[Pod]) -> Result<HealthReport, EngineError> {
        match self {
            Engine::Generic(g) => Ok(g.observe(pods)),
            Engine::Etcd(e) => Ok(e.observe(pods).await),
        }
    }

    /// Hands leadership from `from` (the current leader) to `to`, and waits until every member
    /// reports the new leader. Idempotent: Ok when `to` already leads. Generic: an error (a
    /// label-marked leader cannot be moved by us; the generic gates never ask for it).
    pub async fn transfer_leadership(
        &self,
        report: &HealthReport,
        from: &str,
        to: &str,
    ) -> Result<(), EngineError> {
        match self {
            Engine::Generic(_) => Err(EngineError::LeaderTransfer {
                from: from.to_string(),
                to: to.to_string(),
                message: "the Generic engine cannot transfer leadership".to_string(),
            }),
            Engine::Etcd(e) => e.transfer_leadership(report, from, to).await,
        }
    }

    /// A digest of the data all members agree on, once every member is migrated. Etcd:
    /// `hash_kv` at a common revision on every member, as `"<hash>@<revision>"`; an error when
    /// members differ. Generic: `None`.
    pub async fn final_hash(&self, pods: &[Pod]) -> Result<Option<FinalHash>, EngineError> {
        match self {
            Engine::Generic(_) => Ok(None),
            Engine::Etcd(e) => e.final_hash(pods).await.map(Some),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
