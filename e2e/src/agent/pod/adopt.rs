//! Re-adoption of a pod's containers by an agent started again (a kubelet restart): the agent
//! died (SIGKILL), its containers did not (see `runtime::supervise`). What a pod dir holds per
//! container: the init spec and pid file (`runtime::recorded_container`), the exit code its
//! supervisor recorded, and the run record written here at each start ([`RunRecord`]: which run
//! it is and when it started, as reported to the API).
//!
//! [`decide`] is the pure decision from those records and the pod; the worker then either
//! adopts (same sandbox, IP, restart count, start time; the still-running processes are waited
//! for, an ended one is reported with its recorded exit code and restarted as its restartPolicy
//! says), or discards the leftovers and starts the pod from scratch.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::agent::runtime::{ContainerSpec, Recorded, Sandbox};
use crate::agent::status::CState;

/// What the agent notes about one run of a container when it starts it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The supervisor's pid (as in the pid file).
    pub pid: u32,
    /// The restart count of this run.
    pub attempt: i32,
    /// RFC 3339, the `startedAt` reported for this run.
    pub started_at: String,
    pub image: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot encode the run record: {0}")]
    Encode(#[source] serde_json::Error),
}

/// `<dir>/<name>.run`.
pub fn run_record_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.run"))
}

pub fn write_run_record(dir: &Path, name: &str, record: &RunRecord) -> Result<(), RecordError> {
    let path = run_record_path(dir, name);
    let text = serde_json::to_vec(record).map_err(RecordError::Encode)?;
    std::fs::write(&path, text).map_err(|source| RecordError::Write { path, source })
}

pub fn read_run_record(dir: &Path, name: &str) -> Option<RunRecord> {
    serde_json::from_slice(&std::fs::read(run_record_path(dir, name)).ok()?).ok()
}

/// What a pod dir holds about one container of the pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub name: String,
    pub run: Option<RunRecord>,
    pub container: Option<Recorded>,
}

/// A container taken over from the previous agent.
#[derive(Debug, Clone, PartialEq)]
pub struct Adopted {
    pub pid: u32,
    pub attempt: i32,
    pub started_at: Timestamp,
    pub image: String,
    pub spec: ContainerSpec,
    /// `Some`: the program ended while the agent was away (`Some(None)`: killed before its
    /// supervisor could record a code).
    pub ended: Option<Option<i32>>,
    /// Ready and started as last reported (the probes take over from there).
    pub ready: bool,
    pub started: bool,
}

/// A pod taken over: its sandbox, its main containers (in spec order), its init containers'
/// final states (as last reported).
#[derive(Debug, Clone, PartialEq)]
pub struct Adoption {
    pub sandbox: Sandbox,
    pub containers: Vec<Adopted>,
    pub init_states: Vec<CState>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Nothing of the pod on disk: start it as usual.
    Fresh,
    /// Leftovers that cannot be taken over (why): remove them, then start as usual.
    Discard(String),
    Adopt(Adoption),
}

/// Whether to take over the containers recorded in the pod dir (`found`: one entry per main
/// container of the pod's spec, in order; `inits_found`: whether any init container left a
/// record). Adopted only when every main container has a matching run record and init spec, all
/// in one sandbox (at the pod's reported IP), and every init container is reported completed.
pub fn decide(pod: &Pod, found: &[Found], inits_found: bool) -> Decision {
    if !inits_found
        && found
            .iter()
            .all(|f| f.run.is_none() && f.container.is_none())
    {
        return Decision::Fresh;
    }
    let Some(init_states) = completed_inits(pod) else {
        return Decision::Discard("its init containers had not all completed".into());
    };
    let mut containers = Vec::new();
    let mut sandbox: Option<Sandbox> = None;
    for f in found {
        let (Some(run), Some(rec)) = (&f.run, &f.container) else {
            return Decision::Discard(format!("container {} has no complete record", f.name));
        };
        if run.pid != rec.pid {
            return Decision::Discard(format!("container {}: records disagree", f.name));
        }
        if sandbox.as_ref().is_some_and(|s| *s != rec.sandbox) {
            return Decision::Discard("containers in different sandboxes".into());
        }
        sandbox = Some(rec.sandbox.clone());
        let Ok(started_at) = run.started_at.parse::<Timestamp>() else {
            return Decision::Discard(format!("container {}: bad start time", f.name));
        };
        let (ready, started) = reported_flags(pod, &f.name, run.attempt);
        containers.push(Adopted {
            pid: rec.pid,
            attempt: run.attempt,
            started_at,
            image: run.image.clone(),
            spec: rec.spec.clone(),
            ended: (!rec.running).then_some(rec.exit_code),
            ready: ready && rec.running,
            started: started && rec.running,
        });
    }
    let Some(sandbox) = sandbox else {
        return Decision::Discard("no main container was started".into());
    };
    let reported_ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref());
    if reported_ip.is_some_and(|ip| ip != sandbox.ip.to_string()) {
        return Decision::Discard(format!("sandbox IP {} is not the pod's", sandbox.ip));
    }
    Decision::Adopt(Adoption {
        sandbox,
        containers,
        init_states,
    })
}

