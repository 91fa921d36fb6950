//! `kubectl smr orphans`: the PersistentVolumes no claim refers to. Pure: the selection and the
//! tables, from the lists the command read.
//!
//! A volume a request names (old or new, of any claim of any member: `plan::claims`) is never
//! an orphan, with one exception: an old volume a `Successful` request released on purpose
//! (its member `Done`, the data on its new volume). A `Failed` request's volumes are listed
//! under their own heading with the steps to restore from them, and `--delete` never deletes
//! them; the volumes of requests in progress, denied, or named otherwise by a successful one
//! are left out, and said so.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::api::{MemberStep, Phase, StorageMigrationRequest};
use crate::labels;
use crate::plan::claims::{VolumeRole, request_volumes};
use crate::plan::runbook::RUNBOOK;

use super::render::duration;

/// The runbook section a failed request's volumes point to.
const FAILED_SECTION: &str = "failed-rolling-back-then-failed";

/// One volume, as the tables show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Orphan {
    pub name: String,
    pub uid: String,
    pub phase: String,
    pub age_seconds: i64,
    pub size: String,
    pub class: String,
    pub reclaim_policy: String,
    /// The request that left it (our labels), if any.
    pub request: Option<String>,
    /// The claim it still names, that is gone.
    pub former_claim: Option<String>,
}

impl Orphan {
    /// The exact command that deletes it.
    pub fn delete_command(&self) -> String {
        format!("kubectl delete persistentvolume {}", self.name)
    }
}

/// A volume a request names, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct Naming {
    /// `namespace/name` of the request.
    pub request: String,
    pub phase: Phase,
    pub role: VolumeRole,
    /// The claim (by its own name) the volume is a volume of.
    pub claim: String,
    /// The member.
    pub pod: String,
    /// Where the claim's data is now, when the request recorded it (a `Failed` request).
    pub data_volume: Option<String>,
    /// An old volume a `Successful` request released on purpose: its member is `Done`.
    pub released: bool,
}

impl Naming {
    /// `old volume of claim data-etcd-0 (member etcd-0)`, and whether the claim's data is on it.
    pub fn describe(&self, volume: &str) -> String {
        let here = match self.data_volume.as_deref() {
            Some(v) if v == volume => ": the claim's data is on it now",
            Some(_) if self.role == VolumeRole::Old => ": the data as before the swap",
            Some(_) => ": a copy; the claim's data is on another volume",
            None => "",
        };
        format!(
            "{} volume of claim {} (member {}){here}",
            self.role.as_str(),
            self.claim,
            self.pod
        )
    }
}

/// Every volume every request names, by volume name.
pub fn namings(requests: &[StorageMigrationRequest]) -> BTreeMap<String, Vec<Naming>> {
    let mut out: BTreeMap<String, Vec<Naming>> = BTreeMap::new();
    for r in requests {
        let Some(status) = r.status.as_ref() else {
            continue;
        };
        let request = format!("{}/{}", r.namespace().unwrap_or_default(), r.name_any());
        for (volume, role, c) in request_volumes(status) {
            let location = c.status.first_claim.data_location.as_ref();
            out.entry(volume).or_default().push(Naming {
                request: request.clone(),
                phase: status.phase,
                role,
                claim: c.claim().to_string(),
                pod: c.pod().to_string(),
                data_volume: location.map(|l| l.volume.clone()),
                released: status.phase == Phase::Successful
                    && role == VolumeRole::Old
                    && c.status.step == MemberStep::Done,
            });
        }
    }
    out
}

/// What `orphans` makes of one volume.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Released or Available, no claim refers to it, no request keeps it: an orphan.
    Orphan,
    /// A `Failed` request names it: kept, listed under that request.
    KeptByFailed(Naming),
    /// Another request names it (in progress, denied, or a successful one's volume it did not
    /// release): left out.
    Named(Naming),
    /// Not Released or Available (`Bound`, `Pending`, ...): its phase.
    NotReleased(String),
    /// A claim (`namespace/name`) refers to it.
    Claimed(String),
}

