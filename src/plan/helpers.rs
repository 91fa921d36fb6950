//! Our helper pods (the Jobs' pods and the mounter) that cannot start or cannot finish: pure
//! readings of their status, so that a member fails within `--helper-start-timeout` with the
//! pod's or the API server's own reason instead of waiting for the request's timeout.
//!
//! What is read, and what it means:
//! - a container waiting with `InvalidImageName` or `ErrImageNeverPull`: it can never start;
//!   the member fails at once;
//! - a container waiting for any other reason (`ErrImagePull`, `ImagePullBackOff`,
//!   `CreateContainerConfigError`, ...), or the pod not scheduled (`PodScheduled=False`, reason
//!   `Unschedulable` and the scheduler's message), for longer than the timeout since the pod
//!   was created: the member fails quoting that reason and message;
//! - a pod that is still being deleted a timeout after its grace period ended (its node is gone
//!   or its kubelet no longer answers): the member fails naming the node;
//! - a pod that ended `Failed` with reason `Evicted` (the kubelet evicted it under node
//!   pressure): transient; the caller replaces it, at most `--max-evictions` times per member;
//! - a member pod (not a helper) still terminating a timeout after its grace period ended on a
//!   node that is NotReady, Unknown or gone ([`lost_pod`]): force-deleted only when the Node
//!   object is gone (what the pod garbage collector waits for), the node carries the taint
//!   `node.kubernetes.io/out-of-service` (non-graceful node shutdown), or the request sets
//!   `spec.forceDeleteOnLostNode` ([`LostPod::force`]); its member then rolls back
//!   (`Failure::NodeLost`). Otherwise the request waits (condition `NodeLost`): a node that is
//!   only partitioned may still run the pod and write to its volume;
//! - a Job with no pod a timeout after its creation (its pods are refused at admission: a quota,
//!   a Pod Security or policy webhook; the Job controller reports it only as `FailedCreate`
//!   Events): the member fails saying so.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::ObservedJob;
use crate::labels::JOB_NAME_LABELS;

/// Waiting reasons after which a container can never start, whatever the wait.
const NEVER_STARTS: [&str; 2] = ["InvalidImageName", "ErrImageNeverPull"];

/// What is wrong with a helper pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trouble {
    /// It cannot start or cannot finish: fail its member with this message.
    Stuck(String),
    /// Evicted from its node (transient): replace it while the eviction budget lasts.
    Evicted(String),
}

/// How long ago `t` was, in whole seconds (0 when in the future or unknown).
fn age(t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>, now: Timestamp) -> i64 {
    t.map_or(0, |t| (now.as_second() - t.0.as_second()).max(0))
}

/// The trouble of one helper pod, if any (see the module docs).
pub fn pod_trouble(pod: &Pod, now: Timestamp, timeout: Duration) -> Option<Trouble> {
    let name = pod.name_any();
    let limit = i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX);
    let status = pod.status.clone().unwrap_or_default();
    if status.phase.as_deref() == Some("Failed") && status.reason.as_deref() == Some("Evicted") {
        let message = status.message.unwrap_or_default();
        return Some(Trouble::Evicted(format!(
            "pod {name} was evicted: {message}"
        )));
    }
    if let Some(deleted) = &pod.metadata.deletion_timestamp {
        let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        if age(Some(deleted), now) > grace + limit {
            return Some(Trouble::Stuck(format!(
                "pod {name} is still being deleted {}s after its grace period ended: its node {} \
                 is gone or its kubelet does not answer",
                age(Some(deleted), now) - grace,
                node.as_deref().unwrap_or("(none)")
            )));
        }
        return None;
    }
    let started = status.container_statuses.iter().flatten().any(|c| {
        c.state
            .as_ref()
            .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
    });
    if started || super::pod_finished(pod) {
        return None;
    }
    let waiting = status.container_statuses.iter().flatten().find_map(|c| {
        let w = c.state.as_ref()?.waiting.as_ref()?;
        let reason = w.reason.clone().filter(|r| r != "ContainerCreating")?;
        Some((reason, w.message.clone().unwrap_or_default()))
    });
    if let Some((reason, message)) = &waiting
        && NEVER_STARTS.contains(&reason.as_str())
    {
        return Some(Trouble::Stuck(format!(
            "pod {name} cannot start: {reason}: {message}"
        )));
    }
    let waited = age(pod.metadata.creation_timestamp.as_ref(), now);
    if waited <= limit {
        return None;
    }
    let unscheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    let why = match (waiting, unscheduled) {
        (Some((reason, message)), _) => format!("{reason}: {message}"),
        (None, Some(c)) => format!(
            "not scheduled: {}: {}",
            c.reason.as_deref().unwrap_or("PodScheduled=False"),
            c.message.as_deref().unwrap_or_default()
        ),
        (None, None) => format!(
            "no container started (phase {})",
            status.phase.as_deref().unwrap_or("unknown")
        ),
    };
    Some(Trouble::Stuck(format!(
        "pod {name} did not start within {limit}s: {why}"
    )))
}

