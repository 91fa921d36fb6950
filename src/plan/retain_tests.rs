//! Planner tests of `plan::retain`: the claim swap deletes a claim only while both of its
//! volumes are on `Retain` in the snapshot of that decision; a volume reset to `Delete` between
//! two decisions is patched back and no claim is deleted; reset again, condition
//! `ReclaimPolicy` names it.

use super::fixtures::*;
use super::retain::{NotRetained, ReclaimPolicyReason, unsafe_claim_delete};
use super::*;
use crate::api::conditions;
use crate::api::{MemberStatus, Phase, PlannedMember};

fn first_status(d: &Decision) -> &StorageMigrationRequestStatus {
    match d.actions.first() {
        Some(Action::SetStatus(s)) => s,
        other => panic!("expected SetStatus first, got {other:?}"),
    }
}

fn member0(sim: &Sim) -> MemberStatus {
    sim.status().members[0].clone()
}

fn planned0(sim: &Sim) -> PlannedMember {
    sim.status().plan.unwrap_or_default().members[0].clone()
}

/// The old and the new volume of member etcd-0's claim.
fn volumes0(sim: &Sim) -> (String, String) {
    let new = member0(sim).first_claim.new_volume.unwrap_or_default();
    (planned0(sim).old_volume, new)
}

fn claim_deletes(d: &Decision) -> Vec<String> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            Action::Delete {
                kind: Kind::Claim,
                name,
                ..
            } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

fn patches_to_retain(d: &Decision) -> Vec<String> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            Action::PatchReclaimPolicy { volume, policy } if policy == "Retain" => {
                Some(volume.clone())
            }
            _ => None,
        })
        .collect()
}

/// Applies a decision's actions to the simulated cluster.
fn apply(sim: &mut Sim, d: &Decision) {
    for a in &d.actions {
        sim.apply(a);
    }
}

fn reclaim_condition(
    sim: &Sim,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    conditions::get(&sim.status().conditions, conditions::RECLAIM_POLICY).cloned()
}

#[test]
fn a_volume_reset_to_delete_before_the_claim_deletes_is_patched_back_and_nothing_deleted() {
    for reset_new in [false, true] {
        let mut sim = Sim::at(MemberStep::DeletingOldClaim);
        let (old, new) = volumes0(&sim);
        let reset = if reset_new { new.clone() } else { old.clone() };
        // Both Retain when the step was entered; someone resets one before the delete.
        sim.set_reclaim_policy(&reset, "Delete");
        let d = decide(&sim.o, &SETTINGS);
        assert_eq!(claim_deletes(&d), Vec::<String>::new(), "{:?}", d.actions);
        assert_eq!(patches_to_retain(&d), vec![reset.clone()]);
        let ms = &first_status(&d).members[0];
        assert_eq!(ms.step, MemberStep::DeletingOldClaim);
        let resets = &ms.first_claim.policy_resets;
        assert_eq!(resets.len(), 1, "{resets:?}");
        assert_eq!(
            (
                resets[0].volume.as_str(),
                resets[0].policy.as_str(),
                resets[0].times
            ),
            (reset.as_str(), "Delete", 1)
        );
        assert!(
            d.actions
                .iter()
                .any(|a| matches!(a, Action::Event { reason, message, .. }
                if reason == "ReclaimPolicyRestored" && message.contains(&reset))),
            "{:?}",
            d.actions
        );
        // Once only: no condition yet.
        apply(&mut sim, &d);
        assert_eq!(reclaim_condition(&sim), None);
        // Back on Retain: both claims go, by the next decision.
        let d = decide(&sim.o, &SETTINGS);
        let temp = planned0(&sim).temp_claim;
        assert_eq!(claim_deletes(&d), vec!["data-etcd-0".to_string(), temp]);
    }
}

