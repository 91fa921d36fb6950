//! Member pods as users write them today, moved with a client writing to etcd throughout,
//! against the cluster `KUBECONFIG` points at (Kubernetes 1.34 or newer):
//!
//! - a native sidecar container (an init container with `restartPolicy: Always`, GA in 1.33);
//! - a scheduling gate (GA in 1.30) in the pod template, removed from each pod before it starts,
//!   as the controller that owns the gate would;
//! - claims with a `volumeAttributesClassName` (GA in 1.34), with a VolumeAttributesClass
//!   object of the volumes' driver.
//!
//! The set moves to the WaitForFirstConsumer class. Each member pod comes back exactly as it was
//! (init containers with the sidecar, containers, volumes, no gate), its sidecar started again;
//! each claim keeps its VolumeAttributesClass and so does its new volume; the recreated set's
//! template still has the sidecar and the gate; no acknowledged write is lost.
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test modern_pods`

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::testing::faults::{ETCD_SET, EtcdUnderLoad};
use e2e::testing::operator::{self, Operator, summary};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, PodSpec};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use storage_migrator::api::Phase;

const MIGRATION: Duration = Duration::from_secs(900);
const MEMBERS: usize = 3;
const GATE: &str = "example.com/provisioned";
const SIDECAR: &str = "log-shipper";

/// The fixture with a sidecar, a scheduling gate and claims of VolumeAttributesClass `vac`;
/// its pods carry the label `e2e-gated=<token>`.
fn modern(token: String, vac: String) -> impl Fn(&mut DynamicObject) {
    move |obj| {
        if obj.types.as_ref().is_none_or(|t| t.kind != "StatefulSet") {
            return;
        }
        let spec = &mut obj.data["spec"];
        spec["template"]["metadata"]["labels"]["e2e-gated"] = json!(token);
        let pod = &mut spec["template"]["spec"];
        pod["schedulingGates"] = json!([{"name": GATE}]);
        pod["initContainers"] = json!([{
            "name": SIDECAR,
            "image": "busybox",
            "restartPolicy": "Always",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
            "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 2},
        }]);
        if let Some(t) = spec.pointer_mut("/volumeClaimTemplates/0/spec") {
            t["volumeAttributesClassName"] = json!(vac);
        }
    }
}

/// Removes the scheduling gate from every pod labelled `e2e-gated=<token>` as it appears, as
/// the controller that owns the gate would, until aborted.
fn ungate(client: kube::Client, token: &str) -> tokio::task::JoinHandle<()> {
    let pods: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().labels(&format!("e2e-gated={token}"));
    tokio::spawn(async move {
        let mut stream = watcher::watcher(pods.clone(), config).boxed();
        while let Some(event) = stream.next().await {
            let (Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p))) = event else {
                continue;
            };
            let gated = p.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref());
            if gated.is_none_or(Vec::is_empty) {
                continue;
            }
            let api: Api<Pod> = Api::namespaced(
                pods.clone().into_client(),
                &p.namespace().unwrap_or_default(),
            );
            let patch = json!({"spec": {"schedulingGates": null}});
            let done = api
                .patch(
                    &p.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await;
            println!(
                "NOTE modern pods: ungated {}: {:?}",
                p.name_any(),
                done.map(|_| ())
            );
        }
    })
}

/// What must come back unchanged of a member pod.
fn kept(spec: &PodSpec) -> serde_json::Value {
    json!({
        "initContainers": spec.init_containers,
        "containers": spec.containers,
        "volumes": spec.volumes,
        "schedulingGates": spec.scheduling_gates.clone().unwrap_or_default(),
    })
}

async fn member_pods(api: &Api<Pod>) -> BTreeMap<String, Pod> {
    let mut out = BTreeMap::new();
    for i in 0..MEMBERS {
        let name = format!("{ETCD_SET}-{i}");
        out.insert(name.clone(), api.get(&name).await.expect("member pod"));
    }
    out
}

/// The sidecar's status in `pod`: (started, running).
fn sidecar_running(pod: &Pod) -> (bool, bool) {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref());
    let s = statuses.into_iter().flatten().find(|s| s.name == SIDECAR);
    (
        s.and_then(|s| s.started).unwrap_or(false),
        s.and_then(|s| s.state.as_ref())
            .is_some_and(|st| st.running.is_some()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_gates_and_volume_attributes_come_back_as_they_were() {
    let client = kube::Client::try_default().await.expect("KUBECONFIG");
    let token = format!("{:08x}", std::process::id() ^ 0x5eed);
    let vac = format!("e2e-gold-{token}");
    let vacs: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("storage.k8s.io", "v1", "VolumeAttributesClass"),
            "volumeattributesclasses",
        ),
    );
    let class: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "VolumeAttributesClass",
        "metadata": {"name": vac},
        "driverName": storage_migrator_e2e_provisioner(),
        "parameters": {"iops": "3000", "throughput": "125"},
    }))
    .expect("VolumeAttributesClass");
    vacs.create(&PostParams::default(), &class)
        .await
        .expect("create the VolumeAttributesClass");
    let ungater = ungate(client.clone(), &token);

    let run = EtcdUnderLoad::start_with("smr-modern", modern(token.clone(), vac.clone()))
        .await
        .expect("setup");
    let ns = &run.ns;
    let pods: Api<Pod> = ns.api();
    let before = member_pods(&pods).await;
    for (name, p) in &before {
        assert_eq!(sidecar_running(p), (true, true), "{name}'s sidecar before");
    }
    let _op = Operator::start(ns, 0, None).await.expect("operator");
    run.create_request("modern").await.expect("request");
    let req = operator::wait_final(ns, "modern", MIGRATION)
        .await
        .expect("final");
    println!("NOTE modern pods: {}", summary(&req));
    assert_eq!(
        req.status.as_ref().map(|s| s.phase),
        Some(Phase::Successful),
        "{}",
        summary(&req)
    );

    let after = member_pods(&pods).await;
    for (name, p) in &after {
        let old = &before[name];
        assert_ne!(p.uid(), old.uid(), "{name} was moved (a new pod)");
        let (spec, old_spec) = (
            p.spec.clone().unwrap_or_default(),
            old.spec.clone().unwrap_or_default(),
        );
        assert_eq!(kept(&spec), kept(&old_spec), "{name} came back as it was");
        assert_eq!(sidecar_running(p), (true, true), "{name}'s sidecar after");
    }
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    for i in 0..MEMBERS {
        let claim = claims
            .get(&format!("data-{ETCD_SET}-{i}"))
            .await
            .expect("claim");
        let spec = claim.spec.clone().unwrap_or_default();
        assert_eq!(
            spec.volume_attributes_class_name.as_deref(),
            Some(vac.as_str())
        );
        assert_eq!(
            spec.storage_class_name,
            Some(run.cluster.wffc_storage_class.clone())
        );
        let pv = volumes
            .get(spec.volume_name.as_deref().unwrap_or_default())
            .await
            .expect("the claim's volume");
        let pv_vac = pv.spec.and_then(|s| s.volume_attributes_class_name);
        assert_eq!(
            pv_vac.as_deref(),
            Some(vac.as_str()),
            "{}'s volume",
            claim.name_any()
        );
    }
    let sets: Api<StatefulSet> = ns.api();
    let set = sets.get(ETCD_SET).await.expect("the recreated set");
    let template = set.spec.and_then(|s| s.template.spec).unwrap_or_default();
    assert_eq!(
        template
            .scheduling_gates
            .unwrap_or_default()
            .first()
            .map(|g| g.name.clone()),
        Some(GATE.to_string()),
        "the template keeps its gate"
    );
    let sidecar = template.init_containers.unwrap_or_default();
    assert_eq!(
        sidecar
            .first()
            .and_then(|c| c.restart_policy.clone())
            .as_deref(),
        Some("Always")
    );

    run.finish().await;
    ungater.abort();
    vacs.delete(&vac, &DeleteParams::default())
        .await
        .expect("delete the VolumeAttributesClass");
}

/// The local cluster's CSI driver (of its volumes that carry a VolumeAttributesClass).
fn storage_migrator_e2e_provisioner() -> &'static str {
    e2e::state::CSI_DRIVER
}
