use serde_json::{Value, json};

use super::*;
use crate::api::{ApplyPolicy, Phase};
use crate::plan::fixtures::{Sim, observed, spec_class_change, t};
use crate::plan::{Action, Kind, decide};

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A `policy/v1` budget named `name` at `generation`, with `spec` and `status` (`Null`: none)
/// as the API server returns them.
fn from_json(name: &str, generation: Option<i64>, spec: Value, status: Value) -> Budget {
    let pdb = json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "demo", "generation": generation},
        "spec": spec, "status": status,
    });
    Budget::from_budget(serde_json::from_value(pdb).unwrap())
}

/// A budget on `selector` with `allowed` disruptions and an up-to-date status.
fn budget(name: &str, selector: Value, allowed: i32) -> Budget {
    let status = json!({
        "disruptionsAllowed": allowed, "currentHealthy": 3, "desiredHealthy": 3,
        "expectedPods": 3, "observedGeneration": 1,
    });
    let spec = json!({"minAvailable": 2, "selector": selector});
    from_json(name, Some(1), spec, status)
}

fn etcd_budget(allowed: i32) -> Budget {
    budget("etcd-pdb", json!({"matchLabels": {"app": "etcd"}}), allowed)
}

#[test]
fn a_budget_is_read_from_the_object_as_the_api_server_returns_it() {
    let b = etcd_budget(1);
    assert_eq!((b.name.as_str(), b.generation), ("etcd-pdb", Some(1)));
    assert_eq!(b.rule, "minAvailable 2");
    assert_eq!(b.min_available, Some(IntOrString::Int(2)));
    assert_eq!(b.max_unavailable, None);
    let s = b.status.as_ref().unwrap();
    assert_eq!((s.disruptions_allowed, s.observed_generation), (1, Some(1)));
    let bare = from_json("bare", None, Value::Null, Value::Null);
    assert_eq!(bare.rule, "no minAvailable or maxUnavailable");
    assert_eq!(
        (bare.selector, bare.status, bare.generation),
        (None, None, None)
    );
}

#[test]
fn match_labels_and_every_expression_operator() {
    let sel = json!({
        "matchLabels": {"app": "etcd"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["db", "cache"]},
            {"key": "canary", "operator": "NotIn", "values": ["true"]},
            {"key": "zone", "operator": "Exists"},
            {"key": "skip", "operator": "DoesNotExist"},
        ],
    });
    let b = budget("b", sel, 1);
    let base = [("app", "etcd"), ("tier", "db"), ("zone", "a")];
    assert!(selects(&b, &labels(&base)));
    assert!(selects(
        &b,
        &labels(&[&base[..], &[("canary", "no")]].concat())
    ));
    let cases: &[&[(&str, &str)]] = &[
        &[("app", "web"), ("tier", "db"), ("zone", "a")],
        &[("tier", "db"), ("zone", "a")],
        &[("app", "etcd"), ("tier", "web"), ("zone", "a")],
        &[("app", "etcd"), ("zone", "a")],
        &[
            ("app", "etcd"),
            ("tier", "db"),
            ("zone", "a"),
            ("canary", "true"),
        ],
        &[("app", "etcd"), ("tier", "db")],
        &[("app", "etcd"), ("tier", "db"), ("zone", "a"), ("skip", "")],
    ];
    for c in cases {
        assert!(!selects(&b, &labels(c)), "{c:?}");
    }
    let unknown = json!({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]});
    let b = budget("b", unknown, 1);
    assert!(!selects(&b, &labels(&[("app", "2")])), "unknown operator");
}

#[test]
fn an_empty_selector_selects_every_pod_and_none_selects_nothing() {
    for pod in [labels(&[("app", "etcd")]), labels(&[])] {
        for empty in [
            json!({}),
            json!({"matchLabels": {}, "matchExpressions": []}),
        ] {
            assert!(selects(&budget("b", empty.clone(), 0), &pod), "{empty}");
        }
        assert!(!selects(&budget("b", Value::Null, 0), &pod), "no selector");
    }
}

#[test]
fn a_budget_refuses_with_none_allowed_a_stale_status_or_none_at_all() {
    assert_eq!(etcd_budget(1).refusal(), None);
    let none = etcd_budget(0).refusal().unwrap();
    assert_eq!(
        none,
        "PodDisruptionBudget etcd-pdb (minAvailable 2) allows 0 disruptions (3 healthy of 3 \
         expected pods, 3 must stay healthy)"
    );
    let mut stale = etcd_budget(1);
    stale.generation = Some(2);
    let why = stale.refusal().unwrap();
    assert!(why.contains("generation 2, observed 1"), "{why}");
    let mut unobserved = etcd_budget(1);
    if let Some(s) = unobserved.status.as_mut() {
        s.observed_generation = None;
    }
    assert!(unobserved.refusal().is_some(), "no observedGeneration");
    let spec = json!({"maxUnavailable": "0%", "selector": {}});
    let fresh = from_json("new", Some(1), spec, Value::Null);
    assert_eq!(fresh.rule, "maxUnavailable 0%");
    assert!(fresh.refusal().unwrap().contains("has no status yet"));
}

