//! Leader election: only the replica holding the Lease reconciles and writes.
//!
//! An elector of our own on a `coordination.k8s.io/v1` Lease, one request per renewal:
//! - **The holder renews** `duration - grace` after its last renewal with a replace (PUT) of the
//!   Lease that carries the `resourceVersion` of its last write; the answer is the new record,
//!   so nothing is read back. Another writer in between makes it a 409 Conflict, after which the
//!   holder reads the Lease once: still ours (a renewal whose answer was lost) → renew on that
//!   version; another's → the term is lost.
//! - **The fence**: the holder acts until `duration - grace / 2` after it *sent* the last renewal
//!   the API server confirmed, by its own monotonic clock, and stops there unless a later one
//!   is confirmed (each renewal request is bounded by that end). The API server recorded the
//!   renewal no earlier than it was sent, and a candidate sees it no earlier than that, so a
//!   holder that cannot renew (API server unreachable, partitioned node) has stopped `grace / 2`
//!   before any candidate may start (defaults: renewal every 20 s, fence at 25 s, takeover
//!   after 30 s). After losing the lease or being fenced the process exits (as Kubernetes' own
//!   controllers do), and its restart waits as a follower.
//! - **A candidate** watches the Lease (no polling) and takes it, a replace on the version it
//!   saw, only once the record has not changed for a whole lease duration by its own monotonic
//!   clock ([`record::candidate_move`]): the holders' wall clocks are never compared with ours.
//!   A released Lease (no holder) is taken at once, and so is one held under this replica's
//!   identity: a container restarted in its pod (the identity is the pod's name), whose
//!   predecessor is gone.
//! - **On shutdown** the holder releases the Lease (clears the holder) before the process exits,
//!   so a rolling restart hands over at once instead of after a full lease duration.
//!
//! Why not `kube-lease-manager` (used before): it renews with a patch and then reads the Lease
//! back (two requests per renewal: 12 a minute with the defaults), judges expiry by comparing
//! the holder's `renewTime` with its own wall clock, and reports no fence (a holder that cannot
//! renew keeps believing it leads), which we had to add around it with a watch and reads.

pub mod record;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::runtime::watcher::Event;
use kube::{Api, Client};
use thiserror::Error;
use tokio::time::Instant;
use tracing::{info, warn};

use record::Move;

/// How long a candidate waits before trying again after a write or read failed.
const RETRY: Duration = Duration::from_secs(2);

/// How long the holder waits before renewing again after a renewal failed (never past the end
/// of its term).
const RENEW_RETRY: Duration = Duration::from_secs(1);

/// How long releasing the Lease on shutdown may take.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a read of the Lease may take (the client itself sets no bound).
const READ_TIMEOUT: Duration = Duration::from_secs(10);

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
    #[error("leader election: cannot read Lease {namespace}/{name}: {reason}")]
    Read {
        namespace: String,
        name: String,
        reason: String,
    },
    #[error(
        "invalid leader election timing: --lease-grace ({grace:?}) must be at least 2 s and shorter than --lease-duration ({duration:?})"
    )]
    Timing { duration: Duration, grace: Duration },
}

