//! One-off mover pods and Jobs: their spec, running them, their outcome and logs.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Container, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec,
    PodTemplateSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, LogParams, PostParams};

use crate::testing::objects::claim_manifest;
use crate::testing::{TestError, TestNamespace, unexpected};

/// A claim mounted into a mover pod.
#[derive(Debug, Clone)]
pub struct ClaimMount {
    pub claim: String,
    pub mount_path: String,
    pub read_only: bool,
}

impl ClaimMount {
    pub fn new(claim: &str, mount_path: &str) -> Self {
        Self {
            claim: claim.to_string(),
            mount_path: mount_path.to_string(),
            read_only: false,
        }
    }
}

/// A one-off mover container: the mover image running `argv`, optionally pinned to a node.
#[derive(Debug, Clone)]
pub struct MoverSpec {
    pub name: String,
    pub argv: Vec<String>,
    /// Pin with required node affinity (`metadata.name In [node]`), never `spec.nodeName`:
    /// the scheduler must run so that WaitForFirstConsumer claims get a node.
    pub node: Option<String>,
    pub mounts: Vec<ClaimMount>,
}

impl MoverSpec {
    /// `sh -c SCRIPT` in the mover image.
    pub fn shell(name: &str, script: &str) -> Self {
        Self {
            name: name.to_string(),
            argv: vec!["sh".into(), "-c".into(), script.to_string()],
            node: None,
            mounts: Vec::new(),
        }
    }
    pub fn on_node(mut self, node: &str) -> Self {
        self.node = Some(node.to_string());
        self
    }
    pub fn mount(mut self, claim: &str, path: &str) -> Self {
        self.mounts.push(ClaimMount::new(claim, path));
        self
    }
}

/// How a one-off pod ended.
#[derive(Debug, Clone)]
pub struct PodOutcome {
    pub pod: String,
    pub node: Option<String>,
    /// `Succeeded` or `Failed`.
    pub phase: String,
    pub exit_code: Option<i32>,
    /// The container's termination message (with `FallbackToLogsOnError`, the log tail of a
    /// failed container).
    pub message: String,
    /// The container's log, or a note why it could not be read.
    pub logs: String,
}

impl PodOutcome {
    pub fn succeeded(&self) -> bool {
        self.phase == "Succeeded" && self.exit_code == Some(0)
    }
    /// Termination message and logs together, for assertions on output.
    pub fn output(&self) -> String {
        format!("{}\n{}", self.message, self.logs)
    }
}

/// How a Job ended, with its (last) pod.
#[derive(Debug, Clone)]
pub struct JobOutcome {
    pub job: String,
    pub complete: bool,
    pub pod: Option<PodOutcome>,
}

/// The pod spec of a one-off mover container (restartPolicy Never).
pub fn mover_pod_spec(image: &str, spec: &MoverSpec) -> PodSpec {
    let volumes: Vec<Volume> = spec
        .mounts
        .iter()
        .enumerate()
        .map(|(i, m)| Volume {
            name: format!("vol{i}"),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: m.claim.clone(),
                read_only: Some(m.read_only),
            }),
            ..Default::default()
        })
        .collect();
    let mounts: Vec<VolumeMount> = spec
        .mounts
        .iter()
        .enumerate()
        .map(|(i, m)| VolumeMount {
            name: format!("vol{i}"),
            mount_path: m.mount_path.clone(),
            read_only: Some(m.read_only),
            ..Default::default()
        })
        .collect();
    let affinity = spec.node.as_ref().map(|node| Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec![node.clone()]),
                    }]),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    PodSpec {
        restart_policy: Some("Never".into()),
        affinity,
        termination_grace_period_seconds: Some(5),
        // Root, as the operator's Jobs run: the project's image defaults to its nonroot user,
        // and a fresh volume's root directory belongs to root.
        security_context: Some(PodSecurityContext {
            run_as_user: Some(0),
            run_as_group: Some(0),
            ..Default::default()
        }),
        containers: vec![Container {
            name: "mover".into(),
            image: Some(image.to_string()),
            image_pull_policy: Some("IfNotPresent".into()),
            command: Some(spec.argv.clone()),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            volume_mounts: (!mounts.is_empty()).then_some(mounts),
            ..Default::default()
        }],
        volumes: (!volumes.is_empty()).then_some(volumes),
        ..Default::default()
    }
}

