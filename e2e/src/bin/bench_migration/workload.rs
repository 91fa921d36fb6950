//! The benchmarked workload: a StatefulSet whose members append to their volume, and
//! the one-off pods that fill each member's volume before the migration.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use e2e::testing::{MoverSpec, TestNamespace, describe_pod};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Container, ExecAction, PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod, PodSpec,
    PodTemplateSpec, Probe, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::ResourceExt;
use kube::api::DeleteParams;
use tracing::info;

use crate::BenchError;
use crate::cli::DataSize;

pub const SET: &str = "bench";
const CLAIM_TEMPLATE: &str = "data";
/// Size of each fill file, MiB.
const FILL_FILE_MIB: u64 = 64;
const POD_SCHEDULED: Duration = Duration::from_secs(300);
const FILL_POD_GONE: Duration = Duration::from_secs(120);

/// The member's program, every 100 ms: append a short line to a log and, once the volume is
/// filled, overwrite the next 4 KiB of the first 64 MiB fill file in place, as a database
/// writes its preallocated WAL segment. So the final pass finds a few KiB changed in a large
/// file. Exits on SIGTERM (sh as the container's first process would otherwise ignore it and
/// wait out the grace period).
pub const WRITER_SCRIPT: &str = r#"trap 'exit 0' TERM INT
n=0
while :; do
  n=$((n + 1))
  echo "$n $(date -u +%s)" >> /data/writes.log
  if [ -f /data/ready ]; then
    dd if=/dev/urandom of=/data/fill-0 bs=4096 count=1 seek=$((n % 16384)) conv=notrunc 2>/dev/null
  fi
  sleep 0.1
done
"#;

/// The fill pod's program: `$1` MiB of incompressible data in files of `$2` MiB, then the
/// readiness file. The sizes come as arguments, never interpolated into the script.
pub const FILL_SCRIPT: &str = r#"set -eu
left=$1
chunk=$2
i=0
while [ "$left" -gt 0 ]; do
  n=$chunk
  if [ "$left" -lt "$chunk" ]; then n=$left; fi
  dd if=/dev/urandom of="/data/fill-$i" bs=1M count="$n" iflag=fullblock status=none
  left=$((left - n))
  i=$((i + 1))
done
sync
touch /data/ready
echo "filled $i files"
"#;

