//! `bench-migration`: per-member downtime of a StorageClassChange with and without pre-copy.
//!
//! Against the cluster `KUBECONFIG` points at, for each data size (`--sizes`, default
//! `64Mi,1Gi`) and each mode (`copy.preCopy` true / false), in a fresh namespace:
//!
//! 1. a 3-member Generic StatefulSet (`busybox`, a writer appending a line to its volume every
//!    100 ms; ready once `/data/ready` exists) with its claims on the Immediate class
//!    (`E2E_STORAGE_CLASS`, default `standard`), sized data + 50% (at least 256Mi);
//! 2. each member's volume filled with that many bytes of incompressible data (64 MiB files from
//!    `/dev/urandom`) by a one-off pod pinned to the member's node, which then writes the
//!    readiness file;
//! 3. the operator (`storage-migrator run --namespace NS`, started here, stopped by its pid at
//!    the end) migrates the set to the WaitForFirstConsumer class (`E2E_WFFC_STORAGE_CLASS`,
//!    default `fast`), engine Generic, timeout 30m;
//! 4. the request's `status.members[].downtimeSeconds` and `bytesCopied` and its
//!    `startTime`→`completionTime` are read, and a pod watcher measures each member's
//!    unavailability as a client sees it (from the first event showing the pod deleted or not
//!    Ready to the first showing it Ready again).
//!
//! Prints a Markdown table on stdout (progress goes to stderr) and deletes the namespaces
//! (`--keep` keeps them).
//!
//! ```sh
//! export KUBECONFIG=/tmp/sm-bench/kubeconfig
//! bench-migration --operator-bin target/debug/storage-migrator --sizes 64Mi,1Gi --modes both
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use e2e::testing::{FIELD_MANAGER, MoverSpec, TestCluster, TestError, TestNamespace, describe_pod};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Container, ExecAction, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod,
    PodSpec, PodTemplateSpec, Probe, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::{WatchStreamExt, watcher};
use serde::Deserialize;
use serde_json::json;
use tokio::process::{Child, Command};
use tracing::{info, warn};

const CRD: &str = include_str!("../../../crds/storagemigrationrequests.yaml");
const SET: &str = "bench";
const CLAIM_TEMPLATE: &str = "data";
const REQUEST: &str = "to-target-class";
const REPLICAS: i32 = 3;
/// Size of each fill file, MiB.
const FILL_FILE_MIB: u64 = 64;
/// The request's own bound, and how long the benchmark waits beyond it for a final phase.
const REQUEST_TIMEOUT: &str = "30m";
const REQUEST_WAIT: Duration = Duration::from_secs(35 * 60);
const POD_SCHEDULED: Duration = Duration::from_secs(300);
const SET_READY: Duration = Duration::from_secs(300);
const NAMESPACE_GONE: Duration = Duration::from_secs(300);
const VOLUMES_GONE: Duration = Duration::from_secs(180);
const OPERATOR_STOP: Duration = Duration::from_secs(15);

/// The member's program: append a short line to the volume every 100 ms, exit on SIGTERM (sh
/// as the container's first process would otherwise ignore it and wait out the grace period).
const WRITER_SCRIPT: &str = r#"trap 'exit 0' TERM INT
n=0
while :; do
  n=$((n + 1))
  echo "$n $(date -u +%s)" >> /data/writes.log
  sleep 0.1
done
"#;

/// The fill pod's program: `$1` MiB of incompressible data in files of `$2` MiB, then the
/// readiness file. The sizes come as arguments, never interpolated into the script.
const FILL_SCRIPT: &str = r#"set -eu
left=$1
chunk=$2
i=0
while [ "$left" -gt 0 ]; do
  n=$chunk
  if [ "$left" -lt "$chunk" ]; then n=$left; fi
  dd if=/dev/urandom of="/data/fill-$i" bs=1M count="$n" iflag=fullblock status=none
  left=$((left - n))
  i=$((i + 1))
