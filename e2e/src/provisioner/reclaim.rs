//! The volume controller: deletes Released volumes whose reclaim policy is `Delete`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;
use tracing::{info, warn};

use crate::provisioner::controller::{Ctx, ensure_mounted, volume_paths};
use crate::provisioner::host::destroy_volume;
use crate::provisioner::objects::is_ours;
use crate::provisioner::{ProvisionerError, is_api_status};

/// What to do with one of our PVs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeDecision {
    Ignore,
    /// Released with reclaim policy Delete: free it.
    Delete,
    /// In use or retained: make sure its mount exists.
    KeepMounted,
}

pub fn decide_volume(pv: &PersistentVolume) -> VolumeDecision {
    if !is_ours(pv) || pv.metadata.deletion_timestamp.is_some() {
        return VolumeDecision::Ignore;
    }
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    let policy = pv
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref());
    match (phase, policy) {
        (Some("Released"), Some("Delete")) => VolumeDecision::Delete,
        (Some("Failed"), _) => VolumeDecision::Ignore,
        _ => VolumeDecision::KeepMounted,
    }
}

pub(super) async fn reconcile_volume(
    pv: Arc<PersistentVolume>,
    ctx: Arc<Ctx>,
) -> Result<Action, ProvisionerError> {
    match decide_volume(&pv) {
        VolumeDecision::Ignore => Ok(Action::await_change()),
        VolumeDecision::KeepMounted => {
            ensure_mounted(&ctx, &pv).await?;
            Ok(Action::await_change())
        }
        VolumeDecision::Delete => {
            let (name, image, dir) = volume_paths(&ctx.state, &pv)?;
            {
                let _guard = ctx.host.lock().await;
                let pv_name = name.clone();
                tokio::task::spawn_blocking(move || {
                    destroy_volume(&image, &dir).map_err(|e| ProvisionerError::Busy {
                        pv: pv_name,
                        reason: e.to_string(),
                    })
                })
                .await??;
            }
            let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => info!(pv = %name, "deleted released volume"),
                Err(e) if is_api_status(&e, |s| s.is_not_found()) => {}
                Err(e) => return Err(e.into()),
            }
            Ok(Action::await_change())
        }
    }
}

pub(super) fn volume_error_policy(
    pv: Arc<PersistentVolume>,
    err: &ProvisionerError,
    _ctx: Arc<Ctx>,
) -> Action {
    warn!(pv = %pv.name_any(), error = %err, "volume reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    use k8s_openapi::api::core::v1::PersistentVolumeStatus;

    use crate::provisioner::test_support::pv_on;

    #[test]
    fn volume_decisions() {
        let mut pv = pv_on("p1", "node-a");
        assert_eq!(decide_volume(&pv), VolumeDecision::KeepMounted);
        pv.status = Some(PersistentVolumeStatus {
            phase: Some("Released".into()),
            ..Default::default()
        });
        assert_eq!(decide_volume(&pv), VolumeDecision::Delete);
        pv.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Retain".into());
        assert_eq!(decide_volume(&pv), VolumeDecision::KeepMounted);
        pv.metadata.annotations = None;
        assert_eq!(decide_volume(&pv), VolumeDecision::Ignore);
    }
}
