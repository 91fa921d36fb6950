//! Why a request stops and rolls back. The message of each kind, followed by its runbook pointer
//! (`plan::runbook`), is the text written to `status.failure`, the `RollingBack` condition and
//! Event, and the final `Failed` message.

use crate::build::JobResult;
use crate::plan::preflight::{MIN_HEADROOM_BYTES, headroom};
use crate::plan::quantity::human;

/// A reason to stop and roll back (see `machine::STAGES`: the transitions to `RollingBack`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Failure {
    /// `spec.timeout` expired while the request was blocked by a StatefulSet or a member pod
    /// that something else created (see `plan::foreign`).
    #[error(
        "the request's timeout of {timeout} expired while it was blocked: {what} was created by someone else"
    )]
    BlockedUntilTimeout { timeout: String, what: String },
    /// A member's pod ran again after its final copy while its old claim was still in place
    /// (something else started it): the copy may lack its writes, so it is not swapped in.
    #[error(
        "{} ({what}): the copy is stale, so the member stays on its old claim",
        stale_copy_prefix(pod)
    )]
    StaleCopy { pod: String, what: String },
    /// `spec.timeout` expired while a PodDisruptionBudget kept the member in flight from
    /// stopping (see `plan::disruption`).
    #[error(
        "the request's timeout of {timeout} expired while member pod {pod} waited for a disruption budget: {why}"
    )]
    DisruptionBudgetUntilTimeout {
        timeout: String,
        pod: String,
        why: String,
    },
    /// `spec.timeout` expired while the request was orphaning or migrating.
    #[error("the request's timeout of {timeout} expired")]
    TimedOut { timeout: String },
    /// A stage bounded by `--stage-timeout` (recreating the StatefulSet) waited longer: what
    /// for is named (pods never adopted, a set stuck terminating, a set that cannot be
    /// recreated).
    #[error(
        "stage {stage} did not end within {timeout} (--stage-timeout): still waiting for {waiting}"
    )]
    StageTimedOut {
        stage: String,
        timeout: String,
        waiting: String,
    },
    /// A member's pod was being stopped when its node became unreachable: it stayed
    /// Terminating past its grace period and `--helper-start-timeout`, and the Node is gone,
    /// tainted `node.kubernetes.io/out-of-service`, or the request sets
    /// `spec.forceDeleteOnLostNode` (otherwise the request waits, condition `NodeLost`); so it
    /// is force-deleted and the member rolls back on its old claim.
    #[error(
        "member pod {pod} was still terminating {waited}s after its grace period ended and its node {node} is {node_state}: it is force-deleted and the member rolls back; its data stays on its old claim and volume"
    )]
    NodeLost {
        pod: String,
        node: String,
        node_state: String,
        waited: i64,
    },
    /// A member's pod stuck terminating on a lost node (the request waited, condition
    /// `NodeLost`) was deleted by something else (Kubernetes' pod garbage collector once the
    /// node is tainted `node.kubernetes.io/out-of-service` or its Node deleted, or an
    /// administrator), and the node is still Unknown, tainted out-of-service or gone: the
    /// member's copy would run on that node and cannot, so the member rolls back on its old
    /// claim.
    #[error(
        "member pod {pod} was deleted by something else while it was stuck terminating and its node {node} is {node_state}: the copy cannot run on that node, so the member rolls back; its data stays on its old claim and volume"
    )]
    NodeLostPodDeleted {
        pod: String,
        node: String,
        node_state: String,
    },
    /// The request was deleted while orphaning or migrating.
    #[error("the request was deleted while progressing")]
    Deleted,
    /// Someone asked for a rollback with the abort annotation (`kubectl smr abort`).
    #[error("aborted: annotation {annotation} asked for a rollback")]
    Aborted { annotation: String },

    /// The pre-copy Job of a member failed.
    #[error("pre-copy of member {pod} failed: {reason}")]
    PreCopyFailed { pod: String, reason: String },
    /// The request's memory limit for copy pods (`spec.copy.resources.limits.memory`) is below
    /// what the member's final copy needs for what its pre-copy found (`build::copy_memory`);
    /// found before the member stops.
    #[error(
        "member {} was not stopped: its final copy needs about {} of memory for the {} files and \
         directories ({} in use) on {}, more than spec.copy.resources.limits.memory {}; raise or \
         remove that limit",
        .0.pod, .0.needed, .0.entries, .0.bytes, .0.claim, .0.limit
    )]
    CopyMemoryTooLow(Box<MemoryShortfall>),
    /// The final copy Job of a member failed.
    #[error("copy of claim {claim} to {temp_claim} failed: {reason}")]
    CopyFailed {
        claim: String,
        temp_claim: String,
        reason: String,
    },
    /// A copy pass found no space left on the member's temporary claim: the new size does not
    /// hold the member's data (it grew since preflight, or its filesystem takes more than
    /// predicted). The member rolls back to its untouched old claim.
    #[error("{0}")]
    OutOfSpace(Box<OutOfSpace>),
    /// The verification of a member failed: its pass in the final copy's pod (or a verify Job)
    /// could not compare.
    #[error("verification of member {pod} failed: {reason}")]
    VerifyFailed { pod: String, reason: String },
    /// The verification found the copy different from the original.
    #[error(
        "verification of member {pod} found {differences} differences between {claim} and {temp_claim}"
    )]
    Differences {
        pod: String,
        differences: i64,
        claim: String,
        temp_claim: String,
    },
    /// The verification succeeded without reporting how many differences it found (its
    /// result, when it reported one, is shown as it was parsed).
    #[error("verification of member {pod} reported no result ({result:?})")]
    NoVerification {
        pod: String,
        result: Option<Box<JobResult>>,
    },

    /// The final consistency check found the members inconsistent (etcd: `hash_kv` differs).
    /// Every member is already on its new volume; the old volumes stay on Retain.
    #[error("the final consistency check failed: {reason}; the old volumes are kept on Retain")]
    FinalCheckFailed { reason: String },
    /// Members of a `Generic` request reached `Done` without a verification on record.
    #[error(
        "the final check found no verification on record for members {pods}; the old volumes are kept on Retain"
    )]
    Unverified { pods: String },
    /// `spec.timeout` expired while the final consistency check could not be computed.
    #[error(
        "the request's timeout of {timeout} expired before the final consistency check could be computed ({reason}); the old volumes are kept on Retain"
    )]
    FinalCheckTimedOut { timeout: String, reason: String },

    /// The status has no plan (it is written at acceptance).
    #[error("the status has no plan")]
    NoPlan,
    /// `status.members` has no entry at this index.
    #[error("no member status #{index}")]
    NoMemberStatus { index: usize },
    /// A member of the status is missing from the plan.
    #[error("member {pod} is not in the plan")]
    NotInPlan { pod: String },
    /// The StatefulSet is gone and was not stashed.
    #[error("StatefulSet {name} disappeared before it was stashed")]
    StatefulSetDisappeared { name: String },
    /// The target Deployment is gone, or something else scaled it while the request held it
    /// (`what` says which).
    #[error("Deployment {deployment} {what}")]
    DeploymentChanged { deployment: String, what: String },
    /// A member's original claim is gone before its temporary claim was created.
    #[error("claim {claim} of member {pod} disappeared")]
    ClaimDisappeared { claim: String, pod: String },
    /// A member's pod is gone (or terminating) and was not stashed.
    #[error("pod {pod} disappeared before its manifest was stashed")]
    PodDisappeared { pod: String },
    /// Something else recreated the member's pod while its data was being copied.
    #[error("member pod {pod} came back during its copy (something else recreated it)")]
    PodCameBack { pod: String },
    /// Something else started the member's pod again during its copy (a foreign StatefulSet,
    /// named in `what`): the member is rolled back to its untouched old claim.
    #[error(
        "{what} came back during the copy of member {pod}: the member is rolled back to its old claim"
    )]
    ForeignPodDuringCopy { pod: String, what: String },
    /// A pod other than the member mounted its claim during the final copy or its
    /// verification: what it wrote may be missing from the copy, so the member is rolled back
    /// to its old claim.
    #[error(
        "claim {claim} of member {pod} is mounted by pod {others} during its copy: the migration does not stop that pod, so the copy may miss its writes; the member is rolled back to its old claim"
    )]
    ClaimSharedDuringCopy {
        pod: String,
        claim: String,
        others: String,
    },
    /// The member's original claim was replaced (another uid under its name) before it was
    /// deleted: the claim now there is not deleted.
    #[error(
        "claim {claim} was replaced before its deletion: stashed uid {stashed_uid}, now uid {live_uid}; the claim now there is left alone"
    )]
    ClaimReplaced {
        claim: String,
        stashed_uid: String,
        live_uid: String,
    },
    /// The temporary claim is `Lost`.
    #[error("temporary claim {claim} lost its volume")]
    TempClaimLost { claim: String },
    /// A claim under the temporary claim's name that this request did not make (its
    /// `storagemigrator.io/request-uid` label is not the request's uid): never adopted, never
    /// deleted.
    #[error(
        "claim {claim} has the name of member {pod}'s temporary claim but was not made by this request ({found}); it is neither used nor deleted: move or delete it, then apply the request again"
    )]
    TempClaimNotOurs {
        claim: String,
        pod: String,
        found: String,
    },
    /// The new volume's node affinity excludes the member's node.
    #[error("new volume {volume} was provisioned where node {node} (member {pod}) cannot reach it")]
    VolumeUnreachable {
        volume: String,
        node: String,
        pod: String,
    },

    /// The mounter pod of a member cannot start or finish (see `plan::helpers`).
    #[error("the mounter pod of member {pod} failed: {reason}")]
    MounterStuck { pod: String, reason: String },
    /// The mounter pod's manifest could not be built.
    #[error("cannot build the mounter pod: {error}")]
    MounterPod { error: String },
    /// A manifest could not be encoded for the stash.
    #[error("cannot stash {key}: {error}")]
    Stash { key: String, error: String },
    /// The stash ConfigMap would exceed its size budget with this entry (nothing more is
    /// deleted: the stash precedes every destructive step).
    #[error("cannot stash {key}: ConfigMap {config_map} would exceed its budget of {budget} bytes")]
    StashFull {
        key: String,
        config_map: String,
        budget: usize,
    },
    /// The recorded retention policy of the StatefulSet cannot be read back.
    #[error("cannot restore the retention policy: {error}")]
    RetentionPolicy { error: String },
}

