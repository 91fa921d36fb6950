//! Planner tests of `plan::foreign`: a StatefulSet or a member pod that something else created
//! while the request is past orphaning, at every step of the member in flight; gone again; the
//! timeout; and rollbacks that meet one (each must end).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;

use super::fixtures::*;
use super::*;
use crate::api::{MemberStatus, Phase, Stage};

const FOREIGN_UID: &str = "uid-foreign";

fn first_status(d: &Decision) -> &StorageMigrationRequestStatus {
    match d.actions.first() {
        Some(Action::SetStatus(s)) => s,
        other => panic!("expected SetStatus first, got {other:?}"),
    }
}

fn members_of(sim: &Sim) -> Vec<MemberStatus> {
    sim.o.request.status.clone().unwrap_or_default().members
}

/// The original StatefulSet, applied again by someone else: same name, another uid.
fn foreign_set() -> crate::build::Manifest<k8s_openapi::api::apps::v1::StatefulSet> {
    let mut set = stateful_set(3);
    set.metadata.uid = Some(FOREIGN_UID.into());
    manifest(set)
}

/// Member pod `ordinal` controlled by the foreign set, with `uid`.
fn pod_of_foreign_set(ordinal: usize, uid: &str) -> crate::build::Manifest<Pod> {
    let mut pod = member_pod(ordinal);
    pod.metadata.uid = Some(uid.into());
    pod.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "StatefulSet".into(),
        name: "etcd".into(),
        uid: FOREIGN_UID.into(),
        controller: Some(true),
        ..Default::default()
    }]);
    manifest(pod)
}

fn blocked(s: &StorageMigrationRequestStatus) -> Option<(String, String, String)> {
    conditions::get(&s.conditions, conditions::BLOCKED)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Only the status and Events: nothing on the cluster is touched.
fn only_status_and_events(d: &Decision) -> bool {
    d.actions
        .iter()
        .all(|a| matches!(a, Action::SetStatus(_) | Action::Event { .. }))
}

/// The actions of a decision but its status write (to compare blocked and unblocked decisions).
fn cluster_actions(d: &Decision) -> Vec<Action> {
    d.actions
        .iter()
        .filter(|a| !matches!(a, Action::SetStatus(_) | Action::Event { .. }))
        .cloned()
        .collect()
}

/// Steps where a foreign set alone holds the member still.
const HELD_STEPS: [MemberStep; 8] = [
    MemberStep::CreatingClaim,
    MemberStep::PreCopying,
    MemberStep::GatingStop,
    MemberStep::StoppingPod,
    MemberStep::Copying,
    MemberStep::RetainingVolumes,
    MemberStep::DeletingOldClaim,
    MemberStep::RecreatingPod,
];

#[test]
fn a_foreign_set_blocks_every_step_then_the_member_resumes_when_it_is_gone() {
    for step in HELD_STEPS {
        let sim = Sim::at(step);
        let unblocked = decide(&sim.o, &SETTINGS);
        let mut o = sim.o.clone();
        o.stateful_set = Some(foreign_set());
        let d = decide(&o, &SETTINGS);
        assert!(only_status_and_events(&d), "{step:?}: {:?}", d.actions);
        let s = first_status(&d);
        assert_eq!((s.stage, s.members[0].step), (Stage::Migrating, step));
        let (status, reason, message) = blocked(s).unwrap();
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("True", "ForeignStatefulSet")
        );
        assert!(
            message.starts_with(
                "StatefulSet etcd (uid uid-foreign) was created by someone else while the \
                 request was migrating; pause its owner"
            ) && message.contains("30m"),
            "{message}"
        );
        assert!(
            d.actions
                .iter()
                .any(|a| matches!(a, Action::Event { reason, .. } if reason == "Blocked"))
        );
        // Looked at again with nothing new: the same, without a second Event.
        o.request.status = Some(s.clone());
        let again = decide(&o, &SETTINGS);
        assert!(again.actions.is_empty(), "{step:?}: {:?}", again.actions);
        // Gone: the condition is cleared and the step does what it would have done.
        o.stateful_set = None;
        let d = decide(&o, &SETTINGS);
        let (status, reason, _) = blocked(first_status(&d)).unwrap();
        assert_eq!((status.as_str(), reason.as_str()), ("False", "Clear"));
        assert_eq!(cluster_actions(&d), cluster_actions(&unblocked), "{step:?}");
    }
}

