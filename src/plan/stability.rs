//! The stability part of the gate before a member stops: every member pod must have been
//! running and Ready, without a restart, for `--stable-window` (default
//! [`DEFAULT_STABLE_WINDOW`]). Pure: it reads the pods' own status.
//!
//! Why: the database's health is one reading at one moment. A member in a crash loop answers
//! healthy between two crashes; stopping the next member then leaves two down, and a 3-member
//! etcd loses quorum until the crashing one is back. The pod's status remembers what a single
//! reading cannot: when each container last started (a restart, even one the readiness probe
//! missed, moves it) and when the pod last became Ready. The window starts at the later of the
//! two.
//!
//! What each member pod must show, else the gate waits naming the first that does not:
//! - it exists and is not being deleted;
//! - condition `Ready` is `True`, with its `lastTransitionTime` at least the window ago;
//! - every container is running, started at least the window ago.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// Default of `--stable-window`: how long every member must have been running and Ready, with
/// no restart, before the next one stops.
pub const DEFAULT_STABLE_WINDOW: Duration = Duration::from_secs(10);

/// Why the member pod `name` (`pod`, if it exists) is not yet stable at `now`, if it is not.
pub fn unstable(name: &str, pod: Option<&Pod>, now: Timestamp, window: Duration) -> Option<String> {
    let Some(pod) = pod else {
        return Some(format!("member pod {name} does not exist"));
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return Some(format!("member pod {name} is being deleted"));
    }
    let window_s = i64::try_from(window.as_secs()).unwrap_or(i64::MAX);
    let status = pod.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready");
    let Some(ready) = ready.filter(|c| c.status == "True") else {
        return Some(format!("member pod {name} is not Ready"));
    };
    let ready_for = seconds_since(ready.last_transition_time.as_ref(), now);
    if ready_for.is_some_and(|s| s < window_s) {
        return Some(too_soon(name, "has been Ready", ready_for, window_s));
    }
    for c in status.container_statuses.unwrap_or_default() {
        let started = c.state.and_then(|s| s.running).map(|r| r.started_at);
        let Some(started) = started else {
            return Some(format!(
                "container {} of member pod {name} is not running",
                c.name
            ));
        };
        let up_for = seconds_since(started.as_ref(), now);
        if up_for.is_none_or(|s| s < window_s) {
            let what = format!(
                "has run since its last start (restarts: {}) for",
                c.restart_count
            );
            return Some(too_soon(
                &format!("{name}/{}", c.name),
                &what,
                up_for,
                window_s,
            ));
        }
    }
    None
}

/// The first of `members` (pod names, with their pods) that is not stable, as a reason to wait.
pub fn first_unstable<'p>(
    members: impl IntoIterator<Item = (&'p str, Option<&'p Pod>)>,
    now: Timestamp,
    window: Duration,
) -> Option<String> {
    members
        .into_iter()
        .find_map(|(name, pod)| unstable(name, pod, now, window))
}

/// When every one of `pods` will have been running and Ready for `window`, if none restarts or
/// turns unready before: the latest of their `Ready` transitions and container starts, plus the
/// window. `None` when one of them is missing, not Ready or not running (nothing tells when it
/// will be), or has no time on record.
pub fn stable_at<'p>(
    pods: impl IntoIterator<Item = Option<&'p Pod>>,
    window: Duration,
) -> Option<Timestamp> {
    let mut latest: Option<Timestamp> = None;
    for pod in pods {
        let status = pod?.status.as_ref()?;
        let ready = (status.conditions.as_deref().unwrap_or_default().iter())
            .find(|c| c.type_ == "Ready" && c.status == "True")?;
        let mut since = ready.last_transition_time.as_ref()?.0;
        for c in status.container_statuses.as_deref().unwrap_or_default() {
            let running = c.state.as_ref()?.running.as_ref()?;
            since = since.max(running.started_at.as_ref()?.0);
        }
        latest = Some(latest.map_or(since, |l| l.max(since)));
    }
    let window = k8s_openapi::jiff::SignedDuration::try_from(window).ok()?;
    latest?.checked_add(window).ok()
}

fn seconds_since(t: Option<&Time>, now: Timestamp) -> Option<i64> {
    t.map(|t| now.as_second() - t.0.as_second())
}

