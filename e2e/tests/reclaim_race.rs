//! Another actor resets a volume's reclaim policy to `Delete` in the middle of the claim swap
//! (a GitOps tool that owns statically declared PVs, a storage vendor's reconciler), against the
//! cluster `KUBECONFIG` points at, with a client writing to etcd throughout.
//!
//! The operator is held just before it deletes the first member's old claim (it exits at the
//! failpoint `step-DeletingOldClaim`). Then a "fighter" task sets that claim's volume to `Delete`,
//! and again each time the operator puts it back on `Retain`, twice in all. The operator is started
//! again: it must never delete a claim whose volume is not `Retain` (a watch on claims and on the
//! volume checks each claim deletion against the policy the volume had then), it must say which
//! volume keeps being changed (condition `ReclaimPolicy`, reason `ChangedAgain`); the old volume
//! outlives the swap and goes (its original policy back) only after the request's final check;
//! the request succeeds, and no acknowledged write is lost.
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --all-features --test reclaim_race` (the
//! operator binary needs the `failpoints` feature).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use e2e::testing::faults::EtcdUnderLoad;
use e2e::testing::operator::{Operator, summary};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::json;
use storage_migrator::api::{MemberStep, Phase, StorageMigrationRequest};

const MIGRATION: Duration = Duration::from_secs(900);
const REQUEST: &str = "race";
const RESETS: usize = 2;

/// The reclaim policy of `pv` as the watch last saw it, and every deletion of a claim bound to
/// it with the policy seen at that moment.
#[derive(Default)]
struct Seen {
    policy: Option<String>,
    resets: usize,
    claim_deletions: Vec<(String, Option<String>)>,
    /// When the volume was deleted: whether the request's final check had passed by then.
    volume_deleted: Option<bool>,
}

type Shared = Arc<Mutex<Seen>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Seen> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sets `pv` to `Delete` whenever it is `Retain`, `RESETS` times in all, recording the policy
/// it sees, and whether the request's final check had passed when the volume was deleted.
fn fight(
    pvs: Api<PersistentVolume>,
    requests: Api<StorageMigrationRequest>,
    pv: String,
    seen: Shared,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let config = watcher::Config::default().fields(&format!("metadata.name={pv}"));
        let mut stream = watcher::watcher(pvs.clone(), config).boxed();
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Delete(_)) = event {
                let req = requests.get(REQUEST).await.ok();
                let checked = req
                    .and_then(|r| r.status)
                    .is_some_and(|s| s.final_hash.is_some() || s.phase == Phase::Successful);
                lock(&seen).volume_deleted = Some(checked);
                continue;
            }
            let (Ok(watcher::Event::Apply(v)) | Ok(watcher::Event::InitApply(v))) = event else {
                continue;
            };
            let policy = v
                .spec
                .as_ref()
                .and_then(|s| s.persistent_volume_reclaim_policy.clone());
            let retain = policy.as_deref() == Some("Retain");
            let resets = {
                let mut s = lock(&seen);
                s.policy = policy;
                s.resets
            };
            if retain && resets < RESETS {
                let patch = json!({"spec": {"persistentVolumeReclaimPolicy": "Delete"}});
                let done = pvs
                    .patch(&pv, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                println!(
                    "NOTE reclaim race: {pv} set to Delete: {:?}",
                    done.map(|_| ())
                );
                lock(&seen).resets += 1;
            }
        }
    })
}

/// Records each deletion of `claim` with the volume's policy as last seen.
fn watch_claim(
    claims: Api<PersistentVolumeClaim>,
    claim: String,
    seen: Shared,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let config = watcher::Config::default().fields(&format!("metadata.name={claim}"));
        let mut stream = watcher::watcher(claims, config).boxed();
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Delete(c)) = event {
                let mut s = lock(&seen);
                let policy = s.policy.clone();
                s.claim_deletions
                    .push((c.uid().unwrap_or_default(), policy));
            }
        }
    })
}

/// The first claim of the member at `DeletingOldClaim`: (claim, old volume).
fn held_member(req: &StorageMigrationRequest) -> Option<(String, String)> {
    let status = req.status.as_ref()?;
    let held = status
        .members
        .iter()
        .find(|m| m.step == MemberStep::DeletingOldClaim)?;
    let claims = storage_migrator::plan::claims::request_claims(status);
    let c = claims.iter().find(|c| c.pod() == held.pod && c.slot == 0)?;
    Some((c.claim().to_string(), c.old_volume().to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_policy_reset_mid_swap_never_turns_a_claim_delete_into_a_volume_delete() {
    let run = EtcdUnderLoad::start("smr-reclaim-race")
        .await
        .expect("setup");
    let ns = &run.ns;
    let mut held = Operator::start(ns, 0, Some("step-DeletingOldClaim=return"))
        .await
        .expect("operator");
    run.create_request(REQUEST).await.expect("request");
    let code = held.wait_exit(MIGRATION).await.expect("held operator");
    assert_eq!(
        code,
        86,
        "the operator did not stop at the failpoint: {}",
        held.log().display()
    );
    let req: StorageMigrationRequest = ns.api().get(REQUEST).await.expect("request");
    let (claim, volume) = held_member(&req).unwrap_or_else(|| panic!("{}", summary(&req)));

    let seen = Shared::default();
    let pvs: Api<PersistentVolume> = Api::all(run.cluster.client.clone());
    let fighter = fight(pvs.clone(), ns.api(), volume.clone(), seen.clone());
    let deletions = watch_claim(ns.api(), claim.clone(), seen.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    while lock(&seen).resets == 0 {
        assert!(
            Instant::now() < deadline,
            "the fighter never reset {volume}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let _op = Operator::start(ns, 1, None).await.expect("operator again");
    let mut named = None;
    let deadline = Instant::now() + MIGRATION;
    let done = loop {
        let req: StorageMigrationRequest = ns.api().get(REQUEST).await.expect("request");
        let status = req.status.clone().unwrap_or_default();
        let changed = status.conditions.iter().find(|c| {
            c.type_ == "ReclaimPolicy" && c.reason == "ChangedAgain" && c.message.contains(&volume)
        });
        if let Some(c) = changed {
            named.get_or_insert_with(|| c.message.clone());
        }
        if status.phase.is_final() {
            break req;
        }
        assert!(Instant::now() < deadline, "{}", summary(&req));
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    fighter.abort();
    deletions.abort();
    println!("NOTE reclaim race: {}; condition {named:?}", summary(&done));
    assert_eq!(
        done.status.as_ref().map(|s| s.phase),
        Some(Phase::Successful),
        "{}",
        summary(&done)
    );
    let (resets, claim_deletions, volume_deleted) = {
        let s = lock(&seen);
        (s.resets, s.claim_deletions.clone(), s.volume_deleted)
    };
    assert_eq!(
        resets, RESETS,
        "the fighter reset the volume {resets} times"
    );
    assert!(
        named.is_some(),
        "no condition named {volume} as changed again"
    );
    assert!(!claim_deletions.is_empty(), "{claim} was never swapped");
    for (uid, policy) in &claim_deletions {
        assert_eq!(
            policy.as_deref(),
            Some("Retain"),
            "{claim} ({uid}) deleted while {volume} was {policy:?}"
        );
    }
    // The old volume outlived the swap; it may go (its original policy back) only once the
    // whole request was verified.
    assert_ne!(
        volume_deleted,
        Some(false),
        "the old volume {volume} was deleted before the request's final check"
    );
    run.finish().await;
}
