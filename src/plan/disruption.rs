//! PodDisruptionBudgets: a member pod is deleted only while every budget that selects it allows
//! at least one disruption (pure; the cluster layer reads the budgets, see
//! `cluster::gather`).
//!
//! - The budgets are read through `policy/v1` (the only version served since Kubernetes 1.25;
//!   the operator supports 1.30 and newer), into a [`Budget`].
//! - Selection is the budget's label selector on the pod's labels ([`selects`]). A budget with
//!   no selector selects nothing; an empty selector (`{}`) selects every pod of the namespace,
//!   as the disruption controller and the eviction API do.
//! - A budget whose status is behind its spec (`status.observedGeneration < generation`), or
//!   has no status yet, allows nothing until the disruption controller has caught up: its
//!   `disruptionsAllowed` was computed for an older spec.
//! - While migrating, the StatefulSet is orphaned and its pods have no controller. The
//!   disruption controller can still count a budget with an integer `minAvailable`, but not one
//!   with `maxUnavailable` or a percentage (it needs the controller's scale): it reports no
//!   disruption allowed until the set is back. For those the operator counts the budget itself
//!   over the plan's members, as the controller would (expected = the members it selects,
//!   healthy = their pods Ready, percentages rounded up); pods it selects outside the
//!   StatefulSet are not counted then.
//! - [`hold`]: the gate before a member stops (`GatingStop`) and again just before its pod is
//!   deleted (`StoppingPod`): while a budget holds, the member waits with the condition
//!   `DisruptionBudget` (`False`, reason `Waiting`, message naming the budget and its numbers)
//!   and one `WaitingForDisruptionBudget` Event; the request's timeout bounds the wait, and its
//!   failure names the budget ([`timeout_failure`]).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::{Ctx, EventType, Failure};
use crate::api::{MemberStep, conditions};

/// How often a member held by a budget is looked at again (budgets are not watched).
pub const REQUEUE_HELD: Duration = Duration::from_secs(2);

/// One PodDisruptionBudget of the request's namespace, as the gate needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    pub name: String,
    /// `spec.selector`; `None` when absent (selects nothing).
    pub selector: Option<LabelSelector>,
    pub generation: Option<i64>,
    /// `None` when it has no status yet (or one that cannot be read).
    pub status: Option<PodDisruptionBudgetStatus>,
    /// `spec.minAvailable` / `spec.maxUnavailable` as written (for messages).
    pub rule: String,
    pub min_available: Option<IntOrString>,
    pub max_unavailable: Option<IntOrString>,
}

/// The members a budget selects, as the operator counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    /// Members of the plan it selects (a member whose pod is gone counts).
    pub expected: i32,
    /// Those whose pod is there, Ready and not terminating.
    pub healthy: i32,
}

impl Budget {
    /// A budget from the object the API server returned (`policy/v1`).
    pub fn from_budget(budget: PodDisruptionBudget) -> Self {
        let name = budget.name_any();
        let generation = budget.metadata.generation;
        let spec = budget.spec.unwrap_or_default();
        let status = budget.status;
        let rule = match (&spec.min_available, &spec.max_unavailable) {
            (Some(m), _) => format!("minAvailable {}", int_or_string(m)),
            (None, Some(m)) => format!("maxUnavailable {}", int_or_string(m)),
            (None, None) => "no minAvailable or maxUnavailable".to_string(),
        };
        Budget {
            name,
            selector: spec.selector,
            generation,
            status,
            rule,
            min_available: spec.min_available,
            max_unavailable: spec.max_unavailable,
        }
    }

    /// Why this budget does not allow the disruption of one pod now, if it does not.
    pub fn refusal(&self) -> Option<String> {
        let name = &self.name;
        let Some(s) = &self.status else {
            return Some(format!(
                "PodDisruptionBudget {name} ({}) has no status yet: the disruption controller \
                 has not computed how many disruptions it allows",
                self.rule
            ));
        };
        if let (Some(generation), observed) = (self.generation, s.observed_generation)
            && observed.unwrap_or(0) < generation
        {
            return Some(format!(
                "PodDisruptionBudget {name} ({}) changed and its status is not up to date \
                 (generation {generation}, observed {}): waiting for the disruption controller",
                self.rule,
                observed.unwrap_or(0)
            ));
        }
        (s.disruptions_allowed < 1).then(|| {
            format!(
                "PodDisruptionBudget {name} ({}) allows {} disruptions ({} healthy of {} \
                 expected pods, {} must stay healthy)",
                self.rule,
                s.disruptions_allowed,
                s.current_healthy,
                s.expected_pods,
                s.desired_healthy
            )
        })
    }
}

