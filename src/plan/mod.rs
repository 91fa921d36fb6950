//! The pure state machine: an [`Observed`] snapshot in, a [`Decision`] out.
//!
//! Nothing here does I/O. The cluster layer (`crate::cluster`) gathers the snapshot, calls
//! [`decide`], and carries out the [`Action`]s in order, stopping at the first error. Every
//! action is idempotent (a create that finds the object, a delete that finds nothing are
//! successes), and the request's status records a step *before* the step's destructive action,
//! so a decision re-derived after a crash at any point continues where the last one stopped.
//!
//! The planner reads top to bottom in the order of the flow:
//! - [`machine`]: the request's stages and a member's steps with every allowed transition; the
//!   only writer of `status.stage` and `status.members[].step`;
//! - [`preflight`]: checks, measuring (Shrink), then `Denied` or accepted with a plan;
//! - [`stages`]: orphaning the StatefulSet, recreating it, finalizing, rolling back;
//! - [`member`]: one function per [`MemberStep`] of the member in flight;
//! - [`failure`]: why a request rolls back; [`stash`]: where manifests are saved.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::api::conditions;
use crate::api::schema::TIMEOUT_MAX_LENGTH;
use crate::api::{
    MemberStep, Phase, Stage, StorageMigrationRequest, StorageMigrationRequestSpec,
    StorageMigrationRequestStatus,
};
use crate::build::Manifest;
use crate::engine::{FinalHash, FinalHashError, HealthReport, HealthUnavailable};
use crate::image::ImageRef;
use crate::labels;

pub mod action;
pub mod claims;
pub mod disruption;
pub mod failure;
pub mod foreign;
pub mod helpers;
pub mod machine;
pub mod member;
pub mod observe;
pub mod preflight;
pub mod progress;
pub mod retain;
mod scaled;
pub mod slots;
pub use crate::quantity;
pub mod runbook;
pub mod stability;
pub mod stages;
pub mod stash;

pub use action::*;
pub use failure::{Failure, MemoryShortfall};

#[cfg(test)]
mod admission_tests;
#[cfg(test)]
mod bounded_tests;
#[cfg(test)]
mod claim_target_tests;
#[cfg(test)]
mod deployment_tests;
#[cfg(test)]
mod finish_tests;
#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod foreign_tests;
#[cfg(test)]
mod retain_tests;
#[cfg(test)]
mod slots_tests;
#[cfg(test)]
mod templates_tests;
#[cfg(test)]
mod tests;

/// Condition set when the spec changed after acceptance (the accepted spec is kept).
pub const SPEC_CHANGE_IGNORED: &str = "SpecChangeIgnored";

/// How often a progressing request is looked at again when nothing else wakes it.
pub const REQUEUE_PROGRESSING: Duration = Duration::from_secs(2);
/// How often a request waiting on something slow (measure Jobs, binding) is looked at again.
pub const REQUEUE_WAITING: Duration = Duration::from_secs(2);
/// How often a request queued behind another request on the same target is looked at again
/// (the other request's changes do not wake it).
pub const REQUEUE_QUEUED: Duration = Duration::from_secs(5);
/// What an ended request asks for. The controller does not requeue an ended request at all: a
/// deletion or a spec change is a change of the request, which wakes it anyway.
pub const REQUEUE_FINAL: Duration = Duration::from_secs(300);
/// How far before a member's first copy pass the verification in `Changed` mode looks for
/// changed files: room for the clock that stamps the source's files (the node's; a file
/// server's for a network filesystem) to run behind the operator's.
pub const VERIFY_CLOCK_MARGIN_SECONDS: i64 = 60;

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("invalid quantity {0:?}")]
    Quantity(String),
    #[error("invalid timeout {value:?}: {reason}")]
    Timeout { value: String, reason: String },
}

