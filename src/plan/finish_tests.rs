//! Planner tests of finishing or undoing a request that failed part way: members already on
//! the target (an earlier request moved them) are planned `AlreadyThere`, never stopped; the
//! others migrate, leader last; the recreated StatefulSet's template ends on the target; a
//! Failed request records where each member's data is.

use kube::ResourceExt;

use super::fixtures::*;
use super::*;
use crate::api::{DataLocation, DataState, Phase, PlannedWork};

/// A fresh request named `name` with `spec` on what `sim` left (the earlier request's objects
/// stay; its stash ConfigMap is its own and not looked at).
fn next_request(sim: &mut Sim, name: &str, spec: crate::api::StorageMigrationRequestSpec) {
    let mut req = request(spec);
    req.metadata.name = Some(name.into());
    req.metadata.uid = Some(format!("uid-{name}"));
    sim.o.request = req;
    // The pods the earlier request recreated are scheduled by now (the Sim plays no scheduler).
    for (name, pod) in sim.o.pods.iter_mut() {
        let node = NODES[name.trim_start_matches("etcd-").parse::<usize>().unwrap()];
        pod.update(|p| p.spec.as_mut().unwrap().node_name = Some(node.into()));
    }
    sim.o.stash = Default::default();
    sim.stash_config_map = None;
    sim.jobs.fail.clear();
}

fn status(sim: &Sim) -> StorageMigrationRequestStatus {
    sim.o.request.status.clone().unwrap_or_default()
}

/// A class change to `fast` whose first member (etcd-0) is migrated and whose second member's
/// copy then fails: Failed, etcd-0 on `fast`, etcd-1 and etcd-2 on `standard`.
fn partly_failed() -> Sim {
    let mut sim = Sim::at(MemberStep::Done);
    sim.jobs.fail = vec!["copy".into()];
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Failed, "{:?}", status(&sim).message);
    sim
}

fn claim_class_of(sim: &Sim, i: usize) -> String {
    let claim = &sim.o.claims[&format!("data-etcd-{i}")];
    claim_class(claim).unwrap_or_default().to_string()
}

fn template_class(sim: &Sim) -> String {
    let set = sim
        .o
        .stateful_set
        .as_ref()
        .expect("the StatefulSet is there");
    let templates = set.spec.as_ref().unwrap().volume_claim_templates.as_ref();
    claim_class(&templates.unwrap()[0])
        .unwrap_or_default()
        .to_string()
}

