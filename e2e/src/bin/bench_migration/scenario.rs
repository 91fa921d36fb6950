//! One scenario: a fresh namespace, the filled workload, the operator, one request, and the
//! row of results read from the request's status and the pod watcher.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::testing::operator::{self, Operator};
use e2e::testing::{TestCluster, TestNamespace};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use storage_migrator::api::{Phase, StorageMigrationRequest, StorageMigrationRequestStatus};
use storage_migrator::plan::VERIFY_CLOCK_MARGIN_SECONDS;
use tracing::{info, warn};

use crate::BenchError;
use crate::availability::{Availability, watch_availability};
use crate::cli::DataSize;
use crate::frugal::{Requests, count_requests, count_requests_between, wait_quiet};
use crate::phases::{Noted, Phases, phases, request_events};
use crate::workload::{SET, fill_member, statefulset};

const REQUEST: &str = "to-target-class";
/// The request's own bound, and how long the benchmark waits beyond it for a final phase.
const REQUEST_TIMEOUT: &str = "30m";
pub(crate) const REQUEST_WAIT: Duration = Duration::from_secs(35 * 60);
pub(crate) const SET_READY: Duration = Duration::from_secs(300);
const NAMESPACE_GONE: Duration = Duration::from_secs(300);
const VOLUMES_GONE: Duration = Duration::from_secs(180);
/// How long the operator must keep running after its start to count as started.
const OPERATOR_SETTLE: Duration = Duration::from_secs(1);
pub(crate) const OPERATOR_STOP: Duration = Duration::from_secs(15);
/// How long the operator's requests must pause before its start counts as over.
const START_QUIET: Duration = Duration::from_secs(2);
/// How long its start may take at most (beside 10,000 unrelated objects: 3 s).
const START_LIMIT: Duration = Duration::from_secs(60);

/// What every scenario shares.
pub struct Settings {
    pub operator_bin: PathBuf,
    pub log_dir: PathBuf,
    pub keep: bool,
    /// Members of the benchmarked StatefulSet.
    pub replicas: i32,
    /// `spec.copy.firstPassTool` of every request.
    pub first_pass_tool: &'static str,
    /// Namespaces of unrelated objects every scenario's operator watches too (`--unrelated`).
    pub unrelated: Vec<TestNamespace>,
    /// Every scenario's operator watches every namespace (`--cluster-wide`).
    pub cluster_wide: bool,
    /// More arguments for every operator's `run` (`--operator-arg`).
    pub operator_args: Vec<String>,
}

#[derive(Debug)]
pub struct MemberRow {
    pub pod: String,
    pub downtime: Option<f64>,
    pub bytes_copied: Option<i64>,
    pub bytes_written: Option<i64>,
    /// Files whose content the verification read (`Changed` mode).
    pub verified_files: Option<i64>,
    pub observed: Option<Duration>,
    /// Where its downtime went after its pod stopped, from the operator's Events.
    pub phases: Phases,
}

#[derive(Debug)]
pub struct Row {
    pub namespace: String,
    pub members: Vec<MemberRow>,
    /// `startTime` → `completionTime` (whole seconds, as the status records them).
    pub total_seconds: Option<i64>,
    /// Request created → `Successful` seen by this client.
    pub wall: Duration,
    /// A plain restart of one member before the request, as the client saw it.
    pub plain_restart: Duration,
    /// The operator's peak resident memory, in bytes.
    pub peak_rss: Option<u64>,
    /// The operator's API requests, from its start until it was stopped.
    pub requests: Option<Requests>,
    /// When the operator's start was over (its requests quiet), before the request was created.
    pub started: Option<jiff::Timestamp>,
    /// Its requests from then on: the migration's.
    pub migration_requests: Option<Requests>,
}