/// What the cluster looks like to one reconcile: everything [`decide`] needs, nothing more.
#[derive(Debug, Clone)]
pub struct Observed {
    /// The request, fresh from the API server (spec, status, annotations, deletionTimestamp).
    pub request: StorageMigrationRequest,
    pub now: Timestamp,
    /// The labels of the request's namespace (preflight reads its Pod Security level).
    pub namespace_labels: BTreeMap<String, String>,
    /// The target StatefulSet, if it exists: its raw JSON as the API server returned it (what
    /// gets stashed) with the typed view the planner reads.
    pub stateful_set: Option<Manifest<StatefulSet>>,
    /// The request's stash ConfigMap and the manifests in it, decoded (see [`stash`]).
    pub stash: Stash,
    /// Pods of the target (by the StatefulSet's selector), by name, raw JSON and typed view
    /// (a member pod is stashed as the API server returned it).
    pub pods: BTreeMap<String, Manifest<Pod>>,
    /// Our helper pods (mounters) and Job pods, by name.
    pub helper_pods: BTreeMap<String, Pod>,
    /// The pods of the namespace that mount each claim (by claim name; pod names sorted), our
    /// helper pods and finished pods left out: read in Preflight and while a member is copied
    /// (empty otherwise), so that a claim another pod writes to is not copied as if it were
    /// still (see [`observe::claim_users`]).
    pub claim_users: BTreeMap<String, Vec<String>>,
    /// The pods that mount the target claim, with their controllers (`target.kind:
    /// PersistentVolumeClaim`, read in Preflight only; empty otherwise).
    pub target_claim_users: Vec<observe::ClaimUser>,
    /// The target Deployment (a Deployment's claim), if it exists.
    pub deployment: Option<Deployment>,
    /// The namespace's HorizontalPodAutoscalers, read in Preflight of a Deployment's claim only
    /// (empty otherwise).
    pub autoscalers: Vec<Autoscaler>,
    /// Claims of the namespace that matter: the members' claims and our temporary claims.
    pub claims: BTreeMap<String, PersistentVolumeClaim>,
    /// Volumes bound to those claims, and the ones named in the status.
    pub volumes: BTreeMap<String, PersistentVolume>,
    /// Our Jobs, by name, with what their pod reported.
    pub jobs: BTreeMap<String, ObservedJob>,
    /// Every StorageClass, read in Preflight and while the member in flight makes its temporary
    /// claim (`observe::reads_storage_classes`; empty otherwise).
    pub storage_classes: BTreeMap<String, StorageClass>,
    /// Other requests in the namespace on the same target, read in Preflight
    /// (`observe::reads_other_requests`; empty otherwise).
    pub other_requests: Vec<OtherRequest>,
    /// The PodDisruptionBudgets of the namespace, read in Preflight and while a member is about
    /// to stop (`observe::reads_budgets`; empty otherwise).
    pub budgets: Vec<disruption::Budget>,
    /// The database engine's view, or why it could not be had.
    pub health: Result<HealthReport, HealthUnavailable>,
    /// `Some` in the Finalizing stage for engines that compute a final hash (etcd `hash_kv`),
    /// with the member pods it covers.
    pub final_hash: Option<Result<Option<FinalHash>, FinalHashError>>,
    /// The Nodes of the member and helper pods that are terminating, by name (`None`: no such
    /// Node): a pod stuck terminating on a lost node is force-deleted when the Node is gone or
    /// tainted out-of-service, or the request allows it (see [`helpers::lost_pod`]).
    pub nodes: BTreeMap<String, Option<Node>>,
    /// The members of the operator's other requests that hold a copy slot ([`slots`]): filled
    /// by the controller from its ledger, not read from the cluster (empty without caps).
    pub copy_holders: Vec<slots::CopyHolder>,
}

impl Observed {
    /// True for a request that has ended (`Successful`, `Failed`): [`decide`] reads nothing of
    /// it but the request itself ([`Observed::ended`]).
    pub fn has_ended(request: &StorageMigrationRequest) -> bool {
        request.status.as_ref().is_some_and(|s| s.phase.is_final())
    }

    /// The snapshot of an ended request: the request and the time, nothing else. [`decide`]
    /// only removes its finalizer when it is deleted and notes a spec edit, so an ended request
    /// costs no read of the cluster (the unit test `an_ended_request_is_decided_on_itself_alone`
    /// holds this against a full snapshot).
    pub fn ended(request: StorageMigrationRequest, now: Timestamp) -> Observed {
        Observed {
            request,
            now,
            namespace_labels: BTreeMap::new(),
            stateful_set: None,
            stash: Stash::default(),
            pods: BTreeMap::new(),
            helper_pods: BTreeMap::new(),
            claim_users: BTreeMap::new(),
            target_claim_users: Vec::new(),
            deployment: None,
            autoscalers: Vec::new(),
            claims: BTreeMap::new(),
            volumes: BTreeMap::new(),
            jobs: BTreeMap::new(),
            storage_classes: BTreeMap::new(),
            other_requests: Vec::new(),
            budgets: Vec::new(),
            health: Err(HealthUnavailable::NotObservedInStage),
            final_hash: None,
            nodes: BTreeMap::new(),
            copy_holders: Vec::new(),
        }
    }
}

/// A HorizontalPodAutoscaler and what it scales.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Autoscaler {
    pub name: String,
    /// `scaleTargetRef.kind`.
    pub target_kind: String,
    /// `scaleTargetRef.name`.
    pub target_name: String,
}

