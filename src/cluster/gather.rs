//! Gathering the [`Observed`] snapshot the planner decides on: one function per kind of thing
//! gathered; those that do not depend on each other run concurrently.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::autoscaling::v1::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Event, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ListParams};
use kube::{ResourceExt, api::ObjectList};

use super::Engine;
use super::error::{ClusterError, kube_err};
use super::{Cluster, namespace};
use crate::api::{
    Stage, StorageMigrationRequest, StorageMigrationRequestSpec, StorageMigrationRequestStatus,
    TargetKind,
};
use crate::build::Manifest;
use crate::engine::{self, FinalHashError, HealthReport, HealthUnavailable};
use crate::labels;
use crate::plan::observe::{
    ClaimUser, Workload, claim_users, copy_log_pod, effective_spec, expected_members, job_outcome,
    may_target, measured_bytes, nodes_to_judge, pods_behind_jobs, reads_claim_users,
    reads_other_requests, reads_storage_classes, target_claim_users, target_workload,
};
use crate::plan::{self, Autoscaler, Observed, ObservedJob, OtherRequest};

/// Lines of a running copy's log read for its progress (one update a line; the summary that
/// follows the last one is shorter than this).
const COPY_LOG_TAIL_LINES: i64 = 40;

/// How many reads of one kind (the volumes, one GET each) are in flight at once.
const PARALLEL_READS: usize = 8;

/// Our Jobs with their outcome, and our helper pods, by name.
type JobsAndHelpers = (BTreeMap<String, ObservedJob>, BTreeMap<String, Pod>);

impl Cluster {
    /// Gathers the snapshot the planner decides on. Reads that do not depend on each other run
    /// at once, in three waves: everything the request names; then the member pods (by the
    /// set's selector) and the volumes (of the claims); then the database's view and the Nodes
    /// (of the pods).
    pub async fn gather(
        &self,
        req: StorageMigrationRequest,
        engine: &Result<Engine, String>,
    ) -> Result<Observed, ClusterError> {
        let ns = namespace(&req)?;
        let name = req.name_any();
        let status = req.status.clone().unwrap_or_default();
        let spec = effective_spec(&req);
        let (target_claim_users, listed) = self.target_claim_users(&ns, &spec, &status).await?;
        let workload = target_workload(&spec, &status, &target_claim_users);
        // `join!`, not `try_join!`, then the errors in a fixed order: a read that fails (RBAC, an
        // unreachable API server) is reported the same way every time, not by which one lost
        // a race.
        let (target, stash, jobs, claims, storage_classes) = tokio::join!(
            self.workload_objects(&ns, &workload),
            self.stash(&req, &ns, &status),
            self.jobs(&ns, &name, &status),
            self.claims(&ns),
            self.storage_classes(&status),
        );
        let ((stateful_set, deployment), stash, (jobs, helper_pods), claims, storage_classes) =
            (target?, stash?, jobs?, claims?, storage_classes?);
        let selector = workload_selector(
            stateful_set.as_ref().or(stash.stateful_set.as_ref()),
            deployment.as_ref(),
        );
        let (pods, volumes, other_requests, namespace_labels, budgets, claim_users) = tokio::join!(
            self.member_pods(&ns, selector, workload.pod()),
            self.volumes(&claims, &status),
            self.other_requests(&ns, &name, &workload, &status),
            self.namespace_labels(&ns, &status),
            self.budgets(&ns, &status),
            self.claim_users(&ns, &status, listed.as_deref()),
        );
        let (pods, volumes, other_requests, namespace_labels, budgets, claim_users) = (
            pods?,
            volumes?,
            other_requests?,
            namespace_labels?,
            budgets?,
            claim_users?,
        );
        let expected = expected_members(&status, stateful_set.as_deref(), workload.stateful_set());
        let member_pods: Vec<Pod> = expected
            .iter()
            .filter_map(|p| pods.get(p).map(|p| p.typed().clone()))
            .collect();
        let (health, final_hash, nodes, autoscalers) = tokio::join!(
            gather_health(engine, &status, &member_pods, &expected),
            gather_final_hash(engine, &status, &member_pods),
            self.nodes(&status, &pods, &helper_pods),
            self.autoscalers(&ns, &status, &workload),
        );
        let autoscalers = autoscalers?;
        Ok(Observed {
            request: req,
            now: k8s_openapi::jiff::Timestamp::now(),
            namespace_labels,
            stateful_set,
            stash,
            pods,
            helper_pods,
            claims,
            volumes,
            jobs,
            storage_classes,
            other_requests,
            budgets,
            health,
            final_hash,
            nodes: nodes?,
            copy_holders: Vec::new(),
            claim_users,
            target_claim_users,
            deployment,
            autoscalers,
        })
    }

