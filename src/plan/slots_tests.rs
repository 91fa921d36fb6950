//! The copy caps in whole decisions: a member waits for a slot before its first copy, still
//! serving, and the condition `CopySlot` names who holds the slots.

use std::num::NonZeroU32;

use crate::api::{MemberStep, Phase, conditions};
use crate::plan::fixtures::{SETTINGS, Sim, observed, spec_class_change};
use crate::plan::slots::{CopyCaps, CopyHolder};
use crate::plan::{Action, Object};

fn capped(cluster: u32, per_node: u32) -> Sim {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    sim.settings.copy_caps = CopyCaps {
        cluster: NonZeroU32::new(cluster),
        per_node: NonZeroU32::new(per_node),
    };
    sim
}

fn holder(request: &str, node: &str) -> CopyHolder {
    CopyHolder {
        request: request.to_string(),
        pod: "db-0".to_string(),
        node: node.to_string(),
    }
}

fn copy_slot(sim: &Sim) -> Option<(String, String, String)> {
    let status = sim.status();
    conditions::get(&status.conditions, conditions::COPY_SLOT)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn jobs_created(sim: &Sim) -> usize {
    (sim.log.iter())
        .filter(|a| matches!(a, Action::Create(Object::Job(_))))
        .count()
}

#[test]
fn a_member_waits_for_a_slot_serving_then_takes_the_one_given_back() {
    let mut sim = capped(2, 0);
    sim.o.copy_holders = vec![holder("a/one", "node-9"), holder("b/two", "node-8")];
    sim.run(60);
    assert_eq!(sim.phase(), Phase::Progressing);
    assert_eq!(sim.step_of("etcd-0"), MemberStep::CreatingClaim);
    assert_eq!(jobs_created(&sim), 0, "no copy while the cap is reached");
    assert!(sim.o.pods.contains_key("etcd-0"), "the member still serves");
    let (status, reason, message) = copy_slot(&sim).expect("the condition CopySlot");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "Waiting"));
    assert_eq!(
        message,
        "member etcd-0 waits for a copy slot: 2 of at most 2 copies in the cluster are running: \
         a/one (db-0 on node-9), b/two (db-0 on node-8)"
    );
    assert!(
        sim.reasons().contains(&"WaitingForCopySlot"),
        "{:?}",
        sim.events
    );
    // One slot given back: the member takes it and the request goes on to the end.
    sim.o.copy_holders.pop();
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful, "{:?}", sim.events);
    let (status, reason, _) = copy_slot(&sim).expect("the condition CopySlot");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Taken"));
}

#[test]
fn the_node_cap_holds_only_the_member_on_a_full_node() {
    let mut sim = capped(0, 1);
    sim.o.copy_holders = vec![holder("a/one", "node-b")];
    sim.run(400);
    let plan = sim.status().plan.expect("a plan");
    let on = |node: &str| {
        (plan.members.iter())
            .find(|m| m.node == node)
            .map(|m| m.pod.clone())
            .expect("a member on the node")
    };
    let held = on("node-b");
    assert_eq!(sim.step_of(&held), MemberStep::CreatingClaim);
    let (status, _, message) = copy_slot(&sim).expect("the condition CopySlot");
    assert_eq!(status, "False");
    assert_eq!(
        message,
        format!(
            "member {held} waits for a copy slot: 1 of at most 1 copies on node node-b are \
             running: a/one (db-0 on node-b)"
        )
    );
    // The members before it in the order went on their nodes; those after it wait their turn
    // (the member order is unchanged).
    let steps: Vec<(String, MemberStep)> = (sim.status().members.iter())
        .map(|m| (m.pod.clone(), m.step))
        .collect();
    let at = steps
        .iter()
        .position(|(p, _)| *p == held)
        .expect("in the status");
    assert!(at > 0, "a member before it: {steps:?}");
    assert!(
        steps[..at].iter().all(|(_, s)| *s == MemberStep::Done),
        "{steps:?}"
    );
    assert!(
        steps[at + 1..]
            .iter()
            .all(|(_, s)| *s == MemberStep::Pending),
        "{steps:?}"
    );
    sim.o.copy_holders.clear();
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful, "{:?}", sim.events);
}

#[test]
fn without_caps_no_condition_and_no_wait() {
    let mut sim = Sim::new(observed(spec_class_change("fast")));
    assert_eq!(sim.settings.copy_caps, SETTINGS.copy_caps);
    sim.o.copy_holders = vec![holder("a/one", "node-9")];
    sim.run(400);
    assert_eq!(sim.phase(), Phase::Successful);
    assert_eq!(copy_slot(&sim), None);
}
