//! Pure readers the cluster layer uses while it gathers an [`super::Observed`] snapshot: the
//! spec a request runs with, the member pods the engine must see, how a Job ended.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::JobOutcome;
use crate::api::conditions::{NODE_LOST, is_true};
use crate::api::{
    MemberStep, Stage, StorageMigrationRequest, StorageMigrationRequestSpec,
    StorageMigrationRequestStatus, TargetKind,
};
use crate::build::{self, Manifest};
use crate::labels;

/// Whether the planner checks who else mounts the members' claims ([`claim_users`]): in
/// Preflight, and while the member in flight is `Copying` (its final copy and verification), so
/// the namespace's pods are listed only then. A final request reads none.
pub fn reads_claim_users(status: &StorageMigrationRequestStatus) -> bool {
    in_flight_step(status, &[MemberStep::Copying])
}

/// Whether the planner looks at the StorageClasses: in Preflight (the target class, binding
/// modes) and while the member in flight is `CreatingClaim` (a class that waits for a consumer
/// gets a mounter pod). A final request reads none.
pub fn reads_storage_classes(status: &StorageMigrationRequestStatus) -> bool {
    in_flight_step(status, &[MemberStep::CreatingClaim])
}

/// Whether the planner looks at the PodDisruptionBudgets: in Preflight, and while the member in
/// flight is about to stop (`GatingStop`, `StoppingPod`: the gate before its pod is deleted, and
/// the timeout's failure that names the budget holding it). A final request reads none.
pub fn reads_budgets(status: &StorageMigrationRequestStatus) -> bool {
    in_flight_step(status, &[MemberStep::GatingStop, MemberStep::StoppingPod])
}

/// Whether the planner looks at the other requests of the namespace: in Preflight only (a
/// request waits there behind an earlier one on the same target). A final request reads none.
pub fn reads_other_requests(status: &StorageMigrationRequestStatus) -> bool {
    in_preflight(status)
}

/// Whether `status` is in Preflight (and not final): where the engine's preflight problems are
/// asked (`Client::preflight_problems`).
pub fn in_preflight(status: &StorageMigrationRequestStatus) -> bool {
    in_flight_step(status, &[])
}

/// Whether a change of a member pod, a member's claim or a volume may be what a request in
/// `status` waits for: not while its member in flight copies (`PreCopying`, `Copying`). That
/// member waits on its Job, whose end wakes the request through the watch of our Jobs, and its
/// running copy is looked at every few seconds anyway (`member::copy_poll`); meanwhile the claims'
/// `Unused` condition (Kubernetes 1.36+) changes as each copy pod starts and ends, and the other
/// members' pods as they restart, each of which would start a round that finds nothing to do.
pub fn wakes_on_members(status: &StorageMigrationRequestStatus) -> bool {
    let copying = [MemberStep::PreCopying, MemberStep::Copying];
    !(status.stage == Stage::Migrating && in_flight_step(status, &copying))
}

/// Whether a request in `status` waits, at `StoppingPod`, for its member in flight's pod `pod`
/// to be gone: the updates of that pod's termination (a few, as its containers stop) decide
/// nothing for it; its deletion is what it waits for.
pub fn waits_for_pod_gone(status: &StorageMigrationRequestStatus, pod: &str) -> bool {
    migrating_member(status).is_some_and(|m| m.step == MemberStep::StoppingPod && m.pod == pod)
}

/// The member in flight of a request in `status` that migrates and has not ended.
fn migrating_member(status: &StorageMigrationRequestStatus) -> Option<&crate::api::MemberStatus> {
    (status.stage == Stage::Migrating && !status.phase.is_final())
        .then(|| super::in_flight(status).and_then(|i| status.members.get(i)))
        .flatten()
}

/// Whether a request in `status` waits for `claim`, which it deleted, to be gone: its member in
/// flight's claim or temporary claim at `DeletingOldClaim` (which deletes both), its temporary
/// claim at `DeletingTempClaim`, of the claim the member works on (`claimIndex`). The updates of
/// that claim while it terminates (its finalizers, released one at a time) decide nothing for
/// it; its deletion is what it waits for.
pub fn waits_for_claim_gone(status: &StorageMigrationRequestStatus, claim: &str) -> bool {
    let Some(member) = migrating_member(status) else {
        return false;
    };
    let claims = super::claims::request_claims(status);
    let Some(on) = (claims.iter()).find(|c| c.pod() == member.pod && c.slot == member.claim_index)
    else {
        return false;
    };
    match member.step {
        MemberStep::DeletingOldClaim => on.claim() == claim || on.temp_claim() == claim,
        MemberStep::DeletingTempClaim => on.temp_claim() == claim,
        _ => false,
    }
}