    /// The pods that mount the target claim, with their controllers: read in Preflight for a
    /// claim target (`target.kind: PersistentVolumeClaim`), the workload it works on is found
    /// from them; none otherwise. With the namespace's pods so listed, which
    /// [`Cluster::claim_users`] then reads instead of listing them again.
    async fn target_claim_users(
        &self,
        ns: &str,
        spec: &StorageMigrationRequestSpec,
        status: &StorageMigrationRequestStatus,
    ) -> Result<(Vec<ClaimUser>, Option<Vec<Pod>>), ClusterError> {
        if spec.target.kind != TargetKind::PersistentVolumeClaim
            || status.stage != Stage::Preflight
            || status.phase.is_final()
        {
            return Ok((Vec::new(), None));
        }
        let pods = self.namespace_pods(ns).await?;
        let mut users = target_claim_users(&pods, &spec.target.name);
        for user in &mut users {
            if let Some((kind, name)) = &user.owner
                && kind == "ReplicaSet"
                && let Some(deployment) = self.deployment_of(ns, name).await?
            {
                user.owner = Some(("Deployment".to_string(), deployment));
            }
        }
        Ok((users, Some(pods)))
    }

    /// Every pod of the namespace.
    async fn namespace_pods(&self, ns: &str) -> Result<Vec<Pod>, ClusterError> {
        let pods = self
            .ns_api::<Pod>(ns)
            .list(&ListParams::default())
            .await
            .map_err(kube_err("list pods"))?;
        Ok(pods.items)
    }

    /// The Deployment that controls ReplicaSet `name`, if any.
    async fn deployment_of(&self, ns: &str, name: &str) -> Result<Option<String>, ClusterError> {
        let set = self
            .ns_api::<ReplicaSet>(ns)
            .get_opt(name)
            .await
            .map_err(kube_err(format!("get ReplicaSet {name}")))?;
        let controller = set.as_ref().and_then(plan::controller_ref);
        Ok(controller
            .filter(|o| o.kind == "Deployment")
            .map(|o| o.name.clone()))
    }

    /// The workload's StatefulSet and Deployment, each when it is one and exists. The set is raw
    /// JSON: it is stashed as returned, so that fields our API structs do not know survive its
    /// recreation (see `build::manifest`).
    async fn workload_objects(
        &self,
        ns: &str,
        workload: &Workload,
    ) -> Result<(Option<Manifest<StatefulSet>>, Option<Deployment>), ClusterError> {
        let set = self
            .get_raw::<StatefulSet>(ns, workload.stateful_set())
            .await?;
        Ok((set, self.deployment(ns, workload.deployment()).await?))
    }

    /// The target Deployment, if it exists (none asked for: `name` empty).
    async fn deployment(&self, ns: &str, name: &str) -> Result<Option<Deployment>, ClusterError> {
        if name.is_empty() {
            return Ok(None);
        }
        self.ns_api::<Deployment>(ns)
            .get_opt(name)
            .await
            .map_err(kube_err(format!("get Deployment {name}")))
    }

