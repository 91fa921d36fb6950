//! Planner tests: table-driven denials, first actions of each stage and step, whole runs on the
//! simulated cluster (success, crash at every point, failure before/after the swap, timeout,
//! deletion, spec change), and the paths the 1.20 test cluster cannot show (retention policy).

use k8s_openapi::api::apps::v1::StatefulSetPersistentVolumeClaimRetentionPolicy;
use k8s_openapi::api::core::v1::PodCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::ResourceExt;

use std::collections::BTreeSet;

use super::fixtures::*;
use super::member::{BIND_NUDGE_FALLBACK_SECONDS, BIND_NUDGE_LOST_RACE_SECONDS, SWAP_POLL};
use super::*;
use crate::api::{ApplyPolicy, LeaderChangeKind, MemberStatus, Phase, Stage};
use crate::build::{self, JobKind};
use crate::engine::{FinalHashError, HealthUnavailable, Role};
use crate::labels;

fn first_status(d: &Decision) -> &StorageMigrationRequestStatus {
    match d.actions.first() {
        Some(Action::SetStatus(s)) => s,
        other => panic!("expected SetStatus first, got {other:?}"),
    }
}

fn denial_reason(d: &Decision) -> (String, String) {
    let s = first_status(d);
    assert_eq!(s.phase, Phase::Denied, "{s:?}");
    let c = conditions::get(&s.conditions, conditions::ACCEPTED).unwrap();
    assert_eq!(c.status, "False");
    assert!(
        d.actions
            .iter()
            .any(|a| matches!(a, Action::Event { reason, .. } if reason == "Denied"))
    );
    (c.reason.clone(), c.message.clone())
}

/// Every status the planner wrote during the run moved the stage and each member's step only
/// along the transitions of [`machine`].
pub(super) fn assert_machine_transitions(sim: &Sim) {
    let mut stage = Stage::Preflight;
    let mut steps: std::collections::BTreeMap<String, MemberStep> = Default::default();
    for a in &sim.log {
        let Action::SetStatus(s) = a else {
            continue;
        };
        assert!(
            s.stage == stage || machine::stage_allowed(stage, s.stage),
            "stage {stage:?} -> {:?} is not in machine::STAGES",
            s.stage
        );
        stage = s.stage;
        for m in &s.members {
            let from = steps.get(&m.pod).copied().unwrap_or_default();
            assert!(
                m.step == from || machine::steps_passed(from, m.step).is_some(),
                "member {}: {from:?} -> {:?} is not in machine::STEPS",
                m.pod,
                m.step
            );
            steps.insert(m.pod.clone(), m.step);
        }
    }
}

fn not_ready(o: &mut Observed, pod: &str) {
    o.pods.get_mut(pod).unwrap().update(|p| {
        p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "False".into(),
            ..Default::default()
        }]);
    });
    o.health = Ok(generic_report(&o.pods));
}

#[test]
fn denials_name_the_problem() {
    type Tweak = fn(&mut Observed);
    let cases: Vec<(&str, Tweak, &str, &str)> = vec![
        (
            "type without its block",
            |o| o.request.spec.storage_class_change = None,
            "InvalidSpec",
            "storageClassName",
        ),
        (
            "both blocks",
            |o| o.request.spec.shrink = spec_shrink("1Mi").shrink,
            "InvalidSpec",
            "spec.shrink",
        ),
        (
            "bad timeout",
            |o| o.request.spec.timeout = "soon".into(),
            "InvalidSpec",
            "spec.timeout",
        ),
        (
            "bad size",
            |o| o.request.spec = spec_shrink("small"),
            "InvalidSpec",
            "small",
        ),
        (
            "no target",
            |o| o.stateful_set = None,
            "TargetNotFound",
            "etcd",
        ),
        (
            "unknown template",
            |o| o.request.spec.volume_claim_template = Some("logs".into()),
            "TemplateNotFound",
            "logs",
        ),
        (
            "two templates, the second's claims missing",
            |o| {
                o.stateful_set.as_mut().unwrap().update(|s| {
                    let spec = s.spec.as_mut().unwrap();
                    let mut logs = claim_template("standard", "1Gi");
                    logs.metadata.name = Some("logs".into());
                    spec.volume_claim_templates.as_mut().unwrap().push(logs);
                });
            },
            // Every template moves when none is named: its claims must be there.
            "ClaimNotFound",
            "claim logs-etcd-0 of member etcd-0 does not exist",
        ),
        (
            "block volume",
            |o| {
                o.stateful_set.as_mut().unwrap().update(|s| {
                    let spec = s.spec.as_mut().unwrap();
                    spec.volume_claim_templates.as_mut().unwrap()[0]
                        .spec
                        .as_mut()
                        .unwrap()
                        .volume_mode = Some("Block".into());
                });
            },
            "UnsupportedVolumeMode",
            "Block",
        ),
        (
            "unknown class",
            |o| o.request.spec = spec_class_change("gold"),
            "StorageClassNotFound",
            "gold",
        ),
        (
            "same class",
            |o| o.request.spec = spec_class_change("standard"),
            "SameStorageClass",
            "already on StorageClass standard: nothing to do",
        ),
        (
            "WFFC source, Immediate target",
            |o| {
                for c in o.claims.values_mut() {
                    c.spec.as_mut().unwrap().storage_class_name = Some("fast".into());
                }
                o.request.spec = spec_class_change("slow");
            },
            "BindingModeMismatch",
            "fast",
        ),
        (
            "every member and the template already at the size",
            |o| o.request.spec = spec_shrink("1Gi"),
            "NotSmaller",
            "already request 1Gi: nothing to do",
        ),
        (
            "bigger than a claim",
            |o| o.request.spec = spec_shrink("2Gi"),
            "NotSmaller",
            "data-etcd-0",
        ),
        (
            "member pod missing",
            |o| {
                o.pods.remove("etcd-1");
            },
            "MemberMissing",
            "etcd-1",
        ),
        (
            "claim not bound",
            |o| {
                o.claims
                    .get_mut("data-etcd-2")
                    .unwrap()
                    .status
                    .as_mut()
                    .unwrap()
                    .phase = Some("Pending".into())
            },
            "ClaimNotBound",
            "data-etcd-2",
        ),
        (
            "member not ready",
            |o| not_ready(o, "etcd-2"),
            "NotHealthy",
            "etcd-2",
        ),
        (
            "health unreadable",
            |o| o.health = Err(HealthUnavailable::Engine("connection refused".into())),
            "NotHealthy",
            "connection refused",
        ),
    ];
    for (name, tweak, reason, needle) in cases {
        let mut o = observed(spec_class_change("fast"));
        tweak(&mut o);
        let d = decide(&o, &SETTINGS);
        let (got, message) = denial_reason(&d);
        assert_eq!(got, reason, "{name}: {message}");
        assert!(
            message.contains(needle),
            "{name}: {message:?} lacks {needle:?}"
        );
        // Nothing touched: only status, events, and measure-Job cleanup.
        assert!(
            d.actions.iter().all(|a| matches!(
                a,
                Action::SetStatus(_)
                    | Action::Event { .. }
                    | Action::Delete {
                        kind: Kind::Job,
                        ..
                    }
            )),
            "{name}: {:?}",
            d.actions
        );
    }
}

fn other(name: &str, created: i64, phase: Phase) -> OtherRequest {
    OtherRequest {
        name: name.into(),
        created: Some(t(created)),
        phase,
    }
}

/// The `Queued` condition of a status, as (status, reason, message).
fn queued_condition(s: &StorageMigrationRequestStatus) -> Option<(String, String, String)> {
    conditions::get(&s.conditions, conditions::QUEUED)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Every action of the log only writes the status or emits an Event: nothing was touched.
fn nothing_touched(actions: &[Action]) -> bool {
    actions
        .iter()
        .all(|a| matches!(a, Action::SetStatus(_) | Action::Event { .. }))
}

#[test]
fn a_younger_request_waits_for_an_older_bad_one_then_goes_when_it_is_denied() {
    // The older request is bad (unknown class): it is judged first and denied, though a
    // younger request waits on the same target.
    let mut bad = observed(spec_class_change("gold"));
    bad.request.metadata.creation_timestamp = Some(Time(t(-10)));
    bad.other_requests.push(other(REQ, 0, Phase::Pending));
    assert_eq!(
        denial_reason(&decide(&bad, &SETTINGS)).0,
        "StorageClassNotFound"
    );

    // The younger good one waits while the older one is Pending, touching nothing.
    let mut o = observed(spec_class_change("fast"));
    o.other_requests.push(other("bad", -10, Phase::Pending));
    let mut sim = Sim::new(o);
    for _ in 0..5 {
        let d = decide(&sim.o, &SETTINGS);
        assert_eq!(d.requeue, REQUEUE_QUEUED);
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
    }
    assert!(nothing_touched(&sim.log), "{:?}", sim.log);
    let status = sim.o.request.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Pending);
    assert_eq!(status.stage, Stage::Preflight);
    let (cond, reason, message) = queued_condition(&status).unwrap();
    assert_eq!(
        (cond.as_str(), reason.as_str()),
        ("True", "WaitingForRequest")
    );
    assert_eq!(
        message,
        "waiting for request bad (Pending) on StatefulSet etcd: requests on one workload are \
         judged one at a time, oldest first"
    );
    assert_eq!(status.message.as_deref(), Some(message.as_str()));
    assert_eq!(sim.reasons(), ["Queued"], "the Event is emitted once");

    // The older one is denied: the younger one is judged, accepted and runs to the end.
    sim.o.other_requests[0].phase = Phase::Denied;
    let d = decide(&sim.o, &SETTINGS);
    let s = first_status(&d);
    assert_eq!(s.phase, Phase::Progressing);
    let (cond, reason, _) = queued_condition(s).unwrap();
    assert_eq!((cond.as_str(), reason.as_str()), ("False", "TurnCame"));
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful);
}

#[test]
fn a_progressing_request_makes_a_younger_or_older_one_wait_naming_it() {
    for created in [-100, 100] {
        let mut o = observed(spec_shrink("512Mi"));
        o.other_requests
            .push(other("running", created, Phase::Progressing));
        o.other_requests
            .push(other("earlier", -200, Phase::Pending));
        let mut sim = Sim::new(o);
        sim.run(5);
        // No measure Job, no finalizer: nothing touched while queued.
        assert!(nothing_touched(&sim.log), "{:?}", sim.log);
        assert!(sim.o.jobs.is_empty());
        assert!(sim.o.request.finalizers().is_empty());
        let status = sim.o.request.status.clone().unwrap();
        assert_eq!(status.phase, Phase::Pending);
        let (cond, _, message) = queued_condition(&status).unwrap();
        assert_eq!(cond, "True");
        assert!(
            message.starts_with("waiting for request running (Progressing)"),
            "{message}"
        );

        // It ends: the queued one is judged (and, a Shrink, measures first).
        sim.o.other_requests[0].phase = Phase::Successful;
        sim.o.other_requests[1].phase = Phase::Denied;
        sim.run(400);
        assert_eq!(sim.phase(), Phase::Successful, "created {created}");
    }
}

#[test]
fn a_final_request_never_blocks() {
    for phase in [Phase::Successful, Phase::Failed, Phase::Denied] {
        let mut o = observed(spec_class_change("fast"));
        o.other_requests.push(other("first", -10, phase));
        o.other_requests.push(other("later", 10, Phase::Pending));
        let d = decide(&o, &SETTINGS);
        let s = first_status(&d);
        assert_eq!(s.phase, Phase::Progressing, "{phase:?}");
        assert_eq!(queued_condition(s), None, "never queued: no condition");
    }
}

#[test]
fn requests_created_in_the_same_second_go_by_name() {
    // Same creation time as "move": "alpha" is ahead, "zulu" behind.
    let mut o = observed(spec_class_change("fast"));
    o.other_requests.push(other("zulu", 0, Phase::Pending));
    assert_eq!(
        first_status(&decide(&o, &SETTINGS)).phase,
        Phase::Progressing
    );
    o.other_requests.push(other("alpha", 0, Phase::Pending));
    let d = decide(&o, &SETTINGS);
    let s = first_status(&d);
    assert_eq!(s.phase, Phase::Pending);
    let (_, _, message) = queued_condition(s).unwrap();
    assert!(message.contains("request alpha "), "{message}");
}

#[test]
fn a_malformed_request_is_denied_at_once_even_when_queued() {
    let mut o = observed(StorageMigrationRequestSpec {
        shrink: None,
        ..spec_shrink("1Gi")
    });
    o.other_requests
        .push(other("running", -10, Phase::Progressing));
    assert_eq!(denial_reason(&decide(&o, &SETTINGS)).0, "InvalidSpec");
}

#[test]
fn always_starts_despite_an_unhealthy_member_but_the_gate_holds() {
    let mut o = observed(spec_class_change("fast"));
    o.request.spec.apply = ApplyPolicy::Always;
    not_ready(&mut o, "etcd-2");
    let d = decide(&o, &SETTINGS);
    assert_eq!(first_status(&d).phase, Phase::Progressing);
    let mut sim = Sim::new(o);
    sim.run(40);
    // etcd-0 is the first member; the gate waits for etcd-2 to be healthy.
    assert_eq!(sim.step_of("etcd-0"), MemberStep::GatingStop);
    assert!(sim.reasons().contains(&"WaitingForHealth"));
    let cond = conditions::get(
        &sim.o.request.status.as_ref().unwrap().conditions,
        conditions::HEALTH_GATE,
    )
    .unwrap();
    assert_eq!(cond.status, "False");
    assert!(cond.message.contains("etcd-2"), "{}", cond.message);
}

#[test]
fn the_gate_holds_until_a_member_that_restarted_is_stable_for_the_window() {
    // etcd-2 crashed and came back: healthy to the database, Ready again, but only just.
    let mut sim = Sim::at(MemberStep::GatingStop);
    let now = sim.o.now;
    sim.o.pods.get_mut("etcd-2").unwrap().update(|p| {
        p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            last_transition_time: Some(Time(now)),
            ..Default::default()
        }]);
    });
    let window = SETTINGS.stable_window.as_secs();
    for _ in 1..window {
        let d = decide(&sim.o, &sim.settings);
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
        assert_eq!(sim.step_of("etcd-0"), MemberStep::GatingStop);
    }
    let cond = conditions::get(
        &sim.o.request.status.as_ref().unwrap().conditions,
        conditions::HEALTH_GATE,
    )
    .unwrap();
    assert_eq!(cond.status, "False");
    assert!(
        cond.message.contains("etcd-2 has been Ready") && cond.message.contains("--stable-window"),
        "{}",
        cond.message
    );
    // Once it has been stable for the whole window, etcd-0 stops.
    sim.run(5);
    assert_ne!(sim.step_of("etcd-0"), MemberStep::GatingStop);
}

/// Waiting only for the window, the gate looks again when the last member to become Ready
/// will have been so for the window (a member pod that changes before wakes the request), not
/// every 2 s; when nothing tells when (a member not Ready), every 2 s.
#[test]
fn the_gate_waiting_on_the_window_looks_again_when_it_ends() {
    let mut sim = Sim::at(MemberStep::GatingStop);
    let now = sim.o.now;
    let ready = |ago: i64, status: &str| PodCondition {
        type_: "Ready".into(),
        status: status.into(),
        last_transition_time: Some(Time(
            now - k8s_openapi::jiff::SignedDuration::from_secs(ago),
        )),
        ..Default::default()
    };
    for (pod, ago) in [("etcd-0", 60), ("etcd-1", 60), ("etcd-2", 3)] {
        sim.o.pods.get_mut(pod).unwrap().update(|p| {
            p.status.as_mut().unwrap().conditions = Some(vec![ready(ago, "True")]);
        });
    }
    let d = decide(&sim.o, &sim.settings);
    assert_eq!(
        d.requeue,
        SETTINGS.stable_window - Duration::from_secs(3) + Duration::from_millis(100)
    );
    sim.o.pods.get_mut("etcd-2").unwrap().update(|p| {
        p.status.as_mut().unwrap().conditions = Some(vec![ready(3, "False")]);
    });
    assert_eq!(
        decide(&sim.o, &sim.settings).requeue,
        Duration::from_secs(2)
    );
}

