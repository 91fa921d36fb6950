//! Every stage bounded: `--stage-timeout` on recreating the StatefulSet, the final cleanup and
//! the rollback, and a member pod stuck terminating on a lost node (force-deleted only when
//! the Node is gone, tainted out-of-service or the request allows it, the member then rolls
//! back; else the request waits, condition `NodeLost`).

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

/// Runs exactly `rounds` decisions, with member pod `pod` hanging as in
/// [`run_with_pod_hanging`].
fn run_rounds(sim: &mut Sim, pod: &str, rounds: usize) {
    let left = std::cell::Cell::new(rounds);
    run_with_pod_hanging(sim, pod, rounds + 1, |_| {
        let l = left.get();
        left.set(l.saturating_sub(1));
        l == 0
    });
}

fn forced(sim: &Sim, pod: &str) -> usize {
    (sim.log.iter())
        .filter(|a| matches!(a, Action::ForceDeletePod { name, .. } if name == pod))
        .count()
}

fn tainted_out_of_service(mut node: Node) -> Node {
    node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
        taints: Some(vec![k8s_openapi::api::core::v1::Taint {
            key: helpers::OUT_OF_SERVICE_TAINT.into(),
            value: Some("nodeshutdown".into()),
            effect: "NoExecute".into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    node
}

/// The request waits on member pod `pod` stuck on a lost node: the condition `NodeLost`
/// names the node and says how to go on, one Event, and nothing is force-deleted.
fn assert_waits_for_the_node(sim: &Sim, pod: &str) {
    assert!(!sim.phase().is_final(), "{:?}", sim.status().message);
    assert_eq!(forced(sim, pod), 0, "{:?}", sim.log);
    let s = sim.status();
    let c = crate::api::conditions::get(&s.conditions, crate::api::conditions::NODE_LOST)
        .expect("condition NodeLost");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "WaitingForLostNode")
    );
    for part in [
        &format!("member pod {pod} is stuck terminating on node node-a"),
        "kubectl taint nodes node-a node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
        "kubectl delete node node-a",
        "spec.forceDeleteOnLostNode: true",
    ] {
        assert!(c.message.contains(part), "{part:?} not in {}", c.message);
    }
    let waiting = sim
        .reasons()
        .iter()
        .filter(|r| **r == "WaitingForLostNode")
        .count();
    assert_eq!(waiting, 1, "one Event: {:?}", sim.reasons());
}

#[test]
fn a_pod_stopping_on_an_unreachable_node_waits_until_the_node_is_tainted_out_of_service() {
    let mut sim = Sim::at(MemberStep::StoppingPod);
    run_with_pod_hanging(&mut sim, "etcd-0", 20, |s| terminating(s, "etcd-0"));
    let bound = sim.settings.helper_start_timeout.as_secs();
    // Its node still Ready: its kubelet will finish; nothing is forced, however long.
    sim.o.nodes = BTreeMap::from([("node-a".to_string(), Some(node("node-a", "True")))]);
    sim.o.now = later(sim.o.now, 30 + bound + 100);
    run_rounds(&mut sim, "etcd-0", 5);
    assert_eq!(sim.step_of("etcd-0"), MemberStep::StoppingPod);
    assert_eq!(forced(&sim, "etcd-0"), 0);
    // The node stops heartbeating (Ready Unknown): it may only be partitioned, so the request
    // waits, however long, within its timeout.
    sim.o.nodes = BTreeMap::from([("node-a".to_string(), Some(node("node-a", "Unknown")))]);
    run_rounds(&mut sim, "etcd-0", 30);
    assert_eq!(sim.step_of("etcd-0"), MemberStep::StoppingPod);
    assert_waits_for_the_node(&sim, "etcd-0");
    // Once tainted out-of-service (non-graceful node shutdown), it is force-deleted.
    let down = tainted_out_of_service(node("node-a", "Unknown"));
    sim.o.nodes = BTreeMap::from([("node-a".to_string(), Some(down))]);
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
    assert_eq!(forced(&sim, "etcd-0"), 1, "{:?}", sim.log);
    assert!(sim.reasons().contains(&"PodForceDeleted"));
    let (_, why) = (sim.events.iter())
        .find(|(r, _)| r == "PodForceDeleted")
        .unwrap();
    assert!(why.contains("node.kubernetes.io/out-of-service"), "{why}");
    let c = crate::api::conditions::get(&s.conditions, crate::api::conditions::NODE_LOST).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "Resolved")
    );
    assert_rolled_back(&sim);
    assert_eq!(sim.o.claims.len(), 3, "temporary claim deleted");
    assert!(sim.o.jobs.is_empty());
}