#[test]
fn once_the_old_claim_is_gone_a_foreign_set_alone_does_not_stop_the_claim_steps() {
    for step in [
        MemberStep::DeletingTempClaim,
        MemberStep::ReleasingNewVolume,
        MemberStep::RecreatingClaim,
    ] {
        let sim = Sim::at_or_left_behind(step);
        let unblocked = decide(&sim.o, &SETTINGS);
        let mut o = sim.o.clone();
        o.stateful_set = Some(foreign_set());
        let d = decide(&o, &SETTINGS);
        assert_eq!(cluster_actions(&d), cluster_actions(&unblocked), "{step:?}");
        assert!(!cluster_actions(&d).is_empty(), "{step:?}");
        let (status, reason, message) = blocked(first_status(&d)).unwrap();
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("True", "ForeignStatefulSet")
        );
        assert!(message.contains("its pod is not recreated"), "{message}");
    }
}

#[test]
fn a_foreign_set_run_through_recreating_pod_creates_no_pod_of_ours() {
    let mut sim = Sim::at(MemberStep::RecreatingClaim);
    sim.o.stateful_set = Some(foreign_set());
    let from = sim.log.len();
    sim.run(40);
    assert_eq!(sim.step_of("etcd-0"), MemberStep::RecreatingPod);
    assert!(
        !sim.log[from..].iter().any(|a| matches!(
            a,
            Action::Create(Object::Pod(_)) | Action::Create(Object::StatefulSet(_))
        )),
        "{:?}",
        &sim.log[from..]
    );
    let claim = &sim.o.claims["data-etcd-0"];
    assert_eq!(
        claim_volume(claim),
        members_of(&sim)[0].first_claim.new_volume.as_deref(),
        "the claim's name holds the verified copy"
    );
}

#[test]
fn a_pod_someone_else_started_blocks_stopping_and_recreating() {
    // StoppingPod, after the stash: the pod there is not the stashed one.
    let mut sim = Sim::at(MemberStep::StoppingPod);
    let d = decide(&sim.o, &SETTINGS);
    for a in &d.actions {
        sim.apply(a);
    }
    assert!(sim.o.stash.pods.contains_key("etcd-0"));
    let mut o = sim.o.clone();
    let mut other = member_pod(0);
    other.metadata.uid = Some("uid-other".into());
    other.metadata.owner_references = None;
    o.pods.insert("etcd-0".into(), manifest(other));
    let d = decide(&o, &SETTINGS);
    assert!(only_status_and_events(&d), "{:?}", d.actions);
    let (status, reason, message) = blocked(first_status(&d)).unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "ForeignPod"));
    assert!(
        message.starts_with("pod etcd-0 (uid uid-other)"),
        "{message}"
    );

    // RecreatingPod: a pod controlled by a foreign set (the set itself already gone).
    let sim = Sim::at(MemberStep::RecreatingPod);
    let mut o = sim.o.clone();
    o.pods
        .insert("etcd-0".into(), pod_of_foreign_set(0, "uid-p"));
    let d = decide(&o, &SETTINGS);
    assert!(only_status_and_events(&d), "{:?}", d.actions);
    let (_, reason, message) = blocked(first_status(&d)).unwrap();
    assert_eq!(reason, "ForeignPod");
    assert!(
        message.starts_with(
            "pod etcd-0 (uid uid-p) is controlled by StatefulSet etcd (uid uid-foreign), which \
             someone else created while the request was migrating"
        ),
        "{message}"
    );
}

#[test]
fn a_foreign_set_that_adopted_the_running_pods_is_named_rather_than_the_pods() {
    let sim = Sim::at(MemberStep::GatingStop);
    let mut o = sim.o.clone();
    o.stateful_set = Some(foreign_set());
    for i in 0..3 {
        o.pods.insert(
            format!("etcd-{i}"),
            pod_of_foreign_set(i, &format!("uid-etcd-{i}")),
        );
    }
    let d = decide(&o, &SETTINGS);
    assert!(only_status_and_events(&d), "{:?}", d.actions);
    let (_, reason, message) = blocked(first_status(&d)).unwrap();
    assert_eq!(reason, "ForeignStatefulSet");
    assert!(
        message.starts_with("StatefulSet etcd (uid uid-foreign)"),
        "{message}"
    );
    let mut sim = Sim::new(o);
    expire(&mut sim);
    let d = decide(&sim.o, &SETTINGS);
    assert_eq!(
        first_status(&d).failure.as_deref(),
        Some(
            "the request's timeout of 30m expired while it was blocked: StatefulSet etcd (uid \
             uid-foreign) was created by someone else (runbook: \
             docs/runbook.md#failed-timeout-expired)"
        )
    );
}