#[test]
fn accept_records_the_plan_before_anything() {
    let o = observed(spec_class_change("fast"));
    let d = decide(&o, &SETTINGS);
    let s = first_status(&d);
    assert_eq!(s.phase, Phase::Progressing);
    assert_eq!(s.stage, Stage::OrphaningStatefulSet);
    assert_eq!(s.observed_generation, Some(1));
    assert_eq!(s.accepted_spec.as_deref(), Some(&o.request.spec));
    assert_eq!(s.progress.as_deref(), Some("0/3"));
    let plan = s.plan.as_ref().unwrap();
    assert_eq!(plan.target_storage_class, "fast");
    assert_eq!(plan.source_storage_class.as_deref(), Some("standard"));
    assert_eq!(plan.target_size.0, "1Gi");
    let m = &plan.members[1];
    assert_eq!(
        (
            m.pod.as_str(),
            m.node.as_str(),
            m.claim.as_str(),
            m.old_volume.as_str()
        ),
        ("etcd-1", "node-b", "data-etcd-1", "pv-old-1")
    );
    assert_eq!(m.temp_claim, build::temp_claim_name(REQ, "data-etcd-1"));
    assert_eq!(m.new_size.0, "1Gi");
    assert!(d.actions.contains(&Action::AddFinalizer));
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::Delete { .. } | Action::Create(_)))
    );
}

#[test]
fn storage_class_change_runs_to_success() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    let rounds = sim.run(400);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(
        s.phase,
        Phase::Successful,
        "{:?} after {rounds}: {:?}",
        s.message,
        s
    );
    assert_eq!(s.progress.as_deref(), Some("3/3"));
    assert!(sim.o.request.finalizers().is_empty());
    assert_machine_transitions(&sim);
    for i in 0..3 {
        let claim = &sim.o.claims[&format!("data-etcd-{i}")];
        assert_eq!(claim_class(claim), Some("fast"));
        let v = claim_volume(claim).unwrap();
        assert!(v.starts_with("pv-new-"), "{v}");
        // The new volume is on the member's node and back to its class's policy.
        let pv = &sim.o.volumes[v];
        assert_eq!(volume_policy(pv), "Delete");
        let old = &sim.o.volumes[&format!("pv-old-{i}")];
        assert_eq!(old.labels()[labels::MIGRATED_BY_LABEL], REQ);
        assert_eq!(volume_policy(old), "Delete", "original policy restored");
        assert!(sim.o.pods.contains_key(&format!("etcd-{i}")));
        let ms = &s
            .members
            .iter()
            .find(|m| m.pod == format!("etcd-{i}"))
            .unwrap();
        assert_eq!(ms.step, MemberStep::Done);
        assert!(ms.downtime_seconds.is_some());
        assert_eq!(ms.first_claim.bytes_copied, Some(1 << 20));
    }
    let tpl = first_template(&sim);
    assert_eq!(claim_class(tpl), Some("fast"));
    // Nothing of ours is left.
    assert!(sim.o.jobs.is_empty());
    assert!(sim.o.helper_pods.is_empty());
    assert_eq!(sim.o.claims.len(), 3);
    // One event per step, in the flow's order.
    let reasons = sim.reasons();
    for want in [
        "Accepted",
        "OrphaningStatefulSet",
        "StatefulSetOrphaned",
        "MemberStarted",
        "ClaimCreated",
        "PreCopied",
        "PodStopped",
        "Copied",
        "Verified",
        "ClaimSwapped",
        "MemberMigrated",
        "StatefulSetRecreated",
        "Successful",
    ] {
        assert!(reasons.contains(&want), "no {want} event in {reasons:?}");
    }
}

#[test]
fn shrink_measures_then_runs_to_success() {
    let mut sim = Sim::new(observed(spec_shrink("256Mi")));
    sim.run(400);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    assert_machine_transitions(&sim);
    let plan = s.plan.unwrap();
    assert!(plan.members.iter().all(|m| m.used_bytes == Some(100 << 20)));
    for (i, node) in NODES.iter().enumerate() {
        let claim = &sim.o.claims[&format!("data-etcd-{i}")];
        assert_eq!(claim_class(claim), Some("standard"));
        assert_eq!(claim_request(claim).unwrap().0, "256Mi");
        // Immediate class: the new volume was asked for on the member's node.
        let pv = &sim.o.volumes[claim_volume(claim).unwrap()];
        assert!(member::volume_reachable_from(pv, node));
    }
    let tpl = first_template(&sim);
    assert_eq!(claim_request(tpl).unwrap().0, "256Mi");
}

#[test]
fn shrink_below_used_bytes_is_denied_and_nothing_changes() {
    let o = observed(spec_shrink("256Mi"));
    let before_claims = o.claims.clone();
    let mut sim = Sim::new(o);
    sim.jobs.used_bytes = 250 << 20;
    sim.run(20);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Denied);
    let c = conditions::get(&s.conditions, conditions::ACCEPTED).unwrap();
    assert_eq!(c.reason, "InsufficientSize");
    assert!(c.message.contains("250Mi"), "{}", c.message);
    assert_eq!(sim.o.claims, before_claims);
    assert!(sim.o.stateful_set.is_some());
    assert!(sim.o.jobs.is_empty(), "measure Jobs cleaned up");
    assert!(
        !sim.log
            .iter()
            .any(|a| matches!(a, Action::Delete { kind, .. } if *kind != Kind::Job))
    );
}

#[test]
fn measure_failure_denies() {
    let mut sim = Sim::new(observed(spec_shrink("256Mi")));
    sim.jobs.fail = vec!["measure".into()];
    sim.run(20);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Denied);
    assert_eq!(
        conditions::get(&s.conditions, conditions::ACCEPTED)
            .unwrap()
            .reason,
        "MeasureFailed"
    );
}

/// The operator dies in the middle of every decision (after each prefix of its actions) and
/// the next one carries on: always Successful, same end state.
#[test]
fn crash_at_any_point_resumes_to_the_same_end() {
    let mut reference = Sim::new(observed(spec_class_change("fast")));
    let rounds = reference.run(400);
    assert_eq!(reference.phase(), Phase::Successful);
    let end = |sim: &Sim| {
        let mut v: Vec<(String, Option<String>, Option<String>)> = sim
            .o
            .claims
            .values()
            .map(|c| {
                (
                    c.name_any(),
                    claim_class(c).map(str::to_string),
                    claim_request(c).map(|q| q.0.clone()),
                )
            })
            .collect();
        v.sort();
        v
    };
    for crash_at in 0..rounds {
        let d_len = {
            let mut probe = Sim::new(observed(spec_class_change("fast")));
            probe.run(crash_at);
            decide(&probe.o, &SETTINGS).actions.len()
        };
        for keep in 0..d_len {
            let mut sim = Sim::new(observed(spec_class_change("fast")));
            sim.run_with_crash(500, crash_at, keep);
            assert_eq!(
                sim.phase(),
                Phase::Successful,
                "crash at round {crash_at} after {keep} actions: {:?}",
                sim.o
                    .request
                    .status
                    .as_ref()
                    .and_then(|s| s.message.clone())
            );
            assert_eq!(end(&sim), end(&reference), "crash at {crash_at}/{keep}");
            assert!(
                sim.log.contains(&Action::AddFinalizer),
                "crash at {crash_at}/{keep}: the finalizer was never added"
            );
            assert_machine_transitions(&sim);
            assert_eq!(sim.o.pods.len(), 3);
        }
    }
}

#[test]
fn failed_copy_rolls_back_the_member_and_restores_the_set() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    sim.jobs.fail = vec!["copy".into()];
    sim.run(400);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Failed, "{:?}", s.message);
    assert!(
        s.failure
            .as_deref()
            .unwrap()
            .contains("copy of claim data-etcd-0")
    );
    assert_eq!(sim.step_of("etcd-0"), MemberStep::RolledBack);
    assert_eq!(sim.step_of("etcd-1"), MemberStep::Pending);
    for i in 0..3 {
        let claim = &sim.o.claims[&format!("data-etcd-{i}")];
        assert_eq!(claim_volume(claim), Some(format!("pv-old-{i}").as_str()));
        assert_eq!(
            claim.metadata.uid.as_deref(),
            Some(format!("uid-data-etcd-{i}").as_str())
        );
        assert!(sim.o.pods.contains_key(&format!("etcd-{i}")));
    }
    assert_eq!(sim.o.claims.len(), 3, "temporary claim deleted");
    assert!(sim.o.jobs.is_empty() && sim.o.helper_pods.is_empty());
    let tpl = first_template(&sim);
    assert_eq!(claim_class(tpl), Some("standard"), "original template");
    let message = s.message.unwrap();
    assert!(
        message.contains("etcd-0 on claim data-etcd-0 -> original volume pv-old-0"),
        "{message}"
    );
    assert!(sim.reasons().contains(&"RollingBack"));
    assert!(sim.reasons().contains(&"MemberRolledBack"));
    assert!(sim.o.request.finalizers().is_empty());
    assert_machine_transitions(&sim);
}

#[test]
fn verify_differences_fail_before_the_swap() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    sim.jobs.differences = 2;
    sim.run(400);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Failed);
    assert!(s.failure.unwrap().contains("2 differences"));
    assert_machine_transitions(&sim);
    assert_eq!(sim.step_of("etcd-0"), MemberStep::RolledBack);
    assert_eq!(claim_volume(&sim.o.claims["data-etcd-0"]), Some("pv-old-0"));
    // The differences came from the final copy's own pod: no verification Job was made.
    let verify = build::job_name(REQ, "etcd-0", JobKind::Verify);
    assert!(
        !sim.log
            .iter()
            .any(|a| matches!(a, Action::Create(Object::Job(j)) if j.name_any() == verify))
    );
}

/// A final copy whose verification pass could not compare (rsync failed in it) fails as a
/// verification, not as a copy, and the member rolls back to its old claim.
#[test]
fn a_verification_that_cannot_compare_fails_as_one() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    sim.jobs.fail = vec!["verify".into()];
    sim.run(400);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Failed);
    let failure = s.failure.unwrap();
    assert!(
        failure.starts_with("verification of member etcd-0 failed: copy exited 23"),
        "{failure}"
    );
    assert_eq!(sim.step_of("etcd-0"), MemberStep::RolledBack);
    assert_eq!(claim_volume(&sim.o.claims["data-etcd-0"]), Some("pv-old-0"));
}

/// The `SINCE` the final copy Job of `etcd-0` was created with, if it verifies in its pod
/// (`VERIFY`): `Some(None)` when it has no `SINCE` (`Full`).
fn verify_job_since(a: &Action) -> Option<Option<String>> {
    let Action::Create(Object::Job(job)) = a else {
        return None;
    };
    if job.name_any() != build::job_name(REQ, "etcd-0", JobKind::Copy) {
        return None;
    }
    let pod = job.spec.as_ref()?.template.spec.as_ref()?;
    let env = pod.containers[0].env.clone().unwrap_or_default();
    let get = |name: &str| {
        env.iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    get("VERIFY")?;
    Some(get("SINCE"))
}

#[test]
fn verification_reads_the_content_changed_since_a_minute_before_the_first_copy_pass() {
    for mode in [
        crate::api::VerifyMode::Changed,
        crate::api::VerifyMode::Full,
    ] {
        let mut spec = spec_class_change("fast");
        spec.copy.verify_mode = mode;
        let mut sim = Sim::new(observed(spec));
        let precopy = build::job_name(REQ, "etcd-0", JobKind::PreCopy);
        let (mut precopy_at, mut since) = (None, None);
        for _ in 0..400 {
            let d = decide(&sim.o, &SETTINGS);
            for a in &d.actions {
                if matches!(a, Action::Create(Object::Job(j)) if j.name_any() == precopy) {
                    precopy_at.get_or_insert(sim.o.now.as_second());
                }
                since = since.or(verify_job_since(a));
                sim.apply(a);
            }
            sim.settle();
        }
        let precopy_at = precopy_at.expect("a pre-copy Job");
        let etcd0 = &sim.status().members[0];
        assert_eq!(
            etcd0.copy_started.as_ref().map(|t| t.0.as_second()),
            Some(precopy_at)
        );
        let expected = match mode {
            crate::api::VerifyMode::Changed => Some((precopy_at - 60).to_string()),
            crate::api::VerifyMode::Full => None,
        };
        assert_eq!(since, Some(expected), "{mode:?}");
        assert_eq!(sim.phase(), Phase::Successful, "{mode:?}");
        // The fixture's final copy, verifying in its pod, reports 2 files read in Changed mode.
        assert_eq!(etcd0.first_claim.verified_files, Some(2));
        let verified = sim.events.iter().find(|(r, _)| r == "Verified");
        assert!(
            verified.is_some_and(|(_, m)| m.contains("in content for the 2 files changed")),
            "{verified:?}"
        );
    }
}

/// The final pass leaves every entry's ACLs and xattrs out of its walk (`ATTRS_SINCE`, the
/// same minute before the first copy pass as the verification's `SINCE`) only after a pre-copy
/// that reported it compared them all, on a volume of many files.
#[test]
fn the_final_pass_compares_attributes_of_what_changed_only_after_a_pre_copy_that_compared_all() {
    let many = build::job::ATTRIBUTES_OF_CHANGED_MIN_ENTRIES;
    for (compared, entries) in [(true, many), (false, many), (true, many - 1)] {
        let mut sim = Sim::new(observed(spec_class_change("fast")));
        sim.jobs.pre_copy_without_attributes = !compared;
        sim.jobs.source_entries = Some(entries);
        let lite = compared && entries >= many;
        let precopy = build::job_name(REQ, "etcd-0", JobKind::PreCopy);
        let copy = build::job_name(REQ, "etcd-0", JobKind::Copy);
        let (mut precopy_at, mut attrs_since) = (None, None);
        for _ in 0..400 {
            let d = decide(&sim.o, &SETTINGS);
            for a in &d.actions {
                if let Action::Create(Object::Job(j)) = a {
                    if j.name_any() == precopy {
                        precopy_at.get_or_insert(sim.o.now.as_second());
                    }
                    if j.name_any() == copy {
                        attrs_since = Some(job_env(j, "ATTRS_SINCE"));
                    }
                }
                sim.apply(a);
            }
            sim.settle();
        }
        assert_eq!(sim.phase(), Phase::Successful, "{compared} {entries}");
        let precopy_at = precopy_at.expect("a pre-copy Job");
        let expected = lite.then(|| (precopy_at - 60).to_string());
        assert_eq!(attrs_since, Some(expected), "{compared} {entries}");
        let etcd0 = &sim.status().members[0];
        assert_eq!(
            etcd0.first_claim.pre_copy_compared_attributes,
            compared.then_some(true)
        );
    }
}

/// A final pass that replaces an evicted one is given no `ATTRS_SINCE`: its predecessor may have
/// stopped between writing an entry's content and time and writing its ACLs and xattrs, so it
/// compares every entry's. The first is given it, and records when it was created.
#[test]
fn a_final_pass_that_replaces_an_evicted_one_compares_every_entrys_attributes() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    sim.jobs.source_entries = Some(build::job::ATTRIBUTES_OF_CHANGED_MIN_ENTRIES);
    for _ in 0..400 {
        if sim.step_of("etcd-1") == MemberStep::Copying {
            break;
        }
        sim.run(1);
    }
    assert_eq!(sim.step_of("etcd-1"), MemberStep::Copying);
    sim.jobs.hang = true;
    let job = build::job_name(REQ, "etcd-1", JobKind::Copy);
    let mut created = Vec::new();
    for round in 0..2 {
        for _ in 0..5 {
            let d = decide(&sim.o, &sim.settings);
            for a in &d.actions {
                if let Action::Create(Object::Job(j)) = a
                    && j.name_any() == job
                {
                    created.push(job_env(j, "ATTRS_SINCE"));
                }
                sim.apply(a);
            }
            sim.settle();
            if sim.o.jobs.contains_key(&job) {
                break;
            }
        }
        assert_eq!(
            created.len(),
            round + 1,
            "round {round}: copy Job (re)created"
        );
        let started = sim.status().members[1]
            .first_claim
            .final_pass_started
            .clone();
        assert!(started.is_some(), "round {round}");
        if round == 0 {
            evict_job(&mut sim, &job);
        }
    }
    assert!(created[0].is_some(), "the first final pass: {created:?}");
    assert_eq!(created[1], None, "the replacing one");
    sim.jobs.hang = false;
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful);
}

