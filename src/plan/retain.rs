//! The claim swap deletes a claim only while its volume is on `Retain`, as seen in the snapshot
//! of the decision that deletes it.
//!
//! `RetainingVolumes` sets both volumes of a claim (the old one and the new one) to `Retain`
//! and moves on only once both are. Something else can change a policy back afterwards (a
//! GitOps tool that owns statically declared volumes, a storage vendor's reconciler), and a
//! claim deleted then takes its volume with it. So every swap step from `DeletingOldClaim` to
//! `RecreatingClaim` first looks at both volumes again ([`hold_swap`]): one that is not on
//! `Retain` is patched back, and the step does nothing else in that decision. Each change is
//! recorded on the claim's status (`policyResets`), told apart from the last one by the
//! volume's `resourceVersion`; from the second change of the same volume on, condition
//! `ReclaimPolicy` names it and says that something else keeps changing it. Each delete checks
//! its own claim's volume once more ([`delete_allowed`]), and [`unsafe_claim_delete`] is the
//! same rule over a whole decision, the last word before it is carried out. Until the final
//! check, the volumes of members already swapped are kept on `Retain` the same way
//! ([`keep_swapped`]).

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;

use super::claims::{self, VolumeRole};
use super::member::{Member, SWAP_POLL};
use super::runbook;
use super::{Action, Ctx, EventType, Kind, Observed, claim_volume, volume_policy};
use crate::api::conditions;
use crate::api::{MemberStep, PolicyReset, StorageMigrationRequestStatus};

/// The only reclaim policy under which a claim of the swap may be deleted.
pub const RETAIN: &str = "Retain";

/// Why condition `ReclaimPolicy` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReclaimPolicyReason {
    /// A volume's policy was changed from `Retain` again after the operator had set it back.
    ChangedAgain,
}

impl ReclaimPolicyReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ChangedAgain => "ChangedAgain",
        }
    }
}

/// The claim a volume belongs to: member `i` of the status, its claim `slot`, the claim's name.
struct Owner {
    i: usize,
    slot: usize,
    claim: String,
}

/// What a look at a volume's policy found that was not `Retain`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Change {
    /// A change not seen before (another `resourceVersion`): how many there were so far.
    New { times: u32 },
    /// The change the last decision saw and patched back already (same `resourceVersion`):
    /// the patch has not landed.
    Seen { times: u32 },
}

/// Looks at both volumes of the claim the swap step works on; patches back each one that is
/// not on `Retain`, recording the change. True when one was not: the step does nothing else
/// in this decision (no delete), and looks again soon.
pub(super) fn hold_swap(cx: &mut Ctx, mb: &Member) -> bool {
    let owner = Owner {
        i: mb.i,
        slot: mb.slot,
        claim: mb.m.claim.clone(),
    };
    let volumes = [
        (VolumeRole::Old, Some(mb.m.old_volume.clone())),
        (VolumeRole::New, mb.ms.first_claim.new_volume.clone()),
    ];
    let mut held = false;
    for (role, name) in volumes {
        let Some(pv) = name.and_then(|n| cx.o.volumes.get(&n)) else {
            continue;
        };
        if volume_policy(pv) != RETAIN {
            restore(cx, &owner, role, pv);
            held = true;
        }
    }
    if held {
        cx.wait(SWAP_POLL);
    }
    held
}

/// While the members are migrated and the StatefulSet recreated, the volumes of each member
/// whose swap has finished (`Done`) stay on `Retain` too: its old volume is `Released`, and the
/// PV controller deletes a released volume on `Delete`, before the final check that alone may
/// give it such a policy. One found changed is patched back and recorded as in the swap; no
/// step waits for it.
pub(crate) fn keep_swapped(cx: &mut Ctx) {
    let mut changed: Vec<(Owner, VolumeRole, PersistentVolume)> = Vec::new();
    for c in claims::request_claims(&cx.status) {
        let member = cx.status.members.iter().position(|m| m.pod == c.pod());
        let Some(i) = member.filter(|_| c.status.step == MemberStep::Done) else {
            continue;
        };
        for (role, name) in c.volumes() {
            let Some(pv) = cx.o.volumes.get(name) else {
                continue;
            };
            if volume_policy(pv) != RETAIN {
                let claim = c.claim().to_string();
                let owner = Owner {
                    i,
                    slot: c.slot,
                    claim,
                };
                changed.push((owner, role, pv.clone()));
            }
        }
    }
    for (owner, role, pv) in &changed {
        restore(cx, owner, *role, pv);
    }
}

