//! Pod status as the kubelet computes it: container records → containerStatuses, phase,
//! conditions; restart policy and the crash-loop backoff. Pure functions.

use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// The host IP of every node (pods' `status.hostIP`).
pub const HOST_IP: &str = "127.0.0.1";

/// The state of one container as the agent knows it.
#[derive(Debug, Clone, PartialEq)]
pub enum CState {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: Timestamp,
    },
    Terminated {
        exit_code: i32,
        signal: Option<i32>,
        reason: String,
        message: Option<String>,
        started_at: Option<Timestamp>,
        finished_at: Timestamp,
        container_id: Option<String>,
    },
}

impl CState {
    pub fn waiting(reason: &str, message: Option<String>) -> Self {
        CState::Waiting {
            reason: reason.to_string(),
            message,
        }
    }

    fn to_api(&self) -> ContainerState {
        match self {
            CState::Waiting { reason, message } => ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.clone()),
                    message: message.clone(),
                }),
                ..Default::default()
            },
            CState::Running { started_at } => ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(*started_at)),
                }),
                ..Default::default()
            },
            CState::Terminated {
                exit_code,
                signal,
                reason,
                message,
                started_at,
                finished_at,
                container_id,
            } => ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: *exit_code,
                    signal: *signal,
                    reason: Some(reason.clone()),
                    message: message.clone(),
                    started_at: started_at.map(Time),
                    finished_at: Some(Time(*finished_at)),
                    container_id: container_id.clone(),
                }),
                ..Default::default()
            },
        }
    }

    pub fn is_running(&self) -> bool {
        matches!(self, CState::Running { .. })
    }

    pub fn exit_code(&self) -> Option<i32> {
        match self {
            CState::Terminated { exit_code, .. } => Some(*exit_code),
            _ => None,
        }
    }
}

/// Everything the agent tracks about one container.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerRecord {
    pub name: String,
    pub image: String,
    pub state: CState,
    /// The previous (terminated) state, after a restart.
    pub last_state: Option<CState>,
    pub restart_count: i32,
    pub ready: bool,
    /// Startup probe passed (or none), while running.
    pub started: bool,
    pub container_id: Option<String>,
    /// An init container with `restartPolicy: Always` (a native sidecar): it keeps running
    /// beside the main containers, counts as initialized once started, and its readiness
    /// counts for the pod's.
    pub sidecar: bool,
}

impl ContainerRecord {
    pub fn new(name: &str, image: &str) -> Self {
        ContainerRecord {
            name: name.to_string(),
            image: image.to_string(),
            state: CState::waiting("ContainerCreating", None),
            last_state: None,
            restart_count: 0,
            ready: false,
            started: false,
            container_id: None,
            sidecar: false,
        }
    }

    /// Whether it holds the pod's initialization back: a regular init container until it
    /// exited 0, a sidecar until it first started.
    fn initializing(&self) -> bool {
        if self.sidecar {
            self.restart_count == 0 && !(self.state.is_running() && self.started)
        } else {
            self.state.exit_code() != Some(0)
        }
    }

    fn to_api(&self) -> ContainerStatus {
        ContainerStatus {
            name: self.name.clone(),
            image: self.image.clone(),
            image_id: format!("localcluster://{}", self.image),
            container_id: self.container_id.clone(),
            state: Some(self.state.to_api()),
            last_state: Some(
                self.last_state
                    .as_ref()
                    .map(CState::to_api)
                    .unwrap_or_default(),
            ),
            ready: self.ready,
            restart_count: self.restart_count,
            started: Some(self.started && self.state.is_running()),
            ..Default::default()
        }
    }
}

/// What the agent knows about one pod.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodRecord {
    pub pod_ip: Option<String>,
    pub start_time: Option<Timestamp>,
    pub init_containers: Vec<ContainerRecord>,
    pub containers: Vec<ContainerRecord>,
    /// A terminal phase once reached (never left again).
    pub terminal_phase: Option<String>,
    /// Pod-level reason/message (e.g. while the sandbox cannot be created).
    pub message: Option<String>,
}

/// `restartPolicy` of a pod (Always when unset).
pub fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