/// Manifests stashed before they are deleted. The StatefulSet and the pods are kept as the raw
/// JSON the API server returned (see [`Manifest`]): they are recreated from it, so fields our
/// API structs do not know survive; claims are only read, so they are typed.
#[derive(Debug, Clone, Default)]
pub struct Stash {
    /// The stash ConfigMap itself.
    pub object: StashObject,
    pub stateful_set: Option<Manifest<StatefulSet>>,
    pub pods: BTreeMap<String, Manifest<Pod>>,
    pub claims: BTreeMap<String, PersistentVolumeClaim>,
    /// Stash entries that exist but cannot be decoded, or hold another object than their key
    /// names (key, reason). Any one stops the request (see [`stash::stash_problem`]).
    pub errors: Vec<(String, String)>,
}

/// The request's stash ConfigMap (`<request>-stash`) as gathered.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum StashObject {
    /// No ConfigMap of that name.
    #[default]
    Missing,
    /// Ours (its `storagemigrator.io/request-uid` label is this request's uid): its uid, and
    /// the size (key plus value) of each of its entries.
    Ours {
        uid: Option<String>,
        sizes: BTreeMap<String, usize>,
    },
    /// A ConfigMap of that name whose uid label is not this request's (the stash kept after an
    /// earlier request of the same name failed, or someone else's): never read nor written.
    Foreign { uid_label: Option<String> },
}

/// A Job we created and how it ended.
#[derive(Debug, Clone)]
pub struct ObservedJob {
    pub job: Job,
    pub outcome: JobOutcome,
    /// A running copy's progress, read from the tail of its pod's log (PreCopy and Copy Jobs).
    pub progress: Option<crate::api::CopyProgress>,
    /// For a running Job with no pod: the message of its newest `FailedCreate` Event (the API
    /// server's reason for refusing its pod: quota, admission), when there is one.
    pub refused: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum JobOutcome {
    Running,
    /// Complete; the termination message of its pod (one-line JSON), when it could be read.
    Succeeded {
        message: Option<String>,
    },
    /// Failed (backoff limit, deadline, ...): a reason for humans.
    Failed {
        reason: String,
    },
    /// Failed because a copy pass found no space left on the target (its result's cause is
    /// [`crate::build::JobFailureCause::NoSpace`]): a reason for humans, and the result with the
    /// numbers the script could read (source bytes now, the target's `statfs`).
    NoSpace {
        reason: String,
        result: Box<crate::build::JobResult>,
    },
    /// Failed in its verification pass (a Verify Job, or a Copy Job verifying in the same pod):
    /// differences found, or the comparison itself failed. A reason for humans and the result
    /// ([`crate::build::JobResult::verified_in_pass`]).
    VerifyFailed {
        reason: String,
        result: Box<crate::build::JobResult>,
    },
}

/// Another request on the same target.
#[derive(Debug, Clone, PartialEq)]
pub struct OtherRequest {
    pub name: String,
    pub created: Option<Timestamp>,
    pub phase: Phase,
}

/// The operator's configuration that decisions depend on (the `run` flags), threaded into
/// [`decide`] as the image used to be alone.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The operator's own image (`--image`): the image of every Job and mounter pod.
    pub image: ImageRef,
    /// `--allow-request-mover-image`: a request's `spec.copy.moverImage` replaces [`image`]
    /// for that request. Off by default: such a request is Denied
    /// (`DenialReason::MoverImageNotAllowed`), since whoever writes a request would otherwise
    /// pick the code that runs with the data volumes mounted.
    ///
    /// [`image`]: Settings::image
    pub allow_request_mover_image: bool,
    /// `--helper-start-timeout`: how long a copy, verify, measure or mounter pod may stay
    /// unstarted (image not pulled, not scheduled, not admitted) before its member fails.
    pub helper_start_timeout: Duration,
    /// `--max-evictions`: how many times a helper pod evicted from its node is replaced
    /// before its member fails.
    pub max_evictions: u32,
    /// `--stable-window`: how long every member pod must have been running and Ready, with no
    /// restart, before the next member stops ([`stability`]).
    pub stable_window: Duration,
    /// `--stage-timeout`: how long `RecreatingStatefulSet`, the cleanup of `Finalizing` and
    /// `RollingBack` may wait (the request's own timeout bounds orphaning and migrating). See
    /// [`stages`]: a recreation past it rolls back, a rollback past it ends `Failed` saying what
    /// it still waited for, a cleanup past it ends `Successful` naming what is left behind.
    pub stage_timeout: Duration,
    /// `--max-copies`, `--max-copies-per-node`: how many members may copy at once ([`slots`]).
    pub copy_caps: slots::CopyCaps,
}