    /// The HorizontalPodAutoscalers of the namespace, read in Preflight of a Deployment's claim
    /// only (empty otherwise).
    async fn autoscalers(
        &self,
        ns: &str,
        status: &StorageMigrationRequestStatus,
        workload: &Workload,
    ) -> Result<Vec<Autoscaler>, ClusterError> {
        if status.stage != Stage::Preflight
            || status.phase.is_final()
            || !matches!(workload, Workload::Deployment(_))
        {
            return Ok(Vec::new());
        }
        let list = self
            .ns_api::<HorizontalPodAutoscaler>(ns)
            .list(&ListParams::default())
            .await
            .map_err(kube_err("list HorizontalPodAutoscalers"))?;
        Ok(list.items.iter().map(autoscaler).collect())
    }

    /// The pods of the namespace by the claims they mount ([`claim_users`]), read only when
    /// the planner checks them ([`reads_claim_users`]); from `listed` when this gather already
    /// listed them.
    async fn claim_users(
        &self,
        ns: &str,
        status: &StorageMigrationRequestStatus,
        listed: Option<&[Pod]>,
    ) -> Result<BTreeMap<String, Vec<String>>, ClusterError> {
        if !reads_claim_users(status) {
            return Ok(BTreeMap::new());
        }
        match listed {
            Some(pods) => Ok(claim_users(pods)),
            None => Ok(claim_users(&self.namespace_pods(ns).await?)),
        }
    }