#[test]
fn the_first_selecting_budget_that_refuses_is_named() {
    let other = budget("web", json!({"matchLabels": {"app": "web"}}), 0);
    let pod = labels(&[("app", "etcd")]);
    assert_eq!(refusal(&[other.clone(), etcd_budget(1)], &pod), None);
    let why = refusal(&[other, etcd_budget(1), etcd_budget(0)], &pod).unwrap();
    assert!(why.starts_with("PodDisruptionBudget etcd-pdb"), "{why}");
}

fn condition(sim: &Sim) -> (String, String) {
    let s = sim.o.request.status.as_ref().unwrap();
    let c = conditions::get(&s.conditions, conditions::DISRUPTION_BUDGET).unwrap();
    (c.status.clone(), c.message.clone())
}

/// Member pods deleted (not our helper pods).
fn deleted_pods(sim: &Sim) -> usize {
    sim.log.iter().filter(|a| deletes_member(a)).count()
}

fn deletes_member(a: &Action) -> bool {
    matches!(a, Action::Delete { kind: Kind::Pod, name, .. } if ["etcd-0", "etcd-1", "etcd-2"].contains(&name.as_str()))
}

#[test]
fn a_member_waits_while_a_budget_allows_nothing_then_goes() {
    let mut o = observed(spec_class_change("fast"));
    o.request.spec.apply = ApplyPolicy::Always;
    o.budgets = vec![etcd_budget(0)];
    let mut sim = Sim::new(o);
    sim.run(80);
    assert_eq!(sim.step_of("etcd-0"), MemberStep::GatingStop);
    assert_eq!(
        deleted_pods(&sim),
        0,
        "no member pod is deleted: {:?}",
        sim.log
    );
    let (status, message) = condition(&sim);
    assert_eq!(status, "False");
    assert!(
        message.starts_with("member pod etcd-0 is not stopped: PodDisruptionBudget etcd-pdb"),
        "{message}"
    );
    let waits = sim
        .reasons()
        .iter()
        .filter(|r| **r == "WaitingForDisruptionBudget")
        .count();
    assert_eq!(waits, 1, "one Event while the reason stays the same");
    sim.o.budgets = vec![etcd_budget(1)];
    sim.run(400);
    assert_eq!(
        sim.o.request.status.as_ref().unwrap().phase,
        Phase::Successful
    );
    let (status, message) = condition(&sim);
    assert_eq!(status, "True");
    assert!(message.contains("etcd-pdb allows member pod"), "{message}");
}

#[test]
fn a_budget_closed_after_the_gate_keeps_the_pod_from_being_deleted() {
    let mut sim = Sim::at(MemberStep::StoppingPod);
    let d = decide(&sim.o, &crate::plan::fixtures::SETTINGS);
    for a in &d.actions {
        sim.apply(a);
    }
    sim.o.budgets = vec![etcd_budget(0)];
    let d = decide(&sim.o, &crate::plan::fixtures::SETTINGS);
    assert!(!d.actions.iter().any(deletes_member), "{:?}", d.actions);
    sim.o.budgets = vec![etcd_budget(1)];
    let d = decide(&sim.o, &crate::plan::fixtures::SETTINGS);
    assert!(d.actions.iter().any(deletes_member), "{:?}", d.actions);
}

#[test]
fn the_timeout_while_a_budget_holds_names_it_and_rolls_back() {
    let mut o = observed(spec_class_change("fast"));
    o.request.spec.apply = ApplyPolicy::Always;
    o.budgets = vec![etcd_budget(0)];
    let mut sim = Sim::new(o);
    sim.run(80);
    sim.o.now = t(10 + 31 * 60);
    sim.run(200);
    let s = sim.o.request.status.clone().unwrap();
    assert_eq!(s.phase, Phase::Failed);
    let failure = s.failure.unwrap();
    assert!(
        failure.contains(
            "expired while member pod etcd-0 waited for a disruption budget: \
                          PodDisruptionBudget etcd-pdb"
        ),
        "{failure}"
    );
    assert_eq!(sim.step_of("etcd-0"), MemberStep::RolledBack);
    assert_eq!(deleted_pods(&sim), 0);
}

/// A budget the disruption controller cannot count while the set is orphaned: its status
/// says no disruption (fail-safe), whatever the pods.
fn max_unavailable_budget(max: Value) -> Budget {
    let spec = json!({"maxUnavailable": max, "selector": {"matchLabels": {"app": "etcd"}}});
    let status = json!({
        "disruptionsAllowed": 0, "currentHealthy": 3, "desiredHealthy": 2,
        "expectedPods": 3, "observedGeneration": 1,
    });
    from_json("etcd-pdb", Some(1), spec, status)
}