/// Why `--delete` refuses a volume the scope names (then nothing is deleted).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error("{0}: no such PersistentVolume in scope")]
    Unknown(String),
    #[error("{volume}: kept by failed request {} ({})", naming.request, naming.describe(volume))]
    KeptByFailed { volume: String, naming: Naming },
    #[error("{volume}: named by request {} ({:?}): {}", naming.request, naming.phase, naming.describe(volume))]
    Named { volume: String, naming: Naming },
    #[error("{volume}: not an orphan: it is {phase}")]
    NotReleased { volume: String, phase: String },
    #[error("{volume}: not an orphan: claim {claim} refers to it")]
    Claimed { volume: String, claim: String },
}

impl Refusal {
    /// Why `verdict` keeps `volume` from being deleted; `None` for an orphan.
    fn of(volume: &str, verdict: &Verdict) -> Option<Refusal> {
        let volume = volume.to_string();
        Some(match verdict.clone() {
            Verdict::Orphan => return None,
            Verdict::KeptByFailed(naming) => Refusal::KeptByFailed { volume, naming },
            Verdict::Named(naming) => Refusal::Named { volume, naming },
            Verdict::NotReleased(phase) => Refusal::NotReleased { volume, phase },
            Verdict::Claimed(claim) => Refusal::Claimed { volume, claim },
        })
    }
}

/// Which volumes `orphans` looks at: all, or those a label selector (applied by the API server
/// when listing), a StorageClass or names pick.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scope {
    pub selector: Option<String>,
    pub storage_class: Option<String>,
    pub names: Vec<String>,
}

impl Scope {
    fn admits(&self, pv: &PersistentVolume) -> bool {
        let class = pv
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref());
        let name = pv.name_any();
        (self.storage_class.is_none() || class == self.storage_class.as_deref())
            && (self.names.is_empty() || self.names.contains(&name))
    }
}

/// Every volume in scope, with its verdict, by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Survey {
    pub volumes: Vec<(Orphan, Verdict)>,
    /// Names the scope gives that are not volumes.
    pub unknown: Vec<String>,
}

impl Survey {
    pub fn orphans(&self) -> Vec<Orphan> {
        (self.volumes.iter())
            .filter(|(_, v)| *v == Verdict::Orphan)
            .map(|(o, _)| o.clone())
            .collect()
    }

    /// The volumes kept by each failed request, by request.
    pub fn kept(&self) -> BTreeMap<&str, Vec<(&Orphan, &Naming)>> {
        let mut out: BTreeMap<&str, Vec<(&Orphan, &Naming)>> = BTreeMap::new();
        for (o, v) in &self.volumes {
            if let Verdict::KeptByFailed(n) = v {
                out.entry(n.request.as_str()).or_default().push((o, n));
            }
        }
        out
    }
}

/// Looks at every volume in `scope`: `claims` are every claim of the cluster, `named` what
/// [`namings`] made of every request.
pub fn survey(
    volumes: &[PersistentVolume],
    claims: &[PersistentVolumeClaim],
    named: &BTreeMap<String, Vec<Naming>>,
    scope: &Scope,
    now: Timestamp,
) -> Survey {
    let live: BTreeMap<(String, String), String> = claims
        .iter()
        .map(|c| {
            let key = (c.namespace().unwrap_or_default(), c.name_any());
            (key, c.uid().unwrap_or_default())
        })
        .collect();
    let mut out: Vec<(Orphan, Verdict)> = volumes
        .iter()
        .filter(|pv| scope.admits(pv))
        .map(|pv| {
            let namings = named.get(&pv.name_any()).map_or(&[][..], Vec::as_slice);
            (orphan(pv, now), verdict(pv, &live, namings))
        })
        .collect();
    out.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    let listed: BTreeSet<&str> = volumes
        .iter()
        .filter_map(|v| v.metadata.name.as_deref())
        .collect();
    let unknown = (scope.names.iter())
        .filter(|n| !listed.contains(n.as_str()))
        .cloned()
        .collect();
    Survey {
        volumes: out,
        unknown,
    }
}

