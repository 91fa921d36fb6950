//! The claim controller: provisions a volume for each claim that is ours.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use crate::provisioner::claims::{ClaimDecision, ProvisionRequest, claim_class_name, decide_claim};
use crate::provisioner::controller::Ctx;
use crate::provisioner::host::{
    create_image, image_path, image_size, mount_dir, mount_image, mounted_node,
};
use crate::provisioner::objects::{build_pv, pv_capacity, pv_name};
use crate::provisioner::placement::{allowed_nodes, provision_node};
use crate::provisioner::{LABEL_NODE, ProvisionerError, is_api_status};
use crate::state::NODE_NAMES;

async fn publish(
    ctx: &Ctx,
    claim: &PersistentVolumeClaim,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: "Provision".to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &claim.object_ref(&())).await {
        warn!(claim = %claim.name_any(), reason, error = %e, "cannot publish event");
    }
}

pub(super) async fn reconcile_claim(
    claim: Arc<PersistentVolumeClaim>,
    ctx: Arc<Ctx>,
) -> Result<Action, ProvisionerError> {
    let Some(class_name) = claim_class_name(&claim) else {
        return Ok(Action::await_change());
    };
    let classes: Api<StorageClass> = Api::all(ctx.client.clone());
    let class = classes.get_opt(&class_name).await?;
    let claim_id = claim_id(&claim);
    match decide_claim(&claim, class.as_ref()) {
        ClaimDecision::Ignore => Ok(Action::await_change()),
        ClaimDecision::WaitForConsumer => {
            debug!(claim = %claim_id, "waiting for a consumer to be scheduled");
            Ok(Action::await_change())
        }
        ClaimDecision::Refuse(reason) => {
            warn!(claim = %claim_id, %reason, "refusing claim");
            publish(
                &ctx,
                &claim,
                EventType::Warning,
                "ProvisioningFailed",
                reason,
            )
            .await;
            Ok(Action::await_change())
        }
        ClaimDecision::Provision(request) => {
            let Some(class) = class else {
                return Ok(Action::await_change());
            };
            provision(&ctx, &claim, &class, request).await?;
            Ok(Action::await_change())
        }
    }
}

/// `namespace/name` of a claim, for logs and events.
fn claim_id(claim: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}",
        claim.namespace().unwrap_or_default(),
        claim.name_any()
    )
}

/// The node for the volume `name`: where an earlier attempt mounted it, else the selected node
/// or the node with the fewest volumes. `None` (with a `ProvisioningFailed` event) when no node
/// fits.
async fn volume_node(
    ctx: &Ctx,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    request: &ProvisionRequest,
    name: &str,
) -> Result<Option<String>, ProvisionerError> {
    // A previous attempt for this claim got as far as mounting: finish it there.
    if let Some(mounted) = mounted_node(&ctx.state, name)? {
        return Ok(Some(mounted));
    }
    let candidates = allowed_nodes(class, &NODE_NAMES);
    let existing = match request.node {
        Some(_) => Vec::new(),
        None => {
            let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
            pvs.list(&ListParams::default().labels(LABEL_NODE))
                .await?
                .items
        }
    };
    match provision_node(
        request.node.as_deref(),
        &candidates,
        &existing,
        &claim.namespace().unwrap_or_default(),
        &class.name_any(),
    ) {
        Ok(node) => Ok(Some(node)),
        Err(reason) => {
            // Nothing a retry could change (the nodes are fixed): wait for the claim to
            // change, e.g. a new selected node.
            warn!(claim = %claim_id(claim), %reason, "cannot provision claim");
            publish(ctx, claim, EventType::Warning, "ProvisioningFailed", reason).await;
            Ok(None)
        }
    }
}

/// Creates the image of `size` bytes and mounts it at `dir` (on the blocking pool); a failure
/// is also published as a `ProvisioningFailed` event.
async fn create_on_host(
    ctx: &Ctx,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    image: &Path,
    dir: &Path,
    size: u64,
) -> Result<(), ProvisionerError> {
    let host_result = {
        let (image, dir) = (image.to_path_buf(), dir.to_path_buf());
        tokio::task::spawn_blocking(move || {
            create_image(&image, size)?;
            mount_image(&image, &dir)
        })
        .await?
    };
    if let Err(e) = &host_result {
        publish(
            ctx,
            claim,
            EventType::Warning,
            "ProvisioningFailed",
            format!(
                "failed to provision volume with StorageClass \"{}\": {e}",
                class.name_any()
            ),
        )
        .await;
    }
    host_result
}

/// Creates the PV (one that exists already counts as created); a failure is also published as a
/// `ProvisioningFailed` event.
async fn create_pv(
    ctx: &Ctx,
    claim: &PersistentVolumeClaim,
    pv: &PersistentVolume,
) -> Result<(), ProvisionerError> {
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    match pvs.create(&PostParams::default(), pv).await {
        Ok(_) => Ok(()),
        Err(e) if is_api_status(&e, |s| s.is_already_exists()) => Ok(()),
        Err(e) => {
            publish(
                ctx,
                claim,
                EventType::Warning,
                "ProvisioningFailed",
                format!("failed to create PersistentVolume {}: {e}", pv.name_any()),
            )
            .await;
            Err(e.into())
        }
    }
}

async fn provision(
    ctx: &Ctx,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    request: ProvisionRequest,
) -> Result<(), ProvisionerError> {
    let claim_id = claim_id(claim);
    let Some(uid) = claim.uid() else {
        return Ok(());
    };
    let name = pv_name(&uid);
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    if pvs.get_opt(&name).await?.is_some() {
        debug!(claim = %claim_id, pv = %name, "volume exists already");
        return Ok(());
    }
    let _guard = ctx.host.lock().await;
    let Some(node) = volume_node(ctx, claim, class, &request, &name).await? else {
        return Ok(());
    };
    publish(
        ctx,
        claim,
        EventType::Normal,
        "Provisioning",
        format!("External provisioner is provisioning volume for claim \"{claim_id}\""),
    )
    .await;
    let image = image_path(&ctx.state, &name);
    let dir = mount_dir(&ctx.state, &node, &name);
    let size = image_size(request.bytes);
    create_on_host(ctx, claim, class, &image, &dir, size).await?;
    let pv = build_pv(claim, class, &node, &dir, pv_capacity(&request))?;
    create_pv(ctx, claim, &pv).await?;
    info!(claim = %claim_id, pv = %name, %node, bytes = size, "provisioned volume");
    publish(
        ctx,
        claim,
        EventType::Normal,
        "ProvisioningSucceeded",
        format!("Successfully provisioned volume {name}"),
    )
    .await;
    Ok(())
}

pub(super) fn claim_error_policy(
    claim: Arc<PersistentVolumeClaim>,
    err: &ProvisionerError,
    _ctx: Arc<Ctx>,
) -> Action {
    warn!(claim = %claim.name_any(), error = %err, "provisioning failed; retrying");
    Action::requeue(Duration::from_secs(5))
}
