//! End-to-end: the ACLs and xattrs of a member with many files, moved while it changes them.
//!
//! A one-member generic StatefulSet (the `debian` image: the host's `sh`, `setfattr`,
//! `setfacl`, `getfattr`, `getfacl`) fills its volume with 60,000 empty files in 60 directories,
//! sets xattrs on a directory and a file of them, an ACL on another file and an xattr on a file
//! under `tree0/sub`, then, until it is stopped, every half second renames that tree to the next
//! name (`tree0`, `tree1`, ...: the file under it keeps its inode change time, but its path
//! changes) and sets a counter xattr on one file, recording both. The request comes more than a
//! minute after the files were written, so they are older than the verification's `SINCE`, as on
//! a volume in service.
//!
//! With more than 50,000 entries on the old volume and a pre-copy that compared every entry's
//! ACLs and xattrs, the final pass lists what differs or changed since (`ATTRS_SINCE`) in one
//! walk of both volumes (`storage-migrator tree-diff`), and copies and verifies those entries
//! only, with their ACLs and xattrs (docs/api.md). The member, restarted on its new
//! volume, reads back every xattr and the ACL at the paths it last recorded and prints them: all
//! must be there, the renamed tree's file's too.
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test attributes`

use std::time::{Duration, Instant};

use e2e::testing::operator::{Operator, create_request, install_crd, summary, wait_final};
use e2e::testing::{TestNamespace, one_member_set, scenario};
use k8s_openapi::api::core::v1::{ExecAction, Pod, Probe};
use kube::api::LogParams;
use serde_json::json;
use storage_migrator::api::Phase;

const APP: &str = "attrs";
const POD: &str = "attrs-0";

/// Fills the volume once, then churns until stopped; restarted on a filled volume, checks it.
const SCRIPT: &str = r#"stop=
trap 'stop=1' TERM
if [ -f /data/ready ]; then
  w=$(cat /data/where); n=$(cat /data/count)
  g() { getfattr --absolute-names --only-values -n "$1" "$2" 2>&1; }
  echo "CHECK labelled=$(g user.smr /data/tree$w/sub/labelled) count=$(g user.count /data/counter) recorded=$n acl=$(getfacl --absolute-names -cn /data/acl 2>&1 | grep -c '^user:1234:r--') dir=$(g user.dir /data/d7) file=$(g user.file /data/d7/f500) files=$(ls /data/d59 | wc -l) tree=$w"
  while [ -z "$stop" ]; do sleep 1; done
  exit 0
fi
i=0
while [ $i -lt 60 ]; do
  mkdir /data/d$i
  j=0
  while [ $j -lt 1000 ]; do : > /data/d$i/f$j; j=$((j + 1)); done
  i=$((i + 1))
done
setfattr -n user.dir -v dir /data/d7
setfattr -n user.file -v file /data/d7/f500
mkdir -p /data/tree0/sub
echo labelled > /data/tree0/sub/labelled
setfattr -n user.smr -v 7 /data/tree0/sub/labelled
echo acl > /data/acl
setfacl -m u:1234:r /data/acl
: > /data/counter
echo 0 > /data/where
echo 0 > /data/count
sync
: > /data/ready
echo FILLED
n=0
while [ -z "$stop" ]; do
  sleep 0.5
  n=$((n + 1))
  mv /data/tree$((n - 1)) /data/tree$n && echo $n > /data/where
  setfattr -n user.count -v $n /data/counter && echo $n > /data/count
done
"#;

/// The set, Ready once its volume is filled.
fn set(class: &str) -> k8s_openapi::api::apps::v1::StatefulSet {
    let mut set = one_member_set(APP, "debian", class, "2Gi", SCRIPT);
    let pod = (set.spec.as_mut())
        .and_then(|s| s.template.spec.as_mut())
        .expect("a pod template");
    pod.containers[0].readiness_probe = Some(Probe {
        exec: Some(ExecAction {
            command: Some(vec!["test".into(), "-f".into(), "/data/ready".into()]),
        }),
        period_seconds: Some(1),
        ..Default::default()
    });
    set
}

/// The member's `CHECK` line, once its restarted pod has printed it.
async fn check_line(ns: &TestNamespace) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let logs = ns.api::<Pod>().logs(POD, &LogParams::default()).await;
        if let Some(line) = logs.as_deref().ok().and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("CHECK "))
                .map(str::to_string)
        }) {
            return line;
        }
        assert!(
            Instant::now() < deadline,
            "no CHECK line from the restarted member: {logs:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The value of `key=` in the `CHECK` line.
fn field<'l>(line: &'l str, key: &str) -> &'l str {
    line.split(' ')
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acls_and_xattrs_of_a_member_of_many_files_survive_renames_and_changes_while_it_moves() {
    let (cluster, ns) = scenario("smr-attrs").await;
    install_crd(&ns).await.unwrap();
    ns.create_statefulset_ready(&set(&cluster.storage_class))
        .await
        .unwrap();
    // Older than the verification's margin, as the files of a volume in service are.
    let margin = storage_migrator::plan::VERIFY_CLOCK_MARGIN_SECONDS.unsigned_abs();
    tokio::time::sleep(Duration::from_secs(margin + 2)).await;
    let _op = Operator::start(&ns, 0, None).await.unwrap();
    create_request(
        &ns,
        "attrs",
        json!({
            "type": "StorageClassChange",
            "target": {"kind": "StatefulSet", "name": APP},
            "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
            "timeout": "15m",
            "database": {"engine": "Generic"},
        }),
    )
    .await
    .unwrap();
    let req = wait_final(&ns, "attrs", Duration::from_secs(600))
        .await
        .unwrap();
    let status = req.status.clone().unwrap();
    assert_eq!(status.phase, Phase::Successful, "{}", summary(&req));
    let m = &status.members[0].first_claim;
    assert_eq!(m.pre_copy_compared_attributes, Some(true), "{m:?}");
    let entries = m.source_entries.unwrap_or_default();
    assert!(
        entries >= storage_migrator::build::job::ATTRIBUTES_OF_CHANGED_MIN_ENTRIES,
        "{entries} entries: the final pass compared every entry's ACLs and xattrs"
    );
    assert!(m.verified.is_some(), "{m:?}");
    // The final pass walked both volumes once with the image's `storage-migrator tree-diff`
    // and copied and verified only what it listed (the renamed tree, the counter, the
    // member's records), not the 60,000 files.
    let listed = m.final_pass_listed_entries;
    assert!(listed.is_some_and(|n| n > 0 && n < 1000), "{m:?}");

    let line = check_line(&ns).await;
    eprintln!("NOTE attributes: {entries} entries; {line}");
    assert_eq!(field(&line, "labelled"), "7", "{line}");
    assert_eq!(field(&line, "count"), field(&line, "recorded"), "{line}");
    assert_eq!(field(&line, "acl"), "1", "{line}");
    assert_eq!(field(&line, "dir"), "dir", "{line}");
    assert_eq!(field(&line, "file"), "file", "{line}");
    assert_eq!(field(&line, "files"), "1000", "{line}");
    // The tree was renamed every half second until the member stopped, so after the pre-copy
    // too: the file under it came to its last path in the final pass, with its xattr.
    assert!(
        field(&line, "tree").parse::<u32>().is_ok_and(|n| n > 0),
        "{line}"
    );
}