/// Default of `--helper-start-timeout`.
pub const DEFAULT_HELPER_START_TIMEOUT: Duration = Duration::from_secs(180);
/// Default of `--max-evictions`.
pub const DEFAULT_MAX_EVICTIONS: u32 = 2;
/// Default of `--stage-timeout`.
pub const DEFAULT_STAGE_TIMEOUT: Duration = Duration::from_secs(600);

impl Settings {
    /// The defaults of every flag with `image` as the operator's image.
    pub fn new(image: ImageRef) -> Self {
        Self {
            image,
            allow_request_mover_image: false,
            helper_start_timeout: DEFAULT_HELPER_START_TIMEOUT,
            max_evictions: DEFAULT_MAX_EVICTIONS,
            stable_window: stability::DEFAULT_STABLE_WINDOW,
            stage_timeout: DEFAULT_STAGE_TIMEOUT,
            copy_caps: slots::CopyCaps::default(),
        }
    }

    /// The image of `req`'s Jobs and mounter pods: its `moverImage` when the operator allows
    /// one and it is a valid reference (preflight denies an invalid one), else the operator's.
    /// A request accepted while the flag was on and resumed after it was turned off goes on
    /// with the operator's image.
    pub fn mover_image(&self, spec: &StorageMigrationRequestSpec) -> ImageRef {
        self.mover_image_of(&spec.copy)
    }

    /// [`Settings::mover_image`] of a copy spec.
    pub fn mover_image_of(&self, copy: &crate::api::CopySpec) -> ImageRef {
        match &copy.mover_image {
            Some(own) if self.allow_request_mover_image => {
                ImageRef::parse(own).unwrap_or_else(|_| self.image.clone())
            }
            _ => self.image.clone(),
        }
    }
}

/// The working state of one decision: a copy of the status to change, the actions so far.
pub(crate) struct Ctx<'a> {
    pub o: &'a Observed,
    pub settings: &'a Settings,
    /// The image of this request's Jobs and mounter pods ([`Settings::mover_image`]).
    pub image: ImageRef,
    /// The request with the accepted spec (the spec as accepted, even if it changed since).
    pub req: StorageMigrationRequest,
    pub status: StorageMigrationRequestStatus,
    pub actions: Vec<Action>,
    pub requeue: Duration,
    /// The shortest wait asked with [`Ctx::wait`], if any.
    asked: Option<Duration>,
    /// A wait longer than the default asked with [`Ctx::wait_longer`], if any.
    longer: Option<Duration>,
    pub now: Time,
    /// The first transition this decision tried that [`machine`] refused (see [`Ctx::finish`]).
    rejected: Option<machine::TransitionError>,
}

impl<'a> Ctx<'a> {
    pub(crate) fn new(o: &'a Observed, settings: &'a Settings) -> Self {
        let mut status = o.request.status.clone().unwrap_or_default();
        // Every decision looks at the current spec (and says so in a condition when it ignores
        // a change, see `spec_change`): kstatus-based tools read a request whose
        // observedGeneration lags its generation as still in progress.
        if o.request.metadata.generation.is_some() {
            status.observed_generation = o.request.metadata.generation;
        }
        let mut req = o.request.clone();
        req.spec = observe::effective_spec(&o.request);
        Self {
            o,
            settings,
            image: settings.mover_image(&req.spec),
            req,
            status,
            actions: Vec::new(),
            requeue: REQUEUE_PROGRESSING,
            asked: None,
            longer: None,
            now: Time(o.now),
            rejected: None,
        }
    }

    /// Moves the request to stage `to` through [`machine::enter_stage`]. A transition the
    /// machine refuses leaves the stage as it is and turns the whole decision into "stuck" (see
    /// [`Ctx::finish`]).
    pub fn enter_stage(&mut self, to: Stage) {
        if let Err(e) = machine::enter_stage(&mut self.status, to, &self.now) {
            self.reject(e);
        }
    }

    /// Moves member `i` to step `to` through [`machine::advance`]; a refused transition is
    /// handled like one of [`Ctx::enter_stage`].
    pub fn advance_member(&mut self, i: usize, to: MemberStep) {
        let result = match self.status.members.get_mut(i) {
            Some(ms) => machine::advance(ms, to),
            None => Err(machine::TransitionError::NoMember { index: i }),
        };
        if let Err(e) = result {
            self.reject(e);
        }
    }

    fn reject(&mut self, e: machine::TransitionError) {
        self.rejected.get_or_insert(e);
    }

    pub fn spec(&self) -> &StorageMigrationRequestSpec {
        &self.req.spec
    }

