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
