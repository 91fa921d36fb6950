//! Shrink: one measure Job per member reports the used bytes and the filesystem of its old volume
//! (read-only mount, on the member's node); each must fit the shrink size with headroom, and
//! what the new volume holds once its filesystem is made ([`headroom`]).

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{Denial, DenialReason, headroom};
use crate::api::{PlannedMember, PlannedWork};
use crate::build::{self, FsReport, JobKind};
use crate::plan::claims::member_claims;
use crate::plan::helpers::{self, Trouble};
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

/// Runs (or reads) one measure Job per claim of each member, recording each claim's used
/// bytes; each must fit its claim's new size (`newSize`).
pub(super) fn measure(cx: &mut Ctx, members: &mut [PlannedMember]) -> Result<Measurement, Denial> {
    let mut measurement = Measurement::Complete;
    let to_migrate = members
        .iter_mut()
        .filter(|m| m.work == PlannedWork::Migrate);
    for m in to_migrate {
        for c in member_claims(m, &Default::default()) {
            match measure_claim(cx, &c.planned, &c.subject)? {
                Some(used) if c.slot == 0 => m.used_bytes = Some(used),
                Some(used) => {
                    if let Some(f) = m.further_claims.get_mut(c.slot - 1) {
                        f.used_bytes = Some(used);
                    }
                }
                None => measurement = Measurement::Running,
            }
        }
    }
    Ok(measurement)
}

/// The used bytes of the member's claim (`m` seen on it), once its measure Job (named after
/// `subject`) reported them and they fit; `None` while it runs (created when missing).
fn measure_claim(cx: &mut Ctx, m: &PlannedMember, subject: &str) -> Result<Option<i64>, Denial> {
    let o = cx.o;
    check_measurable(o.claims.get(&m.claim), m)?;
    let job_name = build::job_name(&cx.name(), subject, JobKind::Measure);
    match o.jobs.get(&job_name).map(|j| &j.outcome) {
        None => {
            create_measure_job(cx, m, subject);
            Ok(None)
        }
        Some(JobOutcome::Running) => {
            check_started(cx, &job_name, m)?;
            Ok(None)
        }
        Some(
            JobOutcome::Failed { reason }
            | JobOutcome::NoSpace { reason, .. }
            | JobOutcome::VerifyFailed { reason, .. },
        ) => Err(Denial::new(
            DenialReason::MeasureFailed,
            format!("measuring the used bytes of {} failed: {reason}", m.claim),
        )),
        Some(JobOutcome::Succeeded { message }) => {
            let used = check_measured_bytes(m, message.as_deref())?;
            check_fits(m, used, &m.new_size)?;
            if let Some(fs) = measured_filesystem(message.as_deref()) {
                let capacity = claim_capacity(o.claims.get(&m.claim));
                check_filesystem_fits(m, &fs, capacity, used, &m.new_size)?;
            }
            Ok(Some(used))
        }
    }
}

/// A measure Job whose pod cannot start (see `plan::helpers`) denies the request with the pod's
/// reason, within `--helper-start-timeout`.
fn check_started(cx: &Ctx, job_name: &str, m: &PlannedMember) -> Result<(), Denial> {
    let Some(job) = cx.o.jobs.get(job_name) else {
        return Ok(());
    };
    let timeout = cx.settings.helper_start_timeout;
    match helpers::job_trouble(job, &cx.o.helper_pods, cx.o.now, timeout) {
        Some(Trouble::Stuck(reason) | Trouble::Evicted(reason)) => Err(Denial::new(
            DenialReason::MeasureFailed,
            format!("measuring the used bytes of {} failed: {reason}", m.claim),
        )),
        None => Ok(()),
    }
}

fn create_measure_job(cx: &mut Ctx, m: &PlannedMember, subject: &str) {
    let deadline = cx.remaining_seconds();
    let job = build::job(
        &cx.req,
        &cx.image,
        m,
        subject,
        JobKind::Measure,
        deadline,
        build::Verification::Skip,
    );
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

/// The most bytes in use that still fit `size_bytes` with headroom (see [`check_fits`]); 0 when
/// nothing fits.
pub fn max_used_bytes(size_bytes: i64) -> i64 {
    let fits = |used: i64| {
        let used = i128::from(used);
        used + (used / 10).max(MIN_HEADROOM_BYTES) <= i128::from(size_bytes)
    };
    let (mut lo, mut hi) = (0_i64, size_bytes.max(0));
    if !fits(0) {
        return 0;
    }
    while lo < hi {
        let mid = lo + (hi - lo + 1) / 2;
        if fits(mid) { lo = mid } else { hi = mid - 1 }
    }
    lo
}

/// The old volume's filesystem, when the measure Job could read it.
fn measured_filesystem(message: Option<&str>) -> Option<FsReport> {
    message
        .and_then(|msg| build::parse_job_result(msg).ok())
        .and_then(|r| r.filesystem)
}

/// The claim's provisioned capacity in bytes (`status.capacity.storage`), 0 when unknown.
fn claim_capacity(claim: Option<&PersistentVolumeClaim>) -> i128 {
    claim
        .and_then(|c| c.status.as_ref())
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(quantity::bytes)
        .unwrap_or(0)
}

/// The used bytes plus headroom fit what a new volume of `size` holds once its filesystem is
/// made ([`headroom::predict`]), and its inodes hold the old volume's files. Without a
/// prediction (a filesystem shared with others), [`check_fits`] alone applies.
pub(super) fn check_filesystem_fits(
    m: &PlannedMember,
    fs: &FsReport,
    old_capacity: i128,
    used: i64,
    size: &Quantity,
) -> Result<(), Denial> {
    let size_bytes = quantity::bytes(size).unwrap_or_default();
    let Some(usable) = headroom::predict(fs, old_capacity, size_bytes) else {
        return Ok(());
    };
    let used = i128::from(used);
    let needed = used + (used / 10).max(MIN_HEADROOM_BYTES);
    if needed > usable.bytes {
        return Err(Denial::new(
            DenialReason::InsufficientSize,
            format!(
                "member {} uses {} on claim {}: with headroom it needs {}, but a {} volume holds \
                 about {} once its filesystem is made ({})",
                m.pod,
                human(used),
                m.claim,
                human(needed),
                size.0,
                human(usable.bytes),
                usable.basis
            ),
        ));
    }
    let files = i128::from(fs.inodes - fs.inodes_free);
    if let Some(inodes) = usable.inodes
        && files + files / 10 > inodes
    {
        return Err(Denial::new(
            DenialReason::InsufficientSize,
            format!(
                "member {} has {files} files and directories on claim {}: with 10% headroom they \
                 need more than the {inodes} inodes a {} volume gets ({})",
                m.pod, m.claim, size.0, usable.basis
            ),
        ));
    }
    Ok(())
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