    pub fn name(&self) -> String {
        self.o.request.name_any()
    }

    pub fn event(&mut self, type_: EventType, reason: &str, message: impl Into<String>) {
        self.actions.push(Action::Event {
            type_,
            reason: reason.to_string(),
            message: message.into(),
        });
    }

    pub fn act(&mut self, action: Action) {
        self.actions.push(action);
    }

    /// Deletes an object in the background; `uid` (when known) guards against deleting a
    /// successor of the same name.
    pub fn delete(&mut self, kind: Kind, name: impl Into<String>, uid: Option<String>) {
        self.act(Action::Delete {
            kind,
            name: name.into(),
            propagation: Propagation::Background,
            uid,
            resource_version: None,
        });
    }

    pub fn wait(&mut self, requeue: Duration) {
        self.requeue = self.requeue.min(requeue);
        self.asked = Some(self.asked.map_or(requeue, |a| a.min(requeue)));
    }

    /// Looks again after `requeue`, even if longer than the default [`REQUEUE_PROGRESSING`]:
    /// for a wait whose end the planner knows and whose other causes a watch reports. Any
    /// other wait of the same decision ([`Ctx::wait`], or a requeue set outright) wins.
    pub fn wait_longer(&mut self, requeue: Duration) {
        self.longer = Some(self.longer.map_or(requeue, |l| l.min(requeue)));
    }

    /// The requeue of the decision: [`Ctx::wait_longer`]'s when nothing else asked for one.
    fn requeue(&self) -> Duration {
        match self.longer {
            Some(longer) if self.asked.is_none() && self.requeue == REQUEUE_PROGRESSING => longer,
            _ => self.requeue,
        }
    }

    pub fn set_condition(
        &mut self,
        type_: &str,
        status: bool,
        reason: &str,
        message: &str,
    ) -> bool {
        let generation = self
            .status
            .observed_generation
            .or(self.o.request.metadata.generation);
        conditions::set(
            &mut self.status.conditions,
            type_,
            status,
            reason,
            message,
            generation,
            &self.now,
        )
    }

    /// Seconds left before the request's timeout (at least 1), for Job deadlines.
    pub fn remaining_seconds(&self) -> i64 {
        let Some(start) = &self.status.start_time else {
            return timeout_seconds(&self.spec().timeout).unwrap_or(3600).max(1);
        };
        let total = timeout_seconds(&self.spec().timeout).unwrap_or(3600);
        let elapsed = self.o.now.as_second() - start.0.as_second();
        (total - elapsed).max(1)
    }

    /// The decision: the status first when it changed, then the actions. When a transition was
    /// refused, or a claim delete would take a volume not on Retain with it
    /// ([`retain::unsafe_claim_delete`]), nothing of this decision is kept: the request is
    /// reported stuck instead (either is a bug in the planner, and half a decision is not safe
    /// to carry out).
    fn finish(self) -> Decision {
        if let Some(e) = &self.rejected {
            return self.refused(&format!(
                "the planner tried a transition its state machine does not allow: {e}"
            ));
        }
        let original = self.o.request.status.clone().unwrap_or_default();
        let pre_copy = self.spec().copy.pre_copy;
        if let Some(why) = retain::unsafe_claim_delete(self.o, &self.status, &self.actions) {
            return self.refused(&format!(
                "the planner tried to delete a claim whose volume is not seen on Retain: {why}"
            ));
        }
        let requeue = self.requeue();
        let mut status = self.status;
        if status.stage != Stage::Preflight {
            progress::summarize(&mut status, pre_copy);
        }
        let mut actions = Vec::with_capacity(self.actions.len() + 1);
        if status != original {
            actions.push(Action::SetStatus(Box::new(status)));
        }
        actions.extend(self.actions);
        Decision { actions, requeue }
    }

    /// Nothing of this decision is kept (a bug of the planner, and half a decision is not safe
    /// to carry out): the request is reported stuck instead, saying `why`.
    fn refused(&self, why: &str) -> Decision {
        let mut fresh = Ctx::new(self.o, self.settings);
        stuck(&mut fresh, runbook::Stuck::Planner, why);
        fresh.finish()
    }
}