/// How the message of [`Failure::StaleCopy`] of member `pod` begins.
pub fn stale_copy_prefix(pod: &str) -> String {
    format!("member {pod} ran again after its final copy")
}

/// What [`Failure::CopyMemoryTooLow`] names.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryShortfall {
    pub pod: String,
    pub claim: String,
    /// `build::copy_memory` of what the pre-copy found.
    pub needed: String,
    /// Files and directories on the old volume.
    pub entries: i64,
    /// Bytes in use on it, for people.
    pub bytes: String,
    /// The request's limit.
    pub limit: String,
}

/// What is known when a copy pass of a member runs out of space ([`Failure::OutOfSpace`]).
#[derive(Debug, Clone, PartialEq)]
pub struct OutOfSpace {
    pub pod: String,
    /// The pass: `pre-copy` or `final copy`.
    pub pass: &'static str,
    pub claim: String,
    pub temp_claim: String,
    /// The size asked for the temporary claim (`spec.shrink.size`, or the old claim's size).
    pub size: String,
    /// Bytes in use on the old claim as measured at preflight (Shrink).
    pub measured_bytes: Option<i64>,
    /// Bytes in use on the old claim when the pass failed.
    pub used_bytes: Option<i64>,
    /// The size of the target's filesystem (`statfs`: its blocks, metadata left out).
    pub target_bytes: Option<i64>,
    /// Bytes the pass had dealt with by its last progress line (a lower bound: rsync reports
    /// about once a second, so a fast pass may fill the volume after its first line).
    pub copied_bytes: Option<i64>,
    /// The target's filesystem type (`statfs`), when known.
    pub fs_type: Option<String>,
    /// Set when the pass fitted but left the target almost full: the bytes still free there
    /// (see [`crate::plan::preflight::MIN_HEADROOM_BYTES`]).
    pub left_bytes: Option<i64>,
}