#[test]
fn a_volume_reset_again_after_the_patch_back_sets_the_condition_naming_it() {
    let mut sim = Sim::at(MemberStep::DeletingOldClaim);
    let (old, _) = volumes0(&sim);
    sim.set_reclaim_policy(&old, "Delete");
    let d = decide(&sim.o, &SETTINGS);
    // The patch back has not landed yet (same resourceVersion): the same change, not another.
    let mut unpatched = sim.o.clone();
    unpatched.request.status = Some(first_status(&d).clone());
    let again = decide(&unpatched, &SETTINGS);
    assert_eq!(patches_to_retain(&again), vec![old.clone()]);
    assert!(claim_deletes(&again).is_empty());
    assert_eq!(
        first_status_or(&again, &unpatched).members[0]
            .first_claim
            .policy_resets[0]
            .times,
        1
    );
    // It lands; then something resets it again.
    apply(&mut sim, &d);
    sim.set_reclaim_policy(&old, "Delete");
    let d = decide(&sim.o, &SETTINGS);
    assert!(claim_deletes(&d).is_empty(), "{:?}", d.actions);
    assert_eq!(patches_to_retain(&d), vec![old.clone()]);
    apply(&mut sim, &d);
    let c = reclaim_condition(&sim).expect("condition ReclaimPolicy");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", ReclaimPolicyReason::ChangedAgain.as_str())
    );
    assert!(
        c.message
            .contains(&format!("volume {old} (old volume of claim data-etcd-0)"))
    );
    assert!(
        c.message
            .contains("something else keeps changing its reclaim policy"),
        "{}",
        c.message
    );
    assert!(c.message.contains("runbook: docs/runbook.md#reclaimpolicy"));
    assert_eq!(member0(&sim).first_claim.policy_resets[0].times, 2);
    assert!(sim.reasons().contains(&"ReclaimPolicyChangedAgain"));
    // Left alone now, the swap goes on: the claims are deleted, the old volume kept.
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful);
    assert!(sim.o.volumes.contains_key(&old));
}

/// The status a decision writes, or the one it was decided on when it writes none.
fn first_status_or(d: &Decision, o: &Observed) -> StorageMigrationRequestStatus {
    match d.actions.first() {
        Some(Action::SetStatus(s)) => (**s).clone(),
        _ => o.request.status.clone().unwrap_or_default(),
    }
}

/// The temporary claim left behind (the old one gone): its volume, the new one, reset to
/// `Delete` keeps it.
#[test]
fn the_temporary_claim_is_not_deleted_while_the_new_volume_is_not_retain() {
    let mut sim = Sim::at_or_left_behind(MemberStep::DeletingTempClaim);
    let (_, new) = volumes0(&sim);
    sim.set_reclaim_policy(&new, "Delete");
    let d = decide(&sim.o, &SETTINGS);
    assert!(claim_deletes(&d).is_empty(), "{:?}", d.actions);
    assert_eq!(patches_to_retain(&d), vec![new.clone()]);
    apply(&mut sim, &d);
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful);
    assert!(sim.o.volumes.contains_key(&new));
}

/// Over a whole request, something resets each member's old and new volume to `Delete` at
/// every swap step, twice: no claim is deleted while its volume is not on `Retain` (the
/// simulator's invariant panics otherwise), every volume survives, the request succeeds.
#[test]
fn a_request_whose_volumes_are_reset_at_every_swap_step_loses_no_volume() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    let mut resets = BTreeMap::<String, u32>::new();
    for _ in 0..600 {
        if sim.phase().is_final() {
            break;
        }
        let status = sim.status();
        let plan = status.plan.clone().unwrap_or_default();
        for (ms, m) in status.members.iter().zip(&plan.members) {
            let swapping =
                ms.step >= MemberStep::DeletingOldClaim && ms.step <= MemberStep::RecreatingClaim;
            let new = ms.first_claim.new_volume.clone().unwrap_or_default();
            for v in [m.old_volume.clone(), new] {
                let n = resets.entry(v.clone()).or_default();
                if swapping && *n < 2 {
                    *n += 1;
                    sim.set_reclaim_policy(&v, "Delete");
                }
            }
        }
        let d = decide(&sim.o, &SETTINGS);
        apply(&mut sim, &d);
        sim.settle();
    }
    assert_eq!(sim.phase(), Phase::Successful, "{:?}", sim.status().message);
    for (v, n) in &resets {
        if *n > 0 {
            assert!(sim.o.volumes.contains_key(v), "volume {v} is gone");
        }
    }
    assert!(
        resets.values().filter(|n| **n == 2).count() >= 3,
        "{resets:?}"
    );
    assert!(sim.reasons().contains(&"ReclaimPolicyChangedAgain"));
}

