//! End-to-end scenarios of the cluster itself (pods, probes, volumes, provisioning) against the
//! cluster `KUBECONFIG` points at (the local cluster from `localcluster up`, or any other with the
//! storage classes named by `E2E_STORAGE_CLASS` and `E2E_WFFC_STORAGE_CLASS`). Each test works in
//! its own namespace.
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test cluster -- --test-threads=2`

use std::collections::BTreeSet;
use std::time::Duration;

use e2e::quantity::parse_bytes;
use e2e::testing::etcd::{self, EtcdMember, MemberView};
use e2e::testing::{MoverSpec, TestCluster, node_satisfies, scenario};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PropagationPolicy};

const CLAIM_BOUND: Duration = Duration::from_secs(90);
const POD_RUN: Duration = Duration::from_secs(180);
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// Every member's view, once all agree on one leader that is one of them (polls: a view taken
/// during an election may still lack the leader).
async fn agreed_views(members: &mut [EtcdMember], timeout: Duration) -> Vec<MemberView> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let mut views = Vec::new();
        let mut last_error = None;
        for m in members.iter_mut() {
            match m.view().await {
                Ok(v) => views.push(v),
                Err(e) => last_error = Some(e.to_string()),
            }
        }
        let leaders: BTreeSet<u64> = views.iter().map(|v| v.leader).collect();
        if last_error.is_none() && leaders.len() == 1 && !leaders.contains(&0) {
            return views;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "members do not agree on one leader within {timeout:?}: views {views:?}, last error {last_error:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_statefulset_forms_a_three_member_cluster() {
    let (_cluster, ns) = scenario("etcd-cluster").await;
    ns.apply_etcd().await.unwrap();

    let mut members = etcd::members(&ns, "etcd", 3).await.unwrap();
    let views = agreed_views(&mut members, Duration::from_secs(30)).await;
    let mut own_ids = BTreeSet::new();
    for (m, view) in members.iter().zip(&views) {
        let mut names: Vec<&str> = view.members.iter().map(|(_, n, _)| n.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            ["etcd-0", "etcd-1", "etcd-2"],
            "member list through {}",
            m.endpoint
        );
        assert!(
            view.members.iter().all(|(_, _, learner)| !learner),
            "every member votes (none is a learner), through {}: {view:?}",
            m.endpoint
        );
        assert!(
            view.members.iter().any(|(id, _, _)| *id == view.leader),
            "the leader is a member, through {}: {view:?}",
            m.endpoint
        );
        assert!(
            view.members.iter().any(|(id, _, _)| *id == view.id),
            "{} answers as one of the members",
            m.endpoint
        );
        own_ids.insert(view.id);
    }
    assert_eq!(
        own_ids.len(),
        3,
        "each endpoint is a different member: {views:?}"
    );

    members[0]
        .put("e2e/greeting", "written-through-etcd-0")
        .await
        .unwrap();
    for m in &mut members[1..] {
        let got = m.get("e2e/greeting").await.unwrap();
        assert_eq!(
            got.as_deref(),
            Some("written-through-etcd-0"),
            "read through {}",
            m.pod
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writing_past_a_small_volume_fails_with_enospc() {
    let (cluster, ns) = scenario("enospc").await;
    ns.create_pvc("small", &cluster.storage_class, "32Mi")
        .await
        .unwrap();
    let claim = ns.wait_pvc_bound("small", CLAIM_BOUND).await.unwrap();
    let pv = cluster.pv_of(&claim).await.unwrap();
    let capacity = pv
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .map(|q| parse_bytes(&q.0).unwrap());
    assert_eq!(capacity, Some(32 << 20), "PV capacity of a 32Mi claim");

    let fill = MoverSpec::shell(
        "fill",
        "dd if=/dev/zero of=/data/fill bs=1M count=64 && sync && echo wrote-64MiB",
    )
    .mount("small", "/data");
    let out = ns.run_pod(&fill, POD_RUN).await.unwrap();
    assert_eq!(out.phase, "Failed", "the pod must fail: {out:?}");
    assert!(
        out.exit_code.is_some_and(|c| c != 0),
        "non-zero exit: {out:?}"
    );
    assert!(
        out.output().contains("No space left on device"),
        "termination message or logs name ENOSPC: {out:?}"
    );
    assert!(!out.output().contains("wrote-64MiB"), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_first_consumer_claim_is_provisioned_on_the_pods_node() {
    let (cluster, ns) = scenario("wffc").await;
    let created = ns
        .create_pvc("late", &cluster.wffc_storage_class, "64Mi")
        .await
        .unwrap();
    // The PV controller reports that it waits for a consumer: from then on the claim must stay
    // unprovisioned.
    ns.wait_for_event("late", "WaitForFirstConsumer", Duration::from_secs(60))
        .await
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let pending = claims.get("late").await.unwrap();
    assert_eq!(
        pending.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    assert_eq!(
        pending.spec.as_ref().and_then(|s| s.volume_name.clone()),
        None
    );
    assert!(!pending.annotations().contains_key(SELECTED_NODE));
    let uid = created.uid().unwrap();
    let pvs: Api<PersistentVolume> = Api::all(cluster.client.clone());
    let for_claim = pvs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|pv| {
            pv.spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| r.uid.as_deref())
                == Some(uid.as_str())
        })
        .count();
    assert_eq!(for_claim, 0, "no PV for a claim without a consumer");

    // Pin the consumer to the last schedulable node (not the first, which a naive provisioner
    // would pick).
    let nodes = cluster.schedulable_nodes().await.unwrap();
    let node = nodes.last().cloned().expect("a schedulable node");
    let consumer = MoverSpec::shell("consumer", "echo hello > /data/hello && cat /data/hello")
        .on_node(&node)
        .mount("late", "/data");
    let out = ns.run_pod(&consumer, POD_RUN).await.unwrap();
    assert!(out.succeeded(), "consumer pod: {out:?}");
    assert_eq!(out.node.as_deref(), Some(node.as_str()));

    let bound = ns.wait_pvc_bound("late", CLAIM_BOUND).await.unwrap();
    assert_eq!(
        bound.annotations().get(SELECTED_NODE),
        Some(&node),
        "selected-node annotation"
    );
    let pv = cluster.pv_of(&bound).await.unwrap();
    let affinity = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.clone())
        .expect("PV has node affinity");
    let node_api: Api<Node> = Api::all(cluster.client.clone());
    let pod_node = node_api.get(&node).await.unwrap();
    assert!(
        node_satisfies(&affinity, &pod_node),
        "PV affinity {affinity:?} admits the pod's node {node}"
    );
    for other in nodes.iter().filter(|n| **n != node) {
        let other_node = node_api.get(other).await.unwrap();
        assert!(
            !node_satisfies(&affinity, &other_node),
            "PV affinity {affinity:?} must name only {node}, but admits {other}"
        );
    }
}

/// Builds the source tree: contents, modes 0600/0755, owner 1234:5678, a hard link pair, a
/// symlink, a sparse file, an empty dir.
const PREPARE_SOURCE: &str = r#"set -eu
cd /src
printf 'secret contents\n' > secret
chmod 0600 secret
mkdir -p dir/sub
printf '#!/bin/sh\necho hi\n' > dir/sub/script.sh
chmod 0755 dir/sub/script.sh
printf 'owned by 1234\n' > owned
chown 1234:5678 owned dir
printf 'linked\n' > hard-a
ln hard-a hard-b
ln -s dir/sub/script.sh link
chown -h 1234:5678 link
dd if=/dev/urandom of=random.bin bs=64k count=4 2>/dev/null
truncate -s 8M sparse.bin
printf 'end' >> sparse.bin
mkdir empty
chmod 0750 empty
sync
[ "$(stat -c %h hard-a)" = 2 ]
echo SOURCE-READY
"#;

/// Compares /src and /dst: rsync's own dry-run checksum comparison shows nothing, listings of
/// path, mode, owner, link count, size, type and link target are equal, contents hash equal;
/// then the specific attributes are checked on the target. Exit codes name the failed check.
const VERIFY_TREES: &str = r#"set -eu
changes=$(rsync -aHAXSn --numeric-ids --delete --itemize-changes --checksum /src/ /dst/)
if [ -n "$changes" ]; then echo "rsync dry run shows changes:"; echo "$changes"; exit 10; fi
list() { (cd "$1" && find . -printf '%p %m %U %G %n %s %y %l\n' | LC_ALL=C sort); }
sums() { (cd "$1" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum); }
la=$(list /src); lb=$(list /dst)
if [ "$la" != "$lb" ]; then echo "listings differ:"; echo "$la"; echo "---"; echo "$lb"; exit 11; fi
sa=$(sums /src); sb=$(sums /dst)
if [ "$sa" != "$sb" ]; then echo "checksums differ:"; echo "$sa"; echo "---"; echo "$sb"; exit 12; fi
links=$(stat -c %h /dst/hard-a)
[ "$links" = 2 ] || { echo "hard link count on target: $links"; exit 13; }
[ "$(stat -c %i /dst/hard-a)" = "$(stat -c %i /dst/hard-b)" ] || { echo "hard-a and hard-b are not one inode"; exit 14; }
[ "$(stat -c %u:%g /dst/owned)" = 1234:5678 ] || { echo "owner: $(stat -c %u:%g /dst/owned)"; exit 15; }
[ "$(stat -c %a /dst/secret)" = 600 ] || { echo "mode: $(stat -c %a /dst/secret)"; exit 16; }
[ "$(stat -c %a /dst/dir/sub/script.sh)" = 755 ] || exit 16
[ "$(readlink /dst/link)" = dir/sub/script.sh ] || { echo "symlink: $(readlink /dst/link)"; exit 17; }
blocks=$(stat -c %b /dst/sparse.bin)
[ "$blocks" -lt 1024 ] || { echo "sparse file uses $blocks blocks on target"; exit 18; }
[ -d /dst/empty ] && [ -z "$(ls -A /dst/empty)" ] || { echo "empty dir"; exit 19; }
echo "$lb"
echo TREES-IDENTICAL
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rsync_job_copies_one_claim_into_another_identically() {
    let (cluster, ns) = scenario("rsync").await;
    ns.create_pvc("src", &cluster.storage_class, "64Mi")
        .await
        .unwrap();
    ns.wait_pvc_bound("src", CLAIM_BOUND).await.unwrap();
    // The source claim's PV pins the preparing pod to its node.
    let prepare = MoverSpec::shell("prepare", PREPARE_SOURCE).mount("src", "/src");
    let out = ns.run_pod(&prepare, POD_RUN).await.unwrap();
    assert!(out.succeeded(), "preparing the source tree: {out:?}");
    let node = out.node.clone().expect("prepare pod ran on a node");

    // The target is a WaitForFirstConsumer claim: the copy Job's pod, pinned to the source's
    // node, gets it provisioned there.
    ns.create_pvc("dst", &cluster.wffc_storage_class, "64Mi")
        .await
        .unwrap();
    let argv = [
        "rsync",
        "-aHAXS",
        "--numeric-ids",
        "--delete",
        "/src/",
        "/dst/",
    ];
    let copy = MoverSpec {
        name: "copy".into(),
        argv: argv.iter().map(|a| a.to_string()).collect(),
        node: Some(node.clone()),
        mounts: Vec::new(),
    }
    .mount("src", "/src")
    .mount("dst", "/dst");
    let job = ns.run_job(&copy, POD_RUN).await.unwrap();
    assert!(job.complete, "rsync Job completes: {job:?}");
    let pod = job.pod.as_ref().expect("the Job ran a pod");
    assert_eq!(pod.exit_code, Some(0), "{job:?}");
    assert_eq!(pod.node.as_deref(), Some(node.as_str()));
    let dst = ns.wait_pvc_bound("dst", CLAIM_BOUND).await.unwrap();
    assert_eq!(dst.annotations().get(SELECTED_NODE), Some(&node));

    let verify = MoverSpec::shell("verify", VERIFY_TREES)
        .on_node(&node)
        .mount("src", "/src")
        .mount("dst", "/dst");
    let out = ns.run_pod(&verify, POD_RUN).await.unwrap();
    assert!(
        out.succeeded(),
        "trees differ (see exit code in the script): {out:?}"
    );
    assert!(out.logs.contains("TREES-IDENTICAL"), "{out:?}");
    eprintln!("verify pod output:\n{}", out.logs);
    // `%p %m %U %G %n %s %y %l` of the target, as printed by the verify pod.
    let field = |path: &str, index: usize| -> Option<String> {
        out.logs
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .find(|f| f.first() == Some(&path))
            .and_then(|f| f.get(index).map(|s| s.to_string()))
    };
    assert_eq!(field("./hard-a", 4).as_deref(), Some("2"), "{}", out.logs);
    assert_eq!(field("./owned", 2).as_deref(), Some("1234"), "{}", out.logs);
    assert_eq!(field("./owned", 3).as_deref(), Some("5678"), "{}", out.logs);
    assert_eq!(field("./secret", 1).as_deref(), Some("600"), "{}", out.logs);
    assert_eq!(field("./link", 6).as_deref(), Some("l"), "{}", out.logs);
    assert_eq!(field("./empty", 6).as_deref(), Some("d"), "{}", out.logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_delete_keeps_members_serving_and_one_member_loss_keeps_writes() {
    let (_cluster, ns) = scenario("orphan").await;
    ns.apply_etcd().await.unwrap();
    let pods: Api<Pod> = ns.api();
    let mut uids = Vec::new();
    for i in 0..3 {
        uids.push(pods.get(&format!("etcd-{i}")).await.unwrap().uid().unwrap());
    }

    let sets: Api<StatefulSet> = ns.api();
    let set_uid = sets.get("etcd").await.unwrap().uid().unwrap();
    sets.delete(
        "etcd",
        &DeleteParams {
            propagation_policy: Some(PropagationPolicy::Orphan),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    ns.wait_deleted(sets.clone(), "etcd", &set_uid, Duration::from_secs(60))
        .await
        .unwrap();

    for (i, uid) in uids.iter().enumerate() {
        let name = format!("etcd-{i}");
        let pod = pods.get(&name).await.unwrap();
        assert_eq!(
            pod.uid().as_deref(),
            Some(uid.as_str()),
            "{name} is the same pod"
        );
        assert!(
            pod.metadata.deletion_timestamp.is_none(),
            "{name} is not being deleted"
        );
        assert!(
            pod.owner_references().iter().all(|r| r.uid != set_uid),
            "{name} no longer references the deleted set"
        );
        let ready = ns.wait_pod_ready(&name, Duration::from_secs(10)).await;
        assert!(ready.is_ok(), "{name} still Ready: {ready:?}");
    }

    let mut members = etcd::members(&ns, "etcd", 3).await.unwrap();
    for (i, m) in members.iter_mut().enumerate() {
        m.put(&format!("e2e/orphaned/{i}"), "still-serving")
            .await
            .unwrap_or_else(|e| panic!("put through {} after the orphan delete: {e}", m.pod));
    }

    // Take one follower away; the other two keep a quorum.
    let views = agreed_views(&mut members, Duration::from_secs(30)).await;
    let leader = views[0].leader;
    let victim = views
        .iter()
        .position(|v| v.id != leader)
        .expect("a follower");
    let victim_pod = members[victim].pod.clone();
    pods.delete(&victim_pod, &DeleteParams::default())
        .await
        .unwrap();
    ns.wait_deleted(
        pods.clone(),
        &victim_pod,
        &uids[victim],
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert!(
        pods.get_opt(&victim_pod).await.unwrap().is_none(),
        "nothing recreates {victim_pod} without its set"
    );
    let mut survivors: Vec<EtcdMember> = members
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, m)| m)
        .collect();
    for round in 0..5 {
        for m in survivors.iter_mut() {
            let key = format!("e2e/degraded/{round}/{}", m.pod);
            m.put(&key, "written-with-one-member-gone")
                .await
                .unwrap_or_else(|e| {
                    panic!("put through {} while {victim_pod} is gone: {e}", m.pod)
                });
        }
    }
    let (first, rest) = survivors.split_at_mut(1);
    let key = format!("e2e/degraded/4/{}", rest[0].pod);
    assert_eq!(
        first[0].get(&key).await.unwrap().as_deref(),
        Some("written-with-one-member-gone")
    );
}

/// The provisioner's reclaim promise: a Released volume with reclaim
/// policy Delete is freed, one with Retain is kept (with its data) until its policy is Delete.
/// On the local cluster the image files and mounts are checked too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_volumes_follow_their_reclaim_policy() {
    let (cluster, ns) = scenario("reclaim").await;
    let local = TestCluster::local_state();
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let pvs: Api<PersistentVolume> = Api::all(cluster.client.clone());
    let mut bound = Vec::new();
    for name in ["gone", "kept"] {
        ns.create_pvc(name, &cluster.storage_class, "16Mi")
            .await
            .unwrap();
    }
    for name in ["gone", "kept"] {
        let claim = ns.wait_pvc_bound(name, CLAIM_BOUND).await.unwrap();
        bound.push((claim.uid().unwrap(), cluster.pv_of(&claim).await.unwrap()));
    }
    let (gone_pv, kept_pv) = (bound[0].1.name_any(), bound[1].1.name_any());
    let image = |pv: &str| {
        local
            .as_ref()
            .map(|s| s.volumes_dir().join(format!("{pv}.img")))
    };
    let set_policy = |policy: &str| {
        Patch::Merge(serde_json::json!({"spec": {"persistentVolumeReclaimPolicy": policy}}))
    };
    pvs.patch(&kept_pv, &PatchParams::default(), &set_policy("Retain"))
        .await
        .unwrap();

    for (name, (uid, _)) in ["gone", "kept"].iter().zip(&bound) {
        claims.delete(name, &DeleteParams::default()).await.unwrap();
        ns.wait_deleted(claims.clone(), name, uid, Duration::from_secs(60))
            .await
            .unwrap();
    }
    let gone_uid = bound[0].1.uid().unwrap();
    ns.wait_deleted(pvs.clone(), &gone_pv, &gone_uid, Duration::from_secs(90))
        .await
        .unwrap();
    let released = |pv: Option<&PersistentVolume>| {
        pv.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Released")
    };
    ns.wait_for(
        pvs.clone(),
        &kept_pv,
        "retained PV Released",
        Duration::from_secs(60),
        released,
        |p| format!("{:?}", p.status),
    )
    .await
    .unwrap();
    if let (Some(gone), Some(kept)) = (image(&gone_pv), image(&kept_pv)) {
        assert!(!gone.exists(), "{} removed", gone.display());
        assert!(kept.exists(), "{} kept", kept.display());
    }
    // Still Released a moment later (the PV controller does not delete Retain volumes).
    let again = pvs.get(&kept_pv).await.unwrap();
    assert!(released(Some(&again)), "{:?}", again.status);

    // Switching it to Delete lets the provisioner free it.
    pvs.patch(&kept_pv, &PatchParams::default(), &set_policy("Delete"))
        .await
        .unwrap();
    let kept_uid = bound[1].1.uid().unwrap();
    ns.wait_deleted(pvs.clone(), &kept_pv, &kept_uid, Duration::from_secs(90))
        .await
        .unwrap();
    if let Some(kept) = image(&kept_pv) {
        assert!(
            !kept.exists(),
            "{} removed after the policy became Delete",
            kept.display()
        );
    }
}
