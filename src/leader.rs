//! Leader election: only the replica holding the Lease reconciles and writes.
//!
//! The Lease is managed by `kube-lease-manager` (server-side apply on a `coordination.k8s.io/v1`
//! Lease; a holder renews `grace` seconds before `duration` runs out; a candidate takes over
//! only once the lease has expired by its own clock). That crate reports gaining and losing the
//! lease, but a holder that cannot renew (API server unreachable, partitioned node) keeps
//! believing it leads. So the controller also runs under a **fence**: this replica watches the
//! Lease (each renewal the watch shows moves the end on, with no read), reads it itself when a
//! renewal is due and the watch has not shown it (half a [`FENCE_PERIOD`] after), and stops acting
//! at `renewTime + duration - grace / 2` unless a later renewal of its own is on record. The holder renews at `renewTime + duration -
//! grace`, so a working holder is never fenced; stopping `grace / 2` before the lease expires
//! leaves room for clock skew and for calls already sent, so a replica that loses the lease has
//! stopped before another can start (defaults: renewal every 10 s, fence at 12.5 s, takeover
//! after 15 s). Each reading is bounded by the time left, and readings come closer together as
//! the end nears, so a slow API server cannot stretch a term and a late renewal is still seen.
//! After losing the lease the process exits (as Kubernetes' own controllers do), and its restart
//! waits as a follower.
//!
//! A replica starts acting only once the Lease shows a renewal of its own valid for at least a
//! [`FENCE_PERIOD`] more. That matters to a process restarted under the same identity (a
//! container restarted in its pod): the manager takes its predecessor's lease over without
//! writing, and renews at once only when the renewal on record is already due, so the record
//! can be stale for a moment.
//!
//! Each candidate applies the Lease under a field manager of its own (the crate's default,
//! derived from the identity): server-side apply then refuses a second holder as a conflict.

use std::future::Future;
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use thiserror::Error;
use tracing::{info, warn};

/// The fence's longest wait between two readings once a renewal is due (its first reading after
/// one is due comes half of this later).
pub const FENCE_PERIOD: Duration = Duration::from_secs(1);

/// The shortest wait between two readings of the Lease.
const FENCE_MIN_WAIT: Duration = Duration::from_millis(50);

/// Where the Lease is and who this replica is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    /// How long a renewal is valid.
    pub duration: Duration,
    /// How long before the end the holder renews; the fence stops acting half of it before
    /// the end.
    pub grace: Duration,
}

#[derive(Debug, Error)]
pub enum LeaderError {
    #[error("leader election on Lease {namespace}/{name}: {source}")]
    Lease {
        namespace: String,
        name: String,
        source: LeaseManagerError,
    },
    #[error(
        "invalid leader election timing: --lease-grace ({grace:?}) must be at least 2 s and shorter than --lease-duration ({duration:?})"
    )]
    Timing { duration: Duration, grace: Duration },
}

/// How a term as leader ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Term {
    /// The work ended on its own (a shutdown signal); the lease was released.
    Finished,
    /// Another replica holds the lease now.
    Lost,
    /// No renewal of ours is on record in time (API server unreachable, or the lease changed
    /// hands without us noticing): stopped acting before the lease can expire for others.
    Fenced(String),
}

/// What the fence concludes from one reading of the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceVerdict {
    /// Still ours: act until this time at the latest.
    Valid(SystemTime),
    Stop(String),
}

impl LeaseConfig {
    pub fn validate(&self) -> Result<(), LeaderError> {
        if self.grace < Duration::from_secs(2) || self.grace >= self.duration {
            return Err(LeaderError::Timing {
                duration: self.duration,
                grace: self.grace,
            });
        }
        Ok(())
    }