/// Parses `spec.timeout` into whole seconds: hours, minutes and seconds in that order, each part
/// a whole number with its unit, each optional but at least one given, not all zero (`30m`,
/// `1h30m`, `90s`, `1h0m`), at most `TIMEOUT_MAX_LENGTH` characters; a sum beyond `i64` seconds is
/// capped. Exactly the strings `api::schema::TIMEOUT_PATTERN` admits (a unit test compares them),
/// so the API server refuses what this refuses.
pub fn timeout_seconds(s: &str) -> Result<i64, PlanError> {
    let err = |reason: &str| PlanError::Timeout {
        value: s.to_string(),
        reason: reason.to_string(),
    };
    if s.is_empty() {
        return Err(err("empty"));
    }
    if s.len() > TIMEOUT_MAX_LENGTH {
        return Err(err("longer than 32 characters"));
    }
    let mut units = [('h', 3600u128), ('m', 60), ('s', 1)].into_iter();
    let mut rest = s;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(digits);
        let Some(unit) = tail.chars().next() else {
            return Err(err("a number needs a unit: h, m or s"));
        };
        let Some((_, seconds)) = units.by_ref().find(|(u, _)| *u == unit) else {
            return Err(err(
                "expected hours, minutes and seconds in that order, each at most once (h, m, s)",
            ));
        };
        // At most 31 digits: below 10^31, times 3600, fits a u128.
        let n: u128 = number
            .parse()
            .map_err(|_| err("each unit needs a whole number before it"))?;
        total += n * seconds;
        rest = &tail[unit.len_utf8()..];
    }
    if total == 0 {
        return Err(err("must be positive"));
    }
    Ok(i64::try_from(total).unwrap_or(i64::MAX))
}

/// Decides what to do next. Pure. `settings` is the operator's configuration (its image, whether
/// a request may name its own, how long a helper pod may take to start).
pub fn decide(o: &Observed, settings: &Settings) -> Decision {
    let mut cx = Ctx::new(o, settings);
    let deleting = o.request.metadata.deletion_timestamp.is_some();
    let has_finalizer = observe::has_finalizer(&o.request);

    if cx.status.phase.is_final() {
        // Ended: the finalizer guards nothing any more. The decision that ended the request
        // lifted it; this lifts it when the operator died between that decision's status write
        // and its finalizer patch, so that no ended request keeps its namespace or the CRD from
        // being deleted once the operator is gone.
        if has_finalizer {
            cx.act(Action::RemoveFinalizer);
        }
        spec_change(&mut cx);
        cx.requeue = REQUEUE_FINAL;
        return cx.finish();
    }
    if cx.status.stage == Stage::Preflight {
        if deleting {
            // Nothing was touched: measure Jobs are owned by the request and go with it.
            if has_finalizer {
                cx.act(Action::RemoveFinalizer);
            }
            return cx.finish();
        }
        preflight::run(&mut cx);
        return cx.finish();
    }

    spec_change(&mut cx);
    if !deleting && !has_finalizer {
        restore_finalizer(&mut cx);
    }

    // Timeout, deletion and abort turn a progressing request into a rollback, until the
    // members are all done (recreating the StatefulSet and finalizing are then the fastest way
    // out).
    if let Some(failure) = rollback_asked(&cx, deleting) {
        start_rollback(&mut cx, failure);
        return cx.finish();
    }

    if stash::stopped_by_a_problem(&mut cx) {
        if let Some(failure) = stages::stuck_past_deadline(&mut cx) {
            let mut fresh = Ctx::new(o, settings);
            spec_change(&mut fresh);
            start_rollback(&mut fresh, failure);
            return fresh.finish();
        }
        return cx.finish();
    }

    let result = match cx.status.stage {
        Stage::Preflight => Ok(()),
        Stage::OrphaningStatefulSet => stages::orphaning(&mut cx),
        Stage::Migrating => stages::migrating(&mut cx),
        Stage::RecreatingStatefulSet => stages::recreating_stateful_set(&mut cx),
        Stage::Finalizing => stages::finalizing(&mut cx),
        Stage::RollingBack => stages::rolling_back(&mut cx),
        Stage::Done => {
            // A final phase is always written with stage Done; a Done stage with a non-final
            // phase can only come from a hand-edited status: leave it alone.
            cx.requeue = REQUEUE_FINAL;
            Ok(())
        }
    };
    if let Err(failure) = result
        && cx.rejected.is_none()
    {
        let mut fresh = Ctx::new(o, settings);
        spec_change(&mut fresh);
        start_rollback(&mut fresh, failure);
        return fresh.finish();
    }
    cx.finish()
}

/// The finalizer of a request in progress, missing: added with the acceptance, it went missing
/// since (a `kubectl replace` or `apply` of the request, a hand edit, or the operator died
/// between the status write and the finalizer). Added back: without it a deletion would skip
/// the rollback.
fn restore_finalizer(cx: &mut Ctx) {
    cx.act(Action::AddFinalizer);
    cx.event(
        EventType::Warning,
        "FinalizerRestored",
        format!(
            "finalizer {} was missing from the request in progress (replaced or edited?); \
             added back",
            labels::FINALIZER
        ),
    );
}

