//! The etcd scenario (issue 10, target 8): a StatefulSet of `n` etcd members, a client writing
//! through the Ready members every ~20 ms ([`e2e::testing::etcd_writer::Writer`], one retry
//! through the next member), one migration with pre-copy and engine `Etcd`; what the client saw:
//! the longest gap between two acknowledged writes, and the writes retried and failed.

use std::time::{Duration, Instant};

use e2e::testing::etcd_writer::{Writer, Writes};
use e2e::testing::operator::{self, Operator};
use e2e::testing::{TestCluster, TestNamespace, etcd, set_template_class};
use serde_json::json;
use storage_migrator::api::Phase;
use tracing::info;

use crate::BenchError;
use crate::scenario::{
    OPERATOR_STOP, REQUEST_WAIT, SET_READY, Settings, keep_or_delete, start_operator,
};

const SET: &str = "etcd";
const REQUEST: &str = "etcd-to-target-class";
/// How long the members get to agree on a leader after the set is Ready.
const LEADER_AGREED: Duration = Duration::from_secs(120);
/// Writes before the request is created, and after it ended, so both ends are measured.
const WRITES_AROUND: Duration = Duration::from_secs(2);

/// One etcd scenario's numbers.
#[derive(Debug)]
pub struct EtcdRow {
    pub writes: Writes,
    /// `pod: downtimeSeconds` in the migration's order.
    pub downtime: Vec<(String, Option<f64>)>,
    /// Request created → `Successful` seen.
    pub wall: Duration,
    /// When the longest gap ended, in seconds after the request was created (negative: before).
    pub gap_ended_at: f64,
}

/// Waits until every member answers and all name the same leader.
async fn wait_leader(ns: &TestNamespace, n: usize) -> Result<(), BenchError> {
    let deadline = Instant::now() + LEADER_AGREED;
    loop {
        let mut leaders = Vec::new();
        if let Ok(members) = etcd::members(ns, SET, n).await {
            for mut m in members {
                if let Ok(view) = m.view().await {
                    leaders.push(view.leader);
                }
            }
        }
        leaders.dedup();
        if let [leader] = leaders.as_slice()
            && *leader != 0
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(BenchError::Etcd(format!(
                "the {n} members of {}/{SET} did not agree on a leader within {LEADER_AGREED:?} \
                 (leaders seen: {leaders:?})",
                ns.name
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The etcd set of `n` members on the cluster's Immediate class, Ready and with a leader.
async fn deploy(ns: &TestNamespace, n: usize) -> Result<(), BenchError> {
    let yaml = etcd::fixture_yaml(n)?;
    let class = ns.cluster.storage_class.clone();
    ns.apply_yaml_with(&yaml, |obj| set_template_class(obj, "standard", &class))
        .await?;
    ns.wait_statefulset_ready(SET, i32::try_from(n).unwrap_or(i32::MAX), SET_READY)
        .await?;
    wait_leader(ns, n).await
}

/// Deploys, starts the writer and the operator, migrates with pre-copy, and reads the writes.
async fn body(
    ns: &TestNamespace,
    settings: &Settings,
    n: usize,
    op: &mut Option<Operator>,
) -> Result<EtcdRow, BenchError> {
    deploy(ns, n).await?;
    *op = Some(start_operator(ns, settings).await?);
    let (writer, writer_started) = (Writer::start(ns), Instant::now());
    let wall_started = std::time::SystemTime::now();
    tokio::time::sleep(WRITES_AROUND).await;
    let spec = json!({
        "type": "StorageClassChange",
        "target": {"kind": "StatefulSet", "name": SET},
        "storageClassChange": {"storageClassName": ns.cluster.wffc_storage_class},
        "timeout": "30m",
        "copy": {"preCopy": true, "firstPassTool": settings.first_pass_tool},
        "database": {"engine": "Etcd"},
    });
    let started = Instant::now();
    operator::create_request(ns, REQUEST, spec).await?;
    info!(namespace = %ns.name, members = n, "request created; the writer runs");
    let request = operator::wait_final(ns, REQUEST, REQUEST_WAIT).await?;
    let wall = started.elapsed();
    tokio::time::sleep(WRITES_AROUND).await;
    let writes = writer
        .finish()
        .await
        .map_err(|e| BenchError::Etcd(format!("the writer's task failed: {e}")))?;
    let gap_ended_at = writes.longest_gap_ended.as_secs_f64()
        - started.duration_since(writer_started).as_secs_f64();
    info!(
        namespace = %ns.name,
        gap = ?writes.longest_gap,
        ended = %jiff::Timestamp::try_from(wall_started + writes.longest_gap_ended)
            .map(|t| t.to_string())
            .unwrap_or_default(),
        failures = ?writes.failures,
        retries = ?writes.retries,
        "the longest gap between acknowledged writes"
    );
    let status = request.status.clone().unwrap_or_default();
    if status.phase != Phase::Successful {
        return Err(BenchError::NotSuccessful {
            namespace: ns.name.clone(),
            name: REQUEST.into(),
            phase: format!("{:?}", status.phase),
            detail: operator::summary(&request),
        });
    }
    let downtime = status
        .members
        .iter()
        .map(|m| (m.pod.clone(), m.downtime_seconds))
        .collect();
    Ok(EtcdRow {
        writes,
        downtime,
        wall,
        gap_ended_at,
    })
}

/// Runs the etcd scenario with `n` members in a fresh namespace, then stops the operator and
/// deletes (or keeps) the namespace.
pub async fn run_etcd_scenario(
    cluster: &TestCluster,
    settings: &Settings,
    n: usize,
) -> Result<EtcdRow, BenchError> {
    let ns = cluster.namespace(&format!("bench-etcd-{n}")).await?;
    info!(namespace = %ns.name, members = n, "etcd scenario started");
    let mut op = None;
    let result = body(&ns, settings, n, &mut op).await;
    if let Some(op) = op {
        op.stop(OPERATOR_STOP).await;
    }
    keep_or_delete(ns, settings).await;
    result
}