/// Whether `status` is in Preflight, or in Migrating with its member in flight at one of
/// `steps`; false for a final request.
fn in_flight_step(status: &StorageMigrationRequestStatus, steps: &[MemberStep]) -> bool {
    if status.phase.is_final() {
        return false;
    }
    match status.stage {
        Stage::Preflight => true,
        Stage::Migrating => super::in_flight(status)
            .and_then(|i| status.members.get(i))
            .is_some_and(|m| steps.contains(&m.step)),
        _ => false,
    }
}

/// The pods that mount each claim, by claim name (pod names sorted, each once): neither our
/// helper pods (they carry the request label) nor pods that have finished (`Succeeded`,
/// `Failed`: their volumes are unmounted). A terminating pod still counts: it may still write.
pub fn claim_users(pods: &[Pod]) -> BTreeMap<String, Vec<String>> {
    let mut users: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for pod in not_ours(pods) {
        for claim in super::claims_held(pod) {
            users
                .entry(claim.to_string())
                .or_default()
                .insert(pod.name_any());
        }
    }
    users
        .into_iter()
        .map(|(claim, pods)| (claim, pods.into_iter().collect()))
        .collect()
}

/// The pods that are not our helper pods (those carry the request label).
fn not_ours(pods: &[Pod]) -> impl Iterator<Item = &Pod> {
    pods.iter()
        .filter(|p| !p.labels().contains_key(labels::REQUEST_LABEL))
}

/// A pod that mounts the request's target claim (`target.kind: PersistentVolumeClaim`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimUser {
    /// The pod's name.
    pub pod: String,
    /// The kind and name of the pod's controller (its ownerReference with `controller: true`),
    /// or of the Deployment that controls that ReplicaSet when the cluster layer found one;
    /// `None` for a bare pod.
    pub owner: Option<(String, String)>,
}

/// The pods that mount `claim`, by name, each with its controller; our helper pods and
/// finished pods left out, as in [`claim_users`].
pub fn target_claim_users(pods: &[Pod], claim: &str) -> Vec<ClaimUser> {
    let mut users: Vec<ClaimUser> = not_ours(pods)
        .filter(|p| super::claims_held(p).any(|c| c == claim))
        .map(|p| ClaimUser {
            pod: p.name_any(),
            owner: super::controller_ref(p).map(|o| (o.kind.clone(), o.name.clone())),
        })
        .collect();
    users.sort_by(|a, b| a.pod.cmp(&b.pod));
    users
}

/// The workload a request works on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Workload {
    /// None found (a claim target no single workload's pods mount): preflight denies it.
    #[default]
    None,
    StatefulSet(String),
    Deployment(String),
    /// A pod that no controller owns (a claim target's only user).
    Pod(String),
}

impl Workload {
    /// The StatefulSet's name, empty for any other workload.
    pub fn stateful_set(&self) -> &str {
        match self {
            Workload::StatefulSet(name) => name,
            _ => "",
        }
    }

    /// The Deployment's name, empty for any other workload.
    pub fn deployment(&self) -> &str {
        match self {
            Workload::Deployment(name) => name,
            _ => "",
        }
    }

    /// The bare pod's name, empty for any other workload.
    pub fn pod(&self) -> &str {
        match self {
            Workload::Pod(name) => name,
            _ => "",
        }
    }
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Workload::None => f.write_str("no workload"),
            Workload::StatefulSet(name) => write!(f, "StatefulSet {name}"),
            Workload::Deployment(name) => write!(f, "Deployment {name}"),
            Workload::Pod(name) => write!(f, "pod {name}"),
        }
    }
}

/// The workload a request works on: its target, or for a claim target the workload in its
/// plan, else the one that controls the only pod mounting the claim (a ReplicaSet's pod counts
/// as its Deployment's, see [`ClaimUser::owner`]).
pub fn target_workload(
    spec: &StorageMigrationRequestSpec,
    status: &StorageMigrationRequestStatus,
    users: &[ClaimUser],
) -> Workload {
    let name = spec.target.name.clone();
    match spec.target.kind {
        TargetKind::StatefulSet => Workload::StatefulSet(name),
        TargetKind::Deployment => Workload::Deployment(name),
        TargetKind::PersistentVolumeClaim => match &status.plan {
            Some(plan) => match (&plan.deployment, &plan.pod) {
                (Some(d), _) => Workload::Deployment(d.clone()),
                (None, Some(pod)) => Workload::Pod(pod.clone()),
                (None, None) => Workload::StatefulSet(plan.stateful_set.clone()),
            },
            None => match users {
                [ClaimUser { owner: None, pod }] => Workload::Pod(pod.clone()),
                [
                    ClaimUser {
                        owner: Some((kind, name)),
                        ..
                    },
                ] => match kind.as_str() {
                    "StatefulSet" => Workload::StatefulSet(name.clone()),
                    "Deployment" => Workload::Deployment(name.clone()),
                    _ => Workload::None,
                },
                _ => Workload::None,
            },
        },
    }
}

