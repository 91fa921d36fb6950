//! Fault injection for the end-to-end tests: cargo feature `failpoints`, configured by the
//! environment variable `FAILPOINTS` (e.g. `FAILPOINTS='step-Copying=return'`).
//!
//! Without the feature every hook is a no-op. The failpoints:
//! - `step-<MemberStep>` (the member step in flight, and every swap step the write passed it
//!   through, see [`status_failpoints`]) or `stage-<Stage>` (no member in flight), right after
//!   a status write: with `return`, the process exits at once with code [`EXIT_CODE`], as a
//!   crash would;
//! - `after-<action>` (see [`Action::name`], e.g. `after-Create-Job`), right after an action:
//!   the same exit;
//! - `copy-job-fails`: with `return`, a copy Job's script is replaced before it is created by
//!   one that reports an error and exits 23, so the Job really fails on the cluster;
//! - `final-check-fails`: with `return`, the final hash gathered in the Finalizing stage is
//!   replaced by [`FinalHashError::Inconsistent`], as if the members disagreed.

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;

use crate::api::StorageMigrationRequestStatus;
use crate::build::JobKind;
use crate::engine::{FinalHash, FinalHashError};
use crate::labels;
use crate::plan::Action;

/// Whether the hooks do anything (the cargo feature `failpoints`).
const ENABLED: bool = cfg!(feature = "failpoints");

/// The exit code of a process stopped at a failpoint.
pub const EXIT_CODE: i32 = 86;

/// The failpoint that fails copy Jobs.
pub const COPY_JOB_FAILS: &str = "copy-job-fails";

/// The failpoint that makes the final consistency check fail.
pub const FINAL_CHECK_FAILS: &str = "final-check-fails";

/// The reason a failed final check gives under `final-check-fails`.
const INJECTED_INCONSISTENCY: &str = "injected failure (failpoint final-check-fails)";

/// What a failing copy Job runs instead of its script.
const FAILING_COPY_SCRIPT: &str = r#"printf '{"error":"injected failure (failpoint copy-job-fails)","exitCode":23}' > /dev/termination-log; exit 23"#;

/// Keeps the failpoints configured from `FAILPOINTS` while it lives (hold it in `main`).
pub struct Scenario {
    #[cfg(feature = "failpoints")]
    _scenario: fail::FailScenario<'static>,
}

/// Configures the failpoints from the environment variable `FAILPOINTS`.
pub fn setup() -> Scenario {
    Scenario {
        #[cfg(feature = "failpoints")]
        _scenario: fail::FailScenario::setup(),
    }
}

/// Hook after an action ran: exits at `after-<action>`, and after a status write first at the
/// status's failpoints ([`status_failpoints`]; `before` is the status the decision started
/// from).
pub fn after_action(before: Option<&StorageMigrationRequestStatus>, action: &Action) {
    if !ENABLED {
        return;
    }
    if let Action::SetStatus(status) = action {
        for name in status_failpoints(before, status) {
            exit_at(&name);
        }
    }
    exit_at(&after_action_failpoint(action));
}

/// Hook before a Job is created: a copy Job fails when `copy-job-fails` is set.
pub fn before_create_job(job: &mut Job) {
    if !ENABLED {
        return;
    }
    if is_copy_job(job) && hit(COPY_JOB_FAILS) {
        tracing::warn!(job = %job.name_any(), "failpoint copy-job-fails: this copy Job will fail");
        make_job_fail(job);
    }
}

/// Hook on the gathered final hash: an inconsistency when `final-check-fails` is set.
pub fn final_hash(
    gathered: Result<Option<FinalHash>, FinalHashError>,
) -> Result<Option<FinalHash>, FinalHashError> {
    if ENABLED && hit(FINAL_CHECK_FAILS) {
        tracing::warn!("failpoint final-check-fails: the final check reports an inconsistency");
        return Err(injected_inconsistency());
    }
    gathered
}

fn injected_inconsistency() -> FinalHashError {
    FinalHashError::Inconsistent(INJECTED_INCONSISTENCY.to_string())
}

/// The failpoint name after a status write: the member step in flight (`step-Copying`), else
/// the stage (`stage-OrphaningStatefulSet`).
pub fn status_failpoint(status: &StorageMigrationRequestStatus) -> String {
    match status.members.iter().find(|m| m.step.in_flight()) {
        Some(m) => format!("step-{:?}", m.step),
        None => format!("stage-{:?}", status.stage),
    }
}

/// The failpoint names after a status write, in order: a `step-<MemberStep>` for each step the
/// write passed the member in flight through since `before` (one decision may pass several
/// steps of the claim swap, `plan::machine::steps_passed`), so that a crash "at" a step that
/// was entered and left in the same decision is still injected there; then
/// [`status_failpoint`].
pub fn status_failpoints(
    before: Option<&StorageMigrationRequestStatus>,
    status: &StorageMigrationRequestStatus,
) -> Vec<String> {
    let last = status_failpoint(status);
    let passed = status
        .members
        .iter()
        .filter(|m| m.step.in_flight())
        .find_map(|m| {
            let was = before?.members.iter().find(|b| b.pod == m.pod)?.step;
            let path = crate::plan::machine::steps_passed(was, m.step)?;
            Some(path.into_iter().map(|s| format!("step-{s:?}")))
        });
    let mut names: Vec<String> = passed.into_iter().flatten().collect();
    if !names.contains(&last) {
        names.push(last);
    }
    names
}

