//! The claim controller: provisions a volume for each claim that is ours.

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
    let claim_id = format!(
        "{}/{}",
        claim.namespace().unwrap_or_default(),
        claim.name_any()
    );
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

async fn provision(
    ctx: &Ctx,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    request: ProvisionRequest,
) -> Result<(), ProvisionerError> {
    let claim_id = format!(
        "{}/{}",
        claim.namespace().unwrap_or_default(),
        claim.name_any()
    );
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
    let candidates = allowed_nodes(class, &NODE_NAMES);
    let node = match mounted_node(&ctx.state, &name)? {
        // A previous attempt for this claim got as far as mounting: finish it there.
        Some(mounted) => mounted,
        None => {
            let existing = match request.node {
                Some(_) => Vec::new(),
                None => {
                    pvs.list(&ListParams::default().labels(LABEL_NODE))
                        .await?
                        .items
                }
            };
            match provision_node(
                request.node.as_deref(),
                &candidates,
                &existing,
                &class.name_any(),
            ) {
                Ok(node) => node,
                Err(reason) => {
                    // Nothing a retry could change (the nodes are fixed): wait for the claim
                    // to change, e.g. a new selected node.
                    warn!(claim = %claim_id, %reason, "cannot provision claim");
                    publish(ctx, claim, EventType::Warning, "ProvisioningFailed", reason).await;
                    return Ok(());
                }
            }
        }
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
    let host_result = {
        let (image, dir) = (image.clone(), dir.clone());
        tokio::task::spawn_blocking(move || {
            create_image(&image, size)?;
            mount_image(&image, &dir)
        })
        .await?
    };
    if let Err(e) = host_result {
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
        return Err(e);
    }
    let pv = build_pv(claim, class, &node, &dir, pv_capacity(&request))?;
    match pvs.create(&PostParams::default(), &pv).await {
        Ok(_) => {}
        Err(e) if is_api_status(&e, |s| s.is_already_exists()) => {}
        Err(e) => {
            publish(
                ctx,
                claim,
                EventType::Warning,
                "ProvisioningFailed",
                format!("failed to create PersistentVolume {name}: {e}"),
            )
            .await;
            return Err(e.into());
        }
    }
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