/// The planner's own check, the last word on a decision: a claim delete whose volume is not
/// on `Retain` in the snapshot drops the decision and reports the request stuck.
#[test]
fn the_planner_refuses_a_claim_delete_whose_volume_is_not_retain() {
    let mut sim = Sim::at(MemberStep::DeletingOldClaim);
    let (old, new) = volumes0(&sim);
    let temp = planned0(&sim).temp_claim;
    let delete = |name: &str| Action::Delete {
        kind: Kind::Claim,
        name: name.into(),
        propagation: Propagation::Background,
        uid: None,
        resource_version: None,
    };
    let status = sim.status();
    assert_eq!(
        unsafe_claim_delete(&sim.o, &status, &[delete("data-etcd-0"), delete(&temp)]),
        None
    );
    sim.set_reclaim_policy(&old, "Delete");
    let why = unsafe_claim_delete(&sim.o, &status, &[delete("data-etcd-0")]);
    assert_eq!(
        why,
        Some(NotRetained::Policy {
            claim: "data-etcd-0".into(),
            volume: old.clone(),
            policy: "Delete".into()
        })
    );
    // The temporary claim is guarded once the swap has begun.
    sim.set_reclaim_policy(&old, "Retain");
    sim.set_reclaim_policy(&new, "Delete");
    assert!(unsafe_claim_delete(&sim.o, &status, &[delete(&temp)]).is_some());
    // Not before: a rollback deletes it with its volume's own policy.
    let mut before = status.clone();
    before.members[0].step = MemberStep::Copying;
    assert_eq!(unsafe_claim_delete(&sim.o, &before, &[delete(&temp)]), None);
    // Another claim is not the planner's to guard.
    assert_eq!(
        unsafe_claim_delete(&sim.o, &status, &[delete("someone-elses")]),
        None
    );
}

/// A member whose swap has finished keeps both volumes on `Retain` until the final check: its
/// old volume, `Released`, reset to `Delete` while the next member migrates, is patched back
/// (the PV controller would delete it), recorded on its status; reset again, the condition.
#[test]
fn a_migrated_members_old_volume_reset_while_the_next_migrates_is_patched_back() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    for _ in 0..400 {
        let status = sim.status();
        if status
            .members
            .first()
            .is_some_and(|m| m.step == MemberStep::Done)
        {
            break;
        }
        let d = decide(&sim.o, &SETTINGS);
        apply(&mut sim, &d);
        sim.settle();
    }
    let done = member0(&sim);
    assert_eq!(done.step, MemberStep::Done);
    assert_eq!(sim.status().stage, Stage::Migrating);
    let old = sim
        .status()
        .plan
        .unwrap_or_default()
        .members
        .iter()
        .find(|m| m.pod == done.pod)
        .map(|m| m.old_volume.clone())
        .unwrap_or_default();
    for times in 1..=2 {
        sim.set_reclaim_policy(&old, "Delete");
        let d = decide(&sim.o, &SETTINGS);
        assert_eq!(patches_to_retain(&d), vec![old.clone()], "{:?}", d.actions);
        apply(&mut sim, &d);
        let resets = member0(&sim).first_claim.policy_resets;
        assert_eq!(resets.iter().map(|r| r.times).collect::<Vec<_>>(), [times]);
    }
    let c = reclaim_condition(&sim).expect("condition ReclaimPolicy");
    assert!(
        c.message
            .contains(&format!("volume {old} (old volume of claim")),
        "{}",
        c.message
    );
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful);
}