#[test]
fn the_operators_own_recreated_set_is_never_foreign() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful);
    let status = sim.o.request.status.clone().unwrap();
    let ours = sim.o.stateful_set.as_ref().unwrap();
    assert_eq!(status.recreated_stateful_set_uid, ours.uid());
    assert_eq!(
        ours.annotations()
            .get(labels::CREATED_BY_REQUEST_ANNOTATION)
            .map(String::as_str),
        Some("uid-move")
    );
    assert!(conditions::get(&status.conditions, conditions::BLOCKED).is_none());
    // Every recreated pod carries the marker too.
    for pod in sim.o.pods.values() {
        assert_eq!(
            pod.annotations()
                .get(labels::CREATED_BY_REQUEST_ANNOTATION)
                .map(String::as_str),
            Some("uid-move"),
            "{}",
            pod.name_any()
        );
    }
}

#[test]
fn a_set_with_our_marker_but_another_uid_than_recorded_is_foreign() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    for _ in 0..400 {
        if sim
            .o
            .request
            .status
            .as_ref()
            .is_some_and(|s| s.stage == Stage::Finalizing)
        {
            break;
        }
        let d = decide(&sim.o, &SETTINGS);
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
    }
    let mut o = sim.o.clone();
    let mut status = o.request.status.clone().unwrap();
    assert!(status.recreated_stateful_set_uid.is_some());
    // A copy of our set (marker included) applied by someone else after ours was deleted.
    status.stage = Stage::RecreatingStatefulSet;
    o.request.status = Some(status);
    let mut copy = o.stateful_set.clone().unwrap();
    copy.update(|s| s.metadata.uid = Some("uid-copy".into()));
    o.stateful_set = Some(copy);
    let d = decide(&o, &SETTINGS);
    assert!(only_status_and_events(&d), "{:?}", d.actions);
    let (_, reason, message) = blocked(first_status(&d)).unwrap();
    assert_eq!(reason, "ForeignStatefulSet");
    assert!(message.contains("uid-copy") && message.contains("recreating the StatefulSet"));
}

/// Moves the simulated clock past the request's timeout of 30m.
fn expire(sim: &mut Sim) {
    sim.o.now = Timestamp::from_second(sim.o.now.as_second() + 3600).unwrap();
}

fn failed_message(sim: &Sim) -> String {
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Failed, "{s:?}");
    s.message.unwrap_or_default()
}

#[test]
fn the_timeout_while_blocked_rolls_back_naming_the_set_and_leaves_it_alone() {
    for step in HELD_STEPS {
        let mut sim = Sim::at(step);
        sim.o.stateful_set = Some(foreign_set());
        sim.run(3);
        assert_eq!(sim.step_of("etcd-0"), step, "blocked");
        expire(&mut sim);
        let from = sim.log.len();
        assert!(sim.run(200) < 200, "{step:?}: the rollback ends");
        let message = failed_message(&sim);
        assert!(
            message.starts_with(
                "failed: the request's timeout of 30m expired while it was blocked: StatefulSet \
                 etcd (uid uid-foreign) was created by someone else"
            ),
            "{step:?}: {message}"
        );
        assert!(
            message.contains(
                "StatefulSet etcd (uid uid-foreign) was created by someone else and is left alone"
            ),
            "{message}"
        );
        assert_eq!(
            sim.o.stateful_set.as_ref().and_then(|s| s.uid()).as_deref(),
            Some(FOREIGN_UID)
        );
        assert!(
            !sim.log[from..].iter().any(|a| matches!(
                a,
                Action::Create(Object::StatefulSet(_)) | Action::Create(Object::Pod(_))
            )),
            "{step:?}: nothing of ours created over the foreign set: {:?}",
            &sim.log[from..]
        );
        // Every claim still has its data: on its original volume, or (swapped) on the new one.
        for i in 0..3 {
            let claim = &sim.o.claims[&format!("data-etcd-{i}")];
            let volume = claim_volume(claim).unwrap().to_string();
            assert!(sim.o.volumes.contains_key(&volume), "{step:?}: {volume}");
        }
        // From DeletingOldClaim on (RetainingVolumes done) the old volume stays on Retain.
        let old = &sim.o.volumes["pv-old-0"];
        assert!(step <= MemberStep::RetainingVolumes || volume_policy(old) == "Retain");
    }
}