impl std::fmt::Display for OutOfSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let h = |b: i64| human(i128::from(b));
        match self.left_bytes {
            Some(left) => write!(
                f,
                "the {} of member {} fitted but left only {} free on temporary claim {} \
                 (less than the {} headroom a member needs to run, and less than it had on its \
                 old claim; {}",
                self.pass,
                self.pod,
                h(left),
                self.temp_claim,
                human(MIN_HEADROOM_BYTES),
                self.size
            )?,
            None => write!(
                f,
                "the {} of member {} ran out of space on temporary claim {} ({}",
                self.pass, self.pod, self.temp_claim, self.size
            )?,
        }
        if let Some(size) = self.target_bytes {
            write!(f, ": its filesystem holds {}", h(size))?;
        }
        if let Some(copied) = self.copied_bytes {
            write!(f, "; rsync last reported {} copied", h(copied))?;
        }
        write!(f, ")")?;
        let mut data = Vec::new();
        if let Some(used) = self.used_bytes {
            data.push(format!("claim {} now uses {}", self.claim, h(used)));
        }
        if let Some(measured) = self.measured_bytes {
            data.push(format!("preflight measured {}", h(measured)));
        }
        if !data.is_empty() {
            write!(f, "; {}", data.join(", "))?;
        }
        write!(
            f,
            "; the member stays on its untouched old claim {}; retry with a larger size",
            self.claim
        )?;
        match self.suggested_size() {
            Some((needed, Some(size))) => write!(
                f,
                " (with headroom the data needs {}, which an ext4 volume of {} holds)",
                human(needed),
                human(size)
            ),
            Some((needed, None)) => write!(
                f,
                " (with headroom the data needs {} once the filesystem is made)",
                human(needed)
            ),
            None => Ok(()),
        }
    }
}

impl OutOfSpace {
    /// What the data needs with preflight's headroom (the larger of the bytes now and those
    /// measured), and for ext4 the size of a volume that holds it.
    pub fn suggested_size(&self) -> Option<(i128, Option<i128>)> {
        let used = i128::from(self.used_bytes.max(self.measured_bytes)?);
        let needed = used + (used / 10).max(MIN_HEADROOM_BYTES);
        let ext4 = self.fs_type.as_deref() == Some(headroom::EXT_FAMILY);
        Some((needed, ext4.then(|| headroom::ext4_size_holding(needed))))
    }
}
