//! Every claim of a request and its volumes, one way. Pure.
//!
//! A member has one claim per volumeClaimTemplate moved (the plan's `claim`, then
//! `furtherClaims[]`), each with an old volume, a temporary claim and, once provisioned, a new
//! volume. Everything that walks a request's claims or volumes goes through [`member_claim`],
//! [`member_claims`] or [`request_claims`]: the step functions (a member seen on its claim),
//! the rollback and the cleanup, the failure message's data locations, the volumes `gather`
//! reads, the controller's wake-ups, and `kubectl smr orphans` (which volumes a request names).

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;

use crate::api::{
    MemberStatus, Plan, PlannedMember, StorageMigrationRequest, StorageMigrationRequestStatus,
};
use crate::labels;

/// Whether `claim`, found under one of `request`'s temporary claim names, is the one `request`
/// made. The name is derived from the request's name, so a claim of that name may be another's
/// (an earlier request of the same name, a person): it is the request's when its
/// [`labels::REQUEST_UID_LABEL`] is the request's uid. A claim without that label (made by an
/// operator before the label existed, for a request in flight across the upgrade) is the
/// request's when its [`labels::REQUEST_LABEL`] names the request and it was created no earlier
/// than the request: a claim of an earlier request of the same name is older than this one.
pub fn temp_claim_is_ours(
    claim: &PersistentVolumeClaim,
    request: &StorageMigrationRequest,
) -> bool {
    let labels = claim.labels();
    if let Some(uid) = labels.get(labels::REQUEST_UID_LABEL) {
        return request.metadata.uid.as_ref() == Some(uid);
    }
    let named = labels.get(labels::REQUEST_LABEL).map(String::as_str)
        == request.metadata.name.as_deref()
        && labels.get(labels::MANAGED_BY_LABEL).map(String::as_str)
            == Some(labels::MANAGED_BY_VALUE);
    let created = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        m.creation_timestamp.as_ref().map(|t| t.0)
    };
    named
        && matches!(
            (created(&claim.metadata), created(&request.metadata)),
            (Some(c), Some(r)) if c >= r
        )
}

/// What a claim says about who made it, for messages: `request-uid <uid>`, `request <name>`, or
/// `no request's labels`.
pub fn claim_origin(claim: &PersistentVolumeClaim) -> String {
    let labels = claim.labels();
    match (
        labels.get(labels::REQUEST_UID_LABEL),
        labels.get(labels::REQUEST_LABEL),
    ) {
        (Some(uid), _) => format!(
            "uid {}, labelled for request uid {uid}",
            claim.uid().unwrap_or_default()
        ),
        (None, Some(name)) => format!(
            "uid {}, labelled for request {name} without this request's uid",
            claim.uid().unwrap_or_default()
        ),
        (None, None) => format!(
            "uid {}, without a request's labels",
            claim.uid().unwrap_or_default()
        ),
    }
}

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
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    /// A request `move` (uid `u-1`) created at `t`, and a claim labelled as `labels` says,
    /// created at `created`.
    fn claim_and_request(
        labels: &[(&str, &str)],
        created: i64,
    ) -> (PersistentVolumeClaim, StorageMigrationRequest) {
        let at = |s: i64| Some(Time(crate::plan::fixtures::t(s)));
        let mut req = crate::plan::fixtures::request(crate::plan::fixtures::spec_class_change("f"));
        req.metadata.name = Some("move".into());
        req.metadata.uid = Some("u-1".into());
        req.metadata.creation_timestamp = at(100);
        let mut claim = PersistentVolumeClaim::default();
        claim.metadata.creation_timestamp = at(created);
        claim.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        (claim, req)
    }

    #[test]
    fn a_temporary_claim_is_the_requests_by_its_uid_label_not_by_its_name() {
        let ours = [
            (labels::MANAGED_BY_LABEL, labels::MANAGED_BY_VALUE),
            (labels::REQUEST_LABEL, "move"),
            (labels::REQUEST_UID_LABEL, "u-1"),
        ];
        let (c, r) = claim_and_request(&ours, 50);
        assert!(temp_claim_is_ours(&c, &r), "the uid decides, not the time");
        // An earlier request of the same name made it: another uid.
        let earlier = [
            (labels::MANAGED_BY_LABEL, labels::MANAGED_BY_VALUE),
            (labels::REQUEST_LABEL, "move"),
            (labels::REQUEST_UID_LABEL, "u-0"),
        ];
        let (c, r) = claim_and_request(&earlier, 150);
        assert!(!temp_claim_is_ours(&c, &r));
        assert!(claim_origin(&c).contains("request uid u-0"));
        // Someone else's claim of that name, without our labels.
        let (c, r) = claim_and_request(&[], 150);
        assert!(!temp_claim_is_ours(&c, &r));
        // Made before the uid label existed: ours only if made since the request was.
        let legacy = [
            (labels::MANAGED_BY_LABEL, labels::MANAGED_BY_VALUE),
            (labels::REQUEST_LABEL, "move"),
        ];
        let (c, r) = claim_and_request(&legacy, 150);
        assert!(temp_claim_is_ours(&c, &r));
        let (c, r) = claim_and_request(&legacy, 50);
        assert!(!temp_claim_is_ours(&c, &r), "older than the request");
    }

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