/// One line per interesting fact of a pod's state, for failure messages.
pub fn describe_pod(pod: &Pod) -> String {
    let Some(status) = pod.status.as_ref() else {
        return "no status".into();
    };
    let mut out = format!(
        "phase={} node={}",
        status.phase.as_deref().unwrap_or("?"),
        pod.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or("<unscheduled>")
    );
    for c in status.conditions.iter().flatten() {
        out.push_str(&format!(" {}={}", c.type_, c.status));
        if let Some(m) = &c.message {
            out.push_str(&format!("({m})"));
        }
    }
    for cs in status.container_statuses.iter().flatten() {
        out.push_str(&format!(
            " [{} ready={} restarts={}",
            cs.name, cs.ready, cs.restart_count
        ));
        if let Some(state) = &cs.state {
            if let Some(w) = &state.waiting {
                out.push_str(&format!(
                    " waiting {} {}",
                    w.reason.as_deref().unwrap_or(""),
                    w.message.as_deref().unwrap_or("")
                ));
            }
            if let Some(t) = &state.terminated {
                out.push_str(&format!(
                    " terminated exit={} {} {}",
                    t.exit_code,
                    t.reason.as_deref().unwrap_or(""),
                    t.message.as_deref().unwrap_or("")
                ));
            }
        }
        out.push(']');
    }
    out
}

impl TestNamespace {
    /// IP of a running pod.
    pub async fn pod_ip(&self, name: &str) -> Result<String, TestError> {
        let pod = self.api::<Pod>().get(name).await?;
        pod.status
            .and_then(|s| s.pod_ip)
            .filter(|ip| !ip.is_empty())
            .ok_or_else(|| unexpected(format!("pod {}/{name}", self.name), "has no IP"))
    }

    /// Creates a claim of `size` on `class`.
    pub async fn create_pvc(
        &self,
        name: &str,
        class: &str,
        size: &str,
    ) -> Result<PersistentVolumeClaim, TestError> {
        let claim = claim_manifest(name, class, size);
        Ok(self.api().create(&PostParams::default(), &claim).await?)
    }