    /// The Nodes of the member and helper pods that are terminating (`None`: no such Node);
    /// none otherwise, so a request with no pod terminating reads no Node.
    async fn nodes(
        &self,
        status: &StorageMigrationRequestStatus,
        pods: &BTreeMap<String, Manifest<Pod>>,
        helper_pods: &BTreeMap<String, Pod>,
    ) -> Result<BTreeMap<String, Option<Node>>, ClusterError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let mut nodes = BTreeMap::new();
        if status.phase.is_final() {
            return Ok(nodes);
        }
        for name in nodes_to_judge(status, pods, helper_pods) {
            let node = api
                .get_opt(&name)
                .await
                .map_err(kube_err(format!("get node {name}")))?;
            nodes.insert(name, node);
        }
        Ok(nodes)
    }

    /// Member pods: by the workload's selector (the set's, live or stashed, or the
    /// Deployment's), or the bare pod of a claim target; never our own helper pods; raw JSON
    /// too, as a member pod is stashed as returned. None without either.
    async fn member_pods(
        &self,
        ns: &str,
        selector: Option<String>,
        bare_pod: &str,
    ) -> Result<BTreeMap<String, Manifest<Pod>>, ClusterError> {
        let mut pods = BTreeMap::new();
        // A bare pod by its name (a list, as for the others: no `get` of pods is granted).
        let params = match (selector, bare_pod) {
            (Some(selector), _) => ListParams::default().labels(&selector),
            (None, "") => return Ok(pods),
            (None, pod) => ListParams::default().fields(&format!("metadata.name={pod}")),
        };
        for p in self.list_raw::<Pod>(ns, &params).await? {
            if !p.labels().contains_key(labels::REQUEST_LABEL) {
                pods.insert(p.name_any(), p);
            }
        }
        Ok(pods)
    }

    /// Our Jobs (with how they ended) and our helper pods. Jobs before their pods: a Job seen
    /// Complete then has its pod's final status (and termination message) in the pod list
    /// taken after it.
    async fn jobs(
        &self,
        ns: &str,
        request: &str,
        status: &StorageMigrationRequestStatus,
    ) -> Result<JobsAndHelpers, ClusterError> {
        let owned = ListParams::default().labels(&labels::owned_selector(request));
        let job_list = self
            .ns_api::<Job>(ns)
            .list(&owned)
            .await
            .map_err(kube_err("list jobs"))?;
        let mut helper_pods = by_name(list_owned_pods(self.client.clone(), ns, &owned).await?);
        if pods_behind_jobs(&job_list.items, &helper_pods) {
            // Kept from before a Job ended (`read_cache`): read as they are now, which shows
            // the end of every Job that has ended.
            helper_pods = by_name(list_owned_pods(self.read_now(), ns, &owned).await?);
        }
        let mut jobs = BTreeMap::new();
        for job in job_list {
            let name = job.name_any();
            let outcome = job_outcome(&job, &helper_pods);
            let progress = match copy_log_pod(&job, &outcome, &helper_pods) {
                Some((pod, pass)) => {
                    let measured = measured_bytes(&job, status);
                    self.copy_progress(ns, &pod, pass, measured).await
                }
                None => None,
            };
            let podless = plan::helpers::job_pods(&name, &helper_pods).is_empty();
            let refused = if outcome == plan::JobOutcome::Running && podless {
                self.failed_create(ns, &name).await?
            } else {
                None
            };
            let observed = ObservedJob {
                job,
                outcome,
                progress,
                refused,
            };
            jobs.insert(name, observed);
        }
        Ok((jobs, helper_pods))
    }

    /// The latest progress line in the last lines of a copy pod's log. Best effort: a log that
    /// cannot be read (the pod just ended, the node is unreachable) gives no reading, and the
    /// status keeps the previous one.
    async fn copy_progress(
        &self,
        ns: &str,
        pod: &str,
        pass: crate::api::CopyPass,
        measured: Option<i64>,
    ) -> Option<crate::api::CopyProgress> {
        let params = kube::api::LogParams {
            container: Some(crate::build::job::JOB_CONTAINER.to_string()),
            tail_lines: Some(COPY_LOG_TAIL_LINES),
            ..Default::default()
        };
        match self.ns_api::<Pod>(ns).logs(pod, &params).await {
            Ok(log) => crate::build::parse_progress(&log, pass, measured),
            Err(e) => {
                tracing::debug!(pod, error = %e, "cannot read the copy's log");
                None
            }
        }
    }

    /// The message of the newest `FailedCreate` Event of Job `name`: why the API server refused
    /// its pod. Read only for a running Job that has no pod.
    async fn failed_create(&self, ns: &str, name: &str) -> Result<Option<String>, ClusterError> {
        let fields =
            format!("involvedObject.kind=Job,involvedObject.name={name},reason=FailedCreate");
        let events = self
            .ns_api::<Event>(ns)
            .list(&ListParams::default().fields(&fields))
            .await
            .map_err(kube_err(format!("list FailedCreate events of Job {name}")))?;
        Ok(events
            .items
            .into_iter()
            .max_by_key(|e| e.last_timestamp.as_ref().map(|t| t.0))
            .and_then(|e| e.message))
    }

    /// The labels of the request's namespace, read only in Preflight (its Pod Security level);
    /// empty in other stages.
    async fn namespace_labels(
        &self,
        ns: &str,
        status: &StorageMigrationRequestStatus,
    ) -> Result<BTreeMap<String, String>, ClusterError> {
        if status.phase.is_final() || status.stage != Stage::Preflight {
            return Ok(BTreeMap::new());
        }
        let namespace = Api::<Namespace>::all(self.client.clone())
            .get(ns)
            .await
            .map_err(kube_err(format!("get namespace {ns}")))?;
        Ok(namespace.metadata.labels.unwrap_or_default())
    }

    /// Every claim of the namespace.
    async fn claims(
        &self,
        ns: &str,
    ) -> Result<BTreeMap<String, PersistentVolumeClaim>, ClusterError> {
        let claims = self
            .ns_api::<PersistentVolumeClaim>(ns)
            .list(&ListParams::default())
            .await
            .map_err(kube_err("list claims"))?;
        Ok(by_name(claims))
    }

    /// The volumes of [`volume_names`] that exist: from the [`super::VolumeCache`] when it
    /// keeps one and it is not to be read now (`Cluster::reading_volumes_now`), else read now.
    async fn volumes(
        &self,
        claims: &BTreeMap<String, PersistentVolumeClaim>,
        status: &StorageMigrationRequestStatus,
    ) -> Result<BTreeMap<String, PersistentVolume>, ClusterError> {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let cache = self.volumes.as_deref();
        let reads = volume_names(claims, status).into_iter().map(|v| {
            let pvs = &pvs;
            async move {
                let kept = cache.filter(|_| !self.volumes_now.contains(&v));
                if let Some(pv) = kept.and_then(|c| c.get(&v)) {
                    return Ok(Some((v, pv)));
                }
                let begun = cache.map(|c| c.begin(&v));
                let pv = pvs
                    .get_opt(&v)
                    .await
                    .map_err(kube_err(format!("get PV {v}")))?;
                if let Some((c, begun)) = cache.zip(begun) {
                    c.keep(&v, pv.as_ref(), begun);
                }
                Ok::<_, ClusterError>(pv.map(|pv| (v, pv)))
            }
        });
        let read: Vec<Option<(String, PersistentVolume)>> = futures::stream::iter(reads)
            .buffered(PARALLEL_READS)
            .try_collect()
            .await?;
        Ok(read.into_iter().flatten().collect())
    }

    /// Every StorageClass, read only when the planner looks at them
    /// ([`reads_storage_classes`]); none otherwise.
    pub(super) async fn storage_classes(
        &self,
        status: &StorageMigrationRequestStatus,
    ) -> Result<BTreeMap<String, StorageClass>, ClusterError> {
        if !reads_storage_classes(status) {
            return Ok(BTreeMap::new());
        }
        let classes = Api::<StorageClass>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(kube_err("list StorageClasses"))?;
        Ok(by_name(classes))
    }

    /// The other requests of the namespace on the same target (by their effective spec), read
    /// only when the planner looks at them ([`reads_other_requests`]); none otherwise.
    pub(super) async fn other_requests(
        &self,
        ns: &str,
        name: &str,
        workload: &Workload,
        status: &StorageMigrationRequestStatus,
    ) -> Result<Vec<OtherRequest>, ClusterError> {
        if !reads_other_requests(status) {
            return Ok(Vec::new());
        }
        let requests = self
            .ns_api::<StorageMigrationRequest>(ns)
            .list(&ListParams::default())
            .await
            .map_err(kube_err("list requests"))?;
        Ok(requests
            .into_iter()
            .filter(|r| r.name_any() != name && may_target(r, workload))
            .map(|r| OtherRequest {
                name: r.name_any(),
                created: r.metadata.creation_timestamp.as_ref().map(|t| t.0),
                phase: r.status.as_ref().map(|s| s.phase).unwrap_or_default(),
            })
            .collect())
    }
}

