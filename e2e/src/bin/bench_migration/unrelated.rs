//! `--unrelated N`: the cluster-size half of issue 30 (item 2). Before the scenarios, N pods
//! and N claims that no request concerns, spread over `--unrelated-namespaces` namespaces, all
//! Pending for good: each pod asks for a node label no node has, each claim for a StorageClass
//! that does not exist. Every scenario's operator then watches those namespaces too (the
//! chart's Roles in each, `--namespace` each), so every event of theirs reaches it, as for an
//! operator watching a busy cluster. Run the benchmark with and without, and compare the
//! operator's peak RSS and API requests per member (target: within 10%).

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use tracing::info;

use e2e::testing::{TestCluster, TestNamespace};

use crate::BenchError;

/// Creates at once, at most this many in flight.
const IN_FLIGHT: usize = 32;

/// Creates `namespaces` namespaces holding `n` Pending pods and `n` Pending claims in all.
pub async fn create(
    cluster: &TestCluster,
    n: usize,
    namespaces: usize,
) -> Result<Vec<TestNamespace>, BenchError> {
    let started = std::time::Instant::now();
    let mut spaces = Vec::new();
    for i in 0..namespaces.max(1) {
        spaces.push(cluster.namespace(&format!("bench-unrelated-{i}")).await?);
    }
    let jobs: Vec<(usize, &TestNamespace)> =
        (0..n).map(|i| (i, &spaces[i % spaces.len()])).collect();
    futures::stream::iter(jobs)
        .map(|(i, ns)| create_pair(ns, i))
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await?;
    info!(pods = n, claims = n, namespaces = spaces.len(), took = ?started.elapsed(), "unrelated objects created");
    Ok(spaces)
}

/// One Pending pod and one Pending claim, both named `unrelated-<i>`.
async fn create_pair(ns: &TestNamespace, i: usize) -> Result<(), BenchError> {
    let name = format!("unrelated-{i:05}");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "unrelated"}},
        "spec": {
            "nodeSelector": {"storage-migrator.bench/no-such-node": "true"},
            "automountServiceAccountToken": false,
            "containers": [{"name": "idle", "image": "busybox:stable", "command": ["sleep", "3600"]}],
        },
    }))?;
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "unrelated"}},
        "spec": {
            "storageClassName": "bench-no-such-class",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Mi"}},
        },
    }))?;
    let pods: Api<Pod> = ns.api();
    let claims: Api<PersistentVolumeClaim> = ns.api();
    pods.create(&PostParams::default(), &pod).await?;
    claims.create(&PostParams::default(), &claim).await?;
    Ok(())
}
