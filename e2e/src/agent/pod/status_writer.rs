//! The status writer: patches the pod's status whenever the record changes.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::agent::pod::{PodShared, lock};
use crate::agent::status;

/// Writes the pod's status whenever the record changes (and every 10 s), until `stop`, then
/// once more.
pub(super) async fn status_writer(
    client: kube::Client,
    shared: Arc<PodShared>,
    stop: CancellationToken,
) {
    let pods: Api<Pod> = Api::namespaced(client, &shared.namespace);
    let mut last: Option<PodStatus> = None;
    loop {
        let stopping = tokio::select! {
            _ = shared.dirty.notified() => false,
            _ = tokio::time::sleep(Duration::from_secs(10)) => false,
            _ = stop.cancelled() => true,
        };
        if !stopping {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        write_status(&pods, &shared, &mut last).await;
        if stopping {
            return;
        }
    }
}

async fn write_status(pods: &Api<Pod>, shared: &PodShared, last: &mut Option<PodStatus>) {
    let mut pod = (*shared.pod()).clone();
    if let Some(l) = last.as_ref() {
        pod.status = Some(l.clone());
    }
    let rec = lock(&shared.record).clone();
    let st = status::compute_status(&pod, &rec, Timestamp::now());
    if last.as_ref() == Some(&st) {
        return;
    }
    let mut value = match serde_json::to_value(&st) {
        Ok(v) => v,
        Err(e) => {
            warn!(error = %e, "cannot serialize pod status");
            return;
        }
    };
    if let Some(obj) = value.as_object_mut() {
        for k in ["message", "reason"] {
            obj.entry(k).or_insert(serde_json::Value::Null);
        }
    }
    let patch = serde_json::json!({"metadata": {"uid": shared.uid}, "status": value});
    match pods
        .patch_status(&shared.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => *last = Some(st),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
            debug!(pod = %shared.name, code = s.code, "status not written: pod gone or replaced");
        }
        Err(e) => warn!(pod = %shared.name, error = %e, "status write failed"),
    }
}