#[test]
fn a_pod_back_on_the_old_claim_after_the_copy_rolls_back_and_holds_the_member_there() {
    for step in [MemberStep::RetainingVolumes, MemberStep::DeletingOldClaim] {
        let mut sim = Sim::at(step);
        sim.o.stateful_set = Some(foreign_set());
        sim.o
            .pods
            .insert("etcd-0".into(), pod_of_foreign_set(0, "uid-back"));
        let d = decide(&sim.o, &SETTINGS);
        let s = first_status(&d);
        assert_eq!(s.stage, Stage::RollingBack);
        assert!(
            s.failure.as_deref().unwrap().starts_with(
                "member etcd-0 ran again after its final copy (pod etcd-0 (uid uid-back, \
                 controlled by StatefulSet etcd (uid uid-foreign))): the copy is stale"
            ),
            "{:?}",
            s.failure
        );
        let from = sim.log.len();
        assert!(sim.run(200) < 200, "{step:?}: the rollback ends");
        assert!(
            !sim.log[from..].iter().any(|a| matches!(
                a,
                Action::Delete { kind: Kind::Claim, name, .. } if name == "data-etcd-0"
            )),
            "the old claim the pod uses is never deleted"
        );
        assert_eq!(claim_volume(&sim.o.claims["data-etcd-0"]), Some("pv-old-0"));
        let message = failed_message(&sim);
        assert!(
            message.contains(
                "etcd-0 held on its old claim data-etcd-0 (volume pv-old-0, reclaim policy"
            ),
            "{message}"
        );
        let held = members_of(&sim)[0].held.clone().unwrap();
        assert!(held.contains("uid-back"), "{held}");
        // Even with the pod gone again, a held member is not carried forward.
        sim.o.pods.remove("etcd-0");
        assert_eq!(sim.step_of("etcd-0"), step);
    }
}

#[test]
fn a_pod_of_a_foreign_set_during_the_copy_rolls_the_member_back_naming_the_set() {
    let mut sim = Sim::at(MemberStep::Copying);
    sim.o.stateful_set = Some(foreign_set());
    sim.o
        .pods
        .insert("etcd-0".into(), pod_of_foreign_set(0, "uid-back"));
    let d = decide(&sim.o, &SETTINGS);
    let s = first_status(&d);
    assert_eq!(s.stage, Stage::RollingBack);
    assert_eq!(
        s.failure.as_deref(),
        Some(
            "pod etcd-0 (uid uid-back, controlled by StatefulSet etcd (uid uid-foreign)) came \
             back during the copy of member etcd-0: the member is rolled back to its old claim \
             (runbook: docs/runbook.md#failed-a-member-pod-came-back-stale-copy)"
        )
    );
    assert!(sim.run(200) < 200, "the rollback ends");
    assert_eq!(sim.step_of("etcd-0"), MemberStep::RolledBack);
    assert_eq!(claim_volume(&sim.o.claims["data-etcd-0"]), Some("pv-old-0"));
    assert_eq!(sim.o.pods["etcd-0"].uid().as_deref(), Some("uid-back"));
    failed_message(&sim);
}

/// The set is read before the pods: a snapshot may hold the pod a foreign set just started but
/// not the set. The pod's controller reference still names the set.
#[test]
fn a_pod_of_a_foreign_set_seen_before_its_set_still_names_the_set() {
    let mut sim = Sim::at(MemberStep::Copying);
    sim.o
        .pods
        .insert("etcd-0".into(), pod_of_foreign_set(0, "uid-back"));
    let d = decide(&sim.o, &SETTINGS);
    let s = first_status(&d);
    assert_eq!(s.stage, Stage::RollingBack);
    let failure = s.failure.clone().unwrap_or_default();
    assert!(
        failure.contains("controlled by StatefulSet etcd (uid uid-foreign)"),
        "{failure}"
    );
}

#[test]
fn a_claim_someone_else_created_during_the_swap_ends_the_rollback_holding_the_member() {
    let mut sim = Sim::at(MemberStep::RecreatingClaim);
    sim.o.stateful_set = Some(foreign_set());
    // The set's controller was quicker: an empty claim from its template, on another volume.
    let empty = bound_claim("data-etcd-0", "standard", "1Gi", "pv-empty");
    sim.o.claims.insert("data-etcd-0".into(), empty);
    sim.o
        .pods
        .insert("etcd-0".into(), pod_of_foreign_set(0, "uid-empty"));
    sim.run(3);
    expire(&mut sim);
    assert!(sim.run(200) < 200, "the rollback ends");
    let message = failed_message(&sim);
    assert!(
        message.contains("claim data-etcd-0 was created by someone else (volume pv-empty)")
            && message.contains("new volume pv-new-1 (verified copy, Retain)"),
        "{message}"
    );
}

