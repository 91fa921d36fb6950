//! Shrink: one measure Job per member reports the used bytes of its old volume (read-only
//! mount, on the member's node); each must fit the shrink size with headroom.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{Denial, DenialReason};
use crate::api::{PlannedMember, PlannedWork};
use crate::build::{self, JobKind};
use crate::plan::quantity::{self, human};
use crate::plan::{Action, Ctx, JobOutcome, Object};

/// Minimum free headroom a shrunk volume keeps above the used bytes.
pub const MIN_HEADROOM_BYTES: i128 = 16 << 20;

/// Where the measuring stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Measurement {
    /// Every member is measured and fits.
    Complete,
    /// Measure Jobs are still running (or were created just now).
    Running,
}

/// Runs (or reads) one measure Job per member, recording each member's used bytes.
pub(super) fn measure(
    cx: &mut Ctx,
    members: &mut [PlannedMember],
    size: &Quantity,
) -> Result<Measurement, Denial> {
    let o = cx.o;
    let req_name = cx.name();
    let mut measurement = Measurement::Complete;
    let to_migrate = members
        .iter_mut()
        .filter(|m| m.work == PlannedWork::Migrate);
    for m in to_migrate {
        check_measurable(o.claims.get(&m.claim), m)?;
        let job_name = build::job_name(&req_name, &m.pod, JobKind::Measure);
        match o.jobs.get(&job_name).map(|j| &j.outcome) {
            None => {
                create_measure_job(cx, m);
                measurement = Measurement::Running;
            }
            Some(JobOutcome::Running) => measurement = Measurement::Running,
            Some(JobOutcome::Failed { reason }) => {
                return Err(Denial::new(
                    DenialReason::MeasureFailed,
                    format!("measuring the used bytes of {} failed: {reason}", m.claim),
                ));
            }
            Some(JobOutcome::Succeeded { message }) => {
                let used = check_measured_bytes(m, message.as_deref())?;
                m.used_bytes = Some(used);
                check_fits(m, used, size)?;
            }
        }
    }
    Ok(measurement)
}

fn create_measure_job(cx: &mut Ctx, m: &PlannedMember) {
    let deadline = cx.remaining_seconds();
    let job = build::job(&cx.req, cx.image, m, JobKind::Measure, deadline);
    cx.act(Action::Create(Object::Job(Box::new(job))));
}

/// The claim can be mounted by a measure Job while its member runs (not `ReadWriteOncePod`).
pub(super) fn check_measurable(
    claim: Option<&PersistentVolumeClaim>,
    m: &PlannedMember,
) -> Result<(), Denial> {
    if let Some(claim) = claim
        && claim
            .spec
            .as_ref()
            .and_then(|s| s.access_modes.as_ref())
            .is_some_and(|a| a.iter().any(|m| m == "ReadWriteOncePod"))
    {
        return Err(Denial::new(
            DenialReason::CannotMeasure,
            format!(
                "claim {} is ReadWriteOncePod: its used bytes cannot be measured while member {} runs",
                m.claim, m.pod
            ),
        ));
    }
    Ok(())
}

/// The used bytes a succeeded measure Job reported in its termination message.
pub(super) fn check_measured_bytes(
    m: &PlannedMember,
    message: Option<&str>,
) -> Result<i64, Denial> {
    message
        .and_then(|msg| build::parse_job_result(msg).ok())
        .and_then(|r| r.used_bytes)
        .ok_or_else(|| {
            Denial::new(
                DenialReason::MeasureFailed,
                format!(
                    "the measure Job of {} reported no used bytes ({:?})",
                    m.claim, message
                ),
            )
        })
}

/// The used bytes plus headroom (a tenth, at least [`MIN_HEADROOM_BYTES`]) fit the size.
pub(super) fn check_fits(m: &PlannedMember, used: i64, size: &Quantity) -> Result<(), Denial> {
    let size_bytes = quantity::bytes(size).unwrap_or_default();
    let used = i128::from(used);
    let needed = used + (used / 10).max(MIN_HEADROOM_BYTES);
    if needed > size_bytes {
        return Err(Denial::new(
            DenialReason::InsufficientSize,
            format!(
                "member {} uses {} on claim {}: with headroom it needs {}, more than the shrink size {}",
                m.pod,
                human(used),
                m.claim,
                human(needed),
                size.0
            ),
        ));
    }
    Ok(())
}
