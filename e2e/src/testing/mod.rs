//! Helpers for end-to-end scenarios. They work against any cluster `KUBECONFIG` points at (the
//! local cluster from `localcluster up`, kind, a staging cluster): storage class names and the
//! mover image come from the environment.
//!
//! - [`TestCluster`]: the client and the scenario settings.
//! - [`TestNamespace`]: a unique namespace per test, deleted on drop; YAML apply, waits, claims,
//!   one-off mover pods and Jobs.
//! - [`etcd`]: one etcd client per member endpoint, member list, leader, put/get.
//! - [`operator`]: the operator as a child process, the CRD, creating and awaiting requests.
//! - [`patroni`]: the Patroni fixture, its REST API, and a PostgreSQL writer.
//! - [`redis`]: the Redis Sentinel fixture, what members and Sentinels say, and a writer.
//! - [`zookeeper`]: the ZooKeeper fixture, its four-letter words, and a znode writer.
//! - [`faults`]: faults injected into the local cluster (a node taken down).
//! - [`recording`]: a background watch that records what it sees.
//!
//! Every wait is a watch bounded by a timeout; a timeout error says what was awaited and the
//! object's last state.

use std::fmt::Debug;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

mod cluster;
pub mod etcd;
pub mod etcd_writer;
pub mod faults;
pub mod fleet;
pub mod helm;
mod namespace;
mod objects;
pub mod operator;
pub mod patroni;
mod pods;
pub mod procs;
pub mod rbac;
pub mod recording;
pub mod redis;
pub mod require;
mod waits;
pub mod zookeeper;

pub use cluster::TestCluster;
pub use namespace::TestNamespace;
pub use objects::{
    assert_claims_bound, claim_manifest, fixture_path, node_satisfies, one_claim_deployment,
    one_member_set, requested_size, set_template_class,
};
pub use pods::{ClaimMount, JobOutcome, MoverSpec, PodOutcome, describe_pod, mover_pod_spec};

/// Field manager of every server-side apply done by the tests.
pub const FIELD_MANAGER: &str = "storage-migrator-e2e";
/// Default mover image: the project's own image at this version (the operator's default
/// `--image`), which `test-all.sh` builds and loads into the local cluster's image store.
pub const DEFAULT_MOVER_IMAGE: &str = storage_migrator::image::DEFAULT_IMAGE;

#[derive(Debug, thiserror::Error)]
pub enum TestError {
    #[error("KUBECONFIG is not set: set KUBECONFIG to a cluster, e.g. from `localcluster up`")]
    NoKubeconfig,
    #[error("cannot load KUBECONFIG: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("invalid YAML: {0}")]
    Yaml(#[from] serde_norway::Error),
    #[error("manifest document {index} has no apiVersion/kind or name")]
    Manifest { index: usize },
    #[error("cannot read fixture {path}: {source}")]
    Fixture {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("timed out after {waited:?} waiting for {what}; last state: {last}")]
    Timeout {
        what: String,
        waited: Duration,
        last: String,
    },
    #[error("watch for {what} failed: {detail}")]
    Watch { what: String, detail: String },
    #[error("{what}: {detail}")]
    Unexpected { what: String, detail: String },
    #[error("etcd request to {endpoint} failed: {source}")]
    Etcd {
        endpoint: String,
        source: etcd_client::Error,
    },
}

fn unexpected(what: impl Into<String>, detail: impl Into<String>) -> TestError {
    TestError::Unexpected {
        what: what.into(),
        detail: detail.into(),
    }
}

/// Installs a test-friendly tracing subscriber once (`RUST_LOG` filters, default `info`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// How long the etcd fixture may take to reach 3/3 Ready.
pub const ETCD_READY: Duration = Duration::from_secs(300);

/// How long a request's final Event may follow its final status (written first) on a busy
/// machine.
pub const FINAL_EVENT: Duration = Duration::from_secs(60);

/// The start of every scenario: tracing, the cluster `KUBECONFIG` points at, and a fresh
/// namespace for `test`. Panics with a clear message when the cluster cannot be reached.
pub async fn scenario(test: &str) -> (TestCluster, TestNamespace) {
    init_tracing();
    let cluster = TestCluster::from_env()
        .await
        .unwrap_or_else(|e| panic!("cannot reach the cluster under test: {e}"));
    let ns = cluster
        .namespace(test)
        .await
        .unwrap_or_else(|e| panic!("cannot create the namespace of {test}: {e}"));
    (cluster, ns)
}

/// Runs `work` with a client of `config` from a `Drop`: the test's runtime may be
/// single-threaded and blocked in that drop, so on a thread of its own with a runtime and
/// client of its own, waiting for it to end. Its error, or why it could not run.
pub(crate) fn from_drop<W, F>(config: kube::Config, work: W) -> Result<(), String>
where
    W: FnOnce(kube::Client) -> F + Send + 'static,
    F: std::future::Future<Output = Result<(), String>>,
{
    let handle = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
            work(client).await
        })
    });
    handle
        .join()
        .map_err(|_| "the thread panicked".to_string())?
}

/// A random 6-hex-digit suffix (from std's randomly seeded hasher; no crate needed).
pub fn random_suffix() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.write_u32(std::process::id());
    format!("{:06x}", h.finish() & 0xff_ffff)
}

/// `e2e-<test>-<suffix>`, the test name reduced to a valid DNS label.
pub fn namespace_name(test: &str, suffix: &str) -> String {
    let mut base: String = test
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    while base.contains("--") {
        base = base.replace("--", "-");
    }
    let base = base.trim_matches('-');
    // 63 max: "e2e-" (4) + base + "-" (1) + suffix.
    let room = 63usize.saturating_sub(5 + suffix.len());
    let base: String = base.chars().take(room).collect();
    let base = base.trim_end_matches('-');
    if base.is_empty() {
        format!("e2e-{suffix}")
    } else {
        format!("e2e-{base}-{suffix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names_are_dns_labels() {
        assert_eq!(
            namespace_name("etcd_ready", "abc123"),
            "e2e-etcd-ready-abc123"
        );
        assert_eq!(namespace_name("A::B__c", "000001"), "e2e-a-b-c-000001");
        assert_eq!(namespace_name("__", "ffffff"), "e2e-ffffff");
        let long = namespace_name(&"x".repeat(200), "abcdef");
        assert!(long.len() <= 63, "{long}");
        assert!(long.ends_with("-abcdef"));
    }

    #[test]
    fn random_suffixes_differ() {
        let a = random_suffix();
        let b = random_suffix();
        assert_eq!(a.len(), 6);
        assert_ne!(a, b);
    }
}