#[test]
fn a_rollback_before_the_swap_with_a_foreign_set_creates_no_pod_and_ends() {
    let mut sim = Sim::at(MemberStep::Copying);
    sim.jobs.hang = true;
    sim.o.stateful_set = Some(foreign_set());
    expire(&mut sim);
    let from = sim.log.len();
    assert!(sim.run(200) < 200);
    assert_eq!(sim.step_of("etcd-0"), MemberStep::RolledBack);
    assert!(!sim.log[from..].iter().any(|a| matches!(
        a,
        Action::Create(Object::StatefulSet(_)) | Action::Create(Object::Pod(_))
    )));
    assert_eq!(claim_volume(&sim.o.claims["data-etcd-0"]), Some("pv-old-0"));
    failed_message(&sim);
}

#[test]
fn blocked_reasons_are_documented() {
    let doc = include_str!("../../docs/api.md");
    for r in foreign::BlockedReason::ALL {
        assert!(
            doc.contains(&format!("`{}`", r.as_str())),
            "{} not in docs/api.md",
            r.as_str()
        );
    }
}

#[test]
fn a_pod_of_a_foreign_set_at_every_step_blocks_or_fails_before_anything_is_touched() {
    for step in [
        MemberStep::CreatingClaim,
        MemberStep::PreCopying,
        MemberStep::GatingStop,
        MemberStep::StoppingPod,
        MemberStep::Copying,
        MemberStep::RetainingVolumes,
        MemberStep::DeletingOldClaim,
        MemberStep::DeletingTempClaim,
        MemberStep::ReleasingNewVolume,
        MemberStep::RecreatingClaim,
        MemberStep::RecreatingPod,
    ] {
        let sim = Sim::at_or_left_behind(step);
        let mut o = sim.o.clone();
        // The set itself is not in the snapshot (deleted in the background, its pod not yet).
        o.pods
            .insert("etcd-0".into(), pod_of_foreign_set(0, "uid-p"));
        let d = decide(&o, &SETTINGS);
        assert!(only_status_and_events(&d), "{step:?}: {:?}", d.actions);
        let s = first_status(&d);
        match step {
            // After the stop, with the old claim in place: the copy is stale, roll back now.
            MemberStep::Copying | MemberStep::RetainingVolumes | MemberStep::DeletingOldClaim => {
                assert_eq!(s.stage, Stage::RollingBack, "{step:?}");
                let failure = s.failure.clone().unwrap();
                assert!(failure.contains("etcd-0"), "{step:?}: {failure}");
            }
            _ => {
                assert_eq!((s.stage, s.members[0].step), (Stage::Migrating, step));
                let (status, reason, message) = blocked(s).unwrap();
                assert_eq!((status.as_str(), reason.as_str()), ("True", "ForeignPod"));
                assert!(
                    message.starts_with("pod etcd-0 (uid uid-p)"),
                    "{step:?}: {message}"
                );
            }
        }
    }
}

/// The run: the set came back while the old claim was already being deleted, and its pod
/// holds that claim. Forward: Blocked until the timeout; the rollback holds the member and ends.
#[test]
fn a_pod_on_an_old_claim_being_deleted_blocks_then_the_rollback_ends_holding_it() {
    let mut sim = Sim::at(MemberStep::DeletingOldClaim);
    sim.o.stateful_set = Some(foreign_set());
    sim.o
        .pods
        .insert("etcd-0".into(), pod_of_foreign_set(0, "uid-back"));
    let claim = sim.o.claims.get_mut("data-etcd-0").unwrap();
    claim.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(5)));
    let d = decide(&sim.o, &SETTINGS);
    assert!(only_status_and_events(&d), "{:?}", d.actions);
    let s = first_status(&d);
    assert_eq!(s.stage, Stage::Migrating);
    assert_eq!(blocked(s).unwrap().1, "ForeignStatefulSet");
    sim.run(3);
    expire(&mut sim);
    assert!(sim.run(200) < 200, "the rollback ends");
    let message = failed_message(&sim);
    assert!(
        message.contains("held on its old claim data-etcd-0")
            && message.contains("the claim is being deleted or gone")
            && message.contains("uid-back"),
        "{message}"
    );
    assert_eq!(sim.step_of("etcd-0"), MemberStep::DeletingOldClaim);
}
