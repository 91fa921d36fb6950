//! `kubectl smr orphans`: the PersistentVolumes no claim refers to. Pure: the selection and the
//! table, from the lists the command read.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::labels;

use super::render::duration;

/// One orphaned volume, as the table shows it.
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

/// The volumes `Released` or `Available` that no existing claim refers to: no `claimRef`, or a
/// `claimRef` to a claim that does not exist (or exists with another uid). Volumes named by a
/// request still in progress (`busy`) are left out: they are in the middle of a swap.
pub fn orphans(
    volumes: &[PersistentVolume],
    claims: &[PersistentVolumeClaim],
    busy: &BTreeSet<String>,
    now: Timestamp,
) -> Vec<Orphan> {
    let live: BTreeMap<(String, String), String> = claims
        .iter()
        .map(|c| {
            let key = (c.namespace().unwrap_or_default(), c.name_any());
            (key, c.uid().unwrap_or_default())
        })
        .collect();
    let mut out: Vec<Orphan> = volumes
        .iter()
        .filter(|pv| !busy.contains(&pv.name_any()))
        .filter(|pv| matches!(phase(pv).as_str(), "Released" | "Available"))
        .filter(|pv| !claimed(pv, &live))
        .map(|pv| orphan(pv, now))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn phase(pv: &PersistentVolume) -> String {
    (pv.status.as_ref().and_then(|s| s.phase.clone())).unwrap_or_default()
}

/// True when the volume's claimRef names a claim that exists (with the same uid, when the
/// claimRef records one).
fn claimed(pv: &PersistentVolume, live: &BTreeMap<(String, String), String>) -> bool {
    let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    let key = (
        r.namespace.clone().unwrap_or_default(),
        r.name.clone().unwrap_or_default(),
    );
    match (live.get(&key), r.uid.as_deref()) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(uid), Some(want)) => uid == want,
    }
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

/// The table: one line per volume, then its delete command.
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

#[cfg(test)]
mod tests {
    use super::*;
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
        let busy = BTreeSet::from(["pv-swapping".to_string()]);
        let now = Timestamp::from_second(1000 + 3600).unwrap();
        let found = orphans(&volumes, &claims, &busy, now);
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
}