impl Budget {
    /// True when, by its status, the rule needs every pod it selects healthy (or more): it
    /// can never allow a disruption of these pods (`minAvailable` as many as the pods,
    /// `maxUnavailable: 0`).
    pub fn leaves_no_room(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(|s| s.expected_pods > 0 && s.desired_healthy >= s.expected_pods)
    }

    /// True when the disruption controller needs the scale of the pods' controller to compute
    /// this budget (`maxUnavailable`, or `minAvailable` as a percentage). It cannot while the
    /// StatefulSet is orphaned (its pods have no controller): it then reports no disruption
    /// allowed, whatever the pods' health, until the set is back.
    pub fn needs_scale(&self) -> bool {
        self.max_unavailable.is_some() || matches!(self.min_available, Some(IntOrString::String(_)))
    }

    /// How many of `c.expected` members must stay healthy, as the disruption controller
    /// computes it (percentages rounded up); `None` when it needs no scale.
    pub fn desired_healthy(&self, expected: i32) -> Option<i32> {
        match (&self.min_available, &self.max_unavailable) {
            (_, Some(max)) => Some((expected - scaled(max, expected)).max(0)),
            (Some(min @ IntOrString::String(_)), None) => Some(scaled(min, expected)),
            _ => None,
        }
    }

    /// [`Budget::refusal`] computed by the operator from the members it counted, for a budget
    /// the disruption controller cannot compute while the members have no controller.
    pub fn counted_refusal(&self, c: Counted) -> Option<String> {
        let desired = self.desired_healthy(c.expected)?;
        let allowed = c.healthy - desired;
        (allowed < 1).then(|| {
            format!(
                "PodDisruptionBudget {} ({}) allows {} disruptions ({} healthy of {} members, \
                 {desired} must stay healthy; counted by the operator, as the disruption \
                 controller cannot count this budget while the StatefulSet is orphaned)",
                self.name,
                self.rule,
                allowed.max(0),
                c.healthy,
                c.expected
            )
        })
    }
}

/// `v` of `total`: an integer as it is, a percentage rounded up (as the disruption controller
/// does); a value that cannot be read counts as all of `total` (nothing may be disrupted).
fn scaled(v: &IntOrString, total: i32) -> i32 {
    match v {
        IntOrString::Int(i) => *i,
        IntOrString::String(s) => s
            .strip_suffix('%')
            .and_then(|p| p.trim().parse::<i64>().ok())
            .map(|p| ((p * i64::from(total) + 99) / 100) as i32)
            .unwrap_or(total),
    }
}

fn int_or_string(v: &IntOrString) -> String {
    match v {
        IntOrString::Int(i) => i.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

/// True when `budget` selects a pod with `labels` (see the module's doc for the empty and
/// the absent selector).
pub fn selects(budget: &Budget, labels: &BTreeMap<String, String>) -> bool {
    let Some(selector) = &budget.selector else {
        return false;
    };
    // An empty selector (no labels, no expressions) selects every pod.
    let mut match_labels = selector.match_labels.iter().flatten();
    let mut expressions = selector.match_expressions.iter().flatten();
    match_labels.all(|(k, v)| labels.get(k) == Some(v))
        && expressions.all(|e| requirement_holds(e, labels))
}

/// One `matchExpressions` requirement on a pod's labels; an unknown operator never holds.
fn requirement_holds(r: &LabelSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&r.key);
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => false,
    }
}

/// Why a pod with `labels` may not be disrupted now, by the disruption controller's status:
/// the refusal of the first budget (by name) that selects it and does not allow a disruption.
pub fn refusal(budgets: &[Budget], labels: &BTreeMap<String, String>) -> Option<String> {
    budgets
        .iter()
        .filter(|b| selects(b, labels))
        .find_map(Budget::refusal)
}

/// The budgets that select a pod with `labels`, by name.
fn selecting(budgets: &[Budget], labels: &BTreeMap<String, String>) -> Vec<String> {
    budgets
        .iter()
        .filter(|b| selects(b, labels))
        .map(|b| b.name.clone())
        .collect()
}