fn too_soon(who: &str, what: &str, for_s: Option<i64>, window_s: i64) -> String {
    let for_s = for_s.map_or("an unknown time".to_string(), |s| format!("{}s", s.max(0)));
    format!(
        "{who} {what} {for_s}; every member must be stable for {window_s}s (--stable-window) \
         before the next one stops"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateWaiting, ContainerStatus,
        PodCondition, PodStatus,
    };

    const W: Duration = Duration::from_secs(10);

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    /// A pod Ready since `ready_at`, its container started at `started_at` after `restarts`.
    fn pod(ready_at: i64, started_at: i64, restarts: i32) -> Pod {
        Pod {
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    last_transition_time: Some(Time(ts(ready_at))),
                    ..Default::default()
                }]),
                container_statuses: Some(vec![ContainerStatus {
                    name: "etcd".into(),
                    restart_count: restarts,
                    state: Some(ContainerState {
                        running: Some(ContainerStateRunning {
                            started_at: Some(Time(ts(started_at))),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_member_ready_and_running_for_the_window_is_stable() {
        assert_eq!(unstable("etcd-1", Some(&pod(0, 0, 3)), ts(10), W), None);
        assert_eq!(unstable("etcd-1", Some(&pod(0, 0, 0)), ts(100), W), None);
    }

    #[test]
    fn a_member_ready_again_for_a_second_between_two_crashes_is_not() {
        let why = unstable("etcd-1", Some(&pod(99, 98, 4)), ts(100), W).unwrap_or_default();
        assert!(why.contains("etcd-1 has been Ready 1s"), "{why}");
        assert!(why.contains("stable for 10s (--stable-window)"), "{why}");
    }

    #[test]
    fn a_restart_the_readiness_probe_missed_still_counts() {
        // Ready for long (the probe never saw the crash), but the container started 3 s ago.
        let why = unstable("etcd-1", Some(&pod(0, 97, 1)), ts(100), W).unwrap_or_default();
        assert!(
            why.contains("etcd-1/etcd has run since its last start (restarts: 1) for 3s"),
            "{why}"
        );
    }

    #[test]
    fn missing_deleted_unready_or_waiting_members_are_not_stable() {
        let now = ts(100);
        assert!(unstable("etcd-2", None, now, W).is_some_and(|w| w.contains("does not exist")));
        let mut deleted = pod(0, 0, 0);
        deleted.metadata.deletion_timestamp = Some(Time(ts(99)));
        assert!(unstable("etcd-2", Some(&deleted), now, W).is_some_and(|w| w.contains("deleted")));
        let mut unready = pod(0, 0, 0);
        if let Some(c) = unready
            .status
            .as_mut()
            .and_then(|s| s.conditions.as_mut())
            .and_then(|c| c.first_mut())
        {
            c.status = "False".into();
        }
        assert!(
            unstable("etcd-2", Some(&unready), now, W).is_some_and(|w| w.contains("not Ready"))
        );
        let mut waiting = pod(0, 0, 5);
        if let Some(c) = waiting
            .status
            .as_mut()
            .and_then(|s| s.container_statuses.as_mut())
            .and_then(|c| c.first_mut())
        {
            c.state = Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("CrashLoopBackOff".into()),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        assert!(
            unstable("etcd-2", Some(&waiting), now, W)
                .is_some_and(|w| w.contains("container etcd of member pod etcd-2 is not running"))
        );
    }

    #[test]
    fn a_zero_window_only_asks_for_ready_and_running() {
        assert_eq!(
            unstable("etcd-1", Some(&pod(100, 100, 9)), ts(100), Duration::ZERO),
            None
        );
    }

    /// The members are stable when the last of them to become Ready or to start has been so
    /// for the window; nothing tells when a missing, unready or waiting member will be.
    #[test]
    fn the_members_are_stable_the_window_after_the_last_ready_or_start() {
        let (a, b) = (pod(90, 88, 0), pod(95, 97, 2));
        assert_eq!(stable_at([Some(&a), Some(&b)], W), Some(ts(107)));
        assert_eq!(stable_at([Some(&a)], W), Some(ts(100)));
        assert_eq!(stable_at([Some(&a), None], W), None);
        let mut unready = pod(0, 0, 0);
        if let Some(c) = (unready.status.as_mut())
            .and_then(|s| s.conditions.as_mut())
            .and_then(|c| c.first_mut())
        {
            c.status = "False".into();
        }
        assert_eq!(stable_at([Some(&a), Some(&unready)], W), None);
        let mut waiting = pod(0, 0, 1);
        if let Some(c) = (waiting.status.as_mut())
            .and_then(|s| s.container_statuses.as_mut())
            .and_then(|c| c.first_mut())
        {
            c.state = Some(ContainerState::default());
        }
        assert_eq!(stable_at([Some(&waiting)], W), None);
    }

    #[test]
    fn the_first_unstable_member_is_named() {
        let (a, b) = (pod(0, 0, 0), pod(95, 95, 2));
        let why = first_unstable([("etcd-0", Some(&a)), ("etcd-1", Some(&b))], ts(100), W);
        assert!(why.is_some_and(|w| w.starts_with("etcd-1 has been Ready 5s")));
        assert_eq!(first_unstable([("etcd-0", Some(&a))], ts(100), W), None);
    }
}