/// Patches `pv` back to `Retain`, records the change on the claim's status, says so (an Event
/// for each new change, the condition from the second on).
fn restore(cx: &mut Ctx, owner: &Owner, role: VolumeRole, pv: &PersistentVolume) {
    let volume = pv.name_any();
    let policy = volume_policy(pv);
    let change = record(cx, owner, &volume, &policy, pv.resource_version());
    cx.act(Action::PatchReclaimPolicy {
        volume: volume.clone(),
        policy: RETAIN.to_string(),
    });
    let Change::New { times } = change else {
        return;
    };
    let what = format!(
        "volume {volume} ({} volume of claim {}) is on reclaim policy {policy}",
        role.as_str(),
        owner.claim
    );
    cx.event(
        EventType::Warning,
        "ReclaimPolicyRestored",
        format!(
            "{what}, after the operator had set it to Retain for the migration: set back to \
             Retain; no claim of it is deleted until it stays Retain"
        ),
    );
    if times >= 2 {
        let message = format!(
            "{what} again ({times} times during the request): something else keeps changing \
             its reclaim policy. The operator sets it back to Retain each time and deletes no \
             claim of it while it is not; stop whatever changes it{}",
            runbook::pointer(runbook::Section::ReclaimPolicyChanged)
        );
        let reason = ReclaimPolicyReason::ChangedAgain.as_str();
        if cx.set_condition(conditions::RECLAIM_POLICY, false, reason, &message) {
            cx.event(EventType::Warning, "ReclaimPolicyChangedAgain", message);
        }
    }
}

/// Records the change on the claim's `policyResets`: a new one when the volume's
/// `resourceVersion` is not the one recorded (or either is unknown).
fn record(
    cx: &mut Ctx,
    owner: &Owner,
    volume: &str,
    policy: &str,
    version: Option<String>,
) -> Change {
    let Some(ms) = cx.status.members.get_mut(owner.i) else {
        return Change::New { times: 1 };
    };
    let mut c = ms.claim_status(owner.slot);
    let change = next_change(&c.policy_resets, volume, version.as_deref());
    let times = match change {
        Change::New { times } | Change::Seen { times } => times,
    };
    c.policy_resets.retain(|r| r.volume != volume);
    c.policy_resets.push(PolicyReset {
        volume: volume.to_string(),
        policy: policy.to_string(),
        times,
        resource_version: version,
    });
    ms.set_claim_status(owner.slot, c);
    change
}

/// Whether the volume found off `Retain` at `version` is a change already recorded.
fn next_change(recorded: &[PolicyReset], volume: &str, version: Option<&str>) -> Change {
    match recorded.iter().find(|r| r.volume == volume) {
        Some(r) if version.is_some() && r.resource_version.as_deref() == version => {
            Change::Seen { times: r.times }
        }
        Some(r) => Change::New {
            times: r.times.saturating_add(1),
        },
        None => Change::New { times: 1 },
    }
}

/// Why a claim may not be deleted in this decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotRetained {
    #[error("claim {claim}'s volume {volume} is on reclaim policy {policy}, not Retain")]
    Policy {
        claim: String,
        volume: String,
        policy: String,
    },
    #[error("claim {claim}'s volume {volume} was not found, so it cannot be seen on Retain")]
    Unseen { claim: String, volume: String },
}

/// Whether `claim` may be deleted in this decision: it is bound to no volume, or to one the
/// snapshot shows on `Retain`.
pub(super) fn delete_allowed(
    o: &Observed,
    claim: &PersistentVolumeClaim,
) -> Result<(), NotRetained> {
    let Some(volume) = claim_volume(claim) else {
        return Ok(());
    };
    let (claim, volume) = (claim.name_any(), volume.to_string());
    match o.volumes.get(&volume) {
        Some(pv) if volume_policy(pv) == RETAIN => Ok(()),
        Some(pv) => Err(NotRetained::Policy {
            claim,
            volume,
            policy: volume_policy(pv),
        }),
        None => Err(NotRetained::Unseen { claim, volume }),
    }
}

/// The first claim delete of `actions` that would lose data: a member's claim (any of its
/// claims) or, once its swap has begun, its temporary claim, whose volume the snapshot does
/// not show on `Retain` (the simulator's invariant, checked by the planner on its own
/// decisions). `status` is the one the decision writes first.
pub(crate) fn unsafe_claim_delete(
    o: &Observed,
    status: &StorageMigrationRequestStatus,
    actions: &[Action],
) -> Option<NotRetained> {
    // A member without a status yet is `Pending`: its swap has not begun.
    let claims = super::claims::request_claims(status);
    let guarded = |name: &str| {
        (claims.iter())
            .any(|c| c.claim() == name || (c.temp_claim() == name && c.status.step.swap_begun()))
    };
    actions.iter().find_map(|a| match a {
        Action::Delete {
            kind: Kind::Claim,
            name,
            ..
        } if guarded(name) => delete_allowed(o, o.claims.get(name)?).err(),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reset(volume: &str, times: u32, version: Option<&str>) -> PolicyReset {
        PolicyReset {
            volume: volume.into(),
            policy: "Delete".into(),
            times,
            resource_version: version.map(str::to_string),
        }
    }

    #[test]
    fn a_change_is_told_from_the_last_one_by_the_volumes_resource_version() {
        let recorded = [reset("pv-a", 1, Some("7")), reset("pv-b", 2, None)];
        assert_eq!(
            next_change(&recorded, "pv-a", Some("7")),
            Change::Seen { times: 1 }
        );
        assert_eq!(
            next_change(&recorded, "pv-a", Some("9")),
            Change::New { times: 2 }
        );
        // Unknown versions count as a new change: a warning too many, never one too few.
        assert_eq!(
            next_change(&recorded, "pv-b", None),
            Change::New { times: 3 }
        );
        assert_eq!(
            next_change(&recorded, "pv-c", Some("1")),
            Change::New { times: 1 }
        );
    }
}
