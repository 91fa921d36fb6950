//! The only code that talks to the API server: gather an [`Observed`] snapshot for one request,
//! and carry out the planner's [`Action`]s (each idempotent: a create that finds the object and a
//! delete that finds nothing are successes).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{
    Api, DeleteParams, GetParams, ListParams, Patch, PatchParams, PostParams, Preconditions,
    PropagationPolicy,
};
use kube::core::Request;
use kube::runtime::events::{Event, EventType as KubeEventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use crate::api::{Stage, StorageMigrationRequest, StorageMigrationRequestStatus};
use crate::build::{self, BuildError, Manifest};
use crate::engine::{self, Engine, EngineError};
use crate::labels;
use crate::plan::observe::{effective_spec, expected_members, job_outcome};
use crate::plan::{
    self, Action, EventType, Kind, Object, Observed, ObservedJob, OtherRequest, Propagation, Stash,
    StashTarget,
};

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("database engine: {0}")]
    Engine(#[from] EngineError),
    #[error("{0}")]
    Build(#[from] BuildError),
    #[error("request {0} has no namespace")]
    NoNamespace(String),
    #[error("invalid value for {what}: {reason}")]
    Invalid { what: String, reason: String },
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ClusterError {
    let what = what.into();
    move |source| ClusterError::Kube { what, source }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Everything the cluster layer needs for one request.
pub struct Cluster {
    pub client: Client,
    pub recorder: Recorder,
}

impl Cluster {
    pub fn new(client: Client, recorder: Recorder) -> Self {
        Self { client, recorder }
    }

    fn ns_api<K>(&self, ns: &str) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), ns)
    }

    /// The request as stored now (`None` once it is gone).
    pub async fn fetch(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<StorageMigrationRequest>, ClusterError> {
        self.ns_api::<StorageMigrationRequest>(ns)
            .get_opt(name)
            .await
            .map_err(kube_err(format!("get request {ns}/{name}")))
    }

    /// The database engine of a request (from its accepted spec).
    pub async fn engine(&self, req: &StorageMigrationRequest) -> Result<Engine, ClusterError> {
        let ns = req
            .namespace()
            .ok_or_else(|| ClusterError::NoNamespace(req.name_any()))?;
        let spec = effective_spec(req);
        Ok(Engine::from_spec(&self.client, &ns, &spec.database).await?)
    }

    /// Gathers the snapshot the planner decides on.
    pub async fn gather(
        &self,
        req: StorageMigrationRequest,
        engine: &Result<Engine, String>,
    ) -> Result<Observed, ClusterError> {
        let ns = req
            .namespace()
            .ok_or_else(|| ClusterError::NoNamespace(req.name_any()))?;
        let name = req.name_any();
        let spec = effective_spec(&req);
        let status = req.status.clone().unwrap_or_default();
        let set_name = spec.target.name.clone();

        // Raw JSON: the set is stashed as returned, so that fields our API structs do not know
        // survive its recreation (see `build::manifest`).
        let stateful_set = self.get_raw::<StatefulSet>(&ns, &set_name).await?;

        let (stash, stash_config_map_exists) = self.stash(&req, &ns, &status).await?;

        // Member pods: by the set's selector (live or stashed), never our own helper pods.
        let pods_api: Api<Pod> = self.ns_api(&ns);
        let selector_source = stateful_set.as_ref().or(stash.stateful_set.as_ref());
        let selector = selector_source
            .and_then(|s| s.spec.as_ref())
            .and_then(|s| s.selector.match_labels.as_ref())
            .filter(|l| !l.is_empty())
            .map(|l| {
                l.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            });
        let mut pods = BTreeMap::new();
        if let Some(selector) = selector {
            // Raw JSON too: a member pod is stashed as returned.
            for p in self
                .list_raw::<Pod>(&ns, &ListParams::default().labels(&selector))
                .await?
            {
                if !p.labels().contains_key(labels::REQUEST_LABEL) {
                    pods.insert(p.name_any(), p);
                }
            }
        }
        // Jobs before their pods: a Job seen Complete then has its pod's final status (and
        // termination message) in the pod list taken after it.
        let owned = labels::request_selector(&name);
        let job_list = self
            .ns_api::<Job>(&ns)
            .list(&ListParams::default().labels(&owned))
            .await
            .map_err(kube_err("list jobs"))?;
        let helper_pods: BTreeMap<String, Pod> = pods_api
            .list(&ListParams::default().labels(&owned))
            .await
            .map_err(kube_err("list helper pods"))?
            .into_iter()
            .map(|p| (p.name_any(), p))
            .collect();
        let mut jobs = BTreeMap::new();
        for job in job_list {
            let outcome = job_outcome(&job, &helper_pods);
            jobs.insert(job.name_any(), ObservedJob { job, outcome });
        }

        let claims: BTreeMap<String, PersistentVolumeClaim> = self
            .ns_api::<PersistentVolumeClaim>(&ns)
            .list(&ListParams::default())
            .await
            .map_err(kube_err("list claims"))?
            .into_iter()
            .map(|c| (c.name_any(), c))
            .collect();

        let mut volume_names: BTreeSet<String> = claims
            .values()
            .filter_map(|c| plan::claim_volume(c).map(str::to_string))
            .collect();
        if let Some(p) = &status.plan {
            volume_names.extend(p.members.iter().map(|m| m.old_volume.clone()));
        }
        volume_names.extend(status.members.iter().filter_map(|m| m.new_volume.clone()));
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let mut volumes = BTreeMap::new();
        for v in volume_names {
            if let Some(pv) = pvs
                .get_opt(&v)
                .await
                .map_err(kube_err(format!("get PV {v}")))?
            {
                volumes.insert(v, pv);
            }
        }

        let storage_classes = Api::<StorageClass>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(kube_err("list StorageClasses"))?
            .into_iter()
            .map(|c| (c.name_any(), c))
            .collect();

        let other_requests = self
            .ns_api::<StorageMigrationRequest>(&ns)
            .list(&ListParams::default())
            .await
            .map_err(kube_err("list requests"))?
            .into_iter()
            .filter(|r| r.name_any() != name && effective_spec(r).target.name == set_name)
            .map(|r| OtherRequest {
                name: r.name_any(),
                created: r.metadata.creation_timestamp.as_ref().map(|t| t.0),
                phase: r.status.as_ref().map(|s| s.phase).unwrap_or_default(),
            })
            .collect();

        // The engine's view of the members (only where the planner uses it).
        let expected = expected_members(&status, stateful_set.as_deref(), &set_name);
        let member_pods: Vec<Pod> = expected
            .iter()
            .filter_map(|p| pods.get(p).map(|p| p.typed().clone()))
            .collect();
        let wants_health =
            !status.phase.is_final() && matches!(status.stage, Stage::Preflight | Stage::Migrating);
        let health = match engine {
            Err(e) => Err(e.clone()),
            Ok(_) if !wants_health => Err("not observed in this stage".to_string()),
            Ok(engine) => match engine.observe(&member_pods).await {
                Ok(mut report) => {
                    engine::note_missing_pods(&mut report, &expected);
                    Ok(report)
                }
                Err(e) => Err(e.to_string()),
            },
        };
        let final_hash = match engine {
            Ok(engine)
                if status.stage == Stage::Finalizing
                    && status.final_hash.is_none()
                    && !status.phase.is_final() =>
            {
                Some(
                    engine
                        .final_hash(&member_pods)
                        .await
                        .map_err(|e| e.to_string()),
                )
            }
            _ => None,
        };

        Ok(Observed {
            request: req,
            now: k8s_openapi::jiff::Timestamp::now(),
            stateful_set,
            stash,
            stash_config_map_exists,
            pods,
            helper_pods,
            claims,
            volumes,
            jobs,
            storage_classes,
            other_requests,
            health,
            final_hash,
        })
    }

    /// GET one object as the raw JSON the API server returned, with its typed view (`None` when
    /// it does not exist). Unlike `Api::<K>::get`, nothing k8s-openapi does not know is lost.
    async fn get_raw<K>(&self, ns: &str, name: &str) -> Result<Option<Manifest<K>>, ClusterError>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + k8s_openapi::Resource
            + DeserializeOwned,
    {
        let err = kube_err(format!(
            "get {} {ns}/{name}",
            <K as k8s_openapi::Resource>::KIND
        ));
        let url = <K as Resource>::url_path(&(), Some(ns));
        let mut req = match Request::new(url).get(name, &GetParams::default()) {
            Ok(req) => req,
            Err(e) => return Err(err(kube::Error::BuildRequest(e))),
        };
        req.extensions_mut().insert("get");
        match self.client.request::<Value>(req).await {
            Ok(raw) => Ok(Some(Manifest::from_raw(raw)?)),
            Err(e) if is_status(&e, 404) => Ok(None),
            Err(e) => Err(err(e)),
        }
    }

    /// LIST objects as the raw JSON the API server returned, each with its typed view.
    async fn list_raw<K>(&self, ns: &str, lp: &ListParams) -> Result<Vec<Manifest<K>>, ClusterError>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + k8s_openapi::Resource
            + DeserializeOwned,
    {
        /// A list response, its items kept as JSON.
        #[derive(serde::Deserialize)]
        struct RawList {
            #[serde(default)]
            items: Vec<Value>,
        }
        let err = kube_err(format!(
            "list {} in {ns} ({})",
            <K as k8s_openapi::Resource>::KIND,
            lp.label_selector.as_deref().unwrap_or("all")
        ));
        let url = <K as Resource>::url_path(&(), Some(ns));
        let mut req = match Request::new(url).list(lp) {
            Ok(req) => req,
            Err(e) => return Err(err(kube::Error::BuildRequest(e))),
        };
        req.extensions_mut().insert("list");
        let list: RawList = self.client.request(req).await.map_err(err)?;
        Ok(list
            .items
            .into_iter()
            .map(Manifest::from_raw)
            .collect::<Result<_, _>>()?)
    }

    /// CREATE from raw JSON, so that nothing is dropped on the way out; an existing object of
    /// that name is a success.
    async fn create_raw<K>(
        &self,
        ns: &str,
        obj: &Manifest<K>,
        what: &str,
    ) -> Result<(), ClusterError>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        let name = obj.raw()["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let err = kube_err(format!("create {what} {name}"));
        let body = serde_json::to_vec(obj.raw()).map_err(|e| ClusterError::Invalid {
            what: format!("{what} {name}"),
            reason: e.to_string(),
        })?;
        let url = <K as Resource>::url_path(&(), Some(ns));
        let mut req = match Request::new(url).create(&PostParams::default(), body) {
            Ok(req) => req,
            Err(e) => return Err(err(kube::Error::BuildRequest(e))),
        };
        req.extensions_mut().insert("create");
        match self.client.request::<Value>(req).await {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 409) => Ok(()),
            Err(e) => Err(err(e)),
        }
    }

    /// Decodes the stash from the request's annotations and the stash ConfigMap.
    async fn stash(
        &self,
        req: &StorageMigrationRequest,
        ns: &str,
        status: &StorageMigrationRequestStatus,
    ) -> Result<(Stash, bool), ClusterError> {
        let mut entries: BTreeMap<String, String> = req.annotations().clone();
        let mut exists = false;
        if let Some(cm) = &status.stash_config_map
            && let Some(cm) = self
                .ns_api::<ConfigMap>(ns)
                .get_opt(cm)
                .await
                .map_err(kube_err(format!("get stash ConfigMap {cm}")))?
        {
            exists = true;
            for (k, v) in cm.data.unwrap_or_default() {
                entries.insert(format!("{}/{k}", labels::GROUP), v);
            }
        }
        let mut stash = Stash::default();
        let decode = |key: &str| -> Option<String> { entries.get(key).cloned() };
        if let Some(v) = decode(labels::STASH_STATEFULSET_ANNOTATION) {
            match build::stash_decode(&v) {
                Ok(s) => stash.stateful_set = Some(s),
                Err(e) => stash
                    .errors
                    .push((labels::STASH_STATEFULSET_ANNOTATION.into(), e.to_string())),
            }
        }
        for m in status.plan.iter().flat_map(|p| p.members.iter()) {
            let key = build::stash_pod_annotation(&m.pod);
            if let Some(v) = decode(&key) {
                match build::stash_decode(&v) {
                    Ok(p) => {
                        stash.pods.insert(m.pod.clone(), p);
                    }
                    Err(e) => stash.errors.push((key, e.to_string())),
                }
            }
            let key = format!("{}{}", labels::STASH_CLAIM_ANNOTATION_PREFIX, m.claim);
            if let Some(v) = decode(&key) {
                match build::stash_decode(&v) {
                    Ok(c) => {
                        stash.claims.insert(m.claim.clone(), c);
                    }
                    Err(e) => stash.errors.push((key, e.to_string())),
                }
            }
        }
        for (key, e) in &stash.errors {
            warn!(key, error = %e, "stash entry cannot be decoded");
        }
        Ok((stash, exists))
    }

    /// Carries out one action.
    pub async fn execute(
        &self,
        o: &Observed,
        engine: &Result<Engine, String>,
        action: &Action,
    ) -> Result<(), ClusterError> {
        let req = &o.request;
        let ns = req
            .namespace()
            .ok_or_else(|| ClusterError::NoNamespace(req.name_any()))?;
        let name = req.name_any();
        let reqs: Api<StorageMigrationRequest> = self.ns_api(&ns);
        match action {
            Action::SetStatus(status) => {
                let body = json!({
                    "apiVersion": "storagemigrator.io/v1alpha1",
                    "kind": "StorageMigrationRequest",
                    "status": status,
                });
                reqs.patch_status(
                    &name,
                    &PatchParams::apply(labels::FIELD_MANAGER).force(),
                    &Patch::Apply(&body),
                )
                .await
                .map_err(kube_err(format!("write status of {ns}/{name}")))?;
            }
            Action::AddFinalizer | Action::RemoveFinalizer => {
                let current = self.fetch(&ns, &name).await?;
                let Some(current) = current else {
                    return Ok(());
                };
                let mut finalizers = current.finalizers().to_vec();
                let has = finalizers.iter().any(|f| f == labels::FINALIZER);
                match action {
                    Action::AddFinalizer if !has => finalizers.push(labels::FINALIZER.into()),
                    Action::RemoveFinalizer if has => finalizers.retain(|f| f != labels::FINALIZER),
                    _ => return Ok(()),
                }
                let patch = json!({"metadata": {
                    "finalizers": finalizers,
                    "resourceVersion": current.resource_version(),
                }});
                match reqs
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {}
                    Err(e) if is_status(&e, 404) => {}
                    Err(e) => return Err(kube_err(format!("finalizer of {ns}/{name}"))(e)),
                }
            }
            Action::Event {
                type_,
                reason,
                message,
            } => {
                let ev = Event {
                    type_: match type_ {
                        EventType::Normal => KubeEventType::Normal,
                        EventType::Warning => KubeEventType::Warning,
                    },
                    reason: reason.clone(),
                    note: Some(message.chars().take(1000).collect()),
                    // The recorder folds events with the same action and reason into one
                    // series; the message tells members apart, so it goes into the key.
                    action: format!("{reason}-{:08x}", fnv(message)),
                    secondary: None,
                };
                if let Err(e) = self.recorder.publish(&ev, &req.object_ref(&())).await {
                    warn!(reason, error = %e, "cannot publish event");
                }
                info!(reason, "{message}");
            }
            Action::Stash { target, value } => match target {
                StashTarget::Annotation(key) => {
                    let patch = json!({"metadata": {"annotations": {key: value}}});
                    reqs.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map_err(kube_err(format!("stash {key} on {ns}/{name}")))?;
                }
                StashTarget::ConfigMap { name: cm, key } => {
                    let cms: Api<ConfigMap> = self.ns_api(&ns);
                    if cms
                        .get_opt(cm)
                        .await
                        .map_err(kube_err(format!("get ConfigMap {cm}")))?
                        .is_none()
                    {
                        let mut obj = build::stash_config_map(req, &BTreeMap::new());
                        obj.metadata.name = Some(cm.clone());
                        create(&cms, &obj, "stash ConfigMap").await?;
                    }
                    let patch = json!({"data": {key: value}});
                    cms.patch(cm, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map_err(kube_err(format!("stash {key} in ConfigMap {cm}")))?;
                }
            },
            Action::Create(obj) => match obj {
                Object::Claim(c) => create(&self.ns_api(&ns), c.as_ref(), "claim").await?,
                Object::Pod(p) => self.create_raw(&ns, p.as_ref(), "pod").await?,
                Object::Job(j) => {
                    let mut job = j.as_ref().clone();
                    inject_copy_failure(&mut job);
                    create(&self.ns_api(&ns), &job, "Job").await?
                }
                Object::StatefulSet(s) => self.create_raw(&ns, s.as_ref(), "StatefulSet").await?,
                Object::ConfigMap(c) => create(&self.ns_api(&ns), c.as_ref(), "ConfigMap").await?,
            },
            Action::Delete {
                kind,
                name: obj,
                propagation,
                uid,
            } => {
                let dp = DeleteParams {
                    propagation_policy: Some(match propagation {
                        Propagation::Background => PropagationPolicy::Background,
                        Propagation::Orphan => PropagationPolicy::Orphan,
                    }),
                    preconditions: uid.clone().map(|uid| Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                match kind {
                    Kind::Claim => {
                        delete::<PersistentVolumeClaim>(&self.ns_api(&ns), obj, &dp).await?
                    }
                    Kind::Pod => delete::<Pod>(&self.ns_api(&ns), obj, &dp).await?,
                    Kind::Job => delete::<Job>(&self.ns_api(&ns), obj, &dp).await?,
                    Kind::StatefulSet => delete::<StatefulSet>(&self.ns_api(&ns), obj, &dp).await?,
                    Kind::ConfigMap => delete::<ConfigMap>(&self.ns_api(&ns), obj, &dp).await?,
                }
            }
            Action::PatchReclaimPolicy { volume, policy } => {
                let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
                merge(
                    &pvs,
                    volume,
                    &build::reclaim_policy_patch(policy),
                    "reclaim policy",
                )
                .await?;
            }
            Action::SetClaimRef { volume, claim } => {
                let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
                merge(
                    &pvs,
                    volume,
                    &build::claim_ref_patch(&ns, claim),
                    "claimRef",
                )
                .await?;
            }
            Action::RemoveOwnerReferences { claim, .. } => {
                let claims: Api<PersistentVolumeClaim> = self.ns_api(&ns);
                let Some(current) = claims
                    .get_opt(claim)
                    .await
                    .map_err(kube_err(format!("get claim {claim}")))?
                else {
                    return Ok(());
                };
                if let Some(patch) = build::claim_owner_references_patch(&current) {
                    merge(&claims, claim, &patch, "claim ownerReferences").await?;
                }
            }
            Action::PatchRetentionPolicy {
                stateful_set,
                policy,
            } => {
                let policy: Value =
                    serde_json::from_str(policy).map_err(|e| ClusterError::Invalid {
                        what: "retention policy".into(),
                        reason: e.to_string(),
                    })?;
                let patch = json!({"spec": {"persistentVolumeClaimRetentionPolicy": policy}});
                merge(
                    &self.ns_api::<StatefulSet>(&ns),
                    stateful_set,
                    &patch,
                    "retention policy",
                )
                .await?;
            }
            Action::TransferLeadership { from, to } => {
                let (Ok(engine), Ok(report)) = (engine, &o.health) else {
                    return Err(ClusterError::Engine(EngineError::Other(
                        "no engine or health report to transfer leadership with".into(),
                    )));
                };
                engine.transfer_leadership(report, from, to).await?;
            }
            Action::AnnotateClaim { claim, key, value } => {
                let patch = json!({"metadata": {"annotations": {key: value}}});
                merge(
                    &self.ns_api::<PersistentVolumeClaim>(&ns),
                    claim,
                    &patch,
                    "claim annotation",
                )
                .await?;
            }
            Action::LabelVolume { volume } => {
                let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
                merge(
                    &pvs,
                    volume,
                    &build::migrated_by_label_patch(&name),
                    "label",
                )
                .await?;
            }
        }
        debug!(action = action_name(action), "done");
        Ok(())
    }
}

/// Whether the failpoint `name` is configured to `return` (cargo feature `failpoints`, env
/// `FAILPOINTS`); always false without the feature.
#[allow(unused_variables)]
pub fn failpoint_hit(name: &str) -> bool {
    #[cfg(feature = "failpoints")]
    {
        fail::fail_point!(name, |_| true);
    }
    false
}

/// Test fault injection (failpoint `copy-job-fails`): the copy Job's script is replaced by one
/// that reports an error and exits 23, so the Job really fails on the cluster.
fn inject_copy_failure(job: &mut Job) {
    let is_copy = job.labels().get(labels::JOB_KIND_LABEL).map(String::as_str)
        == Some(build::JobKind::Copy.as_str());
    if !is_copy || !failpoint_hit("copy-job-fails") {
        return;
    }
    warn!(job = %job.name_any(), "failpoint copy-job-fails: this copy Job will fail");
    let script = r#"printf '{"error":"injected failure (failpoint copy-job-fails)","exitCode":23}' > /dev/termination-log; exit 23"#;
    for c in job
        .spec
        .iter_mut()
        .flat_map(|s| s.template.spec.iter_mut())
        .flat_map(|s| s.containers.iter_mut())
    {
        c.command = Some(vec!["sh".into(), "-c".into(), script.into()]);
        c.args = None;
    }
}

/// A short name of an action for logs and failpoints (`Create-Job`, `Delete-Pod`, ...).
pub fn action_name(action: &Action) -> String {
    match action {
        Action::SetStatus(_) => "SetStatus".into(),
        Action::AddFinalizer => "AddFinalizer".into(),
        Action::RemoveFinalizer => "RemoveFinalizer".into(),
        Action::Event { .. } => "Event".into(),
        Action::Stash { .. } => "Stash".into(),
        Action::Create(o) => format!("Create-{:?}", o.kind()),
        Action::Delete { kind, .. } => format!("Delete-{kind:?}"),
        Action::PatchReclaimPolicy { .. } => "PatchReclaimPolicy".into(),
        Action::SetClaimRef { .. } => "SetClaimRef".into(),
        Action::RemoveOwnerReferences { .. } => "RemoveOwnerReferences".into(),
        Action::PatchRetentionPolicy { .. } => "PatchRetentionPolicy".into(),
        Action::TransferLeadership { .. } => "TransferLeadership".into(),
        Action::LabelVolume { .. } => "LabelVolume".into(),
        Action::AnnotateClaim { .. } => "AnnotateClaim".into(),
    }
}

fn fnv(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

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

async fn delete<K>(api: &Api<K>, name: &str, dp: &DeleteParams) -> Result<(), ClusterError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, dp).await {
        Ok(_) => Ok(()),
        // Gone already, or a successor with another uid (precondition failed): nothing to do.
        Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(()),
        Err(e) => Err(kube_err(format!("delete {name}"))(e)),
    }
}

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
