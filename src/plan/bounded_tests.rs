//! Every stage bounded: `--stage-timeout` on recreating the StatefulSet, the final cleanup and
//! the rollback, and a member pod stuck terminating on a lost node (force-deleted, the member
//! rolls back).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::fixtures::*;
use super::*;
use crate::api::{DataState, Phase, Stage};

fn later(now: Timestamp, secs: u64) -> Timestamp {
    now + SignedDuration::from_secs(i64::try_from(secs).unwrap())
}

fn node(name: &str, ready: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Runs decisions until `done` holds (at most `max`), applying every action except the
/// deletion of member pod `pod`, which leaves it terminating with a grace period of 30 s (its
/// kubelet never confirms it).
fn run_with_pod_hanging(sim: &mut Sim, pod: &str, max: usize, done: impl Fn(&Sim) -> bool) {
    for _ in 0..max {
        if done(sim) {
            return;
        }
        let d = decide(&sim.o, &sim.settings);
        for a in &d.actions {
            match a {
                Action::Delete {
                    kind: Kind::Pod,
                    name,
                    ..
                } if name == pod => {
                    let now = sim.o.now;
                    if let Some(p) = sim.o.pods.get_mut(pod) {
                        p.update(|p| {
                            p.metadata.deletion_timestamp.get_or_insert(Time(now));
                            p.metadata.deletion_grace_period_seconds = Some(30);
                        });
                    }
                }
                _ => sim.apply(a),
            }
        }
        sim.settle();
    }
    assert!(done(sim), "not reached in {max} rounds: {:?}", sim.status());
}

fn terminating(sim: &Sim, pod: &str) -> bool {
    sim.o
        .pods
        .get(pod)
        .is_some_and(|p| p.typed().metadata.deletion_timestamp.is_some())
}

#[test]
fn a_pod_stopping_on_a_lost_node_is_force_deleted_and_its_member_rolls_back() {
    let mut sim = Sim::at(MemberStep::StoppingPod);
    run_with_pod_hanging(&mut sim, "etcd-0", 20, |s| terminating(s, "etcd-0"));
    let bound = sim.settings.helper_start_timeout.as_secs();
    // Its node still Ready: its kubelet will finish; nothing is forced, however long.
    sim.o.nodes = BTreeMap::from([("node-a".to_string(), Some(node("node-a", "True")))]);
    sim.o.now = later(sim.o.now, 30 + bound + 100);
    run_with_pod_hanging(&mut sim, "etcd-0", 5, |_| false.then_some(()).is_none());
    assert_eq!(sim.step_of("etcd-0"), MemberStep::StoppingPod);
    assert!(
        !sim.log
            .iter()
            .any(|a| matches!(a, Action::ForceDeletePod { .. }))
    );
    // The node stops heartbeating: Ready Unknown.
    sim.o.nodes = BTreeMap::from([("node-a".to_string(), Some(node("node-a", "Unknown")))]);
    run_with_pod_hanging(&mut sim, "etcd-0", 400, |s| s.phase().is_final());
    let s = sim.status();
    assert_eq!(s.phase, Phase::Failed, "{:?}", s.message);
    let failure = s.failure.clone().unwrap();
    assert!(
        failure.contains("member pod etcd-0 was still terminating")
            && failure.contains("its node node-a is Unknown")
            && failure.contains("failed-a-members-node-was-lost-while-its-pod-stopped"),
        "{failure}"
    );
    let forced: Vec<&Action> = (sim.log.iter())
        .filter(|a| matches!(a, Action::ForceDeletePod { name, .. } if name == "etcd-0"))
        .collect();
    assert_eq!(forced.len(), 1, "{forced:?}");
    assert!(sim.reasons().contains(&"PodForceDeleted"));
    assert_eq!(sim.step_of("etcd-0"), MemberStep::RolledBack);
    let message = s.message.clone().unwrap();
    assert!(
        message.contains("etcd-0 on claim data-etcd-0 -> original volume pv-old-0"),
        "{message}"
    );
    assert!(sim.o.stateful_set.is_some(), "StatefulSet recreated");
    assert_eq!(sim.o.claims.len(), 3, "temporary claim deleted");
    assert!(sim.o.jobs.is_empty());
}

#[test]
fn a_gone_node_counts_as_lost_and_a_fresh_pod_is_never_forced() {
    let mut sim = Sim::at(MemberStep::StoppingPod);
    run_with_pod_hanging(&mut sim, "etcd-0", 20, |s| terminating(s, "etcd-0"));
    sim.o.nodes = BTreeMap::from([("node-a".to_string(), None)]);
    // Within its grace period plus the bound: waiting.
    let d = decide(&sim.o, &sim.settings);
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::SetStatus(s) if s.failure.is_some()))
    );
    sim.o.now = later(
        sim.o.now,
        30 + sim.settings.helper_start_timeout.as_secs() + 1,
    );
    let d = decide(&sim.o, &sim.settings);
    let status = first_status(&d);
    assert_eq!(status.stage, Stage::RollingBack);
    assert!(status.failure.unwrap().contains("node node-a is gone"));
}