    /// When this replica must stop acting, judged from the Lease as read (pure).
    pub fn fence(&self, lease: Option<&Lease>) -> FenceVerdict {
        let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
            return FenceVerdict::Stop(format!("Lease {}/{} is gone", self.namespace, self.name));
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return FenceVerdict::Stop(format!(
                "Lease {}/{} is held by {}",
                self.namespace,
                self.name,
                spec.holder_identity.as_deref().unwrap_or("nobody")
            ));
        }
        let Some(renewed) = spec.renew_time.as_ref() else {
            return FenceVerdict::Stop("the Lease has no renewTime".into());
        };
        let renewed = SystemTime::from(renewed.0);
        FenceVerdict::Valid(renewed + self.margin())
    }

    fn lease_error(&self, source: LeaseManagerError) -> LeaderError {
        LeaderError::Lease {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    /// How long after a renewal this replica may act: `duration - grace / 2`.
    pub fn margin(&self) -> Duration {
        self.duration.saturating_sub(self.grace / 2)
    }
}

/// Builds the lease manager (reads or creates the Lease: the first API calls of leader
/// election).
pub async fn connect(client: Client, cfg: &LeaseConfig) -> Result<LeaseManager, LeaderError> {
    cfg.validate()?;
    LeaseManagerBuilder::new(client, &cfg.name)
        .with_namespace(&cfg.namespace)
        .with_identity(&cfg.identity)
        .with_duration(cfg.duration.as_secs())
        .with_grace(cfg.grace.as_secs())
        .build()
        .await
        .map_err(|source| cfg.lease_error(source))
}

/// Runs `work` only while this replica holds the lease of `manager` (from [`connect`]);
/// `on_role(true/false)` reports the role. Returns when `work` finishes, when `shutdown`
/// resolves (SIGTERM: the work is stopped) or when leadership ends; in every case the lease
/// manager is stopped first, which releases the lease when this replica holds it, so a graceful
/// restart hands over at once instead of after a full lease duration.
pub async fn lead<W, F>(
    manager: LeaseManager,
    client: Client,
    cfg: &LeaseConfig,
    on_role: impl Fn(bool),
    work: W,
    shutdown: impl Future<Output = ()>,
) -> Result<Term, LeaderError>
where
    W: FnOnce() -> F,
    F: Future<Output = ()>,
{
    let lease_err = |source| cfg.lease_error(source);
    tokio::pin!(shutdown);
    let (mut leading, task) = manager.watch().await;
    on_role(false);
    info!(lease = %format!("{}/{}", cfg.namespace, cfg.name), identity = %cfg.identity,
        "waiting to become the leader");
    while !*leading.borrow_and_update() {
        let stop = tokio::select! {
            changed = leading.changed() => changed.is_err().then_some(Term::Lost),
            () = &mut shutdown => Some(Term::Finished),
        };
        if let Some(term) = stop {
            drop(leading);
            return finish(task, term).await.map_err(lease_err);
        }
    }
    info!(identity = %cfg.identity, "became the leader");
    let leases: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let confirmation = tokio::select! {
        c = confirmed(&leases, cfg) => c.map_err(Term::Fenced),
        () = &mut shutdown => Err(Term::Finished),
    };
    let valid_until = match confirmation {
        Ok(until) => until,
        Err(term) => {
            drop(leading);
            return finish(task, term).await.map_err(lease_err);
        }
    };
    on_role(true);
    // On shutdown the work is dropped where it awaits: every step of a request is on record
    // before it is taken, so the next leader resumes it.
    let term = tokio::select! {
        () = work() => Term::Finished,
        () = &mut shutdown => {
            info!("shutting down: releasing the lease");
            Term::Finished
        }
        () = lost(&mut leading) => Term::Lost,
        reason = fenced(&leases, cfg, valid_until, renewals(leases.clone(), cfg)) => {
            Term::Fenced(reason)
        }
    };
    on_role(false);
    drop(leading);
    finish(task, term).await.map_err(lease_err)
}

/// Resolves once the lease manager reports the lease lost (or stops reporting).
async fn lost(leading: &mut tokio::sync::watch::Receiver<bool>) {
    loop {
        if leading.changed().await.is_err() || !*leading.borrow_and_update() {
            return;
        }
    }
}

/// One reading of the Lease, given up at `by`: the verdict, or `None` when it could not be read
/// in time.
async fn read_fence(
    leases: &Api<Lease>,
    cfg: &LeaseConfig,
    by: SystemTime,
) -> Option<FenceVerdict> {
    let left = by.duration_since(SystemTime::now()).unwrap_or_default();
    match tokio::time::timeout(left, leases.get_opt(&cfg.name)).await {
        Ok(Ok(lease)) => Some(cfg.fence(lease.as_ref())),
        Ok(Err(e)) => {
            warn!(error = %e, "cannot read the Lease; acting until the last renewal expires");
            None
        }
        Err(_) => None,
    }
}

/// Waits (up to the grace) until the Lease shows a renewal of ours valid for at least a
/// [`FENCE_PERIOD`] more; returns until when it is valid.
async fn confirmed(leases: &Api<Lease>, cfg: &LeaseConfig) -> Result<SystemTime, String> {
    let give_up = SystemTime::now() + cfg.grace;
    let mut told = false;
    loop {
        match read_fence(leases, cfg, give_up).await {
            Some(FenceVerdict::Valid(until)) if until > SystemTime::now() + FENCE_PERIOD => {
                return Ok(until);
            }
            Some(FenceVerdict::Stop(reason)) => return Err(reason),
            Some(FenceVerdict::Valid(_)) if !told => {
                told = true;
                info!("the renewal on record is about to end; waiting for our own before acting");
            }
            Some(FenceVerdict::Valid(_)) | None => {}
        }
        if SystemTime::now() + 2 * FENCE_MIN_WAIT >= give_up {
            return Err(format!(
                "holding Lease {}/{}, but no fresh renewal of ours was on record within {:?}",
                cfg.namespace, cfg.name, cfg.grace
            ));
        }
        tokio::time::sleep(2 * FENCE_MIN_WAIT).await;
    }
}

/// The Lease each time it changes, as a watch of it (`metadata.name`) reports it, restarted
/// with the watcher's backoff when it fails.
fn renewals(leases: Api<Lease>, cfg: &LeaseConfig) -> impl Stream<Item = Lease> + Send + use<> {
    let config = watcher::Config::default().fields(&format!("metadata.name={}", cfg.name));
    watcher(leases, config)
        .default_backoff()
        .applied_objects()
        .filter_map(|lease| std::future::ready(lease.ok()))
}

/// Resolves, with the reason, once no renewal of ours is valid any more; `valid_until` is the
/// end of the renewal [`confirmed`] found. Each renewal the watch `renewals` reports moves the
/// end on (another holder stops it at once); the Lease is read ([`next_reading_in`]) only when
/// a renewal is due and the watch has not shown it, so a working holder reads nothing, and one
/// whose watch is late or down is fenced exactly as without it.
async fn fenced(
    leases: &Api<Lease>,
    cfg: &LeaseConfig,
    mut valid_until: SystemTime,
    renewals: impl Stream<Item = Lease>,
) -> String {
    futures::pin_mut!(renewals);
    let mut watching = true;
    loop {
        let left = valid_until
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        if left.is_zero() {
            return format!(
                "no renewal of Lease {}/{} on record for {:?}",
                cfg.namespace,
                cfg.name,
                cfg.margin()
            );
        }
        let wait = tokio::time::sleep(next_reading_in(left, cfg.grace / 2));
        if watching {
            tokio::select! {
                seen = renewals.next() => {
                    match seen.map(|lease| cfg.fence(Some(&lease))) {
                        Some(FenceVerdict::Valid(until)) => valid_until = valid_until.max(until),
                        Some(FenceVerdict::Stop(reason)) => return reason,
                        None => watching = false,
                    }
                    continue;
                }
                () = wait => {}
            }
        } else {
            wait.await;
        }
        match read_fence(leases, cfg, valid_until).await {
            Some(FenceVerdict::Valid(until)) => valid_until = until,
            Some(FenceVerdict::Stop(reason)) => return reason,
            None => {}
        }
    }
}

/// How long the fence waits before its next reading, `left` before its end, when the holder's
/// next renewal is due `due` before that end (`grace / 2`): no renewal can be on record sooner,
/// so until half a [`FENCE_PERIOD`] after it is due (one reading per renewal while renewals
/// come on time); from then on half of what is left (at most a [`FENCE_PERIOD`], at least
/// [`FENCE_MIN_WAIT`], never past the end), so a renewal that lands late is still seen.
pub fn next_reading_in(left: Duration, due: Duration) -> Duration {
    let closing = (left / 2).max(FENCE_MIN_WAIT).min(left).min(FENCE_PERIOD);
    match left.checked_sub(due) {
        Some(before_due) if !before_due.is_zero() => (before_due + FENCE_PERIOD / 2)
            .min(left.saturating_sub(FENCE_MIN_WAIT))
            .max(closing),
        _ => closing,
    }
}

/// Stops the lease manager (it releases the lease when it still holds it) and reports `term`.
async fn finish(
    task: tokio::task::JoinHandle<Result<LeaseManager, LeaseManagerError>>,
    term: Term,
) -> Result<Term, LeaseManagerError> {
    match tokio::time::timeout(Duration::from_secs(5), task).await {
        Ok(Ok(Ok(_))) => {}
        Ok(Ok(Err(e))) => warn!(error = %e, "releasing the lease failed; it expires on its own"),
        Ok(Err(e)) => warn!(error = %e, "the lease manager task failed"),
        Err(_) => warn!("releasing the lease timed out; it expires on its own"),
    }
    Ok(term)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn cfg() -> LeaseConfig {
        LeaseConfig {
            name: "storage-migrator".into(),
            namespace: "ops".into(),
            identity: "op-0".into(),
            duration: Duration::from_secs(15),
            grace: Duration::from_secs(5),
        }
    }

    fn lease(holder: Option<&str>, renewed: Option<SystemTime>) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(String::from),
                renew_time: renewed.map(|t| MicroTime(t.try_into().unwrap_or_default())),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    #[test]
    fn a_renewal_of_ours_is_valid_until_half_the_grace_before_expiry() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(
            cfg().fence(Some(&lease(Some("op-0"), Some(t)))),
            FenceVerdict::Valid(t + Duration::from_millis(12_500))
        );
    }

    #[test]
    fn another_holder_a_missing_lease_or_renewal_stops_at_once() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let stop = |v: FenceVerdict| match v {
            FenceVerdict::Stop(reason) => reason,
            FenceVerdict::Valid(_) => panic!("expected Stop"),
        };
        assert!(stop(cfg().fence(Some(&lease(Some("op-1"), Some(t))))).contains("held by op-1"));
        assert!(stop(cfg().fence(Some(&lease(None, Some(t))))).contains("held by nobody"));
        assert!(stop(cfg().fence(None)).contains("is gone"));
        assert!(stop(cfg().fence(Some(&lease(Some("op-0"), None)))).contains("renewTime"));
    }

    #[test]
    fn the_fence_reads_once_the_renewal_is_due_then_more_often_as_the_end_nears() {
        let ms = Duration::from_millis;
        // The defaults: the end 12.5 s after a renewal, the next renewal due 2.5 s before it.
        let due = ms(2_500);
        let waits: Vec<_> = [12_500, 3_000, 2_500, 2_000, 1_000, 400, 80, 30, 0]
            .into_iter()
            .map(|left| next_reading_in(ms(left), due).as_millis())
            .collect();
        assert_eq!(waits, [10_500, 1_000, 1_000, 1_000, 500, 200, 50, 30, 0]);
        // Never past the end, whatever the due time says.
        assert_eq!(next_reading_in(ms(600), ms(100)), ms(550));
        assert_eq!(next_reading_in(ms(10), ms(0)), ms(10));
    }

    /// The Lease API of a mocked server that answers each GET with the next of `answers`
    /// (`None`: never answers) and counts the requests it got.
    fn lease_server(answers: Vec<Option<Lease>>) -> (Api<Lease>, tokio::task::JoinHandle<usize>) {
        use http::{Request, Response};
        use kube::client::Body;
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            let mut served = 0;
            for answer in answers {
                let Some((request, send)) = handle.next_request().await else {
                    break;
                };
                assert_eq!(
                    request.uri().path(),
                    "/apis/coordination.k8s.io/v1/namespaces/ops/leases/storage-migrator"
                );
                served += 1;
                match answer {
                    Some(lease) => send.send_response(Response::new(Body::from(
                        serde_json::to_vec(&lease).unwrap_or_default(),
                    ))),
                    None => held.push(send),
                }
            }
            if !held.is_empty() {
                // The unanswered requests stay pending for as long as the test runs.
                std::future::pending::<()>().await;
            }
            served
        });
        let client = Client::new(service, "ops");
        (Api::namespaced(client, "ops"), server)
    }

    fn ours_renewed(ago: Duration) -> Option<Lease> {
        Some(lease(Some("op-0"), Some(SystemTime::now() - ago)))
    }

    #[tokio::test]
    async fn leading_waits_for_a_fresh_renewal_of_ours_before_acting() {
        // A restart under the same identity: the renewal on record (12 s ago) ends in 0.5 s,
        // then the manager's own renewal lands.
        let (leases, server) = lease_server(vec![
            ours_renewed(Duration::from_secs(12)),
            ours_renewed(Duration::from_secs(12)),
            ours_renewed(Duration::ZERO),
        ]);
        let until = confirmed(&leases, &cfg()).await.expect("confirmed");
        let left = until.duration_since(SystemTime::now()).unwrap_or_default();
        assert!(left > Duration::from_secs(12), "{left:?}");
        drop(leases);
        assert_eq!(server.await.ok(), Some(3));
    }

    #[tokio::test]
    async fn leading_never_starts_on_a_lease_held_by_another() {
        let (leases, _server) =
            lease_server(vec![Some(lease(Some("op-1"), Some(SystemTime::now())))]);
        let reason = confirmed(&leases, &cfg()).await.expect_err("not ours");
        assert!(reason.contains("held by op-1"), "{reason}");
    }

    #[tokio::test]
    async fn a_renewal_read_just_before_the_end_extends_the_term() {
        // The end is 0.3 s away: the fence reads again before it and sees the renewal.
        let (leases, server) = lease_server(vec![ours_renewed(Duration::ZERO)]);
        let (cfg, end) = (cfg(), SystemTime::now() + Duration::from_millis(300));
        let fence = tokio::time::timeout(
            Duration::from_secs(1),
            fenced(&leases, &cfg, end, futures::stream::pending()),
        );
        assert!(fence.await.is_err(), "the fence stopped despite a renewal");
        drop(leases);
        assert_eq!(server.await.ok(), Some(1));
    }

    #[tokio::test]
    async fn a_reading_that_never_returns_does_not_stretch_the_term() {
        let (leases, _server) = lease_server(vec![None]);
        let t0 = std::time::Instant::now();
        let end = SystemTime::now() + Duration::from_millis(300);
        let no_watch = futures::stream::pending();
        let reason = tokio::time::timeout(
            Duration::from_secs(2),
            fenced(&leases, &cfg(), end, no_watch),
        )
        .await
        .expect("the fence stops at the end of the term");
        assert!(reason.contains("no renewal"), "{reason}");
        assert!(
            t0.elapsed() < Duration::from_millis(450),
            "{:?}",
            t0.elapsed()
        );
    }

    /// A renewal the watch reports moves the end on without a reading: here the API server
    /// answers no reading at all, and the fence still holds past the old end.
    #[tokio::test]
    async fn a_renewal_the_watch_reports_extends_the_term_without_a_reading() {
        let (leases, _server) = lease_server(vec![None]);
        let end = SystemTime::now() + Duration::from_millis(300);
        let watched = futures::stream::once(async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            ours_renewed(Duration::ZERO).unwrap_or_default()
        })
        .chain(futures::stream::pending());
        let cfg = cfg();
        let fence =
            tokio::time::timeout(Duration::from_secs(1), fenced(&leases, &cfg, end, watched));
        assert!(
            fence.await.is_err(),
            "the fence stopped despite the renewal"
        );
    }

    #[tokio::test]
    async fn another_holder_the_watch_reports_stops_at_once() {
        let (leases, _server) = lease_server(vec![None]);
        let end = SystemTime::now() + Duration::from_secs(10);
        let taken = lease(Some("op-1"), Some(SystemTime::now()));
        let watched = futures::stream::once(async { taken }).chain(futures::stream::pending());
        let reason = tokio::time::timeout(
            Duration::from_millis(500),
            fenced(&leases, &cfg(), end, watched),
        )
        .await
        .expect("stopped at once");
        assert!(reason.contains("held by op-1"), "{reason}");
    }

    #[test]
    fn the_grace_must_fit_inside_the_duration() {
        assert!(cfg().validate().is_ok());
        for (d, g) in [(15, 15), (15, 20), (15, 1)] {
            let c = LeaseConfig {
                duration: Duration::from_secs(d),
                grace: Duration::from_secs(g),
                ..cfg()
            };
            assert!(matches!(c.validate(), Err(LeaderError::Timing { .. })));
        }
    }
}
