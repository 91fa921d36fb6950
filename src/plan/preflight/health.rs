//! The database engine's view at preflight: the members' roles, and `apply: IfReady` (the
//! database healthy, and every PodDisruptionBudget that selects a member to migrate allowing a
//! disruption now).
//!
//! The only place preflight reads the engine's [`HealthReport`] and the budgets.

use super::{Denial, DenialReason};
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::api::{ApplyPolicy, PlannedMember, PlannedWork};
use crate::build::Manifest;
use crate::engine::{self, HealthReport, HealthUnavailable, Rules};
use crate::plan::disruption::{self, Budget};

/// Marks each member `leader` or `follower` as the engine reports it (members the report does
/// not name keep no role; nothing is marked when the health cannot be read).
pub(super) fn assign_roles(
    health: &Result<HealthReport, HealthUnavailable>,
    members: &mut [PlannedMember],
) {
    let Ok(report) = health else {
        return;
    };
    for m in members {
        if let Some(h) = report.members.iter().find(|h| h.pod == m.pod) {
            m.role = Some(h.role());
        }
    }
}

/// What the engine denies whatever `apply` says ([`Rules::preflight`]); then, for
/// `apply: IfReady`, the health can be read and every member is healthy (a member missing from
/// the report counts as unhealthy). `apply: Always` passes.
pub(super) fn check_engine_health(
    apply: ApplyPolicy,
    rules: &dyn Rules,
    health: &Result<HealthReport, HealthUnavailable>,
    members: &[PlannedMember],
) -> Result<(), Denial> {
    rules
        .preflight(health)
        .map_err(|why| Denial::new(DenialReason::EngineRefuses, why))?;
    if apply != ApplyPolicy::IfReady {
        return Ok(());
    }
    match health {
        Ok(report) => {
            let mut report = report.clone();
            let pods: Vec<String> = members.iter().map(|m| m.pod.clone()).collect();
            engine::note_missing_pods(&mut report, &pods);
            rules.healthy_for_start(&report).map_err(|problems| {
                Denial::new(
                    DenialReason::NotHealthy,
                    format!("apply is IfReady and the database is not healthy: {problems}"),
                )
            })
        }
        Err(e) => Err(Denial::new(
            DenialReason::NotHealthy,
            format!("apply is IfReady and the database's health cannot be read: {e}"),
        )),
    }
}

/// `apply: IfReady`: every PodDisruptionBudget that selects a member to migrate allows a
/// disruption now (by the disruption controller's status: the StatefulSet still owns its pods).
/// A budget whose rule leaves no room for these pods is named as such. `apply: Always` passes:
/// each member then waits for its budgets before it stops.
pub(super) fn check_budgets(
    apply: ApplyPolicy,
    budgets: &[Budget],
    pods: &BTreeMap<String, Manifest<Pod>>,
    members: &[PlannedMember],
) -> Result<(), Denial> {
    if apply != ApplyPolicy::IfReady {
        return Ok(());
    }
    for m in members.iter().filter(|m| m.work == PlannedWork::Migrate) {
        let Some(pod) = pods.get(&m.pod) else {
            continue;
        };
        let labels = pod.typed().labels();
        let Some(why) = disruption::refusal(budgets, labels) else {
            continue;
        };
        let never = budgets
            .iter()
            .filter(|b| disruption::selects(b, labels))
            .find(|b| b.refusal().is_some())
            .is_some_and(Budget::leaves_no_room);
        let hint = if never {
            "; its rule leaves no room for these pods: relax it, or create the request with \
             apply: Always and relax it while the member waits"
        } else {
            "; wait until it allows one (a pod it selects is not Ready?), or create the request \
             with apply: Always: each member then waits for it before it stops"
        };
        return Err(Denial::new(
            DenialReason::DisruptionBudget,
            format!(
                "apply is IfReady and member pod {} may not be stopped now: {why}{hint}",
                m.pod
            ),
        ));
    }
    Ok(())
}