#[test]
fn desired_healthy_as_the_disruption_controller_computes_it() {
    assert_eq!(max_unavailable_budget(json!(1)).desired_healthy(3), Some(2));
    assert_eq!(
        max_unavailable_budget(json!("34%")).desired_healthy(3),
        Some(1)
    );
    assert_eq!(max_unavailable_budget(json!(5)).desired_healthy(3), Some(0));
    assert_eq!(
        max_unavailable_budget(json!("x")).desired_healthy(3),
        Some(0)
    );
    let min = |v: Value| from_json("b", None, json!({"minAvailable": v}), Value::Null);
    assert_eq!(min(json!("50%")).desired_healthy(3), Some(2));
    assert_eq!(min(json!("100%")).desired_healthy(3), Some(3));
    assert_eq!(min(json!(2)).desired_healthy(3), None, "no scale needed");
    assert!(!min(json!(2)).needs_scale());
    assert!(min(json!("50%")).needs_scale());
    assert!(max_unavailable_budget(json!(1)).needs_scale());
    let b = max_unavailable_budget(json!(1));
    let counted = |healthy| Counted {
        expected: 3,
        healthy,
    };
    assert_eq!(b.counted_refusal(counted(3)), None);
    let why = b.counted_refusal(counted(2)).unwrap();
    assert!(
        why.starts_with(
            "PodDisruptionBudget etcd-pdb (maxUnavailable 1) allows 0 disruptions (2 healthy \
             of 3 members, 2 must stay healthy; counted by the operator"
        ),
        "{why}"
    );
}

#[test]
fn a_max_unavailable_budget_is_counted_by_the_operator_while_the_set_is_orphaned() {
    let mut o = observed(spec_class_change("fast"));
    o.request.spec.apply = ApplyPolicy::Always;
    o.budgets = vec![max_unavailable_budget(json!(1))];
    let mut sim = Sim::new(o);
    sim.run(400);
    assert_eq!(
        sim.o.request.status.as_ref().unwrap().phase,
        Phase::Successful,
        "the controller's fail-safe 0 does not hold orphaned members: {:?}",
        sim.events
    );
}

#[test]
fn a_max_unavailable_budget_holds_while_another_member_is_not_ready() {
    let mut o = observed(spec_class_change("fast"));
    o.request.spec.apply = ApplyPolicy::Always;
    o.budgets = vec![max_unavailable_budget(json!(1))];
    o.pods.get_mut("etcd-2").unwrap().update(|p| {
        p.status.as_mut().unwrap().conditions = None;
    });
    let mut sim = Sim::new(o);
    sim.run(80);
    assert_eq!(sim.step_of("etcd-0"), MemberStep::GatingStop);
    assert_eq!(deleted_pods(&sim), 0);
    let (status, message) = condition(&sim);
    assert_eq!(status, "False");
    assert!(
        message.contains("allows 0 disruptions (2 healthy of 3 members"),
        "{message}"
    );
}

/// The phase the first decision writes.
fn phase(o: &crate::plan::Observed) -> Phase {
    match decide(o, &crate::plan::fixtures::SETTINGS).actions.first() {
        Some(Action::SetStatus(s)) => s.phase,
        other => panic!("expected SetStatus first, got {other:?}"),
    }
}

/// The Denied condition's reason and message of the first decision.
fn denial(o: &crate::plan::Observed) -> (String, String) {
    let d = decide(o, &crate::plan::fixtures::SETTINGS);
    let Some(Action::SetStatus(s)) = d.actions.first() else {
        panic!("expected SetStatus first, got {:?}", d.actions);
    };
    assert_eq!(s.phase, Phase::Denied);
    let c = conditions::get(&s.conditions, conditions::ACCEPTED).expect("Accepted");
    (c.reason.clone(), c.message.clone())
}

#[test]
fn if_ready_is_denied_while_a_budget_allows_nothing_and_always_starts() {
    let mut o = observed(spec_class_change("fast"));
    o.budgets = vec![etcd_budget(1)];
    assert_eq!(phase(&o), Phase::Progressing);
    o.budgets = vec![etcd_budget(0)];
    let (reason, message) = denial(&o);
    assert_eq!(reason, "DisruptionBudget");
    assert!(
        message.starts_with(
            "apply is IfReady and member pod etcd-0 may not be stopped now: PodDisruptionBudget \
             etcd-pdb (minAvailable 2) allows 0 disruptions"
        ),
        "{message}"
    );
    assert!(message.contains("its rule leaves no room"), "{message}");
    assert!(
        message.contains("(runbook: docs/runbook.md#denied-"),
        "{message}"
    );
    // Room by its rule, but a pod it selects is not Ready.
    if let Some(s) = o.budgets[0].status.as_mut() {
        (s.current_healthy, s.desired_healthy) = (1, 2);
    }
    let (_, message) = denial(&o);
    assert!(
        message.contains("a pod it selects is not Ready?"),
        "{message}"
    );
    o.request.spec.apply = ApplyPolicy::Always;
    assert_eq!(phase(&o), Phase::Progressing);
}