/// Deletes the last member's pod under its StatefulSet and waits until the pod watcher sees it
/// Ready again: the floor each member's downtime is compared with, measured in the same run.
async fn plain_restart(ns: &TestNamespace, replicas: i32) -> Result<Duration, BenchError> {
    let (watch_task, availability) = watch_availability(ns.api::<Pod>());
    // The watcher's first list, so that the deletion is seen as an outage of a serving pod.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pod = format!("{SET}-{}", replicas - 1);
    if let Err(e) = ns.api::<Pod>().delete(&pod, &DeleteParams::default()).await {
        watch_task.abort();
        return Err(e.into());
    }
    let deadline = Instant::now() + SET_READY;
    let result = loop {
        let back = availability.lock().ok().and_then(|a| a.recovered(&pod));
        if let Some(d) = back {
            break Ok(d);
        }
        if Instant::now() >= deadline {
            break Err(BenchError::PlainRestart {
                namespace: ns.name.clone(),
                pod,
                waited: SET_READY,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    watch_task.abort();
    if let Ok(took) = &result {
        info!(namespace = %ns.name, ?took, "plain restart of the last member");
    }
    result
}

/// Creates the StatefulSet, fills every member's volume, and waits until the set is Ready.
async fn deploy_and_fill(
    ns: &TestNamespace,
    size: &DataSize,
    replicas: i32,
) -> Result<(), BenchError> {
    let set = statefulset(&size.claim_size(), &ns.cluster.storage_class, replicas);
    ns.api::<StatefulSet>()
        .create(&PostParams::default(), &set)
        .await?;
    info!(namespace = %ns.name, size = %size.label, claim = %size.claim_size(), "StatefulSet created; filling volumes");
    let fills = (0..replicas).map(|i| fill_member(ns, i, size));
    futures::future::try_join_all(fills).await?;
    ns.wait_statefulset_ready(SET, replicas, SET_READY).await?;
    // Let the writers run a moment so the volumes change while serving.
    tokio::time::sleep(Duration::from_secs(3)).await;
    Ok(())
}

/// Starts the operator for `ns`, logging to `<log dir>/<ns>-operator.log`.
pub(crate) async fn start_operator(
    ns: &TestNamespace,
    settings: &Settings,
) -> Result<Operator, BenchError> {
    let log = settings.log_dir.join(format!("{}-operator.log", ns.name));
    let others: Vec<&TestNamespace> = settings.unrelated.iter().collect();
    let bin = &settings.operator_bin;
    let flags: Vec<&str> = settings.operator_args.iter().map(String::as_str).collect();
    let mut op = match settings.cluster_wide {
        true => Operator::spawn_cluster_wide_with(bin, ns, log, &flags).await?,
        false => Operator::spawn_watching_with(bin, ns, &others, log, &flags).await?,
    };
    op.check_running(OPERATOR_SETTLE).await?;
    Ok(op)
}

/// The request's spec: the set to the WaitForFirstConsumer class, engine Generic.
fn request_spec(cluster: &TestCluster, pre_copy: bool, tool: &str) -> serde_json::Value {
    json!({
        "type": "StorageClassChange",
        "target": {"kind": "StatefulSet", "name": SET},
        "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
        "timeout": REQUEST_TIMEOUT,
        "copy": {"preCopy": pre_copy, "firstPassTool": tool},
        "database": {"engine": "Generic"},
    })
}

/// What one migration produced: the final request, the wall time from its creation, and the
/// availability the pod watcher recorded meanwhile.
struct Migration {
    request: StorageMigrationRequest,
    wall: Duration,
    availability: Arc<Mutex<Availability>>,
}

/// Creates the request and waits for its final phase while watching the set's pods.
async fn migrate(ns: &TestNamespace, pre_copy: bool, tool: &str) -> Result<Migration, BenchError> {
    let (watch_task, availability) = watch_availability(ns.api::<Pod>());
    let started = Instant::now();
    let created =
        operator::create_request(ns, REQUEST, request_spec(&ns.cluster, pre_copy, tool)).await;
    let result = match created {
        Ok(()) => {
            info!(namespace = %ns.name, pre_copy, "request created");
            operator::wait_final(ns, REQUEST, REQUEST_WAIT).await
        }
        Err(e) => Err(e),
    };
    let wall = started.elapsed();
    // Let the watcher see the last member's Ready event before reading it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    watch_task.abort();
    Ok(Migration {
        request: result?,
        wall,
        availability,
    })
}

/// Seconds from the status's `startTime` to its `completionTime`.
fn total_seconds(status: &StorageMigrationRequestStatus) -> Option<i64> {
    match (&status.start_time, &status.completion_time) {
        (Some(a), Some(b)) => Some(b.0.as_second() - a.0.as_second()),
        _ => None,
    }
}

/// The scenario's row; an error unless the request ended `Successful`.
fn row(
    ns: &TestNamespace,
    migration: Migration,
    plain_restart: Duration,
    events: &[Noted],
) -> Result<Row, BenchError> {
    let status = migration.request.status.clone().unwrap_or_default();
    if status.phase != Phase::Successful {
        return Err(BenchError::NotSuccessful {
            namespace: ns.name.clone(),
            name: REQUEST.into(),
            phase: format!("{:?}", status.phase),
            detail: operator::summary(&migration.request),
        });
    }
    let now = Instant::now();
    let observed = migration.availability.lock().ok();
    let members = status
        .members
        .iter()
        .map(|m| MemberRow {
            pod: m.pod.clone(),
            downtime: m.downtime_seconds,
            bytes_copied: m.first_claim.bytes_copied,
            bytes_written: m.first_claim.bytes_written,
            verified_files: m.first_claim.verified_files,
            observed: observed.as_ref().and_then(|a| a.down(&m.pod, now)),
            phases: phases(events, &m.pod),
        })
        .collect();
    Ok(Row {
        namespace: ns.name.clone(),
        members,
        total_seconds: total_seconds(&status),
        wall: migration.wall,
        plain_restart,
        peak_rss: None,
        requests: None,
        started: None,
        migration_requests: None,
    })
}

async fn scenario_body(
    ns: &TestNamespace,
    settings: &Settings,
    size: &DataSize,
    pre_copy: bool,
    operator: &mut Option<Operator>,
) -> Result<Row, BenchError> {
    deploy_and_fill(ns, size, settings.replicas).await?;
    let filled = Instant::now();
    let restart = plain_restart(ns, settings.replicas).await?;
    // Data as a volume in service holds it: written longer ago than the verification's clock
    // margin, so only what the writer changes since is read again (`verifyMode: Changed`).
    let settled = Duration::from_secs(VERIFY_CLOCK_MARGIN_SECONDS.unsigned_abs() + 2);
    tokio::time::sleep(settled.saturating_sub(filled.elapsed())).await;
    ns.wait_statefulset_ready(SET, settings.replicas, SET_READY)
        .await?;
    *operator = Some(start_operator(ns, settings).await?);
    let started = operator_started(&ns.name).await;
    let migration = migrate(ns, pre_copy, settings.first_pass_tool).await?;
    let events = request_events(&ns.api(), REQUEST)
        .await
        .unwrap_or_else(|e| {
            warn!(namespace = %ns.name, error = %e, "the request's Events could not be read");
            Vec::new()
        });
    let mut row = row(ns, migration, restart, &events)?;
    row.peak_rss = operator.as_ref().and_then(Operator::peak_rss_bytes);
    row.started = started;
    Ok(row)
}

/// Names of the volumes still bound to claims of `namespace`.
async fn volumes_of(
    pvs: &Api<PersistentVolume>,
    namespace: &str,
) -> Result<Vec<String>, BenchError> {
    Ok(pvs
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|pv| {
            pv.spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| r.namespace.as_deref())
                == Some(namespace)
        })
        .map(|pv| pv.name_any())
        .collect())
}

/// Deletes the namespace and waits until its volumes are released too (bounded; a slow release
/// is only a warning).
async fn cleanup(ns: TestNamespace) -> Result<(), BenchError> {
    let client = ns.client();
    let name = ns.name.clone();
    ns.delete_and_wait(NAMESPACE_GONE).await?;
    let pvs: Api<PersistentVolume> = Api::all(client);
    let deadline = Instant::now() + VOLUMES_GONE;
    loop {
        let left = volumes_of(&pvs, &name).await?;
        if left.is_empty() {
            info!(namespace = %name, "namespace and its volumes gone");
            return Ok(());
        }
        if Instant::now() >= deadline {
            warn!(namespace = %name, volumes = ?left, "volumes of the deleted namespace still exist (their reclaim policy may be Retain)");
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The user the operator of `ns` is (its ServiceAccount).
fn operator_user(ns: &str) -> String {
    format!(
        "system:serviceaccount:{ns}:{}",
        e2e::testing::rbac::service_account(ns)
    )
}

/// When the start of the operator of `ns` is over: its requests quiet ([`wait_quiet`]); `None`,
/// with a warning, where they never were or the audit log cannot be read.
async fn operator_started(ns: &str) -> Option<jiff::Timestamp> {
    let waited = match e2e::testing::rbac::audit_log() {
        Ok(path) => wait_quiet(&path, &operator_user(ns), START_QUIET, START_LIMIT)
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match waited {
        Ok(Some(at)) => Some(at),
        Ok(None) => {
            warn!(limit = ?START_LIMIT, "the operator's requests were never quiet: the migration's are not counted apart");
            None
        }
        Err(e) => {
            warn!(error = %e, "the operator's start is not told apart");
            None
        }
    }
}

/// The requests of the operator of `ns` in the audit log, all of them and from `from` on;
/// `None`, with a warning, where the log cannot be read (a cluster without one).
fn operator_requests(
    ns: &str,
    from: Option<jiff::Timestamp>,
) -> Option<(Requests, Option<Requests>)> {
    let user = operator_user(ns);
    let counted = e2e::testing::rbac::audit_log()
        .map_err(|e| e.to_string())
        .and_then(|path| {
            let all = count_requests(&path, &user).map_err(|e| e.to_string())?;
            let since =
                from.map(|from| count_requests_between(&path, &user, from, jiff::Timestamp::MAX));
            Ok((all, since.transpose().map_err(|e| e.to_string())?))
        });
    match counted {
        Ok(requests) => Some(requests),
        Err(e) => {
            warn!(error = %e, "the operator's API requests are not counted");
            None
        }
    }
}

/// Runs one scenario in a fresh namespace, then stops the operator and deletes (or keeps) the
/// namespace.
pub async fn run_scenario(
    cluster: &TestCluster,
    settings: &Settings,
    size: &DataSize,
    pre_copy: bool,
) -> Result<Row, BenchError> {
    let mode = if pre_copy { "precopy" } else { "offline" };
    let ns = cluster
        .namespace(&format!("bench-{}-{mode}", size.label))
        .await?;
    info!(namespace = %ns.name, size = %size.label, pre_copy, "scenario started");
    let mut operator = None;
    let mut result = scenario_body(&ns, settings, size, pre_copy, &mut operator).await;
    if let Some(op) = operator {
        op.stop(OPERATOR_STOP).await;
    }
    // Counted once the operator is gone: its watches have ended too.
    if let Ok(row) = result.as_mut()
        && let Some((all, since)) = operator_requests(&ns.name, row.started)
    {
        row.requests = Some(all);
        row.migration_requests = since;
    }
    keep_or_delete(ns, settings).await;
    result
}

/// Keeps the namespace (`--keep`) or deletes it and waits for its volumes (a failure to is only
/// a warning).
pub(crate) async fn keep_or_delete(ns: TestNamespace, settings: &Settings) {
    if settings.keep {
        let name = ns.keep();
        info!(namespace = %name, "kept (--keep)");
    } else if let Err(e) = cleanup(ns).await {
        warn!(error = %e, "cleanup incomplete");
    }
}
