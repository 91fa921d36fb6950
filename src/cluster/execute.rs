//! Carrying out the planner's actions: [`Cluster::execute`] dispatches each [`Action`] to one
//! function, which does what the action's contract (in `plan::action`) says.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{
    Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::{debug, info, warn};

use super::bodies;
use super::error::{ClusterError, is_status, kube_err};
use super::{Cluster, namespace};
use super::{Engine, EngineError};
use crate::api::{StorageMigrationRequest, StorageMigrationRequestStatus};
use crate::build;
use crate::engine::{HealthReport, HealthUnavailable};
use crate::failpoints;
use crate::labels;
use crate::plan::{Action, EventType, Kind, Object, Observed, Propagation};

impl Cluster {
    /// Carries out one action (see its contract in `plan::action`); a status write returns the
    /// request as the API server stored it.
    pub async fn execute(
        &self,
        o: &Observed,
        engine: &Result<Engine, String>,
        action: &Action,
    ) -> Result<Option<StorageMigrationRequest>, ClusterError> {
        let req = &o.request;
        let ns = namespace(req)?;
        let name = req.name_any();
        match action {
            Action::SetStatus(status) => {
                let rv = req.metadata.resource_version.as_deref();
                let written = self.set_status(&ns, &name, status, rv).await?;
                debug!(action = %action.name(), "done");
                return Ok(Some(written));
            }
            Action::AddFinalizer => self.set_finalizer(&ns, &name, true).await?,
            Action::RemoveFinalizer => self.set_finalizer(&ns, &name, false).await?,
            Action::Event {
                type_,
                reason,
                message,
            } => self.publish_event(req, *type_, reason, message).await,
            Action::Stash {
                config_map,
                key,
                value,
            } => self.stash_value(req, &ns, config_map, key, value).await?,
            Action::Create(obj) => self.create(&ns, obj).await?,
            Action::Delete {
                kind,
                name: obj,
                propagation,
                uid,
                resource_version,
            } => {
                let dp = delete_params(*propagation, uid, resource_version);
                self.delete(&ns, *kind, obj, &dp).await?
            }
            Action::ForceDeletePod { name: pod, uid } => {
                let mut dp = delete_params(Propagation::Background, uid, &None);
                dp.grace_period_seconds = Some(0);
                self.delete(&ns, Kind::Pod, pod, &dp).await?
            }
            Action::PatchReclaimPolicy { volume, policy } => {
                self.patch_reclaim_policy(volume, policy).await?
            }
            Action::SetClaimRef { volume, claim } => self.set_claim_ref(&ns, volume, claim).await?,
            Action::RemoveOwnerReferences { claim, uids } => {
                self.remove_owner_references(&ns, claim, uids).await?
            }
            Action::PatchRetentionPolicy {
                stateful_set,
                policy,
            } => {
                self.patch_retention_policy(&ns, stateful_set, policy)
                    .await?
            }
            Action::ScaleDeployment {
                deployment,
                replicas,
                resource_version,
            } => {
                self.scale_deployment(&ns, deployment, *replicas, resource_version.as_deref())
                    .await?
            }
            Action::TransferLeadership { from, to } => {
                execute_transfer_leadership(engine, &o.health, from, to).await?
            }
            Action::AnnotateClaim { claim, key, value } => {
                self.annotate_claim(&ns, claim, key, value.as_deref())
                    .await?
            }
            Action::LabelVolume { volume } => self.label_volume(volume, &name).await?,
        }
        debug!(action = %action.name(), "done");
        Ok(None)
    }

    /// Writes `status` as the status of `req`, on the condition that the request is still as
    /// read (its `resourceVersion`): for the controller's own status writes, outside a decision.
    pub async fn write_status(
        &self,
        req: &StorageMigrationRequest,
        status: &StorageMigrationRequestStatus,
    ) -> Result<(), ClusterError> {
        let ns = namespace(req)?;
        let rv = req.metadata.resource_version.as_deref();
        self.set_status(&ns, &req.name_any(), status, rv)
            .await
            .map(drop)
    }

    /// Applies the status (server-side apply, forced, our field manager) on the condition that
    /// the request is still at `resource_version`, the version the decision was made from; a 409
    /// is [`ClusterError::StaleStatus`] (the caller reads again and decides again).
    ///
    /// Server-side apply, not a replace: the status fields another manager owns (none today, but
    /// `kubectl` or a policy engine may add some) are kept, and a field we stop sending is
    /// removed only when we owned it. `force`: no other manager's claim on a field we decide
    /// (a manual `kubectl edit --subresource=status`) blocks the operator's own state.
    ///
    /// Returns the request as written (its new `resourceVersion`).
    async fn set_status(
        &self,
        ns: &str,
        name: &str,
        status: &StorageMigrationRequestStatus,
        resource_version: Option<&str>,
    ) -> Result<StorageMigrationRequest, ClusterError> {
        let result = self
            .ns_api::<StorageMigrationRequest>(ns)
            .patch_status(
                name,
                &PatchParams::apply(labels::FIELD_MANAGER).force(),
                &Patch::Apply(&bodies::status_body(status, resource_version)),
            )
            .await;
        match (result, resource_version) {
            (Ok(written), _) => Ok(written),
            (Err(e), Some(rv)) if is_status(&e, 409) => Err(ClusterError::StaleStatus {
                request: format!("{ns}/{name}"),
                resource_version: rv.to_string(),
            }),
            (Err(e), _) => Err(kube_err(format!("write status of {ns}/{name}"))(e)),
        }
    }