/// The taint of non-graceful node shutdown: an administrator's word that the node is really
/// down (any effect).
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// A member pod stuck terminating on a lost node (see [`lost_pod`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostPod {
    pub node: String,
    /// `NotReady`, `Unknown` (no heartbeat) or `gone` (no such Node).
    pub node_state: String,
    /// Seconds since its grace period ended.
    pub waited: i64,
    /// What the Node itself says about force-deleting its pods (`None`: nothing).
    pub node_says: Option<ForceReason>,
}

/// Why a member pod stuck terminating on a lost node may be force-deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForceReason {
    /// The Node object is gone: the pod garbage collector's own case.
    NodeGone,
    /// The node carries the taint `node.kubernetes.io/out-of-service`.
    OutOfService,
    /// The request sets `spec.forceDeleteOnLostNode`.
    RequestAllows,
}

impl std::fmt::Display for ForceReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ForceReason::NodeGone => "its Node object is gone",
            ForceReason::OutOfService => "its node is tainted node.kubernetes.io/out-of-service",
            ForceReason::RequestAllows => "the request sets spec.forceDeleteOnLostNode",
        })
    }
}

impl LostPod {
    /// Why the pod may be force-deleted, `None` when it may not: its node is only NotReady or
    /// Unknown, so it may be partitioned and still run the pod and write to its volume.
    pub fn force(&self, request_allows: bool) -> Option<ForceReason> {
        self.node_says
            .or(request_allows.then_some(ForceReason::RequestAllows))
    }

    /// The message of the condition `NodeLost` while the request waits for the node: what to
    /// do to go on.
    pub fn waiting_message(&self, pod: &str) -> String {
        let node = &self.node;
        format!(
            "member pod {pod} is stuck terminating on node {node}, which is {}; it is not \
             force-deleted while the node may still run it and write to its volume. Once node \
             {node} is really down, taint it out-of-service (kubectl taint nodes {node} \
             {OUT_OF_SERVICE_TAINT}=nodeshutdown:NoExecute), or delete the Node object \
             (kubectl delete node {node}), or set spec.forceDeleteOnLostNode: true on this \
             request; until then the request waits, within its timeout",
            self.node_state
        )
    }
}

/// The state of a node that cannot run a pod we pin to it, `None` when it may: gone (no Node),
/// tainted out-of-service (declared down), or `Unknown` (no heartbeat). A node only `NotReady`
/// still has a kubelet that reports, and the helper's start timeout judges it.
pub fn node_down(node: Option<&Node>) -> Option<String> {
    let state = node_not_ready(node)?;
    match node {
        Some(n) if out_of_service(n) => Some(format!("{state}, tainted {OUT_OF_SERVICE_TAINT}")),
        Some(_) if state != "Unknown" => None,
        _ => Some(state),
    }
}

/// Whether the node carries the out-of-service taint.
fn out_of_service(node: &Node) -> bool {
    (node.spec.as_ref())
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT))
}