fn first_status(d: &Decision) -> crate::api::StorageMigrationRequestStatus {
    d.actions
        .iter()
        .find_map(|a| match a {
            Action::SetStatus(s) => Some((**s).clone()),
            _ => None,
        })
        .expect("a status write")
}

#[test]
fn a_rollback_that_waits_past_the_stage_timeout_gives_up_saying_for_what() {
    let mut sim = Sim::at(MemberStep::StoppingPod);
    run_with_pod_hanging(&mut sim, "etcd-0", 20, |s| terminating(s, "etcd-0"));
    // Its node is Ready but its kubelet never finishes the deletion: not a lost node.
    sim.o.nodes = BTreeMap::from([("node-a".to_string(), Some(node("node-a", "True")))]);
    sim.o
        .request
        .annotations_mut()
        .insert(crate::labels::ABORT_ANNOTATION.into(), "true".into());
    run_with_pod_hanging(&mut sim, "etcd-0", 20, |s| {
        s.status().stage == Stage::RollingBack
    });
    let started = sim.status().stage_started.clone().unwrap();
    run_with_pod_hanging(&mut sim, "etcd-0", 10, |_| false.then_some(()).is_none());
    assert_eq!(
        sim.status().stage,
        Stage::RollingBack,
        "waiting for the pod"
    );
    sim.o.now = later(started.0, sim.settings.stage_timeout.as_secs() + 1);
    run_with_pod_hanging(&mut sim, "etcd-0", 5, |s| s.phase().is_final());
    let s = sim.status();
    assert_eq!(s.phase, Phase::Failed);
    let message = s.message.clone().unwrap();
    for part in [
        "aborted",
        "rollback gave up after 10m (--stage-timeout): still waiting for member pod etcd-0 to \
         finish terminating (node node-a)",
        "StatefulSet etcd was not recreated: recreate it from ConfigMap",
        "failed-the-rollback-gave-up",
        "etcd-0 on claim data-etcd-0 -> original volume pv-old-0",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
    assert!(sim.reasons().contains(&"RollbackGaveUp"));
    assert_eq!(
        s.members[0]
            .first_claim
            .data_location
            .as_ref()
            .map(|l| l.state),
        Some(DataState::Untouched)
    );
}

/// Runs until the request is in `stage`.
fn run_to_stage(sim: &mut Sim, stage: Stage) {
    for _ in 0..600 {
        if sim.status().stage == stage {
            return;
        }
        let d = decide(&sim.o, &sim.settings);
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
    }
    panic!("stage {stage:?} not reached: {:?}", sim.status());
}

#[test]
fn a_statefulset_that_never_adopts_its_pods_rolls_back_after_the_stage_timeout() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    run_to_stage(&mut sim, Stage::RecreatingStatefulSet);
    let entered = sim.status().stage_started.clone().unwrap();
    // Created, but its controller never reports the pods (status replicas 0).
    for _ in 0..5 {
        let d = decide(&sim.o, &sim.settings);
        for a in &d.actions {
            sim.apply(a);
        }
        if let Some(set) = sim.o.stateful_set.as_mut() {
            set.update(|s| {
                s.status = Some(k8s_openapi::api::apps::v1::StatefulSetStatus {
                    observed_generation: Some(1),
                    replicas: 0,
                    ..Default::default()
                })
            });
        }
        sim.o.now = later(sim.o.now, 1);
    }
    assert_eq!(sim.status().stage, Stage::RecreatingStatefulSet);
    sim.o.now = later(entered.0, sim.settings.stage_timeout.as_secs() + 1);
    let d = decide(&sim.o, &sim.settings);
    let status = first_status(&d);
    assert_eq!(status.stage, Stage::RollingBack);
    let failure = status.failure.unwrap();
    assert!(
        failure.contains(
            "stage RecreatingStatefulSet did not end within 10m (--stage-timeout): still \
             waiting for StatefulSet etcd to adopt its pods (it owns 0 of 3"
        ) && failure.contains("failed-a-stage-timed-out"),
        "{failure}"
    );
    for a in &d.actions {
        sim.apply(a);
    }
    sim.run(50);
    let s = sim.status();
    assert_eq!(s.phase, Phase::Failed, "{:?}", s.message);
    assert!((s.members.iter()).all(
        |m| m.first_claim.data_location.as_ref().map(|l| l.state) == Some(DataState::Migrated)
    ));
}

