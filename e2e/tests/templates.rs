//! End-to-end scenarios of a request that moves several volumeClaimTemplates of a StatefulSet at
//! once (no `volumeClaimTemplate` in the spec: every template moves), against the cluster
//! `KUBECONFIG` points at, each in its own namespace with its own operator process:
//!
//! - a class change of a three-member generic StatefulSet with two templates, `data` and `wal`:
//!   every member's two claims move to new volumes on the target class with their files
//!   (checksums compared), each member's pod is deleted exactly once (a pod watch started before
//!   the request sees exactly two uids per member, before and after), the plan and the status
//!   record both claims of every member, and the recreated set has both templates on the target
//!   class; `kubectl smr orphans`, run every second throughout, never offers to delete a volume
//!   the request names while it runs (old, temporary or new, of either template), nor ever one
//!   of its new volumes;
//! - a Shrink of a two-member set with a size per template (`shrink.sizes`): each claim gets its
//!   template's new size with its files, each member's pod is deleted once, and the recreated
//!   set's templates ask for those sizes.
//!
//! The class change goes from the cluster's Immediate class (`standard` on the local cluster)
//! to its WaitForFirstConsumer class (`fast`), as in `claim_target.rs` (the operator denies the
//! other way round: new volumes of an Immediate class could land away from their members). The
//! local provisioner places an Immediate claim on the node with the fewest volumes, so a member's
//! two claims could land on two nodes and its pod could never be scheduled: the test creates the
//! members' claims itself, as the StatefulSet would (same names and labels), each member's two
//! pinned to one node by `volume.kubernetes.io/selected-node`. The Shrink stays on the
//! WaitForFirstConsumer class, where the set makes its claims itself.
//!
//! The operator binary comes from `STORAGE_MIGRATOR_BIN` (default
//! `<workspace>/target/debug/storage-migrator`).
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test templates`

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use e2e::testing::operator::{Operator, create_request, install_crd, summary, wait_final};
use e2e::testing::recording::{Recording, Seen};
use e2e::testing::{TestNamespace, claim_manifest, one_member_set, requested_size, scenario};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ExecAction, PersistentVolumeClaim, Pod, Probe, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use storage_migrator::api::{MemberStep, Phase, StorageMigrationRequest};

const APP: &str = "app";
const TEMPLATES: [&str; 2] = ["data", "wal"];
const FINAL: Duration = Duration::from_secs(900);

/// Writes a few random files into each volume once (to a temporary name, then renamed), then
/// marks it `written`; the readiness probe waits for both marks, so Ready means written.
const SCRIPT: &str = "trap 'exit 0' TERM; \
    for d in /data /wal; do \
      if [ ! -f $d/written ]; then \
        mkdir -p $d/sub; \
        head -c 4194304 /dev/urandom > $d/.tmp && mv $d/.tmp $d/random-1; \
        head -c 1048576 /dev/urandom > $d/.tmp && mv $d/.tmp $d/sub/random-2; \
        head -c 65536 /dev/urandom > $d/.tmp && mv $d/.tmp $d/random-3; \
        sync; touch $d/written; \
      fi; \
    done; sync; while true; do sleep 1; done";

/// Lists every regular file of the claim mounted at `/data` with its checksum, once written.
const SUMS: &str = "i=0; while [ ! -f /data/written ]; do i=$((i+1)); [ $i -lt 300 ] || exit 3; \
    sleep 0.2; done; cd /data && find . -type f | sort | xargs sha256sum";

/// `replicas` members of a generic set `app` on `class`, with the templates `data` (mounted at
/// `/data`) and `wal` (at `/wal`) of `sizes[0]` and `sizes[1]`, Ready once both volumes are
/// written.
fn two_template_set(image: &str, class: &str, replicas: i32, sizes: [&str; 2]) -> StatefulSet {
    let mut set = one_member_set(APP, image, class, sizes[0], SCRIPT);
    let spec = set.spec.as_mut().expect("a set has a spec");
    spec.replicas = Some(replicas);
    let templates = spec.volume_claim_templates.get_or_insert_with(Vec::new);
    let mut wal = templates[0].clone();
    wal.metadata.name = Some("wal".into());
    if let Some(s) = wal.spec.as_mut() {
        s.resources = Some(VolumeResourceRequirements {
            requests: Some(BTreeMap::from([(
                "storage".to_string(),
                Quantity(sizes[1].to_string()),
            )])),
            ..Default::default()
        });
    }
    templates.push(wal);
    let pod = spec.template.spec.as_mut().expect("a pod template");
    let container = &mut pod.containers[0];
    container
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(VolumeMount {
            name: "wal".into(),
            mount_path: "/wal".into(),
            ..Default::default()
        });
    container.readiness_probe = Some(Probe {
        exec: Some(ExecAction {
            command: Some(vec![
                "sh".into(),
                "-c".into(),
                "test -f /data/written && test -f /wal/written".into(),
            ]),
        }),
        period_seconds: Some(1),
        ..Default::default()
    });
    set
}

/// Creates both claims of each of `replicas` members as the set would (`<template>-app-<i>`,
/// label `app: app`), on `class`, each member's two on one node (`selected-node`), the members
/// spread over the schedulable nodes.
async fn create_pinned_claims(ns: &TestNamespace, class: &str, replicas: usize, sizes: [&str; 2]) {
    let nodes = ns.cluster.schedulable_nodes().await.unwrap();
    assert!(!nodes.is_empty(), "no schedulable node");
    for i in 0..replicas {
        for (template, size) in TEMPLATES.into_iter().zip(sizes) {
            let mut claim = claim_manifest(&format!("{template}-{APP}-{i}"), class, size);
            claim.metadata.labels = Some(BTreeMap::from([("app".to_string(), APP.to_string())]));
            claim.metadata.annotations = Some(BTreeMap::from([(
                "volume.kubernetes.io/selected-node".to_string(),
                nodes[i % nodes.len()].clone(),
            )]));
            ns.api::<PersistentVolumeClaim>()
                .create(&PostParams::default(), &claim)
                .await
                .unwrap();
        }
    }
}

/// One claim of one member as it stands: `(volume, class, requested size)`; panics unless Bound.
async fn claim_state(ns: &TestNamespace, claim: &str) -> (String, String, String) {
    let c = ns
        .wait_pvc_bound(claim, Duration::from_secs(60))
        .await
        .unwrap();
    let spec = c.spec.unwrap_or_default();
    let size = requested_size(&spec);
    (
        spec.volume_name.unwrap_or_default(),
        spec.storage_class_name.unwrap_or_default(),
        size,
    )
}

/// `claim → (volume, class, size)` of both claims of every member.
async fn claim_states(
    ns: &TestNamespace,
    replicas: usize,
) -> BTreeMap<String, (String, String, String)> {
    let mut out = BTreeMap::new();
    for i in 0..replicas {
        for t in TEMPLATES {
            let claim = format!("{t}-{APP}-{i}");
            let state = claim_state(ns, &claim).await;
            out.insert(claim, state);
        }
    }
    out
}

/// `claim → sha256sum of its files` for both claims of every member, each read by a mover pod on
/// the member's node (the volumes are local to it), all at once.
async fn checksums(ns: &TestNamespace, tag: &str, replicas: usize) -> BTreeMap<String, String> {
    let mut reads = Vec::new();
    for i in 0..replicas {
        let node = ns
            .api::<Pod>()
            .get(&format!("{APP}-{i}"))
            .await
            .unwrap()
            .spec
            .and_then(|s| s.node_name)
            .unwrap_or_default();
        for t in TEMPLATES {
            let claim = format!("{t}-{APP}-{i}");
            let reader = format!("sum-{tag}-{t}-{i}");
            let node = node.clone();
            reads.push(async move {
                let sums = ns.run_on_claim(&reader, &node, &claim, SUMS).await;
                (claim, sums.unwrap_or_else(|e| panic!("{reader}: {e}")))
            });
        }
    }
    let sums: BTreeMap<String, String> =
        futures::future::join_all(reads).await.into_iter().collect();
    for (claim, s) in &sums {
        // random-1, sub/random-2, random-3 and the mark.
        assert_eq!(s.lines().count(), 4, "files of {claim}: {s}");
    }
    sums
}

/// `pod → uid` of the members.
async fn member_uids(ns: &TestNamespace, replicas: usize) -> BTreeMap<String, String> {
    let mut uids = BTreeMap::new();
    for i in 0..replicas {
        let pod = ns.api::<Pod>().get(&format!("{APP}-{i}")).await.unwrap();
        uids.insert(pod.name_any(), pod.uid().unwrap_or_default());
    }
    uids
}

/// What a watch of the namespace's pods saw of the members' pods.
#[derive(Debug, Default)]
struct PodHistory {
    /// `pod → the distinct uids seen under that name`, in the order first seen.
    uids: BTreeMap<String, Vec<String>>,
    /// `pod → Delete events`.
    deletes: BTreeMap<String, usize>,
    /// Times the watch had to list again after its first list (a Delete may be missed then;
    /// the uids are not, as a pod lives longer than the gap).
    relists: usize,
    errors: Vec<String>,
}

impl PodHistory {
    /// Records the pod's uid when it is a member's (`app-<ordinal>`, not a helper of one);
    /// whether it is.
    fn saw(&mut self, pod: &Pod) -> bool {
        let name = pod.name_any();
        let ordinal = name.strip_prefix(&format!("{APP}-"));
        if ordinal.is_none_or(|o| o.parse::<u32>().is_err()) {
            return false;
        }
        let uid = pod.uid().unwrap_or_default();
        let uids = self.uids.entry(name).or_default();
        if !uids.contains(&uid) {
            uids.push(uid);
        }
        true
    }
}

impl PodHistory {
    /// Folds one thing the watch saw in.
    fn record(&mut self, seen: Seen<Pod>) {
        match seen {
            Seen::Applied(p) => {
                self.saw(&p);
            }
            Seen::Deleted(p) => {
                if self.saw(&p) {
                    *self.deletes.entry(p.name_any()).or_default() += 1;
                }
            }
            Seen::Relisted => self.relists += 1,
            Seen::Error(e) => self.errors.push(e),
        }
    }
}

/// A background watch of the namespace's pods, from its first list on.
async fn watch_pods(ns: &TestNamespace) -> Recording<PodHistory> {
    let config = watcher::Config::default();
    Recording::start(
        ns.api(),
        config,
        "pod",
        PodHistory::default(),
        PodHistory::record,
    )
    .await
}

/// Each member's pod was deleted exactly once: the watch saw its uid before the request and
/// the one it has now, and no other.
fn assert_each_member_stopped_once(
    history: &PodHistory,
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) {
    println!("pod watch: {history:?}");
    for (pod, uid) in before {
        let seen = history.uids.get(pod).cloned().unwrap_or_default();
        assert_eq!(
            seen,
            vec![uid.clone(), after[pod].clone()],
            "{pod}: the uids the watch saw, before and after its one stop"
        );
        if history.relists == 0 {
            assert_eq!(history.deletes.get(pod), Some(&1), "{pod}: Delete events");
        }
    }
}

/// Runs a request that moves every template of the set to its end; it must be Successful.
async fn run_request(
    ns: &TestNamespace,
    name: &str,
    spec: serde_json::Value,
) -> StorageMigrationRequest {
    let _op = Operator::start(ns, 0, None).await.unwrap();
    create_request(ns, name, spec).await.unwrap();
    let req = wait_final(ns, name, FINAL).await.unwrap();
    let status = req.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Phase::Successful, "{}", summary(&req));
    req
}

/// The plan names `data` as the first template and `wal` as the further one (of `wal_size`),
/// and each member's both claims with the volumes they had; the status has every member Done
/// with a new, verified volume for each claim: the ones the claims are bound to now.
fn assert_plan_and_status(
    req: &StorageMigrationRequest,
    before: &BTreeMap<String, (String, String, String)>,
    after: &BTreeMap<String, (String, String, String)>,
    wal_size: &str,
) {
    let status = req.status.clone().unwrap_or_default();
    let plan = status.plan.clone().unwrap_or_default();
    assert_eq!(plan.stateful_set, APP);
    assert_eq!(plan.volume_claim_template, "data");
    let further: Vec<(&str, &str)> = (plan.further_templates.iter())
        .map(|t| (t.name.as_str(), t.size.0.as_str()))
        .collect();
    assert_eq!(further, [("wal", wal_size)], "plan.furtherTemplates");
    let replicas = before.len() / TEMPLATES.len();
    assert_eq!(plan.members.len(), replicas);
    for m in &plan.members {
        let wal = format!("wal-{}", m.pod);
        assert_eq!(m.claim, format!("data-{}", m.pod));
        assert_eq!(m.old_volume, before[&m.claim].0, "{}", m.claim);
        assert_eq!(m.further_claims.len(), 1, "{:?}", m.further_claims);
        let fc = &m.further_claims[0];
        assert_eq!((fc.template.as_str(), fc.claim.as_str()), ("wal", &*wal));
        assert_eq!(fc.old_volume, before[&wal].0, "{wal}");
        assert_eq!(fc.new_size.0, wal_size, "{wal}");
    }
    assert_eq!(status.members.len(), replicas);
    for m in &status.members {
        let (data, wal) = (format!("data-{}", m.pod), format!("wal-{}", m.pod));
        assert_eq!(m.step, MemberStep::Done, "{}", m.pod);
        assert_eq!(
            m.first_claim.new_volume.as_ref(),
            Some(&after[&data].0),
            "{data}"
        );
        assert!(m.first_claim.verified.is_some(), "{data} verified");
        assert_eq!(m.further_claims.len(), 1, "{:?}", m.further_claims);
        let fc = &m.further_claims[0];
        assert_eq!(fc.claim, wal);
        assert_eq!(fc.new_volume.as_ref(), Some(&after[&wal].0), "{wal}");
        assert!(fc.verified.is_some(), "{wal} verified");
    }
}

/// The recreated set's templates, `name → (class, requested size)`.
async fn set_templates(ns: &TestNamespace) -> BTreeMap<String, (String, String)> {
    let set = ns.api::<StatefulSet>().get(APP).await.unwrap();
    let templates = set.spec.and_then(|s| s.volume_claim_templates);
    templates
        .into_iter()
        .flatten()
        .map(|t| {
            let spec = t.spec.unwrap_or_default();
            let size = requested_size(&spec);
            let class = spec.storage_class_name.unwrap_or_default();
            (t.metadata.name.unwrap_or_default(), (class, size))
        })
        .collect()
}

/// What the members had before the request: each claim's volume, class and size, each file's
/// checksum, each pod's uid.
struct Before {
    claims: BTreeMap<String, (String, String, String)>,
    sums: BTreeMap<String, String>,
    uids: BTreeMap<String, String>,
}

/// Records [`Before`], runs request `name` with `spec` to `Successful` under a pod watch, waits
/// for the recreated set, and checks that each member's pod was stopped exactly once.
async fn migrate(
    ns: &TestNamespace,
    replicas: usize,
    name: &str,
    spec: serde_json::Value,
) -> (Before, StorageMigrationRequest) {
    let before = Before {
        claims: claim_states(ns, replicas).await,
        sums: checksums(ns, "before", replicas).await,
        uids: member_uids(ns, replicas).await,
    };
    let watch = watch_pods(ns).await;
    let started = std::time::Instant::now();
    let req = run_request(ns, name, spec).await;
    println!("request {name} Successful after {:?}", started.elapsed());
    for m in req.status.iter().flat_map(|s| &s.members) {
        let copied = m.first_claim.bytes_copied.unwrap_or(0)
            + m.further_claims
                .iter()
                .filter_map(|c| c.bytes_copied)
                .sum::<i64>();
        println!(
            "  {}: downtime {:?} s, {copied} bytes in the final copies of {} claims",
            m.pod,
            m.downtime_seconds,
            1 + m.further_claims.len()
        );
    }
    let want = i32::try_from(replicas).unwrap();
    ns.wait_statefulset_ready(APP, want, Duration::from_secs(180))
        .await
        .unwrap();
    let history = watch.finish().await;
    let uids_after = member_uids(ns, replicas).await;
    assert_each_member_stopped_once(&history, &before.uids, &uids_after);
    (before, req)
}

/// The volume claim `claim` is bound to now.
async fn volume_of(
    ns: &TestNamespace,
    claim: &str,
) -> k8s_openapi::api::core::v1::PersistentVolume {
    let bound = ns.api::<PersistentVolumeClaim>().get(claim).await.unwrap();
    ns.cluster.pv_of(&bound).await.unwrap()
}

/// The files are the same and the recreated set's templates are `templates` (name → class,
/// size).
async fn assert_files_and_templates(
    ns: &TestNamespace,
    before: &Before,
    replicas: usize,
    templates: [(&str, &str, &str); 2],
) {
    assert_eq!(
        checksums(ns, "after", replicas).await,
        before.sums,
        "the same files"
    );
    let want = templates
        .iter()
        .map(|(t, class, size)| (t.to_string(), (class.to_string(), size.to_string())))
        .collect::<BTreeMap<_, _>>();
    assert_eq!(
        set_templates(ns).await,
        want,
        "the recreated set's templates"
    );
}

/// The plugin binary (`KUBECTL_SMR_BIN`, else the workspace's debug build).
fn plugin_bin() -> std::path::PathBuf {
    std::env::var_os("KUBECTL_SMR_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/kubectl-smr")
        })
}

/// One run of `kubectl smr orphans`: the volumes it offered to delete, and whether request
/// `name` was still not final once the run had ended (then the run saw it in flight).
struct OrphansRun {
    offered: BTreeSet<String>,
    in_flight: bool,
}

/// Runs `kubectl smr orphans` every second until `stop`.
fn poll_orphans(
    ns: &TestNamespace,
    name: &str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<OrphansRun>> {
    let requests: Api<StorageMigrationRequest> = ns.api();
    let name = name.to_string();
    tokio::spawn(async move {
        let mut runs = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let out = tokio::process::Command::new(plugin_bin())
                .arg("orphans")
                .stdin(std::process::Stdio::null())
                .output()
                .await
                .expect("run kubectl-smr orphans");
            assert!(out.status.success(), "kubectl-smr orphans: {out:?}");
            let stdout = String::from_utf8_lossy(&out.stdout);
            // The orphans' own delete commands (a failed request's section indents deeper).
            let offered = stdout
                .lines()
                .filter_map(|l| l.strip_prefix("  kubectl delete persistentvolume "))
                .map(str::to_string)
                .collect();
            let phase = requests.get_opt(&name).await.ok().flatten();
            let in_flight = phase
                .and_then(|r| r.status)
                .is_none_or(|s| !s.phase.is_final());
            runs.push(OrphansRun { offered, in_flight });
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        runs
    })
}

/// No run of `orphans` offered a volume request `req` names while it was in flight, nor ever
/// one of its new volumes.
fn assert_orphans_kept_off(runs: &[OrphansRun], req: &StorageMigrationRequest) {
    let status = req.status.clone().unwrap_or_default();
    let claims = storage_migrator::plan::claims::request_claims(&status);
    let new: BTreeSet<String> = claims
        .iter()
        .filter_map(|c| c.new_volume().map(str::to_string))
        .collect();
    let all: BTreeSet<String> = claims
        .iter()
        .flat_map(|c| c.volumes().into_iter().map(|(_, v)| v.to_string()))
        .collect();
    assert!(all.len() >= 12, "3 members, 2 claims, old and new: {all:?}");
    let in_flight = runs.iter().filter(|r| r.in_flight).count();
    println!("orphans polled {} times, {in_flight} in flight", runs.len());
    assert!(
        in_flight >= 5,
        "orphans ran only {in_flight} times while the request ran"
    );
    for (i, r) in runs.iter().enumerate() {
        let named = if r.in_flight { &all } else { &new };
        let wrong: Vec<&String> = r.offered.intersection(named).collect();
        assert!(
            wrong.is_empty(),
            "orphans run {i} offered the request's {wrong:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_templates_move_in_one_request_and_each_member_is_stopped_once() {
    let (cluster, ns) = scenario("smr-templates").await;
    let (source, target) = (&cluster.storage_class, &cluster.wffc_storage_class);
    install_crd(&ns).await.unwrap();
    create_pinned_claims(&ns, source, 3, ["64Mi", "32Mi"]).await;
    let set = two_template_set(&cluster.mover_image, source, 3, ["64Mi", "32Mi"]);
    ns.create_statefulset_ready(&set).await.unwrap();
    // No volumeClaimTemplate: every template moves.
    let spec = json!({
        "type": "StorageClassChange",
        "target": {"kind": "StatefulSet", "name": APP},
        "storageClassChange": {"storageClassName": target},
        "timeout": "15m",
        "database": {"engine": "Generic"},
    });
    // `kubectl smr orphans` every second throughout: it never offers a volume of the request.
    let stop = Arc::new(AtomicBool::new(false));
    let poller = poll_orphans(&ns, "all-templates", stop.clone());
    let (before, req) = migrate(&ns, 3, "all-templates", spec).await;
    stop.store(true, Ordering::Relaxed);
    let runs = poller.await.expect("the orphans poller");
    assert_orphans_kept_off(&runs, &req);

    let claims_after = claim_states(&ns, 3).await;
    for (claim, (volume, class, size)) in &claims_after {
        let (old_volume, _, old_size) = &before.claims[claim];
        assert_ne!(volume, old_volume, "{claim} is on a new volume");
        assert_eq!(class, target, "{claim}'s class");
        assert_eq!(size, old_size, "{claim}'s size");
        let pv_class = volume_of(&ns, claim)
            .await
            .spec
            .and_then(|s| s.storage_class_name);
        assert_eq!(pv_class.as_ref(), Some(target), "{claim}'s volume's class");
    }
    assert_plan_and_status(&req, &before.claims, &claims_after, "32Mi");
    let templates = [("data", target.as_str(), "64Mi"), ("wal", target, "32Mi")];
    assert_files_and_templates(&ns, &before, 3, templates).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shrink_gives_each_template_its_own_size() {
    let (cluster, ns) = scenario("smr-templates-shrink").await;
    let class = &cluster.wffc_storage_class;
    install_crd(&ns).await.unwrap();
    let set = two_template_set(&cluster.mover_image, class, 2, ["512Mi", "256Mi"]);
    ns.create_statefulset_ready(&set).await.unwrap();
    let spec = json!({
        "type": "Shrink",
        "target": {"kind": "StatefulSet", "name": APP},
        "shrink": {"sizes": {"data": "128Mi", "wal": "64Mi"}},
        "timeout": "15m",
        "database": {"engine": "Generic"},
    });
    let (before, req) = migrate(&ns, 2, "shrink-templates", spec).await;
    let plan = (req.status.clone().unwrap_or_default().plan).unwrap_or_default();
    assert_eq!(plan.target_size.0, "128Mi", "plan.targetSize");
    let claims_after = claim_states(&ns, 2).await;
    for (claim, (volume, claim_class, size)) in &claims_after {
        let want = if claim.starts_with("data-") {
            "128Mi"
        } else {
            "64Mi"
        };
        assert_ne!(
            volume, &before.claims[claim].0,
            "{claim} is on a new volume"
        );
        assert_eq!(claim_class, class, "{claim} keeps its class");
        assert_eq!(size, want, "{claim}'s new size");
        let capacity = volume_of(&ns, claim).await.spec.and_then(|s| s.capacity);
        let capacity = capacity.unwrap_or_default();
        assert_eq!(
            capacity.get("storage").map(|q| q.0.as_str()),
            Some(want),
            "{claim}'s volume's capacity"
        );
    }
    assert_plan_and_status(&req, &before.claims, &claims_after, "64Mi");
    let templates = [("data", class.as_str(), "128Mi"), ("wal", class, "64Mi")];
    assert_files_and_templates(&ns, &before, 2, templates).await;
}