/// The kubelet evicts the pod of Job `job`: the Job (backoffLimit 0) fails, and one decision
/// is applied while the evicted pod is still seen.
fn evict_job(sim: &mut Sim, job: &str) {
    let pod = job_pod(job, sim.o.now, PodStatusFixture::Evicted);
    sim.o.helper_pods.insert(pod.name_any(), pod);
    sim.o.jobs.get_mut(job).unwrap().outcome = JobOutcome::Failed {
        reason: format!("Job {job} failed: BackoffLimitExceeded"),
    };
    let d = decide(&sim.o, &sim.settings);
    for a in &d.actions {
        sim.apply(a);
    }
    sim.o.helper_pods.clear();
}

/// The value of the environment variable `name` of a Job's container.
fn job_env(job: &k8s_openapi::api::batch::v1::Job, name: &str) -> Option<String> {
    let pod = job.spec.as_ref()?.template.spec.as_ref()?;
    let env = pod.containers[0].env.as_ref()?;
    env.iter()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

#[test]
fn timeout_after_the_swap_began_carries_the_member_forward() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    // Run until etcd-1 (second member) has begun its swap, then jump past the timeout.
    for _ in 0..400 {
        if sim.step_of("etcd-1") == MemberStep::DeletingOldClaim {
            break;
        }
        let d = decide(&sim.o, &SETTINGS);
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
    }
    assert_eq!(sim.step_of("etcd-1"), MemberStep::DeletingOldClaim);
    sim.o.now = t(10 + 31 * 60);
    sim.run(400);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Failed, "{:?}", s.message);
    assert!(s.failure.unwrap().contains("timeout of 30m expired"));
    assert_machine_transitions(&sim);
    assert_eq!(sim.step_of("etcd-0"), MemberStep::Done);
    assert_eq!(sim.step_of("etcd-1"), MemberStep::Done, "carried forward");
    assert_eq!(sim.step_of("etcd-2"), MemberStep::Pending);
    assert_eq!(claim_class(&sim.o.claims["data-etcd-1"]), Some("fast"));
    assert_eq!(claim_volume(&sim.o.claims["data-etcd-2"]), Some("pv-old-2"));
    // Old volumes of migrated members stay Retain on failure; nobody's data is deleted.
    assert_eq!(volume_policy(&sim.o.volumes["pv-old-0"]), "Retain");
    assert_eq!(volume_policy(&sim.o.volumes["pv-old-1"]), "Retain");
    let tpl = first_template(&sim);
    assert_eq!(claim_class(tpl), Some("standard"), "not every member moved");
    assert_eq!(sim.o.pods.len(), 3);
}

#[test]
fn timeout_while_jobs_hang_rolls_back() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    sim.jobs.hang = true;
    sim.run(60);
    assert_eq!(sim.step_of("etcd-0"), MemberStep::PreCopying);
    sim.o.now = t(10 + 31 * 60);
    sim.jobs.hang = false;
    sim.jobs.fail = vec!["precopy".into()];
    sim.run(200);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Failed);
    assert!(s.failure.unwrap().contains("timeout"));
    assert_machine_transitions(&sim);
    assert_eq!(sim.step_of("etcd-0"), MemberStep::RolledBack);
    assert!(sim.o.jobs.is_empty());
    assert_eq!(sim.o.claims.len(), 3);
}

/// A simulation whose first member's pre-copy Job runs and does not end, with the Job's name.
fn pre_copy_running() -> (Sim, String) {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    sim.jobs.hang = true;
    sim.run(60);
    assert_eq!(sim.step_of("etcd-0"), MemberStep::PreCopying);
    (sim, build::job_name(REQ, "etcd-0", JobKind::PreCopy))
}

#[test]
fn a_running_copy_reports_its_progress_and_an_unchanged_one_writes_nothing() {
    let (mut sim, name) = pre_copy_running();
    let reading = crate::api::CopyProgress {
        pass: crate::api::CopyPass::PreCopy,
        bytes_done: 512,
        bytes_total: Some(1024),
        percent: 50,
        ..Default::default()
    };
    sim.o.jobs.get_mut(&name).unwrap().progress = Some(reading.clone());
    let d = decide(&sim.o, &SETTINGS);
    let s = first_status(&d);
    let ms = s.members.iter().find(|m| m.pod == "etcd-0").unwrap();
    assert_eq!(ms.copy_progress.as_ref(), Some(&reading));
    assert_eq!(s.current_member.as_deref(), Some("etcd-0"));
    assert_eq!(s.percent, Some(11), "0.7 * 0.5 / 3");
    assert!(d.requeue <= Duration::from_secs(5), "{:?}", d.requeue);
    for a in &d.actions {
        sim.apply(a);
    }
    let again = decide(&sim.o, &SETTINGS);
    assert!(
        !again
            .actions
            .iter()
            .any(|a| matches!(a, Action::SetStatus(_))),
        "{:?}",
        again.actions
    );
}

#[test]
fn a_running_copy_is_looked_at_every_quarter_of_its_age_between_one_and_ten_seconds() {
    use crate::plan::member::{COPY_POLL_MAX, COPY_POLL_MIN, copy_poll};
    let (mut sim, name) = pre_copy_running();
    let created = sim.o.now;
    let job = &mut sim.o.jobs.get_mut(&name).unwrap().job;
    job.metadata.creation_timestamp = Some(Time(created));
    for (ran, poll) in [(0, 1), (2, 1), (8, 2), (20, 5), (40, 10), (100, 10)] {
        sim.o.now = created + std::time::Duration::from_secs(ran);
        let d = decide(&sim.o, &SETTINGS);
        assert_eq!(d.requeue, Duration::from_secs(poll), "after {ran} s");
    }
    assert_eq!(copy_poll(Duration::ZERO), COPY_POLL_MIN);
    assert_eq!(copy_poll(Duration::from_secs(86_400)), COPY_POLL_MAX);
}

#[test]
fn deleting_a_progressing_request_rolls_back_then_lets_it_go() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    for _ in 0..400 {
        if sim.step_of("etcd-0") == MemberStep::Copying {
            break;
        }
        let d = decide(&sim.o, &SETTINGS);
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
    }
    sim.o.request.metadata.deletion_timestamp = Some(Time(sim.o.now));
    sim.run(200);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Failed);
    assert!(s.failure.unwrap().contains("deleted"));
    assert_machine_transitions(&sim);
    assert!(sim.o.request.finalizers().is_empty());
    assert_eq!(sim.o.pods.len(), 3, "etcd-0 recreated from its stash");
    assert!(sim.o.stateful_set.is_some());
}

#[test]
fn the_abort_annotation_rolls_a_migrating_request_back() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    for _ in 0..400 {
        if sim.step_of("etcd-1") == MemberStep::Copying {
            break;
        }
        let d = decide(&sim.o, &SETTINGS);
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
    }
    assert_eq!(sim.step_of("etcd-0"), MemberStep::Done);
    sim.o.request.annotations_mut().insert(
        labels::ABORT_ANNOTATION.into(),
        "2026-12-01T18:00:00Z".into(),
    );
    sim.run(300);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Failed);
    assert_eq!(
        s.failure.as_deref(),
        Some(
            "aborted: annotation storagemigrator.io/abort asked for a rollback (runbook: \
             docs/runbook.md#failed-aborted-kubectl-smr-abort)"
        )
    );
    assert_machine_transitions(&sim);
    assert_eq!(sim.step_of("etcd-1"), MemberStep::RolledBack);
    assert_eq!(
        sim.step_of("etcd-0"),
        MemberStep::Done,
        "a finished member stays moved"
    );
    assert!(sim.o.jobs.is_empty());
    assert!(sim.o.stateful_set.is_some());
    assert_eq!(sim.o.pods.len(), 3);
}

#[test]
fn spec_change_after_acceptance_is_ignored() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    sim.run(5);
    sim.o.request.spec = spec_class_change("slow");
    sim.o.request.metadata.generation = Some(2);
    let d = decide(&sim.o, &SETTINGS);
    let s = first_status(&d);
    let c = conditions::get(&s.conditions, SPEC_CHANGE_IGNORED).unwrap();
    assert_eq!(c.status, "True");
    assert!(c.message.contains("generation 2"), "{}", c.message);
    assert!(
        c.message.contains("accepted at generation 1"),
        "{}",
        c.message
    );
    assert!(
        c.message.contains(
            ": spec.storageClassChange differ from status.acceptedSpec; ignored, because"
        ),
        "{}",
        c.message
    );
    assert_eq!(c.observed_generation, Some(2));
    assert_eq!(
        s.observed_generation,
        Some(2),
        "observedGeneration follows generation"
    );
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful);
    assert_eq!(claim_class(&sim.o.claims["data-etcd-0"]), Some("fast"));
    assert_eq!(
        sim.reasons()
            .iter()
            .filter(|r| **r == "SpecChangeIgnored")
            .count(),
        1
    );
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.observed_generation, Some(2));
}

/// Back to the accepted spec, the condition turns False; a denied request says that a change
/// is ignored too (it is final).
#[test]
fn spec_change_reverted_clears_the_condition_and_denied_requests_say_so() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    sim.run(5);
    sim.o.request.spec = spec_class_change("slow");
    sim.o.request.metadata.generation = Some(2);
    sim.run(1);
    sim.o.request.spec = spec_class_change("fast");
    sim.o.request.metadata.generation = Some(3);
    let d = decide(&sim.o, &SETTINGS);
    let s = first_status(&d);
    let c = conditions::get(&s.conditions, SPEC_CHANGE_IGNORED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "SpecMatchesAccepted")
    );
    assert_eq!(s.observed_generation, Some(3));

    let mut o = observed(spec_class_change("missing-class"));
    let d = decide(&o, &SETTINGS);
    o.request.status = Some(first_status(&d).clone());
    assert_eq!(o.request.status.as_ref().unwrap().phase, Phase::Denied);
    o.request.spec = spec_class_change("fast");
    o.request.metadata.generation = Some(2);
    let d = decide(&o, &SETTINGS);
    let s = first_status(&d);
    let c = conditions::get(&s.conditions, SPEC_CHANGE_IGNORED).unwrap();
    assert_eq!(c.status, "True");
    assert!(
        c.message
            .contains("after the request was denied at generation 1"),
        "{}",
        c.message
    );
    assert_eq!(s.observed_generation, Some(2));
    assert_eq!(s.phase, Phase::Denied, "still denied");
}

/// A class change of the 3-member etcd set whose health says: etcd-0 the leader.
fn quorum_observed() -> Observed {
    let mut o = etcd_observed(etcd_spec());
    // The engine's final check agrees whenever it is asked.
    o.final_hash = Some(Ok(Some(agreed("7@42", &["etcd-0", "etcd-1", "etcd-2"]))));
    o
}

#[test]
fn leader_goes_last_and_hands_over_first() {
    let o = quorum_observed();
    let d = decide(&o, &SETTINGS);
    let plan = first_status(&d).plan.clone().unwrap();
    assert_eq!(
        plan.members
            .iter()
            .map(|m| m.pod.as_str())
            .collect::<Vec<_>>(),
        ["etcd-1", "etcd-2", "etcd-0"]
    );
    assert_eq!(plan.members[2].role, Some(Role::Leader));
    let mut sim = Sim::new(o);
    sim.run(500);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    let order: Vec<&str> = s.members.iter().map(|m| m.pod.as_str()).collect();
    assert_eq!(order, ["etcd-1", "etcd-2", "etcd-0"]);
    let transfers: Vec<&Action> = sim
        .log
        .iter()
        .filter(|a| matches!(a, Action::TransferLeadership { .. }))
        .collect();
    assert_eq!(
        transfers,
        [&Action::TransferLeadership {
            from: "etcd-0".into(),
            to: "etcd-1".into()
        }],
        "handed to a migrated member"
    );
}

#[test]
fn retention_policy_and_claim_owner_references_are_neutralised_then_restored() {
    let mut o = observed(spec_class_change("fast"));
    let policy = StatefulSetPersistentVolumeClaimRetentionPolicy {
        when_deleted: Some("Delete".into()),
        when_scaled: Some("Delete".into()),
    };
    o.stateful_set.as_mut().unwrap().update(|s| {
        s.spec
            .as_mut()
            .unwrap()
            .persistent_volume_claim_retention_policy = Some(policy.clone());
    });
    for (i, c) in o.claims.values_mut().enumerate() {
        c.metadata.owner_references = Some(vec![
            OwnerReference {
                api_version: "apps/v1".into(),
                kind: "StatefulSet".into(),
                name: "etcd".into(),
                uid: "uid-etcd".into(),
                ..Default::default()
            },
            OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: format!("etcd-{i}"),
                uid: format!("uid-etcd-{i}"),
                ..Default::default()
            },
        ]);
    }
    let mut sim = Sim::new(o);
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful);
    let pos = |pred: &dyn Fn(&Action) -> bool| sim.log.iter().position(pred).unwrap();
    let patch = pos(&|a| matches!(a, Action::PatchRetentionPolicy { .. }));
    let refs = pos(&|a| matches!(a, Action::RemoveOwnerReferences { .. }));
    let delete = pos(&|a| {
        matches!(
            a,
            Action::Delete {
                kind: Kind::StatefulSet,
                ..
            }
        )
    });
    assert!(patch < delete && refs < delete);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(
        build::parse_retention_policy(s.original_retention_policy.as_deref().unwrap()).unwrap(),
        Some(policy.clone())
    );
    let set = sim.o.stateful_set.as_ref().unwrap();
    assert_eq!(
        set.spec
            .as_ref()
            .unwrap()
            .persistent_volume_claim_retention_policy,
        Some(policy),
        "original policy restored on the recreated set"
    );
}

/// Every claim of the set gets `whenDeleted/whenScaled: Delete` refs to the set and its pod, plus
/// a user's own owner, label and annotation; the set a `Delete`/`Delete` retention policy.
fn observed_with_retention_and_owners()
-> (Observed, StatefulSetPersistentVolumeClaimRetentionPolicy) {
    let mut o = observed(spec_class_change("fast"));
    let policy = StatefulSetPersistentVolumeClaimRetentionPolicy {
        when_deleted: Some("Delete".into()),
        when_scaled: Some("Delete".into()),
    };
    o.stateful_set.as_mut().unwrap().update(|s| {
        s.spec
            .as_mut()
            .unwrap()
            .persistent_volume_claim_retention_policy = Some(policy.clone());
    });
    for (i, c) in o.claims.values_mut().enumerate() {
        let owner = |api_version: &str, kind: &str, name: String| OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            uid: format!("uid-{name}"),
            name,
            ..Default::default()
        };
        c.metadata.owner_references = Some(vec![
            owner("apps/v1", "StatefulSet", "etcd".into()),
            owner("v1", "Pod", format!("etcd-{i}")),
            owner("v1", "ConfigMap", "keeper".into()),
        ]);
        c.labels_mut().insert("team".into(), "db".into());
        c.annotations_mut()
            .insert("example.com/backup".into(), "daily".into());
    }
    (o, policy)
}

fn retention_of(sim: &Sim) -> Option<StatefulSetPersistentVolumeClaimRetentionPolicy> {
    let set = sim.o.stateful_set.as_ref().unwrap();
    set.spec
        .as_ref()
        .unwrap()
        .persistent_volume_claim_retention_policy
        .clone()
}

#[test]
fn recreated_claims_keep_the_users_metadata_and_only_the_users_owner() {
    let (o, _) = observed_with_retention_and_owners();
    let mut sim = Sim::new(o);
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful);
    for i in 0..3 {
        let c = &sim.o.claims[&format!("data-etcd-{i}")];
        assert_ne!(claim_volume(c), Some(format!("pv-old-{i}").as_str()));
        let refs: Vec<&str> = c
            .owner_references()
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(
            refs,
            ["keeper"],
            "claim {i}: the set's and pod's refs dropped"
        );
        assert_eq!(c.owner_references()[0].uid, "uid-keeper");
        assert_eq!(c.labels()["team"], "db");
        assert_eq!(c.annotations()["example.com/backup"], "daily");
        assert!(c.annotations().keys().all(|k| !labels::is_own_key(k)));
    }
}