/// Whether `req` carries our finalizer ([`labels::FINALIZER`]).
pub fn has_finalizer(req: &StorageMigrationRequest) -> bool {
    req.finalizers().iter().any(|f| f == labels::FINALIZER)
}

/// Whether another request may work on `workload`: its target is it, or its plan's workload
/// is. A claim target not yet planned counts for every Deployment, and for a StatefulSet `set`
/// when its claim could be one of the set's (`<template>-<set>-<ordinal>`), so that two
/// requests on one workload are never judged at once.
pub fn may_target(req: &StorageMigrationRequest, workload: &Workload) -> bool {
    let spec = effective_spec(req);
    let status = req.status.clone().unwrap_or_default();
    match (spec.target.kind, &status.plan, workload) {
        (TargetKind::PersistentVolumeClaim, None, Workload::StatefulSet(set)) => {
            let claim = spec.target.name.as_str();
            claim.rsplit_once('-').is_some_and(|(head, ordinal)| {
                ordinal.parse::<u32>().is_ok() && head.ends_with(&format!("-{set}"))
            })
        }
        (TargetKind::PersistentVolumeClaim, None, Workload::Deployment(_) | Workload::Pod(_)) => {
            true
        }
        (_, _, Workload::None) => false,
        _ => &target_workload(&spec, &status, &[]) == workload,
    }
}

/// The pods other than `member` that mount `claim`, from [`claim_users`]; comma-separated,
/// `None` when there are none.
pub fn other_claim_users(
    users: &BTreeMap<String, Vec<String>>,
    claim: &str,
    member: &str,
) -> Option<String> {
    let others: Vec<&str> = users
        .get(claim)
        .into_iter()
        .flatten()
        .map(String::as_str)
        .filter(|p| *p != member)
        .collect();
    (!others.is_empty()).then(|| others.join(", "))
}

/// The spec fields (as written in YAML) read from the current spec even once the request is
/// accepted: they change nothing the plan follows from, and are meant to be set while it runs.
pub const LIVE_SPEC_FIELDS: [&str; 1] = ["forceDeleteOnLostNode"];

/// The spec the request runs with: the accepted one once accepted, else the current one; the
/// [`LIVE_SPEC_FIELDS`] always from the current one.
pub fn effective_spec(req: &StorageMigrationRequest) -> StorageMigrationRequestSpec {
    let mut spec = req
        .status
        .as_ref()
        .and_then(|s| s.accepted_spec.as_deref())
        .cloned()
        .unwrap_or_else(|| req.spec.clone());
    spec.force_delete_on_lost_node = req.spec.force_delete_on_lost_node;
    spec
}

/// The member pods the engine must see: the plan's, or before acceptance the set's ordinals.
pub fn expected_members(
    status: &StorageMigrationRequestStatus,
    set: Option<&StatefulSet>,
    set_name: &str,
) -> Vec<String> {
    if let Some(plan) = &status.plan {
        return plan.members.iter().map(|m| m.pod.clone()).collect();
    }
    let Some(spec) = set.and_then(|s| s.spec.as_ref()) else {
        return Vec::new();
    };
    let replicas = spec.replicas.unwrap_or(1).max(0);
    let start = spec.ordinals.as_ref().and_then(|o| o.start).unwrap_or(0);
    (start..start + replicas)
        .map(|i| format!("{set_name}-{i}"))
        .collect()
}

