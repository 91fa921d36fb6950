//! Where each trouble state is explained: the sections of `docs/runbook.md`. Every message of a
//! Denied, Failed (rolling back), Blocked or stuck request ends with a pointer to its section
//! ([`pointer`]); the mapping from the reason to the section is here and nowhere else, and a
//! unit test fails when a section the code can point to is not a heading of the runbook.

use super::failure::Failure;
use super::foreign::BlockedReason;
use super::preflight::DenialReason;

/// The runbook, relative to the repository (and to an installed chart's docs).
pub const RUNBOOK: &str = "docs/runbook.md";

/// Declares [`Section`] with [`Section::ALL`] and [`Section::anchor`], so none can miss one.
macro_rules! sections {
    ($($(#[doc = $doc:literal])* $variant:ident => $anchor:literal,)+) => {
        /// A section of the runbook.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Section {
            $($(#[doc = $doc])* $variant,)+
        }

        impl Section {
            pub const ALL: &[Section] = &[$(Section::$variant,)+];

            /// The heading's anchor (GitHub's: lower case, spaces to `-`, punctuation dropped).
            pub fn anchor(self) -> &'static str {
                match self {
                    $(Section::$variant => $anchor,)+
                }
            }
        }
    };
}

sections! {
    DeniedInvalidSpec => "denied-invalidspec",
    DeniedTarget => "denied-targetnotfound-claimunused-unsupportedowner-templatenotfound-nomembers",
    DeniedForeignOwner => "denied-foreignowner",
    DeniedEngineRefuses => "denied-enginerefuses",
    DeniedClaims => "denied-unsupportedvolumemode-claimnotfound-claimnotbound-volumenotfound-invalidclaim",
    DeniedMembers => "denied-membermissing-membernotscheduled-nothealthy-disruptionbudget",
    DeniedClaimShared => "denied-claimshared",
    DeniedDeployment => "denied-replicasshareclaim-autoscaler",
    DeniedStorageClass => "denied-mixedstorageclasses-storageclassnotfound-samestorageclass-bindingmodemismatch",
    DeniedSize => "denied-notsmaller-cannotmeasure-measurefailed-insufficientsize",
    DeniedMover => "denied-moverimagenotallowed-podsecuritylevel",
    FailedTimedOut => "failed-timeout-expired",
    FailedDeleted => "failed-request-deleted-while-progressing",
    FailedAborted => "failed-aborted-kubectl-smr-abort",
    FailedCopy => "failed-a-copy-verify-or-mounter-job-failed",
    FailedOutOfSpace => "failed-out-of-space-during-a-copy",
    FailedDifferences => "failed-the-copy-differs-from-the-original",
    FailedStaleCopy => "failed-a-member-pod-came-back-stale-copy",
    FailedClaimShared => "failed-another-pod-mounts-the-claim-during-the-copy",
    FailedFinalCheck => "failed-the-final-check",
    FailedObjectChanged => "failed-an-object-disappeared-or-was-replaced",
    FailedVolumeUnreachable => "failed-new-volume-unreachable-from-the-node",
    FailedStash => "failed-the-stash-cannot-take-a-manifest",
    FailedInternal => "failed-inconsistent-status",
    FailedStageTimedOut => "failed-a-stage-timed-out",
    FailedNodeLost => "failed-a-members-node-was-lost-while-its-pod-stopped",
    FailedRollbackGaveUp => "failed-the-rollback-gave-up",
    BlockedForeignStatefulSet => "blocked-foreignstatefulset",
    BlockedForeignPod => "blocked-foreignpod",
    StuckPlanner => "stuck-a-transition-the-state-machine-does-not-allow",
    StuckStash => "stuck-the-stash-configmap-has-a-problem",
    StuckStashEntry => "stuck-a-stashed-manifest-is-missing",
    StuckCannotRebuild => "stuck-a-pod-or-the-statefulset-cannot-be-recreated",
    StuckVolume => "stuck-a-volume-of-the-member-is-missing",
    StuckClaimInUse => "stuck-the-old-claim-is-still-used",
    StuckPodDuringSwap => "stuck-a-member-pod-appeared-during-the-swap",
    StuckClaimNotOnNewVolume => "stuck-the-claim-is-not-bound-to-the-new-volume",
    StuckRollbackStep => "stuck-a-swap-cannot-be-carried-forward-in-the-rollback",
    ReclaimPolicyChanged => "reclaimpolicy-a-volumes-reclaim-policy-keeps-changing",
    NodeLostWaiting => "nodelost-a-member-pod-is-stuck-on-an-unreachable-node",
}

/// Why a request reports itself stuck (status message `stuck: ...`, Event `Stuck`): something
/// the operator cannot fix by itself; it keeps looking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stuck {
    /// The planner tried a transition its state machine does not allow (a bug).
    Planner,
    /// The stash ConfigMap is someone else's, or an entry cannot be decoded.
    Stash,
    /// A manifest that should be in the stash is not (StatefulSet, pod or claim).
    StashEntry,
    /// A pod or the StatefulSet cannot be built from its stashed manifest.
    CannotRebuild,
    /// The member's new volume is not recorded, or a volume is gone.
    Volume,
    /// The old claim is still used by a pod.
    ClaimInUse,
    /// A member pod appeared while its claims are swapped.
    PodDuringSwap,
    /// The claim exists but is not bound to the new volume.
    ClaimNotOnNewVolume,
    /// A failure while carrying a member's swap forward during the rollback.
    RollbackStep,
}

impl From<Stuck> for Section {
    fn from(s: Stuck) -> Self {
        match s {
            Stuck::Planner => Section::StuckPlanner,
            Stuck::Stash => Section::StuckStash,
            Stuck::StashEntry => Section::StuckStashEntry,
            Stuck::CannotRebuild => Section::StuckCannotRebuild,
            Stuck::Volume => Section::StuckVolume,
            Stuck::ClaimInUse => Section::StuckClaimInUse,
            Stuck::PodDuringSwap => Section::StuckPodDuringSwap,
            Stuck::ClaimNotOnNewVolume => Section::StuckClaimNotOnNewVolume,
            Stuck::RollbackStep => Section::StuckRollbackStep,
        }
    }
}

impl From<DenialReason> for Section {
    fn from(r: DenialReason) -> Self {
        use DenialReason::*;
        match r {
            InvalidSpec => Section::DeniedInvalidSpec,
            TargetNotFound | ClaimUnused | UnsupportedOwner | TemplateNotFound | NoMembers => {
                Section::DeniedTarget
            }
            ForeignOwner => Section::DeniedForeignOwner,
            EngineRefuses => Section::DeniedEngineRefuses,
            UnsupportedVolumeMode
            | ClaimNotFound
            | ClaimNotBound
            | VolumeNotFound
            | InvalidClaim => Section::DeniedClaims,
            MemberMissing | MemberNotScheduled | NotHealthy | DisruptionBudget => {
                Section::DeniedMembers
            }
            ClaimShared => Section::DeniedClaimShared,
            ReplicasShareClaim | Autoscaler => Section::DeniedDeployment,
            MixedStorageClasses | StorageClassNotFound | SameStorageClass | BindingModeMismatch => {
                Section::DeniedStorageClass
            }
            NotSmaller | CannotMeasure | MeasureFailed | InsufficientSize => Section::DeniedSize,
            MoverImageNotAllowed | PodSecurityLevel => Section::DeniedMover,
        }
    }
}

impl From<&Failure> for Section {
    fn from(f: &Failure) -> Self {
        use Failure::*;
        match f {
            TimedOut { .. } | BlockedUntilTimeout { .. } | DisruptionBudgetUntilTimeout { .. } => {
                Section::FailedTimedOut
            }
            Deleted => Section::FailedDeleted,
            Aborted { .. } => Section::FailedAborted,
            PreCopyFailed { .. }
            | CopyMemoryTooLow(_)
            | CopyFailed { .. }
            | VerifyFailed { .. }
            | NoVerification { .. }
            | MounterPod { .. }
            | MounterStuck { .. } => Section::FailedCopy,
            OutOfSpace(_) => Section::FailedOutOfSpace,
            Differences { .. } => Section::FailedDifferences,
            StaleCopy { .. } | PodCameBack { .. } | ForeignPodDuringCopy { .. } => {
                Section::FailedStaleCopy
            }
            ClaimSharedDuringCopy { .. } => Section::FailedClaimShared,
            FinalCheckFailed { .. } | Unverified { .. } | FinalCheckTimedOut { .. } => {
                Section::FailedFinalCheck
            }
            StatefulSetDisappeared { .. }
            | DeploymentChanged { .. }
            | ClaimDisappeared { .. }
            | PodDisappeared { .. }
            | ClaimReplaced { .. }
            | TempClaimNotOurs { .. }
            | TempClaimLost { .. } => Section::FailedObjectChanged,
            VolumeUnreachable { .. } => Section::FailedVolumeUnreachable,
            StageTimedOut { .. } => Section::FailedStageTimedOut,
            NodeLost { .. } | NodeLostPodDeleted { .. } => Section::FailedNodeLost,
            Stash { .. } | StashFull { .. } => Section::FailedStash,
            NoPlan | NoMemberStatus { .. } | NotInPlan { .. } | RetentionPolicy { .. } => {
                Section::FailedInternal
            }
        }
    }
}

impl From<BlockedReason> for Section {
    fn from(r: BlockedReason) -> Self {
        match r {
            // `Clear` is never a trouble state; it points where `Blocked` was explained.
            BlockedReason::ForeignStatefulSet | BlockedReason::Clear => {
                Section::BlockedForeignStatefulSet
            }
            BlockedReason::ForeignPod => Section::BlockedForeignPod,
        }
    }
}

/// What a trouble message ends with: ` (runbook: docs/runbook.md#anchor)`.
pub fn pointer(section: impl Into<Section>) -> String {
    format!(" (runbook: {RUNBOOK}#{})", section.into().anchor())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GitHub's anchor of a heading: lower case; letters, digits, `-` and `_` kept, spaces to
    /// `-`, everything else dropped.
    fn slug(heading: &str) -> String {
        heading
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect()
    }

    fn runbook_anchors() -> Vec<String> {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/runbook.md"))
            .unwrap();
        text.lines()
            .filter_map(|l| l.strip_prefix('#'))
            .map(|l| slug(l.trim_start_matches('#')))
            .collect()
    }

    /// Every section the code can point to is a heading of `docs/runbook.md`.
    #[test]
    fn every_anchor_the_code_emits_is_a_heading_of_the_runbook() {
        let anchors = runbook_anchors();
        let missing: Vec<&str> = Section::ALL
            .iter()
            .map(|s| s.anchor())
            .filter(|a| !anchors.iter().any(|h| h == a))
            .collect();
        assert!(
            missing.is_empty(),
            "docs/runbook.md has no heading for {missing:?}; headings: {anchors:#?}"
        );
    }

    /// The denial sections name each of their reasons in the heading, so a reader finds the
    /// condition reason by searching for it.
    #[test]
    fn each_denial_reason_is_named_in_its_heading() {
        for r in DenialReason::ALL {
            let anchor = Section::from(*r).anchor();
            assert!(
                anchor.contains(&r.as_str().to_lowercase()),
                "{r} points to {anchor}"
            );
        }
    }

    #[test]
    fn pointer_names_the_file_and_anchor() {
        assert_eq!(
            pointer(DenialReason::NotSmaller),
            " (runbook: docs/runbook.md#denied-notsmaller-cannotmeasure-measurefailed-insufficientsize)"
        );
        assert_eq!(
            pointer(&Failure::Deleted),
            " (runbook: docs/runbook.md#failed-request-deleted-while-progressing)"
        );
    }
}
