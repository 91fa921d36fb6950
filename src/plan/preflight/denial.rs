//! Why a request is denied: a [`DenialReason`] (the condition reason) and a message naming the
//! problem.
//!
//! The reasons are declared once, with a doc comment each; `docs/api.md` lists them with the
//! same words (a unit test compares the two).

/// Declares [`DenialReason`] with [`DenialReason::ALL`], [`DenialReason::as_str`] (the
/// variant's name) and [`DenialReason::description`] (its doc comment), so that none of them
/// can miss a variant.
macro_rules! denial_reasons {
    ($($(#[doc = $doc:literal])+ $variant:ident,)+) => {
        /// Why preflight denies a request, in the order the checks run. Written as the reason
        /// of the `Accepted=False` condition; `as_str` is the variant's name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum DenialReason {
            $($(#[doc = $doc])+ $variant,)+
        }

        impl DenialReason {
            /// Every reason, in the order the checks run.
            pub const ALL: &[DenialReason] = &[$(DenialReason::$variant,)+];

            /// The condition reason: the variant's name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(DenialReason::$variant => stringify!($variant),)+
                }
            }

            /// When the reason is given: the variant's doc comment (one line of it per line).
            pub fn description(self) -> &'static str {
                match self {
                    $(DenialReason::$variant => concat!($($doc, "\n"),+),)+
                }
            }
        }
    };
}

denial_reasons! {
    /// The spec is incomplete or malformed: the type's block is missing or empty, the other
    /// type's block is given, `shrink.size` or a `shrink.sizes` entry is not a positive
    /// quantity, a template that moves has no shrink size, `shrink.sizes` names a template that
    /// does not move, `volumeClaimTemplate` and `volumeClaimTemplates` are both set or the list
    /// names one twice, `timeout` does not parse, `target.name` is empty, or a claim target's
    /// `volumeClaimTemplate` names another template than the claim's.
    InvalidSpec,
    /// `spec.copy.moverImage` is set and the operator runs without
    /// `--allow-request-mover-image` (chart value `allowRequestMoverImage`): the copy Jobs run
    /// the operator's own image only.
    MoverImageNotAllowed,
    /// The namespace's Pod Security level (label `pod-security.kubernetes.io/enforce`) would
    /// refuse the copy Jobs (`restricted` refuses their added capabilities and uid 0; an
    /// unknown level is evaluated as `restricted`).
    PodSecurityLevel,
    /// The target StatefulSet does not exist in the request's namespace (or is being deleted);
    /// for a claim target, the claim, or the StatefulSet that controls its pod.
    TargetNotFound,
    /// A claim target (`target.kind: PersistentVolumeClaim`) that no pod mounts: there is no
    /// workload to stop and start again.
    ClaimUnused,
    /// A claim target mounted by a pod that another kind of controller owns (a Job, a
    /// DaemonSet, a ReplicaSet of no Deployment): only the claims of StatefulSet members,
    /// Deployments and bare pods can be migrated.
    UnsupportedOwner,
    /// Another controller owns the StatefulSet (an ownerReference with `controller: true`), or
    /// Argo CD or Flux manages it, and `spec.ownerPaused` is not `true` (the message names the
    /// owner and how to pause it).
    ForeignOwner,
    /// The named `volumeClaimTemplate` does not exist, or the set has no volumeClaimTemplates;
    /// or a claim target is not a member's claim of one of the set's templates.
    TemplateNotFound,
    /// The template or a member's claim is not `volumeMode: Filesystem` (e.g. `Block`).
    UnsupportedVolumeMode,
    /// The StatefulSet has 0 replicas.
    NoMembers,
    /// A member pod does not exist (or is being deleted).
    MemberMissing,
    /// A member pod is not scheduled on a node.
    MemberNotScheduled,
    /// A member's claim does not exist, or its pod does not mount it.
    ClaimNotFound,
    /// A member's claim is not `Bound` to a volume (or is being deleted).
    ClaimNotBound,
    /// The volume a member's claim is bound to does not exist.
    VolumeNotFound,
    /// A member's claim or the template has no storage request, or a claim's request is not a
    /// quantity.
    InvalidClaim,
    /// A Shrink whose members' claims are on different StorageClasses.
    MixedStorageClasses,
    /// The target StorageClass does not exist.
    StorageClassNotFound,
    /// A StorageClassChange to a class that every member's claim and volume, and the
    /// StatefulSet's volumeClaimTemplate, are already on: nothing to do. Members already there
    /// are otherwise skipped (`AlreadyThere`), the others migrated.
    SameStorageClass,
    /// A StorageClassChange from a `WaitForFirstConsumer` class to one that is not: the new
    /// volumes could be provisioned away from the members' nodes.
    BindingModeMismatch,
    /// A Shrink size above a member claim's current request (it would grow), or one that every
    /// member's claim and the volumeClaimTemplate already request: nothing to do. Members
    /// already at the size are otherwise skipped (`AlreadyThere`).
    NotSmaller,
    /// A pod other than its member mounts the claim of a member to migrate (e.g. a backup
    /// Job's pod), or several pods mount a claim target: the migration stops only the member,
    /// so that pod's writes after the final copy would be left behind (the message names the
    /// pods).
    ClaimShared,
    /// A Deployment's claim that several replicas mount while its access mode lets only one
    /// node's pods mount it (not ReadWriteMany or ReadOnlyMany).
    ReplicasShareClaim,
    /// A HorizontalPodAutoscaler scales the target Deployment and `spec.ownerPaused` is not
    /// `true` (the message names it).
    Autoscaler,
    /// The database engine refuses the database whatever `apply` says (Patroni: its REST API
    /// cannot be read, it is paused, it has no leader, it is a standby cluster, or a member is
    /// not running or does not stream on the leader's timeline; RedisSentinel: no Sentinel
    /// answers, the Sentinels do not know the master group or disagree on its master, no
    /// Sentinel reaches its quorum, or a member does not replicate from the master with its
    /// link up; ZooKeeper: the members cannot be read, a member refuses a four-letter word
    /// missing from `4lw.commands.whitelist`, or runs standalone; the message names which).
    EngineRefuses,
    /// `apply: IfReady` and a member is unhealthy or missing, or the database's health cannot
    /// be read (the message names the member and why).
    NotHealthy,
    /// `apply: IfReady` and a PodDisruptionBudget that selects a member to migrate allows no
    /// disruption now, or its status is not up to date (the message names the budget, its
    /// numbers, and whether its rule leaves no room for these pods). With `apply: Always` the
    /// request starts and each member waits for its budgets before it stops.
    DisruptionBudget,
    /// A Shrink of `ReadWriteOncePod` claims: their used bytes cannot be measured while the
    /// members run.
    CannotMeasure,
    /// A measure Job failed, did not start within `--helper-start-timeout` (the message quotes
    /// its pod's reason), or reported no used bytes.
    MeasureFailed,
    /// A member's used bytes (measured by a Job on its node) plus headroom (10%, at least 16
    /// MiB) exceed the shrink size, or what a volume of that size holds once its filesystem is
    /// made, or (ext4) its files need more inodes than that volume gets. The measure Job reports
    /// the old volume's `statfs`: for ext4 the new volume is predicted from `mke2fs`'s defaults
    /// (below 512 MiB: 1 KiB blocks, one inode per 4 KiB, so inode tables take 6.25%; the
    /// journal; 5% root reserve and ext4's allocation reserve; a 128Mi volume holds about 104
    /// MiB), checked against real `mkfs.ext4` 1.47 from 64 MiB to 4 GiB: at most 3% under, never
    /// over. Another filesystem that is the volume's own is scaled by the old volume's usable
    /// ratio; a directory on a shared disk (host-path provisioners) gets the headroom rule only.
    InsufficientSize,
}