/// The nodes to read: those of the pods that are terminating, among the plan's member pods and
/// our helper pods (a pod stuck terminating on a lost node is force-deleted: see
/// `helpers::lost_pod`); and, while the request waits for a lost node (condition `NodeLost`),
/// the planned node of each member being stopped, where its copy would run once its pod is
/// gone (`member::deleted_on_lost_node`).
pub fn nodes_to_judge(
    status: &StorageMigrationRequestStatus,
    pods: &BTreeMap<String, Manifest<Pod>>,
    helper_pods: &BTreeMap<String, Pod>,
) -> BTreeSet<String> {
    let Some(plan) = &status.plan else {
        return BTreeSet::new();
    };
    let members = plan.members.iter().filter_map(|m| pods.get(&m.pod));
    let terminating = members
        .map(|p| p.typed())
        .chain(helper_pods.values())
        .filter(|p| p.metadata.deletion_timestamp.is_some())
        .filter_map(|p| p.spec.as_ref()?.node_name.clone());
    let waiting = is_true(&status.conditions, NODE_LOST);
    let stopping = (status.members.iter())
        .filter(|ms| waiting && ms.step == MemberStep::StoppingPod)
        .filter_map(|ms| plan.members.iter().find(|m| m.pod == ms.pod))
        .map(|m| m.node.clone());
    terminating.chain(stopping).collect()
}

/// How a Job ended, with the termination message of its newest pod among `pods`.
pub fn job_outcome(job: &Job, pods: &BTreeMap<String, Pod>) -> JobOutcome {
    let name = job.name_any();
    let conditions = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let is = |t: &str| {
        conditions
            .iter()
            .any(|c| c.type_ == t && c.status == "True")
    };
    let message = job_pods(&name, pods)
        .iter()
        .rev()
        .find_map(|p| termination_message(p));
    if is("Complete") {
        return JobOutcome::Succeeded { message };
    }
    if is("Failed") {
        let condition = conditions
            .iter()
            .find(|c| c.type_ == "Failed")
            .map(|c| {
                format!(
                    "{}{}",
                    c.reason.clone().unwrap_or_default(),
                    c.message
                        .as_ref()
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                )
            })
            .unwrap_or_default();
        let detail = message
            .as_deref()
            .map(failure_detail)
            .map(|m| format!("; {}", m.trim()))
            .unwrap_or_default();
        let reason = format!("Job {name} failed: {condition}{detail}");
        let result = message.and_then(|m| build::parse_job_result(&m).ok());
        return match result {
            Some(r) if r.cause == Some(build::JobFailureCause::NoSpace) => JobOutcome::NoSpace {
                reason,
                result: Box::new(r),
            },
            Some(r) if r.verified_in_pass() => JobOutcome::VerifyFailed {
                reason,
                result: Box::new(r),
            },
            _ => JobOutcome::Failed { reason },
        };
    }
    JobOutcome::Running
}

/// The conditions of a Job that end what a request waits on ([`job_outcome`] reads no other):
/// not `SuccessCriteriaMet` and `FailureTarget`, which the Job controller sets while the Job's
/// pods still terminate, a moment before `Complete` or `Failed`.
pub const ENDING_JOB_CONDITIONS: [&str; 2] = ["Complete", "Failed"];

/// Whether `pods` (our helper pods) are older than one of `jobs`: a Job has ended
/// ([`ENDING_JOB_CONDITIONS`]) while none of its pods has a container that terminated. The Job controller ends
/// a Job only after its pod's end, so pods listed after the Job show that end; a list kept from
/// an earlier round (`cluster::read_cache`) may not, and the Job's result (its pod's
/// termination message) would be missed.
pub fn pods_behind_jobs(jobs: &[Job], pods: &BTreeMap<String, Pod>) -> bool {
    let ended = |job: &Job| {
        let conditions = job.status.as_ref().and_then(|s| s.conditions.as_deref());
        (conditions.unwrap_or_default().iter())
            .any(|c| ENDING_JOB_CONDITIONS.contains(&c.type_.as_str()) && c.status == "True")
    };
    let terminated = |pod: &&Pod| {
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_deref());
        (statuses.unwrap_or_default().iter())
            .any(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()))
    };
    (jobs.iter().filter(|j| ended(j))).any(|j| {
        !super::helpers::job_pods(&j.name_any(), pods)
            .iter()
            .any(terminated)
    })
}

/// The pod whose log shows a running copy Job's progress, and the pass it copies: the Job's
/// newest pod, when the Job is a PreCopy or Copy Job, still running, and its pod `Running`.
pub fn copy_log_pod(
    job: &Job,
    outcome: &JobOutcome,
    pods: &BTreeMap<String, Pod>,
) -> Option<(String, crate::api::CopyPass)> {
    use crate::api::CopyPass;
    let pass = match job.labels().get(labels::JOB_KIND_LABEL).map(String::as_str) {
        Some(k) if k == build::JobKind::PreCopy.as_str() => CopyPass::PreCopy,
        Some(k) if k == build::JobKind::Copy.as_str() => CopyPass::Copy,
        _ => return None,
    };
    if *outcome != JobOutcome::Running {
        return None;
    }
    let pod = *job_pods(&job.name_any(), pods).last()?;
    let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    running.then(|| (pod.name_any(), pass))
}

