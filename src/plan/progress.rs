//! The request's overall progress for its printer columns: the member in flight and a
//! percentage. Pure; computed from the status on every decision (see `Ctx::finish`), so it is
//! written only when it changed.

use crate::api::{CopyPass, MemberStatus, MemberStep, Phase, StorageMigrationRequestStatus};

/// Share of a member's work done once its pre-copy finished (most bytes move then).
const PRE_COPIED: f64 = 0.7;
/// Share done once its final copy finished (the swap and the restart remain).
const COPIED: f64 = 0.9;

/// Sets `current_member` and `percent` from the members' steps and copy progress.
pub fn summarize(status: &mut StorageMigrationRequestStatus, pre_copy: bool) {
    status.current_member = current_member(&status.members);
    status.percent = overall_percent(status, pre_copy);
}

/// The member in flight: the first one neither pending nor finished.
pub fn current_member(members: &[MemberStatus]) -> Option<String> {
    members
        .iter()
        .find(|m| {
            !matches!(
                m.step,
                MemberStep::Pending | MemberStep::Done | MemberStep::RolledBack
            )
        })
        .map(|m| m.pod.clone())
}

/// Every member weighs the same; 100 only once the request is `Successful`. `None` before the
/// plan has members.
pub fn overall_percent(status: &StorageMigrationRequestStatus, pre_copy: bool) -> Option<i32> {
    if status.members.is_empty() {
        return None;
    }
    if status.phase == Phase::Successful {
        return Some(100);
    }
    let sum: f64 = (status.members.iter())
        .map(|m| member_fraction(m, pre_copy))
        .sum();
    let pct = (sum / status.members.len() as f64 * 100.0).floor() as i32;
    Some(pct.clamp(0, 99))
}

/// How much of one member's work is done, 0.0 to 1.0: by its step, and within a copy step by
/// the copy's percentage.
pub fn member_fraction(m: &MemberStatus, pre_copy: bool) -> f64 {
    let copied = |pass: CopyPass| {
        (m.copy_progress.as_ref())
            .filter(|p| p.pass == pass)
            .map_or(0.0, |p| f64::from(p.percent.clamp(0, 100)) / 100.0)
    };
    match m.step {
        MemberStep::Pending | MemberStep::CreatingClaim | MemberStep::RolledBack => 0.0,
        MemberStep::PreCopying => PRE_COPIED * copied(CopyPass::PreCopy),
        MemberStep::GatingStop | MemberStep::StoppingPod if pre_copy => PRE_COPIED,
        MemberStep::GatingStop | MemberStep::StoppingPod => 0.0,
        MemberStep::Copying if pre_copy => {
            PRE_COPIED + (COPIED - PRE_COPIED) * copied(CopyPass::Copy)
        }
        MemberStep::Copying => COPIED * copied(CopyPass::Copy),
        MemberStep::RetainingVolumes
        | MemberStep::DeletingOldClaim
        | MemberStep::DeletingTempClaim
        | MemberStep::ReleasingNewVolume
        | MemberStep::RecreatingClaim => COPIED,
        MemberStep::RecreatingPod => 0.95,
        MemberStep::Done | MemberStep::AlreadyThere | MemberStep::NotTargeted => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::CopyProgress;

    fn member(pod: &str, step: MemberStep, progress: Option<(CopyPass, i32)>) -> MemberStatus {
        MemberStatus {
            pod: pod.into(),
            step,
            copy_progress: progress.map(|(pass, percent)| CopyProgress {
                pass,
                percent,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn status(members: Vec<MemberStatus>) -> StorageMigrationRequestStatus {
        StorageMigrationRequestStatus {
            phase: Phase::Progressing,
            members,
            ..Default::default()
        }
    }

    #[test]
    fn the_member_in_flight_and_its_copy_count() {
        let mut s = status(vec![
            member("etcd-0", MemberStep::Done, None),
            member(
                "etcd-1",
                MemberStep::PreCopying,
                Some((CopyPass::PreCopy, 50)),
            ),
            member("etcd-2", MemberStep::Pending, None),
        ]);
        summarize(&mut s, true);
        assert_eq!(s.current_member.as_deref(), Some("etcd-1"));
        // (1 + 0.7 * 0.5) / 3 = 45 %.
        assert_eq!(s.percent, Some(45));
        // The pre-copy's reading does not count for the final pass.
        s.members[1].step = MemberStep::Copying;
        assert_eq!(overall_percent(&s, true), Some(56), "(1 + 0.7) / 3");
        s.members[1].copy_progress = Some(CopyProgress {
            pass: CopyPass::Copy,
            percent: 100,
            ..Default::default()
        });
        assert_eq!(overall_percent(&s, true), Some(63), "(1 + 0.9) / 3");
        assert_eq!(overall_percent(&s, false), Some(63), "(1 + 0.9) / 3");
    }

    #[test]
    fn only_a_successful_request_is_complete() {
        let mut s = status(vec![
            member("a", MemberStep::Done, None),
            member("b", MemberStep::Done, None),
        ]);
        summarize(&mut s, true);
        assert_eq!((s.current_member.as_deref(), s.percent), (None, Some(99)));
        s.phase = Phase::Successful;
        summarize(&mut s, true);
        assert_eq!(s.percent, Some(100));
        let mut empty = status(vec![]);
        summarize(&mut empty, true);
        assert_eq!((empty.current_member, empty.percent), (None, None));
    }

    #[test]
    fn without_pre_copy_the_final_pass_carries_the_copy() {
        let m = member("a", MemberStep::Copying, Some((CopyPass::Copy, 50)));
        assert_eq!(member_fraction(&m, false), 0.45);
        assert_eq!(member_fraction(&m, true), 0.8);
        let stopped = member("a", MemberStep::StoppingPod, None);
        assert_eq!(member_fraction(&stopped, false), 0.0);
        assert_eq!(member_fraction(&stopped, true), 0.7);
    }
}
