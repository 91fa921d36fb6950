//! The local cluster runs real images: `localcluster image load` of an OCI archive built here
//! (a static busybox, a whiteout layer, a config with Entrypoint/Cmd/Env/WorkingDir/User), pods
//! from it, the pull policies of a node without a registry, and refused archives.
//!
//! Needs the local cluster (`KUBECONFIG` from `localcluster up`: the store is the state dir's) and
//! Debian's `busybox-static` (`/bin/busybox`, installed by install-deps.sh).
//!
//! Run: `/tmp/tools/e2e-one.sh images`, or
//! `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test images -- --test-threads=2`

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e::images::build::{Layer, LayerBuilder, oci_archive};
use e2e::testing::{TestCluster, TestNamespace, describe_pod, random_suffix, scenario};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{LogParams, PostParams};
use tracing::info;

const LOCALCLUSTER: &str = env!("CARGO_BIN_EXE_localcluster");
const BUSYBOX: &str = "/bin/busybox";
const POD_RUN: Duration = Duration::from_secs(120);

/// What the image's command prints (its Cmd, run by its Entrypoint `/bin/sh -c`).
const REPORT: &str = r#"echo "marker=$(cat /etc/marker)"
if [ -e /etc/doomed ]; then echo doomed=present; else echo doomed=absent; fi
echo "opq="$(ls /opq)
if [ -e /etc/debian_version ] || [ -e /usr/bin/cargo ]; then echo host=visible; else echo host=hidden; fi
echo "uid=$(id -u) gid=$(id -g)"
echo "pwd=$(pwd)"
echo "img=$IMG_VAR override=$OVERRIDE home=$HOME"
"#;

/// The cluster's state dir (the store is `DIR/images`).
fn state_dir() -> PathBuf {
    TestCluster::local_state()
        .expect("these tests need the local cluster: KUBECONFIG from `localcluster up`")
        .dir
}

/// A two-layer image: busybox, applet links (symlinks and a hard link), passwd/group with a
/// named user, a marker; the second layer (uncompressed) deletes `/etc/doomed` and empties
/// `/opq` (opaque whiteout) while adding `/opq/new`.
fn image_archive(name: &str, marker: &str) -> (Vec<u8>, Vec<String>) {
    let busybox = std::fs::read(BUSYBOX)
        .unwrap_or_else(|e| panic!("{BUSYBOX} (Debian's busybox-static): {e}"));
    let l1 = LayerBuilder::new()
        .dir("bin/", 0o755, (0, 0))
        .file("bin/busybox", 0o755, (0, 0), &busybox)
        .symlink("bin/sh", "busybox")
        .symlink("bin/ls", "/bin/busybox")
        .symlink("bin/id", "busybox")
        // `cat` (used for the marker) is a hard link.
        .hard_link("bin/cat", "bin/busybox")
        .dir("etc/", 0o755, (0, 0))
        .file(
            "etc/passwd",
            0o644,
            (0, 0),
            b"root:x:0:0:root:/root:/bin/sh\nappuser:x:4321:4322:app:/home/app:/bin/sh\n",
        )
        .file("etc/group", 0o644, (0, 0), b"root:x:0:\nappgroup:x:4322:\n")
        .file("etc/marker", 0o644, (0, 0), marker.as_bytes())
        .file(
            "etc/doomed",
            0o644,
            (0, 0),
            b"deleted by the second layer\n",
        )
        .dir("opq/", 0o755, (0, 0))
        .file("opq/old", 0o644, (0, 0), b"hidden by the opaque whiteout\n")
        .dir("home/", 0o755, (0, 0))
        .dir("home/app/", 0o755, (4321, 4322))
        .dir("work/", 0o755, (4321, 4322))
        .dir("tmp/", 0o1777, (0, 0))
        .finish();
    let l2 = LayerBuilder::new()
        .whiteout("etc/.wh.doomed")
        .whiteout("opq/.wh..wh..opq")
        .file("opq/new", 0o644, (0, 0), b"new\n")
        .finish();
    let config = serde_json::json!({
        "User": "appuser:appgroup",
        "Env": ["PATH=/bin", "IMG_VAR=from-image", "OVERRIDE=image"],
        "Entrypoint": ["/bin/sh", "-c"],
        "Cmd": [REPORT],
        "WorkingDir": "/work",
    });
    oci_archive(&[Layer::gzip(l1), Layer::plain(l2)], config, name)
}

