//! kube-runtime wiring: the `StorageMigrationRequest` controller, its Context and error policy.
//!
//! One reconcile gathers a snapshot, asks the planner, runs the actions in order, and repeats
//! while the planner has something to do (bounded), so a request moves through several steps per
//! reconcile instead of one step per requeue. What a request waits for wakes it up: the Jobs and
//! helper pods it owns, and the member pods, claims and volumes its plan names (a change of one
//! ends a pause within a reconcile at once, and queues a reconcile when none runs); a progressing
//! request is also requeued when its planner asks (every few seconds at most; half a second in the
//! claim swap, which the claims' and volumes' changes wake). Pods, claims and volumes are
//! watched as metadata only (`PartialObjectMetadata`): a wake-up needs their names and owners,
//! never their specs, so an unrelated pod costs the operator its metadata, not a decoded pod,
//! and nothing is kept of it. An ended request reads nothing of the cluster
//! (`plan::Observed::ended`) and is looked at again only when it changes (a deletion, a spec
//! edit): it costs nothing while it stays as it is. A watch that fails goes on after a pause of
//! a few seconds at most, and lists anew at once after a `410 Gone`
//! ([`crate::cluster::watch_retry`]).
//!
//! Errors by kind ([`Retry`]): a transient one is retried with exponential backoff (1 s
//! doubling to 60 s), a permanent one (403, 422, a bad spec, a decode error) is logged once and
//! looked at again only after [`PERMANENT_REQUEUE`] (or when the request changes).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::{self, reflector};
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::Notify;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::api::StorageMigrationRequest;
use crate::cluster::read_cache::Watched;
use crate::cluster::replay::{Answers, Mode};
use crate::cluster::watch_retry::retried;
use crate::cluster::{Cluster, ClusterError, ReadCache, Retry, VolumeCache};
use crate::failpoints;
use crate::kept::Kept;
use crate::labels;
use crate::ledger::CopyLedger;
use crate::metrics::Metrics;
use crate::plan::Settings;
use crate::plan::{self, Action};
use crate::quiet::Quiet;
use crate::scope::WatchScope;

/// Most decide→act rounds in one reconcile before yielding to the queue.
const MAX_ROUNDS: usize = 40;

/// The longest pause after a decision made only of side effects, before looking again.
const SIDE_EFFECT_PAUSE: Duration = Duration::from_millis(300);

/// When a request whose reconcile failed permanently is looked at again (a change of the
/// request wakes it up sooner).
pub const PERMANENT_REQUEUE: Duration = Duration::from_secs(600);
/// The first and the longest delay before a transient failure is retried.
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Most requests whose failures are remembered at once; the one that failed longest ago is
/// forgotten first.
const MAX_TRACKED: usize = 1024;

type Key = ObjectRef<StorageMigrationRequest>;

pub struct Context {
    pub client: Client,
    pub reporter: Reporter,
    /// The one Event recorder of the operator, shared by every reconcile: its cache is what
    /// turns a repeated Event into a series (a count on one Event) instead of a new object.
    recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// The operator's configuration the planner needs (its image, `--allow-request-mover-image`,
    /// `--helper-start-timeout`).
    pub settings: Settings,
    /// Failures per request, for the error policy.
    failures: Mutex<Failures>,
    /// One waker per request seen: a watched change of what it waits for ends its pause.
    wakers: Mutex<HashMap<Key, Arc<Notify>>>,
    /// The watched changes of each request, against its last round that decided nothing.
    quiet: Mutex<Quiet<Key>>,
    /// Each live request as its last round read or wrote it, while the watch of the requests
    /// delivered no change of it since ([`Kept`]).
    kept: Mutex<Kept<Key, StorageMigrationRequest>>,
    /// The copy slots held and awaited (kept only when the operator caps copies).
    copies: Mutex<CopyLedger>,
    /// Held while a decision that takes a copy slot is checked against the ledger and written.
    admission: tokio::sync::Mutex<()>,
    /// The volumes the rounds read, kept until the watch sees them change.
    volumes: Arc<VolumeCache>,
    /// The reads of watched kinds the rounds made, kept until their watches see a change.
    reads: Arc<ReadCache>,
}