#[test]
fn a_rollback_after_the_orphan_delete_recreates_the_set_with_the_original_retention_policy() {
    let (o, policy) = observed_with_retention_and_owners();
    let mut sim = Sim::new(o);
    sim.jobs.fail = vec!["copy".into()];
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Failed);
    assert!(
        sim.log.iter().any(|a| matches!(
            a,
            Action::Delete {
                kind: Kind::StatefulSet,
                ..
            }
        )),
        "the set was orphan-deleted"
    );
    assert_eq!(retention_of(&sim), Some(policy));
    for i in 0..3 {
        let c = &sim.o.claims[&format!("data-etcd-{i}")];
        let refs: Vec<&str> = c
            .owner_references()
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(refs, ["keeper"], "a user's owner survives the rollback");
    }
}

#[test]
fn a_rollback_before_the_orphan_delete_patches_the_original_retention_policy_back() {
    let (o, policy) = observed_with_retention_and_owners();
    let mut sim = Sim::new(o);
    for _ in 0..400 {
        if sim
            .log
            .iter()
            .any(|a| matches!(a, Action::PatchRetentionPolicy { .. }))
        {
            break;
        }
        let d = decide(&sim.o, &SETTINGS);
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
    }
    assert_ne!(retention_of(&sim), Some(policy.clone()), "protected");
    let set_uid = sim.o.stateful_set.as_ref().unwrap().uid();
    sim.o.request.annotations_mut().insert(
        labels::ABORT_ANNOTATION.into(),
        "2026-12-01T18:00:00Z".into(),
    );
    sim.run(300);
    assert_eq!(sim.phase(), Phase::Failed);
    assert_eq!(
        sim.o.stateful_set.as_ref().unwrap().uid(),
        set_uid,
        "never deleted"
    );
    assert_eq!(retention_of(&sim), Some(policy));
}

#[test]
fn the_stash_lives_in_its_config_map_from_before_the_first_delete_until_success() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    sim.run(400);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    assert_eq!(s.stash_config_map.as_deref(), Some("move-stash"));
    let create = sim.log.iter().position(
        |a| matches!(a, Action::Create(Object::ConfigMap(c)) if c.name_any() == "move-stash"),
    );
    let first_delete = sim.log.iter().position(|a| {
        matches!(
            a,
            Action::Delete {
                kind: Kind::Pod | Kind::StatefulSet | Kind::Claim,
                ..
            }
        )
    });
    assert!(create.unwrap() < first_delete.unwrap());
    // The set, each member's pod and claim were stashed there, nothing on the request.
    let keys: BTreeSet<&str> = sim
        .log
        .iter()
        .filter_map(|a| match a {
            Action::Stash { key, .. } => Some(key.as_str()),
            _ => None,
        })
        .collect();
    let expected: BTreeSet<String> = ["statefulset".to_string()]
        .into_iter()
        .chain((0..3).flat_map(|i| [format!("pod-etcd-{i}"), format!("claim-data-etcd-{i}")]))
        .collect();
    assert_eq!(keys, expected.iter().map(String::as_str).collect());
    assert!(sim.o.request.annotations().is_empty());
    assert!(sim.stash_config_map.is_none(), "deleted at the end");
    assert_eq!(sim.o.stash.object, StashObject::Missing);
}

#[test]
fn read_write_once_pod_skips_the_pre_copy() {
    let mut o = observed(spec_class_change("fast"));
    for c in o.claims.values_mut() {
        c.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteOncePod".into()]);
    }
    let mut sim = Sim::new(o);
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful);
    assert!(!sim.reasons().contains(&"PreCopied"));
    assert!(
        !sim.log
            .iter()
            .any(|a| matches!(a, Action::Create(Object::Job(j))
        if j.labels()[labels::JOB_KIND_LABEL] == JobKind::PreCopy.as_str()))
    );
}

// --- Resume in the middle of a step: the status says X, the objects say Y. -------------------

/// An accepted request with member etcd-0 at `step`, the set already orphaned.
fn at_step(step: MemberStep) -> Observed {
    Sim::at(step).o
}

fn member0(d: &Decision) -> MemberStatus {
    first_status(d).members[0].clone()
}

#[test]
fn resume_stopping_pod_when_the_pod_is_already_gone() {
    let mut o = at_step(MemberStep::StoppingPod);
    // The stash and the delete happened; the status write of the next step did not.
    let d = decide(&o, &SETTINGS);
    assert!(
        matches!(d.actions[0], Action::Stash { .. }),
        "{:?}",
        d.actions
    );
    let mut sim = Sim::new(o.clone());
    sim.apply(&d.actions[0]);
    o = sim.o.clone();
    o.pods.remove("etcd-0");
    let d = decide(&o, &SETTINGS);
    assert_eq!(member0(&d).step, MemberStep::Copying);
    assert!(member0(&d).pod_deleted_at.is_some());
}

#[test]
fn resume_deleting_old_claim_when_it_is_gone() {
    let mut o = at_step(MemberStep::DeletingOldClaim);
    o.claims.remove("data-etcd-0");
    let d = decide(&o, &SETTINGS);
    // The temporary claim is still there: deleted in the same decision.
    assert_eq!(member0(&d).step, MemberStep::DeletingTempClaim);
}

/// Both deleted claims gone: one decision passes `DeletingTempClaim` (nothing left to delete)
/// and enters `ReleasingNewVolume`, whose action it carries, the status written first.
#[test]
fn the_swap_passes_a_step_with_nothing_to_do_in_the_same_decision() {
    let mut o = at_step(MemberStep::DeletingOldClaim);
    let plan = o
        .request
        .status
        .as_ref()
        .and_then(|s| s.plan.clone())
        .unwrap();
    let temp = plan.members[0].temp_claim.clone();
    o.claims.remove("data-etcd-0");
    o.claims.remove(&temp);
    let d = decide(&o, &SETTINGS);
    assert_eq!(member0(&d).step, MemberStep::ReleasingNewVolume);
    assert!(
        matches!(
            &d.actions[..],
            [Action::SetStatus(_), Action::SetClaimRef { claim, .. }] if claim == "data-etcd-0"
        ),
        "{:?}",
        d.actions
    );
}

/// Over a whole request, the claim swap's status writes pass steps: each member goes from its
/// verified copy to its recreated pod in fewer decisions than steps, every write still a path
/// of `machine::STEPS`.
#[test]
fn the_swap_takes_fewer_decisions_than_steps() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful);
    assert_machine_transitions(&sim);
    let mut last = MemberStep::Pending;
    let (mut writes, mut passed) = (0, 0);
    for a in &sim.log {
        let Action::SetStatus(s) = a else { continue };
        let step = s.members[0].step;
        if step != last && step.swap_begun() && step != MemberStep::RetainingVolumes {
            writes += 1;
            passed += machine::steps_passed(last, step).map_or(0, |p| p.len());
        }
        last = step;
    }
    // DeletingOldClaim .. Done: 6 steps entered.
    assert_eq!(passed, 6, "{writes} writes");
    assert!(writes < passed, "{writes} writes for {passed} steps");
}

#[test]
fn resume_recreating_claim_when_it_is_already_bound() {
    let o = at_step(MemberStep::RecreatingClaim);
    let mut sim = Sim::new(o);
    let d = decide(&sim.o, &SETTINGS);
    assert!(
        matches!(&d.actions[..], [Action::Create(Object::Claim(_))]),
        "{:?}",
        d.actions
    );
    sim.apply(&d.actions[0]);
    sim.settle();
    let d = decide(&sim.o, &SETTINGS);
    assert_eq!(member0(&d).step, MemberStep::RecreatingPod);
}

#[test]
fn resume_copying_reads_the_finished_jobs() {
    let mut o = at_step(MemberStep::Copying);
    let copy = build::job_name(REQ, "etcd-0", JobKind::Copy);
    let verify = build::job_name(REQ, "etcd-0", JobKind::Verify);
    o.jobs.extend([
        job(
            &copy,
            "copy",
            JobOutcome::Succeeded {
                message: Some(r#"{"bytes":7,"files":1}"#.into()),
            },
        ),
        job(
            &verify,
            "verify",
            JobOutcome::Succeeded {
                message: Some(r#"{"differences":0}"#.into()),
            },
        ),
    ]);
    let d = decide(&o, &SETTINGS);
    let ms = member0(&d);
    assert_eq!(ms.step, MemberStep::RetainingVolumes);
    assert_eq!(
        (ms.first_claim.bytes_copied, ms.first_claim.files_copied),
        (Some(7), Some(1))
    );
    // The claim is stashed in the same decision, after the status (the swap's first need).
    let claim_key = super::stash::StashKey::Claim("data-etcd-0".into()).config_map_key();
    let stash_at = d
        .actions
        .iter()
        .position(|a| matches!(a, Action::Stash { key, .. } if *key == claim_key));
    assert!(
        matches!(d.actions[0], Action::SetStatus(_)) && stash_at.is_some(),
        "{:?}",
        d.actions
    );
    assert!(
        d.actions
            .iter()
            .any(|a| matches!(a, Action::Delete { kind: Kind::Job, name, .. } if *name == copy))
    );
}

#[test]
fn another_pod_mounting_the_claim_during_the_copy_fails_the_member() {
    let mut o = at_step(MemberStep::Copying);
    o.claim_users = BTreeMap::from([("data-etcd-0".to_string(), vec!["backup-7".to_string()])]);
    let d = decide(&o, &SETTINGS);
    let s = first_status(&d);
    assert_eq!(s.stage, Stage::RollingBack);
    let failure = s.failure.as_deref().unwrap();
    assert!(
        failure.contains("claim data-etcd-0 of member etcd-0 is mounted by pod backup-7"),
        "{failure}"
    );
    // No copy Job is created for it.
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::Create(Object::Job(_)))),
        "{:?}",
        d.actions
    );
    // Other claims' users do not matter.
    o.claim_users = BTreeMap::from([("data-etcd-1".to_string(), vec!["backup-7".to_string()])]);
    let d = decide(&o, &SETTINGS);
    assert!(
        d.actions
            .iter()
            .any(|a| matches!(a, Action::Create(Object::Job(_)))),
        "the copy goes on: {:?}",
        d.actions
    );
}

#[test]
fn a_pod_that_comes_back_during_the_copy_fails_the_member() {
    let mut o = at_step(MemberStep::Copying);
    o.pods.insert("etcd-0".into(), manifest(member_pod(0)));
    let d = decide(&o, &SETTINGS);
    let s = first_status(&d);
    assert_eq!(s.stage, Stage::RollingBack);
    assert!(s.failure.as_deref().unwrap().contains("came back"));
}

