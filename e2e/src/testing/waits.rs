//! Waits of a [`TestNamespace`]: each one a watch bounded by a timeout, whose error says what
//! was awaited and the object's last state.

use std::fmt::Debug;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event as CoreEvent, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::wait::{Condition, await_condition};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::testing::pods::describe_pod;
use crate::testing::{TestError, TestNamespace, unexpected};

fn pod_is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn job_finished(job: &Job) -> Option<bool> {
    let conds = job.status.as_ref()?.conditions.as_ref()?;
    if conds
        .iter()
        .any(|c| c.type_ == "Complete" && c.status == "True")
    {
        Some(true)
    } else if conds
        .iter()
        .any(|c| c.type_ == "Failed" && c.status == "True")
    {
        Some(false)
    } else {
        None
    }
}

impl TestNamespace {
    /// Waits (watch + timeout) until `cond` holds for the object `name` of `api`; returns the
    /// object (None when the condition is met by its absence). On timeout, the error holds
    /// `describe` of the object's last state.
    pub async fn wait_for<K>(
        &self,
        api: Api<K>,
        name: &str,
        what: &str,
        timeout: Duration,
        cond: impl Condition<K>,
        describe: impl Fn(&K) -> String,
    ) -> Result<Option<K>, TestError>
    where
        K: Clone + Debug + Send + DeserializeOwned + Resource + 'static,
    {
        let what = format!("{what} ({}/{name})", self.name);
        match tokio::time::timeout(timeout, await_condition(api.clone(), name, cond)).await {
            Ok(Ok(obj)) => Ok(obj),
            Ok(Err(e)) => Err(TestError::Watch {
                what,
                detail: e.to_string(),
            }),
            Err(_) => {
                let last = match api.get_opt(name).await {
                    Ok(Some(obj)) => describe(&obj),
                    Ok(None) => "object does not exist".to_string(),
                    Err(e) => format!("cannot read it: {e}"),
                };
                let events = self.events_for(name).await.unwrap_or_default();
                Err(TestError::Timeout {
                    what,
                    waited: timeout,
                    last: format!("{last}; events: [{}]", events.join("; ")),
                })
            }
        }
    }

    /// `reason: message` of the events about object `name` in this namespace, oldest first.
    pub async fn events_for(&self, name: &str) -> Result<Vec<String>, TestError> {
        let api: Api<CoreEvent> = self.api();
        let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
        let mut events = api.list(&lp).await?.items;
        events.sort_by_key(|e| {
            e.last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or_else(|| e.event_time.as_ref().map(|t| t.0))
        });
        Ok(events
            .iter()
            .map(|e| {
                format!(
                    "{}: {}",
                    e.reason.as_deref().unwrap_or(""),
                    e.message.as_deref().unwrap_or("")
                )
            })
            .collect())
    }

    /// The events about `name` (as [`Self::events_for`]) once one with reason `last` is there.
    /// The operator writes a step's status before its events, so a test that saw a request's
    /// final phase waits for the final event before it reads them all.
    pub async fn events_through(
        &self,
        name: &str,
        last: &str,
        timeout: Duration,
    ) -> Result<Vec<String>, TestError> {
        self.wait_for_event(name, last, timeout).await?;
        self.events_for(name).await
    }

    /// Waits for an event with `reason` about object `name` (watch + timeout); returns its
    /// message.
    pub async fn wait_for_event(
        &self,
        name: &str,
        reason: &str,
        timeout: Duration,
    ) -> Result<String, TestError> {
        let api: Api<CoreEvent> = self.api();
        let config = watcher::Config::default()
            .fields(&format!("involvedObject.name={name},reason={reason}"));
        let mut stream = watcher::watcher(api, config).applied_objects().boxed();
        let what = format!("event {reason} on {}/{name}", self.name);
        match tokio::time::timeout(timeout, stream.try_next()).await {
            Ok(Ok(Some(ev))) => Ok(ev.message.unwrap_or_default()),
            Ok(Ok(None)) => Err(TestError::Watch {
                what,
                detail: "watch ended".into(),
            }),
            Ok(Err(e)) => Err(TestError::Watch {
                what,
                detail: e.to_string(),
            }),
            Err(_) => Err(TestError::Timeout {
                what,
                waited: timeout,
                last: format!(
                    "events: [{}]",
                    self.events_for(name).await.unwrap_or_default().join("; ")
                ),
            }),
        }
    }

    /// Waits until pod `name` is Ready.
    pub async fn wait_pod_ready(&self, name: &str, timeout: Duration) -> Result<Pod, TestError> {
        let cond = |p: Option<&Pod>| p.is_some_and(pod_is_ready);
        self.wait_for(self.api(), name, "pod Ready", timeout, cond, describe_pod)
            .await?
            .ok_or_else(|| unexpected(name, "pod vanished"))
    }

    /// Waits until pod `name` is Succeeded or Failed.
    pub async fn wait_pod_finished(&self, name: &str, timeout: Duration) -> Result<Pod, TestError> {
        let cond = |p: Option<&Pod>| p.is_some_and(pod_is_finished);
        self.wait_for(
            self.api(),
            name,
            "pod finished",
            timeout,
            cond,
            describe_pod,
        )
        .await?
        .ok_or_else(|| unexpected(name, "pod vanished"))
    }