impl Context {
    pub fn new(client: Client, settings: Settings, metrics: Arc<Metrics>) -> Self {
        let instance = std::env::var("POD_NAME")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok());
        let reporter = Reporter {
            controller: labels::EVENT_REPORTER.to_string(),
            instance,
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
            metrics,
            settings,
            failures: Mutex::new(Failures::new(MAX_TRACKED)),
            wakers: Mutex::new(HashMap::new()),
            quiet: Mutex::new(Quiet::default()),
            kept: Mutex::new(Kept::default()),
            copies: Mutex::new(CopyLedger::default()),
            admission: tokio::sync::Mutex::new(()),
            volumes: Arc::new(VolumeCache::default()),
            reads: Arc::new(ReadCache::default()),
        }
    }

    fn copies(&self) -> std::sync::MutexGuard<'_, CopyLedger> {
        self.copies.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records in the ledger what a status of request `key` says of its copy slot, and wakes
    /// the requests waiting for one when it gave one back. Nothing without caps.
    fn note_copies(&self, key: &Key, status: Option<&crate::api::StorageMigrationRequestStatus>) {
        if self.settings.copy_caps.any() {
            let wake = self.copies().note(key, status);
            self.wake(&wake);
        }
    }

    /// The other requests' members holding a copy slot (none without caps).
    fn copy_holders(&self, key: &Key) -> Vec<plan::slots::CopyHolder> {
        if self.settings.copy_caps.any() {
            self.copies().holders_except(key)
        } else {
            Vec::new()
        }
    }

    fn wakers(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<Notify>>> {
        self.wakers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The waker of a request, made on first use.
    fn waker(&self, key: &Key) -> Arc<Notify> {
        self.wakers().entry(key.clone()).or_default().clone()
    }

    fn quiet(&self) -> std::sync::MutexGuard<'_, Quiet<Key>> {
        self.quiet.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a watched change of each request of `keys` ([`Quiet`]), and ends the current (or
    /// next) pause of those that have a waker.
    fn wake(&self, keys: &[Key]) {
        let mut quiet = self.quiet();
        for key in keys {
            quiet.changed(key);
        }
        drop(quiet);
        let wakers = self.wakers();
        for key in keys {
            if let Some(w) = wakers.get(key) {
                w.notify_one();
            }
        }
    }

    /// [`Context::wake`] for a watched change of `obj` (a `kind`), traced: which change woke
    /// which request is what tells a round that decided nothing from one that did.
    fn wake_by<K: Resource>(&self, keys: &[Key], kind: &str, obj: &K) {
        if !keys.is_empty() {
            let m = obj.meta();
            tracing::trace!(
                kind,
                name = m.name.as_deref().unwrap_or_default(),
                resource_version = m.resource_version.as_deref().unwrap_or_default(),
                terminating = m.deletion_timestamp.is_some(),
                requests = ?keys.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(),
                "watched change wakes"
            );
        }
        self.wake(keys);
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept<Key, StorageMigrationRequest>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A change of the request `key` other than its status, or its removal, delivered by the
    /// watch: the copy of it kept is void ([`Kept`]).
    fn request_changed(&self, key: &Key) {
        self.kept().changed(key);
    }

    /// The watch of the requests failed or lists them anew: every copy kept is void
    /// ([`Kept::changed_all`]).
    fn requests_relisted(&self) {
        self.kept().changed_all();
    }

    /// Drops a request's waker (the request is gone).
    fn drop_waker(&self, key: &Key) {
        self.wakers().remove(key);
    }

    /// The cluster layer for one reconcile, with the operator's one recorder.
    fn cluster(&self) -> Cluster {
        Cluster::new(self.client.clone(), self.recorder.clone())
            .with_volume_cache(self.volumes.clone())
            .with_read_cache(self.reads.clone())
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, Failures> {
        self.failures.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets a request's failures (it reconciled, or it is gone).
    fn forget(&self, obj: &Key) {
        self.failures().forget(obj);
    }

    /// Drops everything kept about a request that is gone: its failures, its waker, its entry
    /// in the phase gauge.
    fn gone(&self, obj: &Key) {
        self.note_copies(obj, None);
        self.forget(obj);
        self.drop_waker(obj);
        self.quiet().forget(obj);
        self.kept().forget(obj);
        self.metrics.request_phase(&phase_key(obj), None);
    }
}

/// What the error policy does about one failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub retry: Retry,
    pub delay: Duration,
    /// Whether to log it as new (a permanent error is logged once until it changes).
    pub log: bool,
}

/// The failures of each request since its last successful reconcile, at most `max` requests.
#[derive(Debug)]
pub struct Failures {
    by_request: HashMap<Key, Failing>,
    max: usize,
}

#[derive(Debug)]
struct Failing {
    transient: u32,
    /// The permanent error last logged.
    permanent: Option<String>,
    last: Instant,
}

impl Failures {
    pub fn new(max: usize) -> Self {
        Self {
            by_request: HashMap::new(),
            max: max.max(1),
        }
    }

    /// Records a failure of `obj` and says when to retry and whether to log it.
    pub fn record(&mut self, obj: &Key, retry: Retry, error: &str) -> Verdict {
        if !self.by_request.contains_key(obj) && self.by_request.len() >= self.max {
            self.evict_oldest();
        }
        let f = self.by_request.entry(obj.clone()).or_insert(Failing {
            transient: 0,
            permanent: None,
            last: Instant::now(),
        });
        f.last = Instant::now();
        match retry {
            Retry::Transient => {
                f.transient = f.transient.saturating_add(1);
                f.permanent = None;
                Verdict {
                    retry,
                    delay: backoff_delay(f.transient),
                    log: true,
                }
            }
            Retry::Permanent => {
                let log = f.permanent.as_deref() != Some(error);
                f.permanent = Some(error.to_string());
                Verdict {
                    retry,
                    delay: PERMANENT_REQUEUE,
                    log,
                }
            }
        }
    }

    pub fn forget(&mut self, obj: &Key) {
        self.by_request.remove(obj);
    }

    pub fn len(&self) -> usize {
        self.by_request.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_request.is_empty()
    }

    fn evict_oldest(&mut self) {
        let oldest = self
            .by_request
            .iter()
            .min_by_key(|(_, f)| f.last)
            .map(|(k, _)| k.clone());
        if let Some(k) = oldest {
            self.by_request.remove(&k);
        }
    }
}

/// The delay before the `attempt`-th retry of a transient failure (1 s doubling to 60 s).
pub fn backoff_delay(attempt: u32) -> Duration {
    let n = attempt.clamp(1, 32) as usize;
    ExponentialBuilder::new()
        .with_min_delay(BACKOFF_MIN)
        .with_max_delay(BACKOFF_MAX)
        .with_factor(2.0)
        .without_max_times()
        .build()
        .nth(n - 1)
        .unwrap_or(BACKOFF_MAX)
}

/// One reconcile of one request.
pub async fn reconcile(
    req: Arc<StorageMigrationRequest>,
    ctx: Arc<Context>,
) -> Result<Requeue, ClusterError> {
    let ns = req.namespace().unwrap_or_default();
    let name = req.name_any();
    let key = format!("{ns}/{name}");
    let span = info_span!("reconcile", request = %key);
    let started = Instant::now();
    let result = async {
        let obj = ObjectRef::from_obj(req.as_ref());
        if let Some(left) = ctx.quiet().remaining(&obj, Instant::now()) {
            debug!(
                ?left,
                "nothing watched changed since a round decided nothing: waiting on"
            );
            return Ok(Requeue::requeue(left));
        }
        rounds(&ctx, &obj, &key).await
    }
    .instrument(span)
    .await;
    ctx.metrics
        .reconcile_finished(started.elapsed().as_secs_f64());
    result
}

/// The decide→act rounds of one reconcile of the request `obj` (`key`: its namespace/name), at
/// most [`MAX_ROUNDS`]: until a round decides nothing, or the request is gone.
async fn rounds(ctx: &Context, obj: &Key, key: &str) -> Result<Requeue, ClusterError> {
    let cluster = ctx.cluster();
    let waker = ctx.waker(obj);
    let mut requeue = plan::REQUEUE_PROGRESSING;
    let mut ended = false;
    // After a decision that only wrote the status: the answers it was made on, for the next
    // round (see `decided`).
    let mut replay: Option<Arc<Answers>> = None;
    // The count of watched changes when the reads a round decides on began ([`Quiet`]): a
    // replayed round's are those of the round it replays.
    let mut replayed_seen: Option<u64> = None;
    for _ in 0..MAX_ROUNDS {
        let seen = (replayed_seen.take()).unwrap_or_else(|| ctx.quiet().count(obj));
        let Some((current, kept_at)) = current_request(ctx, &cluster, obj).await? else {
            ctx.gone(obj);
            return Ok(Requeue::await_change());
        };
        let round = Instant::now();
        ended = plan::Observed::has_ended(&current);
        ctx.note_copies(obj, current.status.as_ref());
        let replaying = replay.take().filter(|a| a.replayable());
        let Some(decided) = decided(ctx, &cluster, obj, current, replaying).await? else {
            continue;
        };
        let (observed, decision) = (&decided.observed, &decided.decision);
        let gathered = round.elapsed();
        record_phase(&ctx.metrics, key, observed, decision);
        requeue = decision.requeue;
        if decision.actions.is_empty() {
            keep_request(ctx, obj, decision, &observed.request, None, kept_at);
            debug!(
                gather_ms = gathered.as_millis(),
                ?requeue,
                "round: nothing to do"
            );
            if !plan::slots::waiting(observed.request.status.as_ref()) {
                if !ended {
                    ctx.quiet().settle(obj, seen, Instant::now() + requeue);
                }
                break;
            }
            // Waiting for a copy slot: until one is given back, or the planner's pause.
            pause(&waker, requeue).await;
            continue;
        }
        let Carried::Done(status_written) = carry_out(ctx, &cluster, obj, &decided).await? else {
            continue;
        };
        keep_request(
            ctx,
            obj,
            decision,
            &observed.request,
            status_written,
            kept_at,
        );
        debug!(
            gather_ms = gathered.as_millis(),
            act_ms = (round.elapsed() - gathered).as_millis(),
            actions = ?decision.actions.iter().map(Action::name).collect::<Vec<_>>(),
            "round"
        );
        match after_acting(decision) {
            AfterActing::Settle => {
                ctx.quiet().settle(obj, seen, Instant::now() + requeue);
                break;
            }
            AfterActing::Replay => {
                replay = Some(decided.answers);
                replayed_seen = Some(seen);
            }
            AfterActing::Pause(wait) => pause(&waker, wait).await,
            AfterActing::LookAtOnce => {}
        }
    }
    ctx.forget(obj);
    Ok(requeue_after_rounds(ended, requeue))
}

/// What follows a round that acted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterActing {
    /// It only started Jobs: nothing to look at until a Job reports or the planner's wait is
    /// over; a reconcile queued by a change this round's reads already saw waits it out.
    Settle,
    /// It only wrote the status: the next round decides on the same answers.
    Replay,
    /// Only side effects, or a status with work others carry out (a create, a delete): give
    /// them a moment before looking, no longer than the planner asked to wait (the claim swap
    /// polls faster), and no longer than until a watched object of this request changes.
    Pause(Duration),
    /// A status with only writes of our own (the stash, a finalizer), or no wait asked: the
    /// next round looks at once, nothing else is to happen first.
    LookAtOnce,
}

fn after_acting(decision: &plan::Decision) -> AfterActing {
    if only_starts_jobs(decision) {
        AfterActing::Settle
    } else if only_writes_status(decision) {
        AfterActing::Replay
    } else if decision.requeue > Duration::ZERO
        && (!changes_status(decision) || leaves_work_to_others(decision))
    {
        AfterActing::Pause(decision.requeue.min(SIDE_EFFECT_PAUSE))
    } else {
        AfterActing::LookAtOnce
    }
}

/// When the reconcile after these rounds comes: an ended request only when it changes (a
/// deletion, a spec edit), else after the last decision's wait (100 ms when it asked none).
fn requeue_after_rounds(ended: bool, requeue: Duration) -> Requeue {
    if ended {
        Requeue::await_change()
    } else if requeue.is_zero() {
        Requeue::requeue(Duration::from_millis(100))
    } else {
        Requeue::requeue(requeue)
    }
}

/// The request to decide on, with the count of its watched changes ([`Kept`]) it holds at: the
/// copy kept by the last round, else as read now (`None` once it is gone).
async fn current_request(
    ctx: &Context,
    cluster: &Cluster,
    obj: &Key,
) -> Result<Option<(StorageMigrationRequest, u64)>, ClusterError> {
    let seen = match ctx.kept().take(obj) {
        Ok(kept) => return Ok(Some(kept)),
        Err(seen) => seen,
    };
    let ns = obj.namespace.as_deref().unwrap_or_default();
    let read = cluster.fetch(ns, &obj.name).await?;
    Ok(read.map(|r| (r, seen)))
}

/// Keeps the request for the next round ([`Kept`]), as `decision`'s status write returned it
/// (`written`) or else as it was decided on, valid while no change of it counted since `seen`:
/// not after a decision that changed its metadata (a finalizer: the copy does not carry it), nor
/// once it has ended (an ended request is looked at again only when it changes).
fn keep_request(
    ctx: &Context,
    obj: &Key,
    decision: &plan::Decision,
    decided_on: &StorageMigrationRequest,
    written: Option<Box<StorageMigrationRequest>>,
    seen: u64,
) {
    let metadata = |a: &Action| matches!(a, Action::AddFinalizer | Action::RemoveFinalizer);
    if decision.actions.iter().any(metadata) {
        return;
    }
    let copy = written.map_or_else(|| decided_on.clone(), |r| *r);
    if !plan::Observed::has_ended(&copy) {
        ctx.kept().keep(obj, copy, seen);
    }
}

/// What carrying out a decision came to.
enum Carried {
    /// Nothing of it was done: it was made on copy slots that changed since, or its status
    /// write was refused as made on a view no longer current. Decide again on a fresh read.
    Again,
    /// Done; with the request as its last status write left it, if it wrote one.
    Done(Option<Box<StorageMigrationRequest>>),
}

/// Carries out `decided`'s decision ([`act`]). A decision that takes a copy slot is written
/// while no other is, and only if it was made on the slots as they are now.
async fn carry_out(
    ctx: &Context,
    cluster: &Cluster,
    obj: &Key,
    decided: &Decided,
) -> Result<Carried, ClusterError> {
    let (observed, decision) = (&decided.observed, &decided.decision);
    let taking = plan::slots::takes_slot(observed.request.status.as_ref(), decision);
    let _admitted = match taking {
        true => Some(ctx.admission.lock().await),
        false => None,
    };
    if taking && ctx.copy_holders(obj) != observed.copy_holders {
        debug!("copy slots changed while deciding; deciding again");
        return Ok(Carried::Again);
    }
    let member = in_flight_member(decision).unwrap_or_default();
    let noted = |s: &crate::api::StorageMigrationRequestStatus| ctx.note_copies(obj, Some(s));
    let engine = &decided.engine;
    let acted = act(cluster, &ctx.metrics, &noted, observed, engine, decision)
        .instrument(info_span!("member", member = %member))
        .await;
    match acted {
        // Decided on a view that is no longer current (another replica wrote, or the request
        // was edited): nothing of this decision was done; read and decide again.
        Err(e @ ClusterError::StaleStatus { .. }) => {
            info!(reason = %e, "status write refused; deciding again on a fresh read");
            Ok(Carried::Again)
        }
        Err(e) => Err(e),
        Ok(written) => Ok(Carried::Done(written.map(Box::new))),
    }
}

/// A decision, with the snapshot it was made on and the answers of the reads behind it.
struct Decided {
    observed: plan::Observed,
    engine: EngineResult,
    decision: plan::Decision,
    answers: Arc<Answers>,
}

/// How fresh the reads a decision must be made on are, from the least to the most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reads {
    /// Any: the last round's answers replayed ([`crate::cluster::replay`]), reads of watched
    /// kinds kept while their watches saw no change ([`crate::cluster::read_cache`]), volumes
    /// from the cache.
    Replayed,
    /// Made in this decision, with what it acts on read now ([`kinds_read_now`]).
    Fresh,
    /// As [`Reads::Fresh`], and the volumes whose state it acts on read now
    /// ([`volumes_read_now`]).
    FreshVolumes,
}

/// The reads `decision` must have been made on (from `observed`): kept or replayed ones, for
/// a decision whose every action [`kept_reads_suffice`]; volumes read now for one that
/// [`volumes_read_now`] names when volumes are cached; fresh reads for any other (a delete of
/// what is not ours, a patch, a handover, a stash).
pub fn reads_needed(
    decision: &plan::Decision,
    observed: &plan::Observed,
    caches_volumes: bool,
) -> Reads {
    let kept_suffice = (decision.actions.iter()).all(|a| kept_reads_suffice(a, observed));
    if caches_volumes && !volumes_read_now(decision, observed).is_empty() {
        Reads::FreshVolumes
    } else if kept_suffice {
        Reads::Replayed
    } else {
        Reads::Fresh
    }
}

/// Whether `action` may be carried out on kept or replayed reads (see `decided`): a status,
/// events and creates (a create of what exists fails or finds it: nothing is lost); giving a
/// volume `Retain` (keeping its data loses nothing, whatever the volume's state); deleting one
/// of our Jobs, or of our helper pods, by its uid (a successor of the same name is never
/// deleted, and a Job's end and a helper's use are not undone: a deletion decided on what they
/// were a moment ago is the one decided on what they are).
pub fn kept_reads_suffice(action: &Action, observed: &plan::Observed) -> bool {
    match action {
        Action::SetStatus(_) | Action::Event { .. } | Action::Create(_) => true,
        Action::PatchReclaimPolicy { policy, .. } => policy == plan::retain::RETAIN,
        Action::Delete {
            kind, name, uid, ..
        } => {
            uid.is_some()
                && match kind {
                    plan::Kind::Job => observed.jobs.contains_key(name),
                    plan::Kind::Pod => observed.helper_pods.contains_key(name),
                    _ => false,
                }
        }
        _ => false,
    }
}

/// The snapshot of `current` ([`snapshot`]) and the planner's decision on it: on `replay`
/// (the answers of the round before, which only wrote the status) when given, else on kept
/// and fresh reads. A decision that needs fresher reads than it was made on ([`reads_needed`])
/// is made again before anything of it is done, on the answers the API server gave since this
/// decision began, with the watched kinds it acts on ([`kinds_read_now`]) and the volumes whose
/// state it acts on ([`volumes_read_now`]) read now. So a claim is deleted only on the `Retain`
/// of its volume as it is at that moment, a pod only as the pods are now, and nothing but what
/// [`kept_reads_suffice`] for is decided on replayed or kept answers.
async fn decided(
    ctx: &Context,
    cluster: &Cluster,
    obj: &Key,
    mut current: StorageMigrationRequest,
    replay: Option<Arc<Answers>>,
) -> Result<Option<Decided>, ClusterError> {
    let began = Instant::now();
    let mut made_on = MadeOn {
        replayed: replay.is_some(),
        kinds: BTreeSet::new(),
        volumes: cluster.caches_volumes().then(BTreeSet::new),
    };
    let (mut answers, mut mode) = match replay {
        Some(answers) => (answers, Mode::Replay),
        None => (Answers::new(), Mode::Record),
    };
    loop {
        let client = answers.client(cluster.kept_reads(&made_on.kinds), mode);
        let volumes_now = made_on.volumes.clone().unwrap_or_default();
        let reading = (cluster.reading_through(client)).reading_volumes_now(volumes_now);
        let Some((observed, engine)) = snapshot(ctx, cluster, &reading, obj, current).await? else {
            return Ok(None);
        };
        let decision = plan::decide(&observed, &ctx.settings);
        let Some((kinds, volumes)) = made_on.lacks(&decision, &observed) else {
            return Ok(Some(Decided {
                observed,
                engine,
                decision,
                answers,
            }));
        };
        debug!(
            ?made_on,
            ?kinds,
            ?volumes,
            "decided on reads older than the decision needs: reading, deciding again"
        );
        (answers, mode) = (answers.read_since(began), Mode::Replay);
        current = observed.request;
        made_on.replayed = false;
        made_on.kinds.extend(kinds);
        if let Some(read) = &mut made_on.volumes {
            read.extend(volumes);
        }
    }
}

/// What a decision was made on (see [`decided`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MadeOn {
    /// On the answers of the round before (its reads of the kinds not watched among them).
    pub replayed: bool,
    /// The watched kinds read now, not kept.
    pub kinds: BTreeSet<Watched>,
    /// The volumes read now, not kept (`None`: volumes are not kept, each is read now).
    pub volumes: Option<BTreeSet<String>>,
}

impl MadeOn {
    /// What `decision` (made on `observed`) needs read now that it was not made on: `None`
    /// when it may be carried out as it is ([`reads_needed`], [`kinds_read_now`],
    /// [`volumes_read_now`]).
    pub fn lacks(
        &self,
        decision: &plan::Decision,
        observed: &plan::Observed,
    ) -> Option<(BTreeSet<Watched>, BTreeSet<String>)> {
        if reads_needed(decision, observed, self.volumes.is_some()) == Reads::Replayed {
            return None;
        }
        let kinds: BTreeSet<Watched> = kinds_read_now(decision);
        let volumes = match &self.volumes {
            Some(_) => volumes_read_now(decision, observed),
            None => BTreeSet::new(),
        };
        let read = self.volumes.as_ref();
        let volumes_read = read.is_none_or(|read| volumes.is_subset(read));
        let enough = !self.replayed && kinds.is_subset(&self.kinds) && volumes_read;
        (!enough).then_some((kinds, volumes))
    }
}

/// The watched kinds ([`Watched`]) whose reads `decision` must have made now, not kept: those
/// it acts on (a pod, claim, Job, set or stash it deletes, what it stashes and the stash, the
/// pods of a handover or a scale, a claim or set it patches); none for what acts on the request,
/// a volume (see [`volumes_read_now`]) or only creates; none for what [`kept_reads_suffice`]
/// for.
pub fn kinds_read_now(decision: &plan::Decision) -> BTreeSet<Watched> {
    let of_kind = |kind: &plan::Kind| match kind {
        plan::Kind::Pod => Watched::Pods,
        plan::Kind::Claim => Watched::Claims,
        plan::Kind::Job => Watched::Jobs,
        plan::Kind::StatefulSet => Watched::StatefulSets,
        plan::Kind::ConfigMap => Watched::ConfigMaps,
    };
    let mut kinds = BTreeSet::new();
    for action in &decision.actions {
        match action {
            Action::Delete { kind, .. } => {
                kinds.insert(of_kind(kind));
                // A member is stopped only while no budget that selects it forbids.
                if *kind == plan::Kind::Pod {
                    kinds.insert(Watched::Budgets);
                }
            }
            Action::ForceDeletePod { .. }
            | Action::TransferLeadership { .. }
            | Action::ScaleDeployment { .. } => _ = kinds.insert(Watched::Pods),
            Action::Stash { key, .. } => {
                kinds.insert(Watched::ConfigMaps);
                kinds.insert(match key.as_str() {
                    labels::STASH_STATEFULSET_KEY => Watched::StatefulSets,
                    k if k.starts_with(labels::STASH_CLAIM_KEY_PREFIX) => Watched::Claims,
                    _ => Watched::Pods,
                });
            }
            Action::RemoveOwnerReferences { .. } | Action::AnnotateClaim { .. } => {
                _ = kinds.insert(Watched::Claims)
            }
            Action::PatchRetentionPolicy { .. } => _ = kinds.insert(Watched::StatefulSets),
            Action::SetStatus(_)
            | Action::AddFinalizer
            | Action::RemoveFinalizer
            | Action::Event { .. }
            | Action::Create(_)
            | Action::PatchReclaimPolicy { .. }
            | Action::SetClaimRef { .. }
            | Action::LabelVolume { .. } => {}
        }
    }
    kinds
}

type EngineResult = Result<crate::cluster::Engine, String>;

/// The volumes `decision` does what is decided on the state of (read from `observed`): each
/// volume of a claim it deletes (it must be on `Retain`), each it gives a policy other than
/// `Retain`, each it points at a claim. Those are read now, not taken from the cache, before
/// the decision is carried out (`decided`).
pub fn volumes_read_now(decision: &plan::Decision, observed: &plan::Observed) -> BTreeSet<String> {
    let claim_volume = |claim: &str| {
        let claim = observed.claims.get(claim)?;
        claim.spec.as_ref()?.volume_name.clone()
    };
    (decision.actions.iter())
        .filter_map(|a| match a {
            Action::Delete { kind, name, .. } if *kind == plan::Kind::Claim => claim_volume(name),
            Action::PatchReclaimPolicy { volume, policy } if policy != plan::retain::RETAIN => {
                Some(volume.clone())
            }
            Action::SetClaimRef { volume, .. } => Some(volume.clone()),
            _ => None,
        })
        .collect()
}

/// Waits `up_to`, or until the request's waker is notified.
async fn pause(waker: &Notify, up_to: Duration) {
    tokio::select! {
        () = tokio::time::sleep(up_to) => tracing::trace!("pause: waited it out"),
        () = waker.notified() => tracing::trace!("pause: ended by a watched change"),
    }
}

/// The snapshot of `current` to decide on, read through `reading` (see [`observe`]), with the
/// engine's client (made on `live`: the database's view is never replayed); the other
/// requests' copy slots from the ledger. An ended request reads nothing of the cluster (see
/// `Observed::ended`).
async fn snapshot(
    ctx: &Context,
    live: &Cluster,
    reading: &Cluster,
    obj: &Key,
    current: StorageMigrationRequest,
) -> Result<Option<(plan::Observed, Result<crate::cluster::Engine, String>)>, ClusterError> {
    if plan::Observed::has_ended(&current) {
        let now = k8s_openapi::jiff::Timestamp::now();
        let engine = Err("the request has ended".to_string());
        return Ok(Some((plan::Observed::ended(current, now), engine)));
    }
    let engine = live.engine(&current).await.map_err(|e| e.to_string());
    let Some(mut observed) = observe(reading, current, &engine).await? else {
        return Ok(None);
    };
    observed.copy_holders = ctx.copy_holders(obj);
    Ok(Some((observed, engine)))
}

/// Carries out a decision's actions in order, stopping at the first error; a status once
/// written feeds the metrics and `noted` (a refused one does not: it is decided again).
/// Returns the request as the last status write left it, if the decision wrote one.
async fn act(
    cluster: &Cluster,
    metrics: &Metrics,
    noted: &(dyn Fn(&crate::api::StorageMigrationRequestStatus) + Sync),
    observed: &plan::Observed,
    engine: &Result<crate::cluster::Engine, String>,
    decision: &plan::Decision,
) -> Result<Option<StorageMigrationRequest>, ClusterError> {
    let before = observed.request.status.as_ref();
    let mut written = None;
    for action in &decision.actions {
        let done = cluster.execute(observed, engine, action).await;
        if let (Action::TransferLeadership { .. }, Err(e @ ClusterError::Engine(_))) =
            (action, &done)
        {
            report_handover_refused(cluster, &observed.request, e).await;
        }
        if let Some(request) = done? {
            written = Some(request);
        }
        if let Action::SetStatus(after) = action {
            metrics.status_written(before, after);
            noted(after);
        }
        failpoints::after_action(before, action);
    }
    Ok(written)
}

/// Feeds the phase gauge with the phase on record, or the one the decision is about to write.
fn record_phase(
    metrics: &Metrics,
    key: &str,
    observed: &plan::Observed,
    decision: &plan::Decision,
) {
    let mut phase = observed.request.status.as_ref().map(|s| s.phase);
    for action in &decision.actions {
        if let Action::SetStatus(after) = action {
            phase = Some(after.phase);
        }
    }
    metrics.request_phase(key, Some(phase.unwrap_or_default()));
}

/// The snapshot of `current` to decide on; `None` after the controller wrote the request's
/// status itself (`ReadFailing` cleared: the reads succeed again), so that it is read again. A
/// read that fails is an error, and past the request's timeout its status says so.
async fn observe(
    cluster: &Cluster,
    current: StorageMigrationRequest,
    engine: &Result<crate::cluster::Engine, String>,
) -> Result<Option<plan::Observed>, ClusterError> {
    let observed = match cluster.gather(current.clone(), engine).await {
        Ok(o) => o,
        Err(e) => {
            report_read_failure(cluster, &current, &e).await;
            return Err(e);
        }
    };
    let Some(status) = read_recovered(&observed.request, observed.now) else {
        return Ok(Some(observed));
    };
    match cluster.write_status(&observed.request, &status).await {
        Ok(()) | Err(ClusterError::StaleStatus { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Says in the request's status (condition `ReadFailing`) that reading what it needs keeps
/// failing, once its timeout has expired: the planner, and so the timeout's rollback, cannot run
/// until the reads succeed. Best effort: the write may fail for the same reason.
async fn report_read_failure(
    cluster: &Cluster,
    req: &StorageMigrationRequest,
    error: &ClusterError,
) {
    let now = k8s_openapi::jiff::Timestamp::now();
    let Some(status) = read_failing(req, &error.to_string(), now) else {
        return;
    };
    match cluster.write_status(req, &status).await {
        Ok(()) => {
            warn!(error = %error, "reads keep failing past the request's timeout; said so in its status")
        }
        Err(e) => debug!(error = %e, "cannot record that the reads keep failing"),
    }
}

/// Says in the request's status (condition `HealthGate` False, reason `HandoverRefused`) that
/// the leader's handover failed or was not answered in time: the operator does not stop a
/// member that still leads, and asks again. Also a Warning Event. Best effort.
async fn report_handover_refused(
    cluster: &Cluster,
    req: &StorageMigrationRequest,
    error: &ClusterError,
) {
    let now = k8s_openapi::jiff::Timestamp::now();
    let Some(status) = handover_refused(req, &error.to_string(), now) else {
        return;
    };
    cluster
        .warning_event(req, "HandoverRefused", &error.to_string())
        .await;
    match cluster.write_status(req, &status).await {
        Ok(()) => warn!(error = %error, "leader handover refused; said so in the status"),
        Err(e) => debug!(error = %e, "cannot record the refused handover"),
    }
}

/// The status that says (condition `HealthGate` False, reason `HandoverRefused`) that handing
/// leadership over failed with `error`; `None` when the status already says exactly that.
/// Pure.
pub fn handover_refused(
    req: &StorageMigrationRequest,
    error: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Option<crate::api::StorageMigrationRequestStatus> {
    let mut status = req.status.clone()?;
    if status.phase.is_final() {
        return None;
    }
    let message = format!(
        "the leader's handover did not complete: {error}; the operator does not stop a member \
         that still leads: it looks again and, while the member leads, asks again until the \
         request's timeout"
    );
    let changed = crate::api::conditions::set(
        &mut status.conditions,
        crate::api::conditions::HEALTH_GATE,
        false,
        "HandoverRefused",
        &message,
        req.metadata.generation,
        &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
    );
    changed.then_some(status)
}

/// The status that says (condition `ReadFailing` True, reason `Failing`) that reading what the
/// request needs fails with `error`, when the request is in flight and its timeout (from its
/// start, or from its creation before it started) expired by `now`; `None` otherwise, or when
/// the status already says exactly that. Pure.
pub fn read_failing(
    req: &StorageMigrationRequest,
    error: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Option<crate::api::StorageMigrationRequestStatus> {
    let mut status = req.status.clone().unwrap_or_default();
    if status.phase.is_final() {
        return None;
    }
    let timeout = plan::observe::effective_spec(req).timeout;
    let seconds = plan::timeout_seconds(&timeout).ok()?;
    let since = (status.start_time.as_ref())
        .or(req.metadata.creation_timestamp.as_ref())?
        .0;
    if now.as_second() - since.as_second() <= seconds {
        return None;
    }
    let message = format!(
        "reading what the request needs keeps failing ({error}); its timeout of {timeout} has          expired, and it rolls back as soon as the reads succeed again"
    );
    let time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now);
    let generation = req.metadata.generation;
    let changed = crate::api::conditions::set(
        &mut status.conditions,
        crate::api::conditions::READ_FAILING,
        true,
        "Failing",
        &message,
        generation,
        &time,
    );
    changed.then_some(status)
}

/// The status that clears `ReadFailing` (False, reason `Recovered`) when it is True: the reads
/// succeeded. Pure.
pub fn read_recovered(
    req: &StorageMigrationRequest,
    now: k8s_openapi::jiff::Timestamp,
) -> Option<crate::api::StorageMigrationRequestStatus> {
    let mut status = req.status.clone()?;
    let failing =
        crate::api::conditions::get(&status.conditions, crate::api::conditions::READ_FAILING)
            .is_some_and(|c| c.status == "True");
    if !failing {
        return None;
    }
    crate::api::conditions::set(
        &mut status.conditions,
        crate::api::conditions::READ_FAILING,
        false,
        "Recovered",
        "the reads succeed again",
        req.metadata.generation,
        &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
    );
    Some(status)
}

/// The key of a request in the phase gauge (`namespace/name`).
fn phase_key(obj: &Key) -> String {
    format!(
        "{}/{}",
        obj.namespace.as_deref().unwrap_or_default(),
        obj.name
    )
}

/// Whether `d` writes the status (first, as a decision always does).
fn changes_status(d: &plan::Decision) -> bool {
    matches!(d.actions.first(), Some(Action::SetStatus(_)))
}

/// Whether `d` starts work that others carry out and a watched change reports: a create, a
/// delete, a claim bound to a volume, a Deployment scaled, a leader handed over, a binding
/// nudged.
pub fn leaves_work_to_others(d: &plan::Decision) -> bool {
    (d.actions.iter()).any(|a| {
        matches!(
            a,
            Action::Create(_)
                | Action::Delete { .. }
                | Action::ForceDeletePod { .. }
                | Action::SetClaimRef { .. }
                | Action::ScaleDeployment { .. }
                | Action::TransferLeadership { .. }
                | Action::AnnotateClaim { .. }
        )
    })
}

/// Whether `d` writes the status and does nothing else but publish events: the next round may
/// be decided on the answers `d` was decided on ([`decided`]).
pub fn only_writes_status(d: &plan::Decision) -> bool {
    does_besides_status(d, |a| matches!(a, Action::SetStatus(_)))
}

/// Whether `d` starts a Job and does nothing else but write the status and publish events:
/// nothing it did is worth looking at until the Job reports, which the watch of our Jobs wakes
/// the request for ([`job_trigger`]); its reconcile ends there rather than read again a round
/// later to find the Job running.
pub fn only_starts_jobs(d: &plan::Decision) -> bool {
    does_besides_status(d, |a| matches!(a, Action::Create(plan::Object::Job(_))))
}

/// Whether `d` has an action that is `this`, and none but those, status writes and events.
fn does_besides_status(d: &plan::Decision, this: impl Fn(&Action) -> bool) -> bool {
    let status_or_event = |a: &Action| matches!(a, Action::SetStatus(_) | Action::Event { .. });
    d.actions.iter().any(&this) && (d.actions.iter()).all(|a| this(a) || status_or_event(a))
}

fn in_flight_member(d: &plan::Decision) -> Option<String> {
    d.actions.iter().find_map(|a| match a {
        Action::SetStatus(s) => s
            .members
            .iter()
            .find(|m| m.step.in_flight())
            .map(|m| m.pod.clone()),
        _ => None,
    })
}

/// The key of a request the controller reports by its erased reference.
fn request_key(obj: &ObjectRef<kube::api::DynamicObject>) -> Key {
    let key = Key::new(&obj.name);
    match &obj.namespace {
        Some(ns) => key.within(ns),
        None => key,
    }
}

/// Retries a transient error with exponential backoff; a permanent one is logged once (with
/// the refused call) and looked at again after [`PERMANENT_REQUEUE`].
pub fn error_policy(
    req: Arc<StorageMigrationRequest>,
    err: &ClusterError,
    ctx: Arc<Context>,
) -> Requeue {
    let message = err.to_string();
    ctx.metrics.reconcile_failed(err.retry());
    let verdict = ctx
        .failures()
        .record(&ObjectRef::from_obj(req.as_ref()), err.retry(), &message);
    let request = format!("{}/{}", req.namespace().unwrap_or_default(), req.name_any());
    let call = err.refused_call().unwrap_or("-");
    match verdict {
        Verdict {
            retry: Retry::Transient,
            delay,
            ..
        } => warn!(request, error = %message, retry_in = ?delay, "reconcile failed"),
        Verdict {
            retry: Retry::Permanent,
            delay,
            log: true,
        } => error!(request, call, error = %message, retry_in = ?delay,
            "reconcile failed permanently; not retried until the request changes"),
        Verdict { .. } => tracing::debug!(request, error = %message, "reconcile failed again"),
    }
    Requeue::requeue(verdict.delay)
}

/// Runs the controller until SIGTERM/SIGINT, one watch per namespace of `scope` (one for all).
/// `settings`: the operator's image and how its helper pods run (see [`Settings`]).
pub async fn run(client: Client, scope: WatchScope, settings: Settings, metrics: Arc<Metrics>) {
    info!(
        namespaces = %scope,
        image = %settings.image,
        allow_request_mover_image = settings.allow_request_mover_image,
        helper_start_timeout = ?settings.helper_start_timeout,
        stage_timeout = ?settings.stage_timeout,
        "starting controller"
    );
    let ctx = Arc::new(Context::new(client.clone(), settings, metrics));
    if ctx.settings.copy_caps.any() {
        let ledger = CopyLedger::seed(&list_requests(&client, &scope).await);
        info!(
            max_copies = ?ctx.settings.copy_caps.cluster,
            max_copies_per_node = ?ctx.settings.copy_caps.per_node,
            held = ledger.held(),
            "copy caps: slots held by the requests on record"
        );
        *ctx.copies() = ledger;
    }
    watch_scope(client, &scope, ctx).await;
    info!("controller stopped");
}

/// How many volume events the fan-out keeps for a controller that has not taken them yet; one
/// further behind loses the oldest (their wake-ups only: each request's own polls still run).
const VOLUME_EVENTS: usize = 1024;

/// A controller for each watched namespace ([`watch_namespace`]), and the one watch of the
/// volumes' metadata they share: volumes are cluster-scoped, so a watch per namespace would
/// receive every volume event of the cluster once per namespace.
async fn watch_scope(client: Client, scope: &WatchScope, ctx: Arc<Context>) {
    let (events, _) = tokio::sync::broadcast::channel(VOLUME_EVENTS);
    // Each controller subscribes here, before the fan-out sends its first event.
    let controllers: Vec<_> = (scope.namespaces().into_iter())
        .map(|ns| {
            let volumes = volume_events(events.subscribe());
            watch_namespace(client.clone(), ns, ctx.clone(), volumes)
        })
        .collect();
    let classes = Api::<PartialObjectMeta<StorageClass>>::all(client.clone());
    let config = watch_config();
    let class_feed = kept_read_feed(classes, config, ctx.reads.clone(), Watched::StorageClasses);
    let classes = tokio::spawn(run_feeds(vec![class_feed]));
    let fan_out = tokio::spawn(fan_out_volumes(client, ctx.volumes.clone(), events));
    futures::future::join_all(controllers).await;
    fan_out.abort();
    classes.abort();
}

type VolumeMeta = PartialObjectMeta<PersistentVolume>;

/// Every watch of the operator: calls that last [`crate::cluster::WATCH_TIMEOUT_SECS`].
fn watch_config() -> watcher::Config {
    watcher::Config::default().timeout(crate::cluster::WATCH_TIMEOUT_SECS)
}

/// Watches the metadata of every volume: each event goes to `cache` (what it keeps may be
/// stale now; after a failure or a new list, all of it), each touched volume to the controllers.
async fn fan_out_volumes(
    client: Client,
    cache: Arc<VolumeCache>,
    to: tokio::sync::broadcast::Sender<VolumeMeta>,
) {
    let events = metadata_events(Api::<VolumeMeta>::all(client), watch_config())
        .inspect(move |event| cache.saw(event))
        .touched_objects();
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        match event {
            // No controller left to receive it: nothing to wake.
            Ok(volume) => drop(to.send(volume)),
            Err(e) => error!(error = %e, "the watch of the volumes' metadata"),
        }
    }
}

/// One controller's share of the volume events.
fn volume_events(
    from: tokio::sync::broadcast::Receiver<VolumeMeta>,
) -> impl futures::Stream<Item = Result<VolumeMeta, watcher::Error>> + Send + 'static {
    use tokio::sync::broadcast::error::RecvError;
    futures::stream::unfold(from, |mut from| async move {
        loop {
            match from.recv().await {
                Ok(volume) => return Some((Ok(volume), from)),
                Err(RecvError::Lagged(missed)) => {
                    warn!(
                        missed,
                        "volume events dropped before this controller took them"
                    )
                }
                Err(RecvError::Closed) => return None,
            }
        }
    })
}

/// Every request of the watched namespaces, listed before the first reconcile so that the copy
/// ledger counts the slots held before a restart. Retried (1 s doubling to 30 s) until a list
/// succeeds, as the controller's own watches are: nothing is decided before.
async fn list_requests(client: &Client, scope: &WatchScope) -> Vec<StorageMigrationRequest> {
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(BACKOFF_MIN)
        .with_max_delay(Duration::from_secs(30))
        .without_max_times()
        .build();
    loop {
        let mut all = Vec::new();
        let mut failed = None;
        for ns in scope.namespaces() {
            let api = scoped_api::<StorageMigrationRequest>(client, ns);
            match api.list(&Default::default()).await {
                Ok(list) => all.extend(list.items),
                Err(e) => failed = Some(e),
            }
        }
        let Some(e) = failed else {
            return all;
        };
        let delay = delays.next().unwrap_or(Duration::from_secs(30));
        error!(error = %e, ?delay, "cannot list the requests to count their copy slots; retrying");
        tokio::time::sleep(delay).await;
    }
}

/// One kube-runtime Controller over the requests of `namespace` (`None`: every namespace), the
/// Jobs they own, and the metadata of the pods and claims in the same namespaces and of every
/// volume (`volumes`, from the one shared watch): a helper pod wakes the request that owns it; a
/// member pod, a claim or a volume the requests whose plan names it ([`requests_naming`]).
async fn watch_namespace(
    client: Client,
    namespace: Option<&str>,
    ctx: Arc<Context>,
    volumes: impl futures::Stream<Item = Result<VolumeMeta, watcher::Error>> + Send + 'static,
) {
    let requests = scoped_api::<StorageMigrationRequest>(&client, namespace);
    let jobs = scoped_api::<Job>(&client, namespace);
    let pods = scoped_api::<PartialObjectMeta<Pod>>(&client, namespace);
    let claims = scoped_api::<PartialObjectMeta<PersistentVolumeClaim>>(&client, namespace);
    let kept_reads = tokio::spawn(kept_read_changes(&client, namespace, &ctx.reads));
    let owned = watch_config().labels(&labels::managed_by_selector());
    let (reader, writer) = reflector::store();
    let controller = Controller::for_stream(request_changes(requests, writer, &ctx), reader);
    let stores = [(); 5].map(|()| controller.store());
    let [
        pod_store,
        claim_store,
        volume_store,
        stopping_store,
        deleting_store,
    ] = stores;
    let (pod_ctx, claim_ctx, volume_ctx) = (ctx.clone(), ctx.clone(), ctx.clone());
    let job_ctx = ctx.clone();
    let job_changes = job_changes(jobs, owned, ctx.reads.clone()).inspect(move |job| {
        if let Ok(job) = job {
            job_ctx.wake_by(&owner_requests(job), "Job", job);
        }
    });
    controller
        .owns_stream(job_changes)
        .watches_stream(
            changes_that_matter(pods, stopping_store, Named::Pod, ctx.reads.clone()),
            move |pod: PartialObjectMeta<Pod>| {
                let mut keys = owner_requests(&pod);
                keys.extend(requests_naming(&pod_store.state(), &pod, Named::Pod));
                pod_ctx.wake_by(&keys, "Pod", &pod);
                keys
            },
        )
        .watches_stream(
            changes_that_matter(claims, deleting_store, Named::Claim, ctx.reads.clone()),
            wake_naming(claim_store, claim_ctx, Named::Claim),
        )
        .watches_stream(
            volumes,
            wake_naming(volume_store, volume_ctx, Named::Volume),
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| {
            let ctx = ctx.clone();
            async move {
                match result {
                    Ok((obj, _)) => tracing::debug!(request = %obj, "reconciled"),
                    // A request deleted between being queued and reconciled: nothing to do.
                    Err(kube::runtime::controller::Error::ObjectNotFound(obj)) => {
                        ctx.gone(&request_key(&obj));
                        tracing::debug!(request = %obj, "request is gone")
                    }
                    Err(e) => error!(error = %e, "controller"),
                }
            }
        })
        .await;
    kept_reads.abort();
}

/// The changes of the requests of `api` that start a reconcile: `writer`'s store sees every
/// change (the mappers read the plans), a reconcile is started only by a change a status write
/// does not make ([`request_trigger`]). Each change other than the status, a deletion, a
/// failure of the watch and a new list void the request copies kept ([`Kept`]).
fn request_changes(
    api: Api<StorageMigrationRequest>,
    writer: reflector::store::Writer<StorageMigrationRequest>,
    ctx: &Arc<Context>,
) -> impl futures::Stream<Item = Result<StorageMigrationRequest, watcher::Error>> + Send + 'static {
    let (removal_ctx, request_ctx) = (ctx.clone(), ctx.clone());
    reflector(writer, retried(watcher(api, watch_config())))
        .inspect(move |event| match event {
            Ok(watcher::Event::Delete(request)) => {
                removal_ctx.request_changed(&ObjectRef::from_obj(request));
            }
            // A failure, or a new list (after one, or a watch too far behind): a request
            // deleted or edited meanwhile may never come as an event of its own, and the next
            // list comes only after a pause (`retried`).
            Ok(watcher::Event::Init) | Err(_) => removal_ctx.requests_relisted(),
            Ok(_) => {}
        })
        .applied_objects()
        .predicate_filter(request_trigger, PredicateConfig::default())
        .inspect(move |request| {
            if let Ok(request) = request {
                let key = ObjectRef::from_obj(request);
                request_ctx.request_changed(&key);
                request_ctx.wake(&[key]);
            }
        })
}

/// Our Jobs' changes that may end what a request waits on: its ending conditions (`Complete`,
/// `Failed`: [`plan::observe::ENDING_JOB_CONDITIONS`]), a failed pod, its deletion; not its appearance (it is
/// ours: the round that created it looks at it), nor its interim conditions, nor the counts of
/// its active and ready pods, which change a few times in each Job's first second and end
/// nothing (a running copy is looked at again by the request's requeue,
/// `plan::member::copy_poll`). Full objects, as only ours are watched.
///
/// Not kube-runtime's `predicate_filter`: it drops an event whose hash did not change, a
/// deletion too, and a Job's deletion must wake its request (a Job deleted to be replaced).
fn job_changes(
    api: Api<Job>,
    config: watcher::Config,
    reads: Arc<ReadCache>,
) -> impl futures::Stream<Item = Result<Job, watcher::Error>> + Send + 'static {
    let mut triggers = JobTriggers::default();
    retried(watcher(api, config))
        .inspect(move |event| reads.saw(Watched::Jobs, event))
        .filter_map(move |event| futures::future::ready(triggers.changed(event)))
}

/// The trigger ([`job_trigger`]) of each Job the watch of our Jobs has seen, by uid.
#[derive(Debug, Default)]
pub struct JobTriggers {
    seen: HashMap<String, u64>,
}

impl JobTriggers {
    /// The Job of `event` when it starts a reconcile ([`job_changes`]). A Job first seen as
    /// created is no change (the round that created it goes on looking at it); one first seen
    /// ended, after a new list of the watch, is.
    pub fn changed(
        &mut self,
        event: Result<watcher::Event<Job>, watcher::Error>,
    ) -> Option<Result<Job, watcher::Error>> {
        match event {
            Ok(watcher::Event::Apply(job) | watcher::Event::InitApply(job)) => {
                let (uid, trigger) = (job.uid().unwrap_or_default(), job_trigger(&job));
                let before = (self.seen.insert(uid, trigger))
                    .unwrap_or_else(|| job_trigger(&Job::default()));
                (before != trigger).then_some(Ok(job))
            }
            Ok(watcher::Event::Delete(job)) => {
                self.seen.remove(&job.uid().unwrap_or_default());
                Some(Ok(job))
            }
            // A new list: every Job counts as new again.
            Ok(watcher::Event::Init) => {
                self.seen.clear();
                None
            }
            Ok(watcher::Event::InitDone) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

/// What of a Job starts a reconcile of its request when it changes ([`job_changes`]).
pub fn job_trigger(job: &Job) -> u64 {
    let status = job.status.as_ref();
    let conditions: Vec<(&str, &str)> = (status.and_then(|s| s.conditions.as_deref()))
        .unwrap_or_default()
        .iter()
        .filter(|c| plan::observe::ENDING_JOB_CONDITIONS.contains(&c.type_.as_str()))
        .map(|c| (c.type_.as_str(), c.status.as_str()))
        .collect();
    let failed = status.and_then(|s| s.failed).filter(|n| *n > 0);
    let deleted = job.metadata.deletion_timestamp.is_some();
    hash_of(&(conditions, failed, deleted))
}

/// What of a request starts a reconcile when it changes: its spec (`generation`), labels,
/// annotations (`abort`), finalizers and deletion; not its status, which the operator writes
/// itself: each status write would otherwise be followed by a reconcile that reads everything
/// again to find nothing new. A request waiting on something is looked at again by its requeue
/// and by the watches of what it waits on, as before.
pub fn request_trigger(r: &StorageMigrationRequest) -> Option<u64> {
    let m = &r.metadata;
    let deleted = m.deletion_timestamp.as_ref().map(|t| t.0.to_string());
    Some(hash_of(&(
        &m.uid,
        m.generation,
        &m.labels,
        &m.annotations,
        &m.finalizers,
        deleted,
    )))
}

/// The hash a trigger compares ([`job_trigger`], [`request_trigger`]).
fn hash_of(value: &impl std::hash::Hash) -> u64 {
    use std::hash::Hasher;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// The mapper of a watch of `named` objects: the requests whose plan names the object, woken
/// ([`Context::wake`]) and returned for the controller to queue.
fn wake_naming<K: Resource>(
    store: kube::runtime::reflector::Store<StorageMigrationRequest>,
    ctx: Arc<Context>,
    named: Named,
) -> impl Fn(K) -> Vec<Key> + Send + Sync + 'static {
    move |obj: K| {
        let keys = requests_naming(&store.state(), &obj, named);
        ctx.wake_by(&keys, named.kind(), &obj);
        keys
    }
}

/// The watch events of the objects of `api` (metadata only) that `config` selects, retried
/// after a failure ([`retried`]).
fn metadata_events<K>(
    api: Api<PartialObjectMeta<K>>,
    config: watcher::Config,
) -> impl futures::Stream<Item = Result<watcher::Event<PartialObjectMeta<K>>, watcher::Error>>
+ Send
+ 'static
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
{
    retried(watcher(api, config.page_size(METADATA_PAGE)))
}

/// The objects of kind `K` in `namespace`, or in every namespace (`None`).
fn scoped_api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The watches of `namespace` (`None`: every namespace) that only tell the [`ReadCache`] what
/// changed: the metadata of the StatefulSets, the PodDisruptionBudgets and our ConfigMaps (the
/// stashes, by our label). They wake no request: a request waits on no change of them.
fn kept_read_changes(
    client: &Client,
    namespace: Option<&str>,
    reads: &Arc<ReadCache>,
) -> impl Future<Output = ()> + Send + 'static {
    let ours = watch_config().labels(&labels::managed_by_selector());
    let all = watch_config;
    let sets = scoped_api::<PartialObjectMeta<StatefulSet>>(client, namespace);
    let budgets = scoped_api::<PartialObjectMeta<PodDisruptionBudget>>(client, namespace);
    let maps = scoped_api::<PartialObjectMeta<ConfigMap>>(client, namespace);
    run_feeds(vec![
        kept_read_feed(sets, all(), reads.clone(), Watched::StatefulSets),
        kept_read_feed(budgets, all(), reads.clone(), Watched::Budgets),
        kept_read_feed(maps, ours, reads.clone(), Watched::ConfigMaps),
    ])
}

/// The metadata watch of `api` (what `config` selects): each change of `kind` told to `reads`.
fn kept_read_feed<K>(
    api: Api<PartialObjectMeta<K>>,
    config: watcher::Config,
    reads: Arc<ReadCache>,
    kind: Watched,
) -> futures::stream::BoxStream<'static, Result<(), watcher::Error>>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
{
    (metadata_events(api, config).inspect(move |event| reads.saw(kind, event)))
        .map_ok(|_| ())
        .boxed()
}

/// Runs `feeds` ([`kept_read_feed`]) for as long as they run: a failure is logged and retried
/// ([`retried`]), and what is kept of its kind is not used until its watch is back.
async fn run_feeds(feeds: Vec<futures::stream::BoxStream<'static, Result<(), watcher::Error>>>) {
    (futures::stream::select_all(feeds))
        .for_each(|event| async move {
            if let Err(e) = event {
                error!(error = %e, "a watch the read cache follows");
            }
        })
        .await
}

/// The changes of the pods or claims of `api` (metadata only) that may matter to a request of
/// `store` ([`event_matters`]).
fn changes_that_matter<K>(
    api: Api<PartialObjectMeta<K>>,
    store: kube::runtime::reflector::Store<StorageMigrationRequest>,
    named: Named,
    reads: Arc<ReadCache>,
) -> impl futures::Stream<Item = Result<PartialObjectMeta<K>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
{
    // Volumes have their own cache (`VolumeCache`), fed by their own watch.
    let kind = match named {
        Named::Pod => Some(Watched::Pods),
        Named::Claim => Some(Watched::Claims),
        Named::Volume => None,
    };
    metadata_events(api, watch_config())
        .inspect(move |event| {
            if let Some(kind) = kind {
                reads.saw(kind, event)
            }
        })
        .try_filter(move |event| {
            futures::future::ready(event_matters(&store.state(), event, named))
        })
        .touched_objects()
}

/// Whether a pod's or a claim's watch event may matter to a request: not an update of a
/// terminating object that no request controls (not a helper pod) and that every request whose
/// plan names it waits to be gone, having deleted it: a member pod at `StoppingPod`
/// ([`plan::observe::waits_for_pod_gone`]), a member's claims at `DeletingOldClaim` and
/// `DeletingTempClaim` ([`plan::observe::waits_for_claim_gone`]). Those updates come a few at
/// once as its containers stop or its finalizers are released, and each started a round that
/// decided nothing. Its deletion always matters, as does every event of any other object; a
/// request that misses a change still looks again at its requeue.
pub fn event_matters<K: Resource>(
    requests: &[Arc<StorageMigrationRequest>],
    event: &watcher::Event<K>,
    named: Named,
) -> bool {
    let watcher::Event::Apply(obj) = event else {
        return true;
    };
    if obj.meta().deletion_timestamp.is_none() || !owner_requests(obj).is_empty() {
        return true;
    }
    let name = obj.name_any();
    let waits_gone = |s: &crate::api::StorageMigrationRequestStatus| match named {
        Named::Pod => plan::observe::waits_for_pod_gone(s, &name),
        Named::Claim => plan::observe::waits_for_claim_gone(s, &name),
        Named::Volume => false,
    };
    let mut naming = naming(requests, obj, named).peekable();
    naming.peek().is_none() || !naming.all(|r| r.status.as_ref().is_some_and(waits_gone))
}

/// Objects per page of the metadata watches' lists (kube-runtime's default is 500). Those lists
/// take every pod, claim and volume in scope, unrelated ones too: with 5,000 unrelated pods and
/// 5,000 claims, pages of 500 raised the operator's peak RSS from 47.9 to 54.2 MiB, pages of 100
/// to 48.8 MiB, for 80 more list calls at start (`docs/benchmarks.md`).
pub const METADATA_PAGE: u32 = 100;

/// What a watched object may be to a request's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    /// A member pod.
    Pod,
    /// A member's claim or its temporary claim.
    Claim,
    /// A member's old or new volume (cluster-scoped: in any request's namespace).
    Volume,
}

impl Named {
    /// The kind of object it names.
    pub fn kind(self) -> &'static str {
        match self {
            Named::Pod => "Pod",
            Named::Claim => "PersistentVolumeClaim",
            Named::Volume => "PersistentVolume",
        }
    }
}

/// The requests not yet ended, in `obj`'s namespace (any, for a volume), whose plan names `obj`
/// ([`Named`]) and which wait on such changes now ([`plan::observe::wakes_on_members`]): a change
/// of it may be what they wait for.
pub fn requests_naming<K: Resource>(
    requests: &[Arc<StorageMigrationRequest>],
    obj: &K,
    named: Named,
) -> Vec<Key> {
    naming(requests, obj, named)
        .map(|r| ObjectRef::from_obj(r.as_ref()))
        .collect()
}

/// The requests of [`requests_naming`].
fn naming<'r, K: Resource>(
    requests: &'r [Arc<StorageMigrationRequest>],
    obj: &K,
    named: Named,
) -> impl Iterator<Item = &'r Arc<StorageMigrationRequest>> {
    let ns = obj.meta().namespace.clone();
    let name = obj.meta().name.clone();
    let names_it = move |r: &StorageMigrationRequest| {
        let Some(name) = name.as_deref() else {
            return false;
        };
        let status = r.status.as_ref();
        let ended = status.is_some_and(|s| s.phase.is_final());
        let waits = status.is_none_or(plan::observe::wakes_on_members);
        let claims = status.map(crate::plan::claims::request_claims);
        !ended
            && waits
            && claims.into_iter().flatten().any(|c| match named {
                Named::Pod => c.pod() == name,
                Named::Claim => c.claim() == name || c.temp_claim() == name,
                Named::Volume => c.volumes().iter().any(|(_, v)| *v == name),
            })
    };
    let in_scope =
        move |r: &StorageMigrationRequest| named == Named::Volume || r.metadata.namespace == ns;
    requests.iter().filter(move |r| in_scope(r) && names_it(r))
}