#[test]
fn retaining_volumes_records_policies_before_patching() {
    // The decision that ended the copy stashed the claim too.
    let mut sim = Sim::at(MemberStep::RetainingVolumes);
    assert!(sim.o.stash.claims.contains_key("data-etcd-0"));
    // Record and patch in one decision: the status first.
    let d = decide(&sim.o, &SETTINGS);
    let ms = member0(&d);
    assert_eq!(
        ms.first_claim.old_volume_original_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(
        ms.first_claim.new_volume_original_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(ms.step, MemberStep::RetainingVolumes, "not before Retain");
    assert!(matches!(d.actions[0], Action::SetStatus(_)), "{d:?}");
    let patches = |d: &Decision| {
        d.actions
            .iter()
            .filter(
                |a| matches!(a, Action::PatchReclaimPolicy { policy, .. } if policy == "Retain"),
            )
            .count()
    };
    assert_eq!((d.actions.len(), patches(&d)), (3, 2), "{:?}", d.actions);
    for a in &d.actions {
        sim.apply(a);
    }
    // Both on Retain: on to the claims, the policies recorded unchanged (still "Delete").
    let d = decide(&sim.o, &SETTINGS);
    let ms = member0(&d);
    assert_eq!(ms.step, MemberStep::DeletingOldClaim);
    assert_eq!(
        ms.first_claim.old_volume_original_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(patches(&d), 0);
}

#[test]
fn the_old_and_the_temporary_claims_are_deleted_together() {
    let o = at_step(MemberStep::DeletingOldClaim);
    let d = decide(&o, &SETTINGS);
    let deleted: Vec<(&str, Option<&str>)> = d
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Delete {
                kind: Kind::Claim,
                name,
                uid,
                ..
            } => Some((name.as_str(), uid.as_deref())),
            _ => None,
        })
        .collect();
    let status = o.request.status.as_ref().unwrap();
    let temp = &status.plan.as_ref().unwrap().members[0].temp_claim;
    let uid = |c: &str| o.claims[c].uid();
    assert_eq!(
        deleted,
        [
            ("data-etcd-0", uid("data-etcd-0").as_deref()),
            (temp.as_str(), uid(temp).as_deref())
        ],
        "both by uid: {:?}",
        d.actions
    );
}

#[test]
fn quantities_and_timeouts() {
    assert_eq!(timeout_seconds("30m").unwrap(), 1800);
    assert_eq!(timeout_seconds("1h30m").unwrap(), 5400);
    assert_eq!(timeout_seconds("90s").unwrap(), 90);
    assert!(timeout_seconds("0s").is_err());
    assert!(timeout_seconds("soon").is_err());
}

/// The claim is recreated only once the PV controller has seen the new claimRef: `Available`
/// (a volume still `Bound` is its view from before the patch; a claim created then waits for its
/// periodic sync), or `Bound` to the live claim's uid (a swap resumed after the claim was made).
#[test]
fn the_claim_is_recreated_only_once_the_volume_is_available_to_it() {
    let mut sim = Sim::at(MemberStep::ReleasingNewVolume);
    let status = sim.o.request.status.clone().unwrap();
    let volume = status.members[0].first_claim.new_volume.clone().unwrap();
    let set = |sim: &mut Sim, phase: &str, uid: Option<&str>| {
        let pv = sim.o.volumes.get_mut(&volume).unwrap();
        let r = pv
            .spec
            .as_mut()
            .unwrap()
            .claim_ref
            .get_or_insert_with(Default::default);
        r.name = Some("data-etcd-0".into());
        r.namespace = Some(sim.o.request.namespace().unwrap());
        r.uid = uid.map(str::to_string);
        pv.status.get_or_insert_with(Default::default).phase = Some(phase.into());
    };
    sim.o.claims.remove("data-etcd-0");
    set(&mut sim, "Bound", None);
    let d = decide(&sim.o, &SETTINGS);
    assert!(d.actions.is_empty(), "a stale Bound waits: {:?}", d.actions);
    set(&mut sim, "Available", None);
    assert_eq!(
        member0(&decide(&sim.o, &SETTINGS)).step,
        MemberStep::RecreatingClaim
    );
    // Resumed: the claim exists, the volume bound to it.
    let mut claim = bound_claim("data-etcd-0", "fast", "1Gi", &volume);
    claim.metadata.uid = Some("uid-live".into());
    sim.o.claims.insert("data-etcd-0".into(), claim);
    set(&mut sim, "Bound", Some("uid-live"));
    let step = member0(&decide(&sim.o, &SETTINGS)).step;
    assert!(
        matches!(
            step,
            MemberStep::RecreatingClaim | MemberStep::RecreatingPod
        ),
        "{step:?}"
    );
}

#[test]
fn a_recreated_claim_left_pending_is_nudged_then_cleaned() {
    let o = at_step(MemberStep::RecreatingClaim);
    let mut sim = Sim::new(o);
    let d = decide(&sim.o, &SETTINGS);
    sim.apply(&d.actions[0]);
    let claim = sim.o.claims.get_mut("data-etcd-0").unwrap();
    claim.metadata.creation_timestamp = Some(Time(sim.o.now));
    claim.metadata.uid = Some("uid-recreated".into());
    let nudge = |d: &Decision| {
        matches!(
            &d.actions[..],
            [Action::AnnotateClaim { value: Some(_), .. }]
        )
    };
    // Just created, its volume not yet bound to it: the PV controller is at work, no nudge.
    let d = decide(&sim.o, &SETTINGS);
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(d.requeue, SWAP_POLL);
    // The volume carries the claim's uid while the claim is Pending: the controller's claim
    // worker lost its race with its volume worker; an annotation update makes it sync again.
    let status = sim.o.request.status.as_ref().unwrap();
    let volume = status.members[0].first_claim.new_volume.clone().unwrap();
    let pv = sim.o.volumes.get_mut(&volume).unwrap();
    let claim_ref = pv.spec.as_mut().unwrap().claim_ref.as_mut().unwrap();
    claim_ref.uid = Some("uid-recreated".into());
    // Binding in flight takes well under a second: no nudge yet.
    assert!(decide(&sim.o, &SETTINGS).actions.is_empty());
    sim.o.now = k8s_openapi::jiff::Timestamp::from_second(
        sim.o.now.as_second() + BIND_NUDGE_LOST_RACE_SECONDS,
    )
    .unwrap();
    let d = decide(&sim.o, &SETTINGS);
    assert!(nudge(&d), "{:?}", d.actions);
    sim.apply(&d.actions[0]);
    assert!(
        decide(&sim.o, &SETTINGS).actions.is_empty(),
        "one nudge per interval"
    );
    // Still Pending a second later: nudged again.
    sim.o.now = k8s_openapi::jiff::Timestamp::from_second(sim.o.now.as_second() + 1).unwrap();
    let d = decide(&sim.o, &SETTINGS);
    assert!(nudge(&d), "{:?}", d.actions);
    sim.apply(&d.actions[0]);
    // Bound: the annotation goes, the step advances.
    sim.settle();
    let d = decide(&sim.o, &SETTINGS);
    assert_eq!(member0(&d).step, MemberStep::RecreatingPod);
    assert!(
        d.actions
            .iter()
            .any(|a| matches!(a, Action::AnnotateClaim { value: None, .. }))
    );
}

#[test]
fn a_recreated_claim_whose_volume_shows_no_binding_is_nudged_after_the_fallback() {
    let o = at_step(MemberStep::RecreatingClaim);
    let mut sim = Sim::new(o);
    let d = decide(&sim.o, &SETTINGS);
    sim.apply(&d.actions[0]);
    let created = sim.o.now;
    let claim = sim.o.claims.get_mut("data-etcd-0").unwrap();
    claim.metadata.creation_timestamp = Some(Time(created));
    let at = |s: i64| k8s_openapi::jiff::Timestamp::from_second(created.as_second() + s).unwrap();
    sim.o.now = at(BIND_NUDGE_FALLBACK_SECONDS - 1);
    assert!(decide(&sim.o, &SETTINGS).actions.is_empty());
    sim.o.now = at(BIND_NUDGE_FALLBACK_SECONDS);
    let d = decide(&sim.o, &SETTINGS);
    assert!(
        matches!(
            &d.actions[..],
            [Action::AnnotateClaim { value: Some(_), .. }]
        ),
        "{:?}",
        d.actions
    );
}

/// The set and member pods as a cluster newer than our API structs returns them: fields
/// k8s-openapi does not know in the pod template / pod spec and their first container, and the
/// template's `creationTimestamp: null` that a typed round trip drops.
fn with_future_fields(o: &mut Observed) {
    let set = o.stateful_set.as_ref().unwrap();
    let mut raw = build::testdata::with_future_fields(set, "/spec/template/spec").into_raw();
    raw["spec"]["template"]["metadata"]["creationTimestamp"] = serde_json::Value::Null;
    o.stateful_set = Some(build::Manifest::from_raw(raw).unwrap());
    for p in o.pods.values_mut() {
        *p = build::testdata::with_future_fields(p, "/spec");
    }
}

/// Asserts that every StatefulSet and member pod the planner created kept the unknown fields:
/// the set's template equal to `template`, each pod's spec with the original's fields.
fn assert_created_with_future_fields(
    sim: &Sim,
    template: &serde_json::Value,
    pods: &BTreeMap<String, serde_json::Value>,
) -> (usize, usize) {
    let (mut sets, mut members) = (0, 0);
    for a in &sim.log {
        match a {
            Action::Create(Object::StatefulSet(s)) => {
                sets += 1;
                assert_eq!(&s.raw()["spec"]["template"], template);
            }
            Action::Create(Object::Pod(p)) if pods.contains_key(&p.name_any()) => {
                members += 1;
                let (old, new) = (&pods[&p.name_any()], &p.raw()["spec"]);
                assert_eq!(new["someFutureField"], serde_json::json!({"x": 1}));
                assert_eq!(new["containers"], old["containers"]);
                assert!(new.get("nodeName").is_none());
            }
            _ => {}
        }
    }
    (sets, members)
}

#[test]
fn unknown_fields_survive_a_whole_migration() {
    let mut o = observed(spec_class_change("fast"));
    with_future_fields(&mut o);
    let template = o.stateful_set.as_ref().unwrap().raw()["spec"]["template"].clone();
    let pods: BTreeMap<String, serde_json::Value> = o
        .pods
        .iter()
        .map(|(n, p)| (n.clone(), p.raw()["spec"].clone()))
        .collect();
    let mut sim = Sim::new(o);
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful);
    assert_eq!(
        assert_created_with_future_fields(&sim, &template, &pods),
        (1, 3)
    );
    let set = sim.o.stateful_set.as_ref().unwrap();
    assert_eq!(set.raw()["spec"]["template"], template, "byte for byte");
    assert_eq!(
        set.raw()["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"],
        "fast"
    );
    for (name, spec) in &pods {
        let now = &sim.o.pods[name].raw()["spec"];
        assert_eq!(now["someFutureField"], spec["someFutureField"]);
        assert_eq!(now["containers"], spec["containers"]);
    }
}

#[test]
fn unknown_fields_survive_a_rollback() {
    let mut o = observed(spec_class_change("fast"));
    with_future_fields(&mut o);
    let template = o.stateful_set.as_ref().unwrap().raw()["spec"]["template"].clone();
    let pods: BTreeMap<String, serde_json::Value> = o
        .pods
        .iter()
        .map(|(n, p)| (n.clone(), p.raw()["spec"].clone()))
        .collect();
    let mut sim = Sim::new(o);
    sim.jobs.fail = vec!["copy".into()];
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Failed);
    assert_eq!(
        assert_created_with_future_fields(&sim, &template, &pods),
        (1, 1),
        "the set and the stopped member are recreated from their stash"
    );
    let set = sim.o.stateful_set.as_ref().unwrap();
    assert_eq!(set.raw()["spec"]["template"], template);
    assert_eq!(
        set.raw()["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"],
        "standard"
    );
}

/// A transition the state machine refuses drops the whole decision: the status says stuck, the
/// stage and steps stay where they were, no other action runs.
#[test]
fn a_refused_transition_turns_the_decision_into_stuck() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    sim.run(3);
    let before = sim.o.request.status.clone().unwrap();
    assert_eq!(before.stage, Stage::OrphaningStatefulSet);
    let o = sim.o.clone();
    let mut cx = Ctx::new(&o, &SETTINGS);
    cx.act(Action::AddFinalizer);
    cx.advance_member(0, MemberStep::Done);
    cx.enter_stage(Stage::Preflight);
    let d = cx.finish();
    let s = first_status(&d);
    assert_eq!(s.stage, Stage::OrphaningStatefulSet);
    assert_eq!(s.members, before.members);
    assert_eq!(
        s.message.as_deref(),
        Some(
            "stuck: the planner tried a transition its state machine does not allow: member \
             etcd-0 cannot go from step Pending to Done (runbook: \
             docs/runbook.md#stuck-a-transition-the-state-machine-does-not-allow)"
        ),
        "the first refusal is the one reported"
    );
    assert_eq!(d.actions.len(), 2, "{:?}", d.actions);
    assert!(matches!(
        &d.actions[1],
        Action::Event { type_: EventType::Warning, reason, .. } if reason == "Stuck"
    ));
    assert_eq!(d.requeue, REQUEUE_WAITING);
}

#[test]
fn a_refused_stage_transition_is_reported() {
    let sim = Sim::new(observed(spec_class_change("fast")));
    let o = sim.o.clone();
    let mut cx = Ctx::new(&o, &SETTINGS);
    cx.enter_stage(Stage::RollingBack);
    let d = cx.finish();
    let s = first_status(&d);
    assert_eq!(s.stage, Stage::Preflight);
    assert_eq!(
        s.message.as_deref(),
        Some(
            "stuck: the planner tried a transition its state machine does not allow: the \
             request cannot go from stage Preflight to RollingBack (runbook: \
             docs/runbook.md#stuck-a-transition-the-state-machine-does-not-allow)"
        )
    );
}

/// The failure messages are user-visible (status, conditions, Events): they stay as they were.
#[test]
fn failure_messages() {
    let s = |f: Failure| f.to_string();
    assert_eq!(
        s(Failure::TimedOut {
            timeout: "30m".into()
        }),
        "the request's timeout of 30m expired"
    );
    assert_eq!(
        s(Failure::Deleted),
        "the request was deleted while progressing"
    );
    assert_eq!(
        s(Failure::PreCopyFailed {
            pod: "etcd-0".into(),
            reason: "BackoffLimitExceeded".into()
        }),
        "pre-copy of member etcd-0 failed: BackoffLimitExceeded"
    );
    assert_eq!(
        s(Failure::CopyMemoryTooLow(Box::new(
            super::failure::MemoryShortfall {
                pod: "etcd-0".into(),
                claim: "data-etcd-0".into(),
                needed: "309Mi".into(),
                entries: 1_000_000,
                bytes: "1Gi".into(),
                limit: "256Mi".into(),
            }
        ))),
        "member etcd-0 was not stopped: its final copy needs about 309Mi of memory for the \
         1000000 files and directories (1Gi in use) on data-etcd-0, more than \
         spec.copy.resources.limits.memory 256Mi; raise or remove that limit"
    );
    assert_eq!(
        s(Failure::CopyFailed {
            claim: "data-etcd-0".into(),
            temp_claim: "tmp".into(),
            reason: "x".into()
        }),
        "copy of claim data-etcd-0 to tmp failed: x"
    );
    assert_eq!(
        s(Failure::VerifyFailed {
            pod: "etcd-0".into(),
            reason: "x".into()
        }),
        "verification of member etcd-0 failed: x"
    );
    assert_eq!(
        s(Failure::Differences {
            pod: "etcd-0".into(),
            differences: 2,
            claim: "a".into(),
            temp_claim: "b".into()
        }),
        "verification of member etcd-0 found 2 differences between a and b"
    );
    assert_eq!(
        s(Failure::NoVerification {
            pod: "etcd-0".into(),
            result: None
        }),
        "verification of member etcd-0 reported no result (None)"
    );
    assert_eq!(
        s(Failure::NoVerification {
            pod: "etcd-0".into(),
            result: Some(Box::new(build::JobResult {
                bytes: Some(1),
                ..Default::default()
            }))
        }),
        format!(
            "verification of member etcd-0 reported no result ({:?})",
            Some(build::JobResult {
                bytes: Some(1),
                ..Default::default()
            })
        )
    );
    assert_eq!(s(Failure::NoPlan), "the status has no plan");
    assert_eq!(
        s(Failure::NoMemberStatus { index: 4 }),
        "no member status #4"
    );
    assert_eq!(
        s(Failure::NotInPlan { pod: "p".into() }),
        "member p is not in the plan"
    );
    assert_eq!(
        s(Failure::StatefulSetDisappeared {
            name: "etcd".into()
        }),
        "StatefulSet etcd disappeared before it was stashed"
    );
    assert_eq!(
        s(Failure::ClaimDisappeared {
            claim: "c".into(),
            pod: "p".into()
        }),
        "claim c of member p disappeared"
    );
    assert_eq!(
        s(Failure::PodDisappeared { pod: "p".into() }),
        "pod p disappeared before its manifest was stashed"
    );
    assert_eq!(
        s(Failure::PodCameBack { pod: "p".into() }),
        "member pod p came back during its copy (something else recreated it)"
    );
    assert_eq!(
        s(Failure::TempClaimLost { claim: "t".into() }),
        "temporary claim t lost its volume"
    );
    assert_eq!(
        s(Failure::VolumeUnreachable {
            volume: "v".into(),
            node: "n".into(),
            pod: "p".into()
        }),
        "new volume v was provisioned where node n (member p) cannot reach it"
    );
    assert_eq!(
        s(Failure::MounterPod { error: "e".into() }),
        "cannot build the mounter pod: e"
    );
    assert_eq!(
        s(Failure::MounterStuck {
            pod: "p".into(),
            reason: "r".into()
        }),
        "the mounter pod of member p failed: r"
    );
    assert_eq!(
        s(Failure::Stash {
            key: "k".into(),
            error: "e".into()
        }),
        "cannot stash k: e"
    );
    assert_eq!(
        s(Failure::RetentionPolicy { error: "e".into() }),
        "cannot restore the retention policy: e"
    );
}

// -------------------------------------------------------------------------------------------
// The final consistency check, before any old volume gets back a policy that can delete it.

fn etcd_spec() -> crate::api::StorageMigrationRequestSpec {
    let mut spec = spec_class_change("fast");
    spec.database.engine = crate::api::DatabaseEngine::Etcd;
    spec
}

/// `observed(spec)` with the health of an etcd cluster that etcd-0 leads (member ids, raft
/// indexes, three voters).
fn etcd_observed(spec: crate::api::StorageMigrationRequestSpec) -> Observed {
    let mut o = observed(spec);
    if let Ok(h) = o.health.as_mut() {
        h.leader = Some("etcd-0".into());
        h.voting_members = Some(3);
        for m in &mut h.members {
            m.member_id = Some(m.pod.clone());
            m.position = Some(100);
            m.leader = m.pod == "etcd-0";
        }
    }
    o
}

/// Runs the simulator until the request has just entered `Finalizing` (nothing of that stage
/// done yet).
fn run_to_finalizing(sim: &mut Sim) {
    for _ in 0..400 {
        let d = decide(&sim.o, &SETTINGS);
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
        if sim.o.request.status.as_ref().unwrap().stage == Stage::Finalizing {
            return;
        }
    }
    panic!("never reached Finalizing");
}

fn status_of(sim: &Sim) -> StorageMigrationRequestStatus {
    sim.o.request.status.clone().unwrap()
}

/// Every old volume is still there, on Retain and labelled; every claim is bound to its new
/// volume; the failure message names each new and old volume.
fn assert_failed_with_old_volumes_kept(sim: &Sim, cause: &str) {
    let s = status_of(sim);
    assert_eq!(s.phase, Phase::Failed, "{:?}", s.message);
    let message = s.message.clone().unwrap();
    assert!(message.contains(cause), "{message}");
    for i in 0..3 {
        let old_name = format!("pv-old-{i}");
        let old = &sim.o.volumes[&old_name];
        assert_eq!(volume_policy(old), "Retain", "{old_name}");
        assert_eq!(old.labels()[labels::MIGRATED_BY_LABEL], REQ);
        let claim_name = format!("data-etcd-{i}");
        let new = claim_volume(&sim.o.claims[&claim_name])
            .unwrap()
            .to_string();
        assert!(new.starts_with("pv-new-"), "{new}");
        let data = format!(
            "etcd-{i} on claim {claim_name} -> new volume {new} (fast; old volume {old_name} kept, Retain)"
        );
        assert!(message.contains(&data), "{data} not in {message}");
        assert!(sim.o.pods.contains_key(&format!("etcd-{i}")));
    }
    assert!(
        !sim.log.iter().any(|a| matches!(
            a,
            Action::PatchReclaimPolicy { volume, policy } if volume.starts_with("pv-old-") && policy != "Retain"
        )),
        "an old volume's policy was restored"
    );
}

/// A `hash_kv` every one of `members` agreed on.
fn agreed(hash: &str, members: &[&str]) -> crate::engine::FinalHash {
    crate::engine::FinalHash {
        hash: hash.into(),
        members: members.iter().map(|m| m.to_string()).collect(),
    }
}