/// One volume's verdict. A claim's reference comes first (whoever names it, it is in use); of
/// the requests that name it, one in progress leaves it out, then a failed one keeps it; it is
/// an orphan only when every request that names it released it on purpose.
fn verdict(
    pv: &PersistentVolume,
    live: &BTreeMap<(String, String), String>,
    namings: &[Naming],
) -> Verdict {
    let phase = phase(pv);
    if !matches!(phase.as_str(), "Released" | "Available") {
        return Verdict::NotReleased(phase);
    }
    if let Some(claim) = claimed(pv, live) {
        return Verdict::Claimed(claim);
    }
    if let Some(n) = namings.iter().find(|n| !n.phase.is_final()) {
        return Verdict::Named(n.clone());
    }
    if let Some(n) = namings.iter().find(|n| n.phase == Phase::Failed) {
        return Verdict::KeptByFailed(n.clone());
    }
    match namings.iter().find(|n| !n.released) {
        Some(n) => Verdict::Named(n.clone()),
        None => Verdict::Orphan,
    }
}

fn phase(pv: &PersistentVolume) -> String {
    (pv.status.as_ref().and_then(|s| s.phase.clone())).unwrap_or_default()
}

/// `namespace/name` of the claim the volume's claimRef names, when that claim exists (with the
/// same uid, when the claimRef records one).
fn claimed(pv: &PersistentVolume, live: &BTreeMap<(String, String), String>) -> Option<String> {
    let r = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref())?;
    let key = (
        r.namespace.clone().unwrap_or_default(),
        r.name.clone().unwrap_or_default(),
    );
    let exists = match (live.get(&key), r.uid.as_deref()) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(uid), Some(want)) => uid == want,
    };
    exists.then(|| format!("{}/{}", key.0, key.1))
}

fn orphan(pv: &PersistentVolume, now: Timestamp) -> Orphan {
    let spec = pv.spec.clone().unwrap_or_default();
    let created = pv.creation_timestamp().map(|t| t.0);
    let l = pv.labels();
    let request = (l.get(labels::MIGRATED_BY_LABEL))
        .or(l.get(labels::REQUEST_LABEL))
        .cloned();
    let former_claim = spec.claim_ref.as_ref().map(|r| {
        format!(
            "{}/{}",
            r.namespace.as_deref().unwrap_or(""),
            r.name.as_deref().unwrap_or("")
        )
    });
    Orphan {
        name: pv.name_any(),
        uid: pv.uid().unwrap_or_default(),
        phase: phase(pv),
        age_seconds: created.map_or(0, |c| now.as_second() - c.as_second()),
        size: (spec.capacity.as_ref())
            .and_then(|c| c.get("storage"))
            .map_or_else(|| "?".into(), |q| q.0.clone()),
        class: spec.storage_class_name.unwrap_or_else(|| "-".into()),
        reclaim_policy: spec
            .persistent_volume_reclaim_policy
            .unwrap_or_else(|| "-".into()),
        request,
        former_claim,
    }
}

/// What `--delete` deletes: the orphans in scope. When the scope names volumes, each must be an
/// orphan: otherwise nothing is deleted, and the error says why each one is not.
pub fn to_delete(survey: &Survey, scope: &Scope) -> Result<Vec<Orphan>, Vec<Refusal>> {
    let unknown = (survey.unknown.iter()).map(|n| Refusal::Unknown(n.clone()));
    let named = (survey.volumes.iter())
        .filter(|(o, _)| scope.names.contains(&o.name))
        .filter_map(|(o, v)| Refusal::of(&o.name, v));
    let refused: Vec<Refusal> = unknown.chain(named).collect();
    if refused.is_empty() {
        Ok(survey.orphans())
    } else {
        Err(refused)
    }
}