/// The used bytes measured at preflight (Shrink) of the member a Job copies, if any: the total
/// of its copy until rsync reports a percentage.
pub fn measured_bytes(job: &Job, status: &StorageMigrationRequestStatus) -> Option<i64> {
    let pod = job.labels().get(labels::MEMBER_LABEL)?;
    let plan = status.plan.as_ref()?;
    (plan.members.iter().find(|m| &m.pod == pod)).and_then(|m| m.used_bytes)
}

/// The pods of Job `name`, oldest first.
fn job_pods<'a>(name: &str, pods: &'a BTreeMap<String, Pod>) -> Vec<&'a Pod> {
    super::helpers::job_pods(name, pods)
}

/// A failed Job's termination message for humans: the script's `error` with its exit code when
/// the message is the script's JSON result, else the message as it is.
fn failure_detail(message: &str) -> String {
    build::parse_job_result(message)
        .ok()
        .and_then(|r| r.error.map(|e| format!("{e} (exit {:?})", r.exit_code)))
        .unwrap_or_else(|| message.to_string())
}

/// The first non-blank termination message of the pod's terminated containers.
pub fn termination_message(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find_map(|c| {
            c.state
                .as_ref()?
                .terminated
                .as_ref()?
                .message
                .clone()
                .filter(|m| !m.trim().is_empty())
        })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::StatefulSetOrdinals;
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;
    use crate::api::{Plan, PlannedMember};
    use crate::plan::fixtures::{self, t};

    fn job(conditions: &[(&str, &str, Option<&str>)]) -> Job {
        Job {
            metadata: ObjectMeta {
                name: Some("copy-etcd-0".into()),
                ..Default::default()
            },
            status: Some(JobStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(type_, reason, message)| JobCondition {
                            type_: type_.to_string(),
                            status: "True".into(),
                            reason: Some(reason.to_string()),
                            message: message.map(str::to_string),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn job_pod(name: &str, label: &str, created: i64, message: Option<&str>) -> (String, Pod) {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([(label.into(), "copy-etcd-0".into())])),
                creation_timestamp: Some(Time(t(created))),
                ..Default::default()
            },
            status: Some(PodStatus {
                container_statuses: Some(vec![ContainerStatus {
                    name: "copy".into(),
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            message: message.map(str::to_string),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        (name.to_string(), pod)
    }

    /// An ended Job whose pods show no end yet: its pods were listed before it ended.
    #[test]
    fn pods_that_do_not_show_an_ended_jobs_end_are_behind_it() {
        let ended = job(&[("Complete", "Completed", None)]);
        let done = BTreeMap::from([job_pod("p", "job-name", 0, Some("{}"))]);
        assert!(!pods_behind_jobs(std::slice::from_ref(&ended), &done));
        let mut running = job_pod("p", "job-name", 0, None);
        if let Some(s) = running.1.status.as_mut() {
            s.container_statuses = Some(vec![ContainerStatus {
                name: "copy".into(),
                state: Some(ContainerState {
                    running: Some(Default::default()),
                    ..Default::default()
                }),
                ..Default::default()
            }]);
        }
        let not_yet = BTreeMap::from([running]);
        assert!(pods_behind_jobs(std::slice::from_ref(&ended), &not_yet));
        assert!(
            pods_behind_jobs(&[ended], &BTreeMap::new()),
            "no pod listed"
        );
        assert!(!pods_behind_jobs(&[job(&[])], &not_yet), "a running Job");
        let failed = job(&[("Failed", "DeadlineExceeded", None)]);
        assert!(pods_behind_jobs(&[failed], &not_yet));
    }

    #[test]
    fn the_log_of_a_running_copy_pod_is_read() {
        let mut running = job_pod("new", "job-name", 5, None);
        running.1.status.as_mut().unwrap().phase = Some("Running".into());
        let pending = job_pod("old", "job-name", 0, None);
        let pods = BTreeMap::from([running, pending.clone()]);
        let mut copy = job(&[]);
        copy.labels_mut()
            .insert(labels::JOB_KIND_LABEL.into(), "copy".into());
        let got = copy_log_pod(&copy, &JobOutcome::Running, &pods);
        assert_eq!(got, Some(("new".into(), crate::api::CopyPass::Copy)));
        let done = JobOutcome::Succeeded { message: None };
        assert_eq!(copy_log_pod(&copy, &done, &pods), None, "not running");
        let only_pending = BTreeMap::from([pending]);
        assert_eq!(
            copy_log_pod(&copy, &JobOutcome::Running, &only_pending),
            None
        );
        let mut verify = copy.clone();
        verify
            .labels_mut()
            .insert(labels::JOB_KIND_LABEL.into(), "verify".into());
        assert_eq!(copy_log_pod(&verify, &JobOutcome::Running, &pods), None);
    }

    #[test]
    fn the_measured_size_of_the_copied_member() {
        let mut copy = job(&[]);
        let mut status = StorageMigrationRequestStatus::default();
        assert_eq!(measured_bytes(&copy, &status), None);
        copy.labels_mut()
            .insert(labels::MEMBER_LABEL.into(), "etcd-1".into());
        let member = |pod: &str, used| PlannedMember {
            pod: pod.into(),
            used_bytes: used,
            ..Default::default()
        };
        status.plan = Some(Plan {
            members: vec![member("etcd-0", Some(1)), member("etcd-1", Some(42))],
            ..Default::default()
        });
        assert_eq!(measured_bytes(&copy, &status), Some(42));
    }

    #[test]
    fn a_job_without_a_final_condition_is_running() {
        let pods = BTreeMap::from([job_pod("p", "job-name", 0, Some("{}"))]);
        assert_eq!(job_outcome(&job(&[]), &pods), JobOutcome::Running);
        let suspended = job(&[("Suspended", "JobSuspended", None)]);
        assert_eq!(job_outcome(&suspended, &pods), JobOutcome::Running);
    }

    #[test]
    fn a_complete_job_carries_its_newest_pods_message() {
        let pods = BTreeMap::from([
            job_pod("old", "job-name", 0, Some("old")),
            job_pod("new", "batch.kubernetes.io/job-name", 5, Some("new")),
            job_pod("blank", "job-name", 9, Some("  ")),
            job_pod("other", "app", 10, Some("not this Job's")),
        ]);
        assert_eq!(
            job_outcome(&job(&[("Complete", "Completed", None)]), &pods),
            JobOutcome::Succeeded {
                message: Some("new".into())
            }
        );
        assert_eq!(
            job_outcome(&job(&[("Complete", "Completed", None)]), &BTreeMap::new()),
            JobOutcome::Succeeded { message: None }
        );
    }

    #[test]
    fn a_failed_job_says_why_with_the_scripts_error() {
        let failed = job(&[("Failed", "BackoffLimitExceeded", Some("too many"))]);
        let script = r#"{"error":"rsync failed","exitCode":23}"#;
        let pods = BTreeMap::from([job_pod("p", "job-name", 0, Some(script))]);
        assert_eq!(
            job_outcome(&failed, &pods),
            JobOutcome::Failed {
                reason: "Job copy-etcd-0 failed: BackoffLimitExceeded: too many; rsync failed \
                         (exit Some(23))"
                    .into()
            }
        );
        let pods = BTreeMap::from([job_pod("p", "job-name", 0, Some(" killed \n"))]);
        assert_eq!(
            job_outcome(&failed, &pods),
            JobOutcome::Failed {
                reason: "Job copy-etcd-0 failed: BackoffLimitExceeded: too many; killed".into()
            }
        );
        assert_eq!(
            job_outcome(
                &job(&[("Failed", "DeadlineExceeded", None)]),
                &BTreeMap::new()
            ),
            JobOutcome::Failed {
                reason: "Job copy-etcd-0 failed: DeadlineExceeded".into()
            }
        );
    }

    #[test]
    fn a_copy_out_of_space_is_told_apart_with_its_numbers() {
        let failed = job(&[("Failed", "BackoffLimitExceeded", None)]);
        let script = r#"{"error":"rsync exited with 11: no space left on the target","exitCode":11,"cause":"NoSpace","usedBytes":42,"targetFilesystem":{"type":"ext2/ext3","blockSize":1024,"blocks":100,"blocksFree":0,"blocksAvailable":0,"inodes":10,"inodesFree":5}}"#;
        let pods = BTreeMap::from([job_pod("p", "job-name", 0, Some(script))]);
        let JobOutcome::NoSpace { reason, result } = job_outcome(&failed, &pods) else {
            panic!("not NoSpace: {:?}", job_outcome(&failed, &pods));
        };
        assert_eq!(
            reason,
            "Job copy-etcd-0 failed: BackoffLimitExceeded; rsync exited with 11: no space left \
             on the target (exit Some(11))"
        );
        assert_eq!(result.used_bytes, Some(42));
        assert_eq!(result.target_filesystem.map(|f| f.blocks), Some(100));
        // The same result from a Job that did not fail is no failure.
        let complete = job(&[("Complete", "Completed", None)]);
        assert!(matches!(
            job_outcome(&complete, &pods),
            JobOutcome::Succeeded { .. }
        ));
    }

    /// A Copy Job that verified in its own pod and failed there is told from a failed copy:
    /// with differences, or with a failed comparison (its error names the mode).
    #[test]
    fn a_failed_verification_pass_is_told_apart_from_a_failed_copy() {
        let failed = job(&[("Failed", "BackoffLimitExceeded", None)]);
        let differs = r#"{"bytes":7,"files":1,"exitCode":0,"differences":2,"verifyMode":"Changed","checkedFiles":1}"#;
        let broken =
            r#"{"error":"rsync verification exited with 23","exitCode":23,"verifyMode":"Full"}"#;
        let copy = r#"{"error":"rsync exited with 23","exitCode":23}"#;
        for (script, differences) in [(differs, Some(2)), (broken, None)] {
            let pods = BTreeMap::from([job_pod("p", "job-name", 0, Some(script))]);
            let JobOutcome::VerifyFailed { result, .. } = job_outcome(&failed, &pods) else {
                panic!("not VerifyFailed: {:?}", job_outcome(&failed, &pods));
            };
            assert_eq!(result.differences, differences, "{script}");
        }
        let pods = BTreeMap::from([job_pod("p", "job-name", 0, Some(copy))]);
        assert!(matches!(
            job_outcome(&failed, &pods),
            JobOutcome::Failed { .. }
        ));
    }

    #[test]
    fn termination_message_skips_blank_and_running_containers() {
        let (_, mut pod) = job_pod("p", "job-name", 0, Some(" \n"));
        assert_eq!(termination_message(&pod), None);
        if let Some(s) = pod
            .status
            .as_mut()
            .and_then(|s| s.container_statuses.as_mut())
        {
            s.insert(
                0,
                ContainerStatus {
                    name: "running".into(),
                    ..Default::default()
                },
            );
            s.push(
                job_pod("q", "job-name", 0, Some("done"))
                    .1
                    .status
                    .unwrap()
                    .container_statuses
                    .unwrap()
                    .remove(0),
            );
        }
        assert_eq!(termination_message(&pod), Some("done".into()));
        assert_eq!(termination_message(&Pod::default()), None);
    }

    #[test]
    fn expected_members_come_from_the_plan_else_the_sets_ordinals() {
        let mut set = fixtures::stateful_set(3);
        let status = StorageMigrationRequestStatus::default();
        assert_eq!(
            expected_members(&status, Some(&set), "etcd"),
            ["etcd-0", "etcd-1", "etcd-2"]
        );
        if let Some(spec) = set.spec.as_mut() {
            spec.ordinals = Some(StatefulSetOrdinals { start: Some(5) });
            spec.replicas = Some(2);
        }
        assert_eq!(
            expected_members(&status, Some(&set), "etcd"),
            ["etcd-5", "etcd-6"]
        );
        assert!(expected_members(&status, None, "etcd").is_empty());
        let planned = StorageMigrationRequestStatus {
            plan: Some(Plan {
                members: vec![PlannedMember {
                    pod: "etcd-1".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(expected_members(&planned, Some(&set), "etcd"), ["etcd-1"]);
        assert_eq!(expected_members(&planned, None, "etcd"), ["etcd-1"]);
    }

    #[test]
    fn effective_spec_is_the_accepted_one_once_accepted() {
        let mut req = fixtures::request(fixtures::spec_class_change("fast"));
        assert_eq!(effective_spec(&req), req.spec);
        let accepted = fixtures::spec_class_change("slow");
        req.status = Some(StorageMigrationRequestStatus {
            accepted_spec: Some(Box::new(accepted.clone())),
            ..Default::default()
        });
        assert_eq!(effective_spec(&req), accepted);
    }

    #[test]
    fn force_delete_on_lost_node_is_read_from_the_current_spec() {
        let mut req = fixtures::request(fixtures::spec_class_change("fast"));
        req.status = Some(StorageMigrationRequestStatus {
            accepted_spec: Some(Box::new(fixtures::spec_class_change("fast"))),
            ..Default::default()
        });
        assert!(!effective_spec(&req).force_delete_on_lost_node);
        req.spec.force_delete_on_lost_node = true;
        assert!(effective_spec(&req).force_delete_on_lost_node);
    }

    fn pod_with_claims(name: &str, claims: &[&str], phase: &str) -> Pod {
        use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, PodSpec, Volume};
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                volumes: Some(
                    claims
                        .iter()
                        .map(|c| Volume {
                            name: format!("v-{c}"),
                            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                                claim_name: c.to_string(),
                                read_only: None,
                            }),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn claim_users_leave_out_our_helpers_and_finished_pods() {
        let mut helper = pod_with_claims("copy-x", &["data-etcd-0", "tmp-0"], "Running");
        helper
            .labels_mut()
            .insert(labels::REQUEST_LABEL.into(), "req".into());
        let mut going = pod_with_claims("backup-b", &["data-etcd-0"], "Running");
        going.metadata.deletion_timestamp = Some(Time(t(3)));
        let pods = vec![
            pod_with_claims("etcd-0", &["data-etcd-0"], "Running"),
            pod_with_claims("backup-a", &["data-etcd-0", "data-etcd-1"], "Pending"),
            going,
            pod_with_claims("done", &["data-etcd-1"], "Succeeded"),
            pod_with_claims("crashed", &["data-etcd-1"], "Failed"),
            helper,
        ];
        let users = claim_users(&pods);
        let names = |c: &str| users[c].iter().map(String::as_str).collect::<Vec<_>>();
        assert_eq!(names("data-etcd-0"), ["backup-a", "backup-b", "etcd-0"]);
        assert_eq!(names("data-etcd-1"), ["backup-a"]);
        assert!(!users.contains_key("tmp-0"), "{users:?}");
        assert_eq!(
            other_claim_users(&users, "data-etcd-0", "etcd-0").as_deref(),
            Some("backup-a, backup-b")
        );
        assert_eq!(other_claim_users(&users, "data-etcd-1", "backup-a"), None);
        assert_eq!(other_claim_users(&users, "data-etcd-9", "etcd-9"), None);
    }

    /// A request migrating its one member, at `step`.
    fn migrating_at(step: MemberStep) -> StorageMigrationRequestStatus {
        StorageMigrationRequestStatus {
            stage: Stage::Migrating,
            members: vec![crate::api::MemberStatus {
                pod: "etcd-0".into(),
                step,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn claim_users_are_read_in_preflight_and_during_a_copy_only() {
        let mut status = StorageMigrationRequestStatus::default();
        assert!(reads_claim_users(&status), "Preflight");
        status = migrating_at(MemberStep::StoppingPod);
        assert!(!reads_claim_users(&status));
        status.members[0].step = MemberStep::Copying;
        assert!(reads_claim_users(&status));
        status.members[0].step = MemberStep::RetainingVolumes;
        assert!(!reads_claim_users(&status));
        status.members[0].step = MemberStep::Copying;
        status.phase = crate::api::Phase::Failed;
        assert!(!reads_claim_users(&status), "final");
    }

    #[test]
    fn budgets_are_read_in_preflight_and_while_a_member_is_about_to_stop_only() {
        let mut status = StorageMigrationRequestStatus::default();
        assert!(reads_budgets(&status), "Preflight");
        status = migrating_at(MemberStep::PreCopying);
        assert!(!reads_budgets(&status));
        for step in [MemberStep::GatingStop, MemberStep::StoppingPod] {
            status.members[0].step = step;
            assert!(reads_budgets(&status), "{step:?}");
        }
        status.members[0].step = MemberStep::Copying;
        assert!(!reads_budgets(&status));
        status.members[0].step = MemberStep::GatingStop;
        status.phase = crate::api::Phase::Failed;
        assert!(!reads_budgets(&status), "final");
    }

    #[test]
    fn classes_are_read_in_preflight_and_while_a_temporary_claim_is_made_other_requests_in_preflight()
     {
        let mut status = StorageMigrationRequestStatus::default();
        assert!(reads_storage_classes(&status) && reads_other_requests(&status));
        status = migrating_at(MemberStep::CreatingClaim);
        assert!(reads_storage_classes(&status));
        assert!(!reads_other_requests(&status));
        status.members[0].step = MemberStep::Copying;
        assert!(!reads_storage_classes(&status));
        status.members[0].step = MemberStep::CreatingClaim;
        status.phase = crate::api::Phase::Failed;
        assert!(!reads_storage_classes(&status), "final");
        status.phase = crate::api::Phase::Progressing;
        status.stage = Stage::RecreatingStatefulSet;
        assert!(!reads_storage_classes(&status) && !reads_other_requests(&status));
    }
}