#[test]
fn etcd_hash_agreement_succeeds_and_restores_old_policies_after_the_check() {
    let mut o = etcd_observed(etcd_spec());
    o.final_hash = Some(Ok(Some(agreed(
        "3735928559",
        &["etcd-0", "etcd-1", "etcd-2"],
    ))));
    let mut sim = Sim::new(o);
    sim.run(400);
    let s = status_of(&sim);
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    assert_eq!(s.final_hash.as_deref(), Some("3735928559"));
    assert!(
        s.message
            .as_deref()
            .unwrap()
            .ends_with("; every member's hash_kv is 3735928559")
    );
    // The hash is written before the first old volume's policy is restored.
    let recorded = sim
        .log
        .iter()
        .position(|a| matches!(a, Action::SetStatus(s) if s.final_hash.is_some()))
        .unwrap();
    let restored = sim
        .log
        .iter()
        .position(|a| {
            matches!(a, Action::PatchReclaimPolicy { volume, policy }
                if volume.starts_with("pv-old-") && policy == "Delete")
        })
        .unwrap();
    assert!(recorded < restored);
    for i in 0..3 {
        let old = &sim.o.volumes[&format!("pv-old-{i}")];
        assert_eq!(volume_policy(old), "Delete", "original policy restored");
    }
    assert_machine_transitions(&sim);
}

#[test]
fn etcd_inconsistent_hashes_fail_and_keep_old_volumes() {
    let mut o = etcd_observed(etcd_spec());
    o.final_hash = Some(Err(FinalHashError::Inconsistent(
        "hash_kv at revision 4 differs".into(),
    )));
    let mut sim = Sim::new(o);
    sim.run(400);
    assert_failed_with_old_volumes_kept(
        &sim,
        "the final consistency check failed: members are inconsistent: hash_kv at revision 4 differs",
    );
    assert_eq!(status_of(&sim).final_hash, None);
    assert!(sim.o.request.finalizers().is_empty());
    // The new volumes are the members' live volumes: back to their class's policy.
    for i in 0..3 {
        let new = claim_volume(&sim.o.claims[&format!("data-etcd-{i}")]).unwrap();
        assert_eq!(volume_policy(&sim.o.volumes[new]), "Delete");
    }
    assert_machine_transitions(&sim);
}

#[test]
fn an_etcd_check_that_cannot_be_computed_waits_then_fails_at_the_timeout() {
    let mut o = etcd_observed(etcd_spec());
    o.final_hash = Some(Err(FinalHashError::Engine("etcd-1 is unreachable".into())));
    let mut sim = Sim::new(o);
    run_to_finalizing(&mut sim);
    for _ in 0..20 {
        let d = decide(&sim.o, &SETTINGS);
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
    }
    let s = status_of(&sim);
    assert_eq!(s.stage, Stage::Finalizing, "still waiting");
    assert!(!s.phase.is_final());
    let c = conditions::get(&s.conditions, conditions::PROGRESSING).unwrap();
    assert_eq!(c.reason, "FinalCheckPending");
    assert!(c.message.contains("etcd-1 is unreachable"), "{}", c.message);
    assert_eq!(
        sim.reasons()
            .iter()
            .filter(|r| **r == "FinalCheckPending")
            .count(),
        1,
        "one Event while the reason stays the same"
    );
    for i in 0..3 {
        assert_eq!(
            volume_policy(&sim.o.volumes[&format!("pv-old-{i}")]),
            "Retain"
        );
    }
    // The request's timeout (30m from its start) expires while it still waits.
    let start = s.start_time.unwrap().0.as_second();
    sim.o.now = t(start + 1801);
    sim.run(100);
    assert_failed_with_old_volumes_kept(
        &sim,
        "the request's timeout of 30m expired before the final consistency check could be computed (etcd-1 is unreachable)",
    );
}

#[test]
fn an_etcd_check_that_becomes_computable_succeeds() {
    let mut o = etcd_observed(etcd_spec());
    o.final_hash = None;
    let mut sim = Sim::new(o);
    run_to_finalizing(&mut sim);
    for _ in 0..5 {
        let d = decide(&sim.o, &SETTINGS);
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
    }
    assert_eq!(status_of(&sim).stage, Stage::Finalizing);
    sim.o.final_hash = Some(Ok(Some(agreed("42", &["etcd-0", "etcd-1", "etcd-2"]))));
    sim.run(100);
    let s = status_of(&sim);
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    assert_eq!(s.final_hash.as_deref(), Some("42"));
}

/// A planned member with no pod, or one that gave no hash, keeps the final check pending (not
/// passed, not failed), until the request's timeout.
#[test]
fn a_planned_member_missing_from_the_final_check_keeps_it_pending() {
    let mut o = etcd_observed(etcd_spec());
    o.final_hash = None;
    let mut sim = Sim::new(o);
    run_to_finalizing(&mut sim);
    // etcd-2 has no pod: the engine hashed the two that exist, and they agree.
    let pod = sim.o.pods.remove("etcd-2").unwrap();
    sim.o.final_hash = Some(Ok(Some(agreed("42", &["etcd-0", "etcd-1"]))));
    for _ in 0..10 {
        let d = decide(&sim.o, &SETTINGS);
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
    }
    let s = status_of(&sim);
    assert_eq!(s.stage, Stage::Finalizing, "still waiting");
    assert!(!s.phase.is_final(), "{:?}", s.message);
    assert_eq!(s.final_hash, None, "not passed");
    let c = conditions::get(&s.conditions, conditions::PROGRESSING).unwrap();
    assert_eq!(c.reason, "FinalCheckPending");
    assert!(
        c.message
            .contains("missing etcd-2 (no pod); covered: etcd-0, etcd-1"),
        "{}",
        c.message
    );
    for i in 0..3 {
        assert_eq!(
            volume_policy(&sim.o.volumes[&format!("pv-old-{i}")]),
            "Retain"
        );
    }
    // Its pod back but no hash from it: still pending.
    sim.o.pods.insert("etcd-2".into(), pod);
    let d = decide(&sim.o, &SETTINGS);
    for a in &d.actions {
        sim.apply(a);
    }
    let s = status_of(&sim);
    assert_eq!((s.stage, s.final_hash.clone()), (Stage::Finalizing, None));
    let c = conditions::get(&s.conditions, conditions::PROGRESSING).unwrap();
    assert!(
        c.message.contains("missing etcd-2 (no hash_kv)"),
        "{}",
        c.message
    );
    // Every planned member covered: it passes.
    sim.o.final_hash = Some(Ok(Some(agreed("42", &["etcd-0", "etcd-1", "etcd-2"]))));
    sim.run(100);
    let s = status_of(&sim);
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    assert_eq!(s.final_hash.as_deref(), Some("42"));
}

#[test]
fn generic_with_verification_records_it_and_succeeds() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    sim.run(400);
    let s = status_of(&sim);
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    assert!(
        s.members.iter().all(|m| m.first_claim.verified.is_some()),
        "{s:?}"
    );
    assert!(!s.message.unwrap().contains("hash_kv"));
}

#[test]
fn generic_member_without_verification_on_record_fails() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    run_to_finalizing(&mut sim);
    sim.o.request.status.as_mut().unwrap().members[1]
        .first_claim
        .verified = None;
    let pod = status_of(&sim).members[1].pod.clone();
    sim.run(100);
    assert_failed_with_old_volumes_kept(
        &sim,
        &format!("the final check found no verification on record for members {pod}"),
    );
}

#[test]
fn generic_without_verification_keeps_old_volumes_on_retain() {
    let mut spec = spec_class_change("fast");
    spec.copy.verify = false;
    let mut sim = Sim::new(observed(spec));
    sim.run(400);
    let s = status_of(&sim);
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    assert!(
        s.message.as_deref().unwrap().ends_with(
            "; the copies were not verified (spec.copy.verify is false): the old volumes are kept on Retain"
        ),
        "{:?}",
        s.message
    );
    assert!(s.members.iter().all(|m| m.first_claim.verified.is_none()));
    assert!(sim.reasons().contains(&"OldVolumesRetained"));
    for i in 0..3 {
        let old = &sim.o.volumes[&format!("pv-old-{i}")];
        assert_eq!(volume_policy(old), "Retain");
        assert_eq!(old.labels()[labels::MIGRATED_BY_LABEL], REQ);
    }
}

/// Runs the simulation until the planner decides the orphan delete of the StatefulSet; returns
/// that decision, not applied.
fn until_orphan_delete(sim: &mut Sim) -> Decision {
    for _ in 0..100 {
        let d = decide(&sim.o, &SETTINGS);
        if d.actions.iter().any(|a| {
            matches!(
                a,
                Action::Delete {
                    kind: Kind::StatefulSet,
                    ..
                }
            )
        }) {
            return d;
        }
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
    }
    panic!("the StatefulSet was never deleted");
}

fn set_delete_version(d: &Decision) -> Option<Option<String>> {
    d.actions.iter().find_map(|a| match a {
        Action::Delete {
            kind: Kind::StatefulSet,
            resource_version,
            uid,
            ..
        } => {
            assert!(uid.is_some(), "the orphan delete carries the set's uid");
            Some(resource_version.clone())
        }
        _ => None,
    })
}

#[test]
fn a_set_changed_after_its_stash_is_stashed_again_then_deleted_with_the_new_version() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    let stale = until_orphan_delete(&mut sim);
    let stashed = sim
        .o
        .stash
        .stateful_set
        .as_ref()
        .unwrap()
        .resource_version();
    assert_eq!(set_delete_version(&stale), Some(stashed.clone()));
    // Someone scales the set after the planner looked.
    sim.o.stateful_set.as_mut().unwrap().update(|s| {
        s.metadata.resource_version = Some("edited-7".into());
        s.spec.as_mut().unwrap().replicas = Some(5);
    });
    // The delete decided before the edit is refused (409) and deletes nothing.
    for a in &stale.actions {
        sim.apply(a);
    }
    assert_eq!(sim.refused.len(), 1, "{:?}", sim.refused);
    assert!(sim.o.stateful_set.is_some());
    // The next pass stashes the set as it is now, and deletes nothing.
    let d = decide(&sim.o, &SETTINGS);
    assert!(set_delete_version(&d).is_none(), "{:?}", d.actions);
    assert!(
        d.actions.iter().any(|a| matches!(a, Action::Stash { .. })),
        "{:?}",
        d.actions
    );
    for a in &d.actions {
        sim.apply(a);
    }
    let restashed = sim.o.stash.stateful_set.as_ref().unwrap();
    assert_eq!(restashed.resource_version().as_deref(), Some("edited-7"));
    assert_eq!(restashed.spec.as_ref().unwrap().replicas, Some(5));
    // Then the delete carries the new version, and the set goes.
    let d = decide(&sim.o, &SETTINGS);
    assert_eq!(set_delete_version(&d), Some(Some("edited-7".into())));
    for a in &d.actions {
        sim.apply(a);
    }
    assert!(sim.o.stateful_set.is_none());
    assert_eq!(sim.refused.len(), 1);
}

#[test]
fn the_retention_patch_makes_a_second_stash_and_the_run_succeeds() {
    let mut o = observed(spec_class_change("fast"));
    o.stateful_set.as_mut().unwrap().update(|s| {
        s.spec
            .as_mut()
            .unwrap()
            .persistent_volume_claim_retention_policy =
            Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
                when_deleted: Some("Delete".into()),
                when_scaled: Some("Retain".into()),
            });
    });
    let mut sim = Sim::new(o);
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful, "{:?}", sim.reasons());
    assert!(sim.refused.is_empty(), "{:?}", sim.refused);
    let versions: Vec<Option<String>> = sim
        .log
        .iter()
        .filter_map(|a| match a {
            Action::Delete {
                kind: Kind::StatefulSet,
                resource_version,
                ..
            } => Some(resource_version.clone()),
            _ => None,
        })
        .collect();
    // The retention patch made a new version of the set: stashed again, deleted with it.
    assert_eq!(versions, vec![Some("sim-1".to_string())]);
    let stashes = sim
        .log
        .iter()
        .filter(|a| matches!(a, Action::Stash { key, .. } if key == labels::STASH_STATEFULSET_KEY))
        .count();
    assert_eq!(stashes, 2);
}

fn holder_pod(name: &str, claim: &str) -> k8s_openapi::api::core::v1::Pod {
    let mut pod = member_pod(0);
    pod.metadata.name = Some(name.into());
    pod.metadata.uid = Some(format!("uid-{name}"));
    let spec = pod.spec.as_mut().unwrap();
    spec.volumes = Some(vec![k8s_openapi::api::core::v1::Volume {
        name: "data".into(),
        persistent_volume_claim: Some(
            k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource {
                claim_name: claim.into(),
                read_only: None,
            },
        ),
        ..Default::default()
    }]);
    pod
}

fn deletes_claim(d: &Decision, claim: &str) -> bool {
    d.actions
        .iter()
        .any(|a| matches!(a, Action::Delete { kind: Kind::Claim, name, .. } if name == claim))
}

#[test]
fn the_old_claim_is_deleted_by_its_stashed_uid() {
    let o = at_step(MemberStep::DeletingOldClaim);
    let stashed = o.stash.claims["data-etcd-0"].uid();
    assert!(stashed.is_some());
    let d = decide(&o, &SETTINGS);
    let uid = d.actions.iter().find_map(|a| match a {
        Action::Delete {
            kind: Kind::Claim,
            name,
            uid,
            ..
        } if name == "data-etcd-0" => Some(uid.clone()),
        _ => None,
    });
    assert_eq!(uid, Some(stashed));
}

#[test]
fn an_old_claim_held_by_a_pod_is_not_deleted_and_the_message_names_the_pod() {
    for terminating in [false, true] {
        let mut o = at_step(MemberStep::DeletingOldClaim);
        let mut pod = holder_pod("backup-reader", "data-etcd-0");
        if terminating {
            pod.metadata.deletion_timestamp = Some(Time(t(5)));
        }
        o.helper_pods.insert("backup-reader".into(), pod);
        let d = decide(&o, &SETTINGS);
        assert!(!deletes_claim(&d, "data-etcd-0"), "{:?}", d.actions);
        let s = first_status(&d);
        assert_eq!(member0(&d).step, MemberStep::DeletingOldClaim);
        let message = s.message.clone().unwrap();
        assert!(
            message.contains("backup-reader") && message.contains("data-etcd-0"),
            "{message}"
        );
        // Once the pod is gone the claim is deleted.
        o.helper_pods.remove("backup-reader");
        o.request.status = Some(s.clone());
        assert!(deletes_claim(&decide(&o, &SETTINGS), "data-etcd-0"));
    }
}

#[test]
fn a_finished_pod_does_not_hold_the_old_claim() {
    for phase in ["Succeeded", "Failed"] {
        let mut o = at_step(MemberStep::DeletingOldClaim);
        let mut pod = holder_pod("etcd-0-copy-x", "data-etcd-0");
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        o.helper_pods.insert("etcd-0-copy-x".into(), pod);
        let d = decide(&o, &SETTINGS);
        assert!(deletes_claim(&d, "data-etcd-0"), "{phase}: {:?}", d.actions);
        // And it is removed at once, by uid, as the pod garbage collector removes a terminated
        // pod: claim protection would otherwise keep the deleted claim until it is gone.
        let uid = o.helper_pods["etcd-0-copy-x"].uid();
        assert!(
            d.actions.contains(&Action::ForceDeletePod {
                name: "etcd-0-copy-x".into(),
                uid
            }),
            "{phase}: {:?}",
            d.actions
        );
    }
}

