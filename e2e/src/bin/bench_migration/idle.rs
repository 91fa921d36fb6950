//! `--workloads idle`: what an operator costs while nothing moves (issue 30: "an idle operator
//! with 100 finished requests makes no more than a few requests a minute"). In a fresh
//! namespace, the operator started as for the other scenarios, `--idle-requests` requests that
//! end at once (each names a StatefulSet of its own that does not exist, so preflight denies
//! it), all
//! waited for until final; then, after a settling minute, the operator's API requests received
//! during `--idle-minutes` are counted from the audit log, by verb, and its resident memory read
//! at the end.

use std::time::{Duration, Instant};

use e2e::testing::operator::{Operator, create_request};
use e2e::testing::{TestCluster, TestNamespace};
use kube::api::{Api, ListParams};
use serde_json::json;
use storage_migrator::api::StorageMigrationRequest;
use tracing::info;

use crate::BenchError;
use crate::frugal::{Requests, count_requests_between};
use crate::scenario::{Settings, keep_or_delete, start_operator};

/// How long every request has to end (preflight denies each within a round or two).
const ALL_FINAL: Duration = Duration::from_secs(300);
/// From the last request final to the start of the count: the reconciles the last status
/// writes cause, and the watches' first restarts, are over.
const SETTLE: Duration = Duration::from_secs(60);

/// What the idle operator cost.
#[derive(Debug)]
pub struct IdleRow {
    pub requests: usize,
    pub window: Duration,
    pub counted: Requests,
    pub rss: Option<u64>,
}

/// Runs the idle scenario (see the module doc).
pub async fn run_idle(
    cluster: &TestCluster,
    settings: &Settings,
    requests: usize,
    window: Duration,
) -> Result<IdleRow, BenchError> {
    let ns = cluster.namespace("bench-idle").await?;
    let operator = start_operator(&ns, settings).await?;
    let result = idle_body(&ns, &operator, requests, window).await;
    operator.stop(Duration::from_secs(10)).await;
    keep_or_delete(ns, settings).await;
    result
}

async fn idle_body(
    ns: &TestNamespace,
    operator: &Operator,
    requests: usize,
    window: Duration,
) -> Result<IdleRow, BenchError> {
    for i in 0..requests {
        let spec = json!({
            "type": "StorageClassChange",
            // One workload each: requests on one workload are judged one at a time.
            "target": {"kind": "StatefulSet", "name": format!("absent-{i:03}")},
            "storageClassChange": {"storageClassName": "fast"},
            "timeout": "5m",
        });
        create_request(ns, &format!("idle-{i:03}"), spec).await?;
    }
    wait_all_final(ns, requests).await?;
    info!(requests, settle = ?SETTLE, "every request final; settling");
    tokio::time::sleep(SETTLE).await;
    let from = jiff::Timestamp::now();
    tokio::time::sleep(window).await;
    let to = jiff::Timestamp::now();
    // Let the audit log's last lines reach the file.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let user = format!(
        "system:serviceaccount:{}:{}",
        ns.name,
        e2e::testing::rbac::service_account(&ns.name)
    );
    let path = e2e::testing::rbac::audit_log()?;
    let counted = count_requests_between(&path, &user, from, to)?;
    Ok(IdleRow {
        requests,
        window,
        counted,
        rss: operator.rss_bytes(),
    })
}

/// Waits (bounded) until `n` requests of `ns` are final.
async fn wait_all_final(ns: &TestNamespace, n: usize) -> Result<(), BenchError> {
    let api: Api<StorageMigrationRequest> = ns.api();
    let deadline = Instant::now() + ALL_FINAL;
    loop {
        let list = api.list(&ListParams::default()).await?;
        let fin = (list.items.iter())
            .filter(|r| r.status.as_ref().is_some_and(|s| s.phase.is_final()))
            .count();
        if fin >= n {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(BenchError::NotSuccessful {
                namespace: ns.name.clone(),
                name: "idle-*".into(),
                phase: format!("{fin} of {n} final"),
                detail: format!("not every request ended within {ALL_FINAL:?}"),
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The idle table.
pub fn idle_table(row: &IdleRow) -> String {
    let minutes = row.window.as_secs_f64() / 60.0;
    let per_minute = row.counted.total() as f64 / minutes.max(f64::EPSILON);
    let verbs: Vec<String> = (row.counted.by_verb.iter())
        .map(|(v, n)| format!("{v} {n}"))
        .collect();
    format!(
        "| finished requests | counted over | API requests | per minute | by verb | operator RSS \
         |\n|---|---|---|---|---|---|\n| {} | {:.0} s | {} | {per_minute:.1} | {} | {} |\n",
        row.requests,
        row.window.as_secs_f64(),
        row.counted.total(),
        verbs.join(", "),
        row.rss.map_or("unknown".into(), |b| format!(
            "{:.1} MiB",
            b as f64 / 1048576.0
        )),
    )
}