/// `localcluster image load`; (success, stderr).
fn image_load(archive: &Path) -> (bool, String) {
    let state = state_dir();
    let t = Instant::now();
    let out = std::process::Command::new(LOCALCLUSTER)
        .args(["image", "load", "--state-dir"])
        .arg(&state)
        .arg(archive)
        .output()
        .expect("run localcluster image load");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    info!(ok = out.status.success(), elapsed = ?t.elapsed(), %stderr, "image load");
    (out.status.success(), stderr)
}

fn write_archive(bytes: &[u8]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("e2e-image-{}.tar", random_suffix()));
    std::fs::write(&path, bytes).expect("write the archive");
    path
}

fn load_ok(bytes: &[u8]) -> String {
    let path = write_archive(bytes);
    let (ok, stderr) = image_load(&path);
    let _ = std::fs::remove_file(&path);
    assert!(ok, "image load failed: {stderr}");
    stderr
}

fn pod(name: &str, image: &str, policy: Option<&str>) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": image, "imagePullPolicy": policy,
                "env": [{"name": "OVERRIDE", "value": "container"}],
            }],
        },
    }))
    .expect("pod manifest")
}

/// Runs the image's own command in a pod; returns its log (the pod must succeed).
async fn run_image(ns: &TestNamespace, name: &str, image: &str) -> String {
    let api = ns.api::<Pod>();
    api.create(&PostParams::default(), &pod(name, image, None))
        .await
        .expect("create pod");
    let done = ns
        .wait_pod_finished(name, POD_RUN)
        .await
        .expect("pod finishes");
    let logs = api
        .logs(name, &LogParams::default())
        .await
        .expect("pod logs");
    let phase = done.status.as_ref().and_then(|s| s.phase.clone());
    assert_eq!(
        phase.as_deref(),
        Some("Succeeded"),
        "{}\nlogs:\n{logs}",
        describe_pod(&done)
    );
    logs
}