#[test]
fn only_finished_pods_of_the_swapped_claims_are_force_deleted() {
    let mut o = at_step(MemberStep::DeletingOldClaim);
    let finished = |name: &str, claim: &str| {
        let mut pod = holder_pod(name, claim);
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        pod
    };
    let temp = o
        .request
        .status
        .as_ref()
        .unwrap()
        .plan
        .as_ref()
        .unwrap()
        .members[0]
        .temp_claim
        .clone();
    o.helper_pods
        .insert("verify".into(), finished("verify", &temp));
    o.helper_pods.insert(
        "other-member".into(),
        finished("other-member", "data-etcd-1"),
    );
    o.helper_pods
        .insert("reader".into(), holder_pod("reader", &temp));
    let d = decide(&o, &SETTINGS);
    let forced: Vec<&str> = d
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::ForceDeletePod { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(forced, ["verify"], "{:?}", d.actions);
}

#[test]
fn an_old_claim_replaced_by_another_uid_fails_the_member_naming_both_uids() {
    let mut o = at_step(MemberStep::DeletingOldClaim);
    let stashed = o.stash.claims["data-etcd-0"].uid().unwrap();
    o.claims.get_mut("data-etcd-0").unwrap().metadata.uid = Some("uid-successor".into());
    let d = decide(&o, &SETTINGS);
    assert!(!deletes_claim(&d, "data-etcd-0"), "{:?}", d.actions);
    let s = first_status(&d);
    assert_eq!(s.stage, Stage::RollingBack);
    let failure = s.failure.clone().unwrap();
    assert!(
        failure.contains("data-etcd-0")
            && failure.contains(&stashed)
            && failure.contains("uid-successor"),
        "{failure}"
    );
}

#[test]
fn a_gate_closed_at_stopping_pod_deletes_no_pod_and_waits() {
    let o = at_step(MemberStep::StoppingPod);
    let mut sim = Sim::new(o);
    // The first pass stashes the pod.
    let d = decide(&sim.o, &SETTINGS);
    for a in &d.actions {
        sim.apply(a);
    }
    assert!(sim.o.stash.pods.contains_key("etcd-0"));
    let mut o = sim.o.clone();
    not_ready(&mut o, "etcd-2");
    let d = decide(&o, &SETTINGS);
    assert!(
        !d.actions.iter().any(|a| matches!(
            a,
            Action::Delete {
                kind: Kind::Pod,
                ..
            }
        )),
        "{:?}",
        d.actions
    );
    assert_eq!(member0(&d).step, MemberStep::StoppingPod);
    let s = first_status(&d);
    let gate = conditions::get(&s.conditions, conditions::HEALTH_GATE).unwrap();
    assert_eq!(gate.status, "False");
    assert!(
        gate.message.contains("etcd-0") && gate.message.contains("not deleted"),
        "{}",
        gate.message
    );
    // With the gate open the pod is deleted.
    assert!(
        decide(&sim.o, &SETTINGS)
            .actions
            .iter()
            .any(|a| matches!(a, Action::Delete { kind: Kind::Pod, name, .. } if name == "etcd-0"))
    );
}

#[test]
fn a_pod_already_terminating_at_stopping_pod_is_not_gated() {
    let o = at_step(MemberStep::StoppingPod);
    let mut sim = Sim::new(o);
    let d = decide(&sim.o, &SETTINGS);
    for a in &d.actions {
        sim.apply(a);
    }
    let mut o = sim.o.clone();
    not_ready(&mut o, "etcd-2");
    o.pods
        .get_mut("etcd-0")
        .unwrap()
        .update(|p| p.metadata.deletion_timestamp = Some(Time(t(5))));
    let d = decide(&o, &SETTINGS);
    assert!(d.actions.iter().all(
        |a| !matches!(a, Action::SetStatus(s) if s.members[0].step != MemberStep::StoppingPod)
    ));
    o.pods.remove("etcd-0");
    let d = decide(&o, &SETTINGS);
    assert_eq!(member0(&d).step, MemberStep::Copying);
}

#[test]
fn a_member_pod_that_appears_during_the_swap_holds_it_with_a_message() {
    for step in [
        MemberStep::RetainingVolumes,
        MemberStep::DeletingOldClaim,
        MemberStep::DeletingTempClaim,
        MemberStep::ReleasingNewVolume,
        MemberStep::RecreatingClaim,
    ] {
        let mut o = Sim::at_or_left_behind(step).o;
        let mut pod = member_pod(0);
        pod.metadata.uid = Some("uid-intruder".into());
        o.pods.insert("etcd-0".into(), manifest(pod));
        let d = decide(&o, &SETTINGS);
        assert!(
            d.actions
                .iter()
                .all(|a| matches!(a, Action::SetStatus(_) | Action::Event { .. })),
            "{step:?}: {:?}",
            d.actions
        );
        assert_eq!(member0(&d).step, step);
        let message = first_status(&d).message.clone().unwrap();
        assert!(
            message.contains("etcd-0") && message.contains("uid-intruder"),
            "{message}"
        );
    }
}

#[test]
fn claim_replaced_names_the_claim_and_both_uids() {
    let f = Failure::ClaimReplaced {
        claim: "data-etcd-0".into(),
        stashed_uid: "uid-a".into(),
        live_uid: "uid-b".into(),
    };
    assert_eq!(
        f.to_string(),
        "claim data-etcd-0 was replaced before its deletion: stashed uid uid-a, now uid uid-b; \
         the claim now there is left alone"
    );
}

// --- The image of what the planner creates. -------------------------------------------------

/// The images of the Jobs (by kind) and mounter pods a whole simulated request created.
fn created_images(spec: StorageMigrationRequestSpec, allow: bool) -> Vec<(String, String)> {
    let mut sim = Sim::new(observed(spec));
    sim.settings.allow_request_mover_image = allow;
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful);
    let image = |c: &k8s_openapi::api::core::v1::Container| c.image.clone().unwrap_or_default();
    sim.log
        .iter()
        .filter_map(|a| match a {
            Action::Create(Object::Job(j)) => {
                let pod = j.spec.as_ref()?.template.spec.as_ref()?;
                let kind = j.labels()[labels::JOB_KIND_LABEL].clone();
                Some((kind, image(&pod.containers[0])))
            }
            Action::Create(Object::Pod(p)) => {
                let c = &p.typed().spec.as_ref()?.containers[0];
                (c.name == "mounter").then(|| ("mounter".to_string(), image(c)))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn jobs_and_mounters_run_the_operator_image_unless_the_request_names_one_and_may() {
    for spec in [spec_class_change("fast"), spec_shrink("256Mi")] {
        let got = created_images(spec.clone(), false);
        let kinds: std::collections::BTreeSet<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        let want: &[&str] = if spec.type_ == crate::api::MigrationType::Shrink {
            // Same (Immediate) class: no mounter needed.
            &["copy", "measure", "precopy"]
        } else {
            // WaitForFirstConsumer class: mounters get the volumes provisioned. No verify Job:
            // the final copy verifies in its own pod.
            &["copy", "mounter", "precopy"]
        };
        assert_eq!(kinds.into_iter().collect::<Vec<_>>(), want);
        assert!(got.iter().all(|(_, i)| i == IMAGE.as_str()), "{got:?}");

        let mut own = spec;
        own.copy.mover_image = Some("registry.test/my-mover:2".into());
        let got = created_images(own, true);
        assert!(!got.is_empty());
        assert!(
            got.iter().all(|(_, i)| i == "registry.test/my-mover:2"),
            "{got:?}"
        );
    }
}

// --- Helper pods that cannot start or are evicted. -------------------------------------------

/// A pod of Job `job` created at `created`, in `status`.
fn job_pod(job: &str, created: k8s_openapi::jiff::Timestamp, status: PodStatusFixture) -> Pod {
    let mut pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("{job}-x1"),
            "namespace": NS,
            "labels": {"job-name": job},
            "creationTimestamp": created.to_string(),
        },
        "spec": {"containers": [{"name": "mover"}], "nodeName": "node-a"},
    }))
    .unwrap();
    pod.status = Some(match status {
        PodStatusFixture::Waiting(reason) => serde_json::from_value(serde_json::json!({
            "phase": "Pending",
            "containerStatuses": [{"name": "mover", "image": "x", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"waiting": {"reason": reason, "message": "Back-off pulling image \"nope:1\""}}}],
        }))
        .unwrap(),
        PodStatusFixture::Evicted => serde_json::from_value(serde_json::json!({
            "phase": "Failed", "reason": "Evicted",
            "message": "The node was low on resource: ephemeral-storage.",
        }))
        .unwrap(),
    });
    pod
}

enum PodStatusFixture {
    Waiting(&'static str),
    Evicted,
}

#[test]
fn a_copy_pod_that_cannot_pull_its_image_fails_the_member_within_the_start_timeout() {
    let mut sim = Sim::at(MemberStep::Copying);
    sim.jobs.hang = true;
    sim.run(1);
    let job = build::job_name(REQ, "etcd-0", JobKind::Copy);
    assert!(sim.o.jobs.contains_key(&job), "copy Job created");
    let created = sim.o.now;
    let pod = job_pod(&job, created, PodStatusFixture::Waiting("ImagePullBackOff"));
    sim.o.helper_pods.insert(pod.name_any(), pod);
    let timeout = sim.settings.helper_start_timeout.as_secs() as i64;
    // Within the timeout: waiting.
    sim.o.now = created + k8s_openapi::jiff::SignedDuration::from_secs(timeout);
    let d = decide(&sim.o, &sim.settings);
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::SetStatus(s) if s.failure.is_some())),
        "{d:?}"
    );
    // Past it: the member fails, quoting the pod's reason, and rolls back.
    sim.o.now = created + k8s_openapi::jiff::SignedDuration::from_secs(timeout + 1);
    sim.run(400);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Failed, "{:?}", s.message);
    let failure = s.failure.unwrap();
    assert!(failure.contains("copy of claim data-etcd-0"), "{failure}");
    assert!(
        failure.contains(&format!(
            "did not start within {timeout}s: ImagePullBackOff"
        )),
        "{failure}"
    );
    assert_eq!(sim.step_of("etcd-0"), MemberStep::RolledBack);
    assert!(sim.o.jobs.is_empty(), "{:?}", sim.o.jobs.keys());
    assert_eq!(sim.o.claims.len(), 3, "temporary claim deleted");
}

#[test]
fn an_evicted_copy_is_replaced_up_to_the_budget_then_fails_the_member() {
    let mut sim = Sim::at(MemberStep::Copying);
    sim.jobs.hang = true;
    let job = build::job_name(REQ, "etcd-0", JobKind::Copy);
    let max = sim.settings.max_evictions;
    for round in 0..=max {
        for _ in 0..5 {
            if sim.o.jobs.contains_key(&job) {
                break;
            }
            sim.run(1);
        }
        assert!(
            sim.o.jobs.contains_key(&job),
            "round {round}: copy Job (re)created"
        );
        evict_job(&mut sim, &job);
        if round < max {
            assert_eq!(sim.phase(), Phase::Progressing, "round {round}");
            assert!(
                !sim.o.jobs.contains_key(&job),
                "round {round}: evicted Job deleted"
            );
            let ms = &sim.o.request.status.as_ref().unwrap().members[0];
            assert_eq!(ms.helper_evictions, round + 1);
            assert!(
                sim.events
                    .iter()
                    .any(|(r, m)| r == "HelperEvicted" && m.contains("ephemeral-storage")),
                "{:?}",
                sim.events
            );
        }
    }
    sim.run(400);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Failed, "{:?}", s.message);
    let failure = s.failure.unwrap();
    assert!(failure.contains("was evicted"), "{failure}");
    assert!(
        failure.contains(&format!("--max-evictions is {max}")),
        "{failure}"
    );
    assert_eq!(sim.step_of("etcd-0"), MemberStep::RolledBack);
}

#[test]
fn a_mounter_that_cannot_start_fails_the_member() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    // Until the mounter exists (the "fast" class waits for a consumer).
    let name = build::mounter_name(REQ, "etcd-0");
    for _ in 0..50 {
        if sim.o.helper_pods.contains_key(&name) {
            break;
        }
        let d = decide(&sim.o, &sim.settings);
        for a in &d.actions {
            sim.apply(a);
        }
    }
    assert!(sim.o.helper_pods.contains_key(&name), "mounter created");
    let mut pod = job_pod(
        "none",
        sim.o.now,
        PodStatusFixture::Waiting("InvalidImageName"),
    );
    pod.metadata = sim.o.helper_pods[&name].metadata.clone();
    sim.o.helper_pods.insert(name, pod);
    let d = decide(&sim.o, &sim.settings);
    let s = first_status(&d);
    let failure = s.failure.clone().unwrap_or_default();
    assert!(
        failure.contains("the mounter pod of member etcd-0 failed")
            && failure.contains("cannot start: InvalidImageName"),
        "{failure}"
    );
}

/// A Shrink whose pre-copy (or final copy) runs out of space on the temporary claim: the
/// request fails with the numbers (size, the target's filesystem, bytes now and at preflight,
/// what the data needs), the member rolls back, and its Jobs and temporary claim are deleted.
#[test]
fn a_copy_out_of_space_fails_the_member_with_the_numbers_and_leaves_nothing() {
    for kind in [JobKind::PreCopy, JobKind::Copy] {
        let mut sim = Sim::new(observed(spec_shrink("256Mi")));
        let job = build::job_name(REQ, "etcd-0", kind);
        for _ in 0..400 {
            if sim.o.jobs.contains_key(&job) {
                break;
            }
            sim.run(1);
        }
        assert!(sim.o.jobs.contains_key(&job), "{kind:?} Job created");
        let result = build::JobResult {
            error: Some("rsync exited with 11: no space left on the target".into()),
            exit_code: Some(11),
            cause: Some(build::JobFailureCause::NoSpace),
            bytes: Some(200 << 20),
            used_bytes: Some(300 << 20),
            target_filesystem: Some(build::FsReport {
                fs_type: "ext2/ext3".into(),
                block_size: 1024,
                blocks: 253_920,
                blocks_free: 12_000,
                blocks_available: 0,
                inodes: 65_536,
                inodes_free: 65_000,
            }),
            ..Default::default()
        };
        sim.o.jobs.get_mut(&job).unwrap().outcome = JobOutcome::NoSpace {
            reason: format!("Job {job} failed: BackoffLimitExceeded"),
            result: Box::new(result),
        };
        sim.run(400);
        let s = sim.o.request.status.clone().unwrap();
        assert_eq!(s.phase, Phase::Failed, "{:?}", s.message);
        let failure = s.failure.unwrap();
        let pass = if kind == JobKind::PreCopy {
            "pre-copy"
        } else {
            "final copy"
        };
        for want in [
            format!("the {pass} of member etcd-0 ran out of space on temporary claim"),
            "(256Mi: its filesystem holds 247.9Mi; rsync last reported 200Mi copied);".to_string(),
            "claim data-etcd-0 now uses 300Mi, preflight measured 100Mi".to_string(),
            "stays on its untouched old claim data-etcd-0; retry with a larger size".to_string(),
            "with headroom the data needs 330Mi, which an ext4 volume of".to_string(),
            "runbook: docs/runbook.md#failed-out-of-space-during-a-copy".to_string(),
        ] {
            assert!(failure.contains(&want), "{want:?} not in {failure}");
        }
        assert_eq!(sim.step_of("etcd-0"), MemberStep::RolledBack);
        assert!(sim.o.jobs.is_empty(), "{:?}", sim.o.jobs.keys());
        assert_eq!(sim.o.claims.len(), 3, "temporary claim deleted");
        assert!(sim.o.pods.contains_key("etcd-0"), "member pod back");
    }
}

/// A final copy that fits but leaves the new volume almost full (less than the headroom, and
/// less than the member had on its old volume) fails the member with the numbers before any
/// swap; a member that already ran that full on its old volume goes on.
#[test]
fn a_final_copy_that_leaves_the_new_volume_full_fails_the_member() {
    let fs = |available: i64| build::FsReport {
        fs_type: "ext2/ext3".into(),
        block_size: 1024,
        blocks: 253_920,
        blocks_free: available + 12_000,
        blocks_available: available,
        inodes: 65_536,
        inodes_free: 65_000,
    };
    for (source_free, fails) in [(200_000, true), (1_000, false)] {
        let mut sim = Sim::new(observed(spec_shrink("256Mi")));
        let job = build::job_name(REQ, "etcd-0", JobKind::Copy);
        for _ in 0..400 {
            if sim.o.jobs.contains_key(&job) {
                break;
            }
            sim.run(1);
        }
        let result = build::JobResult {
            bytes: Some(240 << 20),
            files: Some(3),
            exit_code: Some(0),
            target_filesystem: Some(fs(2_000)),
            source_filesystem: Some(fs(source_free)),
            ..Default::default()
        };
        sim.o.jobs.get_mut(&job).unwrap().outcome = JobOutcome::Succeeded {
            message: Some(serde_json::to_string(&result).unwrap()),
        };
        sim.run(400);
        let s = sim.o.request.status.clone().unwrap();
        if !fails {
            assert_eq!(s.phase, Phase::Successful, "{:?}", s.failure);
            continue;
        }
        assert_eq!(s.phase, Phase::Failed, "{:?}", s.message);
        let failure = s.failure.unwrap();
        for want in [
            "the final copy of member etcd-0 fitted but left only 1.9Mi free on temporary claim",
            "(less than the 16Mi headroom a member needs to run, and less than it had on its old claim; 256Mi: its filesystem holds 247.9Mi; rsync last reported 240Mi copied)",
            "stays on its untouched old claim data-etcd-0; retry with a larger size",
            "runbook: docs/runbook.md#failed-out-of-space-during-a-copy",
        ] {
            assert!(failure.contains(want), "{want:?} not in {failure}");
        }
        assert_eq!(sim.step_of("etcd-0"), MemberStep::RolledBack);
        assert!(sim.o.pods.contains_key("etcd-0"), "member pod back");
    }
}

