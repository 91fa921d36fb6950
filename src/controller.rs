//! kube-runtime wiring: the `StorageMigrationRequest` controller, its Context, error policy and
//! failpoints.
//!
//! One reconcile gathers a snapshot, asks the planner, runs the actions in order, and repeats
//! while the planner has something to do (bounded), so a request moves through several steps per
//! reconcile instead of one step per requeue. Jobs and pods we create (owned by the request)
//! wake it up; a progressing request is also requeued every few seconds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tracing::{Instrument, error, info, info_span, warn};

use crate::api::{MemberStep, StorageMigrationRequest};
use crate::cluster::{Cluster, ClusterError, action_name, failpoint_hit};
use crate::labels;
use crate::plan::{self, Action};

/// Most decide→act rounds in one reconcile before yielding to the queue.
const MAX_ROUNDS: usize = 40;

pub struct Context {
    pub client: Client,
    pub reporter: Reporter,
    /// Consecutive failures per request, for the error policy's backoff.
    failures: Mutex<HashMap<ObjectRef<StorageMigrationRequest>, u32>>,
}

impl Context {
    pub fn new(client: Client) -> Self {
        let instance = std::env::var("POD_NAME")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok());
        Self {
            client,
            reporter: Reporter {
                controller: labels::EVENT_REPORTER.to_string(),
                instance,
            },
            failures: Mutex::new(HashMap::new()),
        }
    }

    fn cluster(&self) -> Cluster {
        Cluster::new(
            self.client.clone(),
            Recorder::new(self.client.clone(), self.reporter.clone()),
        )
    }

    fn note_failure(&self, obj: &ObjectRef<StorageMigrationRequest>) -> u32 {
        let mut map = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(obj.clone()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    fn note_success(&self, obj: &ObjectRef<StorageMigrationRequest>) {
        let mut map = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(obj);
    }
}

/// The failpoint name after a status write: the member step in flight (`step-Copying`), else the
/// stage (`stage-OrphaningStatefulSet`).
pub fn status_failpoint(status: &crate::api::StorageMigrationRequestStatus) -> String {
    match status.members.iter().find(|m| {
        !matches!(
            m.step,
            MemberStep::Pending | MemberStep::Done | MemberStep::RolledBack
        )
    }) {
        Some(m) => format!("step-{:?}", m.step),
        None => format!("stage-{:?}", status.stage),
    }
}

/// Fault injection for tests (cargo feature `failpoints`, configured by env `FAILPOINTS`,
/// e.g. `FAILPOINTS='step-Copying=return'`): the `return` action exits the process at once, as
/// a crash would (exit code 86).
fn failpoint(name: &str) {
    if failpoint_hit(name) {
        warn!(failpoint = name, "failpoint hit: exiting");
        std::process::exit(86);
    }
}

/// One reconcile of one request.
pub async fn reconcile(
    req: Arc<StorageMigrationRequest>,
    ctx: Arc<Context>,
) -> Result<Requeue, ClusterError> {
    let ns = req.namespace().unwrap_or_default();
    let name = req.name_any();
    let span = info_span!("reconcile", request = %format!("{ns}/{name}"));
    async move {
        let cluster = ctx.cluster();
        let mut requeue = plan::REQUEUE_PROGRESSING;
        for _ in 0..MAX_ROUNDS {
            let Some(current) = cluster.fetch(&ns, &name).await? else {
                return Ok(Requeue::await_change());
            };
            let engine = cluster.engine(&current).await.map_err(|e| e.to_string());
            let observed = cluster.gather(current, &engine).await?;
            let decision = plan::decide(&observed);
            requeue = decision.requeue;
            if decision.actions.is_empty() {
                break;
            }
            let member = in_flight_member(&decision).unwrap_or_default();
            async {
                for action in &decision.actions {
                    cluster.execute(&observed, &engine, action).await?;
                    if let Action::SetStatus(status) = action {
                        failpoint(&status_failpoint(status));
                    }
                    failpoint(&format!("after-{}", action_name(action)));
                }
                Ok::<(), ClusterError>(())
            }
            .instrument(info_span!("member", member = %member))
            .await?;
            if decision.requeue > Duration::ZERO && !changes_status(&decision) {
                // Only side effects (a create, a delete): give them a moment before looking.
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
        ctx.note_success(&ObjectRef::from_obj(req.as_ref()));
        Ok(if requeue.is_zero() {
            Requeue::requeue(Duration::from_millis(100))
        } else {
            Requeue::requeue(requeue)
        })
    }
    .instrument(span)
    .await
}

fn changes_status(d: &plan::Decision) -> bool {
    matches!(d.actions.first(), Some(Action::SetStatus(_)))
}

fn in_flight_member(d: &plan::Decision) -> Option<String> {
    d.actions.iter().find_map(|a| match a {
        Action::SetStatus(s) => s
            .members
            .iter()
            .find(|m| {
                !matches!(
                    m.step,
                    MemberStep::Pending | MemberStep::Done | MemberStep::RolledBack
                )
            })
            .map(|m| m.pod.clone()),
        _ => None,
    })
}

/// Logs the error and retries with exponential backoff (1 s doubling to 60 s).
pub fn error_policy(
    req: Arc<StorageMigrationRequest>,
    err: &ClusterError,
    ctx: Arc<Context>,
) -> Requeue {
    let n = ctx.note_failure(&ObjectRef::from_obj(req.as_ref()));
    let delay =
        Duration::from_secs(1u64 << n.saturating_sub(1).min(6)).min(Duration::from_secs(60));
    warn!(
        request = %format!("{}/{}", req.namespace().unwrap_or_default(), req.name_any()),
        error = %err,
        retry_in = ?delay,
        "reconcile failed"
    );
    Requeue::requeue(delay)
}

/// Runs the controller until SIGTERM/SIGINT. `namespace`: watch one namespace, else all.
pub async fn run(client: Client, namespace: Option<String>) {
    let (requests, jobs, pods) = match &namespace {
        Some(ns) => (
            Api::<StorageMigrationRequest>::namespaced(client.clone(), ns),
            Api::<Job>::namespaced(client.clone(), ns),
            Api::<Pod>::namespaced(client.clone(), ns),
        ),
        None => (
            Api::all(client.clone()),
            Api::all(client.clone()),
            Api::all(client.clone()),
        ),
    };
    let owned = watcher::Config::default().labels(&labels::managed_by_selector());
    info!(
        namespace = namespace.as_deref().unwrap_or("<all>"),
        "starting controller"
    );
    let ctx = Arc::new(Context::new(client));
    Controller::new(requests, watcher::Config::default())
        .owns(jobs, owned.clone())
        .owns(pods, owned)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => tracing::debug!(request = %obj, "reconciled"),
                // A request deleted between being queued and reconciled: nothing to do.
                Err(kube::runtime::controller::Error::ObjectNotFound(obj)) => {
                    tracing::debug!(request = %obj, "request is gone")
                }
                Err(e) => error!(error = %e, "controller"),
            }
        })
        .await;
    info!("controller stopped");
}
