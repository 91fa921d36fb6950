//! The database engine's view at preflight: the members' roles, and `apply: IfReady`.
//!
//! The only place preflight reads the engine's [`HealthReport`].

use super::{Denial, DenialReason};
use crate::api::{ApplyPolicy, PlannedMember};
use crate::engine::{self, HealthReport, HealthUnavailable};

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

/// `apply: IfReady`: the health can be read and every member is healthy (a member missing from
/// the report counts as unhealthy). `apply: Always` passes.
pub(super) fn check_engine_health(
    apply: ApplyPolicy,
    health: &Result<HealthReport, HealthUnavailable>,
    members: &[PlannedMember],
) -> Result<(), Denial> {
    if apply != ApplyPolicy::IfReady {
        return Ok(());
    }
    match health {
        Ok(report) => {
            let mut report = report.clone();
            let pods: Vec<String> = members.iter().map(|m| m.pod.clone()).collect();
            engine::note_missing_pods(&mut report, &pods);
            engine::is_healthy_for_start(&report).map_err(|problems| {
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