/// Why an orphaning or migrating request must roll back now, if it must: its timeout expired,
/// it is being deleted, or it carries the abort annotation.
fn rollback_asked(cx: &Ctx, deleting: bool) -> Option<Failure> {
    let early = matches!(
        cx.status.stage,
        Stage::OrphaningStatefulSet | Stage::Migrating
    );
    if !early || cx.status.failure.is_some() {
        return None;
    }
    if let Some(failure) = expired(cx) {
        let failure = disruption::timeout_failure(cx, failure);
        return Some(foreign::timeout_failure(cx, failure));
    }
    if deleting {
        return Some(Failure::Deleted);
    }
    aborted(&cx.o.request).then(|| Failure::Aborted {
        annotation: labels::ABORT_ANNOTATION.to_string(),
    })
}

/// True when the request carries the abort annotation ([`labels::ABORT_ANNOTATION`]).
pub fn aborted(req: &StorageMigrationRequest) -> bool {
    req.annotations().contains_key(labels::ABORT_ANNOTATION)
}

/// `Some(Failure::TimedOut)` once the request's timeout has expired.
pub(crate) fn expired(cx: &Ctx) -> Option<Failure> {
    let start = cx.status.start_time.as_ref()?;
    let total = timeout_seconds(&cx.spec().timeout).ok()?;
    let elapsed = cx.o.now.as_second() - start.0.as_second();
    (elapsed > total).then(|| Failure::TimedOut {
        timeout: cx.spec().timeout.clone(),
    })
}

/// Records the failure and moves to RollingBack (status first: the rollback's actions follow on
/// the next decision).
pub(crate) fn start_rollback(cx: &mut Ctx, failure: Failure) {
    let reason = format!("{failure}{}", runbook::pointer(&failure));
    cx.actions.clear();
    cx.status.failure = Some(reason.clone());
    cx.enter_stage(Stage::RollingBack);
    cx.status.message = Some(format!("rolling back: {reason}"));
    cx.set_condition(conditions::PROGRESSING, true, "RollingBack", &reason);
    cx.event(EventType::Warning, "RollingBack", reason);
    cx.requeue = Duration::ZERO;
}

/// Something is broken in a way the operator cannot fix by itself: say so and keep looking.
pub(crate) fn stuck(cx: &mut Ctx, kind: runbook::Stuck, reason: &str) {
    let message = format!("stuck: {reason}{}", runbook::pointer(kind));
    if cx.status.message.as_deref() != Some(message.as_str()) {
        cx.status.message = Some(message.clone());
        cx.event(EventType::Warning, "Stuck", message);
    }
    cx.wait(REQUEUE_WAITING);
}

/// A spec changed after the request was accepted (or denied) is ignored: said once, in the
/// condition `SpecChangeIgnored` and an Event, naming the fields that differ and why; the
/// condition turns `False` when the spec is back to the accepted one.
fn spec_change(cx: &mut Ctx) {
    let Some(generation) = cx.o.request.metadata.generation else {
        return;
    };
    let judged = conditions::get(&cx.status.conditions, conditions::ACCEPTED)
        .and_then(|c| c.observed_generation);
    let message = match cx.status.accepted_spec.as_deref() {
        Some(accepted) => {
            let fields = changed_fields(accepted, &cx.o.request.spec);
            if fields.is_empty() {
                spec_change_cleared(cx);
                return;
            }
            format!(
                "spec changed (generation {generation}) after the request was accepted{}: {} \
                 differ from status.acceptedSpec; ignored, because the plan, the members already moved and \
                 the stash follow from the accepted spec. The migration carries on with it; for \
                 another migration, create a new request once this one has ended",
                judged
                    .map(|g| format!(" at generation {g}"))
                    .unwrap_or_default(),
                fields.join(", ")
            )
        }
        None if cx.status.phase == Phase::Denied && judged.is_some_and(|g| generation > g) => {
            format!(
                "spec changed (generation {generation}) after the request was denied at \
                 generation {}; ignored, because a denied request is final. Create a new \
                 request with the corrected spec",
                judged.unwrap_or_default()
            )
        }
        None => return,
    };
    let already = conditions::get(&cx.status.conditions, SPEC_CHANGE_IGNORED)
        .is_some_and(|c| c.message == message && c.status == "True");
    if !already {
        cx.set_condition(SPEC_CHANGE_IGNORED, true, "SpecImmutable", &message);
        cx.event(EventType::Warning, "SpecChangeIgnored", message);
    }
}