/// The cluster layer asks the database for its health only where [`reads_health`] says the
/// planner uses it. Through a whole quorum migration (leader last, with its hand-over), every
/// decision made without the health where it is not read is the one made with it, and the
/// steps of a member's downtime (copy, verification, swap) are among those.
#[test]
fn health_is_read_wherever_the_planner_uses_it() {
    let o = quorum_observed();
    let mut sim = Sim::new(o);
    let mut unread = BTreeSet::new();
    for _ in 0..500 {
        if sim.phase().is_final() {
            break;
        }
        let d = decide(&sim.o, &sim.settings);
        let status = sim.status();
        if !reads_health(&status) {
            let mut blind = sim.o.clone();
            blind.health = Err(HealthUnavailable::NotObservedInStage);
            let step = in_flight(&status).map(|i| status.members[i].step);
            assert_eq!(
                decide(&blind, &sim.settings),
                d,
                "{:?} {step:?}",
                status.stage
            );
            unread.insert(format!("{:?} {step:?}", status.stage));
        }
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
    }
    assert_eq!(sim.phase(), Phase::Successful, "{:?}", sim.status().message);
    for step in [
        "Copying",
        "RetainingVolumes",
        "DeletingOldClaim",
        "ReleasingNewVolume",
    ] {
        assert!(
            unread.contains(&format!("Migrating Some({step})")),
            "{step} not among {unread:?}"
        );
    }
    assert!(!reads_health(&sim.status()), "a final request reads none");
}

/// A claim found under a member's temporary claim name that this request did not make (an
/// earlier request of the same name left it: another request uid) is never adopted: the request
/// fails naming it, and the rollback and cleanup leave it alone.
#[test]
fn a_temporary_claim_of_another_request_is_neither_adopted_nor_deleted() {
    let mut sim = Sim::at(MemberStep::CreatingClaim);
    let plan = sim.status().plan.expect("a plan");
    let temp = plan.members[0].temp_claim.clone();
    assert!(!sim.o.claims.contains_key(&temp), "not created yet");
    let mut foreign = bound_claim(&temp, "fast", "1Gi", "pv-theirs");
    foreign.labels_mut().extend([
        (
            labels::MANAGED_BY_LABEL.to_string(),
            labels::MANAGED_BY_VALUE.to_string(),
        ),
        (labels::REQUEST_LABEL.to_string(), sim.o.request.name_any()),
        (
            labels::REQUEST_UID_LABEL.to_string(),
            "uid-of-an-earlier-request".to_string(),
        ),
    ]);
    sim.o.claims.insert(temp.clone(), foreign);
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Failed);
    let failure = sim.status().failure.unwrap_or_default();
    assert!(
        failure.contains(&temp) && failure.contains("not made by this request"),
        "{failure}"
    );
    let left = &sim.o.claims[&temp];
    assert_eq!(
        left.uid(),
        Some(format!("uid-{temp}")),
        "the same claim, untouched"
    );
    assert!(left.metadata.deletion_timestamp.is_none());
}

/// The Patroni engine through the simulator, as etcd above: replicas first, a switchover to a
/// migrated replica, the leader last, and the replayed-WAL agreement recorded before Success.
/// (The simulator's health keeps no synchronous standby: that order is unit-tested with the
/// rules, `engine::patroni::tests`.)
#[test]
fn patroni_moves_the_replicas_first_and_switches_over_before_the_leader() {
    let mut spec = spec_class_change("fast");
    spec.database.engine = crate::api::DatabaseEngine::Patroni;
    let mut o = etcd_observed(spec);
    o.final_hash = Some(Ok(Some(agreed(
        "timeline 2, WAL 0/4090598",
        &["etcd-0", "etcd-1", "etcd-2"],
    ))));
    let mut sim = Sim::new(o);
    sim.run(500);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    let order: Vec<&str> = s.members.iter().map(|m| m.pod.as_str()).collect();
    assert_eq!(order, ["etcd-1", "etcd-2", "etcd-0"]);
    let handovers: Vec<&Action> = (sim.log.iter())
        .filter(|a| matches!(a, Action::TransferLeadership { .. }))
        .collect();
    assert_eq!(handovers.len(), 1, "one switchover: {handovers:?}");
    assert!(
        matches!(handovers[0], Action::TransferLeadership { from, .. } if from == "etcd-0"),
        "{handovers:?}"
    );
    assert_eq!(s.final_hash.as_deref(), Some("timeline 2, WAL 0/4090598"));
    let change = s.members[2]
        .leader_change
        .clone()
        .expect("the leader change on record");
    assert_eq!(change.how, LeaderChangeKind::Handover);
    assert_eq!(
        (change.from.as_str(), change.to.as_deref()),
        ("etcd-0", Some("etcd-1"))
    );
    assert!(change.seconds.is_some_and(|s| s >= 0.0), "{change:?}");
    assert!(
        s.members[..2].iter().all(|m| m.leader_change.is_none()),
        "only the leader's turn changes leadership"
    );
}

/// Runs a request of `engine` through the simulator with the three members `etcd-0..2`
/// (`etcd-0` leading) and the members' agreement `hash` for the final check.
fn engine_sim(engine: crate::api::DatabaseEngine, hash: &str) -> Sim {
    let mut spec = spec_class_change("fast");
    spec.database.engine = engine;
    let mut o = etcd_observed(spec);
    o.final_hash = Some(Ok(Some(agreed(hash, &["etcd-0", "etcd-1", "etcd-2"]))));
    let mut sim = Sim::new(o);
    sim.run(500);
    sim
}

fn handovers(sim: &Sim) -> Vec<&Action> {
    (sim.log.iter())
        .filter(|a| matches!(a, Action::TransferLeadership { .. }))
        .collect()
}

/// Redis with Sentinel through the simulator: the replicas first, one steered failover from
/// the master to a migrated replica (recorded as a handover with its length), the master last,
/// the offsets' agreement on record before Success.
#[test]
fn redis_sentinel_moves_the_replicas_first_and_fails_over_once_before_the_master() {
    let sim = engine_sim(
        crate::api::DatabaseEngine::RedisSentinel,
        "offset 91210, keys db0=1804",
    );
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    let order: Vec<&str> = s.members.iter().map(|m| m.pod.as_str()).collect();
    assert_eq!(order, ["etcd-1", "etcd-2", "etcd-0"]);
    let moves = handovers(&sim);
    assert_eq!(moves.len(), 1, "one failover: {moves:?}");
    assert!(
        matches!(moves[0], Action::TransferLeadership { from, to } if from == "etcd-0" && to == "etcd-1"),
        "to the first migrated replica: {moves:?}"
    );
    let change = s.members[2].leader_change.clone().expect("on record");
    assert_eq!(change.how, LeaderChangeKind::Handover);
    assert_eq!(change.to.as_deref(), Some("etcd-1"));
    assert_eq!(s.final_hash.as_deref(), Some("offset 91210, keys db0=1804"));
}

/// ZooKeeper through the simulator: the followers first, no handover asked (there is none),
/// the leader stopped last while it led, and the election that followed on record: who leads
/// after, and how long until the operator saw it (it follows the election through the old
/// leader's downtime, when it otherwise reads no health).
#[test]
fn zookeeper_moves_the_leader_last_and_records_the_election() {
    let sim = engine_sim(
        crate::api::DatabaseEngine::ZooKeeper,
        "zxid 0x200000253, 2106 znodes",
    );
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    let order: Vec<&str> = s.members.iter().map(|m| m.pod.as_str()).collect();
    assert_eq!(order, ["etcd-1", "etcd-2", "etcd-0"]);
    assert!(handovers(&sim).is_empty(), "{:?}", handovers(&sim));
    let leader = &s.members[2];
    let change = leader
        .leader_change
        .clone()
        .expect("the election on record");
    assert_eq!(change.how, LeaderChangeKind::Election);
    assert_eq!(change.from, "etcd-0");
    assert_eq!(
        change.to.as_deref(),
        Some("etcd-2"),
        "the highest member left"
    );
    assert_eq!(
        Some(change.started.0),
        leader.pod_deleted_at.as_ref().map(|t| t.0)
    );
    let (seconds, downtime) = (change.seconds.unwrap(), leader.downtime_seconds.unwrap());
    assert!(
        seconds > 0.0 && seconds < downtime,
        "seen during the leader's downtime: {seconds} s of {downtime} s"
    );
    let election = change.election_seconds.expect("the election's own length");
    assert!(
        change.leaderless.is_some() && election < seconds,
        "from the first look without a leader: {change:?}"
    );
    assert_eq!(
        s.final_hash.as_deref(),
        Some("zxid 0x200000253, 2106 znodes")
    );
}

/// ZooKeeper with `handover: Reconfig`: the leader hands over before it stops. A handover cut
/// short (the old leader left an observer, another member leading) is asked again before the
/// old leader's pod is deleted, and only then does it stop: the ensemble keeps its voters.
#[test]
fn zookeeper_with_reconfig_hands_over_and_finishes_a_handover_cut_short() {
    let mut spec = spec_class_change("fast");
    spec.database.engine = crate::api::DatabaseEngine::ZooKeeper;
    spec.database.zookeeper = Some(crate::api::ZooKeeperSpec {
        handover: crate::api::ZooKeeperHandover::Reconfig,
        ..Default::default()
    });
    let mut o = etcd_observed(spec);
    let hash = "zxid 0x200000253, 2106 znodes";
    o.final_hash = Some(Ok(Some(agreed(hash, &["etcd-0", "etcd-1", "etcd-2"]))));
    let mut sim = Sim::new(o);
    sim.handovers_cut_short = 1;
    sim.run(500);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    let order: Vec<&str> = s.members.iter().map(|m| m.pod.as_str()).collect();
    assert_eq!(order, ["etcd-1", "etcd-2", "etcd-0"]);
    let moves = handovers(&sim);
    assert_eq!(moves.len(), 2, "the handover, then its end: {moves:?}");
    assert!(
        (moves.iter())
            .all(|a| matches!(a, Action::TransferLeadership { from, .. } if from == "etcd-0")),
        "{moves:?}"
    );
    // The old leader's pod is deleted only after the second handover made it a voter again.
    let second = (sim.log.iter())
        .position(|a| std::ptr::eq(a, moves[1]))
        .expect("in the log");
    let deleted = (sim.log.iter()).position(
        |a| matches!(a, Action::Delete { kind: Kind::Pod, name, .. } if name == "etcd-0"),
    );
    assert!(
        deleted.is_some_and(|d| d > second),
        "etcd-0 deleted after it votes again: {:?}",
        sim.log
    );
    let voters = (sim.o.health.as_ref().unwrap().members.iter())
        .filter(|m| m.member_id.is_some())
        .count();
    assert_eq!(voters, 3, "every member votes at the end");
    let change = s.members[2].leader_change.clone().expect("on record");
    assert_eq!(change.how, LeaderChangeKind::Handover);
    assert_eq!(change.to.as_deref(), Some("etcd-1"));
}

/// The memory limit on the Copy Jobs `log` created, by Job name.
fn copy_job_memory(log: &[Action]) -> Vec<(String, Option<String>)> {
    log.iter()
        .filter_map(|a| match a {
            Action::Create(Object::Job(j))
                if j.labels().get(labels::JOB_KIND_LABEL).map(String::as_str) == Some("copy") =>
            {
                let limit = j
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.spec.as_ref())
                    .and_then(|p| p.containers.first())
                    .and_then(|c| c.resources.as_ref())
                    .and_then(|r| r.limits.as_ref())
                    .and_then(|l| l.get("memory"))
                    .map(|q| q.0.clone());
                Some((j.name_any(), limit))
            }
            _ => None,
        })
        .collect()
}

/// The pre-copy's report of the old volume (300,000 inodes, 1 GiB in use) is recorded, and
/// each final copy's pod gets its memory from it (64Mi + 256 B × 300,000 + 1 GiB / 2,048 =
/// 138Mi, request and limit). A memory limit the request sets below that fails the first
/// member once its pre-copy is done, before it stops; one above it is kept as given.
#[test]
fn final_copies_get_memory_for_what_the_pre_copy_found_and_a_lower_limit_fails_before_the_stop() {
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    for (limit, fails) in [(None, false), (Some("128Mi"), true), (Some("1Gi"), false)] {
        let mut spec = spec_class_change("fast");
        spec.copy.resources = limit.map(|l| ResourceRequirements {
            limits: Some([("memory".to_string(), Quantity(l.to_string()))].into()),
            ..Default::default()
        });
        let mut sim = Sim::new(observed(spec));
        sim.jobs.source_entries = Some(300_000);
        sim.run(600);
        let s = sim.o.request.status.clone().unwrap();
        if fails {
            assert_eq!(s.phase, Phase::Failed, "{:?}", s.message);
            let failure = s.failure.unwrap_or_default();
            for want in [
                "member etcd-0 was not stopped: its final copy needs about 138Mi of memory for the 300000 files and directories (1Gi in use) on data-etcd-0",
                "more than spec.copy.resources.limits.memory 128Mi; raise or remove that limit",
                "runbook: docs/runbook.md#failed-a-copy-verify-or-mounter-job-failed",
            ] {
                assert!(failure.contains(want), "{want:?} not in {failure}");
            }
            assert!(copy_job_memory(&sim.log).is_empty(), "no final copy ran");
            assert!(
                sim.status()
                    .members
                    .iter()
                    .all(|m| m.pod_deleted_at.is_none()),
                "no member was stopped"
            );
            continue;
        }
        assert_eq!(s.phase, Phase::Successful, "{:?}", s.failure);
        let copies = copy_job_memory(&sim.log);
        assert_eq!(copies.len(), 3, "{copies:?}");
        let want = limit.unwrap_or("138Mi");
        for (job, memory) in copies {
            assert_eq!(memory.as_deref(), Some(want), "{job}");
        }
        for m in &sim.status().members {
            assert_eq!(m.first_claim.source_entries, Some(300_000), "{}", m.pod);
            assert_eq!(m.first_claim.source_bytes, Some(1 << 30), "{}", m.pod);
        }
    }
}

/// A decision that passes into a step of the claim swap and runs it there waits as that step
/// asks (the claims deleted: `SWAP_POLL`, or until a watched change), not "at once" as the
/// advance alone would: the round at once found the claims still terminating.
#[test]
fn a_step_passed_into_in_one_decision_sets_its_own_wait() {
    let mut sim = Sim::at(MemberStep::RetainingVolumes);
    for _ in 0..20 {
        let d = decide(&sim.o, &SETTINGS);
        let deletes_claim = (d.actions.iter()).any(|a| {
            matches!(
                a,
                Action::Delete {
                    kind: Kind::Claim,
                    ..
                }
            )
        });
        if deletes_claim {
            let s = first_status(&d);
            assert_eq!(
                s.members[0].step,
                MemberStep::DeletingOldClaim,
                "passed into"
            );
            let names: Vec<_> = d.actions.iter().map(Action::name).collect();
            assert_eq!(d.requeue, SWAP_POLL, "{names:?}");
            return;
        }
        for a in &d.actions {
            sim.apply(a);
        }
        sim.settle();
    }
    panic!("no claim deleted from RetainingVolumes on");
}