impl std::fmt::Display for DenialReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a request is denied: a condition reason and a message naming the problem.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct Denial {
    pub reason: DenialReason,
    pub message: String,
}

impl Denial {
    pub fn new(reason: DenialReason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::DenialReason;

    /// The user documentation of the request API.
    const API_DOC: &str = include_str!("../../../docs/api.md");

    /// The rows of the table of reasons in docs/api.md's preflight section.
    fn doc_rows() -> Vec<&'static str> {
        let section = API_DOC
            .split("\n## ")
            .find(|s| s.starts_with("Preflight"))
            .expect("docs/api.md has a Preflight section");
        section
            .lines()
            .skip_while(|l| !l.starts_with("| reason |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .collect()
    }

    /// The reasons named (in backticks) in the first column of the table.
    fn doc_reasons() -> BTreeSet<&'static str> {
        doc_rows()
            .iter()
            .filter_map(|row| row.split('|').nth(1))
            .flat_map(|cell| cell.split('`').skip(1).step_by(2))
            .collect()
    }

    /// The table docs/api.md must show: one row per reason, its doc comment as the text.
    fn expected_rows() -> Vec<String> {
        DenialReason::ALL
            .iter()
            .map(|r| {
                let text = r.description().split_whitespace().collect::<Vec<_>>();
                format!("| `{}` | {} |", r.as_str(), text.join(" "))
            })
            .collect()
    }

    #[test]
    fn api_doc_lists_every_reason_and_no_other() {
        let documented = doc_reasons();
        let reasons: BTreeSet<&str> = DenialReason::ALL.iter().map(|r| r.as_str()).collect();
        let missing: Vec<_> = reasons.difference(&documented).collect();
        let unknown: Vec<_> = documented.difference(&reasons).collect();
        assert!(
            missing.is_empty() && unknown.is_empty(),
            "docs/api.md misses reasons {missing:?} and lists unknown reasons {unknown:?}"
        );
    }

    #[test]
    fn api_doc_table_is_the_reasons_doc_comments() {
        let expected = expected_rows();
        assert_eq!(
            doc_rows(),
            expected,
            "docs/api.md's table of Denied reasons must be, in the order the checks run:\n{}",
            expected.join("\n")
        );
    }

    #[test]
    fn reasons_are_the_strings_users_see() {
        let strings: Vec<&str> = DenialReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            strings,
            [
                "InvalidSpec",
                "MoverImageNotAllowed",
                "PodSecurityLevel",
                "TargetNotFound",
                "ClaimUnused",
                "UnsupportedOwner",
                "ForeignOwner",
                "TemplateNotFound",
                "UnsupportedVolumeMode",
                "NoMembers",
                "MemberMissing",
                "MemberNotScheduled",
                "ClaimNotFound",
                "ClaimNotBound",
                "VolumeNotFound",
                "InvalidClaim",
                "MixedStorageClasses",
                "StorageClassNotFound",
                "SameStorageClass",
                "BindingModeMismatch",
                "NotSmaller",
                "ClaimShared",
                "ReplicasShareClaim",
                "Autoscaler",
                "EngineRefuses",
                "NotHealthy",
                "DisruptionBudget",
                "CannotMeasure",
                "MeasureFailed",
                "InsufficientSize",
            ]
        );
        assert_eq!(DenialReason::NotHealthy.to_string(), "NotHealthy");
    }

    #[test]
    fn every_reason_has_a_description() {
        for r in DenialReason::ALL {
            assert!(r.description().trim().len() > 10, "{r}");
        }
    }
}