/// `SpecChangeIgnored` turns `False` once the spec is the accepted one again.
fn spec_change_cleared(cx: &mut Ctx) {
    if conditions::get(&cx.status.conditions, SPEC_CHANGE_IGNORED)
        .is_some_and(|c| c.status == "True")
    {
        cx.set_condition(
            SPEC_CHANGE_IGNORED,
            false,
            "SpecMatchesAccepted",
            "the spec is the accepted one again",
        );
    }
}

/// The top-level spec fields (as written in YAML) whose values differ.
fn changed_fields(
    accepted: &StorageMigrationRequestSpec,
    current: &StorageMigrationRequestSpec,
) -> Vec<String> {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(c))) = (
        serde_json::to_value(accepted),
        serde_json::to_value(current),
    ) else {
        return vec!["spec".to_string()];
    };
    let mut keys: Vec<&String> = a.keys().chain(c.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| a.get(*k) != c.get(*k))
        .filter(|k| !observe::LIVE_SPEC_FIELDS.contains(&k.as_str()))
        .map(|k| format!("spec.{k}"))
        .collect()
}

/// Whether any member is past `Pending` but not finished.
pub(crate) fn in_flight(status: &StorageMigrationRequestStatus) -> Option<usize> {
    status.members.iter().position(|m| m.step.in_flight())
}

/// Whether the planner reads the database's health for a request in this state, so that the
/// cluster layer asks the database only then: in Preflight (roles, the engine's checks) and in
/// Migrating, except while the member in flight is down between its stop and its recreated
/// claim (the final copy, its verification and the claim swap). No gate is due in those steps,
/// and a read would wait on the stopped member every round of the member's downtime; only a
/// leader that stopped while it led is followed there, until another member is seen leading
/// (`MemberStatus::leader_change`: the election's length). The step
/// before each gate (PreCopying, RecreatingClaim) still reads it, so a gate never meets a
/// report that was not gathered. A final request reads none.
pub fn reads_health(status: &StorageMigrationRequestStatus) -> bool {
    if status.phase.is_final() {
        return false;
    }
    match status.stage {
        Stage::Preflight => true,
        Stage::Migrating => !in_flight(status)
            .and_then(|i| status.members.get(i))
            .is_some_and(|m| m.step.down_without_gate() && !m.leader_change_pending()),
        _ => false,
    }
}

/// `done/total` for the printer column.
pub(crate) fn progress(status: &StorageMigrationRequestStatus) -> String {
    let done = status.members.iter().filter(|m| m.step.settled()).count();
    format!("{done}/{}", status.members.len())
}

// -------------------------------------------------------------------------------------------
// Small readers of observed objects (pure).

pub(crate) fn is_terminating<K: kube::Resource>(obj: &K) -> bool {
    obj.meta().deletion_timestamp.is_some()
}

/// Whether a pod has finished (`Succeeded`, `Failed`): every container has exited.
pub(crate) fn pod_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The ownerReference of `obj` with `controller: true`, if any.
pub(crate) fn controller_ref(obj: &impl ResourceExt) -> Option<&OwnerReference> {
    obj.owner_references()
        .iter()
        .find(|r| r.controller == Some(true))
}

/// The claims a pod's volumes name.
pub(crate) fn claims_named(pod: &Pod) -> impl Iterator<Item = &str> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.as_str())
}

/// The claims a pod holds: those its volumes name, unless it has finished (`Succeeded`,
/// `Failed`: its volumes are unmounted, as the control plane's claim protection counts it).
pub(crate) fn claims_held(pod: &Pod) -> impl Iterator<Item = &str> {
    let finished = pod_finished(pod);
    claims_named(pod).filter(move |_| !finished)
}

pub(crate) fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// When the pod last became Ready.
pub(crate) fn pod_ready_since(pod: &Pod) -> Option<Timestamp> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

pub(crate) fn claim_phase(claim: &PersistentVolumeClaim) -> &str {
    claim
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

pub(crate) fn claim_volume(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .spec
        .as_ref()?
        .volume_name
        .as_deref()
        .filter(|v| !v.is_empty())
}

pub(crate) fn claim_class(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim.spec.as_ref()?.storage_class_name.as_deref()
}

/// The StorageClass of a volume (`spec.storageClassName`).
pub(crate) fn volume_class(pv: &PersistentVolume) -> Option<&str> {
    pv.spec.as_ref()?.storage_class_name.as_deref()
}

pub(crate) fn claim_request(
    claim: &PersistentVolumeClaim,
) -> Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity> {
    claim
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
}

pub(crate) fn volume_policy(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.clone())
        .unwrap_or_else(|| "Retain".to_string())
}

pub(crate) fn class_is_wffc(class: &StorageClass) -> bool {
    class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
}
