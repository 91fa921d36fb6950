//! etcd helpers: one client per member endpoint (a multi-endpoint client answers `status` from
//! any one of them).
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use super::{TestError, TestNamespace};

/// One etcd member, reached at its pod IP.
pub struct EtcdMember {
    pub pod: String,
    pub endpoint: String,
    pub client: Client,
}

impl std::fmt::Debug for EtcdMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdMember")
            .field("pod", &self.pod)
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

/// What one member reports about the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    /// This member's id.
    pub id: u64,
    /// The leader this member knows (0: none).
    pub leader: u64,
    /// `(id, name, is_learner)` of every member.
    pub members: Vec<(u64, String, bool)>,
}

fn err(endpoint: &str) -> impl FnOnce(etcd_client::Error) -> TestError {
    let endpoint = endpoint.to_string();
    move |source| TestError::Etcd { endpoint, source }
}

/// A client for exactly one endpoint (`http://<ip>:2379`).
pub async fn connect(endpoint: &str) -> Result<Client, TestError> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(10));
    Client::connect([endpoint], Some(options))
        .await
        .map_err(err(endpoint))
}

/// `pod → etcd member id` of the members `<set>-0 .. <set>-(replicas-1)` (unchanged ids show
/// that no member restarted on an empty volume). Panics naming the member it cannot read.
pub async fn member_ids(
    ns: &TestNamespace,
    set: &str,
    replicas: usize,
) -> std::collections::BTreeMap<String, u64> {
    let mut ids = std::collections::BTreeMap::new();
    for mut m in members(ns, set, replicas).await.unwrap() {
        let view = m
            .view()
            .await
            .unwrap_or_else(|e| panic!("member {}: {e}", m.pod));
        ids.insert(m.pod.clone(), view.id);
    }
    ids
}

/// Clients for the members `<set>-0 .. <set>-(replicas-1)` of a StatefulSet, at their pod
/// IPs, port 2379.
pub async fn members(
    ns: &TestNamespace,
    set: &str,
    replicas: usize,
) -> Result<Vec<EtcdMember>, TestError> {
    let mut out = Vec::with_capacity(replicas);
    for i in 0..replicas {
        let pod = format!("{set}-{i}");
        out.push(member(ns, &pod).await?);
    }
    Ok(out)
}

/// A client for one member pod.
pub async fn member(ns: &TestNamespace, pod: &str) -> Result<EtcdMember, TestError> {
    let ip = ns.pod_ip(pod).await?;
    let endpoint = format!("http://{ip}:2379");
    let client = connect(&endpoint).await?;
    Ok(EtcdMember {
        pod: pod.to_string(),
        endpoint,
        client,
    })
}

impl EtcdMember {
    /// This member's view: its id, the leader it knows, the member list.
    pub async fn view(&mut self) -> Result<MemberView, TestError> {
        let status = self.client.status().await.map_err(err(&self.endpoint))?;
        let id = status.header().map(|h| h.member_id()).unwrap_or_default();
        let leader = status.leader();
        let list = self
            .client
            .member_list()
            .await
            .map_err(err(&self.endpoint))?;
        let members = list
            .members()
            .iter()
            .map(|m| (m.id(), m.name().to_string(), m.is_learner()))
            .collect();
        Ok(MemberView {
            id,
            leader,
            members,
        })
    }

    pub async fn put(&mut self, key: &str, value: &str) -> Result<(), TestError> {
        self.client
            .put(key, value, None)
            .await
            .map_err(err(&self.endpoint))?;
        Ok(())
    }

    /// The value of `key` (linearizable read), if any.
    pub async fn get(&mut self, key: &str) -> Result<Option<String>, TestError> {
        let resp = self
            .client
            .get(key, None)
            .await
            .map_err(err(&self.endpoint))?;
        Ok(resp
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }
}

/// Writes `n` keys `seed/<i>` (100 bytes each) through member `<set>-0`; returns them.
pub async fn seed_keys(
    ns: &TestNamespace,
    set: &str,
    n: usize,
) -> Result<std::collections::BTreeSet<String>, TestError> {
    let m = member(ns, &format!("{set}-0")).await?;
    let mut keys = std::collections::BTreeSet::new();
    for i in 0..n {
        let k = format!("seed/{i:04}");
        let value = "x".repeat(100);
        put_with_retries(&m, &k, &value).await?;
        keys.insert(k);
    }
    Ok(keys)
}

/// A put during a test's setup, retried (it is idempotent) a few times with back-off: on a
/// loaded machine one put can outlast the client's timeout, which is no finding of the test.
pub async fn put_with_retries(m: &EtcdMember, key: &str, value: &str) -> Result<(), TestError> {
    use backon::{ExponentialBuilder, Retryable};
    let backoff = ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(500))
        .with_max_times(4);
    let mut attempt = || {
        let client = m.client.clone();
        let endpoint = m.endpoint.clone();
        async move {
            let mut client = client;
            client
                .put(key, value, None)
                .await
                .map(|_| ())
                .map_err(err(&endpoint))
        }
    };
    (&mut attempt)
        .retry(backoff)
        .notify(|e, after| tracing::warn!(key, error = %e, ?after, "setup put failed; retrying"))
        .await
}