done
sync
touch /data/ready
echo "filled $i files"
"#;

#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error(transparent)]
    Test(#[from] TestError),
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("invalid CRD manifest {what}: {detail}")]
    Crd { what: &'static str, detail: String },
    #[error(
        "operator binary {path} is not usable: {detail} (build it with `cargo build --bins`, or pass --operator-bin / STORAGE_MIGRATOR_BIN)"
    )]
    OperatorBin { path: PathBuf, detail: String },
    #[error("cannot start the operator {path}: {source}")]
    OperatorStart {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the operator exited at start ({status}); log {log}")]
    OperatorExited { status: String, log: PathBuf },
    #[error("cannot create {path}: {source}")]
    LogFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("fill pod {pod} on {node} did not succeed (phase {phase}, exit {exit:?}): {output}")]
    Fill {
        pod: String,
        node: String,
        phase: String,
        exit: Option<i32>,
        output: String,
    },
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout { what: String, waited: Duration },
    #[error("cannot read the request's status: {0}")]
    Status(#[from] serde_json::Error),
    #[error("request {namespace}/{name} ended {phase}: {detail}")]
    NotSuccessful {
        namespace: String,
        name: String,
        phase: String,
        detail: String,
    },
}

// ------------------------------------------------------------------------------------------
// Command line.

#[derive(Parser)]
#[command(
    name = "bench-migration",
    about = "Per-member downtime of a StorageClassChange with and without pre-copy, against the cluster KUBECONFIG points at"
)]
struct Cli {
    /// Data sizes written to each member's volume, comma-separated (binary units: Mi, Gi).
    #[arg(long, value_delimiter = ',', default_value = "64Mi,1Gi", value_parser = parse_size)]
    sizes: Vec<DataSize>,
    /// Which copy modes to run: `copy.preCopy` true (on), false (off), or both.
    #[arg(long, value_enum, default_value = "both")]
    modes: Modes,
    /// Keep the namespaces (and their workloads) instead of deleting them.
    #[arg(long)]
    keep: bool,
    /// The operator binary (default: `storage-migrator` next to this binary).
    #[arg(long, env = "STORAGE_MIGRATOR_BIN")]
    operator_bin: Option<PathBuf>,
    /// Where the operator's logs go (default: `<temp dir>/bench-migration`).
    #[arg(long)]
    log_dir: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Modes {
    Both,
    On,
    Off,
}

impl Modes {
    fn pre_copy_values(self) -> &'static [bool] {
        match self {
            Modes::Both => &[true, false],
            Modes::On => &[true],
            Modes::Off => &[false],
        }
    }
}

/// A data size per member, in MiB, with the label it was given as.
#[derive(Clone, Debug, PartialEq)]
struct DataSize {
    label: String,
    mib: u64,
}

impl DataSize {
    /// The claim size: data + 50%, at least 256Mi, in whole MiB.
    fn claim_size(&self) -> String {
        let mib = self.mib.saturating_mul(3).div_ceil(2).max(256);
        format!("{mib}Mi")
    }
}

fn parse_size(s: &str) -> Result<DataSize, String> {
    let s = s.trim();
    let (digits, factor) = if let Some(d) = s.strip_suffix("Mi") {
        (d, 1u64)
    } else if let Some(d) = s.strip_suffix("Gi") {
        (d, 1024)
    } else {
        return Err(format!("{s:?}: give a size in Mi or Gi, e.g. 64Mi or 1Gi"));
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?}: not a whole number of Mi or Gi"))?;
    let mib = n
        .checked_mul(factor)
        .filter(|m| *m > 0)
        .ok_or_else(|| format!("{s:?}: must be above 0 and fit in 64 bits"))?;
    Ok(DataSize {
        label: s.to_string(),
        mib,
    })
}