#[test]
fn a_cleanup_that_waits_past_the_stage_timeout_ends_successful_naming_the_leftovers() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    run_to_stage(&mut sim, Stage::Finalizing);
    let (name, mut job) = job("stuck-job", "copy", JobOutcome::Running);
    job.job.metadata.deletion_timestamp = Some(Time(sim.o.now));
    sim.o.jobs.insert(name, job);
    let entered = sim.status().stage_started.clone().unwrap();
    sim.run(10);
    assert_eq!(sim.status().stage, Stage::Finalizing, "waiting for the Job");
    sim.o.now = later(entered.0, sim.settings.stage_timeout.as_secs() + 1);
    sim.run(5);
    let s = sim.status();
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    let message = s.message.unwrap();
    assert!(
        message.contains(
            "the cleanup gave up after 10m (--stage-timeout), left behind: Job stuck-job"
        ),
        "{message}"
    );
    assert!(sim.reasons().contains(&"CleanupIncomplete"));
}

#[test]
fn a_rollback_carried_past_a_swap_that_gives_up_says_the_swap_was_interrupted() {
    let mut sim = Sim::at(MemberStep::ReleasingNewVolume);
    sim.o
        .request
        .annotations_mut()
        .insert(crate::labels::ABORT_ANNOTATION.into(), "true".into());
    // The aborted request is past its swap: carried forward in the rollback, which gives up
    // before it could.
    let d = decide(&sim.o, &sim.settings);
    for a in &d.actions {
        sim.apply(a);
    }
    assert_eq!(sim.status().stage, Stage::RollingBack);
    let started = sim.status().stage_started.clone().unwrap();
    sim.o.now = later(started.0, sim.settings.stage_timeout.as_secs() + 1);
    let d = decide(&sim.o, &sim.settings);
    let status = first_status(&d);
    assert_eq!(status.phase, Phase::Failed);
    let location = status.members[0].first_claim.data_location.clone().unwrap();
    assert_eq!(location.state, DataState::SwapInterrupted);
    assert!(status.message.unwrap().contains("swap interrupted at step"));
}

#[test]
fn a_copy_pod_stuck_terminating_on_a_lost_node_is_force_deleted_by_the_rollback() {
    let mut sim = Sim::at(MemberStep::Copying);
    // The copy Job's pod, on the member's node, stuck terminating since the node went down.
    let job = crate::build::job_name(REQ, "etcd-0", crate::build::JobKind::Copy);
    let mut pod = k8s_openapi::api::core::v1::Pod {
        metadata: ObjectMeta {
            name: Some(format!("{job}-x")),
            uid: Some("uid-copy".into()),
            labels: Some(BTreeMap::from([
                ("job-name".to_string(), job.clone()),
                (
                    crate::labels::MEMBER_LABEL.to_string(),
                    "etcd-0".to_string(),
                ),
            ])),
            creation_timestamp: Some(Time(sim.o.now)),
            deletion_timestamp: Some(Time(sim.o.now)),
            deletion_grace_period_seconds: Some(30),
            ..Default::default()
        },
        ..Default::default()
    };
    pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
        node_name: Some("node-a".into()),
        ..Default::default()
    });
    sim.o.helper_pods.insert(format!("{job}-x"), pod);
    sim.o.nodes = BTreeMap::from([("node-a".to_string(), None)]);
    sim.o
        .request
        .annotations_mut()
        .insert(crate::labels::ABORT_ANNOTATION.into(), "true".into());
    let d = decide(&sim.o, &sim.settings);
    for a in &d.actions {
        sim.apply(a);
    }
    assert_eq!(sim.status().stage, Stage::RollingBack);
    // Within its grace period plus the bound: left alone.
    let d = decide(&sim.o, &sim.settings);
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::ForceDeletePod { .. }))
    );
    sim.o.now = later(
        sim.o.now,
        30 + sim.settings.helper_start_timeout.as_secs() + 1,
    );
    let d = decide(&sim.o, &sim.settings);
    assert!(
        d.actions.iter().any(|a| matches!(a,
            Action::ForceDeletePod { name, uid } if *name == format!("{job}-x")
                && uid.as_deref() == Some("uid-copy"))),
        "{:?}",
        d.actions
    );
}