/// The pods the planner deleted from log entry `from` on.
fn pods_deleted(sim: &Sim, from: usize) -> Vec<String> {
    sim.log[from..]
        .iter()
        .filter_map(|a| match a {
            Action::Delete {
                kind: Kind::Pod,
                name,
                ..
            } if ["etcd-0", "etcd-1", "etcd-2"].contains(&name.as_str()) => Some(name.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_failed_request_records_where_each_members_data_is() {
    let sim = partly_failed();
    let s = status(&sim);
    let location = |pod: &str| {
        let ms = s.members.iter().find(|m| m.pod == pod).unwrap();
        ms.first_claim
            .data_location
            .clone()
            .expect("dataLocation recorded")
    };
    let new_volume = claim_volume(&sim.o.claims["data-etcd-0"]).unwrap();
    assert_eq!(
        location("etcd-0"),
        DataLocation {
            claim: "data-etcd-0".into(),
            volume: new_volume.into(),
            storage_class: "fast".into(),
            state: DataState::Migrated,
        }
    );
    for i in 1..3 {
        assert_eq!(
            location(&format!("etcd-{i}")),
            DataLocation {
                claim: format!("data-etcd-{i}"),
                volume: format!("pv-old-{i}"),
                storage_class: "standard".into(),
                state: DataState::Untouched,
            }
        );
    }
    let message = s.message.unwrap();
    assert!(
        message.contains(
            "Data: on StorageClass fast: etcd-0; on StorageClass standard: etcd-1, etcd-2 -- "
        ),
        "{message}"
    );
    assert!(
        message.contains(&format!(
            "etcd-0 on claim data-etcd-0 -> new volume {new_volume} (fast;"
        )),
        "{message}"
    );
    // The template went back to the original class: the claims disagree with it.
    assert_eq!(template_class(&sim), "standard");
}

#[test]
fn the_plan_says_per_member_what_is_done_and_what_is_already_there() {
    let mut sim = partly_failed();
    next_request(&mut sim, "finish", spec_class_change("fast"));
    let d = decide(&sim.o, &SETTINGS);
    let Some(Action::SetStatus(s)) = d.actions.first() else {
        panic!("{:?}", d.actions);
    };
    assert_eq!(s.phase, Phase::Progressing, "{:?}", s.message);
    let plan = s.plan.clone().unwrap();
    let work: Vec<(&str, PlannedWork)> = plan
        .members
        .iter()
        .map(|m| (m.pod.as_str(), m.work))
        .collect();
    assert_eq!(
        work,
        [
            ("etcd-0", PlannedWork::AlreadyThere),
            ("etcd-1", PlannedWork::Migrate),
            ("etcd-2", PlannedWork::Migrate),
        ]
    );
    let steps: Vec<MemberStep> = s.members.iter().map(|m| m.step).collect();
    assert_eq!(
        steps,
        [
            MemberStep::AlreadyThere,
            MemberStep::Pending,
            MemberStep::Pending
        ]
    );
    assert_eq!(plan.source_storage_class.as_deref(), Some("standard"));
    let message = s.message.clone().unwrap();
    assert_eq!(
        message,
        "accepted: 2 members of StatefulSet etcd move to StorageClass fast (1Gi), order etcd-1, \
         etcd-2; already there, left running: etcd-0"
    );
    assert_eq!(s.progress.as_deref(), Some("1/3"));
}

#[test]
fn a_second_request_finishes_the_rest_without_stopping_the_member_already_there() {
    let mut sim = partly_failed();
    let migrated_volume = claim_volume(&sim.o.claims["data-etcd-0"])
        .unwrap()
        .to_string();
    next_request(&mut sim, "finish", spec_class_change("fast"));
    let from = sim.log.len();
    let rounds = sim.run(800);
    let s = status(&sim);
    assert_eq!(
        s.phase,
        Phase::Successful,
        "{:?} {rounds} {:?} {:#?}",
        s.message,
        s.stage,
        s.conditions
    );
    assert_eq!(pods_deleted(&sim, from), ["etcd-1", "etcd-2"]);
    assert_eq!(sim.step_of("etcd-0"), MemberStep::AlreadyThere);
    assert_eq!(
        claim_volume(&sim.o.claims["data-etcd-0"]),
        Some(migrated_volume.as_str()),
        "untouched"
    );
    for i in 0..3 {
        assert_eq!(claim_class_of(&sim, i), "fast");
    }
    assert_eq!(
        template_class(&sim),
        "fast",
        "the template agrees with the claims"
    );
    assert_eq!(s.progress.as_deref(), Some("3/3"));
    let message = s.message.unwrap();
    assert!(
        message.starts_with("migrated 2 members of StatefulSet etcd to StorageClass fast"),
        "{message}"
    );
    assert!(
        message.contains("already there, left running: etcd-0"),
        "{message}"
    );
    // etcd-0's volumes were not touched by this request: neither relabelled nor re-policied.
    let touched = sim.log[from..].iter().any(|a| match a {
        Action::PatchReclaimPolicy { volume, .. } | Action::LabelVolume { volume } => {
            volume == "pv-old-0" || *volume == migrated_volume
        }
        _ => false,
    });
    assert!(!touched, "etcd-0's volumes were touched");

    // Then everything back to the source class (made WaitForFirstConsumer like fast): a plain
    // request of all three.
    let wffc = class("standard", "WaitForFirstConsumer");
    sim.o.storage_classes.insert("standard".into(), wffc);
    next_request(&mut sim, "back", spec_class_change("standard"));
    let from = sim.log.len();
    sim.run(600);
    let s = status(&sim);
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    assert_eq!(pods_deleted(&sim, from).len(), 3);
    for i in 0..3 {
        assert_eq!(claim_class_of(&sim, i), "standard");
    }
    assert_eq!(template_class(&sim), "standard");
}

#[test]
fn a_request_back_to_the_source_class_moves_only_the_migrated_member() {
    let mut sim = partly_failed();
    // Back from fast (WaitForFirstConsumer): the source class must bind the same way.
    let wffc = class("standard", "WaitForFirstConsumer");
    sim.o.storage_classes.insert("standard".into(), wffc);
    next_request(&mut sim, "undo", spec_class_change("standard"));
    let from = sim.log.len();
    sim.run(400);
    let s = status(&sim);
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    assert_eq!(pods_deleted(&sim, from), ["etcd-0"]);
    let steps: Vec<(&str, MemberStep)> =
        s.members.iter().map(|m| (m.pod.as_str(), m.step)).collect();
    assert_eq!(
        steps,
        [
            ("etcd-1", MemberStep::AlreadyThere),
            ("etcd-2", MemberStep::AlreadyThere),
            ("etcd-0", MemberStep::Done),
        ]
    );
    for i in 0..3 {
        assert_eq!(claim_class_of(&sim, i), "standard");
    }
    assert_eq!(template_class(&sim), "standard");
}

#[test]
fn the_leader_still_goes_last_among_the_members_that_need_work() {
    let mut sim = partly_failed();
    let mut spec = spec_class_change("fast");
    spec.database.engine = crate::api::DatabaseEngine::Etcd;
    next_request(&mut sim, "finish", spec);
    if let Ok(h) = sim.o.health.as_mut() {
        h.leader = Some("etcd-1".into());
        h.voting_members = Some(3);
        for m in &mut h.members {
            m.member_id = Some(m.pod.clone());
            m.position = Some(100);
            m.leader = m.pod == "etcd-1";
        }
    }
    let d = decide(&sim.o, &SETTINGS);
    let Some(Action::SetStatus(s)) = d.actions.first() else {
        panic!("{:?}", d.actions);
    };
    let order: Vec<&str> = s.members.iter().map(|m| m.pod.as_str()).collect();
    assert_eq!(order, ["etcd-0", "etcd-2", "etcd-1"]);
    let plan = s.plan.as_ref().unwrap();
    assert_eq!(plan.members[2].role, Some(crate::api::Role::Leader));
    assert_eq!(plan.members[2].work, PlannedWork::Migrate);
}

#[test]
fn every_member_and_the_template_there_is_denied_but_a_stale_template_is_recreated() {
    // Every member on fast, the template still on standard: accepted, nothing stopped, the set
    // recreated with the template on fast.
    let mut o = observed(spec_class_change("fast"));
    for i in 0..3 {
        let claim = o.claims.get_mut(&format!("data-etcd-{i}")).unwrap();
        claim.spec.as_mut().unwrap().storage_class_name = Some("fast".into());
        let pv = o.volumes.get_mut(&format!("pv-old-{i}")).unwrap();
        pv.spec.as_mut().unwrap().storage_class_name = Some("fast".into());
    }
    let mut sim = Sim::new(o);
    sim.run(200);
    let s = status(&sim);
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    assert!(pods_deleted(&sim, 0).is_empty());
    assert!(s.members.iter().all(|m| m.step == MemberStep::AlreadyThere));
    assert_eq!(template_class(&sim), "fast");
    assert!(sim.o.stateful_set.as_ref().unwrap().uid().is_some());

    // The same request again: nothing left to do.
    next_request(&mut sim, "again", spec_class_change("fast"));
    let d = decide(&sim.o, &SETTINGS);
    let Some(Action::SetStatus(s)) = d.actions.first() else {
        panic!("{:?}", d.actions);
    };
    assert_eq!(s.phase, Phase::Denied);
    let c = conditions::get(&s.conditions, conditions::ACCEPTED).unwrap();
    assert_eq!(c.reason, "SameStorageClass");
    assert!(
        c.message
            .contains("nothing to do (runbook: docs/runbook.md#"),
        "{}",
        c.message
    );
}

#[test]
fn a_shrink_measures_and_moves_only_the_members_above_the_size() {
    let mut o = observed(spec_shrink("512Mi"));
    let claim = o.claims.get_mut("data-etcd-1").unwrap();
    let requests = claim.spec.as_mut().unwrap().resources.as_mut().unwrap();
    requests.requests.as_mut().unwrap().insert(
        "storage".into(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("512Mi".into()),
    );
    let d = decide(&o, &SETTINGS);
    let measured: Vec<String> = created_jobs(&d.actions);
    assert_eq!(measured.len(), 2, "{measured:?}");
    assert!(
        measured.iter().all(|n| !n.contains("etcd-1")),
        "{measured:?}"
    );
    let mut sim = Sim::new(o);
    sim.run(400);
    let s = status(&sim);
    assert_eq!(s.phase, Phase::Successful, "{:?}", s.message);
    assert_eq!(sim.step_of("etcd-1"), MemberStep::AlreadyThere);
    assert_eq!(pods_deleted(&sim, 0), ["etcd-0", "etcd-2"]);
    for i in 0..3 {
        let claim = &sim.o.claims[&format!("data-etcd-{i}")];
        assert_eq!(claim_request(claim).unwrap().0, "512Mi");
    }
}

/// An ended request is decided on itself alone (`Observed::ended`: what the controller gives it,
/// reading nothing of the cluster): the same decision as on the full snapshot, as it ended,
/// deleted with its finalizer, with its spec edited, and still carrying its finalizer (the
/// operator died between the final status write and the finalizer patch: it is lifted, so
/// that the request does not keep its namespace or the CRD from going once the operator is
/// gone); for a Successful and a Failed request.
#[test]
fn an_ended_request_is_decided_on_itself_alone() {
    let mut done = Sim::new(observed(spec_class_change("fast")));
    done.run(400);
    let mut failed = Sim::at(MemberStep::CreatingClaim);
    let plan = failed.status().plan.expect("a plan");
    let temp = plan.members[0].temp_claim.clone();
    let foreign = bound_claim(&temp, "fast", "1Gi", "pv-theirs");
    failed.o.claims.insert(temp, foreign);
    failed.run(400);
    for (sim, phase) in [(done, Phase::Successful), (failed, Phase::Failed)] {
        assert_eq!(sim.phase(), phase, "{:?}", sim.status().message);
        let mut variants = vec![sim.o.clone()];
        let mut deleted = sim.o.clone();
        deleted.request.metadata.deletion_timestamp = Some(Time(sim.o.now));
        deleted.request.metadata.finalizers = Some(vec![labels::FINALIZER.to_string()]);
        variants.push(deleted);
        let mut edited = sim.o.clone();
        edited.request.spec.timeout = "3h".into();
        edited.request.metadata.generation = Some(7);
        variants.push(edited);
        let mut kept = sim.o.clone();
        kept.request.metadata.finalizers = Some(vec![labels::FINALIZER.to_string()]);
        variants.push(kept);
        let mut decisions = Vec::new();
        for full in variants {
            assert!(Observed::has_ended(&full.request));
            let alone = Observed::ended(full.request.clone(), full.now);
            let d = decide(&full, &SETTINGS);
            assert_eq!(decide(&alone, &SETTINGS), d);
            decisions.push(d);
        }
        assert!(decisions[0].actions.is_empty(), "{:?}", decisions[0]);
        assert!(
            (decisions[1].actions.iter()).any(|a| matches!(a, Action::RemoveFinalizer)),
            "{:?}",
            decisions[1]
        );
        assert!(
            (decisions[2].actions.iter()).any(|a| matches!(a, Action::SetStatus(_))),
            "the edit noted: {:?}",
            decisions[2]
        );
        assert_eq!(
            decisions[3].actions,
            [Action::RemoveFinalizer],
            "the finalizer left by a crash"
        );
    }
}