/// The state of a Node that is not Ready (its `Ready` condition `False` or `Unknown`, or the
/// Node gone), `None` when it is Ready.
pub fn node_not_ready(node: Option<&Node>) -> Option<String> {
    let Some(node) = node else {
        return Some("gone".to_string());
    };
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match ready.map(|c| c.status.as_str()) {
        Some("True") => None,
        Some("False") => Some("NotReady".to_string()),
        _ => Some("Unknown".to_string()),
    }
}

/// A pod that is still terminating `bound` after its grace period ended, on a node that is
/// NotReady, Unknown or gone (`nodes`: what was observed of the terminating member pods'
/// nodes; a node not observed is not judged). Kubernetes' pod garbage collector force-deletes
/// such a pod only once its Node object is deleted, and the non-graceful node shutdown once
/// the node is tainted out-of-service: [`LostPod::force`] says whether the operator may. A pod
/// on a Ready node is never judged lost: its kubelet will finish the deletion.
pub fn lost_pod(
    pod: &Pod,
    nodes: &BTreeMap<String, Option<Node>>,
    now: Timestamp,
    bound: Duration,
) -> Option<LostPod> {
    let deleted = pod.metadata.deletion_timestamp.as_ref()?;
    let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
    let waited = age(Some(deleted), now) - grace;
    if waited <= i64::try_from(bound.as_secs()).unwrap_or(i64::MAX) {
        return None;
    }
    let node = pod.spec.as_ref()?.node_name.clone()?;
    let observed = nodes.get(&node)?.as_ref();
    let node_state = node_not_ready(observed)?;
    let node_says = match observed {
        None => Some(ForceReason::NodeGone),
        Some(n) if out_of_service(n) => Some(ForceReason::OutOfService),
        Some(_) => None,
    };
    Some(LostPod {
        node,
        node_state,
        waited,
        node_says,
    })
}

/// The pods of Job `name`, oldest first.
pub fn job_pods<'a>(name: &str, pods: &'a BTreeMap<String, Pod>) -> Vec<&'a Pod> {
    let mut job_pods: Vec<&Pod> = pods
        .values()
        .filter(|p| {
            let l = p.labels();
            JOB_NAME_LABELS
                .iter()
                .any(|k| l.get(*k).map(String::as_str) == Some(name))
        })
        .collect();
    job_pods.sort_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0));
    job_pods
}

