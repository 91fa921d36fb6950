//! Prometheus metrics (`prometheus-client`), served at `/metrics` by [`crate::serve`].
//!
//! | metric | type | what |
//! |---|---|---|
//! | `storage_migrator_requests{phase}` | gauge | requests this replica has seen, by phase |
//! | `storage_migrator_members_total{result}` | counter | members finished: `migrated`, `rolled_back` |
//! | `storage_migrator_member_downtime_seconds` | histogram | pod deleted → Ready again, per migrated member |
//! | `storage_migrator_copied_bytes_total` | counter | bytes the copy Jobs moved, over migrated members |
//! | `storage_migrator_copy_rate_bytes_per_second` | histogram | a member's bytes over its whole migration time (start to finish) |
//! | `storage_migrator_reconcile_errors_total{retry}` | counter | failed reconciles: `transient`, `permanent` |
//! | `storage_migrator_reconcile_duration_seconds` | histogram | one reconcile (several decide→act rounds) |
//! | `storage_migrator_leader` | gauge | 1 while this replica holds the lease |
//!
//! Member outcomes are read off status changes ([`member_outcomes`], pure): a member counts once,
//! when a status the operator writes first shows it Done or RolledBack.

use std::collections::HashMap;
use std::sync::Mutex;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::api::{MemberStep, Phase, StorageMigrationRequestStatus};
use crate::cluster::Retry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
enum PhaseValue {
    Pending,
    Progressing,
    Successful,
    Failed,
    Denied,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: PhaseValue,
}

/// How a member's migration ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum MemberResult {
    migrated,
    rolled_back,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: MemberResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