/// The request that controls a pod (a mounter pod carries our label and the request as its
/// controller), if any.
fn owner_requests<K: Resource>(pod: &K) -> Vec<Key> {
    let ns = pod.namespace();
    pod.owner_references()
        .iter()
        .filter(|o| o.controller == Some(true))
        .filter_map(|o| Key::from_owner_ref(ns.as_deref(), o, ()))
        .collect()
}

#[cfg(test)]
#[path = "controller_watch_tests.rs"]
mod watch_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Phase, Plan, PlannedMember, StorageMigrationRequestStatus};

    /// A context whose client reaches no API server.
    fn offline_context() -> Context {
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("uri"));
        let client = kube::Client::try_from(config).expect("client");
        let settings = crate::plan::fixtures::SETTINGS.clone();
        Context::new(client, settings, Arc::new(Metrics::new()))
    }

    fn key(name: &str) -> Key {
        Key::new(name).within("demo")
    }

    /// A request in `ns` named `name` whose plan has one member `pod` on `claim` (temporary
    /// claim `tmp-<claim>`), in `phase`.
    fn planned(
        ns: &str,
        name: &str,
        pod: &str,
        claim: &str,
        phase: Phase,
    ) -> Arc<StorageMigrationRequest> {
        let mut r =
            crate::plan::fixtures::request(crate::plan::fixtures::spec_class_change("fast"));
        r.metadata.name = Some(name.into());
        r.metadata.namespace = Some(ns.into());
        let member = PlannedMember {
            pod: pod.into(),
            claim: claim.into(),
            temp_claim: format!("tmp-{claim}"),
            old_volume: format!("pv-{claim}"),
            ..Default::default()
        };
        r.status = Some(StorageMigrationRequestStatus {
            phase,
            plan: Some(Plan {
                members: vec![member],
                ..Default::default()
            }),
            ..Default::default()
        });
        Arc::new(r)
    }

    fn object<K: Resource<DynamicType = ()> + Default>(ns: &str, name: &str) -> K {
        let mut o = K::default();
        o.meta_mut().namespace = Some(ns.into());
        o.meta_mut().name = Some(name.into());
        o
    }

    #[test]
    fn a_pod_or_claim_wakes_the_unfinished_requests_whose_plan_names_it() {
        let requests = [
            planned("demo", "a", "etcd-0", "data-etcd-0", Phase::Progressing),
            planned("demo", "done", "etcd-0", "data-etcd-0", Phase::Successful),
            planned("other", "b", "etcd-0", "data-etcd-0", Phase::Progressing),
            planned("demo", "c", "etcd-1", "data-etcd-1", Phase::Pending),
        ];
        let pod: Pod = object("demo", "etcd-0");
        assert_eq!(requests_naming(&requests, &pod, Named::Pod), [key("a")]);
        let temp: PersistentVolumeClaim = object("demo", "tmp-data-etcd-1");
        assert_eq!(requests_naming(&requests, &temp, Named::Claim), [key("c")]);
        let claim: PersistentVolumeClaim = object("demo", "data-etcd-0");
        assert_eq!(requests_naming(&requests, &claim, Named::Claim), [key("a")]);
        // A claim named like a member pod is not that pod; an unrelated object wakes nothing.
        let by_pod_name: PersistentVolumeClaim = object("demo", "etcd-0");
        assert!(requests_naming(&requests, &by_pod_name, Named::Claim).is_empty());
        let unrelated: Pod = object("demo", "web-0");
        assert!(requests_naming(&requests, &unrelated, Named::Pod).is_empty());
        // A volume has no namespace: it wakes the unfinished requests of any namespace that
        // name it; as metadata only, as the watches deliver it.
        let mut volume = PartialObjectMeta::<PersistentVolume>::default();
        volume.metadata.name = Some("pv-data-etcd-0".into());
        let other = Key::new("b").within("other");
        assert_eq!(
            requests_naming(&requests, &volume, Named::Volume),
            [key("a"), other]
        );
        volume.metadata.name = Some("data-etcd-0".into());
        assert!(requests_naming(&requests, &volume, Named::Volume).is_empty());
    }

    #[test]
    fn a_request_whose_member_copies_is_not_woken_by_its_pods_claims_or_volumes() {
        use crate::api::{MemberStatus, MemberStep, Stage};
        let at = |step: MemberStep| {
            let mut r =
                (*planned("demo", "a", "etcd-0", "data-etcd-0", Phase::Progressing)).clone();
            if let Some(s) = r.status.as_mut() {
                s.stage = Stage::Migrating;
                s.members = vec![MemberStatus {
                    step,
                    ..Default::default()
                }];
            }
            [Arc::new(r)]
        };
        let pod: Pod = object("demo", "etcd-0");
        let claim: PersistentVolumeClaim = object("demo", "data-etcd-0");
        let mut volume = PartialObjectMeta::<PersistentVolume>::default();
        volume.metadata.name = Some("pv-data-etcd-0".into());
        for step in [MemberStep::PreCopying, MemberStep::Copying] {
            let requests = at(step);
            assert!(
                requests_naming(&requests, &pod, Named::Pod).is_empty(),
                "{step:?}"
            );
            assert!(requests_naming(&requests, &claim, Named::Claim).is_empty());
            assert!(requests_naming(&requests, &volume, Named::Volume).is_empty());
        }
        for step in [
            MemberStep::CreatingClaim,
            MemberStep::StoppingPod,
            MemberStep::DeletingOldClaim,
            MemberStep::RecreatingPod,
        ] {
            let requests = at(step);
            assert_eq!(
                requests_naming(&requests, &pod, Named::Pod),
                [key("a")],
                "{step:?}"
            );
            assert_eq!(requests_naming(&requests, &claim, Named::Claim), [key("a")]);
            assert_eq!(
                requests_naming(&requests, &volume, Named::Volume),
                [key("a")]
            );
        }
    }

    #[test]
    fn a_helper_pod_wakes_the_request_that_controls_it() {
        let req = planned("demo", "a", "etcd-0", "data-etcd-0", Phase::Progressing);
        let mut mounter: Pod = object("demo", "mounter");
        let mut owner = req.controller_owner_ref(&()).expect("named request");
        mounter.metadata.owner_references = Some(vec![owner.clone()]);
        assert_eq!(owner_requests(&mounter), [key("a")]);
        owner.controller = Some(false);
        mounter.metadata.owner_references = Some(vec![owner]);
        assert!(owner_requests(&mounter).is_empty());
    }

    /// Request `name`, migrating, its member etcd-0 (claim data-etcd-0) in flight at `step`.
    fn member_at(name: &str, step: crate::api::MemberStep) -> Arc<StorageMigrationRequest> {
        use crate::api::{MemberStatus, Stage};
        let mut r = (*planned("demo", name, "etcd-0", "data-etcd-0", Phase::Progressing)).clone();
        if let Some(s) = r.status.as_mut() {
            s.stage = Stage::Migrating;
            s.members = vec![MemberStatus {
                pod: "etcd-0".into(),
                step,
                ..Default::default()
            }];
        }
        Arc::new(r)
    }

    /// The updates of a member's terminating claims that its request, having deleted them, waits
    /// at `DeletingOldClaim` or `DeletingTempClaim` to be gone are dropped before they wake
    /// anything; their deletion, the claims at another step, a claim not terminating, another
    /// member's claim and a claim another request also waits on are not.
    #[test]
    fn a_deleted_claims_termination_wakes_its_request_only_when_the_claim_is_gone() {
        use crate::api::MemberStep;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let deleting = [member_at("a", MemberStep::DeletingOldClaim)];
        let status = deleting[0].status.as_ref().expect("status");
        let claims = crate::plan::claims::request_claims(status);
        let temp = claims.first().expect("a claim").temp_claim().to_string();
        let claim = |name: &str, terminating: bool| {
            let mut c = PartialObjectMeta::<PersistentVolumeClaim>::default();
            c.metadata.namespace = Some("demo".into());
            c.metadata.name = Some(name.into());
            c.metadata.deletion_timestamp =
                terminating.then(|| Time(k8s_openapi::jiff::Timestamp::now()));
            c
        };
        for name in ["data-etcd-0", temp.as_str()] {
            let updated = watcher::Event::Apply(claim(name, true));
            assert!(!event_matters(&deleting, &updated, Named::Claim), "{name}");
            let gone = watcher::Event::Delete(claim(name, true));
            assert!(event_matters(&deleting, &gone, Named::Claim), "{name}");
            let bound = watcher::Event::Apply(claim(name, false));
            assert!(event_matters(&deleting, &bound, Named::Claim), "{name}");
            let later = [member_at("a", MemberStep::DeletingTempClaim)];
            assert_eq!(
                event_matters(&later, &updated, Named::Claim),
                name == "data-etcd-0",
                "at DeletingTempClaim only the temporary claim is waited on: {name}"
            );
            for step in [MemberStep::RetainingVolumes, MemberStep::RecreatingClaim] {
                let other = [member_at("a", step)];
                assert!(event_matters(&other, &updated, Named::Claim), "{step:?}");
            }
            let both = [deleting[0].clone(), member_at("b", MemberStep::GatingStop)];
            assert!(event_matters(&both, &updated, Named::Claim), "{name}");
        }
        let elsewhere = watcher::Event::Apply(claim("data-etcd-1", true));
        assert!(event_matters(&deleting, &elsewhere, Named::Claim));
    }

    /// The updates of a terminating member pod that its request waits, at `StoppingPod`, to be
    /// gone are dropped before they wake anything; its deletion, the pod at another step, a
    /// helper pod, a pod not terminating and one another request also waits on are not.
    #[test]
    fn a_stopping_members_termination_wakes_its_request_only_when_the_pod_is_gone() {
        use crate::api::MemberStep;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
        let at = member_at;
        let mut pod = PartialObjectMeta::<Pod>::default();
        pod.metadata.namespace = Some("demo".into());
        pod.metadata.name = Some("etcd-0".into());
        let serving = watcher::Event::Apply(pod.clone());
        pod.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        let (updated, gone) = (
            watcher::Event::Apply(pod.clone()),
            watcher::Event::Delete(pod.clone()),
        );
        let stopping = [at("a", MemberStep::StoppingPod)];
        assert!(!event_matters(&stopping, &updated, Named::Pod));
        assert!(event_matters(&stopping, &gone, Named::Pod));
        assert!(event_matters(&stopping, &serving, Named::Pod));
        let listed = watcher::Event::InitApply(pod.clone());
        assert!(event_matters(&stopping, &listed, Named::Pod));
        let recreating = [at("a", MemberStep::RecreatingPod)];
        assert!(event_matters(&recreating, &updated, Named::Pod));
        assert!(
            event_matters(&[], &updated, Named::Pod),
            "no request names it"
        );
        let both = [stopping[0].clone(), at("b", MemberStep::GatingStop)];
        assert!(event_matters(&both, &updated, Named::Pod));
        let mut helper = pod.clone();
        helper.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "storagemigrator.io/v1alpha1".into(),
            kind: "StorageMigrationRequest".into(),
            name: "a".into(),
            uid: "uid-a".into(),
            controller: Some(true),
            ..Default::default()
        }]);
        let helper = watcher::Event::Apply(helper);
        assert!(event_matters(&stopping, &helper, Named::Pod));
    }

    #[tokio::test]
    async fn a_wake_ends_a_pause_and_one_before_it_is_kept() {
        let ctx = offline_context();
        // No waker yet: nothing to wake, nothing made.
        ctx.wake(&[key("a")]);
        assert!(ctx.wakers().is_empty());
        let waker = ctx.waker(&key("a"));
        ctx.wake(&[key("a")]);
        tokio::time::timeout(Duration::from_secs(5), waker.notified())
            .await
            .expect("a wake before the pause ends it at once");
        let pause = tokio::time::timeout(Duration::from_millis(50), waker.notified()).await;
        assert!(pause.is_err(), "one wake ends one pause");
        ctx.drop_waker(&key("a"));
        assert!(ctx.wakers().is_empty());
    }

    /// A request gone (deleted between being queued and reconciled, or found gone by the
    /// reconcile) leaves nothing behind: no failures, no waker, no entry in the phase gauge.
    #[tokio::test]
    async fn a_request_gone_leaves_no_phase_gauge_entry() {
        let ctx = offline_context();
        let progressing = |m: &Metrics| {
            m.encode()
                .expect("metrics")
                .lines()
                .any(|l| l.contains("phase=\"Progressing\"") && l.ends_with(" 1"))
        };
        ctx.metrics
            .request_phase(&phase_key(&key("a")), Some(crate::api::Phase::Progressing));
        ctx.waker(&key("a"));
        assert!(progressing(&ctx.metrics));
        ctx.gone(&request_key(&key("a").erase()));
        assert!(
            !progressing(&ctx.metrics),
            "the deleted request is not counted"
        );
        assert!(ctx.wakers().is_empty());
    }

    /// Every reconcile publishes through the operator's one recorder: the same Event published
    /// by two reconciles is created once, then patched as a series (one recorder per reconcile
    /// would create it again each time).
    #[tokio::test]
    async fn every_reconcile_shares_the_operators_one_recorder() {
        use http::{Request, Response};
        use kube::client::Body;
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let ctx = Context::new(
            kube::Client::new(service, "default"),
            crate::plan::fixtures::SETTINGS.clone(),
            Arc::new(Metrics::default()),
        );
        let server = tokio::spawn(async move {
            let mut methods = Vec::new();
            while let Some((req, send)) = handle.next_request().await {
                methods.push(req.method().clone());
                let event = serde_json::json!({
                    "apiVersion": "events.k8s.io/v1",
                    "kind": "Event",
                    "metadata": {"name": "move.1", "namespace": "demo"},
                    "eventTime": "2026-01-01T00:00:00.000000Z",
                });
                let body = Body::from(serde_json::to_vec(&event).expect("json"));
                send.send_response(Response::builder().body(body).expect("response"));
            }
            methods
        });
        let req = planned("demo", "move", "etcd-0", "data-etcd-0", Phase::Progressing);
        let ev = kube::runtime::events::Event {
            type_: kube::runtime::events::EventType::Normal,
            reason: "Stopping".into(),
            note: Some("stopping etcd-0".into()),
            action: "Migrate".into(),
            secondary: None,
        };
        for _ in 0..2 {
            let cluster = ctx.cluster();
            cluster
                .recorder
                .publish(&ev, &req.object_ref(&()))
                .await
                .expect("published");
        }
        drop(ctx);
        let methods = server.await.expect("server");
        assert_eq!(methods, [http::Method::POST, http::Method::PATCH]);
    }

    /// A request whose reads keep failing past its timeout says so (condition `ReadFailing`,
    /// naming the error) once, and the condition is cleared when the reads succeed again; before
    /// the timeout, or once the request ended, nothing is written.
    #[test]
    fn reads_failing_past_the_timeout_are_recorded_then_cleared() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let t = crate::plan::fixtures::t;
        let mut req = planned("demo", "a", "etcd-0", "data-etcd-0", Phase::Progressing);
        let r = Arc::make_mut(&mut req);
        r.spec.timeout = "10m".into();
        if let Some(s) = r.status.as_mut() {
            s.start_time = Some(Time(t(1000)));
        }
        let error = "get StatefulSet etcd: 403 forbidden";
        assert!(
            read_failing(r, error, t(1000 + 599)).is_none(),
            "within the timeout"
        );
        let failing = read_failing(r, error, t(1000 + 601)).expect("past the timeout");
        let c =
            crate::api::conditions::get(&failing.conditions, crate::api::conditions::READ_FAILING)
                .expect("condition");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Failing"));
        assert!(
            c.message.contains(error) && c.message.contains("10m"),
            "{}",
            c.message
        );
        assert_eq!(failing.phase, Phase::Progressing, "nothing else changes");
        r.status = Some(failing);
        assert!(read_failing(r, error, t(1000 + 700)).is_none(), "said once");
        let recovered = read_recovered(r, t(1000 + 800)).expect("cleared");
        let c = crate::api::conditions::get(
            &recovered.conditions,
            crate::api::conditions::READ_FAILING,
        )
        .expect("condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "Recovered")
        );
        r.status = Some(recovered);
        assert!(
            read_recovered(r, t(1000 + 900)).is_none(),
            "nothing to clear"
        );
        if let Some(s) = r.status.as_mut() {
            s.phase = Phase::Failed;
        }
        assert!(
            read_failing(r, error, t(1000 + 999)).is_none(),
            "an ended request"
        );
    }

    /// The volumes read now before a decision is carried out: those of the claims it deletes,
    /// those it gives a policy other than `Retain`, those it points at a claim; no other.
    #[test]
    fn the_volumes_of_claim_deletes_policies_but_retain_and_claim_refs_are_read_now() {
        use crate::plan::{Decision, Kind, Propagation};
        let mut observed =
            crate::plan::fixtures::observed(crate::plan::fixtures::spec_shrink("1Gi"));
        let claim = crate::plan::fixtures::bound_claim("data-etcd-0", "standard", "1Gi", "pv-old");
        observed.claims.insert("data-etcd-0".into(), claim);
        let decision = |action: Action| Decision {
            actions: vec![
                Action::LabelVolume {
                    volume: "pv-label".into(),
                },
                action,
            ],
            requeue: Duration::ZERO,
        };
        let delete = |kind: Kind| Action::Delete {
            kind,
            name: "data-etcd-0".into(),
            propagation: Propagation::Background,
            uid: None,
            resource_version: None,
        };
        let policy = |policy: &str| Action::PatchReclaimPolicy {
            volume: "pv".into(),
            policy: policy.into(),
        };
        let claim_ref = Action::SetClaimRef {
            volume: "pv".into(),
            claim: "data-etcd-0".into(),
        };
        let now = |action: Action| volumes_read_now(&decision(action), &observed);
        assert_eq!(
            now(delete(Kind::Claim)),
            BTreeSet::from(["pv-old".to_string()])
        );
        for fresh in [policy("Delete"), claim_ref] {
            assert_eq!(
                now(fresh.clone()),
                BTreeSet::from(["pv".to_string()]),
                "{fresh:?}"
            );
        }
        for kept in [delete(Kind::Pod), delete(Kind::Job), policy("Retain")] {
            assert!(now(kept.clone()).is_empty(), "{kept:?}");
        }
        let mut unbound = delete(Kind::Claim);
        if let Action::Delete { name, .. } = &mut unbound {
            *name = "not-there".into();
        }
        assert!(
            now(unbound).is_empty(),
            "no volume known: the claim is read now instead"
        );
    }

    /// A decision is carried out on what it was made on only when that holds what it acts on
    /// read now: not the round before's answers, the kinds it acts on, the volumes whose state
    /// it acts on (when volumes are kept).
    #[test]
    fn a_decision_is_made_again_until_what_it_acts_on_was_read_now() {
        use crate::plan::{Decision, Kind, Propagation};
        let mut observed =
            crate::plan::fixtures::observed(crate::plan::fixtures::spec_shrink("1Gi"));
        let claim = crate::plan::fixtures::bound_claim("data-etcd-0", "standard", "1Gi", "pv-old");
        observed.claims.insert("data-etcd-0".into(), claim);
        let decision = |actions: Vec<Action>| Decision {
            actions,
            requeue: Duration::ZERO,
        };
        let delete = |kind: Kind, name: &str| Action::Delete {
            kind,
            name: name.into(),
            propagation: Propagation::Background,
            uid: Some("uid".into()),
            resource_version: None,
        };
        let made_on = |replayed: bool, kinds: &[Watched], volumes: Option<&[&str]>| MadeOn {
            replayed,
            kinds: kinds.iter().copied().collect(),
            volumes: volumes.map(|v| v.iter().map(|v| v.to_string()).collect()),
        };
        let set = |kinds: &[Watched]| kinds.iter().copied().collect::<BTreeSet<_>>();
        let names = |v: &[&str]| v.iter().map(|v| v.to_string()).collect::<BTreeSet<_>>();
        let status = decision(vec![Action::SetStatus(Box::default())]);
        assert_eq!(
            made_on(true, &[], Some(&[])).lacks(&status, &observed),
            None
        );
        let stop = decision(vec![delete(Kind::Pod, "etcd-0")]);
        let pods = Some((set(&[Watched::Pods, Watched::Budgets]), names(&[])));
        assert_eq!(made_on(true, &[], Some(&[])).lacks(&stop, &observed), pods);
        assert_eq!(made_on(false, &[], Some(&[])).lacks(&stop, &observed), pods);
        let pods_now = made_on(false, &[Watched::Pods, Watched::Budgets], Some(&[]));
        assert_eq!(pods_now.lacks(&stop, &observed), None);
        assert_eq!(
            made_on(true, &[Watched::Pods, Watched::Budgets], Some(&[])).lacks(&stop, &observed),
            pods,
            "the round before's answers are never enough"
        );
        let swap = decision(vec![delete(Kind::Claim, "data-etcd-0")]);
        let claims = set(&[Watched::Claims]);
        let needs = Some((claims.clone(), names(&["pv-old"])));
        let claims_now = made_on(false, &[Watched::Claims], Some(&[]));
        assert_eq!(claims_now.lacks(&swap, &observed), needs);
        let all_now = made_on(false, &[Watched::Claims], Some(&["pv-old"]));
        assert_eq!(all_now.lacks(&swap, &observed), None);
        let uncached = made_on(false, &[Watched::Claims], None);
        assert_eq!(
            uncached.lacks(&swap, &observed),
            None,
            "every volume is read now"
        );
        let finalizer = decision(vec![Action::AddFinalizer]);
        assert_eq!(
            made_on(false, &[], Some(&[])).lacks(&finalizer, &observed),
            None
        );
        let nothing = Some((set(&[]), names(&[])));
        assert_eq!(
            made_on(true, &[], Some(&[])).lacks(&finalizer, &observed),
            nothing
        );
    }

    /// A stash is made on the stash and on what it stashes read now.
    #[test]
    fn a_stash_reads_now_the_stash_and_what_it_stashes() {
        let stash = |key: &str| plan::Decision {
            actions: vec![Action::Stash {
                config_map: "move-stash".into(),
                key: key.into(),
                value: "v".into(),
            }],
            requeue: Duration::ZERO,
        };
        for (key, kind) in [
            (
                labels::STASH_STATEFULSET_KEY.to_string(),
                Watched::StatefulSets,
            ),
            (
                format!("{}data-etcd-0", labels::STASH_CLAIM_KEY_PREFIX),
                Watched::Claims,
            ),
            (
                format!("{}etcd-0", labels::STASH_POD_KEY_PREFIX),
                Watched::Pods,
            ),
        ] {
            let want = BTreeSet::from([Watched::ConfigMaps, kind]);
            assert_eq!(kinds_read_now(&stash(&key)), want, "{key}");
        }
    }

    /// Only a status, events, creates, `Retain` and deletes of our Jobs and helper pods by uid
    /// are decided on replayed or kept answers; a delete of anything else, a patch, a handover
    /// or a stash is decided again on fresh reads, and what needs the volumes as they are now on
    /// volumes read now (when they are cached). Only a decision that writes the status and
    /// nothing else (events aside) lets the next round replay its answers.
    #[test]
    fn replayed_answers_decide_only_statuses_events_and_creates() {
        use crate::plan::{Decision, EventType, Kind, Object, Propagation};
        let decision = |actions: Vec<Action>| Decision {
            actions,
            requeue: Duration::ZERO,
        };
        let status = || Action::SetStatus(Box::default());
        let event = || Action::Event {
            type_: EventType::Normal,
            reason: "MemberMigrated".into(),
            message: "etcd-0".into(),
        };
        let create = || {
            let claim = crate::plan::fixtures::bound_claim("tmp", "fast", "1Gi", "pv");
            Action::Create(Object::Claim(Box::new(claim)))
        };
        let delete = |kind: Kind| Action::Delete {
            kind,
            name: "x".into(),
            propagation: Propagation::Background,
            uid: None,
            resource_version: None,
        };
        let replayed = [
            vec![status()],
            vec![status(), event()],
            vec![create()],
            vec![status(), create()],
            vec![],
        ];
        let mut observed =
            crate::plan::fixtures::observed(crate::plan::fixtures::spec_shrink("1Gi"));
        for actions in replayed {
            let d = decision(actions);
            assert_eq!(reads_needed(&d, &observed, true), Reads::Replayed, "{d:?}");
        }
        let fresh = [
            vec![status(), delete(Kind::Pod)],
            vec![status(), delete(Kind::Job)],
            vec![Action::TransferLeadership {
                from: "etcd-0".into(),
                to: "etcd-1".into(),
            }],
            vec![Action::Stash {
                config_map: "move-stash".into(),
                key: "pod-etcd-0".into(),
                value: "v".into(),
            }],
            vec![Action::AddFinalizer],
            vec![Action::LabelVolume {
                volume: "pv".into(),
            }],
        ];
        for actions in fresh {
            let d = decision(actions);
            assert_eq!(reads_needed(&d, &observed, true), Reads::Fresh, "{d:?}");
        }
        let claim = crate::plan::fixtures::bound_claim("x", "standard", "1Gi", "pv-x");
        observed.claims.insert("x".into(), claim);
        let claim_delete = decision(vec![status(), delete(Kind::Claim)]);
        assert_eq!(
            reads_needed(&claim_delete, &observed, true),
            Reads::FreshVolumes
        );
        let no_cache = reads_needed(&claim_delete, &observed, false);
        assert_eq!(no_cache, Reads::Fresh, "no cache");
        assert!(only_writes_status(&decision(vec![status()])));
        assert!(only_writes_status(&decision(vec![event(), status()])));
        let job = || Action::Create(Object::Job(Box::default()));
        assert!(only_starts_jobs(&decision(vec![job()])));
        assert!(only_starts_jobs(&decision(vec![status(), event(), job()])));
        for not_only in [
            vec![status()],
            vec![create(), job()],
            vec![job(), delete(Kind::Job)],
        ] {
            let d = decision(not_only.clone());
            assert!(!only_starts_jobs(&d), "{not_only:?}");
        }
        for not_only in [
            vec![],
            vec![event()],
            vec![status(), create()],
            vec![status(), Action::AddFinalizer],
        ] {
            assert!(
                !only_writes_status(&decision(not_only.clone())),
                "{not_only:?}"
            );
        }
        // Work others carry out, which a watched change reports: a round after it pauses for
        // it; one after only our own writes (the stash, a finalizer) looks at once.
        for others in [
            vec![status(), delete(Kind::Pod)],
            vec![status(), event(), create()],
            vec![status(), job()],
            vec![Action::SetClaimRef {
                volume: "pv".into(),
                claim: "data-etcd-0".into(),
            }],
        ] {
            assert!(
                leaves_work_to_others(&decision(others.clone())),
                "{others:?}"
            );
        }
        let stash = Action::Stash {
            config_map: "move-stash".into(),
            key: "pod-etcd-0".into(),
            value: "v".into(),
        };
        for own in [
            vec![status(), stash],
            vec![status(), Action::AddFinalizer, event()],
            vec![status()],
        ] {
            assert!(!leaves_work_to_others(&decision(own.clone())), "{own:?}");
        }
    }

    /// What follows a round that acted: started Jobs settle, a status alone replays, work
    /// others carry out pauses (at most [`SIDE_EFFECT_PAUSE`]), our own writes look at once.
    #[test]
    fn a_round_that_acted_settles_replays_pauses_or_looks_at_once() {
        use crate::plan::{Decision, Kind, Object, Propagation};
        let after = |actions: Vec<Action>, ms: u64| {
            after_acting(&Decision {
                actions,
                requeue: Duration::from_millis(ms),
            })
        };
        let status = || Action::SetStatus(Box::default());
        let job = || Action::Create(Object::Job(Box::default()));
        let pod_delete = || Action::Delete {
            kind: Kind::Pod,
            name: "etcd-0".into(),
            propagation: Propagation::Background,
            uid: None,
            resource_version: None,
        };
        assert_eq!(after(vec![status(), job()], 2_000), AfterActing::Settle);
        assert_eq!(after(vec![status()], 2_000), AfterActing::Replay);
        assert_eq!(
            after(vec![status(), pod_delete()], 200),
            AfterActing::Pause(Duration::from_millis(200))
        );
        assert_eq!(
            after(vec![status(), pod_delete()], 60_000),
            AfterActing::Pause(SIDE_EFFECT_PAUSE)
        );
        assert_eq!(
            after(vec![status(), pod_delete()], 0),
            AfterActing::LookAtOnce
        );
        assert_eq!(
            after(vec![status(), Action::AddFinalizer], 2_000),
            AfterActing::LookAtOnce
        );
        let ended = requeue_after_rounds(true, Duration::from_secs(5));
        assert_eq!(ended, Requeue::await_change());
        let asked_none = requeue_after_rounds(false, Duration::ZERO);
        assert_eq!(asked_none, Requeue::requeue(Duration::from_millis(100)));
    }

    /// Our own Jobs and helper pods deleted by uid, and `Retain` given, are decided on kept
    /// reads too; a member pod, a Job without its uid, a StatefulSet are not.
    #[test]
    fn our_jobs_and_helpers_by_uid_and_retain_are_decided_on_kept_reads() {
        use crate::plan::{Decision, Kind, Propagation};
        let decision = |actions: Vec<Action>| Decision {
            actions,
            requeue: Duration::ZERO,
        };
        let delete = |kind: Kind, name: &str, uid: Option<&str>| Action::Delete {
            kind,
            name: name.into(),
            propagation: Propagation::Background,
            uid: uid.map(String::from),
            resource_version: None,
        };
        let mut observed =
            crate::plan::fixtures::observed(crate::plan::fixtures::spec_shrink("1Gi"));
        let job = crate::plan::ObservedJob {
            job: Job::default(),
            outcome: crate::plan::JobOutcome::Running,
            progress: None,
            refused: None,
        };
        observed.jobs.insert("x".into(), job);
        observed.helper_pods.insert("x".into(), Pod::default());
        let retain = Action::PatchReclaimPolicy {
            volume: "pv".into(),
            policy: "Retain".into(),
        };
        for kept in [
            vec![
                Action::SetStatus(Box::default()),
                delete(Kind::Job, "x", Some("u")),
            ],
            vec![delete(Kind::Pod, "x", Some("u"))],
            vec![retain],
        ] {
            let d = decision(kept);
            assert_eq!(reads_needed(&d, &observed, true), Reads::Replayed, "{d:?}");
        }
        for fresh in [
            delete(Kind::Job, "x", None),
            delete(Kind::Pod, "etcd-0", Some("u")),
            delete(Kind::StatefulSet, "x", Some("u")),
        ] {
            let d = decision(vec![fresh]);
            assert_eq!(reads_needed(&d, &observed, true), Reads::Fresh, "{d:?}");
        }
    }

    /// A status write (and the resourceVersion it brings) starts no reconcile; a spec edit, an
    /// abort annotation, a label, a finalizer and a deletion do.
    #[test]
    fn only_what_a_status_write_does_not_change_starts_a_reconcile() {
        let base = planned("demo", "move", "etcd-0", "data-etcd-0", Phase::Progressing);
        let base = base.as_ref().clone();
        let trigger = request_trigger(&base);
        assert!(trigger.is_some());
        let mut status_only = base.clone();
        status_only.metadata.resource_version = Some("99".into());
        if let Some(s) = status_only.status.as_mut() {
            s.phase = Phase::Successful;
            s.message = Some("done".into());
        }
        assert_eq!(request_trigger(&status_only), trigger, "a status write");
        let changes: [fn(&mut StorageMigrationRequest); 5] = [
            |r| r.metadata.generation = Some(2),
            |r| {
                r.annotations_mut()
                    .insert(labels::ABORT_ANNOTATION.into(), "now".into());
            },
            |r| {
                r.labels_mut().insert("team".into(), "db".into());
            },
            |r| r.metadata.finalizers = Some(vec!["storagemigrator.io/cleanup".into()]),
            |r| {
                r.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        crate::plan::fixtures::t(0),
                    ))
            },
        ];
        for (i, change) in changes.iter().enumerate() {
            let mut changed = base.clone();
            change(&mut changed);
            assert_ne!(request_trigger(&changed), trigger, "change {i}");
        }
    }

    /// A Job's active and ready counts and its interim conditions starting no reconcile; its
    /// ending conditions, a failed pod and its deletion do.
    #[test]
    fn a_jobs_conditions_failures_and_deletion_start_a_reconcile_its_pod_counts_do_not() {
        use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
        let job = |active: Option<i32>, ready: Option<i32>| Job {
            status: Some(JobStatus {
                active,
                ready,
                ..Default::default()
            }),
            ..Default::default()
        };
        let created = job(None, None);
        let trigger = job_trigger(&created);
        assert_eq!(job_trigger(&job(Some(1), None)), trigger, "a pod active");
        assert_eq!(job_trigger(&job(Some(1), Some(1))), trigger, "a pod ready");
        let condition = |type_: &str| JobCondition {
            type_: type_.into(),
            status: "True".into(),
            ..Default::default()
        };
        let mut complete = job(Some(1), Some(1));
        if let Some(s) = complete.status.as_mut() {
            s.conditions = Some(vec![condition("SuccessCriteriaMet")]);
        }
        let met = job_trigger(&complete);
        assert_eq!(met, trigger, "SuccessCriteriaMet: the pod still terminates");
        if let Some(s) = complete.status.as_mut() {
            s.conditions = Some(vec![condition("SuccessCriteriaMet"), condition("Complete")]);
        }
        assert_ne!(job_trigger(&complete), met, "Complete");
        let mut failing = job(Some(1), None);
        if let Some(s) = failing.status.as_mut() {
            s.conditions = Some(vec![condition("FailureTarget")]);
        }
        assert_eq!(
            job_trigger(&failing),
            trigger,
            "FailureTarget: not Failed yet"
        );
        if let Some(s) = failing.status.as_mut() {
            s.conditions = Some(vec![condition("FailureTarget"), condition("Failed")]);
        }
        assert_ne!(job_trigger(&failing), trigger, "Failed");
        let mut failed = job(Some(1), None);
        if let Some(s) = failed.status.as_mut() {
            s.failed = Some(1);
        }
        assert_ne!(job_trigger(&failed), trigger, "a pod failed");
        let mut deleted = created.clone();
        deleted.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(crate::plan::fixtures::t(0)),
        );
        assert_ne!(job_trigger(&deleted), trigger, "deleting");
    }

    #[test]
    fn a_job_seen_created_starts_no_reconcile_one_seen_ended_or_deleted_does() {
        use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
        use watcher::Event;
        let job = |uid: &str, complete: bool| {
            let mut job = object::<Job>("ns", uid);
            job.metadata.uid = Some(uid.into());
            job.status = Some(JobStatus {
                active: Some(1),
                failed: Some(0),
                conditions: complete.then(|| {
                    vec![JobCondition {
                        type_: "Complete".into(),
                        status: "True".into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            });
            job
        };
        let passes = |t: &mut JobTriggers, e: Event<Job>| t.changed(Ok(e)).is_some();
        let mut t = JobTriggers::default();
        assert!(!passes(&mut t, Event::Apply(job("a", false))), "created");
        assert!(!passes(&mut t, Event::Apply(job("a", false))), "unchanged");
        assert!(passes(&mut t, Event::Apply(job("a", true))), "complete");
        assert!(
            !passes(&mut t, Event::Apply(job("a", true))),
            "still complete"
        );
        assert!(passes(&mut t, Event::Delete(job("a", true))), "deleted");
        // A new list after a restart of the watch: a Job that ended meanwhile is a change.
        assert!(!passes(&mut t, Event::Init));
        assert!(
            !passes(&mut t, Event::InitApply(job("b", false))),
            "running"
        );
        assert!(passes(&mut t, Event::InitApply(job("c", true))), "ended");
        assert!(!passes(&mut t, Event::InitDone));
        assert!(
            t.changed(Err(watcher::Error::NoResourceVersion)).is_some(),
            "errors pass"
        );
    }

    /// A refused handover says so in the `HealthGate` condition (naming the error) once, and
    /// nothing is written for an ended request.
    #[test]
    fn a_refused_handover_is_recorded_in_the_health_gate() {
        let t = crate::plan::fixtures::t;
        let mut req = planned("demo", "a", "pg-0", "data-pg-0", Phase::Progressing);
        let r = Arc::make_mut(&mut req);
        let error = "leadership transfer from pg-0 to pg-1 failed: Patroni refused the \
                     switchover (HTTP 412 Precondition Failed): candidate name does not match";
        let refused = handover_refused(r, error, t(1000)).expect("recorded");
        let c =
            crate::api::conditions::get(&refused.conditions, crate::api::conditions::HEALTH_GATE)
                .expect("condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "HandoverRefused")
        );
        assert!(
            c.message
                .starts_with("the leader's handover did not complete: "),
            "{}",
            c.message
        );
        assert!(c.message.contains("HTTP 412"), "{}", c.message);
        assert_eq!(refused.phase, Phase::Progressing, "nothing else changes");
        r.status = Some(refused);
        assert!(handover_refused(r, error, t(1001)).is_none(), "said once");
        if let Some(s) = r.status.as_mut() {
            s.phase = Phase::Failed;
        }
        assert!(
            handover_refused(r, "other", t(1002)).is_none(),
            "an ended request"
        );
    }

    /// A status write refused as stale (409 on its resourceVersion) stops the decision before
    /// anything else of it is done (here: no finalizer read or write follows), and is told apart
    /// as `StaleStatus`, on which the reconcile reads again and decides again.
    #[tokio::test]
    async fn a_refused_status_write_stops_the_decision_for_a_fresh_read() {
        use crate::cluster::mock::{Exchange, verify};
        let mut o =
            crate::plan::fixtures::observed(crate::plan::fixtures::spec_class_change("fast"));
        o.request.metadata.resource_version = Some("41".into());
        let decision = plan::Decision {
            actions: vec![Action::SetStatus(Box::default()), Action::AddFinalizer],
            requeue: Duration::ZERO,
        };
        let path = format!(
            "/apis/storagemigrator.io/v1alpha1/namespaces/{}/storagemigrationrequests/{}/status",
            crate::plan::fixtures::NS,
            crate::plan::fixtures::REQ
        );
        let refused = Exchange::new(http::Method::PATCH, &path)
            .query(&format!(
                "&force=true&fieldManager={}",
                labels::FIELD_MANAGER
            ))
            .fails(409, "Conflict");
        let acted = verify(vec![refused], move |cluster| async move {
            let engine: Result<crate::cluster::Engine, String> = Err("none".into());
            act(
                &cluster,
                &Metrics::default(),
                &|_| {},
                &o,
                &engine,
                &decision,
            )
            .await
        })
        .await;
        assert!(
            matches!(acted, Err(ClusterError::StaleStatus { .. })),
            "{acted:?}"
        );
    }

    /// A round decides on the request as the last round read or wrote it, without reading it
    /// again, while the watch delivered no change of it; a change, a finalizer written (the
    /// copy does not carry it) or an ended request make the next round read it.
    #[tokio::test]
    async fn a_round_decides_on_the_request_kept_until_the_watch_sees_it_change() {
        use crate::cluster::mock::{Exchange, verify};
        use crate::plan::fixtures::{NS, REQ, observed, spec_class_change};
        let ctx = Arc::new(offline_context());
        let read = observed(spec_class_change("fast")).request;
        let obj = ObjectRef::from_obj(&read);
        let path = format!(
            "/apis/storagemigrator.io/v1alpha1/namespaces/{NS}/storagemigrationrequests/{REQ}"
        );
        let body = serde_json::to_value(&read).expect("json");
        let get = || vec![Exchange::new(http::Method::GET, &path).returns(body.clone())];
        let round = |exchanges: Vec<Exchange>| {
            let (ctx, obj) = (ctx.clone(), obj.clone());
            verify(exchanges, move |cluster| async move {
                let current = current_request(&ctx, &cluster, &obj).await;
                current.expect("no error").expect("the request is there")
            })
        };
        let decision = |actions| plan::Decision {
            actions,
            requeue: Duration::ZERO,
        };
        let status_only = decision(vec![Action::SetStatus(Box::default())]);
        let (first, seen) = round(get()).await;
        let mut written = first.clone();
        written.metadata.resource_version = Some("43".into());
        keep_request(
            &ctx,
            &obj,
            &status_only,
            &first,
            Some(Box::new(written)),
            seen,
        );
        let (kept, at) = round(vec![]).await;
        assert_eq!(kept.metadata.resource_version.as_deref(), Some("43"));
        assert_eq!(at, seen);
        // Kept again by a round that wrote nothing: still no read.
        keep_request(&ctx, &obj, &decision(vec![]), &kept, None, at);
        let (again, _) = round(vec![]).await;
        assert_eq!(again.metadata.resource_version.as_deref(), Some("43"));
        // A change the watch delivered voids it.
        keep_request(&ctx, &obj, &status_only, &again, None, at);
        ctx.request_changed(&obj);
        let (reread, seen) = round(get()).await;
        assert_ne!(seen, at, "counted from the change");
        // So does a new list of the requests (the watch failed, or fell too far behind).
        keep_request(&ctx, &obj, &status_only, &reread, None, seen);
        ctx.requests_relisted();
        let (reread, relisted) = round(get()).await;
        assert_ne!(relisted, seen, "counted from the new list");
        let seen = relisted;
        // A finalizer written: not kept.
        let finalizer = decision(vec![
            Action::SetStatus(Box::default()),
            Action::AddFinalizer,
        ]);
        keep_request(&ctx, &obj, &finalizer, &reread, None, seen);
        let (reread, seen) = round(get()).await;
        // An ended request: not kept.
        let mut ended = reread.clone();
        ended.status.get_or_insert_default().phase = crate::api::Phase::Successful;
        keep_request(
            &ctx,
            &obj,
            &status_only,
            &reread,
            Some(Box::new(ended)),
            seen,
        );
        round(get()).await;
        // Gone: forgotten.
        ctx.gone(&obj);
        assert!(ctx.kept().is_empty());
    }

    #[test]
    fn transient_failures_back_off_exponentially_to_a_cap() {
        let secs: Vec<u64> = (1..=9).map(|n| backoff_delay(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff_delay(0), Duration::from_secs(1));
        assert_eq!(backoff_delay(u32::MAX), BACKOFF_MAX);
        let mut f = Failures::new(8);
        let delays: Vec<u64> = (0..3)
            .map(|_| f.record(&key("a"), Retry::Transient, "503").delay.as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4]);
        // Another request counts on its own.
        assert_eq!(
            f.record(&key("b"), Retry::Transient, "503").delay.as_secs(),
            1
        );
    }

    #[test]
    fn a_permanent_failure_is_logged_once_and_not_retried_hot() {
        let mut f = Failures::new(8);
        let first = f.record(&key("a"), Retry::Permanent, "403 forbidden");
        assert_eq!(
            first,
            Verdict {
                retry: Retry::Permanent,
                delay: PERMANENT_REQUEUE,
                log: true
            }
        );
        let again = f.record(&key("a"), Retry::Permanent, "403 forbidden");
        assert!(!again.log);
        assert_eq!(again.delay, PERMANENT_REQUEUE);
        // Another permanent error is new: logged.
        assert!(f.record(&key("a"), Retry::Permanent, "422 invalid").log);
        // A transient failure in between: the permanent one is logged again when it returns.
        assert!(f.record(&key("a"), Retry::Transient, "503").log);
        assert!(f.record(&key("a"), Retry::Permanent, "422 invalid").log);
    }

    #[test]
    fn failures_are_forgotten_on_success_and_bounded() {
        let mut f = Failures::new(2);
        f.record(&key("a"), Retry::Transient, "503");
        f.record(&key("a"), Retry::Transient, "503");
        f.forget(&key("a"));
        assert!(f.is_empty());
        // Forgotten: the backoff starts over.
        assert_eq!(
            f.record(&key("a"), Retry::Transient, "503").delay.as_secs(),
            1
        );
        std::thread::sleep(Duration::from_millis(2));
        f.record(&key("b"), Retry::Transient, "503");
        std::thread::sleep(Duration::from_millis(2));
        f.record(&key("c"), Retry::Transient, "503");
        assert_eq!(f.len(), 2);
        // `a` failed longest ago: it went first.
        assert_eq!(
            f.record(&key("b"), Retry::Transient, "503").delay.as_secs(),
            2
        );
        assert_eq!(
            f.record(&key("c"), Retry::Transient, "503").delay.as_secs(),
            2
        );
        f.record(&key("a"), Retry::Transient, "503");
        assert_eq!(f.len(), 2);
    }

    #[test]
    fn a_request_reported_gone_is_forgotten_under_its_key() {
        let mut f = Failures::new(8);
        f.record(&key("a"), Retry::Transient, "503");
        let erased = key("a").erase();
        f.forget(&request_key(&erased));
        assert!(f.is_empty());
    }
}
