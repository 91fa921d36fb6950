//! Every claim of a request and its volumes, one way. Pure.
//!
//! A member has one claim per volumeClaimTemplate moved (the plan's `claim`, then
//! `furtherClaims[]`), each with an old volume, a temporary claim and, once provisioned, a new
//! volume. Everything that walks a request's claims or volumes goes through [`member_claim`],
//! [`member_claims`] or [`request_claims`]: the step functions (a member seen on its claim),
//! the rollback and the cleanup, the failure message's data locations, the volumes `gather`
//! reads, the controller's wake-ups, and `kubectl smr orphans` (which volumes a request names).

use crate::api::{MemberStatus, Plan, PlannedMember, StorageMigrationRequestStatus};

/// Which of a claim's volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum VolumeRole {
    /// The volume the claim was bound to before the request: the original data.
    Old,
    /// The volume provisioned for the temporary claim: the copy, the claim's volume after the
    /// swap.
    New,
}

impl VolumeRole {
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeRole::Old => "old",
            VolumeRole::New => "new",
        }
    }
}

/// One claim of one member, as the request's plan and status know it.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestClaim {
    /// Which of the member's claims: 0 for the plan's `claim`, `k` for `furtherClaims[k-1]`.
    pub slot: usize,
    /// The member as planned, seen on this claim ([`PlannedMember::on_claim`]): its `claim`,
    /// `old_volume`, `temp_claim` and sizes are this claim's.
    pub planned: PlannedMember,
    /// The member's status seen on this claim ([`MemberStatus::on_claim`]): its `first_claim`
    /// is this claim's status (empty before the member has a status).
    pub status: MemberStatus,
    /// What this claim's helpers (Jobs, mounter pod) are named after.
    pub subject: String,
    /// A further claim's volumeClaimTemplate (for a Deployment, the pod volume naming it);
    /// `None` for the first claim (the plan's `template`).
    pub template: Option<String>,
}

impl RequestClaim {
    /// The member's pod.
    pub fn pod(&self) -> &str {
        &self.planned.pod
    }

    /// The claim, by its own name.
    pub fn claim(&self) -> &str {
        &self.planned.claim
    }

    /// The temporary claim the copy is made on.
    pub fn temp_claim(&self) -> &str {
        &self.planned.temp_claim
    }

    /// The volume the claim was bound to before the request.
    pub fn old_volume(&self) -> &str {
        &self.planned.old_volume
    }

    /// The temporary claim's volume, once recorded.
    pub fn new_volume(&self) -> Option<&str> {
        self.status.first_claim.new_volume.as_deref()
    }

    /// The claim's volumes the request names: the old one, and the new one once recorded.
    pub fn volumes(&self) -> Vec<(VolumeRole, &str)> {
        let old = Some(self.old_volume()).filter(|v| !v.is_empty());
        let old = old.map(|v| (VolumeRole::Old, v));
        let new = self.new_volume().map(|v| (VolumeRole::New, v));
        old.into_iter().chain(new).collect()
    }
}

/// Claim `slot` of a member (the last one when `slot` is past it).
pub fn member_claim(m: &PlannedMember, ms: &MemberStatus, slot: usize) -> RequestClaim {
    let slot = slot.min(m.further_claims.len());
    RequestClaim {
        slot,
        planned: m.on_claim(slot),
        status: ms.on_claim(slot),
        subject: m.helper_subject(slot),
        template: (slot.checked_sub(1))
            .and_then(|k| m.further_claims.get(k))
            .map(|c| c.template.clone()),
    }
}

/// Every claim of a member, its first claim first.
pub fn member_claims(m: &PlannedMember, ms: &MemberStatus) -> Vec<RequestClaim> {
    (0..=m.further_claims.len())
        .map(|slot| member_claim(m, ms, slot))
        .collect()
}

/// Every claim of every planned member of a request, in the plan's order, each with its
/// member's status (found by pod; empty when the member has none yet). None before a plan.
pub fn request_claims(status: &StorageMigrationRequestStatus) -> Vec<RequestClaim> {
    let members = status.plan.iter().flat_map(|p| p.members.iter());
    members
        .flat_map(|m| {
            let ms = (status.members.iter()).find(|ms| ms.pod == m.pod);
            member_claims(m, &ms.cloned().unwrap_or_default())
        })
        .collect()
}

