//! The generic engine: a member is healthy when its pod is Ready (and not being deleted); an
//! optional pod label `key=value` marks the leader, which only orders the members (migrated
//! last). No quorum logic, no leadership transfer. Pure: works on the pods it is given.

use k8s_openapi::api::core::v1::Pod;

use super::{
    FinalCheckKind, Gate, HealthReport, InvalidSettings, MemberHealth, Rules, members_gate,
    ordinal_key, returned_gate,
};
use crate::api::{DatabaseSpec, GenericSpec};

/// The rules of the `Generic` engine: every member healthy before a stop, the member healthy
/// after its return; the label-marked leader only goes last (no handover); the final check is
/// each copy's verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GenericRules;

/// The rules of a request with `engine: Generic`.
pub fn rules(_spec: &DatabaseSpec) -> Box<dyn Rules> {
    Box::new(GenericRules)
}

impl Rules for GenericRules {
    fn gate_before_stop(&self, report: &HealthReport, pod: &str) -> Gate {
        members_gate(report, pod).unwrap_or(Gate::Open)
    }

    fn gate_after_return(&self, report: &HealthReport, pod: &str) -> Gate {
        returned_gate(report, pod).unwrap_or(Gate::Open)
    }

    fn final_check(&self) -> FinalCheckKind {
        FinalCheckKind::CopiesVerified
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Generic {
    /// The leader label as (key, value).
    leader_label: Option<(String, String)>,
}

impl Generic {
    /// Parses `spec.database.generic` (`leaderLabel: key=value`).
    pub fn new(spec: Option<&GenericSpec>) -> Result<Self, InvalidSettings> {
        let leader_label = match spec.and_then(|s| s.leader_label.as_deref()) {
            None => None,
            Some(label) => Some(parse_label(label)?),
        };
        Ok(Self { leader_label })
    }

    /// One member per pod, in ordinal order: healthy when Ready and not being deleted; the
    /// leader is the one pod carrying the leader label (several carrying it is a problem).
    /// A pure function of the pods (the cluster layer lists them).
    pub fn observe(&self, pods: &[Pod]) -> HealthReport {
        let mut members: Vec<MemberHealth> = pods
            .iter()
            .map(|pod| {
                let name = pod.metadata.name.clone().unwrap_or_default();
                let problem = pod_problem(pod);
                MemberHealth {
                    healthy: problem.is_none(),
                    leader: self.is_leader(pod),
                    problem,
                    pod: name,
                    ..MemberHealth::default()
                }
            })
            .collect();
        members.sort_by(|a, b| ordinal_key(&a.pod).cmp(&ordinal_key(&b.pod)));
        let leaders: Vec<&str> = members
            .iter()
            .filter(|m| m.leader)
            .map(|m| m.pod.as_str())
            .collect();
        let mut problems = Vec::new();
        let leader = match leaders.as_slice() {
            [] => None,
            [one] => Some(one.to_string()),
            many => {
                problems.push(format!(
                    "several pods carry the leader label: {}",
                    many.join(", ")
                ));
                None
            }
        };
        HealthReport {
            members,
            leader,
            problems,
            voting_members: None,
            replicas_for_writes: 0,
        }
    }

    fn is_leader(&self, pod: &Pod) -> bool {
        let Some((key, value)) = &self.leader_label else {
            return false;
        };
        pod.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .is_some_and(|v| v == value)
    }
}

fn parse_label(label: &str) -> Result<(String, String), InvalidSettings> {
    match label.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() && !value.contains('=') => {
            Ok((key.trim().to_string(), value.trim().to_string()))
        }
        _ => Err(InvalidSettings(format!(
            "spec.database.generic.leaderLabel must be key=value, got {label:?}"
        ))),
    }
}

/// Why a pod is not a healthy member, or None when it is Ready and not being deleted.
pub(crate) fn pod_problem(pod: &Pod) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Some("pod is being deleted".to_string());
    }
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    if ready {
        return None;
    }
    let phase = status
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("unknown phase");
    Some(format!("pod is not Ready (phase {phase})"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;

    fn pod(name: &str, ready: bool, labels: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect::<BTreeMap<_, _>>(),
                ),
                ..ObjectMeta::default()
            },
            status: Some(PodStatus {
                phase: Some("Running".to_string()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".to_string(),
                    status: if ready { "True" } else { "False" }.to_string(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    fn spec(label: &str) -> GenericSpec {
        GenericSpec {
            leader_label: Some(label.to_string()),
        }
    }

    #[test]
    fn readiness_makes_health() {
        let g = Generic::new(None).unwrap();
        let r = g.observe(&[pod("db-1", false, &[]), pod("db-0", true, &[])]);
        assert_eq!(r.members[0].pod, "db-0");
        assert!(r.members[0].healthy);
        assert!(!r.members[1].healthy);
        assert_eq!(
            r.members[1].problem.as_deref(),
            Some("pod is not Ready (phase Running)")
        );
        assert_eq!(r.leader, None);
        assert_eq!(GenericRules.handover_target(&r, "db-0", &[]), None);
        assert!(r.problems.is_empty());
    }

    #[test]
    fn terminating_pod_is_unhealthy() {
        let mut p = pod("db-0", true, &[]);
        p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let r = Generic::new(None).unwrap().observe(&[p]);
        assert_eq!(
            r.members[0].problem.as_deref(),
            Some("pod is being deleted")
        );
    }

    #[test]
    fn leader_label_marks_the_leader() {
        let g = Generic::new(Some(&spec("role=primary"))).unwrap();
        let r = g.observe(&[
            pod("db-0", true, &[("role", "replica")]),
            pod("db-1", true, &[("role", "primary")]),
            pod("db-2", true, &[]),
        ]);
        assert_eq!(r.leader.as_deref(), Some("db-1"));
        assert!(r.members[1].leader);
        assert_eq!(
            GenericRules
                .next_member(&r, &["db-0".into(), "db-1".into(), "db-2".into()])
                .as_deref(),
            Some("db-0")
        );
        assert_eq!(
            GenericRules
                .next_member(&r, &["db-1".into(), "db-2".into()])
                .as_deref(),
            Some("db-2")
        );
    }

    #[test]
    fn two_leaders_is_a_problem() {
        let g = Generic::new(Some(&spec("role=primary"))).unwrap();
        let r = g.observe(&[
            pod("db-0", true, &[("role", "primary")]),
            pod("db-1", true, &[("role", "primary")]),
        ]);
        assert_eq!(r.leader, None);
        assert_eq!(
            r.problems,
            vec!["several pods carry the leader label: db-0, db-1"]
        );
    }

    #[test]
    fn malformed_label_is_refused() {
        for bad in ["role", "=x", "a=b=c"] {
            assert!(
                matches!(Generic::new(Some(&spec(bad))), Err(InvalidSettings(_))),
                "{bad}"
            );
        }
        assert!(Generic::new(Some(&spec("role="))).is_ok());
    }
}