enum RetryValue {
    transient,
    permanent,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RetryLabels {
    retry: RetryValue,
}

/// One member that finished between two statuses.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberOutcome {
    pub result: MemberResult,
    pub downtime_seconds: Option<f64>,
    pub bytes: Option<i64>,
    /// Seconds from the member's start to its finish.
    pub seconds: Option<f64>,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<PhaseLabels, Gauge>,
    members: Family<ResultLabels, Counter>,
    downtime: Histogram,
    bytes: Counter,
    rate: Histogram,
    errors: Family<RetryLabels, Counter>,
    reconcile: Histogram,
    leader: Gauge,
    phases: Mutex<HashMap<String, Phase>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let m = Self {
            registry: Registry::with_prefix("storage_migrator"),
            requests: Family::default(),
            members: Family::default(),
            downtime: Histogram::new(exponential_buckets(0.5, 2.0, 10)),
            bytes: Counter::default(),
            rate: Histogram::new(exponential_buckets(1024.0 * 1024.0, 2.0, 14)),
            errors: Family::default(),
            reconcile: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            leader: Gauge::default(),
            phases: Mutex::new(HashMap::new()),
        };
        m.register()
    }

    fn register(mut self) -> Self {
        let r = &mut self.registry;
        r.register("requests", "Requests seen, by phase", self.requests.clone());
        r.register(
            "members",
            "Members finished, by result",
            self.members.clone(),
        );
        r.register(
            "member_downtime_seconds",
            "Per migrated member: pod deleted until Ready again",
            self.downtime.clone(),
        );
        r.register(
            "copied_bytes",
            "Bytes copied for migrated members",
            self.bytes.clone(),
        );
        r.register(
            "copy_rate_bytes_per_second",
            "Per migrated member: bytes copied over its migration time",
            self.rate.clone(),
        );
        r.register(
            "reconcile_errors",
            "Failed reconciles, by retry kind",
            self.errors.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Duration of one reconcile",
            self.reconcile.clone(),
        );
        r.register(
            "leader",
            "1 while this replica holds the lease",
            self.leader.clone(),
        );
        self
    }

    /// The text exposition format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    pub fn reconcile_finished(&self, seconds: f64) {
        self.reconcile.observe(seconds);
    }

    pub fn reconcile_failed(&self, retry: Retry) {
        let retry = match retry {
            Retry::Transient => RetryValue::transient,
            Retry::Permanent => RetryValue::permanent,
        };
        self.errors.get_or_create(&RetryLabels { retry }).inc();
    }

    /// Records a request's phase (`None`: the request is gone).
    pub fn request_phase(&self, key: &str, phase: Option<Phase>) {
        let mut phases = self.phases.lock().unwrap_or_else(|p| p.into_inner());
        match phase {
            Some(p) => phases.insert(key.to_string(), p),
            None => phases.remove(key),
        };
        let all = [
            (Phase::Pending, PhaseValue::Pending),
            (Phase::Progressing, PhaseValue::Progressing),
            (Phase::Successful, PhaseValue::Successful),
            (Phase::Failed, PhaseValue::Failed),
            (Phase::Denied, PhaseValue::Denied),
        ];
        for (p, value) in all {
            let n = phases.values().filter(|q| **q == p).count();
            let gauge = self.requests.get_or_create(&PhaseLabels { phase: value });
            gauge.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Records the members that finished between `before` and `after`.
    pub fn status_written(
        &self,
        before: Option<&StorageMigrationRequestStatus>,
        after: &StorageMigrationRequestStatus,
    ) {
        for o in member_outcomes(before, after) {
            self.members
                .get_or_create(&ResultLabels { result: o.result })
                .inc();
            if o.result != MemberResult::migrated {
                continue;
            }
            if let Some(d) = o.downtime_seconds {
                self.downtime.observe(d);
            }
            if let Some(b) = o.bytes.and_then(|b| u64::try_from(b).ok()) {
                self.bytes.inc_by(b);
                if let Some(s) = o.seconds.filter(|s| *s > 0.0) {
                    self.rate.observe(b as f64 / s);
                }
            }
        }
    }
}

/// The members whose step became Done or RolledBack from `before` to `after` (pure).
pub fn member_outcomes(
    before: Option<&StorageMigrationRequestStatus>,
    after: &StorageMigrationRequestStatus,
) -> Vec<MemberOutcome> {
    let was = |pod: &str| {
        before
            .and_then(|b| b.members.iter().find(|m| m.pod == pod))
            .map(|m| m.step)
    };
    after
        .members
        .iter()
        .filter_map(|m| {
            let result = match m.step {
                MemberStep::Done => MemberResult::migrated,
                MemberStep::RolledBack => MemberResult::rolled_back,
                _ => return None,
            };
            if was(&m.pod).as_ref() == Some(&m.step) {
                return None;
            }
            let seconds = match (&m.started, &m.finished) {
                (Some(s), Some(f)) => Some(f.0.duration_since(s.0).as_secs_f64()),
                _ => None,
            };
            // Every claim of the member (its further claims move in the same stop).
            let planned = (after.plan.as_ref())
                .and_then(|p| p.members.iter().find(|p| p.pod == m.pod))
                .cloned()
                .unwrap_or_default();
            let claims = crate::plan::claims::member_claims(&planned, m);
            Some(MemberOutcome {
                result,
                downtime_seconds: m.downtime_seconds,
                bytes: claims
                    .iter()
                    .map(|c| c.status.first_claim.bytes_copied)
                    .sum(),
                seconds,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::MemberStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn member(pod: &str, step: MemberStep) -> MemberStatus {
        MemberStatus {
            pod: pod.into(),
            step,
            ..MemberStatus::default()
        }
    }

    fn status(members: Vec<MemberStatus>) -> StorageMigrationRequestStatus {
        StorageMigrationRequestStatus {
            members,
            ..StorageMigrationRequestStatus::default()
        }
    }

    #[test]
    fn a_member_counts_once_when_it_first_shows_done_or_rolled_back() {
        let start: k8s_openapi::jiff::Timestamp =
            "2026-12-01T10:00:00Z".parse().unwrap_or_default();
        let mut done = member("kv-0", MemberStep::Done);
        done.started = Some(Time(start));
        done.finished = Some(Time(
            start + k8s_openapi::jiff::SignedDuration::from_secs(8),
        ));
        done.first_claim.bytes_copied = Some(8 * 1024 * 1024);
        done.downtime_seconds = Some(2.5);
        let before = status(vec![
            member("kv-0", MemberStep::Copying),
            member("kv-1", MemberStep::RolledBack),
        ]);
        let after = status(vec![done, member("kv-1", MemberStep::RolledBack)]);
        let outcomes = member_outcomes(Some(&before), &after);
        assert_eq!(
            outcomes,
            vec![MemberOutcome {
                result: MemberResult::migrated,
                downtime_seconds: Some(2.5),
                bytes: Some(8 * 1024 * 1024),
                seconds: Some(8.0),
            }]
        );
        assert!(member_outcomes(Some(&after), &after).is_empty());
        let rolled = status(vec![member("kv-2", MemberStep::RolledBack)]);
        assert_eq!(
            member_outcomes(None, &rolled)[0].result,
            MemberResult::rolled_back
        );
    }

    /// A member's bytes are those of every claim the plan gives it, its further claims' too.
    #[test]
    fn a_members_bytes_are_those_of_every_claim() {
        let mut done = member("kv-0", MemberStep::Done);
        done.first_claim.bytes_copied = Some(50);
        done.further_claims = vec![crate::api::ClaimStatus {
            bytes_copied: Some(100),
            ..Default::default()
        }];
        let mut after = status(vec![done]);
        after.plan = Some(crate::api::Plan {
            members: vec![crate::api::PlannedMember {
                pod: "kv-0".into(),
                further_claims: vec![crate::api::PlannedClaim::default()],
                ..Default::default()
            }],
            ..Default::default()
        });
        assert_eq!(member_outcomes(None, &after)[0].bytes, Some(150));
    }

    #[test]
    fn the_exposition_carries_every_metric_with_its_values() {
        let m = Metrics::new();
        m.set_leader(true);
        m.request_phase("demo/a", Some(Phase::Progressing));
        m.request_phase("demo/b", Some(Phase::Progressing));
        m.request_phase("demo/c", Some(Phase::Failed));
        m.request_phase("demo/c", None);
        m.reconcile_failed(Retry::Transient);
        m.reconcile_finished(0.2);
        let mut done = member("kv-0", MemberStep::Done);
        done.first_claim.bytes_copied = Some(4096);
        done.downtime_seconds = Some(1.0);
        m.status_written(None, &status(vec![done]));
        let text = m.encode().unwrap_or_default();
        for line in [
            "storage_migrator_leader 1",
            "storage_migrator_requests{phase=\"Progressing\"} 2",
            "storage_migrator_requests{phase=\"Failed\"} 0",
            "storage_migrator_members_total{result=\"migrated\"} 1",
            "storage_migrator_copied_bytes_total 4096",
            "storage_migrator_member_downtime_seconds_count 1",
            "storage_migrator_reconcile_errors_total{retry=\"transient\"} 1",
            "storage_migrator_reconcile_duration_seconds_count 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
    }
}