    /// Adds (`present`) or removes the finalizer on the request as it is now.
    async fn set_finalizer(&self, ns: &str, name: &str, present: bool) -> Result<(), ClusterError> {
        let Some(current) = self.fetch(ns, name).await? else {
            return Ok(());
        };
        let Some(patch) = bodies::finalizer_patch(&current, present) else {
            return Ok(());
        };
        let reqs: Api<StorageMigrationRequest> = self.ns_api(ns);
        match reqs
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(kube_err(format!("finalizer of {ns}/{name}"))(e)),
        }
    }

    /// Publishes a Warning Event on the request, outside a decision (best effort).
    pub async fn warning_event(&self, req: &StorageMigrationRequest, reason: &str, message: &str) {
        self.publish_event(req, EventType::Warning, reason, message)
            .await;
    }

    async fn publish_event(
        &self,
        req: &StorageMigrationRequest,
        type_: EventType,
        reason: &str,
        message: &str,
    ) {
        let ev = bodies::event(type_, reason, message);
        if let Err(e) = self.recorder.publish(&ev, &req.object_ref(&())).await {
            warn!(reason, error = %e, "cannot publish event");
        }
        info!(reason, "{message}");
    }

    /// Sets `key` of the request's stash ConfigMap `cm`, once its uid label is checked.
    async fn stash_value(
        &self,
        req: &StorageMigrationRequest,
        ns: &str,
        cm: &str,
        key: &str,
        value: &str,
    ) -> Result<(), ClusterError> {
        let cms: Api<ConfigMap> = self.ns_api(ns);
        // The stash as kept from this decision's read (`read_cache`): the patch carries its
        // resourceVersion, so a stash changed since is refused (409), never overwritten.
        let kept: Api<ConfigMap> = Api::namespaced(self.kept_reads(&Default::default()), ns);
        let current = kept
            .get_opt(cm)
            .await
            .map_err(kube_err(format!("get stash ConfigMap {cm}")))?;
        let patch = bodies::stash_patch(current.as_ref(), req.uid().as_deref(), key, value)
            .map_err(|reason| ClusterError::Invalid {
                what: format!("stash ConfigMap {ns}/{cm}"),
                reason,
            })?;
        cms.patch(cm, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube_err(format!("stash {key} in ConfigMap {cm}")))?;
        Ok(())
    }

    async fn create(&self, ns: &str, obj: &Object) -> Result<(), ClusterError> {
        match obj {
            Object::Claim(c) => create(&self.ns_api(ns), c.as_ref(), "claim").await,
            Object::Pod(p) => self.create_raw(ns, p.as_ref(), "pod", true).await,
            Object::Job(j) => {
                let mut job = j.as_ref().clone();
                failpoints::before_create_job(&mut job);
                create(&self.ns_api(ns), &job, "Job").await
            }
            // A set of that name may be someone else's: never taken for ours (see
            // `plan::foreign`).
            Object::StatefulSet(s) => self.create_raw(ns, s.as_ref(), "StatefulSet", false).await,
            Object::ConfigMap(c) => create(&self.ns_api(ns), c.as_ref(), "ConfigMap").await,
        }
    }

    async fn delete(
        &self,
        ns: &str,
        kind: Kind,
        name: &str,
        dp: &DeleteParams,
    ) -> Result<(), ClusterError> {
        match kind {
            Kind::Claim => delete::<PersistentVolumeClaim>(&self.ns_api(ns), name, dp).await,
            Kind::Pod => delete::<Pod>(&self.ns_api(ns), name, dp).await,
            Kind::Job => delete::<Job>(&self.ns_api(ns), name, dp).await,
            Kind::StatefulSet => delete::<StatefulSet>(&self.ns_api(ns), name, dp).await,
            Kind::ConfigMap => delete::<ConfigMap>(&self.ns_api(ns), name, dp).await,
        }
    }

    fn volume_api(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    async fn patch_reclaim_policy(&self, volume: &str, policy: &str) -> Result<(), ClusterError> {
        let patch = build::reclaim_policy_patch(policy);
        self.patch_volume(volume, &patch, "reclaim policy").await
    }

    async fn set_claim_ref(&self, ns: &str, volume: &str, claim: &str) -> Result<(), ClusterError> {
        let patch = build::claim_ref_patch(ns, claim);
        self.patch_volume(volume, &patch, "claimRef").await
    }

    /// A merge patch of `volume`; the volume it answers with is what a read of it would answer
    /// now, and is kept as such ([`super::VolumeCache`]) unless the watch saw it change meanwhile.
    async fn patch_volume(
        &self,
        volume: &str,
        patch: &Value,
        what: &str,
    ) -> Result<(), ClusterError> {
        let begun = self.volumes.as_ref().map(|c| c.begin(volume));
        let patched = self
            .volume_api()
            .patch(volume, &PatchParams::default(), &Patch::Merge(patch))
            .await;
        match patched {
            Ok(pv) => {
                if let Some((cache, begun)) = self.volumes.as_ref().zip(begun) {
                    cache.keep(volume, Some(&pv), begun);
                }
                Ok(())
            }
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(kube_err(format!("patch {what} of {volume}"))(e)),
        }
    }

    /// Removes the ownerReferences with these uids from the claim as it is now.
    async fn remove_owner_references(
        &self,
        ns: &str,
        claim: &str,
        uids: &[String],
    ) -> Result<(), ClusterError> {
        let claims: Api<PersistentVolumeClaim> = self.ns_api(ns);
        let Some(current) = claims
            .get_opt(claim)
            .await
            .map_err(kube_err(format!("get claim {claim}")))?
        else {
            return Ok(());
        };
        match bodies::owner_references_patch(&current, uids) {
            Some(patch) => merge(&claims, claim, &patch, "claim ownerReferences").await,
            None => Ok(()),
        }
    }

    async fn patch_retention_policy(
        &self,
        ns: &str,
        stateful_set: &str,
        policy: &str,
    ) -> Result<(), ClusterError> {
        let patch = bodies::retention_policy_patch(policy)?;
        let sets: Api<StatefulSet> = self.ns_api(ns);
        merge(&sets, stateful_set, &patch, "retention policy").await
    }

    async fn scale_deployment(
        &self,
        ns: &str,
        deployment: &str,
        replicas: i32,
        resource_version: Option<&str>,
    ) -> Result<(), ClusterError> {
        let patch = bodies::scale_patch(replicas, resource_version);
        let deployments: Api<Deployment> = self.ns_api(ns);
        deployments
            .patch_scale(deployment, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube_err(format!("scale Deployment {deployment}")))?;
        Ok(())
    }

    async fn annotate_claim(
        &self,
        ns: &str,
        claim: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), ClusterError> {
        let patch = bodies::annotation_patch(key, value);
        let claims: Api<PersistentVolumeClaim> = self.ns_api(ns);
        merge(&claims, claim, &patch, "claim annotation").await
    }

    async fn label_volume(&self, volume: &str, request: &str) -> Result<(), ClusterError> {
        let patch = build::migrated_by_label_patch(request);
        self.patch_volume(volume, &patch, "label").await
    }
}