/// How a term as leader ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Term {
    /// The work ended on its own, or a shutdown signal came; the lease was released.
    Finished,
    /// Another replica holds the lease now.
    Lost,
    /// No renewal of ours was confirmed in time (API server unreachable or slow): stopped
    /// acting before the lease can expire for others.
    Fenced(String),
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

    /// How long after sending a renewal (confirmed) this replica may act: `duration - grace / 2`.
    pub fn margin(&self) -> Duration {
        self.duration.saturating_sub(self.grace / 2)
    }

    /// How long after sending a renewal the holder renews again: `duration - grace`.
    pub fn renew_every(&self) -> Duration {
        self.duration.saturating_sub(self.grace)
    }

    fn lease(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The Lease's API and what this replica last saw of it.
pub struct Elector {
    leases: Api<Lease>,
    cfg: LeaseConfig,
    seen: Option<Lease>,
    /// When `seen` was first seen at its `resourceVersion` (or its absence), by our clock.
    seen_at: Instant,
}

/// This replica's term: its last confirmed record and until when it may act.
struct Held {
    record: Lease,
    sent: Instant,
    until: Instant,
}

/// How one write of the Lease went.
enum Written {
    Done(Box<Lease>),
    /// 409: the record changed since we read it (or it exists already).
    Changed,
    Failed(String),
}

/// Checks the timing and reads the Lease (the first API call of leader election).
pub async fn connect(client: Client, cfg: &LeaseConfig) -> Result<Elector, LeaderError> {
    cfg.validate()?;
    let leases: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let seen = read(&leases, cfg, READ_TIMEOUT)
        .await
        .map_err(|reason| LeaderError::Read {
            namespace: cfg.namespace.clone(),
            name: cfg.name.clone(),
            reason,
        })?;
    Ok(Elector {
        leases,
        cfg: cfg.clone(),
        seen,
        seen_at: Instant::now(),
    })
}

/// Runs `work` only while this replica holds the Lease; `on_role(true/false)` reports the role.
/// Returns when `work` finishes, when `shutdown` resolves (SIGTERM: the work is stopped) or when
/// the term ends (lost, fenced); a term that ends by the first two releases the Lease.
pub async fn lead<W, F>(
    mut elector: Elector,
    on_role: impl Fn(bool),
    work: W,
    shutdown: impl Future<Output = ()>,
) -> Term
where
    W: FnOnce() -> F,
    F: Future<Output = ()>,
{
    tokio::pin!(shutdown);
    on_role(false);
    info!(lease = %elector.cfg.lease(), identity = %elector.cfg.identity,
        "waiting to become the leader");
    let mut held = tokio::select! {
        held = elector.acquire() => held,
        () = &mut shutdown => return Term::Finished,
    };
    info!(identity = %elector.cfg.identity, "became the leader");
    on_role(true);
    // On shutdown the work is dropped where it awaits: every step of a request is on record
    // before it is taken, so the next leader resumes it.
    let term = tokio::select! {
        () = work() => Term::Finished,
        () = &mut shutdown => {
            info!("shutting down: releasing the lease");
            Term::Finished
        }
        end = elector.keep(&mut held) => end,
    };
    on_role(false);
    if term == Term::Finished {
        elector.release(held).await;
    }
    term
}

impl Elector {
    /// Notes the record as read or watched; a new `resourceVersion` (or a Lease appearing or
    /// going) restarts the count of how long it has been unchanged.
    fn observe(&mut self, now: Option<Lease>) {
        let version = |l: &Option<Lease>| l.as_ref().map(|l| l.metadata.resource_version.clone());
        if version(&now) != version(&self.seen) {
            self.seen_at = Instant::now();
        }
        self.seen = now;
    }

    /// Whether `lease` names this replica as its holder.
    fn ours(&self, lease: &Lease) -> bool {
        record::holder(lease) == Some(self.cfg.identity.as_str())
    }

    /// Reads the Lease; a failure is logged and leaves what was seen.
    async fn read_again(&mut self) {
        match read(&self.leases, &self.cfg, READ_TIMEOUT).await {
            Ok(now) => self.observe(now),
            Err(error) => warn!(%error, lease = %self.cfg.lease(), "cannot read the Lease"),
        }
    }

    /// Sends one write (a create when `create`, else a replace), bounded by `within`.
    async fn write(&self, body: &Lease, create: bool, within: Duration) -> Written {
        let pp = PostParams::default();
        let call = async {
            match create {
                true => self.leases.create(&pp, body).await,
                false => self.leases.replace(&self.cfg.name, &pp, body).await,
            }
        };
        match tokio::time::timeout(within, call).await {
            Ok(Ok(lease)) => Written::Done(Box::new(lease)),
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => Written::Changed,
            Ok(Err(e)) => Written::Failed(e.to_string()),
            Err(_) => Written::Failed(format!("no answer within {within:?}")),
        }
    }

    /// Waits as a candidate until this replica holds the Lease (it watches the Lease meanwhile;
    /// failures are retried for as long as it takes).
    async fn acquire(&mut self) -> Held {
        let changes = changes(self.leases.clone(), &self.cfg);
        futures::pin_mut!(changes);
        loop {
            let unchanged = self.seen_at.elapsed();
            let wait = match record::candidate_move(&self.cfg, self.seen.as_ref(), unchanged) {
                Move::Wait(left) => left,
                Move::Create | Move::Take => match self.claim().await {
                    Some(held) => return held,
                    None => RETRY,
                },
            };
            tokio::select! {
                Some(seen) = changes.next() => self.observe(seen),
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Creates or takes the Lease; `None` when another write came first (the Lease is read
    /// again) or the write failed.
    async fn claim(&mut self) -> Option<Held> {
        let body = record::taken(&self.cfg, self.seen.as_ref(), SystemTime::now());
        let sent = Instant::now();
        match self.write(&body, self.seen.is_none(), self.cfg.grace).await {
            Written::Done(record) => Some(Held {
                record: *record,
                sent,
                until: sent + self.cfg.margin(),
            }),
            Written::Changed => {
                self.read_again().await;
                None
            }
            Written::Failed(error) => {
                warn!(%error, lease = %self.cfg.lease(), "cannot take the Lease");
                None
            }
        }
    }

    /// Renews for as long as the term lasts; returns how it ended (lost or fenced).
    async fn keep(&self, held: &mut Held) -> Term {
        let mut next = held.sent + self.cfg.renew_every();
        loop {
            tokio::time::sleep_until(next.min(held.until)).await;
            let left = held.until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return self.fenced();
            }
            let body = record::renewed(&self.cfg, &held.record, SystemTime::now());
            let sent = Instant::now();
            next = match self.write(&body, false, left).await {
                Written::Done(record) => {
                    *held = Held {
                        record: *record,
                        sent,
                        until: sent + self.cfg.margin(),
                    };
                    sent + self.cfg.renew_every()
                }
                Written::Changed => match self.ours_now(held).await {
                    Ok(true) => Instant::now(),
                    Ok(false) => Instant::now() + RENEW_RETRY,
                    Err(term) => return term,
                },
                Written::Failed(error) => {
                    warn!(%error, left = ?left, "cannot renew the Lease; acting until the last renewal ends");
                    Instant::now() + RENEW_RETRY
                }
            };
        }
    }

    /// After a renewal was refused as a conflict: reads the Lease; still ours (a renewal of ours
    /// whose answer was lost) → `held` takes its version (`true`: renew on it now); another's
    /// or gone → the term is lost; not read → `false` (try again shortly).
    async fn ours_now(&self, held: &mut Held) -> Result<bool, Term> {
        let left = held.until.saturating_duration_since(Instant::now());
        match read(&self.leases, &self.cfg, left).await {
            Ok(Some(now)) if self.ours(&now) => {
                held.record = now;
                Ok(true)
            }
            Ok(now) => {
                let by = now.as_ref().and_then(record::holder).unwrap_or("nobody");
                warn!(lease = %self.cfg.lease(), holder = by, "the Lease changed hands");
                Err(Term::Lost)
            }
            Err(error) if Instant::now() < held.until => {
                warn!(%error, "cannot read the Lease after a refused renewal");
                Ok(false)
            }
            Err(_) => Err(self.fenced()),
        }
    }

    fn fenced(&self) -> Term {
        Term::Fenced(format!(
            "no renewal of Lease {} confirmed for {:?}",
            self.cfg.lease(),
            self.cfg.margin()
        ))
    }

    /// Releases the Lease (bounded): a candidate takes it at once. A refusal because the record
    /// changed is read again once: ours still → released on that version.
    async fn release(&self, held: Held) {
        let mut record = held.record;
        for _ in 0..2 {
            let body = record::released(&self.cfg, &record);
            match self.write(&body, false, RELEASE_TIMEOUT).await {
                Written::Done(_) => return info!(lease = %self.cfg.lease(), "released the Lease"),
                Written::Changed => match read(&self.leases, &self.cfg, RELEASE_TIMEOUT).await {
                    Ok(Some(now)) if self.ours(&now) => {
                        record = now;
                    }
                    _ => return,
                },
                Written::Failed(error) => {
                    return warn!(%error, "releasing the Lease failed; it expires on its own");
                }
            }
        }
    }
}

/// One read of the Lease, given up after `within`: the Lease (`None`: there is none), or why not.
async fn read(
    leases: &Api<Lease>,
    cfg: &LeaseConfig,
    within: Duration,
) -> Result<Option<Lease>, String> {
    match tokio::time::timeout(within, leases.get_opt(&cfg.name)).await {
        Ok(Ok(lease)) => Ok(lease),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {within:?}")),
    }
}

/// The Lease each time it changes (`None`: there is none), as a watch of it (`metadata.name`)
/// reports it, restarted after a pause when it fails (`cluster::watch_retry`).
fn changes(leases: Api<Lease>, cfg: &LeaseConfig) -> impl Stream<Item = Option<Lease>> + use<> {
    let config = watcher::Config::default()
        .fields(&format!("metadata.name={}", cfg.name))
        .timeout(crate::cluster::WATCH_TIMEOUT_SECS);
    crate::cluster::watch_retry::retried(watcher(leases, config))
        .scan(false, |listed, event| {
            let seen = match event {
                Ok(Event::Init) => {
                    *listed = false;
                    None
                }
                Ok(Event::InitApply(lease)) => {
                    *listed = true;
                    Some(Some(lease))
                }
                Ok(Event::InitDone) => (!*listed).then_some(None),
                Ok(Event::Apply(lease)) => Some(Some(lease)),
                Ok(Event::Delete(_)) => Some(None),
                Err(_) => None,
            };
            std::future::ready(Some(seen))
        })
        .filter_map(std::future::ready)
}