    /// Waits until StatefulSet `name` has `replicas` ready replicas (and wants that many).
    pub async fn wait_statefulset_ready(
        &self,
        name: &str,
        replicas: i32,
        timeout: Duration,
    ) -> Result<StatefulSet, TestError> {
        let cond = move |s: Option<&StatefulSet>| {
            s.is_some_and(|s| {
                let want = s.spec.as_ref().and_then(|sp| sp.replicas).unwrap_or(1);
                let ready = s
                    .status
                    .as_ref()
                    .and_then(|st| st.ready_replicas)
                    .unwrap_or(0);
                want == replicas && ready == replicas
            })
        };
        let describe = |s: &StatefulSet| {
            let st = s.status.clone().unwrap_or_default();
            format!(
                "replicas={} ready={} current={}",
                st.replicas,
                st.ready_replicas.unwrap_or(0),
                st.current_replicas.unwrap_or(0)
            )
        };
        let what = format!("StatefulSet {replicas}/{replicas} ready");
        let sts = match self
            .wait_for(self.api(), name, &what, timeout, cond, describe)
            .await
        {
            Err(TestError::Timeout { what, waited, last }) => {
                let pods = self.unready_pods_of(name).await;
                return Err(TestError::Timeout {
                    what,
                    waited,
                    last: format!("{last}; pods not Ready: [{pods}]"),
                });
            }
            other => other?,
        };
        sts.ok_or_else(|| unexpected(name, "StatefulSet vanished"))
    }

    /// For a timeout's message: each pod of StatefulSet `set` that is not Ready, with its state
    /// and its events (e.g. why it cannot be scheduled).
    async fn unready_pods_of(&self, set: &str) -> String {
        let api: Api<Pod> = self.api();
        let pods = match api.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(e) => return format!("cannot list pods: {e}"),
        };
        let prefix = format!("{set}-");
        let mut out = Vec::new();
        for pod in pods.iter().filter(|p| !pod_is_ready(p)) {
            let name = pod.name_any();
            if !name.starts_with(&prefix) {
                continue;
            }
            let events = self.events_for(&name).await.unwrap_or_default();
            out.push(format!(
                "{name}: {} events: [{}]",
                describe_pod(pod),
                events.join("; ")
            ));
        }
        out.join("; ")
    }

    /// Waits until claim `name` is Bound; returns it.
    pub async fn wait_pvc_bound(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<PersistentVolumeClaim, TestError> {
        let cond = |c: Option<&PersistentVolumeClaim>| {
            c.and_then(|c| c.status.as_ref())
                .and_then(|s| s.phase.as_deref())
                == Some("Bound")
        };
        let describe = |c: &PersistentVolumeClaim| {
            format!(
                "phase={} volumeName={} annotations={:?}",
                c.status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .unwrap_or("?"),
                c.spec
                    .as_ref()
                    .and_then(|s| s.volume_name.as_deref())
                    .unwrap_or(""),
                c.annotations()
            )
        };
        self.wait_for(self.api(), name, "claim Bound", timeout, cond, describe)
            .await?
            .ok_or_else(|| unexpected(name, "claim vanished"))
    }

    /// Waits until a Job has a Complete or Failed condition; returns it and whether it completed.
    pub async fn wait_job_finished(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<(Job, bool), TestError> {
        let cond = |j: Option<&Job>| j.and_then(job_finished).is_some();
        let describe = |j: &Job| {
            let st = j.status.clone().unwrap_or_default();
            format!(
                "active={} succeeded={} failed={} conditions={:?}",
                st.active.unwrap_or(0),
                st.succeeded.unwrap_or(0),
                st.failed.unwrap_or(0),
                st.conditions
                    .unwrap_or_default()
                    .iter()
                    .map(|c| format!(
                        "{}={} {}",
                        c.type_,
                        c.status,
                        c.message.clone().unwrap_or_default()
                    ))
                    .collect::<Vec<_>>()
            )
        };
        let job = self
            .wait_for(self.api(), name, "Job finished", timeout, cond, describe)
            .await?
            .ok_or_else(|| unexpected(name, "Job vanished"))?;
        let complete = job_finished(&job).unwrap_or(false);
        Ok((job, complete))
    }

    /// Waits until the object is gone (404), or replaced by one with another uid.
    pub async fn wait_deleted<K>(
        &self,
        api: Api<K>,
        name: &str,
        uid: &str,
        timeout: Duration,
    ) -> Result<(), TestError>
    where
        K: Clone + Debug + Send + DeserializeOwned + Resource + 'static,
    {
        let cond = kube::runtime::wait::conditions::is_deleted::<K>(uid);
        let describe = |o: &K| {
            format!(
                "still exists, deletionTimestamp={:?} finalizers={:?}",
                o.meta().deletion_timestamp,
                o.meta().finalizers
            )
        };
        self.wait_for(api, name, "deletion", timeout, cond, describe)
            .await
            .map(|_| ())
    }
}