/// Hands the leadership over with the snapshot's engine and health report.
async fn execute_transfer_leadership(
    engine: &Result<Engine, String>,
    health: &Result<HealthReport, HealthUnavailable>,
    from: &str,
    to: &str,
) -> Result<(), ClusterError> {
    let (Ok(engine), Ok(report)) = (engine, health) else {
        return Err(ClusterError::Engine(EngineError::Other(
            "no engine or health report to transfer leadership with".into(),
        )));
    };
    engine.transfer_leadership(report, from, to).await?;
    Ok(())
}

/// The propagation policy, and the uid as a precondition when there is one.
fn delete_params(
    propagation: Propagation,
    uid: &Option<String>,
    resource_version: &Option<String>,
) -> DeleteParams {
    let preconditions = (uid.is_some() || resource_version.is_some()).then(|| Preconditions {
        uid: uid.clone(),
        resource_version: resource_version.clone(),
    });
    DeleteParams {
        propagation_policy: Some(match propagation {
            Propagation::Background => PropagationPolicy::Background,
            Propagation::Orphan => PropagationPolicy::Orphan,
        }),
        preconditions,
        ..Default::default()
    }
}

/// Creates; an existing object of that name (409) is a success.
async fn create<K>(api: &Api<K>, obj: &K, what: &str) -> Result<(), ClusterError>
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 409) => Ok(()),
        Err(e) => Err(kube_err(format!("create {what} {}", obj.name_any()))(e)),
    }
}

/// Deletes; a missing object (404) is a success, and so is a failed uid precondition (409)
/// unless the delete also carries a resourceVersion precondition: then the 409 may mean "changed
/// since" and is returned as an error (transient), so that the next reconcile looks again.
async fn delete<K>(api: &Api<K>, name: &str, dp: &DeleteParams) -> Result<(), ClusterError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let version_checked = dp
        .preconditions
        .as_ref()
        .is_some_and(|p| p.resource_version.is_some());
    match api.delete(name, dp).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 404) => Ok(()),
        // A successor with another uid (precondition failed): nothing to do.
        Err(e) if is_status(&e, 409) && !version_checked => Ok(()),
        Err(e) => Err(kube_err(format!("delete {name}"))(e)),
    }
}

/// Sends a JSON merge patch; a missing object (404) is a success.
async fn merge<K>(api: &Api<K>, name: &str, patch: &Value, what: &str) -> Result<(), ClusterError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 404) => Ok(()),
        Err(e) => Err(kube_err(format!("patch {what} of {name}"))(e)),
    }
}