    /// Creates a one-off mover pod (not waiting for it).
    pub async fn create_mover_pod(&self, spec: &MoverSpec) -> Result<Pod, TestError> {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(spec.name.clone()),
                labels: Some(BTreeMap::from([(
                    "e2e/mover".to_string(),
                    spec.name.clone(),
                )])),
                ..Default::default()
            },
            spec: Some(mover_pod_spec(&self.cluster.mover_image, spec)),
            status: None,
        };
        Ok(self.api().create(&PostParams::default(), &pod).await?)
    }

    /// Runs a one-off mover pod to its end and collects exit code, termination message and
    /// logs.
    pub async fn run_pod(
        &self,
        spec: &MoverSpec,
        timeout: Duration,
    ) -> Result<PodOutcome, TestError> {
        self.create_mover_pod(spec).await?;
        let pod = self.wait_pod_finished(&spec.name, timeout).await?;
        Ok(self.outcome_of(&pod).await)
    }

    /// Runs `script` in a one-off mover pod `name` on `node` with `claim` at `/data` to its end
    /// (the provisioner's volumes are local to their node, so beside a pod that mounts the claim
    /// too); its log. The pod is then deleted, so that it no longer counts as a user of the
    /// claim. An error when it did not succeed, with its outcome.
    pub async fn run_on_claim(
        &self,
        name: &str,
        node: &str,
        claim: &str,
        script: &str,
    ) -> Result<String, TestError> {
        let spec = MoverSpec::shell(name, script)
            .on_node(node)
            .mount(claim, "/data");
        let out = self.run_pod(&spec, Duration::from_secs(180)).await?;
        let _ = self
            .api::<Pod>()
            .delete(name, &DeleteParams::default())
            .await;
        if !out.succeeded() {
            return Err(TestError::Unexpected {
                what: format!("pod {name} on claim {claim}"),
                detail: out.output(),
            });
        }
        Ok(out.logs)
    }

    /// How a finished pod ended: phase, the `mover` container's exit code, termination message
    /// and log.
    pub async fn outcome_of(&self, pod: &Pod) -> PodOutcome {
        let name = pod.name_any();
        let status = pod.status.clone().unwrap_or_default();
        let terminated = status
            .container_statuses
            .iter()
            .flatten()
            .find(|c| c.name == "mover")
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.clone());
        let logs = match self
            .api::<Pod>()
            .logs(
                &name,
                &LogParams {
                    container: Some("mover".into()),
                    ..Default::default()
                },
            )
            .await
        {
            Ok(l) => l,
            Err(e) => format!("<logs unavailable: {e}>"),
        };
        PodOutcome {
            pod: name,
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            phase: status.phase.unwrap_or_default(),
            exit_code: terminated.as_ref().map(|t| t.exit_code),
            message: terminated.and_then(|t| t.message).unwrap_or_default(),
            logs,
        }
    }

    /// Runs a mover Job (backoffLimit 0, bounded by `timeout`) to its end; returns whether it
    /// completed and how its pod ended.
    pub async fn run_job(
        &self,
        spec: &MoverSpec,
        timeout: Duration,
    ) -> Result<JobOutcome, TestError> {
        let deadline = i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX).max(1);
        let job = Job {
            metadata: ObjectMeta {
                name: Some(spec.name.clone()),
                ..Default::default()
            },
            spec: Some(JobSpec {
                backoff_limit: Some(0),
                active_deadline_seconds: Some(deadline),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(BTreeMap::from([(
                            "e2e/mover".to_string(),
                            spec.name.clone(),
                        )])),
                        ..Default::default()
                    }),
                    spec: Some(mover_pod_spec(&self.cluster.mover_image, spec)),
                },
                ..Default::default()
            }),
            status: None,
        };
        let created = self
            .api::<Job>()
            .create(&PostParams::default(), &job)
            .await?;
        let uid = created.uid().unwrap_or_default();
        let (_, complete) = self
            .wait_job_finished(&spec.name, timeout + Duration::from_secs(30))
            .await?;
        // The Job's pods carry `controller-uid=<job uid>` on every Kubernetes version.
        let pods = self
            .api::<Pod>()
            .list(&ListParams::default().labels(&format!("controller-uid={uid}")))
            .await?;
        let mut pods = pods.items;
        pods.sort_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
        let pod = match pods.last() {
            // The Job is finished, but its pod's final status may lag a moment behind.
            Some(p) => {
                let p = self
                    .wait_pod_finished(&p.name_any(), Duration::from_secs(30))
                    .await
                    .unwrap_or_else(|_| p.clone());
                Some(self.outcome_of(&p).await)
            }
            None => None,
        };
        Ok(JobOutcome {
            job: spec.name.clone(),
            complete,
            pod,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mover_pod_is_pinned_by_affinity_not_node_name() {
        let spec = MoverSpec::shell("fill", "dd if=/dev/zero of=/data/f")
            .on_node("node-b")
            .mount("small", "/data");
        let pod = mover_pod_spec(crate::testing::DEFAULT_MOVER_IMAGE, &spec);
        assert_eq!(pod.node_name, None);
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        let terms = pod
            .affinity
            .unwrap()
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        let field = &terms[0].match_fields.as_ref().unwrap()[0];
        assert_eq!(field.key, "metadata.name");
        assert_eq!(field.values.as_deref(), Some(&["node-b".to_string()][..]));
        let c = &pod.containers[0];
        assert_eq!(c.command.as_ref().unwrap()[0], "sh");
        assert_eq!(
            c.termination_message_policy.as_deref(),
            Some("FallbackToLogsOnError")
        );
        assert_eq!(c.volume_mounts.as_ref().unwrap()[0].mount_path, "/data");
        let vol = &pod.volumes.unwrap()[0];
        assert_eq!(
            vol.persistent_volume_claim.as_ref().unwrap().claim_name,
            "small"
        );
    }
}