/// Why the budgets keep member pod `pod` from being deleted now, if they do (a pod not
/// observed, or already terminating, is not held here: its step handles it). A budget the
/// disruption controller cannot compute while a member it selects has no controller (the
/// StatefulSet orphaned) is counted by the operator over the plan's members instead
/// ([`Budget::counted_refusal`]); pods it selects outside the StatefulSet are not counted then.
fn member_refusal(cx: &Ctx, pod: &str) -> Option<String> {
    let pod = cx.o.pods.get(pod)?.typed();
    if super::is_terminating(pod) {
        return None;
    }
    cx.o.budgets
        .iter()
        .filter(|b| selects(b, pod.labels()))
        .find_map(|b| match counted(cx, b) {
            Some(c) if b.needs_scale() => b.counted_refusal(c),
            _ => b.refusal(),
        })
}

/// The plan's members `budget` selects, counted, when one of their pods has no controller
/// (else `None`: the disruption controller's status is right). A member without a pod (or
/// only its stashed one) is counted by the labels of its stashed pod, else as selected.
fn counted(cx: &Ctx, budget: &Budget) -> Option<Counted> {
    let plan = cx.status.plan.as_ref()?;
    let mut c = Counted {
        expected: 0,
        healthy: 0,
    };
    let mut orphaned = false;
    for m in &plan.members {
        let live = cx.o.pods.get(&m.pod).map(|p| p.typed());
        let stashed = cx.o.stash.pods.get(&m.pod).map(|p| p.typed());
        if live
            .or(stashed)
            .is_some_and(|p| !selects(budget, p.labels()))
        {
            continue;
        }
        c.expected += 1;
        if let Some(p) = live {
            orphaned |= p
                .owner_references()
                .iter()
                .all(|o| o.controller != Some(true));
            if super::pod_ready(p) && !super::is_terminating(p) {
                c.healthy += 1;
            }
        }
    }
    orphaned.then_some(c)
}

/// The gate of the budgets before member pod `pod` is stopped. True when it holds: the
/// condition `DisruptionBudget` says why (an Event when it changes) and the decision looks
/// again soon. False when every budget that selects the pod allows a disruption (the condition
/// then says so, when a budget selects it or the condition was set before).
pub(crate) fn hold(cx: &mut Ctx, pod: &str) -> bool {
    if let Some(why) = member_refusal(cx, pod) {
        let message = format!("member pod {pod} is not stopped: {why}");
        if cx.set_condition(conditions::DISRUPTION_BUDGET, false, "Waiting", &message) {
            cx.event(EventType::Warning, "WaitingForDisruptionBudget", message);
        }
        cx.wait(REQUEUE_HELD);
        return true;
    }
    let names =
        cx.o.pods
            .get(pod)
            .map(|p| selecting(&cx.o.budgets, p.typed().labels()))
            .unwrap_or_default();
    let was_set = conditions::get(&cx.status.conditions, conditions::DISRUPTION_BUDGET).is_some();
    if !names.is_empty() || was_set {
        let message = match names.as_slice() {
            [] => format!("no PodDisruptionBudget selects member pod {pod}"),
            n => format!(
                "PodDisruptionBudget {} allows member pod {pod} to stop",
                n.join(", ")
            ),
        };
        cx.set_condition(conditions::DISRUPTION_BUDGET, true, "Allowed", &message);
    }
    false
}

/// The timeout's failure: [`Failure::DisruptionBudgetUntilTimeout`] naming the budget when a
/// budget holds the member in flight before its stop, else `timed_out` as it is.
pub(crate) fn timeout_failure(cx: &Ctx, timed_out: Failure) -> Failure {
    let held = super::in_flight(&cx.status)
        .and_then(|i| cx.status.members.get(i))
        .filter(|ms| matches!(ms.step, MemberStep::GatingStop | MemberStep::StoppingPod))
        .and_then(|ms| Some((ms.pod.clone(), member_refusal(cx, &ms.pod)?)));
    match held {
        Some((pod, why)) => Failure::DisruptionBudgetUntilTimeout {
            timeout: cx.spec().timeout.clone(),
            pod,
            why,
        },
        None => timed_out,
    }
}

#[cfg(test)]
#[path = "disruption_tests.rs"]
mod tests;