/// The trouble of a Job: that of its newest pod, or, with no pod a timeout after the Job's
/// creation, its pods refused at admission.
pub fn job_trouble(
    job: &ObservedJob,
    pods: &BTreeMap<String, Pod>,
    now: Timestamp,
    timeout: Duration,
) -> Option<Trouble> {
    let name = job.job.name_any();
    match job_pods(&name, pods).last() {
        Some(pod) => pod_trouble(pod, now, timeout),
        None if age(job.job.metadata.creation_timestamp.as_ref(), now)
            > i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX) =>
        {
            let why = match &job.refused {
                Some(message) => format!("the API server refused its pod: {message}"),
                None => format!(
                    "its pods are refused (a quota, Pod Security admission or a policy \
                     webhook; `kubectl describe job {name}` shows the FailedCreate Events)"
                ),
            };
            Some(Trouble::Stuck(format!(
                "Job {name} has created no pod within {}s: {why}",
                timeout.as_secs()
            )))
        }
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateWaiting, ContainerStatus,
        PodCondition, PodSpec, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    const TIMEOUT: Duration = Duration::from_secs(180);

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn pod(created: i64, status: PodStatus) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("move-etcd-0-copy-abc".into()),
                creation_timestamp: Some(Time(t(created))),
                labels: Some(BTreeMap::from([(
                    "job-name".to_string(),
                    "move-etcd-0-copy".to_string(),
                )])),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("node-a".into()),
                ..Default::default()
            }),
            status: Some(status),
        }
    }

    fn waiting(reason: &str, message: &str) -> PodStatus {
        PodStatus {
            phase: Some("Pending".into()),
            container_statuses: Some(vec![ContainerStatus {
                name: "mover".into(),
                state: Some(ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(reason.into()),
                        message: Some(message.into()),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    fn stuck(t: Option<Trouble>) -> String {
        match t {
            Some(Trouble::Stuck(m)) => m,
            other => panic!("not stuck: {other:?}"),
        }
    }

    #[test]
    fn an_image_that_cannot_be_pulled_fails_after_the_timeout_quoting_the_reason() {
        let p = pod(
            0,
            waiting("ImagePullBackOff", "Back-off pulling image \"nope:1\""),
        );
        assert_eq!(pod_trouble(&p, t(180), TIMEOUT), None, "within the timeout");
        let m = stuck(pod_trouble(&p, t(181), TIMEOUT));
        assert!(m.contains("did not start within 180s"), "{m}");
        assert!(
            m.contains("ImagePullBackOff: Back-off pulling image \"nope:1\""),
            "{m}"
        );
    }

    #[test]
    fn an_invalid_image_name_fails_at_once() {
        for reason in NEVER_STARTS {
            let p = pod(0, waiting(reason, "bad"));
            let m = stuck(pod_trouble(&p, t(1), TIMEOUT));
            assert!(m.contains(&format!("cannot start: {reason}: bad")), "{m}");
        }
        // Still creating is not a reason.
        let p = pod(0, waiting("ContainerCreating", ""));
        assert_eq!(pod_trouble(&p, t(1), TIMEOUT), None);
    }

    #[test]
    fn an_unschedulable_pod_quotes_the_scheduler() {
        let status = PodStatus {
            phase: Some("Pending".into()),
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some("0/3 nodes are available: 3 Insufficient memory.".into()),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let m = stuck(pod_trouble(&pod(0, status), t(200), TIMEOUT));
        assert!(
            m.contains(
                "not scheduled: Unschedulable: 0/3 nodes are available: 3 Insufficient memory."
            ),
            "{m}"
        );
    }

    #[test]
    fn a_running_or_finished_pod_is_fine_however_old() {
        let running = PodStatus {
            phase: Some("Running".into()),
            container_statuses: Some(vec![ContainerStatus {
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning::default()),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert_eq!(pod_trouble(&pod(0, running), t(10_000), TIMEOUT), None);
        let failed = PodStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        };
        assert_eq!(pod_trouble(&pod(0, failed), t(10_000), TIMEOUT), None);
    }

    #[test]
    fn an_eviction_is_told_apart() {
        let status = PodStatus {
            phase: Some("Failed".into()),
            reason: Some("Evicted".into()),
            message: Some("The node was low on resource: ephemeral-storage.".into()),
            ..Default::default()
        };
        assert_eq!(
            pod_trouble(&pod(0, status), t(5), TIMEOUT),
            Some(Trouble::Evicted(
                "pod move-etcd-0-copy-abc was evicted: The node was low on resource: ephemeral-storage."
                    .into()
            ))
        );
    }

    #[test]
    fn a_pod_stuck_in_deletion_names_its_node() {
        let mut p = pod(0, waiting("ContainerCreating", ""));
        p.metadata.deletion_timestamp = Some(Time(t(100)));
        p.metadata.deletion_grace_period_seconds = Some(10);
        assert_eq!(pod_trouble(&p, t(290), TIMEOUT), None);
        let m = stuck(pod_trouble(&p, t(291), TIMEOUT));
        assert!(m.contains("node node-a is gone"), "{m}");
    }

    fn node(ready: Option<&str>) -> Node {
        use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
        Node {
            metadata: ObjectMeta {
                name: Some("node-a".into()),
                ..Default::default()
            },
            status: ready.map(|r| NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: r.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_pod_terminating_on_a_lost_node_is_lost_after_its_grace_and_the_bound() {
        let mut p = pod(0, waiting("ContainerCreating", ""));
        let nodes = |n: Option<Node>| BTreeMap::from([("node-a".to_string(), n)]);
        let down = nodes(Some(node(Some("Unknown"))));
        assert_eq!(lost_pod(&p, &down, t(10_000), TIMEOUT), None, "not deleted");
        p.metadata.deletion_timestamp = Some(Time(t(100)));
        p.metadata.deletion_grace_period_seconds = Some(30);
        assert_eq!(
            lost_pod(&p, &down, t(310), TIMEOUT),
            None,
            "within the bound"
        );
        let lost = lost_pod(&p, &down, t(311), TIMEOUT);
        assert_eq!(
            lost,
            Some(LostPod {
                node: "node-a".into(),
                node_state: "Unknown".into(),
                waited: 181,
                node_says: None,
            })
        );
        for (n, state) in [
            (Some(node(Some("False"))), "NotReady"),
            (Some(node(None)), "Unknown"),
            (None, "gone"),
        ] {
            let got = lost_pod(&p, &nodes(n), t(400), TIMEOUT).map(|l| l.node_state);
            assert_eq!(got.as_deref(), Some(state));
        }
        // A Ready node finishes the deletion itself; a node not observed is not judged.
        let ready = nodes(Some(node(Some("True"))));
        assert_eq!(lost_pod(&p, &ready, t(10_000), TIMEOUT), None);
        assert_eq!(lost_pod(&p, &BTreeMap::new(), t(10_000), TIMEOUT), None);
    }

    #[test]
    fn only_a_gone_node_an_out_of_service_taint_or_the_request_allows_a_force_delete() {
        use k8s_openapi::api::core::v1::{NodeSpec, Taint};
        let mut p = pod(0, waiting("ContainerCreating", ""));
        p.metadata.deletion_timestamp = Some(Time(t(100)));
        let nodes = |n: Option<Node>| BTreeMap::from([("node-a".to_string(), n)]);
        let mut tainted = node(Some("False"));
        tainted.spec = Some(NodeSpec {
            taints: Some(vec![Taint {
                key: OUT_OF_SERVICE_TAINT.into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        for (n, says) in [
            (Some(node(Some("False"))), None),
            (Some(node(Some("Unknown"))), None),
            (Some(tainted), Some(ForceReason::OutOfService)),
            (None, Some(ForceReason::NodeGone)),
        ] {
            let lost = lost_pod(&p, &nodes(n), t(10_000), TIMEOUT).unwrap();
            assert_eq!(lost.node_says, says);
            assert_eq!(lost.force(false), says);
            assert_eq!(lost.force(true), says.or(Some(ForceReason::RequestAllows)));
        }
    }

    #[test]
    fn a_job_without_pods_is_refused_at_admission() {
        let mut job = ObservedJob {
            job: k8s_openapi::api::batch::v1::Job {
                metadata: ObjectMeta {
                    name: Some("move-etcd-0-copy".into()),
                    creation_timestamp: Some(Time(t(0))),
                    ..Default::default()
                },
                ..Default::default()
            },
            outcome: super::super::JobOutcome::Running,
            refused: None,
            progress: None,
        };
        let none = BTreeMap::new();
        assert_eq!(job_trouble(&job, &none, t(180), TIMEOUT), None);
        let m = stuck(job_trouble(&job, &none, t(181), TIMEOUT));
        assert!(m.contains("has created no pod within 180s"), "{m}");
        assert!(m.contains("FailedCreate"), "{m}");
        // With the API server's reason from the Job's FailedCreate Event, quoted.
        let quota = "Error creating: pods \"x\" is forbidden: exceeded quota: q";
        job.refused = Some(quota.into());
        let m = stuck(job_trouble(&job, &none, t(181), TIMEOUT));
        assert!(
            m.contains(&format!("the API server refused its pod: {quota}")),
            "{m}"
        );
        // With a pod, the pod's trouble.
        let p = pod(0, waiting("ErrImagePull", "not found"));
        let pods = BTreeMap::from([("p".to_string(), p)]);
        let m = stuck(job_trouble(&job, &pods, t(181), TIMEOUT));
        assert!(m.contains("ErrImagePull: not found"), "{m}");
    }
}