// ------------------------------------------------------------------------------------------
// The request's status (only the fields read here; the operator crate is not a dependency of
// this binary).

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestStatus {
    #[serde(default)]
    phase: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    failure: Option<String>,
    #[serde(default)]
    start_time: Option<jiff::Timestamp>,
    #[serde(default)]
    completion_time: Option<jiff::Timestamp>,
    #[serde(default)]
    members: Vec<MemberStatus>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MemberStatus {
    pod: String,
    #[serde(default)]
    step: Option<String>,
    #[serde(default)]
    downtime_seconds: Option<f64>,
    #[serde(default)]
    bytes_copied: Option<i64>,
}

fn request_status(obj: &DynamicObject) -> Result<RequestStatus, serde_json::Error> {
    match obj.data.get("status") {
        Some(v) if !v.is_null() => serde_json::from_value(v.clone()),
        _ => Ok(RequestStatus::default()),
    }
}

fn request_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("storagemigrator.io", "v1alpha1", "StorageMigrationRequest");
    ApiResource::from_gvk_with_plural(&gvk, "storagemigrationrequests")
}

// ------------------------------------------------------------------------------------------
// The operator process.

struct Operator {
    child: Child,
    log: PathBuf,
}

impl Operator {
    /// Starts `BIN run --namespace NS`, logging to `log`; fails if it exits within a second.
    async fn start(bin: &Path, namespace: &str, log: PathBuf) -> Result<Self, BenchError> {
        let out = std::fs::File::create(&log).map_err(|source| BenchError::LogFile {
            path: log.clone(),
            source,
        })?;
        let err = out.try_clone().map_err(|source| BenchError::LogFile {
            path: log.clone(),
            source,
        })?;
        let mut child = Command::new(bin)
            .args(["run", "--namespace", namespace])
            .env(
                "RUST_LOG",
                std::env::var("OPERATOR_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
            )
            .env_remove("FAILPOINTS")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| BenchError::OperatorStart {
                path: bin.to_path_buf(),
                source,
            })?;
        info!(namespace, pid = ?child.id(), log = %log.display(), "operator started");
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Ok(Some(status)) = child.try_wait() {
            return Err(BenchError::OperatorExited {
                status: status.to_string(),
                log,
            });
        }
        Ok(Self { child, log })
    }

    /// SIGTERM to its pid, then SIGKILL if it has not exited within [`OPERATOR_STOP`].
    async fn stop(mut self) {
        let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) else {
            return; // already reaped
        };
        let pid = nix::unistd::Pid::from_raw(pid);
        if let Err(e) = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM) {
            warn!(%pid, error = %e, "cannot signal the operator");
        }
        match tokio::time::timeout(OPERATOR_STOP, self.child.wait()).await {
            Ok(Ok(status)) => info!(%pid, %status, log = %self.log.display(), "operator stopped"),
            Ok(Err(e)) => warn!(%pid, error = %e, "cannot wait for the operator"),
            Err(_) => {
                warn!(%pid, "operator ignored SIGTERM; killing it");
                if let Err(e) = self.child.kill().await {
                    warn!(%pid, error = %e, "cannot kill the operator");
                }
            }
        }
    }
}