/// Every claim of every member of a plan, as planned (no status: before or apart from it).
pub fn plan_claims(plan: &Plan) -> Vec<RequestClaim> {
    (plan.members.iter())
        .flat_map(|m| member_claims(m, &MemberStatus::default()))
        .collect()
}

/// Every volume a request names (old and new, of every claim of every member), with its role
/// and claim.
pub fn request_volumes(
    status: &StorageMigrationRequestStatus,
) -> Vec<(String, VolumeRole, RequestClaim)> {
    request_claims(status)
        .into_iter()
        .flat_map(|c| {
            let named: Vec<(String, VolumeRole)> = (c.volumes().into_iter())
                .map(|(r, v)| (v.to_string(), r))
                .collect();
            named.into_iter().map(move |(v, r)| (v, r, c.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ClaimStatus, PlannedClaim};

    fn status() -> StorageMigrationRequestStatus {
        let member = |pod: &str, further: bool| PlannedMember {
            pod: pod.into(),
            claim: format!("data-{pod}"),
            old_volume: format!("pv-data-{pod}"),
            temp_claim: format!("r-data-{pod}"),
            further_claims: if further {
                vec![PlannedClaim {
                    template: "wal".into(),
                    claim: format!("wal-{pod}"),
                    old_volume: format!("pv-wal-{pod}"),
                    temp_claim: format!("r-wal-{pod}"),
                    ..Default::default()
                }]
            } else {
                Vec::new()
            },
            ..Default::default()
        };
        let mut ms = MemberStatus {
            pod: "db-0".into(),
            ..Default::default()
        };
        ms.first_claim.new_volume = Some("pv-new-data-db-0".into());
        ms.further_claims = vec![ClaimStatus {
            claim: "wal-db-0".into(),
            new_volume: Some("pv-new-wal-db-0".into()),
            ..Default::default()
        }];
        StorageMigrationRequestStatus {
            plan: Some(Plan {
                members: vec![member("db-0", true), member("db-1", true)],
                ..Default::default()
            }),
            // db-1 has no status yet.
            members: vec![ms],
            ..Default::default()
        }
    }

    #[test]
    fn every_claim_of_every_member_first_and_further() {
        let claims = request_claims(&status());
        let names: Vec<(&str, usize, &str, &str, &str)> = claims
            .iter()
            .map(|c| {
                (
                    c.pod(),
                    c.slot,
                    c.claim(),
                    c.temp_claim(),
                    c.subject.as_str(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("db-0", 0, "data-db-0", "r-data-db-0", "db-0"),
                ("db-0", 1, "wal-db-0", "r-wal-db-0", "db-0-wal"),
                ("db-1", 0, "data-db-1", "r-data-db-1", "db-1"),
                ("db-1", 1, "wal-db-1", "r-wal-db-1", "db-1-wal"),
            ]
        );
        assert_eq!(
            request_claims(&StorageMigrationRequestStatus::default()),
            []
        );
    }

    #[test]
    fn every_volume_old_and_new_of_further_claims_too() {
        let volumes: Vec<(String, VolumeRole, String)> = request_volumes(&status())
            .into_iter()
            .map(|(v, r, c)| (v, r, c.claim().to_string()))
            .collect();
        let v = |v: &str, r, c: &str| (v.to_string(), r, c.to_string());
        assert_eq!(
            volumes,
            [
                v("pv-data-db-0", VolumeRole::Old, "data-db-0"),
                v("pv-new-data-db-0", VolumeRole::New, "data-db-0"),
                v("pv-wal-db-0", VolumeRole::Old, "wal-db-0"),
                v("pv-new-wal-db-0", VolumeRole::New, "wal-db-0"),
                v("pv-data-db-1", VolumeRole::Old, "data-db-1"),
                v("pv-wal-db-1", VolumeRole::Old, "wal-db-1"),
            ]
        );
    }

    #[test]
    fn a_slot_past_the_last_claim_is_the_last() {
        let s = status();
        let plan = s.plan.clone().unwrap_or_default();
        let c = member_claim(&plan.members[0], &s.members[0], 5);
        assert_eq!(
            (c.slot, c.claim(), c.new_volume()),
            (1, "wal-db-0", Some("pv-new-wal-db-0"))
        );
    }
}