/// The failpoint name after an action: `after-<action>` (`after-Create-Job`).
pub fn after_action_failpoint(action: &Action) -> String {
    format!("after-{}", action.name())
}

fn is_copy_job(job: &Job) -> bool {
    job.labels().get(labels::JOB_KIND_LABEL).map(String::as_str) == Some(JobKind::Copy.as_str())
}

/// Replaces the command of every container of the Job by one that fails (exit 23) with an
/// error in its termination message.
fn make_job_fail(job: &mut Job) {
    for c in job
        .spec
        .iter_mut()
        .flat_map(|s| s.template.spec.iter_mut())
        .flat_map(|s| s.containers.iter_mut())
    {
        c.command = Some(vec!["sh".into(), "-c".into(), FAILING_COPY_SCRIPT.into()]);
        c.args = None;
    }
}

/// Exits the process (code [`EXIT_CODE`]) when the failpoint `name` is set to `return`.
fn exit_at(name: &str) {
    if hit(name) {
        tracing::warn!(failpoint = name, "failpoint hit: exiting");
        std::process::exit(EXIT_CODE);
    }
}

/// Whether the failpoint `name` is set to `return`; always false without the feature.
#[cfg(feature = "failpoints")]
fn hit(name: &str) -> bool {
    fail::fail_point!(name, |_| true);
    false
}

#[cfg(not(feature = "failpoints"))]
fn hit(_name: &str) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::batch::v1::JobSpec;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};

    use super::*;
    use crate::api::{MemberStatus, MemberStep, Stage};
    use crate::plan::{Kind, Object, Propagation};

    #[test]
    fn status_failpoints_name_the_step_in_flight_else_the_stage() {
        let mut status = StorageMigrationRequestStatus {
            stage: Stage::OrphaningStatefulSet,
            members: vec![
                MemberStatus {
                    pod: "etcd-0".into(),
                    step: MemberStep::Done,
                    ..Default::default()
                },
                MemberStatus {
                    pod: "etcd-1".into(),
                    step: MemberStep::Pending,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(status_failpoint(&status), "stage-OrphaningStatefulSet");
        status.members[1].step = MemberStep::Copying;
        assert_eq!(status_failpoint(&status), "step-Copying");
        assert_eq!(status_failpoints(None, &status), ["step-Copying"]);
        // A write that passed etcd-1 through swap steps names each of them, in order.
        let mut before = status.clone();
        before.members[1].step = MemberStep::RetainingVolumes;
        status.members[1].step = MemberStep::ReleasingNewVolume;
        assert_eq!(
            status_failpoints(Some(&before), &status),
            [
                "step-DeletingOldClaim",
                "step-DeletingTempClaim",
                "step-ReleasingNewVolume"
            ]
        );
        before.members[1].step = MemberStep::ReleasingNewVolume;
        assert_eq!(
            status_failpoints(Some(&before), &status),
            ["step-ReleasingNewVolume"]
        );
    }

    #[test]
    fn action_failpoints_are_after_the_action_name() {
        let job = Action::Create(Object::Job(Box::default()));
        assert_eq!(after_action_failpoint(&job), "after-Create-Job");
        let delete = Action::Delete {
            kind: Kind::Pod,
            name: "etcd-0".into(),
            propagation: Propagation::Background,
            uid: None,
            resource_version: None,
        };
        assert_eq!(after_action_failpoint(&delete), "after-Delete-Pod");
    }

    #[test]
    fn a_failing_copy_job_runs_the_failing_script() {
        let mut job = Job {
            spec: Some(JobSpec {
                template: PodTemplateSpec {
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            command: Some(vec!["rsync".into()]),
                            args: Some(vec!["-a".into()]),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(!is_copy_job(&job));
        job.labels_mut()
            .insert(labels::JOB_KIND_LABEL.into(), JobKind::Copy.as_str().into());
        assert!(is_copy_job(&job));
        make_job_fail(&mut job);
        let c = &job.spec.unwrap().template.spec.unwrap().containers[0];
        assert_eq!(c.command.as_deref().unwrap()[..2], ["sh", "-c"]);
        assert!(c.command.as_deref().unwrap()[2].ends_with("exit 23"));
        assert_eq!(c.args, None);
    }

    #[test]
    fn an_injected_final_check_failure_is_an_inconsistency() {
        assert_eq!(
            injected_inconsistency().to_string(),
            "members are inconsistent: injected failure (failpoint final-check-fails)"
        );
    }

    /// Without `FAILPOINTS` set (unit tests), the hooks do nothing.
    #[test]
    fn hooks_do_nothing_when_no_failpoint_is_set() {
        let mut job = Job::default();
        job.labels_mut()
            .insert(labels::JOB_KIND_LABEL.into(), JobKind::Copy.as_str().into());
        let before = job.clone();
        before_create_job(&mut job);
        assert_eq!(job, before);
        let hash = FinalHash {
            hash: "7".into(),
            members: vec!["etcd-0".into()],
        };
        assert_eq!(final_hash(Ok(Some(hash.clone()))), Ok(Some(hash)));
        after_action(None, &Action::SetStatus(Box::default()));
    }
}
