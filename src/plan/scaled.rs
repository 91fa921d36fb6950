//! The member steps of a Deployment's claim (`plan.deployment`): its pods stop by scaling the
//! Deployment to zero and start by scaling it back to the replicas recorded before
//! (`status.deploymentReplicas`), through its `scale` subresource. Its template never changes.
//! The other steps (the new claim, the copies, the swap) are the StatefulSet member's.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;

use super::member::{Member, Mode, advance, finish_member, ms_mut};
use super::{
    Action, Ctx, EventType, Failure, disruption, helpers, is_terminating, pod_finished, pod_ready,
    pod_ready_since,
};
use crate::api::{MemberStep, conditions};

/// True when the request moves a Deployment's claim.
pub(super) fn is_scaled(cx: &Ctx) -> bool {
    cx.status
        .plan
        .as_ref()
        .is_some_and(|p| p.deployment.is_some())
}

fn deployment_name(cx: &Ctx) -> String {
    (cx.status.plan.as_ref())
        .and_then(|p| p.deployment.clone())
        .unwrap_or_default()
}

fn replicas(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

fn changed(deployment: String, what: &str) -> Failure {
    Failure::DeploymentChanged {
        deployment,
        what: what.to_string(),
    }
}

fn scale(cx: &mut Ctx, d: &Deployment, replicas: i32) {
    cx.act(Action::ScaleDeployment {
        deployment: d.name_any(),
        replicas,
        resource_version: d.resource_version(),
    });
    cx.wait(Duration::from_secs(1));
}

/// The gates before a Deployment stops, by its pods as they are now (the pod the member is named
/// after may have been replaced since preflight): every pod's PodDisruptionBudgets allow it to
/// stop, and the Deployment is rolled out and ready. True when both are open; otherwise the
/// condition says why and the member waits.
pub(super) fn gate_open(cx: &mut Ctx) -> bool {
    let pods: Vec<String> = cx.o.pods.keys().cloned().collect();
    if pods.iter().any(|pod| disruption::hold(cx, pod)) {
        return false;
    }
    let name = deployment_name(cx);
    let reason = match &cx.o.deployment {
        None => format!("Deployment {name} does not exist"),
        Some(d) if available(d) => {
            cx.set_condition(
                conditions::HEALTH_GATE,
                true,
                "Open",
                &format!("Deployment {name} is ready and may be scaled to zero"),
            );
            return true;
        }
        Some(d) => {
            let status = d.status.clone().unwrap_or_default();
            format!(
                "Deployment {name} is not ready: {} of {} replicas ready, {} updated",
                status.ready_replicas.unwrap_or(0),
                replicas(d),
                status.updated_replicas.unwrap_or(0)
            )
        }
    };
    if cx.set_condition(conditions::HEALTH_GATE, false, "Waiting", &reason) {
        cx.event(EventType::Warning, "WaitingForHealth", reason);
    }
    cx.wait(Duration::from_secs(2));
    false
}

/// `GatingStop` of a Deployment's claim: its gates ([`gate_open`]), then `StoppingPod`.
pub(super) fn gating(cx: &mut Ctx, mb: &Member) -> Result<(), Failure> {
    if gate_open(cx) {
        advance(cx, mb, MemberStep::StoppingPod);
    }
    Ok(())
}

/// Record the replicas, scale the Deployment to zero (only while the gates are open), wait
/// until every pod of it is gone.
pub(super) fn stopping(cx: &mut Ctx, mb: &Member) -> Result<(), Failure> {
    let name = deployment_name(cx);
    let Some(d) = cx.o.deployment.clone() else {
        return Err(changed(name, "was deleted before its pods stopped"));
    };
    let have = replicas(&d);
    // Recorded before the scale-down, in its own decision; replicas changed since (an
    // autoscaler declared paused) are recorded again, while the Deployment still runs.
    if have > 0 && cx.status.deployment_replicas != Some(have) {
        cx.status.deployment_replicas = Some(have);
        cx.requeue = Duration::ZERO;
        return Ok(());
    }
    let Some(recorded) = cx.status.deployment_replicas else {
        return Err(changed(
            name,
            "was scaled to zero by something else before the migration recorded its replicas",
        ));
    };
    if have > 0 {
        if !gate_open(cx) {
            return Ok(());
        }
        let now = cx.now.clone();
        if mb.ms.pod_deleted_at.is_none()
            && let Some(ms) = ms_mut(cx, mb)
        {
            ms.pod_deleted_at = Some(now);
        }
        scale(cx, &d, 0);
        return Ok(());
    }
    if let Some(pod) =
        cx.o.pods
            .values()
            .map(|p| p.typed())
            .find(|p| !pod_finished(p))
    {
        let bound = cx.settings.helper_start_timeout;
        if is_terminating(pod)
            && let Some(lost) = helpers::lost_pod(pod, &cx.o.nodes, cx.o.now, bound)
            && super::member::may_force(cx, &pod.name_any(), &lost)
        {
            return Err(Failure::NodeLost {
                pod: pod.name_any(),
                node: lost.node,
                node_state: lost.node_state,
                waited: lost.waited,
            });
        }
        cx.wait(Duration::from_secs(1));
        return Ok(());
    }
    if let Some(failure) = super::member::deleted_on_lost_node(cx, mb) {
        return Err(failure);
    }
    advance(cx, mb, MemberStep::Copying);
    cx.event(
        EventType::Normal,
        "PodStopped",
        format!(
            "Deployment {name} is scaled to zero (from {recorded} replicas) and its pods are \
             gone; copying claim {}",
            (super::claims::member_claims(&mb.planned, &mb.ms).iter())
                .map(|c| c.claim())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    Ok(())
}

/// Scale the Deployment back to its recorded replicas, then wait until its rollout is
/// available (rolling back: only scale it back).
pub(super) fn starting(cx: &mut Ctx, mb: &Member) -> Result<(), Failure> {
    let name = deployment_name(cx);
    let Some(d) = cx.o.deployment.clone() else {
        if mb.mode == Mode::Rollback {
            finish_member(cx, mb, None);
            return Ok(());
        }
        return Err(changed(name, "was deleted before it was scaled back"));
    };
    let Some(want) = cx.status.deployment_replicas else {
        return Err(changed(
            name,
            "has no recorded replicas to be scaled back to (status.deploymentReplicas)",
        ));
    };
    if replicas(&d) == 0 && want > 0 {
        scale(cx, &d, want);
        return Ok(());
    }
    if mb.mode == Mode::Rollback {
        finish_member(cx, mb, None);
        return Ok(());
    }
    if !available(&d) {
        cx.wait(Duration::from_secs(1));
        return Ok(());
    }
    let ready_since = (cx.o.pods.values().map(|p| p.typed()))
        .filter(|p| pod_ready(p))
        .filter_map(pod_ready_since)
        .max();
    finish_member(cx, mb, ready_since);
    Ok(())
}

/// The Deployment's newest generation is rolled out: every replica updated, ready and
/// available.
fn available(d: &Deployment) -> bool {
    let want = replicas(d);
    let Some(status) = &d.status else {
        return false;
    };
    status.observed_generation >= d.metadata.generation
        && status.updated_replicas.unwrap_or(0) == want
        && status.ready_replicas.unwrap_or(0) == want
        && status.available_replicas.unwrap_or(0) == want
        && status.replicas.unwrap_or(0) == want
}

/// Rolling back a member whose swap has not begun: the Deployment back to its recorded
/// replicas, on its untouched claim. True while that is pending.
pub(super) fn restore_replicas(cx: &mut Ctx) -> bool {
    let (Some(want), Some(d)) = (cx.status.deployment_replicas, cx.o.deployment.clone()) else {
        return false;
    };
    if replicas(&d) == 0 && want > 0 {
        scale(cx, &d, want);
        return true;
    }
    false
}