/// Our helper pods of `ns` (`owned`: the request's selector), read through `client`.
async fn list_owned_pods(
    client: kube::Client,
    ns: &str,
    owned: &ListParams,
) -> Result<ObjectList<Pod>, ClusterError> {
    let pods = Api::<Pod>::namespaced(client, ns).list(owned).await;
    pods.map_err(kube_err("list helper pods"))
}

/// The engine's view of the members, only where the planner uses it
/// ([`crate::plan::reads_health`]); members it did not report are noted as missing.
async fn gather_health(
    engine: &Result<Engine, String>,
    status: &StorageMigrationRequestStatus,
    member_pods: &[Pod],
    expected: &[String],
) -> Result<HealthReport, HealthUnavailable> {
    let wants_health = crate::plan::reads_health(status);
    match engine {
        Err(e) => Err(HealthUnavailable::NoEngine(e.clone())),
        Ok(_) if !wants_health => Err(HealthUnavailable::NotObservedInStage),
        Ok(engine) => match engine.observe(member_pods).await {
            Ok(mut report) => {
                engine::note_missing_pods(&mut report, expected);
                if crate::plan::observe::in_preflight(status) {
                    (report.problems).extend(engine.preflight_problems(member_pods).await);
                }
                Ok(report)
            }
            Err(e) => Err(HealthUnavailable::Engine(e.to_string())),
        },
    }
}