/// The tables: the orphans with their delete commands ([`table`]), each failed request's
/// volumes with the restore steps, and the volumes left out because a request names them.
pub fn report(survey: &Survey) -> Vec<String> {
    let mut lines = table(&survey.orphans());
    for (request, kept) in survey.kept() {
        lines.push(String::new());
        lines.extend(kept_lines(request, &kept));
    }
    let left_out: Vec<String> = (survey.volumes.iter())
        .filter_map(|(o, v)| match v {
            Verdict::Named(n) => Some(format!(
                "  {}: {} of request {} ({:?})",
                o.name,
                n.describe(&o.name),
                n.request,
                n.phase
            )),
            _ => None,
        })
        .collect();
    if !left_out.is_empty() {
        lines.push(String::new());
        lines.push("Not orphans: a request names them (never listed for deletion):".into());
        lines.extend(left_out);
    }
    lines
}

/// The orphans: one line per volume, then its delete command.
pub fn table(orphans: &[Orphan]) -> Vec<String> {
    if orphans.is_empty() {
        return vec!["No orphaned PersistentVolumes.".into()];
    }
    let mut lines = vec![format!(
        "{:<40} {:<9} {:<8} {:<8} {:<12} {:<8} {:<20} {}",
        "NAME", "STATUS", "AGE", "SIZE", "CLASS", "RECLAIM", "REQUEST", "FORMER CLAIM"
    )];
    for o in orphans {
        lines.push(format!(
            "{:<40} {:<9} {:<8} {:<8} {:<12} {:<8} {:<20} {}",
            o.name,
            o.phase,
            duration(o.age_seconds),
            o.size,
            o.class,
            o.reclaim_policy,
            o.request.as_deref().unwrap_or("-"),
            o.former_claim.as_deref().unwrap_or("-"),
        ));
    }
    lines.push(String::new());
    lines.push("To delete them:".into());
    lines.extend(orphans.iter().map(|o| format!("  {}", o.delete_command())));
    lines
}