/// Whether `c` is a native sidecar: an init container with `restartPolicy: Always`.
pub fn is_sidecar(c: &k8s_openapi::api::core::v1::Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Whether a container that exited with `exit_code` is started again.
pub fn should_restart(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// Whether a failed init container is run again (init containers never restart on success).
pub fn should_restart_init(policy: &str, exit_code: i32) -> bool {
    exit_code != 0 && policy != "Never"
}

/// Crash-loop backoff before restart number `n` (0-based): 1 s, 2 s, 4 s, ... capped at 30 s.
pub fn restart_backoff(n: u32) -> Duration {
    Duration::from_secs(1u64.checked_shl(n.min(16)).unwrap_or(u64::MAX).min(30))
}

/// A container that ran this long without failing starts the backoff over.
pub const BACKOFF_RESET: Duration = Duration::from_secs(60);

/// The pod phase, as the kubelet's `getPhase` computes it.
pub fn compute_phase(policy: &str, rec: &PodRecord) -> String {
    if let Some(p) = &rec.terminal_phase {
        return p.clone();
    }
    let mut pending_init = 0;
    for c in &rec.init_containers {
        if c.sidecar {
            pending_init += usize::from(c.initializing());
            continue;
        }
        match (&c.state, &c.last_state) {
            (CState::Terminated { exit_code: 0, .. }, _) => {}
            (CState::Terminated { .. }, _) if policy == "Never" => return "Failed".into(),
            (CState::Waiting { .. }, Some(CState::Terminated { exit_code, .. }))
                if *exit_code != 0 && policy == "Never" =>
            {
                return "Failed".into();
            }
            _ => pending_init += 1,
        }
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for c in &rec.containers {
        match &c.state {
            CState::Running { .. } => running += 1,
            CState::Terminated { exit_code, .. } => {
                stopped += 1;
                if *exit_code == 0 {
                    succeeded += 1;
                }
            }
            CState::Waiting { .. } => {
                if matches!(c.last_state, Some(CState::Terminated { .. })) {
                    stopped += 1;
                } else {
                    waiting += 1;
                }
            }
        }
    }
    if pending_init > 0 || waiting > 0 {
        "Pending".into()
    } else if running > 0 {
        "Running".into()
    } else if stopped > 0 {
        if policy == "Always" {
            "Running".into()
        } else if stopped == succeeded {
            "Succeeded".into()
        } else if policy == "Never" {
            "Failed".into()
        } else {
            "Running".into()
        }
    } else {
        "Pending".into()
    }
}

fn condition(
    previous: &[PodCondition],
    type_: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
    now: Timestamp,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let since = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    PodCondition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.map(str::to_string),
        message,
        last_transition_time: Some(since),
        last_probe_time: None,
        observed_generation: None,
    }
}

/// The pod's conditions (Initialized, Ready, ContainersReady, PodScheduled) for `phase`;
/// transition times of unchanged conditions come from `previous`.
fn pod_conditions(
    previous: &[PodCondition],
    rec: &PodRecord,
    phase: &str,
    now: Timestamp,
) -> Vec<PodCondition> {
    let initialized = rec.init_containers.iter().all(|c| !c.initializing());
    let sidecars = rec.init_containers.iter().filter(|c| c.sidecar);
    let unready: Vec<&str> = sidecars
        .chain(&rec.containers)
        .filter(|c| !c.ready)
        .map(|c| c.name.as_str())
        .collect();
    let uninit: Vec<&str> = rec
        .init_containers
        .iter()
        .filter(|c| c.initializing())
        .map(|c| c.name.as_str())
        .collect();
    let completed = phase == "Succeeded" || phase == "Failed";
    let ready = unready.is_empty() && initialized && !completed;
    let not_ready_reason = if completed {
        "PodCompleted"
    } else {
        "ContainersNotReady"
    };
    let unready_msg = (!unready.is_empty())
        .then(|| format!("containers with unready status: [{}]", unready.join(" ")));
    vec![
        condition(
            previous,
            "Initialized",
            initialized,
            if initialized {
                None
            } else {
                Some("ContainersNotInitialized")
            },
            (!initialized)
                .then(|| format!("containers with incomplete status: [{}]", uninit.join(" "))),
            now,
        ),
        condition(
            previous,
            "Ready",
            ready,
            (!ready).then_some(not_ready_reason),
            if ready { None } else { unready_msg.clone() },
            now,
        ),
        condition(
            previous,
            "ContainersReady",
            ready,
            (!ready).then_some(not_ready_reason),
            if ready { None } else { unready_msg },
            now,
        ),
        condition(previous, "PodScheduled", true, None, None, now),
    ]
}

/// The pod's status from the agent's record; `pod` gives the spec and the previous conditions
/// (whose transition times are kept when a condition did not change).
pub fn compute_status(pod: &Pod, rec: &PodRecord, now: Timestamp) -> PodStatus {
    let policy = restart_policy(pod);
    let phase = compute_phase(policy, rec);
    let previous: &[PodCondition] = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or(&[]);
    let conditions = pod_conditions(previous, rec, &phase, now);
    PodStatus {
        phase: Some(phase),
        conditions: Some(conditions),
        host_ip: Some(HOST_IP.to_string()),
        pod_ip: rec.pod_ip.clone(),
        pod_ips: rec.pod_ip.as_ref().map(|ip| vec![PodIP { ip: ip.clone() }]),
        start_time: rec.start_time.map(Time),
        message: rec.message.clone(),
        init_container_statuses: (!rec.init_containers.is_empty()).then(|| {
            rec.init_containers
                .iter()
                .map(ContainerRecord::to_api)
                .collect()
        }),
        container_statuses: Some(rec.containers.iter().map(ContainerRecord::to_api).collect()),
        qos_class: pod.status.as_ref().and_then(|s| s.qos_class.clone()),
        ..Default::default()
    }
}

/// Reason of a terminated container: `Completed` for exit 0, `Error` otherwise.
pub fn exit_reason(exit_code: i32) -> &'static str {
    if exit_code == 0 { "Completed" } else { "Error" }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn term(code: i32) -> CState {
        CState::Terminated {
            exit_code: code,
            signal: None,
            reason: exit_reason(code).into(),
            message: None,
            started_at: Some(ts(1)),
            finished_at: ts(2),
            container_id: None,
        }
    }

    fn rec(init: &[CState], main: &[(CState, Option<CState>)]) -> PodRecord {
        PodRecord {
            pod_ip: Some("198.18.1.2".into()),
            start_time: Some(ts(0)),
            init_containers: init
                .iter()
                .enumerate()
                .map(|(i, s)| ContainerRecord {
                    state: s.clone(),
                    ..ContainerRecord::new(&format!("init{i}"), "busybox")
                })
                .collect(),
            containers: main
                .iter()
                .enumerate()
                .map(|(i, (s, last))| ContainerRecord {
                    state: s.clone(),
                    last_state: last.clone(),
                    ready: s.is_running(),
                    ..ContainerRecord::new(&format!("c{i}"), "busybox")
                })
                .collect(),
            ..Default::default()
        }
    }

    fn running() -> CState {
        CState::Running { started_at: ts(1) }
    }
    fn creating() -> CState {
        CState::waiting("ContainerCreating", None)
    }
    fn backoff() -> CState {
        CState::waiting("CrashLoopBackOff", None)
    }

    /// A record whose first init container is a native sidecar in `sidecar` state.
    fn with_sidecar(sidecar: CState, started: bool, ready: bool) -> PodRecord {
        let mut r = rec(&[sidecar, term(0)], &[(running(), None)]);
        r.init_containers[0].sidecar = true;
        r.init_containers[0].started = started;
        r.init_containers[0].ready = ready;
        r
    }

    #[test]
    fn a_running_sidecar_initializes_the_pod_and_its_readiness_counts() {
        let started = with_sidecar(running(), true, true);
        assert_eq!(compute_phase("Always", &started), "Running");
        let conds = pod_conditions(&[], &started, "Running", ts(3));
        let status = |t: &str| {
            conds
                .iter()
                .find(|c| c.type_ == t)
                .map(|c| c.status.clone())
        };
        assert_eq!(status("Initialized").as_deref(), Some("True"));
        assert_eq!(status("Ready").as_deref(), Some("True"));

        let unready = with_sidecar(running(), true, false);
        let conds = pod_conditions(&[], &unready, "Running", ts(3));
        let ready = conds.iter().find(|c| c.type_ == "Ready").cloned();
        assert_eq!(ready.as_ref().map(|c| c.status.as_str()), Some("False"));
        let msg = ready.and_then(|c| c.message).unwrap_or_default();
        assert!(msg.contains("init0"), "{msg}");

        // Not started yet (startup probe pending): the pod is still initializing.
        let starting = with_sidecar(running(), false, false);
        assert_eq!(compute_phase("Always", &starting), "Pending");
        let conds = pod_conditions(&[], &starting, "Pending", ts(3));
        let init = conds.iter().find(|c| c.type_ == "Initialized");
        assert_eq!(init.map(|c| c.status.as_str()), Some("False"));
    }

    #[test]
    fn phases() {
        assert_eq!(
            compute_phase("Always", &rec(&[], &[(creating(), None)])),
            "Pending"
        );
        assert_eq!(
            compute_phase("Always", &rec(&[creating()], &[(creating(), None)])),
            "Pending"
        );
        assert_eq!(
            compute_phase("Never", &rec(&[term(1)], &[(creating(), None)])),
            "Failed"
        );
        assert_eq!(
            compute_phase("OnFailure", &rec(&[term(1)], &[(creating(), None)])),
            "Pending"
        );
        assert_eq!(
            compute_phase("Always", &rec(&[term(0)], &[(running(), None)])),
            "Running"
        );
        assert_eq!(
            compute_phase(
                "Always",
                &rec(&[], &[(running(), None), (creating(), None)])
            ),
            "Pending"
        );
        assert_eq!(
            compute_phase("Always", &rec(&[], &[(backoff(), Some(term(1)))])),
            "Running"
        );
        assert_eq!(
            compute_phase("Never", &rec(&[], &[(term(0), None)])),
            "Succeeded"
        );
        assert_eq!(
            compute_phase("Never", &rec(&[], &[(term(0), None), (term(2), None)])),
            "Failed"
        );
        assert_eq!(
            compute_phase("OnFailure", &rec(&[], &[(term(0), None)])),
            "Succeeded"
        );
        assert_eq!(
            compute_phase("OnFailure", &rec(&[], &[(backoff(), Some(term(1)))])),
            "Running"
        );
        assert_eq!(
            compute_phase("Never", &rec(&[], &[(running(), None), (term(0), None)])),
            "Running"
        );
        let mut r = rec(&[], &[(running(), None)]);
        r.terminal_phase = Some("Succeeded".into());
        assert_eq!(compute_phase("Always", &r), "Succeeded");
    }

    fn pod(policy: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"restartPolicy": policy, "containers": [{"name": "c0"}]},
            "status": {"conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": "2020-01-01T00:00:00Z"},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2020-01-01T00:00:00Z"}
            ], "qosClass": "BestEffort"}
        }))
        .unwrap()
    }

    fn cond<'a>(s: &'a PodStatus, t: &str) -> &'a PodCondition {
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == t)
            .unwrap()
    }

    #[test]
    fn status_of_a_running_pod() {
        let now = ts(1000);
        let s = compute_status(&pod("Always"), &rec(&[term(0)], &[(running(), None)]), now);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.pod_ip.as_deref(), Some("198.18.1.2"));
        assert_eq!(s.pod_ips.as_ref().unwrap()[0].ip, "198.18.1.2");
        assert_eq!(s.host_ip.as_deref(), Some("127.0.0.1"));
        assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
        assert_eq!(cond(&s, "Ready").status, "True");
        assert_eq!(cond(&s, "Ready").last_transition_time, Some(Time(now)));
        assert_eq!(cond(&s, "Initialized").status, "True");
        assert_eq!(cond(&s, "ContainersReady").status, "True");
        let sched = cond(&s, "PodScheduled");
        assert_eq!(sched.last_transition_time, Some(Time(ts(1_577_836_800))));
        let cs = &s.container_statuses.as_ref().unwrap()[0];
        assert!(cs.ready);
        assert_eq!(cs.started, Some(false));
        assert!(cs.state.as_ref().unwrap().running.is_some());
        assert_eq!(s.init_container_statuses.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn status_of_unready_and_completed_pods() {
        let now = ts(1000);
        let p = pod("Never");
        let mut r = rec(&[], &[(running(), None)]);
        r.containers[0].ready = false;
        let s = compute_status(&p, &r, now);
        let ready = cond(&s, "Ready");
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("ContainersNotReady"));
        assert_eq!(
            ready.message.as_deref(),
            Some("containers with unready status: [c0]")
        );
        assert_eq!(ready.last_transition_time, Some(Time(ts(1_577_836_800))));

        let s = compute_status(&p, &rec(&[], &[(term(0), None)]), now);
        assert_eq!(s.phase.as_deref(), Some("Succeeded"));
        assert_eq!(cond(&s, "Ready").reason.as_deref(), Some("PodCompleted"));
        let t = s.container_statuses.as_ref().unwrap()[0]
            .state
            .as_ref()
            .unwrap()
            .terminated
            .clone()
            .unwrap();
        assert_eq!(t.exit_code, 0);
        assert_eq!(t.reason.as_deref(), Some("Completed"));

        let s = compute_status(&p, &rec(&[creating()], &[(creating(), None)]), now);
        assert_eq!(cond(&s, "Initialized").status, "False");
        assert_eq!(
            cond(&s, "Initialized").message.as_deref(),
            Some("containers with incomplete status: [init0]")
        );
    }

    #[test]
    fn restart_rules_and_backoff() {
        assert!(should_restart("Always", 0));
        assert!(should_restart("Always", 1));
        assert!(!should_restart("OnFailure", 0));
        assert!(should_restart("OnFailure", 3));
        assert!(!should_restart("Never", 3));
        assert!(should_restart_init("Always", 1));
        assert!(!should_restart_init("Always", 0));
        assert!(!should_restart_init("Never", 1));
        let secs: Vec<u64> = (0..8).map(|n| restart_backoff(n).as_secs()).collect();
        assert_eq!(secs, vec![1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(restart_backoff(u32::MAX).as_secs(), 30);
    }
}