/// The engine's final hash, in the Finalizing stage until it is recorded (`None` elsewhere).
async fn gather_final_hash(
    engine: &Result<Engine, String>,
    status: &StorageMigrationRequestStatus,
    member_pods: &[Pod],
) -> Option<Result<Option<engine::FinalHash>, FinalHashError>> {
    match engine {
        Ok(engine)
            if status.stage == Stage::Finalizing
                && status.final_hash.is_none()
                && !status.phase.is_final() =>
        {
            Some(crate::failpoints::final_hash(
                engine
                    .final_hash(member_pods)
                    .await
                    .map_err(FinalHashError::from),
            ))
        }
        _ => None,
    }
}

/// The set's `matchLabels` as a label selector (`None` without any).
/// The pods of the workload, as a label query: the StatefulSet's (live or stashed), else the
/// Deployment's.
fn workload_selector(
    set: Option<&Manifest<StatefulSet>>,
    deployment: Option<&Deployment>,
) -> Option<String> {
    let set = set.and_then(|s| s.spec.as_ref()).map(|s| &s.selector);
    let deployment = deployment
        .and_then(|d| d.spec.as_ref())
        .map(|s| &s.selector);
    set.or(deployment).and_then(selector)
}

/// A workload's selector as a label query (its `matchLabels`; none when it has none).
fn selector(selector: &LabelSelector) -> Option<String> {
    selector
        .match_labels
        .as_ref()
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
}

/// The volumes that matter: every volume the request names (old and new, of every claim of
/// every member: [`plan::claims`]), and those bound to the claims it names (a member's claim, its
/// temporary claim). Before there is a plan (Preflight), those bound to every claim of the
/// namespace: the plan is made from them. So a round of a migration reads the volumes of its
/// members, however many other claims the namespace has.
fn volume_names(
    claims: &BTreeMap<String, PersistentVolumeClaim>,
    status: &StorageMigrationRequestStatus,
) -> BTreeSet<String> {
    let named = plan::claims::request_claims(status);
    let matters = |claim: &str| {
        named.is_empty()
            || named
                .iter()
                .any(|c| c.claim() == claim || c.temp_claim() == claim)
    };
    let mut names: BTreeSet<String> = claims
        .iter()
        .filter(|(name, _)| matters(name))
        .filter_map(|(_, c)| plan::claim_volume(c).map(str::to_string))
        .collect();
    let named_volumes = named.iter().flat_map(|c| c.volumes());
    names.extend(named_volumes.map(|(_, v)| v.to_string()));
    names
}

/// A list's objects by name.
fn by_name<K: ResourceExt + Clone>(list: ObjectList<K>) -> BTreeMap<String, K> {
    list.into_iter().map(|o| (o.name_any(), o)).collect()
}