/// A failed request's volumes and how to restore from them.
fn kept_lines(request: &str, kept: &[(&Orphan, &Naming)]) -> Vec<String> {
    let (ns, name) = request.split_once('/').unwrap_or(("NS", request));
    let mut lines = vec![
        format!(
            "Kept by failed request {request} (not orphans: `orphans --delete` never deletes them):"
        ),
        format!(
            "  {:<40} {:<9} {:<8} {:<8} {:<12} {:<8} {}",
            "NAME", "STATUS", "AGE", "SIZE", "CLASS", "RECLAIM", "HOLDS"
        ),
    ];
    for (o, n) in kept {
        lines.push(format!(
            "  {:<40} {:<9} {:<8} {:<8} {:<12} {:<8} {}",
            o.name,
            o.phase,
            duration(o.age_seconds),
            o.size,
            o.class,
            o.reclaim_policy,
            n.describe(&o.name)
        ));
    }
    lines.extend([
        "  To restore a member's data from one of them (PV):".to_string(),
        format!(
            "    kubectl -n {ns} get smr {name} -o jsonpath='{{.status.message}}{{\"\\n\"}}'   # where each member's data is now"
        ),
        "    # first the volume the member's claim is bound to now on Retain, so that deleting the claim keeps it:".to_string(),
        "    kubectl patch persistentvolume CURRENT -p '{\"spec\":{\"persistentVolumeReclaimPolicy\":\"Retain\"}}'".to_string(),
        "    # stop the member's pod, delete its claim; then free PV:".to_string(),
        "    kubectl patch persistentvolume PV --type json -p '[{\"op\":\"remove\",\"path\":\"/spec/claimRef\"}]'".to_string(),
        "    # create the claim again under its name with spec.volumeName: PV (same class, size and access modes), start the pod".to_string(),
        format!("  Runbook: {RUNBOOK}#{FAILED_SECTION}. Once the workload is checked and a volume is not needed:"),
        "    kubectl delete persistentvolume PV".to_string(),
    ]);
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        ClaimStatus, DataLocation, DataState, MemberStatus, Plan, PlannedClaim, PlannedMember,
        StorageMigrationRequestStatus,
    };
    use k8s_openapi::api::core::v1::{
        ObjectReference, PersistentVolumeSpec, PersistentVolumeStatus,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn pv(name: &str, phase: &str, claim: Option<(&str, &str)>) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                creation_timestamp: Some(Time(Timestamp::from_second(1000).unwrap())),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))])),
                storage_class_name: Some("standard".into()),
                persistent_volume_reclaim_policy: Some("Retain".into()),
                claim_ref: claim.map(|(ns, n)| ObjectReference {
                    namespace: Some(ns.into()),
                    name: Some(n.into()),
                    uid: Some(format!("uid-{n}")),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: Some(PersistentVolumeStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    fn claim(ns: &str, name: &str, uid: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// A request in `db` whose one member `etcd-0` has claim `data-etcd-0` (old volume `old`,
    /// new volume `new`) and a further claim `wal-etcd-0` (old `old-wal`, new `new-wal`), at
    /// `step`, the request in `phase`.
    fn request(
        name: &str,
        phase: Phase,
        step: MemberStep,
        vols: [&str; 4],
    ) -> StorageMigrationRequest {
        let [old, new, old_wal, new_wal] = vols;
        let mut r =
            StorageMigrationRequest::new(name, crate::plan::fixtures::spec_class_change("fast"));
        r.metadata.namespace = Some("db".into());
        let location = |volume: &str| DataLocation {
            claim: "data-etcd-0".into(),
            volume: volume.into(),
            storage_class: "fast".into(),
            state: DataState::Migrated,
        };
        let mut ms = MemberStatus {
            pod: "etcd-0".into(),
            step,
            ..Default::default()
        };
        ms.first_claim.new_volume = Some(new.into());
        ms.first_claim.data_location = (phase == Phase::Failed).then(|| location(new));
        ms.further_claims = vec![ClaimStatus {
            claim: "wal-etcd-0".into(),
            new_volume: Some(new_wal.into()),
            ..Default::default()
        }];
        r.status = Some(StorageMigrationRequestStatus {
            phase,
            plan: Some(Plan {
                members: vec![PlannedMember {
                    pod: "etcd-0".into(),
                    claim: "data-etcd-0".into(),
                    old_volume: old.into(),
                    temp_claim: format!("{name}-data-etcd-0"),
                    further_claims: vec![PlannedClaim {
                        template: "wal".into(),
                        claim: "wal-etcd-0".into(),
                        old_volume: old_wal.into(),
                        temp_claim: format!("{name}-wal-etcd-0"),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            members: vec![ms],
            ..Default::default()
        });
        r
    }

    #[test]
    fn only_volumes_no_claim_refers_to() {
        let mut migrated = pv("pv-old", "Released", Some(("db", "data-etcd-0")));
        migrated
            .labels_mut()
            .insert(labels::MIGRATED_BY_LABEL.into(), "move".into());
        let volumes = vec![
            pv("pv-bound", "Bound", Some(("db", "live"))),
            pv("pv-free", "Available", None),
            migrated,
            pv("pv-replaced", "Released", Some(("db", "again"))),
            pv("pv-ours-now", "Available", Some(("db", "live"))),
            pv("pv-swapping", "Available", Some(("db", "gone"))),
        ];
        let claims = vec![
            claim("db", "live", "uid-live"),
            claim("db", "again", "other"),
        ];
        // pv-swapping is in the middle of a swap: a request in progress names it.
        let busy = request(
            "busy",
            Phase::Progressing,
            MemberStep::ReleasingNewVolume,
            ["pv-x", "pv-swapping", "pv-y", "pv-z"],
        );
        let now = Timestamp::from_second(1000 + 3600).unwrap();
        let named = namings(&[busy]);
        let found = survey(&volumes, &claims, &named, &Scope::default(), now).orphans();
        let names: Vec<&str> = found.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, vec!["pv-free", "pv-old", "pv-replaced"]);
        let old = &found[1];
        assert_eq!(old.request.as_deref(), Some("move"));
        assert_eq!(old.former_claim.as_deref(), Some("db/data-etcd-0"));
        assert_eq!(old.age_seconds, 3600);
        assert_eq!(
            old.delete_command(),
            "kubectl delete persistentvolume pv-old"
        );
        let lines = table(&found);
        assert!(lines[2].starts_with("pv-old"), "{lines:#?}");
        assert!(lines[2].contains("Released  1h00m00s 1Gi      standard     Retain   move"));
        assert_eq!(
            lines.last().unwrap(),
            "  kubectl delete persistentvolume pv-replaced"
        );
        assert_eq!(table(&[]), vec!["No orphaned PersistentVolumes."]);
    }

    fn released(names: &[&str]) -> Vec<PersistentVolume> {
        names
            .iter()
            .map(|n| pv(n, "Released", Some(("db", "gone"))))
            .collect()
    }

    fn names_of(orphans: &[Orphan]) -> Vec<&str> {
        orphans.iter().map(|o| o.name.as_str()).collect()
    }

    /// A request in progress names every volume of every claim, further claims' too: none is an
    /// orphan, at any step.
    #[test]
    fn no_volume_of_a_request_in_progress_first_or_further_claim() {
        let vols = ["old", "new", "old-wal", "new-wal"];
        let volumes = released(&vols);
        for step in [
            MemberStep::DeletingOldClaim,
            MemberStep::RecreatingClaim,
            MemberStep::Done,
        ] {
            let named = namings(&[request("r", Phase::Progressing, step, vols)]);
            let s = survey(
                &volumes,
                &[],
                &named,
                &Scope::default(),
                Timestamp::UNIX_EPOCH,
            );
            assert_eq!(s.orphans(), [], "{step:?}");
            assert!(
                s.volumes
                    .iter()
                    .all(|(_, v)| matches!(v, Verdict::Named(_)))
            );
        }
    }

    /// A successful request's old volumes, released on purpose, are orphans; its new ones (a
    /// claim deleted since) are not, nor an old one of a member it did not move.
    #[test]
    fn a_successful_requests_released_old_volumes_only() {
        let vols = ["old", "new", "old-wal", "new-wal"];
        let volumes = released(&vols);
        let done = namings(&[request("r", Phase::Successful, MemberStep::Done, vols)]);
        let s = survey(
            &volumes,
            &[],
            &done,
            &Scope::default(),
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(names_of(&s.orphans()), ["old", "old-wal"]);
        let there = namings(&[request(
            "r",
            Phase::Successful,
            MemberStep::AlreadyThere,
            vols,
        )]);
        let s = survey(
            &volumes,
            &[],
            &there,
            &Scope::default(),
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(s.orphans(), []);
        // Named by a successful request and one in progress: left out.
        let both = namings(&[
            request("r", Phase::Successful, MemberStep::Done, vols),
            request(
                "s",
                Phase::Progressing,
                MemberStep::Copying,
                ["old", "a", "b", "c"],
            ),
        ]);
        let s = survey(
            &volumes,
            &[],
            &both,
            &Scope::default(),
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(names_of(&s.orphans()), ["old-wal"]);
    }

    /// A failed request's volumes are kept under its own heading with the restore steps, and
    /// `--delete` never deletes them, not even named.
    #[test]
    fn a_failed_requests_volumes_are_kept_never_deleted() {
        let vols = ["old", "new", "old-wal", "new-wal"];
        let mut volumes = released(&vols);
        volumes.push(pv("stray", "Available", None));
        let named = namings(&[request("gave-up", Phase::Failed, MemberStep::Done, vols)]);
        let s = survey(
            &volumes,
            &[],
            &named,
            &Scope::default(),
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(names_of(&s.orphans()), ["stray"]);
        let kept = s.kept();
        let in_failed: Vec<&str> = kept["db/gave-up"]
            .iter()
            .map(|(o, _)| o.name.as_str())
            .collect();
        assert_eq!(in_failed, ["new", "new-wal", "old", "old-wal"]);
        let lines = report(&s);
        let at = lines
            .iter()
            .position(|l| l.starts_with("Kept by failed request db/gave-up"))
            .expect("heading");
        let section = lines[at..].join("\n");
        assert!(
            section.contains(
                "old volume of claim data-etcd-0 (member etcd-0): the data as before the swap"
            ),
            "{section}"
        );
        assert!(
            section.contains(
                "new volume of claim data-etcd-0 (member etcd-0): the claim's data is on it now"
            ),
            "{section}"
        );
        assert!(
            section.contains("kubectl -n db get smr gave-up"),
            "{section}"
        );
        assert!(section.contains("/spec/claimRef"), "{section}");
        // Deleting the member's claim must not take the volume it is bound to now.
        let keep = section.find("persistentVolumeReclaimPolicy\":\"Retain");
        let delete_claim = section.find("delete its claim");
        assert!(keep.is_some() && keep < delete_claim, "{section}");
        assert!(
            section.contains("docs/runbook.md#failed-rolling-back-then-failed"),
            "{section}"
        );
        // The delete commands name the orphans only (the restore steps' is a placeholder).
        let deleted: Vec<&str> = lines
            .iter()
            .filter_map(|l| l.trim().strip_prefix("kubectl delete persistentvolume "))
            .collect();
        assert_eq!(deleted, ["stray", "PV"]);
        assert_eq!(
            names_of(&to_delete(&s, &Scope::default()).unwrap()),
            ["stray"]
        );
        let scope = Scope {
            names: vec!["old".into(), "stray".into()],
            ..Default::default()
        };
        let s = survey(&volumes, &[], &named, &scope, Timestamp::UNIX_EPOCH);
        let refused = to_delete(&s, &scope).unwrap_err();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(
            refused[0]
                .to_string()
                .starts_with("old: kept by failed request db/gave-up"),
            "{refused:?}"
        );
    }

    /// `--delete` scoped by StorageClass or names (the label selector is the API server's):
    /// only orphans in scope; a named volume that is not an orphan, or not there, refuses all.
    #[test]
    fn the_scope_picks_what_is_deleted() {
        let mut volumes = released(&["a", "b", "c"]);
        if let Some(spec) = volumes[2].spec.as_mut() {
            spec.storage_class_name = Some("fast".into());
        }
        volumes.push(pv("bound", "Bound", Some(("db", "live"))));
        let none = BTreeMap::new();
        let all = |scope: &Scope| {
            let s = survey(&volumes, &[], &none, scope, Timestamp::UNIX_EPOCH);
            to_delete(&s, scope).map(|o| o.iter().map(|o| o.name.clone()).collect::<Vec<_>>())
        };
        assert_eq!(all(&Scope::default()).unwrap(), ["a", "b", "c"]);
        let class = Scope {
            storage_class: Some("fast".into()),
            ..Default::default()
        };
        assert_eq!(all(&class).unwrap(), ["c"]);
        let named = |n: &[&str]| Scope {
            names: n.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        assert_eq!(all(&named(&["b"])).unwrap(), ["b"]);
        let refused: Vec<String> = all(&named(&["b", "bound", "nope"]))
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            refused,
            [
                "nope: no such PersistentVolume in scope",
                "bound: not an orphan: it is Bound"
            ]
        );
    }
}