/// The final states of the pod's init containers when every one is reported completed (exit 0).
fn completed_inits(pod: &Pod) -> Option<Vec<CState>> {
    let wanted = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .map_or(0, Vec::len);
    if wanted == 0 {
        return Some(Vec::new());
    }
    let statuses = pod.status.as_ref()?.init_container_statuses.as_ref()?;
    if statuses.len() != wanted {
        return None;
    }
    statuses
        .iter()
        .map(|s| {
            let t = s.state.as_ref()?.terminated.as_ref()?;
            (t.exit_code == 0).then(|| CState::Terminated {
                exit_code: 0,
                signal: None,
                reason: t.reason.clone().unwrap_or_else(|| "Completed".into()),
                message: t.message.clone(),
                started_at: t.started_at.as_ref().map(|x| x.0),
                finished_at: t.finished_at.as_ref().map_or_else(Timestamp::now, |x| x.0),
                container_id: t.container_id.clone(),
            })
        })
        .collect()
}

/// `(ready, started)` of container `name` as last reported, if the report is of run `attempt`.
fn reported_flags(pod: &Pod, name: &str, attempt: i32) -> (bool, bool) {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|l| l.iter().find(|c| c.name == name))
        .filter(|c| c.restart_count == attempt)
        .map_or((false, false), |c| (c.ready, c.started.unwrap_or(false)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn pod(status: serde_json::Value, inits: bool) -> Pod {
        let init = if inits {
            serde_json::json!([{"name": "init", "image": "i"}])
        } else {
            serde_json::json!([])
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": "x"}], "initContainers": init},
            "status": status,
        }))
        .unwrap()
    }

    fn sandbox(ip: u8) -> Sandbox {
        Sandbox {
            netns: "ns".into(),
            ip: Ipv4Addr::new(198, 18, 1, ip),
            host_veth: "v".into(),
            dir: PathBuf::from("/d"),
        }
    }

    fn found(pid: u32, running: bool, exit_code: Option<i32>) -> Found {
        Found {
            name: "c".into(),
            run: Some(RunRecord {
                pid,
                attempt: 2,
                started_at: "2026-01-01T00:00:00Z".into(),
                image: "x".into(),
            }),
            container: Some(Recorded {
                sandbox: sandbox(5),
                spec: ContainerSpec {
                    argv: vec!["/bin/true".into()],
                    env: vec![],
                    working_dir: None,
                    mounts: vec![],
                    hostname: "p".into(),
                    log_path: PathBuf::from("/d/c/2.log"),
                    run_as_user: None,
                    run_as_group: None,
                    security: Default::default(),
                    image_root: None,
                    image_uid: None,
                },
                pid: 7,
                exit_code,
                running,
            }),
        }
    }

    fn running_status() -> serde_json::Value {
        serde_json::json!({"podIP": "198.18.1.5", "containerStatuses": [
            {"name": "c", "image": "x", "imageID": "", "ready": true, "restartCount": 2,
             "started": true, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]})
    }

    #[test]
    fn a_running_container_is_adopted_as_reported() {
        let Decision::Adopt(a) = decide(
            &pod(running_status(), false),
            &[found(7, true, None)],
            false,
        ) else {
            panic!("not adopted");
        };
        assert_eq!(a.sandbox, sandbox(5));
        let c = &a.containers[0];
        assert_eq!(
            (c.pid, c.attempt, c.ended, c.ready, c.started),
            (7, 2, None, true, true)
        );
        assert_eq!(c.started_at.to_string(), "2026-01-01T00:00:00Z");
    }

    #[test]
    fn a_container_that_ended_meanwhile_carries_its_exit_code() {
        let p = pod(running_status(), false);
        let Decision::Adopt(a) = decide(&p, &[found(7, false, Some(3))], false) else {
            panic!("not adopted");
        };
        assert_eq!(a.containers[0].ended, Some(Some(3)));
        assert!(!a.containers[0].ready);
        let Decision::Adopt(a) = decide(&p, &[found(7, false, None)], false) else {
            panic!("not adopted");
        };
        assert_eq!(a.containers[0].ended, Some(None));
    }

    #[test]
    fn nothing_on_disk_is_fresh_and_incomplete_records_are_discarded() {
        let p = pod(running_status(), false);
        let empty = Found {
            name: "c".into(),
            run: None,
            container: None,
        };
        assert_eq!(
            decide(&p, std::slice::from_ref(&empty), false),
            Decision::Fresh
        );
        assert!(matches!(decide(&p, &[empty], true), Decision::Discard(_)));
        let mut partial = found(7, true, None);
        partial.run = None;
        assert!(matches!(
            decide(&p, &[partial], false),
            Decision::Discard(_)
        ));
        // A pid file of another run than the run record.
        assert!(matches!(
            decide(&p, &[found(8, true, None)], false),
            Decision::Discard(_)
        ));
        // Another IP than the pod's.
        let moved = pod(serde_json::json!({"podIP": "198.18.1.9"}), false);
        assert!(matches!(
            decide(&moved, &[found(7, true, None)], false),
            Decision::Discard(_)
        ));
    }

    #[test]
    fn init_containers_must_have_completed() {
        let f = [found(7, true, None)];
        assert!(matches!(
            decide(&pod(running_status(), true), &f, true),
            Decision::Discard(_)
        ));
        let mut st = running_status();
        st["initContainerStatuses"] = serde_json::json!([{"name": "init", "image": "i",
            "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                "finishedAt": "2026-01-01T00:00:00Z"}}}]);
        let Decision::Adopt(a) = decide(&pod(st, true), &f, true) else {
            panic!("not adopted");
        };
        assert_eq!(a.init_states.len(), 1);
        // A report of an older run leaves ready and started to the probes.
        let mut old = running_status();
        old["containerStatuses"][0]["restartCount"] = serde_json::json!(1);
        let Decision::Adopt(a) = decide(&pod(old, false), &f, false) else {
            panic!("not adopted");
        };
        assert!(!a.containers[0].ready);
    }
}