/// What an autoscaler scales.
fn autoscaler(hpa: &HorizontalPodAutoscaler) -> Autoscaler {
    let target = hpa.spec.as_ref().map(|s| &s.scale_target_ref);
    Autoscaler {
        name: hpa.name_any(),
        target_kind: target.map(|t| t.kind.clone()).unwrap_or_default(),
        target_name: target.map(|t| t.name.clone()).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MemberStatus, Plan, PlannedMember};
    use crate::plan::fixtures;

    #[test]
    fn the_selector_is_the_sets_match_labels() {
        let mut set = fixtures::stateful_set(3);
        let of = |s: &StatefulSet| selector(&s.spec.clone().unwrap_or_default().selector);
        assert_eq!(of(&set).as_deref(), Some("app=etcd"));
        if let Some(spec) = set.spec.as_mut() {
            spec.selector.match_labels = Some(BTreeMap::new());
        }
        assert_eq!(of(&set), None);
        assert_eq!(of(&StatefulSet::default()), None);
    }

    /// With a [`super::super::VolumeCache`], a volume is read once, then taken from the cache
    /// until the watch reports another version of it; then read again.
    #[tokio::test]
    async fn volumes_come_from_the_cache_until_the_watch_sees_them_change() {
        use super::super::mock::{Exchange, verify};
        use http::Method;
        use serde_json::json;
        let cache = std::sync::Arc::new(super::super::VolumeCache::default());
        let claim = fixtures::bound_claim("data-etcd-0", "standard", "1Gi", "pv-old-0");
        let claims = BTreeMap::from([("data-etcd-0".to_string(), claim)]);
        let pv = |version: &str| {
            json!({"apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": "pv-old-0", "resourceVersion": version}})
        };
        let path = "/api/v1/persistentvolumes/pv-old-0";
        let exchanges = vec![
            Exchange::new(Method::GET, path).returns(pv("7")),
            Exchange::new(Method::GET, path).returns(pv("8")),
        ];
        let watched = cache.clone();
        let versions = verify(exchanges, move |cluster| async move {
            let cluster = cluster.with_volume_cache(watched.clone());
            let status = StorageMigrationRequestStatus::default();
            let mut versions = Vec::new();
            for round in 0..4 {
                if round == 2 {
                    let mut changed = PersistentVolume::default();
                    changed.metadata.name = Some("pv-old-0".into());
                    changed.metadata.resource_version = Some("8".into());
                    watched.saw(&Ok(kube::runtime::watcher::Event::Apply(changed)));
                }
                let read = cluster.volumes(&claims, &status).await.unwrap();
                versions.push(read.get("pv-old-0").and_then(|v| v.resource_version()));
            }
            versions
        })
        .await;
        let v = |s: &str| Some(s.to_string());
        assert_eq!(versions, [v("7"), v("7"), v("8"), v("8")]);
    }

    #[test]
    fn volume_names_are_the_planned_the_new_and_those_of_the_claims_the_plan_names() {
        let bound = |claim: &str, volume: &str| {
            let c = fixtures::bound_claim(claim, "standard", "1Gi", volume);
            (claim.to_string(), c)
        };
        let claims = BTreeMap::from([
            bound("data-etcd-0", "pv-old-0"),
            bound("data-etcd-1", "pv-old-1"),
            bound("tmp-data-etcd-1", "pv-temp-1"),
            bound("unrelated", "pv-unrelated"),
        ]);
        let planned = |pod: &str| PlannedMember {
            pod: pod.into(),
            claim: format!("data-{pod}"),
            temp_claim: format!("tmp-data-{pod}"),
            old_volume: format!("pv-old-{}", &pod[pod.len() - 1..]),
            ..Default::default()
        };
        let mut status = StorageMigrationRequestStatus {
            plan: Some(Plan {
                members: vec![planned("etcd-1"), planned("etcd-2")],
                ..Default::default()
            }),
            members: vec![MemberStatus {
                pod: "etcd-2".into(),
                first_claim: crate::api::ClaimStatus {
                    new_volume: Some("pv-new-2".into()),
                    ..Default::default()
                },
                ..Default::default()
            }],
            ..Default::default()
        };
        let names: Vec<String> = volume_names(&claims, &status).into_iter().collect();
        assert_eq!(names, ["pv-new-2", "pv-old-1", "pv-old-2", "pv-temp-1"]);
        // No plan yet (Preflight): every bound claim's volume.
        status.plan = None;
        let names: Vec<String> = volume_names(&claims, &status).into_iter().collect();
        assert_eq!(names, ["pv-old-0", "pv-old-1", "pv-temp-1", "pv-unrelated"]);
    }
}