/// The request waits on etcd-0 stuck terminating on node-a (Unknown); then, with node-a as
/// `then`, the pod is deleted by something else (the pod garbage collector of a node tainted
/// out-of-service wins the race with the operator's own force-delete).
fn pod_deleted_by_another_while_waiting(then: Option<Node>) -> Sim {
    let mut sim = Sim::at(MemberStep::StoppingPod);
    run_with_pod_hanging(&mut sim, "etcd-0", 20, |s| terminating(s, "etcd-0"));
    sim.o.nodes = BTreeMap::from([("node-a".to_string(), Some(node("node-a", "Unknown")))]);
    sim.o.now = later(
        sim.o.now,
        30 + sim.settings.helper_start_timeout.as_secs() + 1,
    );
    run_rounds(&mut sim, "etcd-0", 3);
    assert_waits_for_the_node(&sim, "etcd-0");
    sim.o.pods.remove("etcd-0");
    sim.o.nodes = BTreeMap::from([("node-a".to_string(), then)]);
    sim
}

fn copy_jobs(sim: &Sim) -> usize {
    (sim.log.iter())
        .filter(|a| matches!(a, Action::Create(Object::Job(_))))
        .count()
}

#[test]
fn a_member_pod_deleted_by_another_while_its_node_is_still_down_fails_without_a_copy() {
    for down in [
        Some(tainted_out_of_service(node("node-a", "Unknown"))),
        Some(node("node-a", "Unknown")),
        None,
    ] {
        let mut sim = pod_deleted_by_another_while_waiting(down.clone());
        let jobs_before = copy_jobs(&sim);
        run_rounds(&mut sim, "etcd-0", 400);
        let s = sim.status();
        assert_eq!(s.phase, Phase::Failed, "{down:?}: {:?}", s.message);
        let failure = s.failure.clone().unwrap();
        let state = match &down {
            None => "gone",
            Some(n) if n.spec.is_some() => "Unknown, tainted node.kubernetes.io/out-of-service",
            Some(_) => "Unknown",
        };
        for part in [
            "member pod etcd-0 was deleted by something else while it was stuck terminating",
            &format!("its node node-a is {state}: the copy cannot run on that node"),
            "failed-a-members-node-was-lost-while-its-pod-stopped",
        ] {
            assert!(failure.contains(part), "{part:?} not in {failure}");
        }
        assert_eq!(copy_jobs(&sim), jobs_before, "no copy Job: {:?}", sim.log);
        assert_eq!(forced(&sim, "etcd-0"), 0, "nothing left to force");
        assert_rolled_back(&sim);
    }
}

/// etcd-0 rolled back: its data on its original volume (the final message says so), the
/// StatefulSet recreated.
fn assert_rolled_back(sim: &Sim) {
    assert_eq!(sim.step_of("etcd-0"), MemberStep::RolledBack);
    let message = sim.status().message.clone().unwrap();
    assert!(
        message.contains("etcd-0 on claim data-etcd-0 -> original volume pv-old-0"),
        "{message}"
    );
    assert!(sim.o.stateful_set.is_some(), "StatefulSet recreated");
}

#[test]
fn a_member_pod_gone_once_its_node_answers_again_is_copied() {
    // Its node Ready again, or only NotReady (a kubelet that reports): the copy goes on.
    for back in [node("node-a", "True"), node("node-a", "False")] {
        let mut sim = pod_deleted_by_another_while_waiting(Some(back));
        // Waiting for the lost node with the pod gone: its planned node is read.
        let read = super::observe::nodes_to_judge(&sim.status(), &sim.o.pods, &BTreeMap::new());
        assert_eq!(read.into_iter().collect::<Vec<_>>(), ["node-a"]);
        run_rounds(&mut sim, "etcd-0", 1);
        assert_eq!(sim.step_of("etcd-0"), MemberStep::Copying, "{:?}", sim.log);
        let s = sim.status();
        assert!(s.failure.is_none(), "{:?}", s.failure);
        let c = crate::api::conditions::get(&s.conditions, crate::api::conditions::NODE_LOST);
        assert_eq!(c.map(|c| c.status.as_str()), Some("False"));
        // No longer waiting: no node is read.
        let read = super::observe::nodes_to_judge(&s, &sim.o.pods, &BTreeMap::new());
        assert!(read.is_empty(), "{read:?}");
    }
}