/// Through every member of `<set>-0 .. <set>-(replicas-1)` (one client each): every key of
/// `expected` is there (linearizable read), the key count is equal everywhere, and `hash_kv` at
/// one revision is equal everywhere. Panics naming what differs. Returns (key count, hash).
pub async fn assert_keys_everywhere(
    ns: &TestNamespace,
    set: &str,
    replicas: usize,
    expected: &std::collections::BTreeSet<String>,
) -> (usize, u32) {
    use std::collections::BTreeSet;
    let mut members = members(ns, set, replicas).await.unwrap();
    let (mut counts, mut hashes, mut rev) = (BTreeSet::new(), BTreeSet::new(), None);
    for m in &mut members {
        let resp = m
            .client
            .get("seed/", Some(etcd_client::GetOptions::new().with_prefix()))
            .await
            .unwrap();
        let have: BTreeSet<String> = resp
            .kvs()
            .iter()
            .map(|kv| kv.key_str().unwrap_or_default().to_string())
            .collect();
        let missing: Vec<&String> = expected.difference(&have).collect();
        assert!(
            missing.is_empty(),
            "keys missing through {}: {missing:?}",
            m.pod
        );
        counts.insert(have.len());
        let r = *rev.get_or_insert(resp.header().map(|h| h.revision()).unwrap_or(0));
        hashes.insert(m.client.hash_kv(r).await.unwrap().hash());
    }
    assert_eq!(
        counts.len(),
        1,
        "key counts differ between members: {counts:?}"
    );
    assert_eq!(
        hashes.len(),
        1,
        "hash_kv differs between members: {hashes:?}"
    );
    (
        counts.into_iter().next().unwrap_or(0),
        hashes.into_iter().next().unwrap_or(0),
    )
}

/// What a background writer ([`start_writer`]) did.
#[derive(Debug, Default)]
pub struct Written {
    /// The keys whose put was acknowledged.
    pub acked: std::collections::BTreeSet<String>,
    pub attempts: u64,
    pub failures: u64,
}

/// The client endpoints (`http://<pod IP>:2379`) of the members of `<set>-0 ..
/// <set>-(replicas-1)` that have an IP and are not being deleted now.
async fn live_endpoints(
    client: &kube::Client,
    ns: &str,
    set: &str,
    replicas: usize,
) -> Vec<String> {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(client.clone(), ns);
    let mut eps = Vec::new();
    for i in 0..replicas {
        if let Ok(Some(p)) = pods.get_opt(&format!("{set}-{i}")).await
            && p.metadata.deletion_timestamp.is_none()
            && let Some(ip) = p.status.and_then(|s| s.pod_ip)
        {
            eps.push(format!("http://{ip}:2379"));
        }
    }
    eps
}

/// Puts `<prefix><n>` about every 100 ms through the members' endpoints (re-resolved after a
/// failure: recreated pods get new IPs), one retry per key, until `stop`; returns what was
/// acknowledged. Use a prefix under `seed/` to check the keys with [`assert_keys_everywhere`].
pub fn start_writer(
    ns: &TestNamespace,
    set: &str,
    replicas: usize,
    prefix: &str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Written> {
    let (kube_client, ns_name) = (ns.client(), ns.name.clone());
    let (set, prefix) = (set.to_string(), prefix.to_string());
    tokio::spawn(async move {
        let mut written = Written::default();
        let mut client: Option<Client> = None;
        let mut n = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let key = format!("{prefix}{n:06}");
            for _ in 0..2 {
                written.attempts += 1;
                if client.is_none() {
                    let eps = live_endpoints(&kube_client, &ns_name, &set, replicas).await;
                    let options = ConnectOptions::new()
                        .with_connect_timeout(Duration::from_secs(2))
                        .with_timeout(Duration::from_secs(3));
                    client = Client::connect(eps, Some(options)).await.ok();
                }
                let Some(c) = client.as_mut() else {
                    written.failures += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                match c.put(key.clone(), format!("value-{n}"), None).await {
                    Ok(_) => {
                        written.acked.insert(key.clone());
                        n += 1;
                        break;
                    }
                    Err(e) => {
                        written.failures += 1;
                        tracing::warn!(key, error = %e, "write failed");
                        client = None;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        written
    })
}

/// The etcd fixture (`e2e/fixtures/etcd.yaml`, 3 members) with `n` members: the replicas and
/// the initial cluster list all of them.
pub fn fixture_yaml(n: usize) -> Result<String, TestError> {
    let path = super::fixture_path("etcd.yaml");
    let yaml =
        std::fs::read_to_string(&path).map_err(|source| TestError::Fixture { path, source })?;
    if n == 3 {
        return Ok(yaml);
    }
    let peers: Vec<String> = (0..n)
        .map(|i| format!("etcd-{i}=http://etcd-{i}.etcd.$(NAMESPACE).svc.cluster.local:2380"))
        .collect();
    let mut out = String::new();
    for line in yaml.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if trimmed == "replicas: 3" {
            out.push_str(&format!("{indent}replicas: {n}\n"));
        } else if trimmed.starts_with("- --initial-cluster=") {
            out.push_str(&format!(
                "{indent}- --initial-cluster={}\n",
                peers.join(",")
            ));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    Ok(out)
}