/// The store's index and directory listing (top level and image dirs).
fn store_snapshot() -> (String, Vec<String>) {
    let store = state_dir().join("images");
    let index = std::fs::read_to_string(store.join("index.json")).unwrap_or_default();
    let mut names: Vec<String> = Vec::new();
    for dir in [store.clone(), store.join("sha256")] {
        for e in std::fs::read_dir(&dir).expect("list the store") {
            names.push(e.expect("dir entry").path().display().to_string());
        }
    }
    names.sort();
    (index, names)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_runs_on_its_images_root_with_its_config() {
    let (_cluster, ns) = scenario("image-root").await;
    let image = format!("localhost/e2e/probe:{}", random_suffix());
    let marker = format!("marker-{}", random_suffix());
    let (archive, _) = image_archive(&image, &marker);
    let stderr = load_ok(&archive);
    assert!(stderr.contains(&format!("loaded: {image}")), "{stderr}");
    let logs = run_image(&ns, "probe", &image).await;
    info!(%logs, "pod log");
    for expected in [
        format!("marker={marker}"),
        "doomed=absent".into(),
        "opq=new".into(),
        "host=hidden".into(),
        "uid=4321 gid=4322".into(),
        "pwd=/work".into(),
        "img=from-image override=container home=/home/app".into(),
    ] {
        assert!(
            logs.lines().any(|l| l == expected),
            "{expected:?} not in the log:\n{logs}"
        );
    }
}

/// Waits until container `main` of pod `name` waits with one of `reasons`; returns the message.
async fn waiting_message(ns: &TestNamespace, name: &str, reasons: &[&str]) -> String {
    let cond = |p: Option<&Pod>| waiting_of(p).is_some_and(|(r, _)| reasons.contains(&r.as_str()));
    let pod = ns
        .wait_for(
            ns.api(),
            name,
            "container waiting",
            POD_RUN,
            cond,
            describe_pod,
        )
        .await
        .expect("container waits")
        .expect("pod exists");
    waiting_of(Some(&pod)).map(|(_, m)| m).unwrap_or_default()
}

fn waiting_of(p: Option<&Pod>) -> Option<(String, String)> {
    let w = p?
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .waiting
        .clone()?;
    Some((w.reason.unwrap_or_default(), w.message.unwrap_or_default()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_policies_of_a_node_without_registry() {
    let (_cluster, ns) = scenario("image-pull").await;
    let suffix = random_suffix();
    let absent = format!("localhost/e2e/absent:{suffix}");
    let latest = format!("localhost/e2e/latest-{suffix}:latest");
    let (archive, _) = image_archive(&latest, "latest");
    load_ok(&archive);
    let api = ns.api::<Pod>();
    let pp = PostParams::default();
    for (name, image, policy) in [
        ("unknown", absent.as_str(), None),
        ("never", absent.as_str(), Some("Never")),
        ("always", latest.as_str(), None),
        ("stored", latest.as_str(), Some("Never")),
    ] {
        api.create(&pp, &pod(name, image, policy))
            .await
            .expect("create pod");
    }
    let pulls = ["ErrImagePull", "ImagePullBackOff"];
    let msg = waiting_message(&ns, "unknown", &pulls).await;
    assert!(msg.contains(&absent), "{msg}");
    let msg = waiting_message(&ns, "never", &["ErrImageNeverPull"]).await;
    assert!(msg.contains(&absent) && msg.contains("Never"), "{msg}");
    // `:latest` defaults to Always: a loaded image cannot be "pulled" again.
    let msg = waiting_message(&ns, "always", &pulls).await;
    assert!(
        msg.contains(&latest) && msg.contains("no registry"),
        "{msg}"
    );
    let done = ns
        .wait_pod_finished("stored", POD_RUN)
        .await
        .expect("pod finishes");
    let phase = done.status.as_ref().and_then(|s| s.phase.clone());
    assert_eq!(
        phase.as_deref(),
        Some("Succeeded"),
        "{}",
        describe_pod(&done)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_archives_leave_the_store_as_it_was() {
    let (_cluster, ns) = scenario("image-refused").await;
    let image = format!("localhost/e2e/refused:{}", random_suffix());
    let (good, _) = image_archive(&image, "first-build");
    load_ok(&good);
    let before = store_snapshot();
    // A new build under the same name, damaged two ways.
    let (next, layers) = image_archive(&image, "second-build");
    let hex = &layers[0][7..];
    let header_at = next
        .windows(hex.len())
        .position(|w| w == hex.as_bytes())
        .expect("layer blob in the archive");
    let data_at = (header_at / 512 + 1) * 512;
    let mut corrupt = next.clone();
    corrupt[data_at + 4096] ^= 0x01;
    for (what, bytes, expected) in [
        ("corrupt", &corrupt[..], "digest mismatch"),
        (
            "truncated",
            &next[..data_at + 8192],
            "unexpected end of archive",
        ),
    ] {
        let path = write_archive(bytes);
        let (ok, stderr) = image_load(&path);
        let _ = std::fs::remove_file(&path);
        assert!(!ok, "{what} archive was accepted: {stderr}");
        // Both errors name the layer blob (`sha256:<hex>` / `blobs/sha256/<hex>`).
        assert!(
            stderr.contains(expected) && stderr.contains(hex),
            "{what}: {stderr}"
        );
        assert_eq!(store_snapshot(), before, "{what} archive changed the store");
    }
    let logs = run_image(&ns, "still-first", &image).await;
    assert!(logs.lines().any(|l| l == "marker=first-build"), "{logs}");
    // The intact new build replaces the name's target; loading it again changes nothing.
    load_ok(&next);
    let after = store_snapshot();
    assert_ne!(after.0, before.0);
    let stderr = load_ok(&next);
    assert!(stderr.contains("already present"), "{stderr}");
    assert_eq!(store_snapshot(), after);
    let logs = run_image(&ns, "second", &image).await;
    assert!(logs.lines().any(|l| l == "marker=second-build"), "{logs}");
}