#[test]
fn a_pod_on_a_not_ready_node_is_forced_only_when_the_node_is_gone_tainted_or_the_request_allows_it()
{
    // (node as observed, spec.forceDeleteOnLostNode, forced)
    let cases: [(Option<Node>, bool, bool); 5] = [
        (Some(node("node-a", "False")), false, false),
        (Some(node("node-a", "Unknown")), false, false),
        (
            Some(tainted_out_of_service(node("node-a", "False"))),
            false,
            true,
        ),
        (None, false, true),
        (Some(node("node-a", "False")), true, true),
    ];
    for (n, allow, want) in cases {
        let mut sim = Sim::at(MemberStep::StoppingPod);
        run_with_pod_hanging(&mut sim, "etcd-0", 20, |s| terminating(s, "etcd-0"));
        // Set while the request runs: read from the current spec.
        sim.o.request.spec.force_delete_on_lost_node = allow;
        sim.o.nodes = BTreeMap::from([("node-a".to_string(), n.clone())]);
        sim.o.now = later(
            sim.o.now,
            30 + sim.settings.helper_start_timeout.as_secs() + 1,
        );
        if want {
            run_with_pod_hanging(&mut sim, "etcd-0", 400, |s| s.phase().is_final());
            assert_eq!(forced(&sim, "etcd-0"), 1, "{n:?} {allow}");
            assert_eq!(
                sim.step_of("etcd-0"),
                MemberStep::RolledBack,
                "{n:?} {allow}"
            );
        } else {
            run_rounds(&mut sim, "etcd-0", 30);
            assert_eq!(sim.step_of("etcd-0"), MemberStep::StoppingPod, "{n:?}");
            assert_waits_for_the_node(&sim, "etcd-0");
        }
    }
}

#[test]
fn the_rollback_does_not_force_delete_a_pod_on_an_unreachable_node_until_the_node_is_gone() {
    let mut sim = Sim::at(MemberStep::StoppingPod);
    run_with_pod_hanging(&mut sim, "etcd-0", 20, |s| terminating(s, "etcd-0"));
    sim.o.nodes = BTreeMap::from([("node-a".to_string(), Some(node("node-a", "False")))]);
    sim.o
        .request
        .annotations_mut()
        .insert(crate::labels::ABORT_ANNOTATION.into(), "true".into());
    sim.o.now = later(
        sim.o.now,
        30 + sim.settings.helper_start_timeout.as_secs() + 1,
    );
    run_rounds(&mut sim, "etcd-0", 30);
    assert_eq!(sim.status().stage, Stage::RollingBack);
    assert_waits_for_the_node(&sim, "etcd-0");
    // The Node object deleted: the pod garbage collector's own case.
    sim.o.nodes = BTreeMap::from([("node-a".to_string(), None)]);
    run_with_pod_hanging(&mut sim, "etcd-0", 400, |s| s.phase().is_final());
    assert_eq!(sim.phase(), Phase::Failed);
    assert_eq!(forced(&sim, "etcd-0"), 1, "{:?}", sim.log);
    assert_eq!(sim.step_of("etcd-0"), MemberStep::RolledBack);
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

#[test]
fn setting_force_delete_on_lost_node_while_running_is_not_an_ignored_spec_change() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    sim.run(5);
    sim.o.request.spec.force_delete_on_lost_node = true;
    sim.o.request.metadata.generation = Some(2);
    let d = decide(&sim.o, &sim.settings);
    let s = first_status(&d);
    assert!(
        crate::api::conditions::get(&s.conditions, "SpecChangeIgnored").is_none(),
        "{:?}",
        s.conditions
    );
    // With another change, only that one is named.
    sim.o.request.spec.storage_class_change = spec_class_change("slow").storage_class_change;
    sim.o.request.metadata.generation = Some(3);
    let d = decide(&sim.o, &sim.settings);
    let s = first_status(&d);
    let c = crate::api::conditions::get(&s.conditions, "SpecChangeIgnored").unwrap();
    assert!(
        c.message.contains(": spec.storageClassChange differ from")
            && !c.message.contains("forceDeleteOnLostNode"),
        "{}",
        c.message
    );
}