fn check_operator_bin(path: &Path) -> Result<(), BenchError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| BenchError::OperatorBin {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(BenchError::OperatorBin {
            path: path.to_path_buf(),
            detail: "not an executable file".into(),
        });
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Availability as a client watching the pods sees it.

#[derive(Debug, Default)]
struct PodAvailability {
    down_since: Option<Instant>,
    down_total: Duration,
    outages: u32,
}

#[derive(Debug, Default)]
struct Availability {
    pods: BTreeMap<String, PodAvailability>,
}

impl Availability {
    fn observe(&mut self, pod: &str, serving: bool, at: Instant) {
        let p = self.pods.entry(pod.to_string()).or_default();
        match (serving, p.down_since) {
            (false, None) => {
                p.down_since = Some(at);
                p.outages += 1;
            }
            (true, Some(since)) => {
                p.down_total += at.saturating_duration_since(since);
                p.down_since = None;
            }
            _ => {}
        }
    }

    /// Total unavailability of `pod`; an outage still open counts until `now`.
    fn down(&self, pod: &str, now: Instant) -> Option<Duration> {
        let p = self.pods.get(pod)?;
        let open = p
            .down_since
            .map(|s| now.saturating_duration_since(s))
            .unwrap_or_default();
        Some(p.down_total + open)
    }
}

fn serving(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Watches the set's pods and records each one's outages until aborted.
fn watch_availability(api: Api<Pod>) -> (tokio::task::JoinHandle<()>, Arc<Mutex<Availability>>) {
    let state = Arc::new(Mutex::new(Availability::default()));
    let shared = state.clone();
    let task = tokio::spawn(async move {
        let config = watcher::Config::default().labels(&format!("app={SET}"));
        let mut stream = watcher::watcher(api, config).default_backoff().boxed();
        while let Some(event) = stream.next().await {
            let now = Instant::now();
            let (pod, up) = match event {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                    let up = serving(&p);
                    (p.name_any(), up)
                }
                Ok(watcher::Event::Delete(p)) => (p.name_any(), false),
                Ok(_) => continue,
                Err(e) => {
                    warn!(error = %e, "pod watch error (retrying)");
                    continue;
                }
            };
            if let Ok(mut a) = shared.lock() {
                a.observe(&pod, up, now);
            }
        }
    });
    (task, state)
}

// ------------------------------------------------------------------------------------------
// One scenario.

#[derive(Debug)]
struct MemberRow {
    pod: String,
    downtime: Option<f64>,
    bytes_copied: Option<i64>,
    observed: Option<Duration>,
}

#[derive(Debug)]
struct Row {
    namespace: String,
    members: Vec<MemberRow>,
    /// `startTime` → `completionTime` (whole seconds, as the status records them).
    total_seconds: Option<i64>,
    /// Request created → `Successful` seen by this client.
    wall: Duration,
}

fn statefulset(storage_size: &str, class: &str) -> StatefulSet {
    let labels = BTreeMap::from([("app".to_string(), SET.to_string())]);
    StatefulSet {
        metadata: ObjectMeta {
            name: Some(SET.into()),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        spec: Some(StatefulSetSpec {
            replicas: Some(REPLICAS),
            service_name: Some(SET.into()),
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    termination_grace_period_seconds: Some(10),
                    containers: vec![Container {
                        name: "writer".into(),
                        image: Some("busybox".into()),
                        image_pull_policy: Some("IfNotPresent".into()),
                        command: Some(vec!["sh".into(), "-c".into(), WRITER_SCRIPT.into()]),
                        readiness_probe: Some(Probe {
                            exec: Some(ExecAction {
                                command: Some(vec![
                                    "test".into(),
                                    "-f".into(),
                                    "/data/ready".into(),
                                ]),
                            }),
                            period_seconds: Some(1),
                            ..Default::default()
                        }),
                        volume_mounts: Some(vec![VolumeMount {
                            name: CLAIM_TEMPLATE.into(),
                            mount_path: "/data".into(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            volume_claim_templates: Some(vec![PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some(CLAIM_TEMPLATE.into()),
                    ..Default::default()
                },
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: Some(vec!["ReadWriteOnce".into()]),
                    storage_class_name: Some(class.into()),
                    resources: Some(VolumeResourceRequirements {
                        requests: Some(BTreeMap::from([(
                            "storage".to_string(),
                            Quantity(storage_size.into()),
                        )])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                status: None,
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// Fills one member's volume on its node; returns once the fill pod is gone again.
async fn fill_member(ns: &TestNamespace, ordinal: i32, size: &DataSize) -> Result<(), BenchError> {
    let member = format!("{SET}-{ordinal}");
    let scheduled = |p: Option<&Pod>| {
        p.and_then(|p| p.spec.as_ref())
            .and_then(|s| s.node_name.as_ref())
            .is_some()
    };
    let pod = ns
        .wait_for(
            ns.api::<Pod>(),
            &member,
            "member pod scheduled",
            POD_SCHEDULED,
            scheduled,
            describe_pod,
        )
        .await?;
    let node = pod
        .and_then(|p| p.spec)
        .and_then(|s| s.node_name)
        .unwrap_or_default();
    let claim = format!("{CLAIM_TEMPLATE}-{member}");
    let name = format!("fill-{member}");
    let spec = MoverSpec {
        name: name.clone(),
        argv: vec![
            "sh".into(),
            "-c".into(),
            FILL_SCRIPT.into(),
            "fill".into(),
            size.mib.to_string(),
            FILL_FILE_MIB.to_string(),
        ],
        node: None,
        mounts: Vec::new(),
    }
    .on_node(&node)
    .mount(&claim, "/data");
    // Generous: 2 min plus 4 MiB/s.
    let timeout = Duration::from_secs(120 + size.mib / 4);
    let started = Instant::now();
    let outcome = ns.run_pod(&spec, timeout).await?;
    if !outcome.succeeded() {
        return Err(BenchError::Fill {
            pod: name,
            node,
            phase: outcome.phase.clone(),
            exit: outcome.exit_code,
            output: outcome.output(),
        });
    }
    info!(namespace = %ns.name, %member, %node, took = ?started.elapsed(), "volume filled");
    let api = ns.api::<Pod>();
    let uid = api.get(&name).await?.uid().unwrap_or_default();
    api.delete(&name, &DeleteParams::default()).await?;
    ns.wait_deleted(api, &name, &uid, Duration::from_secs(120))
        .await?;
    Ok(())
}

fn describe_request(obj: &DynamicObject) -> String {
    match request_status(obj) {
        Ok(s) => {
            let members: Vec<String> = s
                .members
                .iter()
                .map(|m| format!("{} {}", m.pod, m.step.as_deref().unwrap_or("?")))
                .collect();
            format!(
                "phase {:?}, message {:?}, failure {:?}, members [{}]",
                s.phase,
                s.message,
                s.failure,
                members.join(", ")
            )
        }
        Err(e) => format!("unreadable status: {e}"),
    }
}

async fn scenario_body(
    ns: &TestNamespace,
    settings: &Settings,
    size: &DataSize,
    pre_copy: bool,
    operator: &mut Option<Operator>,
) -> Result<Row, BenchError> {
    let cluster = &ns.cluster;
    let set = statefulset(&size.claim_size(), &cluster.storage_class);
    ns.api::<StatefulSet>()
        .create(&PostParams::default(), &set)
        .await?;
    info!(namespace = %ns.name, size = %size.label, claim = %size.claim_size(), "StatefulSet created; filling volumes");

    let fills = (0..REPLICAS).map(|i| fill_member(ns, i, size));
    futures::future::try_join_all(fills).await?;
    ns.wait_statefulset_ready(SET, REPLICAS, SET_READY).await?;
    // Let the writers run a moment so the volumes change while serving.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let log = settings
        .log_dir
        .join(format!("{}-operator.log", ns.name.as_str()));
    *operator = Some(Operator::start(&settings.operator_bin, &ns.name, log).await?);

    let (watch_task, availability) = watch_availability(ns.api::<Pod>());
    let resource = request_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(ns.client(), &ns.name, &resource);
    let request = DynamicObject::new(REQUEST, &resource).data(json!({
        "spec": {
            "type": "StorageClassChange",
            "target": {"kind": "StatefulSet", "name": SET},
            "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
            "timeout": REQUEST_TIMEOUT,
            "copy": {"preCopy": pre_copy, "moverImage": cluster.mover_image},
            "database": {"engine": "Generic"},
        }
    }));
    let started = Instant::now();
    api.create(&PostParams::default(), &request).await?;
    info!(namespace = %ns.name, pre_copy, "request created");
    let is_final = |o: Option<&DynamicObject>| {
        o.and_then(|o| request_status(o).ok())
            .and_then(|s| s.phase)
            .is_some_and(|p| matches!(p.as_str(), "Successful" | "Failed" | "Denied"))
    };
    let result = ns
        .wait_for(
            api,
            REQUEST,
            "request final",
            REQUEST_WAIT,
            is_final,
            describe_request,
        )
        .await;
    let wall = started.elapsed();
    // Let the watcher see the last member's Ready event before reading it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    watch_task.abort();
    let obj = result?.ok_or_else(|| BenchError::Timeout {
        what: format!("request {}/{REQUEST} (it vanished)", ns.name),
        waited: wall,
    })?;
    let status = request_status(&obj)?;
    let phase = status.phase.clone().unwrap_or_default();
    if phase != "Successful" {
        return Err(BenchError::NotSuccessful {
            namespace: ns.name.clone(),
            name: REQUEST.into(),
            phase,
            detail: describe_request(&obj),
        });
    }
    let now = Instant::now();
    let observed = availability.lock().ok();
    let members = status
        .members
        .iter()
        .map(|m| MemberRow {
            pod: m.pod.clone(),
            downtime: m.downtime_seconds,
            bytes_copied: m.bytes_copied,
            observed: observed.as_ref().and_then(|a| a.down(&m.pod, now)),
        })
        .collect();
    let total_seconds = match (status.start_time, status.completion_time) {
        (Some(a), Some(b)) => Some(b.as_second() - a.as_second()),
        _ => None,
    };
    Ok(Row {
        namespace: ns.name.clone(),
        members,
        total_seconds,
        wall,
    })
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
        let left: Vec<String> = pvs
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.claim_ref.as_ref())
                    .and_then(|r| r.namespace.as_deref())
                    == Some(name.as_str())
            })
            .map(|pv| pv.name_any())
            .collect();
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

async fn run_scenario(
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
    let result = scenario_body(&ns, settings, size, pre_copy, &mut operator).await;
    if let Some(op) = operator {
        op.stop().await;
    }
    if settings.keep {
        let name = ns.keep();
        info!(namespace = %name, "kept (--keep)");
    } else if let Err(e) = cleanup(ns).await {
        warn!(error = %e, "cleanup incomplete");
    }
    result
}

async fn install_crd(client: &kube::Client) -> Result<(), BenchError> {
    let crd: CustomResourceDefinition =
        serde_norway::from_str(CRD).map_err(|e| BenchError::Crd {
            what: "crds/storagemigrationrequests.yaml",
            detail: e.to_string(),
        })?;
    let name = crd.name_any();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await?;
    let waited = Duration::from_secs(60);
    match tokio::time::timeout(
        waited,
        await_condition(api, &name, conditions::is_crd_established()),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(BenchError::Timeout {
            what: format!("CRD {name} Established (watch failed: {e})"),
            waited,
        }),
        Err(_) => Err(BenchError::Timeout {
            what: format!("CRD {name} Established"),
            waited,
        }),
    }
}

// ------------------------------------------------------------------------------------------
// Output.

fn human_bytes(n: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

fn opt_secs(v: Option<f64>) -> String {
    v.map_or_else(|| "?".into(), |s| format!("{s:.1}"))
}

fn mean(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let all: Option<Vec<f64>> = values.collect();
    let all = all?;
    (!all.is_empty()).then(|| all.iter().sum::<f64>() / all.len() as f64)
}

/// A Markdown table with padded columns.
fn markdown_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("| {} |\n", padded.join(" | "))
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out.push_str(&line(widths.iter().map(|w| "-".repeat(*w)).collect()));
    for row in rows {
        out.push_str(&line(row.clone()));
    }
    out
}

fn tables(results: &[(String, bool, Result<Row, String>)]) -> String {
    let mut main_rows = Vec::new();
    let mut client_rows = Vec::new();
    for (size, pre_copy, result) in results {
        let mode = pre_copy.to_string();
        match result {
            Ok(row) => {
                let members = row.members.len();
                let downtimes: Vec<String> =
                    row.members.iter().map(|m| opt_secs(m.downtime)).collect();
                let bytes: Vec<String> = row
                    .members
                    .iter()
                    .map(|m| m.bytes_copied.map_or_else(|| "?".into(), human_bytes))
                    .collect();
                main_rows.push(vec![
                    size.clone(),
                    mode.clone(),
                    members.to_string(),
                    downtimes.join(" / "),
                    opt_secs(mean(row.members.iter().map(|m| m.downtime))),
                    row.total_seconds
                        .map_or_else(|| "?".into(), |s| s.to_string()),
                    bytes.join(" / "),
                ]);
                let observed: Vec<String> = row
                    .members
                    .iter()
                    .map(|m| opt_secs(m.observed.map(|d| d.as_secs_f64())))
                    .collect();
                let order: Vec<&str> = row.members.iter().map(|m| m.pod.as_str()).collect();
                client_rows.push(vec![
                    size.clone(),
                    mode,
                    order.join(", "),
                    observed.join(" / "),
                    opt_secs(mean(
                        row.members
                            .iter()
                            .map(|m| m.observed.map(|d| d.as_secs_f64())),
                    )),
                    format!("{:.1}", row.wall.as_secs_f64()),
                    row.namespace.clone(),
                ]);
            }
            Err(e) => {
                let failed = format!("FAILED: {e}");
                main_rows.push(vec![
                    size.clone(),
                    mode,
                    "-".into(),
                    failed,
                    "-".into(),
                    "-".into(),
                    "-".into(),
                ]);
            }
        }
    }
    let mut out = markdown_table(
        &[
            "size",
            "preCopy",
            "members",
            "downtime per member (s)",
            "mean downtime",
            "total (s)",
            "bytes copied in final pass",
        ],
        &main_rows,
    );
    if !client_rows.is_empty() {
        out.push('\n');
        out.push_str(&markdown_table(
            &[
                "size",
                "preCopy",
                "migration order",
                "observed unavailability per member (s)",
                "mean",
                "request created → Successful seen (s)",
                "namespace",
            ],
            &client_rows,
        ));
    }
    out
}

// ------------------------------------------------------------------------------------------
// Main.

struct Settings {
    operator_bin: PathBuf,
    log_dir: PathBuf,
    keep: bool,
}

async fn run(cli: Cli) -> Result<bool, BenchError> {
    let operator_bin = match cli.operator_bin {
        Some(p) => p,
        None => std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("storage-migrator")))
            .unwrap_or_else(|| PathBuf::from("storage-migrator")),
    };
    check_operator_bin(&operator_bin)?;
    let log_dir = cli
        .log_dir
        .unwrap_or_else(|| std::env::temp_dir().join("bench-migration"));
    std::fs::create_dir_all(&log_dir).map_err(|source| BenchError::LogFile {
        path: log_dir.clone(),
        source,
    })?;
    let settings = Settings {
        operator_bin,
        log_dir,
        keep: cli.keep,
    };
    let cluster = TestCluster::from_env().await?;
    install_crd(&cluster.client).await?;
    info!(
        operator = %settings.operator_bin.display(),
        from = %cluster.storage_class,
        to = %cluster.wffc_storage_class,
        "benchmark starting"
    );

    let mut results = Vec::new();
    for size in &cli.sizes {
        for &pre_copy in cli.modes.pre_copy_values() {
            let started = Instant::now();
            let result = run_scenario(&cluster, &settings, size, pre_copy).await;
            match &result {
                Ok(row) => {
                    info!(size = %size.label, pre_copy, took = ?started.elapsed(), ?row, "scenario done")
                }
                Err(e) => warn!(size = %size.label, pre_copy, error = %e, "scenario failed"),
            }
            results.push((
                size.label.clone(),
                pre_copy,
                result.map_err(|e| e.to_string()),
            ));
        }
    }
    print!("{}", tables(&results));
    Ok(results.iter().all(|(_, _, r)| r.is_ok()))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench-migration: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("bench-migration: some scenarios failed (see the table)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("bench-migration: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_claims_fit() {
        let s = parse_size("64Mi").unwrap();
        assert_eq!(s.mib, 64);
        assert_eq!(s.claim_size(), "256Mi");
        let g = parse_size("1Gi").unwrap();
        assert_eq!(g.mib, 1024);
        assert_eq!(g.claim_size(), "1536Mi");
        assert_eq!(parse_size("3Mi").unwrap().claim_size(), "256Mi");
        assert_eq!(parse_size("201Mi").unwrap().claim_size(), "302Mi");
        for bad in [
            "64",
            "1G",
            "0Mi",
            "-1Gi",
            "1.5Gi",
            "Gi",
            "99999999999999999999Gi",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn availability_counts_outages_until_ready_again() {
        let t0 = Instant::now();
        let mut a = Availability::default();
        a.observe("p", true, t0);
        a.observe("p", false, t0 + Duration::from_secs(1));
        a.observe("p", false, t0 + Duration::from_secs(2)); // still down: no new outage
        a.observe("p", true, t0 + Duration::from_millis(4500));
        assert_eq!(a.down("p", t0), Some(Duration::from_millis(3500)));
        a.observe("p", false, t0 + Duration::from_secs(10));
        assert_eq!(
            a.down("p", t0 + Duration::from_secs(11)),
            Some(Duration::from_millis(4500))
        );
        assert_eq!(a.pods["p"].outages, 2);
        assert_eq!(a.down("q", t0), None);
    }

    #[test]
    fn table_lists_members_and_failures() {
        let row = Row {
            namespace: "ns".into(),
            members: vec![
                MemberRow {
                    pod: "bench-2".into(),
                    downtime: Some(6.0),
                    bytes_copied: Some(2048),
                    observed: Some(Duration::from_millis(5800)),
                },
                MemberRow {
                    pod: "bench-1".into(),
                    downtime: Some(8.0),
                    bytes_copied: Some(100),
                    observed: Some(Duration::from_millis(7200)),
                },
            ],
            total_seconds: Some(61),
            wall: Duration::from_millis(62_300),
        };
        let out = tables(&[
            ("64Mi".into(), true, Ok(row)),
            ("1Gi".into(), false, Err("timed out".into())),
        ]);
        assert!(out.contains("| 64Mi "), "{out}");
        assert!(out.contains("6.0 / 8.0"), "{out}");
        assert!(out.contains("| 7.0 "), "{out}");
        assert!(out.contains("2.0 KiB / 100 B"), "{out}");
        assert!(out.contains("FAILED: timed out"), "{out}");
        assert!(out.contains("bench-2, bench-1"), "{out}");
        assert!(out.contains("62.3"), "{out}");
    }

    #[test]
    fn scripts_take_no_input_by_interpolation() {
        // The size reaches the fill script as $1 only.
        assert!(FILL_SCRIPT.contains("left=$1"));
        assert!(FILL_SCRIPT.contains("chunk=$2"));
        assert!(!FILL_SCRIPT.contains("{"));
        let set = statefulset("256Mi", "standard");
        let spec = set.spec.unwrap();
        assert_eq!(spec.replicas, Some(3));
        let c = &spec.template.spec.unwrap().containers[0];
        assert_eq!(c.command.as_ref().unwrap()[2], WRITER_SCRIPT);
        let probe = c.readiness_probe.as_ref().unwrap();
        assert_eq!(
            probe.exec.as_ref().unwrap().command.as_deref().unwrap(),
            ["test", "-f", "/data/ready"]
        );
    }
}
