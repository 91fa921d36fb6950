//! The provisioner's controllers: StorageClasses at start, volumes remounted after a restart,
//! then the claim and the volume controllers.

use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::controller::Controller;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;
use tokio::sync::Mutex;
use tracing::{debug, info, warn};

use crate::provisioner::host::{image_path, mount_dir, mount_image};
use crate::provisioner::objects::{csi_driver, is_ours, storage_classes};
use crate::provisioner::provision::{claim_error_policy, reconcile_claim};
use crate::provisioner::reclaim::{reconcile_volume, volume_error_policy};
use crate::provisioner::{LABEL_NODE, ProvisionerError, is_api_status};
use crate::state::{CSI_DRIVER, ClusterState, NODE_NAMES, PROVISIONER};

pub(super) struct Ctx {
    pub(super) client: kube::Client,
    pub(super) state: ClusterState,
    pub(super) recorder: Recorder,
    /// Serialises host changes and node choice (two claims must not both see the same counts).
    pub(super) host: Mutex<()>,
}

/// Creates the StorageClasses `standard` (Immediate) and `fast` (WaitForFirstConsumer) and the
/// driver's CSIDriver object; existing ones are left as they are.
pub async fn ensure_storage_classes(client: &kube::Client) -> Result<(), ProvisionerError> {
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    match drivers.create(&PostParams::default(), &csi_driver()).await {
        Ok(_) => info!(driver = CSI_DRIVER, "created CSIDriver"),
        Err(e) if is_api_status(&e, |s| s.is_already_exists()) => {}
        Err(e) => return Err(e.into()),
    }
    let api: Api<StorageClass> = Api::all(client.clone());
    for class in storage_classes() {
        let name = class.name_any();
        match api.create(&PostParams::default(), &class).await {
            Ok(_) => info!(class = %name, "created StorageClass"),
            Err(e) if is_api_status(&e, |s| s.is_already_exists()) => {
                debug!(class = %name, "StorageClass exists");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Provisions and deletes volumes until the future is dropped. First re-mounts the images of
/// existing PVs of ours whose mounts are missing (an agent restart keeps its volumes).
pub async fn run(client: kube::Client, state: ClusterState) -> Result<(), ProvisionerError> {
    let reporter = Reporter {
        controller: PROVISIONER.to_string(),
        instance: Some(format!("local-e2e-ext4-{}", state.id)),
    };
    let ctx = Arc::new(Ctx {
        recorder: Recorder::new(client.clone(), reporter),
        client: client.clone(),
        state,
        host: Mutex::new(()),
    });
    remount_existing(&ctx).await?;

    let claims = Controller::new(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    )
    .run(reconcile_claim, claim_error_policy, ctx.clone())
    .for_each(|res| async move {
        match res {
            Ok((obj, _)) => debug!(claim = %obj, "claim reconciled"),
            Err(e) => debug!(error = %e, "claim reconcile failed"),
        }
    });
    let volumes = Controller::new(
        Api::<PersistentVolume>::all(client),
        watcher::Config::default().labels(LABEL_NODE),
    )
    .run(reconcile_volume, volume_error_policy, ctx)
    .for_each(|res| async move {
        match res {
            Ok((obj, _)) => debug!(pv = %obj, "volume reconciled"),
            Err(e) => debug!(error = %e, "volume reconcile failed"),
        }
    });
    info!("volume provisioner {PROVISIONER} running");
    futures::future::join(claims, volumes).await;
    Ok(())
}

/// Mounts the image of every PV of ours whose mount is missing (skips PVs being deleted).
async fn remount_existing(ctx: &Ctx) -> Result<(), ProvisionerError> {
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let pvs = api.list(&ListParams::default().labels(LABEL_NODE)).await?;
    for pv in pvs.items.iter().filter(|pv| is_ours(pv)) {
        if let Err(e) = ensure_mounted(ctx, pv).await {
            warn!(pv = %pv.name_any(), error = %e, "cannot re-mount volume");
        }
    }
    Ok(())
}

/// Node of one of our PVs, if it is one of this cluster's nodes.
pub(super) fn pv_node(pv: &PersistentVolume) -> Option<&str> {
    let node = pv.labels().get(LABEL_NODE)?;
    NODE_NAMES.iter().copied().find(|n| n == node)
}

/// The volume's name, image file and mount dir (on the node its label names).
pub(super) fn volume_paths(
    state: &ClusterState,
    pv: &PersistentVolume,
) -> Result<(String, PathBuf, PathBuf), ProvisionerError> {
    let name = pv.name_any();
    let Some(node) = pv_node(pv) else {
        return Err(ProvisionerError::Volume {
            pv: name,
            reason: format!("label {LABEL_NODE} does not name a node of this cluster"),
        });
    };
    let image = image_path(state, &name);
    let dir = mount_dir(state, node, &name);
    Ok((name, image, dir))
}

pub(super) async fn ensure_mounted(
    ctx: &Ctx,
    pv: &PersistentVolume,
) -> Result<(), ProvisionerError> {
    let (_, image, dir) = volume_paths(&ctx.state, pv)?;
    let _guard = ctx.host.lock().await;
    tokio::task::spawn_blocking(move || {
        if !image.exists() {
            warn!(image = %image.display(), "image of volume is missing; not mounting");
            return Ok(());
        }
        mount_image(&image, &dir)
    })
    .await?
}