/// The writer container: [`WRITER_SCRIPT`] on `busybox`, Ready once `/data/ready` exists.
fn writer_container() -> Container {
    Container {
        name: "writer".into(),
        image: Some("busybox".into()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["sh".into(), "-c".into(), WRITER_SCRIPT.into()]),
        readiness_probe: Some(Probe {
            exec: Some(ExecAction {
                command: Some(vec!["test".into(), "-f".into(), "/data/ready".into()]),
            }),
            period_seconds: Some(1),
            ..Default::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: CLAIM_TEMPLATE.into(),
            mount_path: "/data".into(),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// The set's claim template: `storage_size` on `class`.
fn claim_template(storage_size: &str, class: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(CLAIM_TEMPLATE.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some(class.into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(storage_size.into()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// The benchmarked StatefulSet: `replicas` writers, claims of `storage_size` on `class`.
pub fn statefulset(storage_size: &str, class: &str, replicas: i32) -> StatefulSet {
    let labels = BTreeMap::from([("app".to_string(), SET.to_string())]);
    StatefulSet {
        metadata: ObjectMeta {
            name: Some(SET.into()),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
            service_name: Some(SET.into()),
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    termination_grace_period_seconds: Some(10),
                    containers: vec![writer_container()],
                    ..Default::default()
                }),
            },
            volume_claim_templates: Some(vec![claim_template(storage_size, class)]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The node the scheduler put `member` on (waits up to [`POD_SCHEDULED`]).
async fn scheduled_node(ns: &TestNamespace, member: &str) -> Result<String, BenchError> {
    let scheduled = |p: Option<&Pod>| {
        p.and_then(|p| p.spec.as_ref())
            .and_then(|s| s.node_name.as_ref())
            .is_some()
    };
    let pod = ns
        .wait_for(
            ns.api::<Pod>(),
            member,
            "member pod scheduled",
            POD_SCHEDULED,
            scheduled,
            describe_pod,
        )
        .await?;
    Ok(pod
        .and_then(|p| p.spec)
        .and_then(|s| s.node_name)
        .unwrap_or_default())
}

/// The fill pod `name`: [`FILL_SCRIPT`] for `size` on `node`, with `claim` at `/data`.
fn fill_spec(name: &str, node: &str, claim: &str, size: &DataSize) -> MoverSpec {
    MoverSpec {
        name: name.to_string(),
        argv: vec![
            "sh".into(),
            "-c".into(),
            FILL_SCRIPT.into(),
            "fill".into(),
            size.mib.to_string(),
            FILL_FILE_MIB.to_string(),
        ],
        node: None,
        mounts: Vec::new(),
    }
    .on_node(node)
    .mount(claim, "/data")
}

/// Deletes the pod `name` and waits until it is gone.
async fn delete_pod(ns: &TestNamespace, name: &str) -> Result<(), BenchError> {
    let api = ns.api::<Pod>();
    let uid = api.get(name).await?.uid().unwrap_or_default();
    api.delete(name, &DeleteParams::default()).await?;
    ns.wait_deleted(api, name, &uid, FILL_POD_GONE).await?;
    Ok(())
}

/// Fills one member's volume on its node; returns once the fill pod is gone again.
pub async fn fill_member(
    ns: &TestNamespace,
    ordinal: i32,
    size: &DataSize,
) -> Result<(), BenchError> {
    let member = format!("{SET}-{ordinal}");
    let node = scheduled_node(ns, &member).await?;
    let name = format!("fill-{member}");
    let spec = fill_spec(&name, &node, &format!("{CLAIM_TEMPLATE}-{member}"), size);
    // Generous: 2 min plus 4 MiB/s.
    let timeout = Duration::from_secs(120 + size.mib / 4);
    let started = Instant::now();
    let outcome = ns.run_pod(&spec, timeout).await?;
    if !outcome.succeeded() {
        return Err(BenchError::Fill {
            pod: name,
            node,
            phase: outcome.phase.clone(),
            exit: outcome.exit_code,
            output: outcome.output(),
        });
    }
    info!(namespace = %ns.name, %member, %node, took = ?started.elapsed(), "volume filled");
    delete_pod(ns, &name).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_take_no_input_by_interpolation() {
        // The size reaches the fill script as $1 only.
        assert!(FILL_SCRIPT.contains("left=$1"));
        assert!(FILL_SCRIPT.contains("chunk=$2"));
        assert!(!FILL_SCRIPT.contains("{"));
        let set = statefulset("256Mi", "standard", 3);
        let spec = set.spec.unwrap();
        assert_eq!(spec.replicas, Some(3));
        let c = &spec.template.spec.unwrap().containers[0];
        assert_eq!(c.command.as_ref().unwrap()[2], WRITER_SCRIPT);
        let probe = c.readiness_probe.as_ref().unwrap();
        assert_eq!(
            probe.exec.as_ref().unwrap().command.as_deref().unwrap(),
            ["test", "-f", "/data/ready"]
        );
    }

    #[test]
    fn fill_pods_are_pinned_and_mount_the_member_claim() {
        let size = DataSize {
            label: "64Mi".into(),
            mib: 64,
        };
        let spec = fill_spec("fill-bench-0", "node-b", "data-bench-0", &size);
        assert_eq!(spec.node.as_deref(), Some("node-b"));
        assert_eq!(spec.argv[3..], ["fill", "64", "64"]);
        assert_eq!(spec.mounts[0].claim, "data-bench-0");
        assert_eq!(spec.mounts[0].mount_path, "/data");
    }
}
